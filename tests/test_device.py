"""workbench.device: where code runs, the interpreter switch, the bf16 refusal, guarded optional imports."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import workbench
from workbench import device


def _run(code: str, **env: str) -> str:
    full_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    full_env.update(env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env,
                         check=True)
    return out.stdout.strip()


@pytest.mark.interpreter
def test_import_sets_interpreter_before_kernels_on_cpu():
    # A fresh process with no TRITON_INTERPRET: importing workbench must set it, and a kernel defined
    # afterwards must run (under the interpreter) without "0 active drivers".
    out = _run("""
        import os, workbench, torch, triton, triton.language as tl
        @triton.jit
        def add_one(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            m = offs < n
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1, mask=m)
        x = torch.arange(5, dtype=torch.float32)
        add_one[(1,)](x, 5, BLOCK=8)
        print(os.environ["TRITON_INTERPRET"], x.tolist())
    """)
    assert out == "1 [1.0, 2.0, 3.0, 4.0, 5.0]"


def test_explicit_user_choice_is_respected():
    assert _run("import os, workbench; print(os.environ['TRITON_INTERPRET'])", TRITON_INTERPRET="0") == "0"


def test_describe_names_versions_and_optional_packages():
    text = workbench.device.describe()
    assert torch.__version__ in text
    for key in ("device", "kernels", "aiter", "vllm"):
        assert key in text
    if not torch.cuda.is_available():
        assert "interpreter" in text and "no GPU" in text


@pytest.mark.parametrize("hopper", [True, False])
def test_describe_says_which_decode_kernels_an_nvidia_gpu_gets(monkeypatch, hopper):
    """On an NVIDIA GPU the summary names the decode kernels the library will choose and the shared memory a
    program may use (a GPU is faked here: on a real one the GPU suite runs this path)."""
    fake = device.Platform("cuda", "NVIDIA B200" if not hopper else "NVIDIA H200", False, torch.__version__, "3.7.1",
                           "sm_100" if not hopper else "sm_90")
    monkeypatch.setattr(device, "platform", lambda: fake)
    monkeypatch.setattr(device, "interpreter_active", lambda: False)
    monkeypatch.setattr(device, "max_shared_memory", lambda dev: 232_448)
    monkeypatch.setattr(device, "gluon_available", lambda: hopper)
    text = device.describe()
    assert "MLA decode: " + ("the Gluon kernels (Hopper)" if hopper else "the Triton tiles (the Gluon kernels need "
                             "Hopper and Triton >= 3.6)") + ", 227 KB of shared memory per program" in text, text


def test_platform_is_consistent():
    p = device.platform()
    assert p.kind in {"cuda", "rocm", "cpu"}
    assert (p.kind == "cpu") == (not torch.cuda.is_available())
    assert device.default_device().type == ("cpu" if p.kind == "cpu" else "cuda")


def test_bf16_refused_under_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(TypeError, match=r"kv_cache has dtype torch.bfloat16.*interpreter.*float16"):
        device.check_kernel_dtype(torch.bfloat16, "kv_cache")
    device.check_kernel_dtype(torch.float16, "kv_cache")  # allowed
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    device.check_kernel_dtype(torch.bfloat16, "kv_cache")  # compiled kernels compute bf16 correctly


@pytest.fixture
def fresh_status():
    device.aiter_status.cache_clear()
    yield
    device.aiter_status.cache_clear()
    sys.modules.pop("aiter", None)
    sys.modules.pop("aiter.mla", None)


def _fake_aiter(tmp_path, monkeypatch, init_source: str, hip: str | None):
    """Put a package named ``aiter`` with ``init_source`` first on sys.path, and pretend torch's HIP is ``hip``."""
    pkg = tmp_path / "aiter"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(init_source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(torch.version, "hip", hip)


def test_aiter_runtime_error_is_caught_on_rocm(tmp_path, monkeypatch, fresh_status):
    # aiter runs hipconfig/hipcc at import and raises RuntimeError (not ImportError) when that fails.
    _fake_aiter(tmp_path, monkeypatch, "raise RuntimeError('hipconfig: command not found')\n", "6.4.0")
    status = device.aiter_status()
    assert not status.available
    assert "RuntimeError" in status.reason and "hipconfig" in status.reason


def test_aiter_not_imported_without_rocm(tmp_path, monkeypatch, fresh_status):
    marker = tmp_path / "imported"
    _fake_aiter(tmp_path, monkeypatch, f"open({str(marker)!r}, 'w').close()\n", None)
    status = device.aiter_status()
    assert not status.available and "needs ROCm" in status.reason
    assert not marker.exists(), "aiter must not be imported without ROCm"


def test_unrelated_aiter_package_is_told_apart(tmp_path, monkeypatch, fresh_status):
    # PyPI also has an unrelated 'aiter' (async iterators): importable, but with no aiter.mla.
    _fake_aiter(tmp_path, monkeypatch, "", "6.4.0")
    status = device.aiter_status()
    assert not status.available
    assert "ImportError" in status.reason or "ModuleNotFoundError" in status.reason


def test_cli_info(capsys):
    from workbench.cli import main

    assert main(["info"]) == 0
    assert "torch" in capsys.readouterr().out
