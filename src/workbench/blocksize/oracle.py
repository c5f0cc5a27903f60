"""The same questions put to a real vLLM: in this process when vLLM imports, else in ``.venv-vllm``.

:func:`ask_real_vllm` sends JSON requests to ``python -m workbench.blocksize --oracle`` under a Python
that imports vLLM (made by ``scripts/vllm_env.sh``); :func:`serve_oracle` answers them there with vLLM's
own ``select_common_block_size`` and backend classes.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Mapping, Sequence

from workbench.blocksize.catalog import Backend, InstalledBackends, read_installed_backends
from workbench.blocksize.rules import MultipleOf, _is_foreign_multiple_of

_REPO = pathlib.Path(__file__).resolve().parents[3]  # src/workbench/blocksize/oracle.py -> the repository
_MARKER = "@@WB-ORACLE@@"  # opens the one stdout line that carries the answers


def _encode_entry(x: object) -> object:
    if isinstance(x, MultipleOf) or _is_foreign_multiple_of(x):
        return {"multiple_of": x.base}
    if isinstance(x, bool) or x is None or isinstance(x, (int, float, str)):
        return x if not isinstance(x, float) else {"float": x}
    raise TypeError(f"cannot send {x!r} to the vLLM oracle")


def _decode_entry(x: object, multiple_of: type) -> object:
    if isinstance(x, dict):
        if "multiple_of" in x:
            return multiple_of(x["multiple_of"])
        if "float" in x:
            return float(x["float"])
    return x


def read_backends_elsewhere() -> "InstalledBackends":
    """:func:`read_installed_backends`, run under the Python that imports vLLM (:func:`vllm_python`).

    For a process without vLLM: the reading of the conformance environment's vLLM, rebuilt here. Never
    raises; when no vLLM is reachable, ``available`` is ``False`` and ``reason`` says why.
    """
    python, why = vllm_python()
    if python is None:
        return InstalledBackends(False, None, {}, {}, f"vLLM is not importable here, and {why}")
    try:
        (reply,) = ask_real_vllm([{"op": "reader"}])
    except RuntimeError as exc:
        return InstalledBackends(False, None, {}, {}, f"reading vLLM under {python} failed: {exc}")
    backends = {name: Backend(name, tuple(_decode_entry(x, MultipleOf) for x in reply["sizes"][name]),
                              meta["kind"], meta["class_path"], meta["platform"], meta["reported_name"],
                              f"read from vLLM {reply['version']} under {python}")
                for name, meta in reply["backends"].items()}
    where = f"{reply['reason']} (under {python})"
    return InstalledBackends(reply["available"], reply["version"], backends, reply["failures"], where)


def vllm_python() -> tuple[str | None, str]:
    """The Python that can import a real vLLM: ``(path or None, reason)``.

    This process when vLLM imports here; else ``$WB_VLLM_PYTHON``; else ``.venv-vllm/bin/python``
    in the repository (made by ``scripts/vllm_env.sh``, which writes a stamp when it succeeded).
    """
    from workbench import device

    if device.vllm_status().available:
        return sys.executable, f"this Python ({device.vllm_status()})"
    explicit = os.environ.get("WB_VLLM_PYTHON")
    if explicit:
        return (explicit, "$WB_VLLM_PYTHON") if os.path.exists(explicit) else \
            (None, f"$WB_VLLM_PYTHON={explicit} does not exist")
    env = _REPO / ".venv-vllm"
    python = env / "bin" / "python"
    if not python.exists():
        return None, (f"vLLM is not importable here ({device.vllm_status().reason}) and {env} does not exist: "
                      "run `bash scripts/vllm_env.sh` to create it")
    if not (env / ".vllm-stamp").exists():
        return None, f"{env} exists but scripts/vllm_env.sh did not finish (no .vllm-stamp): run it again"
    return str(python), f"{python} (made by scripts/vllm_env.sh)"


def ask_real_vllm(requests: Sequence[Mapping], timeout: float = 600.0) -> list[dict]:
    """Answer requests with a real vLLM's ``select_common_block_size`` and backend classes.

    Each request is a dict with ``"op"``:

    * ``{"op": "select", "n": 16, "backends": [["%16"] ...]}``: stand-in backend classes declaring the
      given entries (encoded: ints, ``{"multiple_of": b}``, ``{"float": x}``, strings, ``None``; the names
      are ``backends[i]`` or ``"names"`` when given) go to vLLM's real function;
    * ``{"op": "select_real", "n": 16, "names": ["ROCM_AITER_MLA", "ROCM_ATTN"], "override": {name: entries}}``:
      the real classes, with a subclass overriding one declaration where ``override`` says so;
    * ``{"op": "read", "names": [...]}``: the declarations of the real classes, and what each returns
      from ``get_preferred_block_size(16)``;
    * ``{"op": "reader"}``: what :func:`read_installed_backends` reports, run in that environment.

    Answers are ``{"value": int}``, ``{"error": "ValueError", "message": str}``, or for ``read``
    ``{"sizes": {name: entries}, "failures": {name: reason}, "preferred": {name: int}, "version": str}``.

    Raises:
        RuntimeError: no real vLLM is available (the message says why) or the oracle failed.
    """
    return run_in_vllm(["workbench.blocksize", "--oracle"], requests, timeout=timeout)


def run_in_vllm(module_args: Sequence[str], requests: Sequence[Mapping], timeout: float = 600.0,
                extra_env: Mapping[str, str] | None = None) -> list:
    """Send ``requests`` (JSON) to ``python -m <module_args>`` under the Python that imports vLLM and return the
    answers it prints on one line opened by the marker (:func:`answer`). The one subprocess runner of the
    package: the block-size oracle and :mod:`workbench.upstream` both go through it. ``extra_env`` is added to
    the subprocess's environment.

    Raises:
        RuntimeError: no real vLLM is available (the message says why) or the subprocess failed.
    """
    python, reason = vllm_python()
    if python is None:
        raise RuntimeError(f"no real vLLM available: {reason}")
    payload = json.dumps(list(requests))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    env.update(extra_env or {})
    proc = subprocess.run([python, "-m", *module_args], input=payload, capture_output=True, text=True,
                          timeout=timeout, env=env)
    out = [line for line in proc.stdout.splitlines() if line.startswith(_MARKER)]
    if proc.returncode != 0 or len(out) != 1:
        raise RuntimeError(f"python -m {' '.join(module_args)} under {python} failed with exit code "
                           f"{proc.returncode}:\n{proc.stderr[-3000:]}\n{proc.stdout[-1000:]}")
    return json.loads(out[0][len(_MARKER):])


def answer(answers: list) -> None:
    """Print ``answers`` as the one marked stdout line :func:`run_in_vllm` reads (to the real stdout, so that
    whatever vLLM logs on the way cannot be mistaken for them)."""
    sys.__stdout__.write(_MARKER + json.dumps(answers) + "\n")
    sys.__stdout__.flush()


def serve_oracle() -> None:
    """Run inside a Python with vLLM: read requests (JSON, stdin), print answers (one marked line).

    The answers go to the real stdout in one line opened by the marker, so that whatever vLLM logs
    on the way cannot be mistaken for them.
    """
    requests = json.loads(sys.stdin.read())
    from vllm.v1.attention.backend import MultipleOf as VMultipleOf
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.worker.utils import select_common_block_size as real_select

    def stand_in(name: str, entries: list):
        sizes = [_decode_entry(e, VMultipleOf) for e in entries]
        return type(name, (), {
            "get_supported_kernel_block_sizes": staticmethod(lambda kv_cache_spec=None, s=sizes: list(s)),
            "get_name": staticmethod(lambda n=name: n),
        })

    def real_class(name: str):
        path = AttentionBackendEnum[name].get_path()
        module, _, cls_name = path.rpartition(".")
        return getattr(importlib.import_module(module), cls_name)

    def call(n, classes) -> dict:
        try:
            return {"value": real_select(n, classes)}
        except Exception as exc:  # noqa: BLE001 - the answer is the error
            return {"error": type(exc).__name__, "message": str(exc)}

    answers = []
    for req in requests:
        op = req["op"]
        if op == "select":
            names = req.get("names") or [f"backends[{i}]" for i in range(len(req["backends"]))]
            answers.append(call(req["n"], [stand_in(nm, e) for nm, e in zip(names, req["backends"])]))
        elif op == "select_real":
            classes = []
            try:
                for name in req["names"]:
                    cls = real_class(name)
                    if name in req.get("override", {}):
                        sizes = [_decode_entry(e, VMultipleOf) for e in req["override"][name]]
                        cls = type(cls.__name__ + "Override", (cls,), {"get_supported_kernel_block_sizes":
                                   staticmethod(lambda kv_cache_spec=None, s=sizes: list(s))})
                    classes.append(cls)
            except Exception as exc:  # noqa: BLE001 - a class that does not import here
                answers.append({"error": "ImportError", "message": f"{name}: {type(exc).__name__}: {exc}"[:300]})
                continue
            answers.append(call(req["n"], classes))
        elif op == "read":
            sizes, failures, preferred = {}, {}, {}
            for name in req["names"]:
                try:
                    cls = real_class(name)
                    sizes[name] = [_encode_entry(x) for x in cls.get_supported_kernel_block_sizes()]
                    try:
                        preferred[name] = cls.get_preferred_block_size(16)
                    except Exception as exc:  # noqa: BLE001 - per backend
                        preferred[name] = f"{type(exc).__name__}: {exc}"[:200]
                except Exception as exc:  # noqa: BLE001 - per backend
                    failures[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
            import vllm
            answers.append({"sizes": sizes, "failures": failures, "preferred": preferred,
                            "version": vllm.__version__})
        elif op == "reader":  # this package's reader of the installed vLLM, run where vLLM is installed
            reading = read_installed_backends()
            answers.append({"available": reading.available, "version": reading.vllm_version,
                            "sizes": {n: [_encode_entry(x) for x in b.sizes] for n, b in reading.backends.items()},
                            "backends": {n: {"kind": b.kind, "class_path": b.class_path, "platform": b.platform,
                                             "reported_name": b.reported_name}
                                         for n, b in reading.backends.items()},
                            "failures": dict(reading.failures), "reason": reading.reason})
        else:
            answers.append({"error": "ValueError", "message": f"unknown op {op!r}"})
    answer(answers)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m workbench.blocksize --oracle``: answer JSON requests on stdin with a real vLLM."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--oracle"]:
        serve_oracle()
        return 0
    print("usage: python -m workbench.blocksize --oracle  (answers JSON requests with a real vLLM)")
    return 2
