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


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    """Drop repeated <script> entries (same file, same attributes).

    With jupyter-book 1.0.4 and Sphinx 7.4, sphinx-thebe's inline configuration script is added twice,
    so every page throws "Identifier 'THEBE_JS_URL' has already been declared" in the browser
    (sphinx-togglebutton's inline script is repeated the same way).
    """
    seen, unique = set(), []
    for script in context.get("script_files", []):
        # An inline script is registered once with filename None and once with "" (same body).
        key = (getattr(script, "filename", str(script)) or "", repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app):
    app.add_js_file(PLOTLY_JS, priority=100)
    app.connect("build-finished", _copy_plotly)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
