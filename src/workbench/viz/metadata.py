"""Chapter 4: the persistent schedule (units x work items) and the build/run interleaving timeline."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from workbench.metadata import PersistentSchedule, ReplayEvent, StressResult

# Fixed qualitative palette (colour-blind friendly, Okabe-Ito + greys), cycled by request index.
REQUEST_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
                  "#999999", "#8C564B")
OUTCOME_COLORS = {"built": "#9e9e9e", "ok": "#2e7d32", "slow path": "#ef6c00", "refused": "#c62828",
                  "output differs": "#6a1b9a"}
DESIGN_LABELS = {"instance": "flag on the builder (first revision)", "metadata": "flag on the metadata (merged)"}


def schedule_figure(schedule: PersistentSchedule, title: str | None = None) -> go.Figure:
    """Units (rows) x work items (bars, length in KV granules), one colour per request.

    A hatched bar is a partial (its request was split across units and is merged by the reduce step);
    a solid bar writes the output directly. Hover shows the request, KV range and partial slot.
    """
    G = schedule.kv_granularity
    by_request: dict[int, dict[str, list]] = {}
    offsets = [0] * schedule.num_units
    for it in schedule.work_items():
        length = -(-(it.kv_end - it.kv_start) // G)
        d = by_request.setdefault(it.request, {"x": [], "base": [], "y": [], "pattern": [], "text": [], "hover": []})
        d["x"].append(length)
        d["base"].append(offsets[it.unit])
        d["y"].append(f"unit {it.unit}")
        d["pattern"].append("/" if it.partial >= 0 else "")
        d["text"].append(f"r{it.request}" + (f" p{it.partial}" if it.partial >= 0 else ""))
        d["hover"].append(
            f"request {it.request}<br>kv_indices[{it.kv_start}:{it.kv_end}] ({it.kv_end - it.kv_start} tokens, "
            f"{length} granules)<br>" + (f"partial slot {it.partial}" if it.partial >= 0 else "direct write"))
        offsets[it.unit] += length
    fig = go.Figure()
    for r in sorted(by_request):
        d = by_request[r]
        fig.add_trace(go.Bar(
            x=d["x"], base=d["base"], y=d["y"], orientation="h", name=f"request {r}", text=d["text"],
            textposition="inside", insidetextanchor="middle", textangle=0, hovertext=d["hover"], hoverinfo="text",
            marker={"color": REQUEST_COLORS[r % len(REQUEST_COLORS)], "line": {"color": "white", "width": 1},
                    "pattern": {"shape": d["pattern"], "fgcolor": "white", "size": 6}},
        ))
    loads = schedule.unit_loads()
    fig.update_layout(
        title=title or (f"Persistent schedule: {schedule.num_reqs} requests, {schedule.num_units} units"
                        f"<br><sup>granules per unit {min(loads)}-{max(loads)}; hatched = partial</sup>"),
        barmode="overlay", template="plotly_white", width=760, height=190 + 34 * schedule.num_units,
        xaxis={"title": f"KV granules ({G} tokens each)"},
        yaxis={"autorange": "reversed", "categoryorder": "array",
               "categoryarray": [f"unit {u}" for u in range(schedule.num_units)]},
        legend={"font": {"size": 10}, "orientation": "h", "y": -0.25 - 1.2 / (2 + schedule.num_units)},
        margin={"t": 60},
    )
    return fig


def interleaving_figure(replays: dict[str, Sequence[ReplayEvent]], active: str | None = None) -> go.Figure:
    """Timeline of builds and runs for both designs, one panel per interleaving (dropdown).

    ``active`` is the interleaving shown first; by default the first one in which something went wrong.

    Each marker is an event: squares are builds, circles are runs. The label shows the flag the design
    reports for that step at that moment (and, in brackets, the step's own fact); the colour is the
    outcome: grey built, green ok, orange slow path, red refused by the schedule, purple output differs.
    """
    fig = go.Figure()
    names = list(replays)
    if active is None:
        active = next((n for n in names if any(e.outcome not in ("built", "ok") for e in replays[n])), names[0])
    if active not in replays:
        raise ValueError(f"active is {active!r}; choose one of {names}")
    first = names.index(active)
    visibility = []
    for i, name in enumerate(names):
        events = list(replays[name])
        designs = list(dict.fromkeys(e.design for e in events))
        for design in designs:
            evs = [e for e in events if e.design == design]
            fig.add_trace(go.Scatter(
                x=[e.t for e in evs], y=[DESIGN_LABELS.get(design, design)] * len(evs), mode="markers+text",
                name=DESIGN_LABELS.get(design, design), visible=(i == first), showlegend=False,
                marker={"size": 26, "symbol": ["square" if e.action == "build" else "circle" for e in evs],
                        "color": [OUTCOME_COLORS.get(e.outcome, "#000000") for e in evs],
                        "line": {"color": "#333333", "width": 1}},
                text=[f"{'T' if e.flag else 'F'}" for e in evs], textfont={"color": "white", "size": 11},
                hovertext=[f"{e.action} {e.step} ({e.kind})<br>flag read: {e.flag}; step's own fact: {e.truth}"
                           f"<br><b>{e.outcome}</b>: {e.detail[:160]}" for e in evs],
                hoverinfo="text",
            ))
            visibility.append(i)
    # One legend entry per outcome (dummy traces, always visible).
    for outcome, color in OUTCOME_COLORS.items():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=outcome,
                                 marker={"size": 12, "color": color, "symbol": "circle"}))

    def ticks(name):
        evs = [e for e in replays[name] if e.design == replays[name][0].design]
        return [e.t for e in evs], [f"{e.action} {e.step}<br>({e.kind})" for e in evs]

    buttons = []
    for i, name in enumerate(names):
        tv, tt = ticks(name)
        vis = [v == i for v in visibility] + [True] * len(OUTCOME_COLORS)
        buttons.append({"label": name, "method": "update",
                        "args": [{"visible": vis}, {"xaxis.tickvals": tv, "xaxis.ticktext": tt}]})
    tv, tt = ticks(active)
    fig.update_layout(
        title={"text": "Builds (squares), runs (circles), flag read (T/F)", "y": 0.97},
        template="plotly_white", width=760, height=340,
        xaxis={"tickvals": tv, "ticktext": tt, "range": [-0.6, max(len(ticks(n)[0]) for n in names) - 0.4],
               "showgrid": False},
        yaxis={"automargin": True, "autorange": "reversed"},
        updatemenus=[{"buttons": buttons, "direction": "down", "x": 0.0, "xanchor": "left", "y": 1.32,
                      "yanchor": "top", "active": first}],
        margin={"t": 130},
        legend={"orientation": "h", "y": -0.35},
    )
    return fig


def stress_figure(results: Sequence[StressResult]) -> go.Figure:
    """Mismatches per run of the stress test, stacked by kind (log-free bar chart; zero bars are labelled)."""
    labels = [f"{r.design}<br>{r.mode}, {r.threads} thr" for r in results]
    kinds = (("persistent_on_verify", "schedule on a verify step", "#c62828"),
             ("persistent_on_no_decode", "stale flag on a step without decodes", "#ad1457"),
             ("skipped_on_decode", "decode sent to the slow path", "#ef6c00"),
             ("foreign_schedule", "another step's work buffers", "#6a1b9a"))
    fig = go.Figure()
    for attr, name, color in kinds:
        fig.add_trace(go.Bar(x=labels, y=[getattr(r, attr) for r in results], name=name, marker={"color": color}))
    fig.add_trace(go.Scatter(x=labels, y=[r.mismatches for r in results], mode="text",
                             text=[f"{r.mismatches:,} / {r.builds:,}" for r in results], textposition="top center",
                             showlegend=False, hoverinfo="skip"))
    fig.update_layout(barmode="stack", template="plotly_white", width=760, height=420,
                      title="Stress test: decisions not the step's own",
                      yaxis={"title": "mismatches"}, legend={"font": {"size": 10}})
    return fig
