"""The committed H200 bars of both benchmarks in one table: ``workbench results`` and the README's table.

Reads the JSON that ``workbench bench expand`` and ``workbench bench decode`` wrote on the H200 and that is committed
under ``src/workbench/data/`` (:func:`workbench.perfmodel.load_measurement`). Nothing is timed here: every number
comes from those files. For a missed bar the note says how far off it is, in terms measured in the same run: the
decode's rates against FlashMLA's and the matrix-product ceiling; the expansion's latency against a torch ``fill_``
of the same output bytes.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from workbench import perfmodel

__all__ = ["BarRow", "committed_bars", "format_markdown", "format_text"]


@dataclasses.dataclass(frozen=True)
class BarRow:
    """One bar of a committed run: the rule, the measured value (as text and as the bar's number), the verdict,
    and a note (for a missed bar: how far off, from the same run; for a ratio bar: its per-repeat range)."""

    benchmark: str  # "expand" | "decode"
    bar: str  # the point and the rule, e.g. "256 x 4k: <= 2 us"
    measured: str  # e.g. "2.36 us"
    value: float
    verdict: str  # "PASS" | "MISS"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _k(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else f"{tokens / 1000:g}k" if tokens >= 1000 else str(tokens)


def _command(command: str) -> str:
    """The recorded command line with the interpreter's path to the package's ``__main__.py`` written as
    ``python -m workbench`` (what was typed; the path is the device machine's)."""
    head, _, rest = command.partition(" ")
    return f"python -m workbench {rest}".rstrip() if head.endswith("workbench/__main__.py") else command


def _expand_rows(data: dict[str, Any]) -> list[BarRow]:
    cases = {(c["num_reqs"], c["seq_len"]): c for c in data["cases"]}
    out = []
    for b in data["bars"]:
        r, l = b["case"]
        c = cases.get((r, l), {})
        if b["metric"] == "kernel_frac_copy":
            rule, measured = f">= {b['target']:.0%} of copy bandwidth", f"{b['value']:.1%} of copy"
        elif b["metric"] == "kernel_us":
            rule, measured = f"<= {b['target']:g} us", f"{b['value']:.2f} us"
        elif b["metric"] == "speedup_vs_serial":
            rule, measured = f">= {b['target']:g}x the serial loop", f"{b['value']:.1f}x"
        else:
            raise ValueError(f"expand bar {b['name']!r} has metric {b['metric']!r}, which this table does not know")
        note = ""
        if b["verdict"] != "PASS" and b["metric"] == "kernel_us" and "fill_same_bytes_us" in c:
            note = (f"same run: a torch fill_ of the output bytes {c['fill_same_bytes_us']:.2f} us, the kernel with "
                    f"the caller's kv_indptr {c['kernel_indptr_given_us']:.2f} us")
        out.append(BarRow("expand", f"{r} x {_k(l)}: {rule}", measured, b["value"], b["verdict"], note))
    return out


def _decode_rows(data: dict[str, Any]) -> list[BarRow]:
    copy = data["ceilings"]["copy"]["gb_s"]
    matmul = data["ceilings"]["matmul_bf16"]["tflops"]
    points = {r["key"]: r for r in data["results"]}
    out = []
    for b in data["bars"]:
        r, v, kind = points.get(b["point"], {}), b["value"], b["kind"]
        point, rule = b["name"].split(": ", 1)
        note = b.get("note", "")
        if v is None:
            out.append(BarRow("decode", f"{point}: {rule}", "not measured", float("nan"), b["verdict"], note))
            continue
        digits = 3 if round(v, 2) == b.get("target") else 2  # a ratio's near miss (< 0.005) still reads as one
        if kind == "flashmla_ratio":
            measured = f"{v:.{digits}f}x ({r['workbench_us']:.1f} against {r['flashmla_us']:.1f} us)"
            lo, hi = r["ratio_range"]
            note = f"{len(r['repeats'])} repeats, {lo:.{digits}f}-{hi:.{digits}f}"
            if b["verdict"] != "PASS" and r["heads"] * r["qlen"] <= 32:  # memory-bound: the stream is the measure
                note += (f"; the workbench {r['kv_gb_s'] / 1000:.2f} TB/s of KV, FlashMLA "
                         f"{r['flashmla_kv_gb_s'] / 1000:.2f}, copy {copy / 1000:.2f} in the same run")
            elif b["verdict"] != "PASS":  # compute-bound: the FLOP rate is the measure
                note += (f"; the workbench {r['tflops']:.0f} TFLOP/s, FlashMLA {r['flashmla_tflops']:.0f}, the bf16 "
                         f"matmul {matmul:.0f} in the same run")
        elif kind == "scattered_ratio":
            measured = f"{v:.{digits}f}x ({r['scattered_us']:.1f} against {r['workbench_us']:.1f} us)"
            if b["verdict"] != "PASS" and r.get("repeats"):  # how the repeats spread around the bar
                ratios = [t["scattered"] / t["workbench"] for t in r["repeats"]]
                note = f"{len(ratios)} repeats, {min(ratios):.3f}-{max(ratios):.3f}"
        elif kind == "kv_fraction_of_copy":
            measured = f"{v:.1%} of copy ({v * copy / 1000:.2f} TB/s)"
        elif kind == "kv_gb_s":
            measured = f"{v / 1000:.2f} TB/s"
        elif kind == "tflops":
            measured = f"{v:.0f} TFLOP/s ({v / matmul:.0%} of matmul)"
        else:
            raise ValueError(f"decode bar {b['name']!r} has kind {kind!r}, which this table does not know")
        out.append(BarRow("decode", f"{point}: {rule}", measured, v, b["verdict"], note))
    return out


def committed_bars(device: str = "h200", data_dir: Path | str | None = None) -> tuple[list[BarRow], list[str]]:
    """Every bar of the committed ``expand`` and ``decode`` runs, and one provenance line per run.

    A benchmark whose JSON is not committed contributes no rows and a line saying so (nothing is made up).
    """
    if not isinstance(device, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", device):
        raise ValueError(f"device={device!r} must be a short lower-case name such as 'h200' (it names the file "
                         "data/bench_<name>_<device>.json)")
    rows: list[BarRow] = []
    lines: list[str] = []
    for name, make in (("expand", _expand_rows), ("decode", _decode_rows)):
        m = perfmodel.load_measurement(name, device, data_dir)
        if not m.available:
            lines.append(f"{name}: {m.reason}")
            continue
        p = m.payload.get("provenance", {})
        lines.append(f"{name}: {m.path.name}, {p.get('device', '?')}, {p.get('date_utc', '?')[:16].replace('T', ' ')} "
                     f"UTC, torch {p.get('torch', '?')}, triton {p.get('triton', '?')}; "
                     f"made by `{_command(p.get('command', '?'))}`")
        rows += make(m.payload)
    return rows, lines


def format_text(rows: list[BarRow], lines: list[str]) -> str:
    """Aligned columns for a terminal, the provenance lines first and a count of the verdicts last."""
    w_bar = max((len(r.bar) for r in rows), default=3)
    w_meas = max((len(r.measured) for r in rows), default=8)
    out = list(lines) + [""]
    for r in rows:
        out.append(f"[{r.verdict}] {r.benchmark:6s} {r.bar:{w_bar}s}  {r.measured:{w_meas}s}  {r.note}".rstrip())
    passed = sum(r.verdict == "PASS" for r in rows)
    out.append(f"\n{passed} of {len(rows)} bars pass")
    return "\n".join(out)


def format_markdown(rows: list[BarRow]) -> str:
    """A Markdown table (the README's): benchmark, bar, measured, verdict, note."""
    out = ["| benchmark | bar | measured | verdict | note |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.benchmark} | {r.bar} | {r.measured} | {r.verdict} | {r.note} |")
    return "\n".join(out)
