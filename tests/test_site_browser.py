"""The built site in a real browser: every page loads offline, without JavaScript errors, and draws its figures.

Serves ``_build/html`` on 127.0.0.1, opens every page in headless Chromium (Debian's ``/usr/bin/chromium``
driven by Playwright), and asserts for each page:

* no uncaught JavaScript error and no console error;
* every plotly figure has drawn (its ``svg.main-svg`` exists);
* every saved ipywidgets view has rendered (when the page carries widget state);
* no request leaves 127.0.0.1 (such requests are aborted and recorded, so a CDN dependency fails loudly);
* at 1400 px wide, no code block or text output scrolls sideways, no figure is wider than the page, and no
  figure title runs past its figure's edge.

One screenshot per page is kept under ``_build/screenshots/`` as a test artifact.
The site must exist: ``make test`` builds it first (``make book`` alone builds it too).
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Chromium talks to Google services at start unless told not to; this machine's network refuses them.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]


# What the layout check measures in the page: text blocks wider than their box (a sideways scrollbar), figures
# past the right edge of the page, and figure titles past their figure's edges.
LAYOUT_JS = """() => {
  const problems = [];
  for (const pre of document.querySelectorAll('main pre')) {
    if (pre.scrollWidth > pre.clientWidth + 2) {
      const first = (pre.innerText.split('\\n').find(l => l.trim().length > 0) || '').slice(0, 60);
      problems.push(`text scrolls sideways (${pre.scrollWidth} > ${pre.clientWidth} px): ${first}`);
    }
  }
  const page = (document.querySelector('main') || document.body).getBoundingClientRect();
  for (const div of document.querySelectorAll('div.plotly-graph-div')) {
    const fig = div.getBoundingClientRect();
    if (fig.right > page.right + 1) problems.push(`figure wider than the page: ${Math.round(fig.width)} px`);
    const svg = div.querySelector('svg.main-svg');
    if (!svg) continue;
    const box = svg.getBoundingClientRect();
    for (const title of div.querySelectorAll('.gtitle')) {
      const t = title.getBoundingClientRect();
      if (t.width && (t.left < box.left - 1 || t.right > box.right + 1)) {
        problems.push(`figure title clipped: ${title.textContent.slice(0, 60)}`);
      }
    }
  }
  return problems;
}"""


def _pages() -> list[str]:
    if not SITE.is_dir():
        return []
    skip = ("_static/", "_sources/", "_images/", "reports/", "_downloads/")
    return sorted(
        p.relative_to(SITE).as_posix() for p in SITE.rglob("*.html") if not p.relative_to(SITE).as_posix().startswith(skip)
    )


@pytest.fixture(scope="module")
def server():
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no built site at {SITE}: run `make book` (or `make test`, which builds it first)")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output readable
        pass


@pytest.fixture(scope="module")
def browser():
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install '.[test]')")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: scripts/setup.sh installs Debian's chromium package")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def test_site_has_pages():
    pages = _pages()
    assert "index.html" in pages and "book/intro.html" in pages, pages


@pytest.mark.parametrize("page_path", _pages() or ["(no site built)"])
def test_page_offline_no_errors_figures_drawn(server, browser, page_path):
    origin = urlparse(server).netloc
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    outside: list[str] = []

    def guard(route):
        url = route.request.url
        parsed = urlparse(url)
        if parsed.scheme in ("data", "blob", "about") or parsed.netloc == origin:
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    context.route("**/*", guard)
    page = context.new_page()
    js_errors: list[str] = []
    console_errors: list[str] = []
    not_found: list[str] = []
    page.on("pageerror", lambda exc: js_errors.append(str(exc)))
    page.on("console", lambda msg: console_errors.append(msg.text) if msg.type == "error" else None)
    page.on("response", lambda r: not_found.append(r.url) if r.status >= 400 else None)

    page.goto(f"{server}/{page_path}", wait_until="load")
    n_figures = page.locator("div.plotly-graph-div").count()
    if n_figures:
        page.wait_for_function(
            "n => document.querySelectorAll('div.plotly-graph-div svg.main-svg').length >= n", arg=n_figures, timeout=20_000
        )
    has_widgets = page.locator('script[type="application/vnd.jupyter.widget-state+json"]').count() > 0
    if has_widgets:
        page.wait_for_selector(".jupyter-widgets, .widget-box, .widget-container", timeout=20_000)
    page.wait_for_timeout(300)  # let late requests (fonts, lazy scripts) start, so the guard sees them

    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / (page_path.replace("/", "__") + ".png")), full_page=True)
    drawn = page.locator("div.plotly-graph-div svg.main-svg").count()
    layout = page.evaluate(LAYOUT_JS)
    context.close()

    assert not outside, f"{page_path}: requests left 127.0.0.1: {outside}"
    assert not js_errors, f"{page_path}: JavaScript errors: {js_errors}"
    assert not console_errors, f"{page_path}: console errors: {console_errors}"
    assert not not_found, f"{page_path}: failed requests: {not_found}"
    assert drawn >= n_figures, f"{page_path}: {n_figures} plotly figures, {drawn} drawn"
    assert not layout, f"{page_path}: layout at 1400 px: {layout}"
