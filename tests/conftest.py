"""Shared fixtures.

``viz``: the figure module, or a skip with the reason when plotly is missing (the GPU machine's image
has torch and triton but no plotly, and the GPU-only tests run there).
"""

from __future__ import annotations

import importlib

import pytest


@pytest.fixture
def viz():
    pytest.importorskip("plotly", reason="plotly is not installed (the GPU machine's image lacks it); figures need it")
    return importlib.import_module("workbench.viz")


@pytest.fixture
def vq(viz):
    """``workbench.viz.qlen`` (chapter 5's figures)."""
    return importlib.import_module("workbench.viz.qlen")
