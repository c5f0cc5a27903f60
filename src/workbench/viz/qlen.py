"""Chapter 5: the power-of-two query-length limitation (aiter #2720), in figures.

* :func:`probe_figure`: which query lengths each backend gets right (from :func:`workbench.qlen.probe_qlen`);
* :func:`acceptance_figure`: vLLM's per-position acceptance rates of correct, faulty and padded runs,
  one ``k`` at a time (a dropdown picks it; static plotly, works on the site);
* :func:`acceptance_length_figure`: mean acceptance length against ``k``, lossy runs marked;
* :func:`padding_cost_figure`: the cost model of padding the verification to the next power of two
  (:func:`workbench.perfmodel.padding_cost_rows`);
* :func:`measured_padding_figure`: the same overhead measured on an H200 with the Triton kernel
  (:func:`workbench.perfmodel.measured_padding_overhead`, from the decode benchmark in ``workbench/data``).

Everything is deterministic: the inputs are seeded reports and formulas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from workbench.perfmodel import padding_cost_rows
from workbench.qlen import LosslessReport, ProbeReport, is_pow2

__all__ = [
    "acceptance_figure",
    "acceptance_length_figure",
    "measured_padding_figure",
    "padding_cost_figure",
    "probe_figure",
]

_VERDICT_CODE = {"ok": 0, "broadcast-fault": 1, "wrong": 2}
_VERDICT_TEXT = {"ok": "ok", "broadcast-fault": "bcast", "wrong": "WRONG"}
_VERDICT_SCALE = [[0.0, "#2ca02c"], [0.33, "#2ca02c"], [0.34, "#d62728"], [0.66, "#d62728"],
                  [0.67, "#222222"], [1.0, "#222222"]]
_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def probe_figure(reports: Sequence[ProbeReport]) -> go.Figure:
    """Heatmap: one row per probed backend, one column per query length; green ok, red broadcast-fault
    (every position got position 0's output), black wrong. Hover shows the errors."""
    if not reports:
        raise ValueError("reports is empty; pass the ProbeReport of at least one backend")
    qlens = sorted({r.qlen for rep in reports for r in rep.rows})
    z, text, hover, names = [], [], [], []
    for rep in reports:
        by_q = {r.qlen: r for r in rep.rows}
        names.append(rep.backend_ran if rep.backend == rep.backend_ran else f"{rep.backend} -> {rep.backend_ran}")
        z.append([_VERDICT_CODE[by_q[q].verdict] if q in by_q else None for q in qlens])
        text.append([_VERDICT_TEXT[by_q[q].verdict] if q in by_q else "" for q in qlens])
        hover.append([(f"{names[-1]} qlen {q}: {by_q[q].verdict}<br>max err {by_q[q].max_err:.2e} "
                       f"(tol {by_q[q].tol:.1e})<br>vs position-0 broadcast {by_q[q].max_err_broadcast:.2e}")
                      if q in by_q else "not probed" for q in qlens])
    fig = go.Figure(go.Heatmap(
        z=z, x=[str(q) for q in qlens], y=names, text=text, texttemplate="%{text}", customdata=hover,
        hovertemplate="%{customdata}<extra></extra>", colorscale=_VERDICT_SCALE, zmin=0, zmax=2, showscale=False,
        xgap=2, ygap=2,
    ))
    fig.update_layout(
        title="Each query length vs the fp32 golden<br><sup>green ok · red broadcast-fault (position 0 everywhere) · "
              "black wrong</sup>",
        xaxis={"title": "max_seqlen_q (query tokens per request)", "type": "category"},
        yaxis={"autorange": "reversed"}, width=760, height=140 + 46 * len(reports), template="plotly_white",
    )
    return fig


def _label(name: str, rep: LosslessReport) -> str:
    return f"{name}: {'lossless' if rep.lossless else 'DIVERGES'}"


def acceptance_figure(groups: Mapping[str, Sequence[LosslessReport]], k: int | None = None) -> go.Figure:
    """Per-position acceptance rates (vLLM's definition) for each group of runs, one ``k`` at a time.

    Args:
        groups: label -> reports of :func:`workbench.qlen.sweep_k` (e.g. ``{"correct": ..., "faulty": ...,
            "padded": ...}``); every group must cover the same ``k`` values.
        k: the ``k`` shown first (default: 5, the case aiter #2720 reports, if swept; else the first ``k``
            with ``k + 1`` not a power of two; else the first ``k``).

    A dropdown switches ``k``; the legend says whether each run was lossless.
    """
    if not groups:
        raise ValueError("groups is empty; pass label -> list of LosslessReport")
    ks = [r.run.k for r in next(iter(groups.values()))]
    for name, reps in groups.items():
        if [r.run.k for r in reps] != ks:
            raise ValueError(f"group {name!r} covers k = {[r.run.k for r in reps]} but the first covers {ks}; "
                             "sweep the same k values in every group")
    if k is None:
        k = 5 if 5 in ks else next((x for x in ks if not is_pow2(x + 1)), ks[0])
    if k not in ks:
        raise ValueError(f"k is {k}; the reports cover {ks}")
    fig = go.Figure()
    for kk in ks:
        for g, (name, reps) in enumerate(groups.items()):
            rep = next(r for r in reps if r.run.k == kk)
            fig.add_trace(go.Scatter(
                x=list(range(1, kk + 1)), y=rep.run.acceptance_rates, mode="lines+markers", name=_label(name, rep),
                visible=kk == k, line={"color": _PALETTE[g % len(_PALETTE)], "dash": "dash" if g == 2 else "solid"},
                marker={"symbol": "circle" if rep.lossless else "x", "size": 9},
                hovertemplate=f"{name} k={kk}: position %{{x}} accepted in %{{y:.3f}} of drafts<extra></extra>",
            ))
    n = len(groups)
    buttons = [dict(label=f"k={kk} (qlen {kk + 1}{'' if is_pow2(kk + 1) else ', not 2^n'})", method="update",
                    args=[{"visible": [i // n == j for i in range(len(ks) * n)]},
                          {"title": _acc_title(kk)}]) for j, kk in enumerate(ks)]
    fig.update_layout(
        title=_acc_title(k), template="plotly_white", width=760, height=460,
        xaxis={"title": "draft position", "dtick": 1},
        yaxis={"title": "per-position acceptance rate", "range": [0, 1.02]},
        updatemenus=[dict(buttons=buttons, active=ks.index(k), x=1.0, xanchor="right", y=1.16, yanchor="top")],
        legend={"orientation": "h", "x": 0, "y": -0.18},
    )
    return fig


def _acc_title(k: int) -> str:
    return (f"Per-position acceptance, k = {k}<br><sup>verification qlen {k + 1}"
            f"{' (a power of two)' if is_pow2(k + 1) else ': not a power of two'}</sup>")


def acceptance_length_figure(groups: Mapping[str, Sequence[LosslessReport]]) -> go.Figure:
    """Mean acceptance length (1 + accepted per draft, vLLM's convention) against ``k`` for each group;
    an ``x`` marks a run whose output diverged from greedy decoding. Grey bands: ``k + 1`` a power of two."""
    if not groups:
        raise ValueError("groups is empty; pass label -> list of LosslessReport")
    fig = go.Figure()
    all_k = sorted({r.run.k for reps in groups.values() for r in reps})
    for kk in all_k:
        if is_pow2(kk + 1):
            fig.add_vrect(x0=kk - 0.4, x1=kk + 0.4, fillcolor="#cccccc", opacity=0.35, line_width=0)
    for g, (name, reps) in enumerate(groups.items()):
        fig.add_trace(go.Scatter(
            x=[r.run.k for r in reps], y=[r.run.mean_acceptance_length for r in reps], mode="lines+markers", name=name,
            line={"color": _PALETTE[g % len(_PALETTE)], "dash": "dash" if g == 2 else "solid"},
            marker={"symbol": ["circle" if r.lossless else "x" for r in reps], "size": 10},
            customdata=[[r.run.call_qlen, "lossless" if r.lossless else "DIVERGES"] for r in reps],
            hovertemplate=f"{name} k=%{{x}}: mean acceptance length %{{y:.2f}}<br>call qlen %{{customdata[0]}}, "
                          "%{customdata[1]}<extra></extra>",
        ))
    fig.update_layout(
        title="Mean acceptance length vs k<br><sup>x: output differs from greedy decoding · grey: k + 1 a power "
              "of two</sup>",
        xaxis={"title": "k (num_speculative_tokens)", "dtick": 1}, yaxis={"title": "mean acceptance length"},
        template="plotly_white", width=760, height=460, legend={"orientation": "h", "x": 0, "y": -0.2},
    )
    return fig


def padding_cost_figure(ks: Sequence[int] = range(1, 16), *, heads: Sequence[int] = (16, 128), batch: int = 64,
                        context: int = 4096, hardware: Sequence[str] = ("H200", "MI300X", "MI355X")) -> go.Figure:
    """Roofline time overhead of padded verification (%) against ``k``, one line per (device, heads);
    a dropdown picks the head count. Powers of two (k = 1, 3, 7, 15) cost nothing."""
    fig = go.Figure()
    colors = {"H200": "#76b900", "MI300X": "#ed1c24", "MI355X": "#8b0000"}
    for h in heads:
        for name in hardware:
            rows = padding_cost_rows(ks, heads=h, batch=batch, context=context, hardware=name)
            fig.add_trace(go.Scatter(
                x=[r["k"] for r in rows], y=[r["time_pct"] for r in rows], mode="lines+markers",
                name=f"{name}, {h} heads", visible=h == heads[0], line={"color": colors.get(name)},
                customdata=[[r["qlen"], r["padded_qlen"], r["bytes_pct"], r["bound"], r["padded_bound"]] for r in rows],
                hovertemplate=(f"{name} {h} heads, k=%{{x}}: qlen %{{customdata[0]}} -> %{{customdata[1]}}<br>"
                               "roofline time +%{y:.1f} %, bytes +%{customdata[2]:.2f} %<br>"
                               "%{customdata[3]}-bound -> %{customdata[4]}-bound<extra></extra>"),
            ))
    n = len(hardware)
    buttons = [dict(label=f"{h} heads", method="update",
                    args=[{"visible": [i // n == j for i in range(len(heads) * n)]}]) for j, h in enumerate(heads)]
    fig.update_layout(
        title=f"Padding verification to a power of two: roofline cost<br><sup>batch {batch}, "
              f"context {context}; the dropdown picks the heads per GPU</sup>",
        xaxis={"title": "k (verification qlen k + 1)", "dtick": 1}, yaxis={"title": "extra time (%)"},
        template="plotly_white", width=760, height=440,
        updatemenus=[dict(buttons=buttons, x=1.0, xanchor="right", y=1.16, yanchor="top")],
    )
    return fig


def measured_padding_figure(rows: Sequence[dict[str, Any]], note: str = "") -> go.Figure:
    """Grouped bars per measured shape: measured padding overhead beside the two roofline predictions
    (rows from :func:`measured_padding_overhead`)."""
    if not rows:
        raise ValueError("rows is empty: there is no measured padding overhead to plot (see the note of "
                         "measured_padding_overhead)")
    labels = [f"H={r['heads']} B={r['batch']} L={r['context'] // 1024}k<br>qlen {r['qlen']}->{r['padded_qlen']}"
              for r in rows]
    fig = go.Figure()
    series = [("measured (workbench kernel)", "overhead_pct", "#1f77b4"),
              ("roofline, measured ceilings", "model_measured_pct", "#ff7f0e"),
              ("roofline, H200 datasheet", "model_pct", "#7f7f7f")]
    for name, key, color in series:
        if all(key in r for r in rows):
            fig.add_trace(go.Bar(x=labels, y=[r[key] for r in rows], name=name, marker_color=color,
                                 hovertemplate=f"{name}: +%{{y:.1f}} %<extra></extra>"))
    fig.update_layout(barmode="group", title="Padding to the next power of two: measured vs modelled"
                      + (f"<br><sup>{note}</sup>" if note else ""), yaxis={"title": "extra time (%)"},
                      template="plotly_white", width=760, height=460, legend={"orientation": "h", "x": 0, "y": -0.25})
    return fig
