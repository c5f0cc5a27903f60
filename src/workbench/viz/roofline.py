"""Intro: the MLA decode roofline on H200, MI300X and MI355X."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from workbench import perfmodel

COLORS = {"H200": "#76b900", "MI300X": "#ed1c24", "MI355X": "#8b0000"}


def roofline_figure(hardware: tuple[str, ...] = ("H200", "MI300X", "MI355X"),
                    points: tuple[tuple[int, int], ...] = ((16, 1), (16, 4), (16, 8), (128, 1), (128, 4)),
                    context: int = 8192) -> go.Figure:
    """Log-log roofline of MLA decode (bf16 KV) for each device, with (heads, qlen) operating points.

    Each device's roof is ``min(peak, intensity * bandwidth)``; each point sits on the roof at the
    intensity of MLA decode with that head count and query length (:func:`perfmodel.mla_decode_intensity`).
    """
    intensity = np.logspace(0, 4, 200)
    fig = go.Figure()
    for name in hardware:
        hw = perfmodel.HARDWARE[name]
        roof = np.minimum(hw.bf16_tflops, intensity * hw.bandwidth_tb_s)
        fig.add_trace(go.Scatter(
            x=intensity, y=roof, mode="lines", name=f"{name} roof", line={"color": COLORS[name]},
            hovertemplate=f"{name}<br>%{{x:.0f}} FLOP/B -> %{{y:.0f}} TFLOP/s<extra></extra>",
        ))
        xs, ys, labels = [], [], []
        for heads, qlen in points:
            ai = perfmodel.mla_decode_intensity(heads, qlen, context)
            xs.append(ai)
            ys.append(min(hw.bf16_tflops, ai * hw.bandwidth_tb_s))
            labels.append(f"H={heads}, qlen={qlen}")
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="markers", name=f"{name}: MLA decode", marker={"color": COLORS[name], "size": 9},
            text=labels, hovertemplate="%{text}<br>%{x:.0f} FLOP/B, bound %{y:.0f} TFLOP/s<extra></extra>",
        ))
    fig.update_layout(
        title=f"MLA decode roofline (bf16 KV, context {context})",
        xaxis={"type": "log", "title": "arithmetic intensity (FLOP / byte)"},
        yaxis={"type": "log", "title": "attainable TFLOP/s"},
        width=760, height=460, template="plotly_white", legend={"font": {"size": 10}},
    )
    return fig
