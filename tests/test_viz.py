"""workbench.viz: the offline plotly renderer and the intro's roofline figure."""

from __future__ import annotations

import plotly.io as pio

from workbench import perfmodel, viz


def test_renderer_is_default_and_emits_html_without_plotly_js():
    assert pio.renderers.default == "workbench"
    bundle = viz.roofline_figure()._repr_mimebundle_()
    assert set(bundle) == {"application/vnd.plotly.v1+json", "text/html"}
    html = bundle["text/html"]
    assert "Plotly.newPlot" in html
    # plotly.js is neither fetched (no <script src>, no CDN address) nor embedded (it is ~4.6 MB)
    assert "<script src" not in html and "cdn.plot.ly" not in html
    assert len(html) < 200_000


def test_figure_ids_deterministic_and_unique():
    a = viz.roofline_figure()._repr_mimebundle_()["text/html"]
    b = viz.roofline_figure()._repr_mimebundle_()["text/html"]
    id_a = a.split('id="', 1)[1].split('"', 1)[0]
    id_b = b.split('id="', 1)[1].split('"', 1)[0]
    assert id_a != id_b and id_a.rsplit("-", 1)[0] == id_b.rsplit("-", 1)[0]


def test_roofline_points_sit_on_the_roof():
    fig = viz.roofline_figure(hardware=("H200",), points=((16, 1), (128, 1)))
    points = [t for t in fig.data if t.mode == "markers"][0]
    hw = perfmodel.HARDWARE["H200"]
    for x, y in zip(points.x, points.y):
        assert abs(y - min(hw.bf16_tflops, x * hw.bandwidth_tb_s)) < 1e-9
