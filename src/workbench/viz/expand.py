"""Chapter 2: the per-token index expansion, drawn.

* :func:`expand_bench_figure`: the benchmark (``workbench bench expand``) as grouped bars per batch shape,
  with a dropdown between time (us, log scale) and achieved bandwidth (GB/s, with the copy ceiling
  and the 90 % bar). Built from the committed H200 JSON unless a result dict is passed in.
* :func:`loose_bound_figure`: each case with its tight bound and under a loose 128k one, both launches;
* :func:`expansion_figure`: a small batch's block table and the flat token rows it expands to.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import plotly.graph_objects as go
import torch

from workbench import expand

__all__ = ["COMMITTED_RESULTS", "case_label", "expand_bench_figure", "expansion_figure", "load_expand_results",
           "loose_bound_figure"]

COMMITTED_RESULTS = "bench_expand_h200.json"  # in workbench/data/
_COLORS = {"kernel": "#1f77b4", "serial": "#ff7f0e", "dense": "#7f7f7f", "fill": "#2ca02c"}
_NAMES = {"kernel": "2-D grid kernel (this library)", "serial": "one program per request (vLLM 0.20 design)",
          "dense": "dense [R, max_len] + mask (torch, eager)", "fill": "fill_ of the same output (no indexing)"}


def load_expand_results(name: str = COMMITTED_RESULTS) -> dict[str, Any]:
    """The committed benchmark result (``src/workbench/data/<name>``) as a dict."""
    return json.loads(resources.files("workbench.data").joinpath(name).read_text())


def case_label(case: dict[str, Any]) -> str:
    """``"256 x 4k"``, ``"1 x 97k"``, ``"1024 x 1000"``, ``"16384 x 32"``: tokens in k only from 2048 on."""
    n = case["seq_len"]
    if n < 2048:
        size = str(n)
    else:
        size = f"{n // 1024}k" if n % 1024 == 0 else f"{n / 1000:.0f}k"
    return f"{case['num_reqs']} x {size}"


def expand_bench_figure(results: dict[str, Any] | None = None) -> go.Figure:
    """Grouped bars per case: time (log us) or bandwidth (GB/s vs the copy ceiling), switched by a dropdown."""
    results = results or load_expand_results()
    cases = results["cases"]
    labels = [case_label(c) for c in cases]
    copy = results["copy"]["gb_s"]
    fig = go.Figure()
    keys = [k for k in ("kernel", "serial", "dense", "fill") if all(
        (f"{k}_us" in c) or (k == "fill" and "fill_same_bytes_us" in c) for c in cases)]
    for k in keys:
        us = [c["fill_same_bytes_us"] if k == "fill" else c[f"{k}_us"] for c in cases]
        fig.add_trace(go.Bar(x=labels, y=us, name=_NAMES[k], marker_color=_COLORS[k], visible=True,
                             hovertemplate="%{x}: %{y:.2f} us<extra>" + k + "</extra>"))
    for k in keys:
        gb = [c["bytes"] / (((c["fill_same_bytes_us"] if k == "fill" else c[f"{k}_us"])) * 1e-6) / 1e9 for c in cases]
        fig.add_trace(go.Bar(x=labels, y=gb, name=_NAMES[k], marker_color=_COLORS[k], visible=False,
                             hovertemplate="%{x}: %{y:.0f} GB/s<extra>" + k + "</extra>"))
    n = len(keys)
    ceiling = [
        {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": copy, "y1": copy, "line": {"dash": "dash"}},
        {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 0.9 * copy, "y1": 0.9 * copy,
         "line": {"dash": "dot", "color": "#d62728"}},
    ]
    ceiling_notes = [
        {"xref": "paper", "x": 1, "y": copy, "text": f"copy ceiling {copy:.0f} GB/s", "showarrow": False,
         "xanchor": "right", "yanchor": "bottom"},
        {"xref": "paper", "x": 1, "y": 0.9 * copy, "text": "90 % bar", "showarrow": False, "xanchor": "right",
         "yanchor": "top", "font": {"color": "#d62728"}},
    ]
    bar_2us = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 2, "y1": 2,
                "line": {"dash": "dot", "color": "#d62728"}}]
    note_2us = [{"xref": "paper", "x": 0, "y": 0.301, "yref": "y", "text": "2 us bar (1 x 97k)", "showarrow": False,
                 "xanchor": "left", "yanchor": "bottom", "font": {"color": "#d62728"}}]
    fig.update_layout(
        updatemenus=[{
            "type": "dropdown", "x": 0, "y": 1.18, "xanchor": "left", "showactive": True,
            "buttons": [
                {"label": "time (us, log)", "method": "update",
                 "args": [{"visible": [True] * n + [False] * n},
                          {"yaxis": {"type": "log", "title": "time per call (us)"},
                           "shapes": bar_2us, "annotations": note_2us}]},
                {"label": "bandwidth (GB/s)", "method": "update",
                 "args": [{"visible": [False] * n + [True] * n},
                          {"yaxis": {"type": "linear", "title": "achieved GB/s (bytes = 4 * sum(ceil(L/K) + L))"},
                           "shapes": ceiling, "annotations": ceiling_notes}]},
            ],
        }],
        shapes=bar_2us, annotations=note_2us,
        barmode="group", yaxis={"type": "log", "title": "time per call (us)"},
        xaxis={"title": "requests x tokens each (K = 16)"},
        title=f"Index expansion, {results['provenance'].get('device', '?')} (graph replay; dense: eager)",
        width=820, height=480, template="plotly_white", legend={"font": {"size": 10}, "orientation": "h", "y": -0.2},
    )
    return fig


def loose_bound_figure(results: dict[str, Any] | None = None) -> go.Figure:
    """Per case of a run that timed loose bounds (``kernel_loose_bound_us``): the call with the tight bound, and
    with the loose one (``loose_bound`` in the case, 128k) launched with ``loose_bound=True`` and by default (no
    bar where that was not timed), as grouped bars on a log time axis."""
    results = results or load_expand_results()
    cases = [c for c in results["cases"] if "kernel_loose_bound_us" in c]
    if not cases:
        raise ValueError("these results have no loose-bound timings (kernel_loose_bound_us): `workbench bench "
                         "expand` times them for every case below 128k tokens")
    labels = [case_label(c) for c in cases]
    bound = cases[0]["loose_bound"]
    fig = go.Figure()
    for key, name, color in (("kernel_us", "tight bound (max of the lengths)", "#1f77b4"),
                             ("kernel_loose_bound_us", f"bound {bound // 1024}k, loose_bound=True", "#2ca02c"),
                             ("kernel_loose_bound_default_us", f"bound {bound // 1024}k, default launch", "#d62728")):
        fig.add_trace(go.Bar(x=labels, y=[c.get(key) for c in cases], name=name, marker_color=color,
                             hovertemplate="%{x}: %{y:.2f} us<extra></extra>"))
    fig.update_layout(
        barmode="group", yaxis={"type": "log", "title": "time per call (us)"},
        xaxis={"title": "requests x tokens each (K = 16)"},
        title=f"Tight and {bound // 1024}k max_seq_len bounds, {results['provenance'].get('device', '?')}",
        width=820, height=440, template="plotly_white", legend={"font": {"size": 10}, "orientation": "h", "y": -0.22},
    )
    return fig


def expansion_figure(block_table: torch.Tensor, seq_lens: torch.Tensor | list[int], kernel_block_size: int) -> go.Figure:
    """Each token of each request as a cell labelled with its flat cache row, coloured by the block it lives in."""
    lens = seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else list(seq_lens)
    kv_indices, kv_indptr = expand.expand_page_indices_ref(block_table, lens, kernel_block_size)
    width = max(lens, default=0)
    z, text = [], []
    for r, n in enumerate(lens):
        rows = kv_indices[int(kv_indptr[r]):int(kv_indptr[r + 1])].tolist()
        z.append([row // kernel_block_size for row in rows] + [None] * (width - n))
        text.append([str(row) for row in rows] + [""] * (width - n))
    fig = go.Figure(go.Heatmap(
        z=z, text=text, texttemplate="%{text}", colorscale="Viridis", showscale=False, xgap=2, ygap=2,
        x=list(range(width)), y=[f"request {r} (seq_len {n})" for r, n in enumerate(lens)],
        hovertemplate="token %{x}<br>row %{text}<br>block %{z}<extra></extra>",
    ))
    fig.update_layout(
        title=f"row = block_table[r, t // {kernel_block_size}] * {kernel_block_size} + t % {kernel_block_size}",
        xaxis={"title": "token position t", "dtick": 1}, yaxis={"autorange": "reversed"},
        width=760, height=140 + 50 * len(lens), template="plotly_white",
    )
    return fig
