"""Sphinx extension: serve plotly.js from the site itself, once, before anything else.

Chapters display plotly figures as HTML that calls ``Plotly.newPlot`` without embedding plotly.js
(``workbench.viz``'s renderer). This extension copies ``plotly.min.js`` from the installed plotly
package (so the library and the site always agree on the version) into ``_static/`` and adds it to
every page's ``<head>`` with a low priority number, so that it loads before RequireJS (which the
ipywidgets embedder needs). Loaded after RequireJS, plotly.js would register itself as an AMD module
and leave ``window.Plotly`` undefined.
"""

from __future__ import annotations

import importlib.resources
import shutil
from pathlib import Path

PLOTLY_JS = "plotly.min.js"


def _copy_plotly(app, exception):
    if exception is not None or app.builder is None or app.builder.format != "html":
        return
    source = importlib.resources.files("plotly") / "package_data" / PLOTLY_JS
    target = Path(app.builder.outdir) / "_static" / PLOTLY_JS
    target.parent.mkdir(parents=True, exist_ok=True)
    with importlib.resources.as_file(source) as path:
        shutil.copyfile(path, target)


def setup(app):
    app.add_js_file(PLOTLY_JS, priority=100)
    app.connect("build-finished", _copy_plotly)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
