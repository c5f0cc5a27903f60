"""Chapter 6: what Eagle3 buys, and what the power-of-two restriction costs (figures of ``workbench.perfmodel``).

* :func:`comparison_figure`: the published MI355X table beside the model (fitted no-speculation column,
  predicted Eagle3 columns) and the error of every figure against the +/-10 % bar;
* :func:`step_breakdown_figure`: where a step's time goes, model vs the step time the table implies;
* :func:`k_choice_figure`: throughput against ``k``, power-of-two ``k`` marked;
* :func:`spec_explorer`: the same model with a precomputed slider (acceptance, ``k``, draft cost or
  concurrency) for the static site; :func:`throughput_widget` is the live ipywidgets version for JupyterLab;
* :func:`verify_trend_figure`: verify cost per accepted token at 1K and 8K context;
* :func:`expansion_per_step_figure`: the index expansion per step beside the decode it feeds.

Everything is computed here from the model; sliders only swap precomputed arrays in the browser.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench import perfmodel as P
from workbench.viz.expand import case_label

COLUMN_COLORS = {"no spec": "#7f7f7f", "BF16 draft": "#0072B2", "FP8 draft": "#E69F00"}
CONC_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000", "#999999", "#8C564B")
PART_COLORS = {"fixed": "#bdbdbd", "tokens": "#6baed6", "attention": "#08519c", "draft": "#E69F00",
               "overhead": "#CC79A7"}
EXPLORER_VARIES = ("acceptance", "draft_cost", "concurrency", "k")


def _color(i: int) -> str:
    return CONC_COLORS[i % len(CONC_COLORS)]


WIDTH = 760  # fits the book's content column; every figure uses it


def _layout(fig: go.Figure, title: str, height: int = 460, legend: str = "above", **kw) -> go.Figure:
    """House layout: fixed width, a horizontal legend above the plot (single panel) or below it (panels)."""
    if legend == "above":
        leg, margin = {"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0}, {"t": 110}
    else:
        # below the x-axis titles: about 110 px under the plotting area, whatever the figure's height
        leg, margin = {"orientation": "h", "yanchor": "top", "y": -max(0.1, 110 / height), "x": 0}, {"t": 80, "b": 150}
    fig.update_layout(title=title, width=WIDTH, height=height, template="plotly_white",
                      legend={"font": {"size": 10}, **leg}, margin=margin, **kw)
    return fig


# ------------------------------------------------------------------------------------------------
# the published table beside the model
# ------------------------------------------------------------------------------------------------


def comparison_figure(prediction: P.Prediction, tolerance: float = 0.10, title: str | None = None) -> go.Figure:
    """Left: tok/s/GPU vs concurrency, published (markers) and model (lines; dashed = the fitted column).
    Right: error of every figure, with the +/-``tolerance`` band."""
    t = prediction.table
    fig = make_subplots(rows=2, cols=1, row_heights=[0.58, 0.42], vertical_spacing=0.14,
                        subplot_titles=("tok/s/GPU: published (markers) and model (lines)",
                                        f"error (model / published - 1), bar +/-{tolerance:.0%}"))
    columns = [("no spec", t.no_spec)] + list(t.eagle3.items())
    conc = list(t.concurrency)
    for name, published in columns:
        rows = [r for r in prediction.rows if r.column == name]
        color = COLUMN_COLORS.get(name, "#444")
        fig.add_trace(go.Scatter(x=conc, y=list(published), mode="markers", name=f"{name}: published",
                                 marker={"color": color, "size": 10, "symbol": "circle"}, legendgroup=name,
                                 hovertemplate=f"{name}<br>concurrency %{{x}}<br>published %{{y:.1f}} tok/s/GPU"
                                               "<extra></extra>"), row=1, col=1)
        fitted = rows[0].fitted
        fig.add_trace(go.Scatter(x=conc, y=[r.predicted for r in rows], mode="lines",
                                 name=f"{name}: model ({'fitted' if fitted else 'predicted'})", legendgroup=name,
                                 line={"color": color, "dash": "dash" if fitted else "solid"},
                                 hovertemplate=f"{name}<br>concurrency %{{x}}<br>model %{{y:.1f}} tok/s/GPU"
                                               "<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Bar(x=[str(c) for c in conc], y=[100 * r.error for r in rows], name=name,
                             marker={"color": color, "opacity": 0.5 if fitted else 1.0}, legendgroup=name,
                             showlegend=False, text=[f"{100 * r.error:+.1f}%" for r in rows],
                             textposition="outside", textfont={"size": 9},
                             hovertemplate=f"{name}<br>concurrency %{{x}}<br>error %{{y:+.1f}} %<extra></extra>"),
                      row=2, col=1)
    fig.add_hrect(y0=-100 * tolerance, y1=100 * tolerance, fillcolor="#2ca02c", opacity=0.10, line_width=0,
                  row=2, col=1)
    fig.update_xaxes(type="log", tickvals=conc, title_text="concurrency", row=1, col=1)
    fig.update_yaxes(title_text="output tok/s per GPU", row=1, col=1)
    fig.update_xaxes(title_text="concurrency", row=2, col=1)
    fig.update_yaxes(title_text="error, %", row=2, col=1)
    law = prediction.target.law
    title = title or (f"{t.hardware} {t.model} TP{t.tp} {t.input_len // 1024}K/{t.output_len // 1024}K<br><sup>fitted on "
                      f"no-spec ({law.name} law); Eagle3 predicted at k={prediction.k} "
                      f"({prediction.tokens_per_step:.2f} tokens/step)</sup>")
    return _layout(fig, title, height=760, legend="below", barmode="group")


def step_breakdown_figure(prediction: P.Prediction, column: str | None = None) -> go.Figure:
    """Stacked step time per concurrency: no speculation (left) and one Eagle3 column (right), split into
    the law's fixed part, its token part, attention, draft and overhead; diamonds = the step time the
    published throughput implies at the model's tokens per step."""
    t = prediction.table
    column = column or next(iter(t.eagle3))
    if column not in t.eagle3:
        raise ValueError(f"column={column!r} is not one of the table's Eagle3 columns {list(t.eagle3)}")
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=("no speculation (fitted)", f"Eagle3, {column}, k={prediction.k} (predicted)"))
    conc = list(t.concurrency)
    xs = [str(c) for c in conc]
    target = prediction.target
    shown: set[str] = set()
    for col, name, k in ((1, "no speculation", 0), (2, column, prediction.k)):
        parts = [target.parts_ms(c, t.mean_context, k + 1) for c in conc]
        steps = [prediction.steps[(name, c)] for c in conc]
        stacks = {"fixed": [p["fixed"] for p in parts], "tokens": [p["tokens"] for p in parts],
                  "attention": [p["attention"] for p in parts], "draft": [s.draft_ms for s in steps],
                  "overhead": [s.overhead_ms for s in steps]}
        labels = {"fixed": "fixed (law)", "tokens": "tokens (law, N = c x qlen)", "attention": "MLA attention",
                  "draft": "draft", "overhead": "spec overhead"}
        for part, ys in stacks.items():
            if not any(ys):
                continue
            fig.add_trace(go.Bar(x=xs, y=ys, name=labels[part], legendgroup=part, showlegend=part not in shown,
                                 marker={"color": PART_COLORS[part]},
                                 hovertemplate=f"{labels[part]}: %{{y:.2f}} ms<extra></extra>"), row=1, col=col)
            shown.add(part)
        published = t.no_spec if k == 0 else t.eagle3[column]
        tokens = [s.tokens_per_step for s in steps]
        implied = [c * e / (t.tp * thr) * 1e3 for c, e, thr in zip(conc, tokens, published)]
        fig.add_trace(go.Scatter(x=xs, y=implied, mode="markers", name="published (implied step)",
                                 legendgroup="published", showlegend=col == 1,
                                 marker={"symbol": "diamond", "size": 11, "color": "#d62728"},
                                 hovertemplate="published implies %{y:.2f} ms<extra></extra>"), row=1, col=col)
    fig.update_xaxes(title_text="concurrency")
    fig.update_yaxes(title_text="ms per engine step", row=1, col=1)
    return _layout(fig, "Where a step's time goes<br><sup>model (bars) and the step the published throughput implies "
                        "(diamonds)</sup>", height=500, legend="below", barmode="stack")


# ------------------------------------------------------------------------------------------------
# the choice of k
# ------------------------------------------------------------------------------------------------


def _symbols(ks: Sequence[int]) -> list[str]:
    return ["circle" if P.is_power_of_two_qlen(k) else "circle-open" for k in ks]


def k_choice_figure(target: P.TargetStepModel, draft: P.DraftModel, concurrency: Sequence[int] = (4, 16, 64),
                    context: float = 1536, *, rates: Sequence[float] | None = None, alpha: float | None = None,
                    k_max: int | None = None, overhead_ms: float = 0.0) -> go.Figure:
    """Speed-up over plain decoding against ``k``, one line per concurrency. Filled markers: ``k + 1`` a power
    of two (allowed with aiter, #2720); open: not. Stars: the best ``k`` without the restriction."""
    fig = go.Figure()
    if rates is None and alpha is None:
        rates = P.AITER_2720_RATES
    for i, c in enumerate(concurrency):
        r = P.power_of_two_cost(target, draft, c, context, rates=rates, alpha=alpha, k_max=k_max,
                                overhead_ms=overhead_ms)
        base = P.spec_step(target, None, c, context, 0).tok_s_per_gpu
        ks = [s.k for s in r.free.scan]
        ys = [s.tok_s_per_gpu / base for s in r.free.scan]
        fig.add_trace(go.Scatter(
            x=ks, y=ys, mode="lines+markers", name=f"concurrency {c}", line={"color": _color(i)},
            marker={"symbol": _symbols(ks), "size": 10, "color": _color(i)},
            hovertemplate=f"concurrency {c}<br>k=%{{x}}: %{{y:.3f}}x<extra></extra>"))
        fig.add_trace(go.Scatter(
            x=[r.free.k], y=[r.free.speedup], mode="markers", showlegend=False,
            marker={"symbol": "star", "size": 16, "color": _color(i), "line": {"color": "black", "width": 1}},
            hovertemplate=(f"concurrency {c}: best k={r.free.k} ({r.free.speedup:.3f}x); best power-of-two k="
                           f"{r.restricted.k} ({r.restricted.speedup:.3f}x); restriction costs {r.cost:.1%}"
                           "<extra></extra>")))
    acc = f"alpha={alpha:.3f} (i.i.d.)" if alpha is not None else "per-position rates (aiter #2720)"
    fig.update_xaxes(title_text="k (draft tokens per step); filled = k+1 a power of two", dtick=1)
    fig.update_yaxes(title_text="speed-up over no speculation")
    return _layout(fig, f"Choosing k<br><sup>{acc}, context {context:g}; stars: best k</sup>", height=480)


# ------------------------------------------------------------------------------------------------
# precomputed explorers for the static site
# ------------------------------------------------------------------------------------------------

ALPHAS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
DRAFT_FIXED_MS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)
CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LINE_CONCURRENCIES = (4, 8, 16, 32, 64)
LINE_ALPHAS = (0.6, 0.7, 0.8, 0.9)
K_RANGE = tuple(range(1, 16))


def _speedup(target, draft, c, context, k, alpha) -> float:
    base = P.spec_step(target, None, c, context, 0).tok_s_per_gpu
    return P.spec_step(target, draft, c, context, k, alpha=alpha).tok_s_per_gpu / base


def spec_explorer(vary: str = "acceptance", prediction: P.Prediction | None = None, *, context: float | None = None,
                  draft_dtype: str = "bf16") -> go.Figure:
    """Speed-up over plain decoding from the calibrated model, with one precomputed slider.

    ``vary``: ``"acceptance"`` (i.i.d. alpha; x = k; a line per concurrency), ``"draft_cost"`` (the
    draft's per-forward overhead in ms; x = k; a line per concurrency; alpha fitted to aiter #2720),
    ``"concurrency"`` (x = k; a line per alpha) or ``"k"`` (x = concurrency; a line per alpha).
    Filled markers on a k axis: ``k + 1`` a power of two. The model is ``prediction``'s (default:
    :func:`perfmodel.predict_published`).
    """
    if vary not in EXPLORER_VARIES:
        raise ValueError(f"vary={vary!r} must be one of {EXPLORER_VARIES}")
    prediction = prediction or P.predict_published()
    target = prediction.target
    context = prediction.table.mean_context if context is None else context
    fixed0 = P.draft_fixed_ms_from_target(target)
    draft0 = P.eagle3_draft(draft_dtype, fixed_ms=fixed0)
    alpha0 = P.fit_iid_alpha(P.AITER_2720_RATES)

    if vary == "acceptance":
        values, labels, lines, x = ALPHAS, [f"{a:.2f}" for a in ALPHAS], LINE_CONCURRENCIES, list(K_RANGE)
        prefix, line_name, x_title, active = "acceptance alpha = ", "concurrency {}", "k (draft tokens)", 6
    elif vary == "draft_cost":
        values, labels = DRAFT_FIXED_MS, [f"{v:g} ms" for v in DRAFT_FIXED_MS]
        lines, x = LINE_CONCURRENCIES, list(K_RANGE)
        prefix, line_name, x_title, active = "draft overhead per forward = ", "concurrency {}", "k (draft tokens)", 1
    elif vary == "concurrency":
        values, labels, lines, x = CONCURRENCIES, [str(c) for c in CONCURRENCIES], LINE_ALPHAS, list(K_RANGE)
        prefix, line_name, x_title, active = "concurrency = ", "alpha {}", "k (draft tokens)", 2
    else:
        values = K_RANGE
        labels = [f"{k}{' (2^n-1)' if P.is_power_of_two_qlen(k) else ''}" for k in K_RANGE]
        lines, x = LINE_ALPHAS, list(CONCURRENCIES)
        prefix, line_name, x_title, active = "k = ", "alpha {}", "concurrency", 6

    def ys(v, line):
        """One line of the explorer: the slider value ``v``, the line's parameter, every x."""
        if vary == "acceptance":
            return [_speedup(target, draft0, line, context, k, v) for k in x]
        if vary == "draft_cost":
            draft = P.eagle3_draft(draft_dtype, v)
            return [_speedup(target, draft, line, context, k, alpha0) for k in x]
        if vary == "concurrency":
            return [_speedup(target, draft0, v, context, k, line) for k in x]
        return [_speedup(target, draft0, c, context, v, line) for c in x]

    table = [[ys(v, line) for line in lines] for v in values]  # [value][line][x]
    top = max(max(max(row) for row in per_value) for per_value in table)
    fig = go.Figure()
    for j, line in enumerate(lines):
        marker = {"size": 8, "color": _color(j)}
        if vary != "k":
            marker["symbol"] = _symbols(x)
        fig.add_trace(go.Scatter(x=x, y=table[active][j], mode="lines+markers", name=line_name.format(line),
                                 line={"color": _color(j)}, marker=marker,
                                 hovertemplate=f"{line_name.format(line)}<br>x=%{{x}}: %{{y:.3f}}x<extra></extra>"))
    steps = [dict(label=lab, method="restyle", args=[{"y": table[i]}, list(range(len(lines)))])
             for i, lab in enumerate(labels)]
    fig.update_layout(sliders=[dict(active=active, steps=steps, currentvalue={"prefix": prefix}, pad={"t": 45},
                                    x=0.0, len=1.0)])
    fig.add_hline(y=1.0, line={"color": "#999", "dash": "dot"})
    fig.update_xaxes(title_text=x_title, **({"type": "log", "tickvals": x} if vary == "k" else {"dtick": 1}))
    fig.update_yaxes(title_text="speed-up over no speculation", range=[0, 1.05 * top])
    fixed_note = "" if vary == "draft_cost" else f", draft overhead {fixed0:.3f} ms/forward"
    acc_note = "" if vary in ("acceptance", "concurrency", "k") else f", alpha {alpha0:.3f}"
    return _layout(fig, f"Explorer: {vary.replace('_', ' ')} slider<br><sup>context {context:g}{fixed_note}{acc_note}"
                        "</sup>", height=560)


# ------------------------------------------------------------------------------------------------
# long context; the index expansion per step
# ------------------------------------------------------------------------------------------------


def verify_trend_figure(target: P.TargetStepModel, *, k: int = 7, input_lens: Sequence[int] = (1024, 8192),
                        reference: Sequence[tuple[int, float]] = ((4, 0.30), (64, 2.56))) -> go.Figure:
    """Left: at the longest input length, the verify time per accepted token (``verify_ms`` / tokens per
    step) split into the weight/token part and the MLA attention part. Right: how each grows with
    concurrency, relative to the lowest concurrency, at every input length, beside the published 8K/1K
    trend (``reference``: (concurrency, ms) pairs, whose exact definition we do not have)."""
    long = max(input_lens)
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.14,
                        subplot_titles=(f"{long // 1024}K in / 1K out: ms per accepted token (model)",
                                        "growth relative to the lowest concurrency"))
    rows = P.verify_cost_trend(target, input_len=long, k=k)
    xs = [str(r["concurrency"]) for r in rows]
    tokens = rows[0]["verify_ms"] / rows[0]["verify_ms_per_accepted_token"]
    fig.add_trace(go.Bar(x=xs, y=[r["weights_tokens_ms"] / tokens for r in rows], name="weights and tokens",
                         marker={"color": PART_COLORS["tokens"]},
                         hovertemplate="weights/tokens: %{y:.3f} ms per accepted token<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=xs, y=[r["attention_ms_per_accepted_token"] for r in rows], name="MLA attention (KV read)",
                         marker={"color": PART_COLORS["attention"]},
                         text=[f"{r['attention_ms_per_accepted_token']:.2f}" for r in rows], textposition="outside",
                         hovertemplate="attention: %{y:.3f} ms per accepted token<extra></extra>"), row=1, col=1)
    dashes = ("dot", "solid", "dash", "dashdot")
    for i, n in enumerate(sorted(input_lens)):
        trend = P.verify_cost_trend(target, input_len=n, k=k)
        conc = [r["concurrency"] for r in trend]
        for key, label, color in (("verify_ms_per_accepted_token", "whole verify", PART_COLORS["tokens"]),
                                  ("attention_ms_per_accepted_token", "attention part", PART_COLORS["attention"])):
            base = trend[0][key]
            fig.add_trace(go.Scatter(x=conc, y=[r[key] / base for r in trend], mode="lines+markers",
                                     name=f"{n // 1024}K: {label} (model)", line={"color": color,
                                                                                  "dash": dashes[i % len(dashes)]},
                                     hovertemplate=f"{n // 1024}K {label}: x%{{y:.2f}} at concurrency %{{x}}"
                                                   "<extra></extra>"), row=2, col=1)
    if reference:
        (c0, v0), *_ = reference
        fig.add_trace(go.Scatter(x=[c for c, _ in reference], y=[v / v0 for _, v in reference], mode="lines+markers",
                                 name="blog 8K/1K: " + " -> ".join(f"{v:.2f} ms" for _, v in reference),
                                 line={"color": "#d62728", "width": 3}, marker={"size": 11, "symbol": "diamond"},
                                 hovertemplate="blog: x%{y:.2f} at concurrency %{x}<extra></extra>"), row=2, col=1)
    fig.update_xaxes(title_text="concurrency", row=1, col=1)
    fig.update_yaxes(title_text="ms per accepted token", row=1, col=1)
    fig.update_xaxes(title_text="concurrency", type="log", tickvals=[r["concurrency"] for r in rows], row=2, col=1)
    fig.update_yaxes(title_text="x value at lowest c", type="log", row=2, col=1)
    return _layout(fig, f"Target verify cost per accepted token (k={k})<br><sup>what grows with concurrency</sup>",
                   height=820, legend="below", barmode="stack")


def expansion_per_step_figure(h200_rows: list[dict[str, Any]] | None, published: dict[str, float]) -> go.Figure:
    """Index expansion per engine step beside MLA decode, log scale.

    Left: MI355X at ~97k context, concurrency 1: the published serial-loop cost (61.6 us x 7 calls), the
    modelled MLA attention of one step and (when ``published`` has it) the modelled whole verify step.
    Right (only when the H200 measurements are committed): per benchmark case, the 2-D-grid kernel and the
    serial kernel per step (x calls per step) and the MLA decode of all layers, per step.
    """
    import math

    cols = 2 if h200_rows else 1
    titles = ["MI355X, ~97k context, concurrency 1"] + (["H200 (measured), per benchmark case"] if h200_rows else [])
    fig = make_subplots(rows=cols, cols=1, subplot_titles=titles, vertical_spacing=0.16)
    bars = [("serial expansion<br>(published)", published["expand_ms_per_step"], "#d62728"),
            ("MLA attention<br>(model)", published["attention_ms_per_step"], PART_COLORS["attention"])]
    if "verify_ms" in published:
        bars.append(("whole verify step<br>(model)", published["verify_ms"], PART_COLORS["tokens"]))
    fig.add_trace(go.Bar(x=[b[0] for b in bars], y=[1e3 * b[1] for b in bars], showlegend=False,
                         marker={"color": [b[2] for b in bars]}, text=[f"{1e3 * b[1]:,.0f} us" for b in bars],
                         textposition="outside", hovertemplate="%{x}: %{y:,.0f} us per step<extra></extra>"),
                  row=1, col=1)
    top = max(1e3 * b[1] for b in bars)
    if h200_rows:
        xs = [case_label(r) for r in h200_rows]
        for key, name, color in (("serial_us_per_step", "serial kernel (v0.20) x calls", "#d62728"),
                                 ("kernel_us_per_step", "2-D-grid kernel x calls", "#2ca02c"),
                                 ("decode_us_per_step", "MLA decode x 61 layers (scaled)", PART_COLORS["attention"])):
            fig.add_trace(go.Bar(x=xs, y=[r[key] for r in h200_rows], name=name, marker={"color": color},
                                 hovertemplate=f"{name}: %{{y:,.1f}} us per step<extra></extra>"), row=2, col=1)
        fig.update_yaxes(type="log", title_text="us per engine step", row=2, col=1)
    fig.update_yaxes(type="log", title_text="us per engine step", range=[1, math.log10(top) + 0.5], row=1, col=1)
    return _layout(fig, "The per-token index expansion per step<br><sup>beside the decode it feeds</sup>",
                   height=820 if cols == 2 else 460, legend="below", barmode="group")


# ------------------------------------------------------------------------------------------------
# live explorer for JupyterLab
# ------------------------------------------------------------------------------------------------


def throughput_report(target: P.TargetStepModel, *, use_rates: bool = True, alpha: float = 0.8, k: int = 7,
                      draft_fixed_ms: float = 0.1, concurrency: int = 16, context: float = 1536,
                      draft_dtype: str = "bf16") -> str:
    """The text :func:`throughput_widget` shows: one speculative step, its throughput and speed-up, and the
    best ``k`` with and without the power-of-two restriction."""
    if use_rates:
        k_used, acc = min(k, len(P.AITER_2720_RATES)), dict(rates=P.AITER_2720_RATES)
    else:
        k_used, acc = k, dict(alpha=alpha)
    draft = P.eagle3_draft(draft_dtype, fixed_ms=draft_fixed_ms)
    plain = P.spec_step(target, None, concurrency, context, 0)
    s = P.spec_step(target, draft, concurrency, context, k_used, **acc)
    r = P.power_of_two_cost(target, draft, concurrency, context, **acc)
    capped = "" if k_used == k else f" (k capped at {k_used}: the rates stop there)"
    safe = "(power of two)" if P.is_power_of_two_qlen(k_used) else "(NOT a power of two: wrong output with aiter, #2720)"
    return "\n".join([
        f"k={k_used}{capped}, verify qlen {k_used + 1} {safe}",
        f"tokens per step {s.tokens_per_step:.3f}",
        f"step {s.step_ms:.2f} ms = draft {s.draft_ms:.2f} + verify {s.verify_ms:.2f} + overhead {s.overhead_ms:.2f}",
        f"no speculation: step {plain.step_ms:.2f} ms, {plain.tok_s_per_gpu:.1f} tok/s/GPU",
        f"Eagle3: {s.tok_s_per_gpu:.1f} tok/s/GPU, speed-up {s.tok_s_per_gpu / plain.tok_s_per_gpu:.3f}x",
        f"best k {r.free.k} ({r.free.speedup:.3f}x); best power-of-two k {r.restricted.k} ({r.restricted.speedup:.3f}x): "
        f"the restriction costs {r.cost:.2%}",
    ])


def throughput_widget(prediction: P.Prediction | None = None):
    """An ipywidgets explorer for JupyterLab: acceptance, k, draft overhead, concurrency and context in;
    the step breakdown, throughput, speed-up and the cost of the power-of-two restriction out.

    The site cannot run it (no kernel); it shows :func:`spec_explorer` instead.
    """
    import ipywidgets as widgets

    prediction = prediction or P.predict_published()
    target = prediction.target
    w_rates = widgets.Checkbox(value=True, description="aiter #2720 rates (else alpha)")
    w_alpha = widgets.FloatSlider(value=round(P.fit_iid_alpha(P.AITER_2720_RATES), 2), min=0.3, max=0.99, step=0.01,
                                  description="alpha")
    w_k = widgets.IntSlider(value=7, min=1, max=15, description="k")
    w_draft = widgets.FloatSlider(value=round(P.draft_fixed_ms_from_target(target), 3), min=0.0, max=3.0, step=0.05,
                                  description="draft ms/fwd")
    w_conc = widgets.SelectionSlider(options=list(CONCURRENCIES), value=16, description="concurrency")
    w_ctx = widgets.SelectionSlider(options=[1536, 4608, 8704, 16896, 33280, 66048, 131584], value=1536,
                                    description="context")
    w_dtype = widgets.ToggleButtons(options=["bf16", "fp8"], value="bf16", description="draft")
    out = widgets.Output()

    def update(_=None):
        out.clear_output()
        with out:
            print(throughput_report(target, use_rates=w_rates.value, alpha=w_alpha.value, k=w_k.value,
                                    draft_fixed_ms=w_draft.value, concurrency=w_conc.value, context=w_ctx.value,
                                    draft_dtype=w_dtype.value))

    for w in (w_rates, w_alpha, w_k, w_draft, w_conc, w_ctx, w_dtype):
        w.observe(update, names="value")
    update()
    return widgets.VBox([widgets.HBox([w_rates, w_alpha]), widgets.HBox([w_k, w_draft]),
                         widgets.HBox([w_conc, w_ctx]), w_dtype, out])


def power_of_two_cost_figure(prediction: P.Prediction | None = None, concurrency: int = 16, *,
                             context: float | None = None, alphas: Sequence[float] = ALPHAS,
                             draft_fixed_ms: Sequence[float] = DRAFT_FIXED_MS, k_max: int = 15) -> go.Figure:
    """Heatmap: throughput lost by restricting ``k + 1`` to powers of two, over i.i.d. acceptance (x) and the
    draft's per-forward overhead (y), at one concurrency. Cell text: best free k / best allowed k."""
    prediction = prediction or P.predict_published()
    target = prediction.target
    context = prediction.table.mean_context if context is None else context
    z, text = [], []
    for fixed in draft_fixed_ms:
        draft = P.eagle3_draft("bf16", fixed)
        row_z, row_t = [], []
        for a in alphas:
            r = P.power_of_two_cost(target, draft, concurrency, context, alpha=a, k_max=k_max)
            row_z.append(100 * r.cost)
            row_t.append(f"{r.free.k}/{r.restricted.k}")
        z.append(row_z)
        text.append(row_t)
    fig = go.Figure(go.Heatmap(
        x=[f"{a:.2f}" for a in alphas], y=[f"{f:g} ms" for f in draft_fixed_ms], z=z, text=text,
        texttemplate="%{text}", colorscale="Reds", zmin=0, colorbar={"title": "% lost"},
        hovertemplate="alpha %{x}, draft %{y}/forward<br>best k / best allowed k: %{text}<br>"
                      "restriction costs %{z:.2f} %<extra></extra>"))
    fig.update_xaxes(title_text="i.i.d. acceptance alpha")
    fig.update_yaxes(title_text="draft overhead per forward")
    return _layout(fig, f"What k+1 in {{2, 4, 8, 16}} costs<br><sup>concurrency {concurrency}, context {context:g}; "
                        "cells: best k / best allowed k (k <= 15)</sup>", height=520)
