"""Chapter 5: the power-of-two query-length limitation (aiter #2720), in figures.

* :func:`probe_figure`: which query lengths each backend gets right (from :func:`workbench.qlen.probe_qlen`);
* :func:`acceptance_figure`: vLLM's per-position acceptance rates of correct, faulty and padded runs,
  one ``k`` at a time (a dropdown picks it; static plotly, works on the site);
* :func:`acceptance_length_figure`: mean acceptance length against ``k``, lossy runs marked;
* :func:`padding_cost_rows` / :func:`padding_cost_figure`: the cost model of padding the verification
  to the next power of two, from :mod:`workbench.perfmodel`'s byte and FLOP formulas and the roofline;
* :func:`measured_padding_overhead`: the same overhead measured on an H200 with the Triton kernel,
  read from the committed decode benchmark (``src/workbench/data/bench_decode_h200.json``) when present.

Everything is deterministic: the inputs are seeded reports and formulas.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from workbench import perfmodel
from workbench.qlen import LosslessReport, ProbeReport, is_pow2, next_pow2

__all__ = [
    "BENCH_DECODE_H200",
    "acceptance_figure",
    "acceptance_length_figure",
    "measured_padding_figure",
    "measured_padding_overhead",
    "padding_cost_figure",
    "padding_cost_rows",
    "probe_figure",
]

_VERDICT_CODE = {"ok": 0, "broadcast-fault": 1, "wrong": 2}
_VERDICT_TEXT = {"ok": "ok", "broadcast-fault": "bcast", "wrong": "WRONG"}
_VERDICT_SCALE = [[0.0, "#2ca02c"], [0.33, "#2ca02c"], [0.34, "#d62728"], [0.66, "#d62728"],
                  [0.67, "#222222"], [1.0, "#222222"]]
_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
BENCH_DECODE_H200 = Path(__file__).resolve().parent.parent / "data" / "bench_decode_h200.json"


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


def padding_cost_rows(ks: Sequence[int] = range(1, 16), *, heads: int = 16, batch: int = 64, context: int = 4096,
                      hardware: str | perfmodel.Hardware = "H200") -> list[dict[str, Any]]:
    """The cost model of padding verification from ``qlen = k + 1`` to ``P = next_pow2(k + 1)``, per layer.

    For each ``k``: extra query rows ``batch * (P - qlen)``; bytes and FLOPs from
    :func:`workbench.perfmodel.mla_decode_bytes` / :func:`~workbench.perfmodel.mla_decode_flops` at ``qlen``
    and at ``P``; roofline times (:func:`~workbench.perfmodel.roofline_time_s`) on ``hardware``'s datasheet
    figures (or a :class:`~workbench.perfmodel.Hardware` with measured ceilings). While both calls are
    memory-bound the time grows only with the extra q and output bytes.
    """
    if isinstance(hardware, perfmodel.Hardware):
        hw = hardware
    elif hardware in perfmodel.HARDWARE:
        hw = perfmodel.HARDWARE[hardware]
    else:
        raise ValueError(f"hardware is {hardware!r}; choose one of {sorted(perfmodel.HARDWARE)} "
                         "or pass a perfmodel.Hardware")
    rows = []
    for k in ks:
        q = k + 1
        P = next_pow2(q)
        b0, b1 = (perfmodel.mla_decode_bytes(heads, batch, context, n) for n in (q, P))
        f0, f1 = (perfmodel.mla_decode_flops(heads, batch, context, n) for n in (q, P))
        mem0, mem1 = (b / (hw.bandwidth_tb_s * 1e12) for b in (b0, b1))
        cmp0, cmp1 = (f / (hw.bf16_tflops * 1e12) for f in (f0, f1))
        t0, t1 = perfmodel.roofline_time_s(hw, f0, b0), perfmodel.roofline_time_s(hw, f1, b1)
        rows.append(dict(k=k, qlen=q, padded_qlen=P, extra_rows=batch * (P - q), heads=heads, batch=batch,
                         context=context, hardware=hw.name, bytes_pct=100 * (b1 / b0 - 1),
                         flops_pct=100 * (f1 / f0 - 1),
                         time_us=t0 * 1e6, padded_time_us=t1 * 1e6, time_pct=100 * (t1 / t0 - 1),
                         bound="memory" if mem0 >= cmp0 else "compute",
                         padded_bound="memory" if mem1 >= cmp1 else "compute"))
    return rows


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
        title=f"Cost of padding verification to the next power of two<br><sup>roofline, batch {batch}, "
              f"context {context}; the dropdown picks the heads per GPU</sup>",
        xaxis={"title": "k (verification qlen k + 1)", "dtick": 1}, yaxis={"title": "extra time (%)"},
        template="plotly_white", width=760, height=440,
        updatemenus=[dict(buttons=buttons, x=1.0, xanchor="right", y=1.16, yanchor="top")],
    )
    return fig


def measured_padding_overhead(path: str | Path | None = None) -> tuple[list[dict[str, Any]], str]:
    """Padding overhead measured by ``workbench bench decode`` (Triton kernel, CUDA-graph replay).

    For every (heads, batch, context) measured at a non-power-of-two ``qlen`` and at ``next_pow2(qlen)``,
    one row with both times, the measured overhead, and two model predictions for the same shapes
    (:func:`padding_cost_rows`): on the datasheet H200 (``model_pct``) and on a roofline built from the
    ceilings measured in the same run (``model_measured_pct``: read-only bandwidth, else copy bandwidth,
    and the bf16 matmul rate). Returns ``(rows, note)``; ``rows`` is empty and ``note`` says why when the
    file is missing or holds no such pair. Nothing is invented: only measured pairs.
    """
    p = Path(path) if path is not None else BENCH_DECODE_H200
    if not p.exists():
        return [], f"{p.name} is not in the repository yet: no measured padding overhead to show"
    payload = json.loads(p.read_text())
    results = payload.get("results", [])
    times = {(r["heads"], r["batch"], r["context"], r["qlen"]): r["triton_us"] for r in results if "triton_us" in r}
    ceilings = payload.get("ceilings", {})
    bw = (ceilings.get("read_only") or ceilings.get("copy") or {}).get("gb_s")
    tf = (ceilings.get("matmul_bf16") or {}).get("tflops")
    measured_hw = perfmodel.Hardware("measured", "", 0, bw / 1e3, tf, f"ceilings in {p.name}") if bw and tf else None
    rows = []
    for (h, b, ctx, q), us in sorted(times.items()):
        P = next_pow2(q)
        if q == P or (h, b, ctx, P) not in times:
            continue
        up = times[(h, b, ctx, P)]
        row = dict(heads=h, batch=b, context=ctx, qlen=q, padded_qlen=P, us=us, padded_us=up,
                   overhead_pct=100 * (up / us - 1),
                   model_pct=padding_cost_rows([q - 1], heads=h, batch=b, context=ctx, hardware="H200")[0]["time_pct"])
        if measured_hw is not None:
            row["model_measured_pct"] = padding_cost_rows([q - 1], heads=h, batch=b, context=ctx,
                                                          hardware=measured_hw)[0]["time_pct"]
        rows.append(row)
    prov = payload.get("provenance", {})
    where = ", ".join(str(prov[k]) for k in ("device", "date_utc") if k in prov) or "no provenance recorded"
    note = f"{p.name} ({where}): {len(rows)} measured (qlen, next power of two) pairs"
    return rows, note


def measured_padding_figure(rows: Sequence[dict[str, Any]], note: str = "") -> go.Figure:
    """Grouped bars per measured shape: measured padding overhead beside the two roofline predictions
    (rows from :func:`measured_padding_overhead`)."""
    if not rows:
        raise ValueError("rows is empty: there is no measured padding overhead to plot (see the note of "
                         "measured_padding_overhead)")
    labels = [f"H={r['heads']} B={r['batch']} L={r['context'] // 1024}k<br>qlen {r['qlen']}->{r['padded_qlen']}"
              for r in rows]
    fig = go.Figure()
    series = [("measured (Triton kernel)", "overhead_pct", "#1f77b4"),
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
