"""Shared fixtures, and the one place where tests that need hardware are skipped.

Markers (declared in pyproject.toml), applied here instead of per-test ``skipif`` stacks:

* ``gpu``: needs a CUDA or ROCm GPU with compiled Triton kernels; skipped with that reason elsewhere;
* ``hopper``: needs an NVIDIA Hopper GPU (compute capability 9.x) where the Gluon kernels run;
* ``interpreter``: checks behaviour of the Triton interpreter or the CPU paths; skipped on a GPU machine.

``viz``: the figure module, or a skip with the reason when plotly is missing (the GPU machine's image
has torch and triton but no plotly, and the GPU-only tests run there). ``run_compiled``: runs a script with
``TRITON_INTERPRET=0`` in a subprocess and returns the JSON it printed last (the codegen tests compile kernels
there: in the test process the kernels are the interpreter's Python functions).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

from workbench import device

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_ON_GPU = device.on_gpu()
_SKIPS = {
    "gpu": (not _ON_GPU, "needs a CUDA or ROCm GPU (compiled Triton kernels); this machine has none"),
    "hopper": (not device.gluon_available(),
               "needs an NVIDIA Hopper GPU (compute capability 9.x) and Triton with Gluon"),
    "interpreter": (_ON_GPU, "checks the Triton interpreter or the CPU path; this machine has a GPU"),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name, (skip, reason) in _SKIPS.items():
            if skip and item.get_closest_marker(name) is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
                break


def _run_compiled(script: str, timeout: int = 600):
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.path.join(ROOT, "src"))
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=timeout,
                         check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def run_compiled():
    return _run_compiled


@pytest.fixture(scope="session")
def vllm_env_python():
    """The Python that imports a real vLLM (``workbench.blocksize.vllm_python``): a skip with the reason where the
    vLLM environment could not be created, a failure where ``$WB_VLLM_PYTHON`` names one that does not work."""
    from workbench import blocksize

    python, reason = blocksize.vllm_python()
    if python is None and os.environ.get("WB_VLLM_PYTHON"):
        pytest.fail(f"WB_VLLM_PYTHON is set but unusable: {reason}")
    if python is None:
        pytest.skip(f"the vLLM environment could not be created: {reason}")
    return python


@pytest.fixture
def viz():
    pytest.importorskip("plotly", reason="plotly is not installed (the GPU machine's image lacks it); figures need it")
    return importlib.import_module("workbench.viz")


@pytest.fixture
def vq(viz):
    """``workbench.viz.qlen`` (chapter 5's figures)."""
    return importlib.import_module("workbench.viz.qlen")
