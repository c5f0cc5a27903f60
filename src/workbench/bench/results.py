"""The committed H200 bars of both benchmarks in one table: ``workbench results`` and the README's table.

Reads the JSON that ``workbench bench expand`` and ``workbench bench decode`` wrote on the H200 and that is
committed under ``src/workbench/data/`` (:func:`workbench.perfmodel.load_measurement`). Nothing is timed
here: every number comes from those files, and every derived number (what a missed bar would need) is
computed from numbers measured in the same run.

For each missed bar the table says how far off it is, in the terms that decide whether any kernel could
meet it:

* a qlen-ratio bar of the decode (16 heads, qlen ``q`` at most 1.25x the qlen-1 time): the qlen-``q`` call
  has ``perfmodel.mla_decode_flops(16, B, L, q)`` to do in 1.25x the qlen-1 call's time, which needs a FLOP
  rate; it is set against the bf16 matrix product measured in the same run (:func:`qlen_bar_needs`; chapter
  3, section "The benchmark");
* a latency bar of the expansion: the same case's torch ``fill_`` of the output bytes and the kernel with the
  caller's ``kv_indptr``, both timed in the same run (chapter 2).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from workbench import perfmodel
from workbench.bench import decode as bench_decode

__all__ = ["BarRow", "committed_bars", "format_markdown", "format_text", "qlen_bar_needs"]


@dataclasses.dataclass(frozen=True)
class BarRow:
    """One bar of a committed run: the rule, the measured value (as text and as the bar's number), the verdict,
    and a note (for a missed bar: how far off, from the same run; for a ratio bar: its per-round range)."""

    benchmark: str  # "expand" | "decode"
    bar: str  # the point and the rule, e.g. "256 x 4k: <= 2 us"
    measured: str  # e.g. "2.36 us"
    value: float
    verdict: str  # "PASS" | "MISS"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _point(data: dict[str, Any], heads: int, qlen: int, batch: int, context: int) -> dict[str, Any]:
    r = bench_decode.find_point(data["results"], heads, qlen, batch, context)
    if r is not None:
        return r
    raise ValueError(f"the decode results have no point heads={heads} qlen={qlen} batch={batch} context={context}: "
                     "is the file the output of a full `workbench bench decode` run?")


def qlen_bar_needs(data: dict[str, Any], qlen: int, *, heads: int = 16, factor: float = 1.25,
                   pairs: list[tuple[int, int]] | None = None) -> list[dict[str, Any]]:
    """What each qlen-ratio bar point asks of the qlen-``qlen`` call, from one committed decode run.

    The call may take ``factor`` x the qlen-1 call's time (the sweep's qlen-1 point) and must do
    ``perfmodel.mla_decode_flops(heads, B, L, qlen)`` in it: ``needs_tflops``, and that as a fraction of the bf16
    matrix product measured in the same run (``of_matmul``; above 1, no kernel doing those FLOPs in bf16 meets the
    bar on that machine). ``measured_tflops`` is the rate the kernel reached at that point in the run.

    Args:
        data: the payload of ``bench_decode_<device>.json`` (``results`` and ``ceilings``).
        qlen: query length of the bar (4 or 8 in the committed bars).
        heads: query heads (16 in the bars).
        factor: the bar's bound on the time ratio (1.25).
        pairs: ``(batch, context)`` points (default: the bars', ``bench.decode.QLEN_PAIRS``).

    Returns:
        one dict per point: batch, context, qlen1_us, allowed_us, needs_tflops, of_matmul, measured_tflops.
    """
    if qlen < 1 or factor <= 0:
        raise ValueError(f"qlen must be >= 1 and factor > 0, got qlen={qlen}, factor={factor}")
    matmul = data["ceilings"]["matmul_bf16"]["tflops"]
    rows = []
    for b, l in pairs or bench_decode.QLEN_PAIRS:
        t1 = _point(data, heads, 1, b, l)["triton_us"]
        need = perfmodel.mla_decode_flops(heads, b, l, qlen) / (factor * t1 * 1e-6) / 1e12
        rows.append(dict(batch=b, context=l, qlen1_us=t1, allowed_us=factor * t1, needs_tflops=need,
                         of_matmul=need / matmul, measured_tflops=_point(data, heads, qlen, b, l)["tflops"]))
    return rows


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
    bars = {bar.name: bar for bar in bench_decode.BARS}
    out = []
    for b in data["bars"]:
        bar = bars.get(b["name"])
        if bar is None:
            raise ValueError(f"decode bar {b['name']!r} is not one of bench.decode.BARS: is the file current?")
        point, rule = b["name"].split(": ", 1)
        v, note = b["value"], ""
        if bar.kind == "kv_fraction_of_copy":
            measured = f"{v:.1%} of copy ({v * copy / 1000:.2f} TB/s)"
        elif bar.kind == "kv_gb_s":
            measured = f"{v / 1000:.2f} TB/s"
        elif bar.kind == "tflops":
            measured = f"{v:.0f} TFLOP/s ({v / matmul:.0%} of matmul)"
        elif bar.kind == "qlen_time_ratio":
            measured = f"{v:.2f}x"
            if "rounds" in b:
                note = f"median of {len(b['rounds'])} paired rounds, {b['ratio_min']:.2f}-{b['ratio_max']:.2f}"
            if b["verdict"] != "PASS":
                (n,) = qlen_bar_needs(data, bar.qlen, heads=bar.heads, factor=bar.target,
                                      pairs=[(bar.batch, bar.context)])
                note += (f"; needs {n['needs_tflops']:.0f} TFLOP/s = {n['of_matmul']:.0%} of the bf16 matmul measured "
                         f"in the same run ({matmul:.0f}); the kernel reaches {n['measured_tflops']:.0f}")
        else:
            raise ValueError(f"decode bar {b['name']!r} has kind {bar.kind!r}, which this table does not know")
        out.append(BarRow("decode", f"{point}: {rule}", measured, v, b["verdict"], note.lstrip("; ")))
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
