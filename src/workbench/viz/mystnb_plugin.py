"""A myst-nb mime-render plugin: the site shows a figure's ``text/html``, never its plotly JSON.

Every figure output carries both ``application/vnd.plotly.v1+json`` (for JupyterLab) and
``text/html`` (for the site; see ``workbench.viz``). myst-nb renders each mime type of a bundle
before choosing one and warns about types it does not know, which breaks a warnings-as-errors
build. This plugin (registered under the ``myst_nb.mime_renderers`` entry point in pyproject.toml)
renders the plotly JSON as nothing for every builder, so the HTML is chosen and nothing is dropped
silently: a bundle with *only* plotly JSON still fails the build ("No mime type available").
"""

from __future__ import annotations

PLOTLY_MIME = "application/vnd.plotly.v1+json"


class PlotlyJsonIsRenderedAsHtml:
    mime_priority_overrides = ()

    @staticmethod
    def handle_mime(renderer, data, inline):
        if data.mime_type == PLOTLY_MIME:
            return []
        return None
