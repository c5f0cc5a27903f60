"""Every figure the book shows (plotly), and the renderer that makes them work offline.

Importing this module registers a plotly renderer named ``"workbench"`` and makes it the default.
A figure shown in a notebook then carries two outputs:

* ``application/vnd.plotly.v1+json`` for JupyterLab, which draws it with its own plotly extension;
* ``text/html``: a ``<div>`` plus a call to ``Plotly.newPlot`` *without* plotly.js inside. The site
  loads plotly.js once, from its own ``_static/`` folder (``book/_ext/workbench_assets.py``), so no
  page fetches anything from a CDN and a page with ten figures does not carry ten copies.

Figures live in one submodule per topic (``viz/roofline.py``, ...) and are re-exported here,
so chapters write ``from workbench import viz; viz.roofline_figure()``. Figures are deterministic: no randomness without an explicit seed, fixed sizes and colours.
"""

from __future__ import annotations

import hashlib
import itertools
import json

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer


_PLOTLY_MIME = "application/vnd.plotly.v1+json"
_FIGURE_COUNTER = itertools.count()


class _SiteRenderer(MimetypeRenderer):
    """plotly JSON for JupyterLab plus HTML that expects ``window.Plotly`` to be on the page."""

    def to_mimebundle(self, fig_dict):
        fig = go.Figure(fig_dict)
        html = pio.to_html(
            fig, include_plotlyjs=False, full_html=False, validate=False,
            config={"displaylogo": False, "responsive": True},
            # Deterministic ids (content hash + display counter) keep rebuilt pages stable and let
            # the same figure appear twice on one page.
            div_id=f"wb-{hashlib.sha1(fig.to_json().encode()).hexdigest()[:10]}-{next(_FIGURE_COUNTER)}",
        )
        return {_PLOTLY_MIME: json.loads(pio.to_json(fig, validate=False)), "text/html": html}


def setup_renderer() -> None:
    """Register the ``workbench`` renderer and make it the default (idempotent)."""
    pio.renderers["workbench"] = _SiteRenderer()
    pio.renderers.default = "workbench"


setup_renderer()

# Figures, one submodule per topic, re-exported here (in the order of the book).
from workbench.viz.roofline import roofline_figure  # noqa: E402
from workbench.viz.blocksize import blocksize_explorer, blocksize_heatmap, blocksize_widget  # noqa: E402
from workbench.viz.expand import expand_bench_figure, expansion_figure, loose_bound_figure  # noqa: E402
from workbench.viz.mla import decode_ratio_figure, decode_roofline_figure  # noqa: E402
from workbench.viz.metadata import interleaving_figure, schedule_figure, stress_figure  # noqa: E402
from workbench.viz.qlen import (  # noqa: E402
    acceptance_figure, acceptance_length_figure, measured_padding_figure, padding_cost_figure, probe_figure,
)
from workbench.viz.throughput import (  # noqa: E402
    comparison_figure, expansion_per_step_figure, k_choice_figure, power_of_two_cost_figure, spec_explorer,
    step_breakdown_figure, throughput_widget, verify_trend_figure,
)

__all__ = [
    "setup_renderer",
    "roofline_figure",
    "blocksize_explorer", "blocksize_heatmap", "blocksize_widget",
    "expand_bench_figure", "expansion_figure", "loose_bound_figure",
    "decode_ratio_figure", "decode_roofline_figure",
    "interleaving_figure", "schedule_figure", "stress_figure",
    "acceptance_figure", "acceptance_length_figure", "measured_padding_figure", "padding_cost_figure", "probe_figure",
    "comparison_figure", "expansion_per_step_figure", "k_choice_figure", "power_of_two_cost_figure", "spec_explorer",
    "step_breakdown_figure", "throughput_widget", "verify_trend_figure",
]
