"""Chapter 3's figures: the MLA decode roofline with both kernels measured in one run, and the time ratio to FlashMLA.

Data: ``workbench/data/bench_decode_h200.json`` (written by ``benchmarks/decode.py --peer-path ...``). The roofs are
the ceilings measured in the same run (copy bandwidth, bf16 matmul) and, dashed, the H200 datasheet. Older peers
(vLLM 0.20's TRITON_MLA, measured on an H200 with the workbench's harness) are drawn at the intensity of their shape.

Every point of the roofline is identifiable without hovering: its x position is its shape class (heads x qlen,
written above the points of that intensity), its marker shape is its batch and context (a legend entry each), its
colour and fill are the kernel. The points of one class are dodged sideways by a few per cent per batch and context
(the same offset for every kernel), so that they do not hide each other; hovering shows the exact numbers.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import numpy as np
import plotly.graph_objects as go

from workbench import perfmodel

__all__ = ["OLDER_PEERS", "decode_ratio_figure", "decode_roofline_figure", "load_decode_results"]

DATA_FILE = "bench_decode_h200.json"

# (heads, qlen, batch, context, value, unit): vLLM v0.20's TRITON_MLA decode (decode_attention_fwd, qlen 1, splits as
# vLLM picks them) measured on an H200 with this workbench's harness; GB/s values are KV-read bandwidth
OLDER_PEERS: list[tuple[int, int, int, int, float, str]] = [
    (16, 1, 16, 4096, 396, "GB/s"),
    (16, 1, 128, 8192, 1415, "GB/s"),
    (16, 1, 64, 32768, 1388, "GB/s"),
    (128, 1, 64, 4096, 48, "TFLOP/s"),
]

_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "star", "pentagon", "hexagon", "cross")
_WORKBENCH, _FLASHMLA, _VLLM = "#1f77b4", "#d62728", "#555"


def load_decode_results(path: str | None = None) -> dict[str, Any] | None:
    """The committed benchmark JSON (or ``path``); ``None`` if there is none."""
    if path is not None:
        with open(path) as f:
            return json.load(f)
    res = resources.files("workbench") / "data" / DATA_FILE
    if not res.is_file():
        return None
    return json.loads(res.read_text())


def _intensity(heads: int, qlen: int) -> float:
    """FLOP per KV byte (the benchmark's convention: bytes = KV rows only)."""
    return 2 * heads * qlen * (perfmodel.QK_HEAD_DIM + perfmodel.KV_LORA_RANK) / (perfmodel.QK_HEAD_DIM * 2)


def _shape(batch: int, context: int) -> str:
    return f"B={batch} L={context // 1024}k"


def _label(r: dict[str, Any]) -> str:
    return f"{r['heads']}x{r['qlen']} {_shape(r['batch'], r['context'])}"


def decode_roofline_figure(data: dict[str, Any] | None = None) -> go.Figure:
    """Log-log roofline: the measured ceilings (solid), the H200 datasheet (dashed), every measured point of the
    workbench (filled) and of FlashMLA in the same run (open), and the older peers (grey, open). Each intensity is
    labelled with its shape classes (heads x qlen); each marker shape is one batch and context (legend)."""
    data = data if data is not None else load_decode_results()
    hw = perfmodel.HARDWARE["H200"]
    x = np.logspace(np.log10(15), np.log10(700), 200)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=np.minimum(hw.bf16_tflops, x * hw.bandwidth_tb_s), mode="lines",
                             name=f"datasheet roof: {hw.bandwidth_tb_s:g} TB/s, {hw.bf16_tflops:g} TFLOP/s",
                             line={"color": "#999", "dash": "dash"}))
    rows = (data or {}).get("results", [])
    shapes = list(dict.fromkeys([(r["batch"], r["context"]) for r in rows]
                                + [(b, c) for _, _, b, c, _, _ in OLDER_PEERS]))
    symbol = {s: _SYMBOLS[i % len(_SYMBOLS)] for i, s in enumerate(shapes)}
    dodge = {s: 1.04 ** (i - (len(shapes) - 1) / 2) for i, s in enumerate(shapes)}  # x factor per batch/context
    tops: dict[float, list[Any]] = {}  # intensity -> [highest y, {class labels}]

    def points(xs, ys, name, color, open_, keys, text):
        """One kernel's points: ``xs`` intensities, ``keys`` their (batch, context), ``text`` starting with the
        class label ("16x8 ..."); also records each intensity's highest point and classes for the labels."""
        fig.add_trace(go.Scatter(
            x=[xi * dodge[k] for xi, k in zip(xs, keys)], y=ys, mode="markers", name=name, text=text,
            hovertemplate="%{text}<extra></extra>",
            marker={"symbol": [symbol[k] + ("-open" if open_ else "") for k in keys], "color": color,
                    "size": 11 if open_ else 8, "line": {"width": 2 if open_ else 0, "color": color}}))
        for xi, yi, t in zip(xs, ys, text):
            top = tops.setdefault(round(xi, 3), [0.0, set()])
            top[0] = max(top[0], yi)
            top[1].add(t.split(" ", 1)[0])

    if data:
        bw = data["ceilings"]["copy"]["gb_s"] / 1000
        peak = data["ceilings"]["matmul_bf16"]["tflops"]
        fig.add_trace(go.Scatter(x=x, y=np.minimum(peak, x * bw), mode="lines", line={"color": "#333"},
                                 name=f"measured roof: copy {bw:.2f} TB/s, matmul {peak:.0f} TFLOP/s"))
        points([r["intensity_flop_per_byte"] for r in rows], [r["tflops"] for r in rows], "workbench (filled)",
               _WORKBENCH, False, [(r["batch"], r["context"]) for r in rows],
               [f"{_label(r)}: workbench {r['workbench_us']:.1f} us, {r['tflops']:.0f} TFLOP/s" for r in rows])
        peer = [r for r in rows if "flashmla_us" in r]
        if peer:
            points([r["intensity_flop_per_byte"] for r in peer], [r["flashmla_tflops"] for r in peer],
                   "FlashMLA, same run (open)", _FLASHMLA, True, [(r["batch"], r["context"]) for r in peer],
                   [f"{_label(r)}: FlashMLA {r['flashmla_us']:.1f} us, {r['flashmla_tflops']:.0f} TFLOP/s"
                    for r in peer])
    old = [(h, q, b, c, v * _intensity(h, q) / 1000 if u == "GB/s" else v, f"{v:g} {u}")
           for h, q, b, c, v, u in OLDER_PEERS]
    points([_intensity(h, q) for h, q, *_ in old], [y for *_, y, _ in old], "vLLM 0.20 TRITON_MLA (grey)", _VLLM,
           True, [(b, c) for _, _, b, c, _, _ in old],
           [f"{h}x{q} {_shape(b, c)}: vLLM 0.20 TRITON_MLA, {t}" for h, q, b, c, _, t in old])
    for s in shapes:  # one legend entry per marker shape
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=_shape(*s),
                                 marker={"symbol": symbol[s], "color": "#777", "size": 8}))
    for i, (xi, (yi, classes)) in enumerate(sorted(tops.items())):  # neighbours' labels at alternating heights
        fig.add_annotation(x=np.log10(xi), y=np.log10(yi), yshift=14 + 14 * (i % 2), showarrow=False,
                           font={"size": 11}, bgcolor="rgba(255,255,255,0.85)",
                           text=" / ".join(sorted(classes, key=lambda c: tuple(map(int, c.split("x"))))))
    fig.update_layout(title="MLA decode on an H200: roofline" + ("" if data else " (no measurements)"),
                      xaxis={"type": "log", "title": "FLOP per KV byte (labels: heads x qlen)",
                             "range": [np.log10(15), np.log10(700)]},
                      yaxis={"type": "log", "title": "TFLOP/s", "range": [np.log10(8), np.log10(1200)]},
                      width=760, height=560, template="plotly_white", margin={"t": 50, "r": 20},
                      legend={"font": {"size": 10}, "orientation": "h", "x": 0, "y": -0.15})
    return fig


def decode_ratio_figure(data: dict[str, Any] | None = None) -> go.Figure:
    """Per point, the workbench's time over FlashMLA's (median of the alternating repetitions, their range as error
    bars), green where it meets its bar (1.00x up to 32 folded rows, 1.10x above), red where not; and the
    token-scattered layout over the paged one (crosses)."""
    data = data if data is not None else load_decode_results()
    fig = go.Figure()
    rows = [r for r in (data or {}).get("results", []) if "ratio" in r]
    if rows:
        labels = [_label(r) for r in rows]
        bar = [1.0 if r["heads"] * r["qlen"] <= 32 else 1.1 for r in rows]
        fig.add_trace(go.Bar(x=labels, y=[r["ratio"] for r in rows], name="workbench / FlashMLA (green: within bar)",
                             error_y={"type": "data", "symmetric": False,
                                      "array": [r["ratio_range"][1] - r["ratio"] for r in rows],
                                      "arrayminus": [r["ratio"] - r["ratio_range"][0] for r in rows]},
                             marker={"color": ["#2ca02c" if r["ratio"] <= b else "#d62728"
                                               for r, b in zip(rows, bar)]}))
        fig.add_trace(go.Scatter(x=labels, y=[r["scattered_ratio"] for r in rows], mode="markers",
                                 name="token-scattered / paged-64", marker={"symbol": "x", "size": 9,
                                                                            "color": "#333"}))
        for y, dash, name in ((1.0, "solid", "bar up to 32 rows: 1.00x"), (1.1, "dot", "bar from 64 rows: 1.10x")):
            fig.add_hline(y=y, line={"color": "#333", "dash": dash, "width": 1})
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=name,
                                     line={"color": "#333", "dash": dash, "width": 1}))
    fig.update_layout(title="Decode time relative to FlashMLA" + ("" if rows else " (no FlashMLA run committed)"),
                      yaxis={"title": "time ratio"}, template="plotly_white", width=780, height=480,
                      xaxis={"title": "heads x qlen, batch, context", "tickangle": -45, "tickfont": {"size": 9}},
                      legend={"font": {"size": 10}, "orientation": "h", "x": 0, "y": 1.12}, margin={"t": 90})
    return fig
