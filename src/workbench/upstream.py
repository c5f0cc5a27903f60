"""The installed vLLM's own code, shown beside the workbench's model of it.

The book explains vLLM functions (``select_common_block_size``, a backend's ``get_supported_kernel_block_sizes``, the
AITER MLA metadata builder's decode path, the expansion kernel); :func:`vllm_source` fetches the source of the
installed vLLM's object with ``inspect.getsource``, in the Python that imports vLLM (this one, or the separate
environment ``scripts/vllm_env.sh`` makes), so the chapter shows the real code of the version installed and nothing
of vLLM is copied into this repository. Where no vLLM is installed it says so in one line.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess

__all__ = ["SourceView", "vllm_source"]

_SCRIPT = r"""
import importlib, inspect, json, sys
mod, _, attr = sys.argv[1].partition(":")
try:
    import vllm
    obj = importlib.import_module(mod)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    print(json.dumps({"version": vllm.__version__, "file": inspect.getsourcefile(obj),
                      "line": inspect.getsourcelines(obj)[1], "source": inspect.getsource(obj)}))
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
"""


@dataclasses.dataclass(frozen=True)
class SourceView:
    """The source of one object of the installed vLLM, or the reason there is none. Shows as Python code in a
    notebook (Markdown), and as text elsewhere."""

    target: str  # "module.path:Qualified.name"
    source: str | None
    version: str | None
    where: str  # "vllm/v1/worker/utils.py:123", or why nothing was shown

    def __str__(self) -> str:
        if self.source is None:
            return f"{self.target}: {self.where}"
        return f"# vLLM {self.version}, {self.where}\n{self.source.rstrip()}"

    def _repr_markdown_(self) -> str:
        if self.source is None:
            return f"*{self.target}*: {self.where}"
        return f"vLLM {self.version}, `{self.where}`:\n\n```python\n{self.source.rstrip()}\n```"

    def lines(self, contains: str, before: int = 0, after: int = 10) -> str:
        """Only the lines around the first one that contains ``contains`` (the part a chapter discusses), or the
        reason there is none."""
        if self.source is None:
            return str(self)
        src = self.source.splitlines()
        hit = next((i for i, line in enumerate(src) if contains in line), None)
        if hit is None:
            return f"{self.target}: the installed vLLM {self.version} has no line containing {contains!r}"
        return "\n".join(src[max(0, hit - before):hit + after + 1])


@functools.cache
def vllm_source(target: str) -> SourceView:
    """The source of ``target`` (``"vllm.v1.worker.utils:select_common_block_size"``; after the colon a dotted
    attribute path, e.g. ``"...rocm_aiter_mla:AiterMLABackend.get_supported_kernel_block_sizes"``) in the installed
    vLLM. Never raises for a missing vLLM or object: the view says why there is no source."""
    if ":" not in target or not target.startswith("vllm"):
        raise ValueError(f"target is {target!r}; it must look like 'vllm.module.path:Name' (or 'vllm.module.path:')")
    from workbench.blocksize import vllm_python

    python, reason = vllm_python()
    if python is None:
        return SourceView(target, None, None, f"not shown: no vLLM is installed here ({reason})")
    try:
        res = subprocess.run([python, "-c", _SCRIPT, target], capture_output=True, text=True, timeout=300, check=False)
        answer = json.loads(res.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as exc:
        return SourceView(target, None, None, f"not shown: the vLLM Python ({python}) did not answer ({exc})")
    if "error" in answer:
        return SourceView(target, None, None, f"not in the installed vLLM: {answer['error']}")
    where = answer["file"] or "?"
    cut = where.rfind("/vllm/")
    where = (where[cut + 1:] if cut >= 0 else where) + f":{answer['line']}"
    return SourceView(target, answer["source"], answer["version"], where)
