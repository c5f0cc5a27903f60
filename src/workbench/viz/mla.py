"""Chapter 3: the MLA decode roofline with measured points and peers, and the bandwidth sweep.

Data: ``workbench/data/bench_decode_h200.json`` (written by ``workbench bench decode``). The roofs are
the ceilings measured in the same run (copy bandwidth, bf16 matmul) and, dashed, the H200 datasheet.
Peers are published or previously measured numbers (shared/CONTEXT.md sections 4-5), converted to
TFLOP/s at the intensity of their shape, so every marker sits on one chart.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import numpy as np
import plotly.graph_objects as go

from workbench import perfmodel

__all__ = ["PEERS", "decode_bandwidth_figure", "decode_fixed_cost_figure", "decode_roofline_figure",
           "decode_trace_figure", "fixed_cost_fit", "load_decode_results", "trace_segments"]

DATA_FILE = "bench_decode_h200.json"

# (label, heads, qlen, value, unit, source). GB/s values are KV-read bandwidth at 16 heads, qlen 1.
PEERS: list[tuple[str, int, int, float, str, str]] = [
    ("vLLM 0.20 TRITON_MLA, B=16 L=4k", 16, 1, 396, "GB/s", "H200, measured (CONTEXT 5)"),
    ("vLLM 0.20 TRITON_MLA, B=128 L=8k", 16, 1, 1415, "GB/s", "H200, measured (CONTEXT 5)"),
    ("vLLM 0.20 TRITON_MLA, B=64 L=32k", 16, 1, 1388, "GB/s", "H200, measured (CONTEXT 5)"),
    ("vLLM 0.20 TRITON_MLA, 128 heads B=64 L=4k", 128, 1, 48, "TFLOP/s", "H200, measured (CONTEXT 5)"),
    ("plain split-KV Triton, B=64 L=32k", 16, 1, 3850, "GB/s", "H200, measured (CONTEXT 5)"),
    ("plain split-KV Triton, B=16 L=4k", 16, 1, 1470, "GB/s", "H200, measured (CONTEXT 5)"),
    ("plain split-KV Triton, 128 heads B=64 L=4k", 128, 1, 168, "TFLOP/s", "H200, measured (CONTEXT 5)"),
    ("FlashMLA memory-bound (H800)", 16, 1, 3000, "GB/s", "FlashMLA README (H800, not H200)"),
    ("FlashMLA compute-bound (H800)", 128, 1, 620, "TFLOP/s", "FlashMLA README, 580-660 (H800, not H200)"),
]

GROUP_COLORS = {(16, 1): "#1f77b4", (16, 2): "#17becf", (16, 4): "#2ca02c", (16, 6): "#bcbd22", (16, 8): "#ff7f0e",
                (128, 1): "#d62728", (128, 2): "#e377c2", (128, 4): "#9467bd", (128, 6): "#8c564b",
                (128, 8): "#7f7f7f"}


def load_decode_results(path: str | None = None) -> dict[str, Any] | None:
    """The committed benchmark JSON (or ``path``); ``None`` if there is none yet."""
    if path is not None:
        with open(path) as f:
            return json.load(f)
    res = resources.files("workbench") / "data" / DATA_FILE
    if not res.is_file():
        return None
    return json.loads(res.read_text())


def _intensity(heads: int, qlen: int, context: int = 8192) -> float:
    """FLOP per KV byte (the benchmark's convention: bytes = KV rows only)."""
    return 2 * heads * qlen * (perfmodel.QK_HEAD_DIM + perfmodel.KV_LORA_RANK) / (perfmodel.QK_HEAD_DIM * 2)


def decode_roofline_figure(data: dict[str, Any] | None = None) -> go.Figure:
    """Log-log roofline: measured ceilings (solid), H200 datasheet (dashed), every measured point by
    (heads, qlen), and the peers (open symbols)."""
    data = data if data is not None else load_decode_results()
    hw = perfmodel.HARDWARE["H200"]
    x = np.logspace(0.5, 3.5, 200)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=np.minimum(hw.bf16_tflops, x * hw.bandwidth_tb_s), mode="lines",
                             name="H200 datasheet roof", line={"color": "#999", "dash": "dash"}))
    if data:
        bw = data["ceilings"]["copy"]["gb_s"] / 1000
        peak = data["ceilings"]["matmul_bf16"]["tflops"]
        fig.add_trace(go.Scatter(x=x, y=np.minimum(peak, x * bw), mode="lines", line={"color": "#333"},
                                 name=f"measured roof: copy {bw:.2f} TB/s, matmul {peak:.0f} TFLOP/s"))
        groups: dict[tuple[int, int], list[dict]] = {}
        for r in data["results"]:
            groups.setdefault((r["heads"], r["qlen"]), []).append(r)
        for (h, q), rows in sorted(groups.items()):
            fig.add_trace(go.Scatter(
                x=[r["intensity_flop_per_byte"] for r in rows], y=[r["tflops"] for r in rows], mode="markers",
                name=f"this kernel: H={h}, qlen={q}", marker={"color": GROUP_COLORS.get((h, q), "#000"), "size": 7},
                text=[f"B={r['batch']} L={r['context']}: {r['triton_us']:.1f} us, {r['kv_gb_s']:.0f} GB/s"
                      for r in rows],
                hovertemplate="%{text}<br>%{y:.0f} TFLOP/s<extra></extra>"))
    px, py, labels = [], [], []
    for label, h, q, value, unit, source in PEERS:
        ai = _intensity(h, q)
        px.append(ai)
        py.append(value * ai / 1000 if unit == "GB/s" else value)
        labels.append(f"{label} ({value:g} {unit}; {source})")
    fig.add_trace(go.Scatter(x=px, y=py, mode="markers", name="peers (hover for source)", text=labels,
                             marker={"symbol": "diamond-open", "size": 10, "color": "#444"},
                             hovertemplate="%{text}<extra></extra>"))
    title = "MLA decode on H200: measured points, roofs and peers"
    if not data:
        title += " (no measurements committed yet)"
    fig.update_layout(title=title, xaxis={"type": "log", "title": "FLOP per KV byte"},
                      yaxis={"type": "log", "title": "TFLOP/s"}, width=780, height=480, template="plotly_white",
                      legend={"font": {"size": 10}})
    return fig


def decode_bandwidth_figure(data: dict[str, Any] | None = None, heads: int = 16, qlen: int = 1) -> go.Figure:
    """Effective KV-read bandwidth against context, one line per batch size, with the copy ceiling."""
    data = data if data is not None else load_decode_results()
    fig = go.Figure()
    if data:
        rows = [r for r in data["results"] if r["heads"] == heads and r["qlen"] == qlen]
        for b in sorted({r["batch"] for r in rows}):
            pts = sorted((r for r in rows if r["batch"] == b), key=lambda r: r["context"])
            fig.add_trace(go.Scatter(x=[r["context"] for r in pts], y=[r["kv_gb_s"] for r in pts],
                                     mode="lines+markers", name=f"Triton, B={b}"))
            torch_pts = [r for r in pts if "torch_kv_gb_s" in r]
            if torch_pts:
                fig.add_trace(go.Scatter(x=[r["context"] for r in torch_pts], y=[r["torch_kv_gb_s"] for r in torch_pts],
                                         mode="lines+markers", line={"dash": "dot"}, name=f"torch path, B={b}"))
        copy = data["ceilings"]["copy"]["gb_s"]
        fig.add_hline(y=copy, line={"color": "#333"}, annotation_text=f"copy {copy:.0f} GB/s (same run)")
        fig.add_hline(y=0.9 * copy, line={"color": "#333", "dash": "dot"}, annotation_text="90 % of copy")
    fig.update_layout(title=f"KV-read bandwidth, {heads} heads, qlen {qlen}" + ("" if data else " (no data yet)"),
                      xaxis={"type": "log", "title": "context L (tokens)"}, yaxis={"title": "GB/s"},
                      width=760, height=440, template="plotly_white", legend={"font": {"size": 10}})
    return fig


def fixed_cost_fit(data: dict[str, Any] | None = None, batch: int = 128,
                   table_key: str = "fixed_cost") -> dict[str, Any] | None:
    """Where the time of a memory-bound call goes, from ``explore[table_key]`` of the committed JSON
    (``fixed_cost``: the 16-row default of rounds 2-7; ``fixed_cost_idx_ahead``: the current large-batch one).

    At one batch size the full call and the split kernel alone were timed over a range of contexts; a
    least-squares line ``time = fixed + kv_bytes / rate`` through each gives the streaming rate (GB/s) and
    the fixed cost (us) that no longer context removes. Also returned: the merge kernel alone (mean over
    those contexts) and the one-tile call (``batch 1, 64 tokens``: the latency floor of a launch).
    ``None`` when the JSON has no such table.
    """
    data = data if data is not None else load_decode_results()
    table = (data or {}).get("explore", {}).get(table_key)
    if not table:
        return None
    out: dict[str, Any] = {"batch": batch, "copy_gb_s": table["ceilings"]["copy"]["gb_s"]}
    for kind in ("full", "split only"):
        pts = [r for r in table["rows"] if r["kind"] == kind and r["batch"] == batch]
        x = np.array([r["batch"] * r["context"] * perfmodel.QK_HEAD_DIM * 2 for r in pts], dtype=float)
        y = np.array([r["us"] for r in pts])
        slope, fixed = np.polyfit(x, y, 1)
        key = kind.replace(" ", "_")
        out[key] = {"rate_gb_s": 1e-3 / slope, "fixed_us": fixed, "contexts": [r["context"] for r in pts],
                    "us": y.tolist()}
    merges = [r["us"] for r in table["rows"] if r["kind"] == "merge only" and r["batch"] == batch]
    out["merge_only_us"] = float(np.mean(merges)) if merges else None
    floor = [r["us"] for r in table["rows"] if r["kind"] == "full" and r["batch"] == 1]
    out["one_tile_us"] = floor[0] if floor else None
    return out


def decode_fixed_cost_figure(data: dict[str, Any] | None = None, batch: int = 128) -> go.Figure:
    """Time of a 16-head qlen-1 call against the KV bytes it reads: the full call and the split kernel
    alone (markers), their fitted lines ``fixed + bytes / rate``, and the copy-bandwidth line through 0."""
    fit = fixed_cost_fit(data, batch)
    fig = go.Figure()
    if fit:
        ctx = np.array(fit["full"]["contexts"], dtype=float)
        gb = batch * ctx * perfmodel.QK_HEAD_DIM * 2 / 1e9
        for key, name, color in (("full", "full call (split + merge)", "#1f77b4"),
                                 ("split_only", "split kernel alone", "#2ca02c")):
            f = fit[key]
            fig.add_trace(go.Scatter(x=gb, y=f["us"], mode="markers", marker={"color": color}, name=name))
            fig.add_trace(go.Scatter(x=[0, gb.max()], y=[f["fixed_us"], f["fixed_us"] + gb.max() / f["rate_gb_s"] * 1e6],
                                     mode="lines", line={"color": color, "dash": "dot"},
                                     name=f"fit: {f['fixed_us']:.0f} us + bytes / {f['rate_gb_s']:.0f} GB/s"))
        copy = fit["copy_gb_s"]
        fig.add_trace(go.Scatter(x=[0, gb.max()], y=[0, gb.max() / copy * 1e6], mode="lines",
                                 line={"color": "#333"}, name=f"bytes / copy bandwidth ({copy:.0f} GB/s)"))
    fig.update_layout(title=f"Where a memory-bound call's time goes (16 heads, qlen 1, B={batch})"
                      + ("" if fit else " (no data yet)"),
                      xaxis={"title": "KV read per call (GB)"}, yaxis={"title": "time per call (us)"},
                      width=760, height=440, template="plotly_white",
                      legend={"font": {"size": 10}, "orientation": "h", "y": -0.2})
    return fig


TRACE_PHASES = (("PDL wait", "#c7c7c7"), ("first tile", "#ff7f0e"), ("later tiles", "#1f77b4"),
                ("after the last tile", "#2ca02c"))


def trace_segments(row: dict[str, Any]) -> dict[str, Any]:
    """The phases of each program of one traced call (a row of ``explore["trace"]["rows"]`` that kept its
    ``timeline``), in microseconds from the call's first split-program entry: per split program, sorted by
    entry, ``(start, length)`` of the PDL wait, the first tile, the later tiles and what follows the last
    tile (the last tile's P @ V, the normalisation and the partial store); per merge program
    ``(start, length)`` from its entry to its exit, and when its wait returned."""
    tl = row.get("timeline")
    if not tl:
        raise ValueError(f"trace row {row.get('label')!r} has no per-program timeline (only the first point keeps one)")
    split = []
    for stamps in tl["split_ns"]:  # entry, after wait, exit, tile 0, tile 1, ... (ns, None = not written)
        entry, wait, exit_ = stamps[0], stamps[1], stamps[2]
        tiles = [t for t in stamps[3:] if t is not None]
        if entry is None or wait is None or exit_ is None or not tiles:
            continue
        us = [v / 1e3 for v in (entry, wait, tiles[0], tiles[-1], exit_)]
        split.append([(us[0], us[1] - us[0]), (us[1], us[2] - us[1]), (us[2], us[3] - us[2]), (us[3], us[4] - us[3])])
    split.sort(key=lambda p: p[0][0])
    merge = sorted(((m[0] / 1e3, (m[2] - m[0]) / 1e3, m[1] / 1e3) for m in tl["merge_ns"] if None not in m[:3]))
    return {"split": split, "merge": merge}


def decode_trace_figure(data: dict[str, Any] | None = None, label: str | None = None,
                        source: str = "trace") -> go.Figure:
    """One call at B=16 L=4k as the GPU ran it (``workbench bench decode --trace``): a bar per split program
    (its PDL wait, first tile, later tiles, and the work after its last tile) and per merge program (from the
    return of its PDL wait to its exit: a merge launched early waits idle before that), from %globaltimer
    stamps. ``label``: which traced config (default: the first with a timeline); ``source``: the ``explore``
    entry that holds the traces (``"trace_round36"``: the swapped gluon kernel's)."""
    data = load_decode_results() if data is None else data
    rows = [r for r in (data or {}).get("explore", {}).get(source, {}).get("rows", []) if r.get("timeline")]
    fig = go.Figure()
    row = next((r for r in rows if label is None or r["label"] == label), None)
    if label is not None and row is None:
        raise ValueError(f"no traced config {label!r} with a timeline; traced: {[r['label'] for r in rows]}")
    if row is None:
        fig.update_layout(title="Where a call's time goes (no trace yet)")
        return fig
    seg = trace_segments(row)
    n = len(seg["split"])
    for i, (name, color) in enumerate(TRACE_PHASES):
        fig.add_trace(go.Bar(orientation="h", y=list(range(n)), base=[p[i][0] for p in seg["split"]],
                             x=[p[i][1] for p in seg["split"]], marker={"color": color, "line": {"width": 0}},
                             name=name, width=1.0))
    fig.add_trace(go.Bar(orientation="h", y=[n + 2 + j for j in range(len(seg["merge"]))],
                         base=[m[2] for m in seg["merge"]], x=[m[0] + m[1] - m[2] for m in seg["merge"]],
                         marker={"color": "#d62728", "line": {"width": 0}}, name="merge program", width=1.0))
    m = row["summary"]["median"]
    fig.update_layout(
        barmode="overlay", template="plotly_white", width=760, height=460,
        title=f"One call, H={row['heads']} B={row['batch']} L={row['context'] // 1024}k, {row['label']} "
              f"({row['num_splits']} splits): {m['per_tile']:.2f} us per later tile, call every {m['period']:.1f} us",
        xaxis={"title": "us after the first split program started"},
        yaxis={"title": f"split programs (0-{n - 1}, by start), then merge programs", "showticklabels": False},
        legend={"orientation": "h", "y": -0.2})
    return fig
