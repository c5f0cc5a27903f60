"""Where a kernel's warps wait, per instruction: Nsight Compute's source page (SASS with its counters), summed
by warp-specialised partition.

    ncu --clock-control none -k regex:gluon_ws -c 1 --section SourceCounters -o ws \\
        python benchmarks/profile_decode.py 16x8:64:4k
    ncu -i ws.ncu-rep --page source --csv --print-source sass > ws_sass.csv
    python benchmarks/stall_summary.py ws_sass.csv

The warp-state sampler stops a warp at intervals and records why it could not issue (``stall_*``, one column
each). A warp-specialised kernel's partitions start with ``setmaxnreg`` (SASS ``USETMAXREG``), and each
partition's code is one contiguous range of addresses, so the instructions between two of them belong to one
partition: the consumer warpgroups and the loader get their own sums. A kernel without ``setmaxnreg`` is one range.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["read_source_csv", "partitions", "instruction_kind", "summarize", "format_summary"]

_SAMPLES = "Warp Stall Sampling (All Samples)"
_EXECUTED = "Instructions Executed"


def _count(text: str) -> int:
    text = text.replace(",", "").strip()
    return int(text) if text.isdigit() else 0


def read_source_csv(path: str | Path) -> list[dict[str, Any]]:
    """The instructions of ``ncu --page source --csv --print-source sass``, in address order: ``sass`` (the
    instruction's text), ``samples`` (all warp-state samples at it), ``executed`` (warp-level executions) and
    ``stalls`` (samples by reason, the ``stall_*`` columns without their "(Not Issued)" twins, plus ``unlisted``:
    the instruction's samples that no column gives a reason for).

    The source page has no column for every reason the sampler records. On the H200 reports of
    ``benchmarks/results`` the unlisted samples sit on the first ``HGMMA`` after a ``WARPGROUP.ARRIVE``, and their
    sum is the kernel's ``smsp__pcsamp_warps_issue_stalled_warpgroup_arrive`` (details page): warps of a
    warpgroup waiting for the others at the start of a wgmma group."""
    rows = list(csv.reader(Path(path).read_text().splitlines()))
    try:
        at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    except StopIteration:
        raise ValueError(f"{path}: no 'Address' header row (expected ncu --page source --csv output)") from None
    head = rows[at]
    for need in ("Source", _SAMPLES, _EXECUTED):
        if need not in head:
            raise ValueError(f"{path}: column {need!r} missing (collect the SourceCounters section)")
    reasons = [c for c in head if c.startswith("stall_") and "Not Issued" not in c]
    out = []
    for r in rows[at + 1:]:
        if len(r) != len(head):
            continue
        d = dict(zip(head, r))
        samples = _count(d[_SAMPLES])
        stalls = {k[len("stall_"):]: _count(d[k]) for k in reasons}
        if samples > sum(stalls.values()):
            stalls["unlisted"] = samples - sum(stalls.values())
        out.append(dict(sass=d["Source"].strip(), samples=samples, executed=_count(d[_EXECUTED]), stalls=stalls))
    if not out:
        raise ValueError(f"{path}: no instruction rows")
    return out


def partitions(instructions: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``instructions`` cut before every ``USETMAXREG`` (where a warp-specialised partition's code starts)."""
    parts: list[list[dict[str, Any]]] = [[]]
    for ins in instructions:
        if "USETMAXREG" in ins["sass"] and parts[-1]:
            parts.append([])
        parts[-1].append(ins)
    return parts


def _registers(part: list[dict[str, Any]]) -> int | None:
    m = re.search(r"USETMAXREG\.\S+\s+(?:UP\d+,\s*)?(0x[0-9a-f]+|\d+)", part[0]["sass"])
    return int(m.group(1), 0) if m else None


def instruction_kind(sass: str, recent: list[str] | tuple[str, ...] = ()) -> str:
    """What an instruction is for the question "what does the warp wait on", given the few instructions before it
    (``recent``, oldest first): ``mbarrier wait`` (a try-wait, or the branch of its polling loop: a branch on the
    predicate a try-wait among ``recent`` set), ``wgmma wait`` (``WARPGROUP.DEPBAR``), ``wgmma issue``
    (``HGMMA``, ``WARPGROUP.ARRIVE``), ``named barrier`` (``BAR.*``), ``memory`` (global, shared or local loads and
    stores, ``LDGSTS``, ``LDSM``) or ``math and other``."""
    if "TRYWAIT" in sass:
        return "mbarrier wait"
    branch = re.match(r"@!?(U?P\d+)\s+BRA\b", sass)
    if branch and any(re.search(rf"TRYWAIT\s+{branch.group(1)}\b", r) for r in recent):
        return "mbarrier wait"
    if "WARPGROUP.DEPBAR" in sass:
        return "wgmma wait"
    if "HGMMA" in sass or "WARPGROUP.ARRIVE" in sass:
        return "wgmma issue"
    if re.search(r"\bBAR\.", sass):
        return "named barrier"
    if re.search(r"\b(LDG|STG|LDS|STS|LDL|STL|LDGSTS|LDSM|STSM|UTMALDG)\b", sass):
        return "memory"
    return "math and other"


def summarize(instructions: list[dict[str, Any]], min_share: float = 0.05, top: int = 6) -> dict[str, Any]:
    """Totals, and for every partition with at least ``min_share`` of the samples: its registers (``setmaxnreg``;
    None for a kernel without), instruction count, executed instructions, share of the samples, stall reasons by
    share (largest first), samples by :func:`instruction_kind` and its ``top`` instructions by samples."""
    total = sum(i["samples"] for i in instructions)
    if total == 0:
        raise ValueError("no warp-state samples: collect the SourceCounters section")
    out = dict(samples=total, executed=sum(i["executed"] for i in instructions), partitions=[])
    for part in partitions(instructions):
        s = sum(i["samples"] for i in part)
        if s < min_share * total:
            continue
        reasons: Counter[str] = Counter()
        kinds: Counter[str] = Counter()
        kind = [instruction_kind(i["sass"], [j["sass"] for j in part[max(0, n - 8):n]]) for n, i in enumerate(part)]
        for i, k in zip(part, kind):
            reasons.update(i["stalls"])
            kinds[k] += i["samples"]
        out["partitions"].append(dict(
            registers=_registers(part), instructions=len(part), executed=sum(i["executed"] for i in part),
            share=s / total,
            stalls={k: v / s for k, v in reasons.most_common() if v},
            kinds={k: v / s for k, v in kinds.most_common() if v},
            top=[dict(sass=part[n]["sass"], kind=kind[n], share=part[n]["samples"] / s, executed=part[n]["executed"],
                      stall=_main_reason(part[n]["stalls"]))
                 for n in sorted(range(len(part)), key=lambda n: -part[n]["samples"])[:top]]))
    return out


def _main_reason(stalls: dict[str, int]) -> str | None:
    """The reason with the most samples at one instruction (None where it has none)."""
    best = max(stalls.items(), key=lambda kv: kv[1], default=(None, 0))
    return best[0] if best[1] else None


def format_summary(summary: dict[str, Any], reasons: int = 8) -> str:
    """A text report of :func:`summarize`'s result."""
    lines = [f"{summary['samples']} warp-state samples, {summary['executed']:,} warp-level instructions executed"]
    for p in summary["partitions"]:
        regs = f"setmaxnreg {p['registers']}" if p["registers"] is not None else "whole kernel"
        lines.append(f"- partition ({regs}, {p['instructions']} SASS instructions): {p['share']:.0%} of the samples,"
                     f" {p['executed']:,} executed")
        lines.append("  at: " + ", ".join(f"{k} {v:.0%}" for k, v in p["kinds"].items()))
        lines.append("  stalls: " + ", ".join(f"{k} {v:.0%}" for k, v in list(p["stalls"].items())[:reasons]))
        for t in p["top"]:
            lines.append(f"  {t['share']:6.1%}  x{t['executed']:<8d} {t['kind']:15s} {t['stall'] or '-':12s}"
                         f" {t['sass'][:72]}")
    return "\n".join(lines)
