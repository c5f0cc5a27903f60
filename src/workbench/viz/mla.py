"""Chapter 3's figures: the MLA decode roofline with both kernels measured in one run, and the time ratio to FlashMLA.

Data: ``workbench/data/bench_decode_h200.json`` (written by ``workbench bench decode --peer-path ...``). The roofs are
the ceilings measured in the same run (copy bandwidth, bf16 matmul) and, dashed, the H200 datasheet. Older peers
(vLLM 0.20's TRITON_MLA, measured on an H200 with the workbench's harness) are drawn at the intensity of their shape.
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

# (label, heads, qlen, value, unit): vLLM v0.20's TRITON_MLA decode (decode_attention_fwd, qlen 1, splits as vLLM
# picks them) measured on an H200 with this workbench's harness; GB/s values are KV-read bandwidth at 16 heads
OLDER_PEERS: list[tuple[str, int, int, float, str]] = [
    ("vLLM 0.20 TRITON_MLA, B=16 L=4k", 16, 1, 396, "GB/s"),
    ("vLLM 0.20 TRITON_MLA, B=128 L=8k", 16, 1, 1415, "GB/s"),
    ("vLLM 0.20 TRITON_MLA, B=64 L=32k", 16, 1, 1388, "GB/s"),
    ("vLLM 0.20 TRITON_MLA, 128 heads B=64 L=4k", 128, 1, 48, "TFLOP/s"),
]


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


def _label(r: dict[str, Any]) -> str:
    return f"{r['heads']}x{r['qlen']} B={r['batch']} L={r['context'] // 1024}k"


def decode_roofline_figure(data: dict[str, Any] | None = None) -> go.Figure:
    """Log-log roofline: the measured ceilings (solid), the H200 datasheet (dashed), every measured point of the
    workbench (filled) and of FlashMLA in the same run (open), labelled, and the older peers (diamonds)."""
    data = data if data is not None else load_decode_results()
    hw = perfmodel.HARDWARE["H200"]
    x = np.logspace(1.2, 3.2, 200)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=np.minimum(hw.bf16_tflops, x * hw.bandwidth_tb_s), mode="lines",
                             name="H200 datasheet roof", line={"color": "#999", "dash": "dash"}))
    if data:
        bw = data["ceilings"]["copy"]["gb_s"] / 1000
        peak = data["ceilings"]["matmul_bf16"]["tflops"]
        fig.add_trace(go.Scatter(x=x, y=np.minimum(peak, x * bw), mode="lines", line={"color": "#333"},
                                 name=f"measured roof: copy {bw:.2f} TB/s, matmul {peak:.0f} TFLOP/s"))
        rows = data["results"]
        fig.add_trace(go.Scatter(
            x=[r["intensity_flop_per_byte"] for r in rows], y=[r["tflops"] for r in rows], mode="markers",
            name="workbench (Triton/Gluon)", marker={"color": "#1f77b4", "size": 8},
            text=[f"{_label(r)}: {r['workbench_us']:.1f} us, {r['kv_gb_s']:.0f} GB/s" for r in rows],
            hovertemplate="%{text}<br>%{y:.0f} TFLOP/s<extra></extra>"))
        peer = [r for r in rows if "flashmla_us" in r]
        if peer:
            fig.add_trace(go.Scatter(
                x=[r["intensity_flop_per_byte"] for r in peer], y=[r["flashmla_tflops"] for r in peer],
                mode="markers", name="FlashMLA (same run, same cache)",
                marker={"symbol": "circle-open", "color": "#d62728", "size": 11, "line": {"width": 2}},
                text=[f"{_label(r)}: {r['flashmla_us']:.1f} us (workbench {r['ratio']:.2f}x)" for r in peer],
                hovertemplate="%{text}<br>%{y:.0f} TFLOP/s<extra></extra>"))
        # one label per shape class (heads x qlen) at its highest point: the labels stay readable
        best: dict[tuple[int, int], dict[str, Any]] = {}
        for r in rows:
            k = (r["heads"], r["qlen"])
            if k not in best or r["tflops"] > best[k]["tflops"]:
                best[k] = r
        for (h, q), r in sorted(best.items()):
            fig.add_annotation(x=np.log10(r["intensity_flop_per_byte"]), y=np.log10(r["tflops"]), text=f"{h}x{q}",
                               showarrow=False, yshift=12, font={"size": 10})
    px, py, labels = [], [], []
    for label, h, q, value, unit in OLDER_PEERS:
        ai = _intensity(h, q)
        px.append(ai)
        py.append(value * ai / 1000 if unit == "GB/s" else value)
        labels.append(f"{label}: {value:g} {unit} (H200)")
    fig.add_trace(go.Scatter(x=px, y=py, mode="markers", name="vLLM 0.20 TRITON_MLA (H200)", text=labels,
                             marker={"symbol": "diamond-open", "size": 9, "color": "#444"},
                             hovertemplate="%{text}<extra></extra>"))
    fig.update_layout(title="MLA decode on an H200: roofline" + ("" if data else " (no measurements)"),
                      xaxis={"type": "log", "title": "FLOP per KV byte (labels: heads x qlen)"},
                      yaxis={"type": "log", "title": "TFLOP/s"}, width=760, height=460, template="plotly_white",
                      legend={"font": {"size": 10}})
    return fig


def decode_ratio_figure(data: dict[str, Any] | None = None) -> go.Figure:
    """Per point, the workbench's time over FlashMLA's (median of alternating rounds, the range as error bars), with
    the bars: 1.00x up to 32 rows, 1.10x above; and the token-scattered layout over the paged one."""
    data = data if data is not None else load_decode_results()
    fig = go.Figure()
    rows = [r for r in (data or {}).get("results", []) if "ratio" in r]
    if rows:
        labels = [_label(r) for r in rows]
        fig.add_trace(go.Bar(x=labels, y=[r["ratio"] for r in rows], name="workbench / FlashMLA",
                             error_y={"type": "data", "symmetric": False,
                                      "array": [r["ratio_range"][1] - r["ratio"] for r in rows],
                                      "arrayminus": [r["ratio"] - r["ratio_range"][0] for r in rows]},
                             marker={"color": ["#2ca02c" if r["ratio"] <= (1.0 if r["heads"] * r["qlen"] <= 32
                                                                           else 1.1) else "#d62728" for r in rows]}))
        fig.add_trace(go.Scatter(x=labels, y=[r["scattered_ratio"] for r in rows], mode="markers",
                                 name="token-scattered / paged-64 (workbench)", marker={"symbol": "x", "size": 9}))
        fig.add_hline(y=1.0, line={"color": "#333"}, annotation_text="1.00x (bar up to 32 rows)")
        fig.add_hline(y=1.1, line={"color": "#333", "dash": "dot"}, annotation_text="1.10x (bar from 64 rows)")
    fig.update_layout(title="Decode time relative to FlashMLA" + ("" if rows else " (no FlashMLA run committed)"),
                      yaxis={"title": "time ratio"}, xaxis={"tickangle": -45, "tickfont": {"size": 9}}, width=780,
                      height=440, template="plotly_white", legend={"font": {"size": 10}})
    return fig
