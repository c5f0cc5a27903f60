"""The installed vLLM's own code, shown beside the workbench's model of it.

The book explains vLLM functions (``select_common_block_size``, a backend's ``get_supported_kernel_block_sizes``, the
AITER MLA metadata builder's decode path, the expansion kernel); :func:`vllm_source` fetches the source of the
installed vLLM's object with ``inspect.getsource``, in the Python that imports vLLM (this one, or the separate
environment ``scripts/vllm_env.sh`` makes), so the chapter shows the real code of the version installed and nothing
of vLLM is copied into this repository. Where no vLLM is installed it says so in one line.

:func:`ask_vllm` runs the installed vLLM's own functions on the workbench's cases, for the fidelity tests
(``tests/test_upstream_fidelity.py``) and the chapter "Since the PR": the AITER MLA backend's
``_expand_page_indices_kernel`` (under the Triton interpreter on CPU), its metadata builder's ``_build_decode``
and the output buffer of its ``_forward_mqa`` (with a recording stand-in for ``aiter``, which does not import
without ROCm), ``max_decode_query_len`` and ``_segmented_mla_page_size``. The answers are plain JSON; the
comparison with the workbench's models (:mod:`workbench.since_pr`, :mod:`workbench.expand`) happens in the caller.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess

__all__ = ["OPS", "SourceView", "ask_vllm", "vllm_source", "vllm_sources"]

AITER_MLA = "vllm.v1.attention.backends.mla.rocm_aiter_mla"  # the module whose functions ask_vllm runs

_SCRIPT = r"""
import importlib, inspect, json, sys
out = []
for target in sys.argv[1:]:
    mod, _, attr = target.partition(":")
    try:
        import vllm
        obj = importlib.import_module(mod)
        for part in attr.split(".") if attr else []:
            obj = getattr(obj, part)
        out.append({"version": vllm.__version__, "file": inspect.getsourcefile(obj),
                    "line": inspect.getsourcelines(obj)[1], "source": inspect.getsource(obj)})
    except Exception as exc:
        out.append({"error": f"{type(exc).__name__}: {exc}"})
print(json.dumps(out))
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


_SOURCES: dict[str, SourceView] = {}


def vllm_source(target: str) -> SourceView:
    """The source of ``target`` (``"vllm.v1.worker.utils:select_common_block_size"``; after the colon a dotted
    attribute path, e.g. ``"...rocm_aiter_mla:AiterMLABackend.get_supported_kernel_block_sizes"``) in the installed
    vLLM. Never raises for a missing vLLM or object: the view says why there is no source. Cached per target;
    :func:`vllm_sources` fetches several in one subprocess."""
    return vllm_sources([target])[target]


def vllm_sources(targets: list[str]) -> dict[str, SourceView]:
    """:func:`vllm_source` for several targets, the ones not cached yet fetched in one subprocess (importing vLLM
    takes seconds: a chapter that shows several of its functions asks for them together)."""
    for target in targets:
        if ":" not in target or not target.startswith("vllm"):
            raise ValueError(f"target is {target!r}; it must look like 'vllm.module.path:Name' "
                             "(or 'vllm.module.path:')")
    todo = [t for t in dict.fromkeys(targets) if t not in _SOURCES]
    if todo:
        _SOURCES.update(_fetch_sources(todo))
    return {t: _SOURCES[t] for t in targets}


def _fetch_sources(targets: list[str]) -> dict[str, SourceView]:
    from workbench.blocksize import vllm_python

    python, reason = vllm_python()
    if python is None:
        return {t: SourceView(t, None, None, f"not shown: no vLLM is installed here ({reason})") for t in targets}
    try:
        res = subprocess.run([python, "-c", _SCRIPT, *targets], capture_output=True, text=True, timeout=300,
                             check=False)
        answers = json.loads(res.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as exc:
        return {t: SourceView(t, None, None, f"not shown: the vLLM Python ({python}) did not answer ({exc})")
                for t in targets}
    out = {}
    for target, answer in zip(targets, answers):
        if "error" in answer:
            out[target] = SourceView(target, None, None, f"not in the installed vLLM: {answer['error']}")
            continue
        where = answer["file"] or "?"
        cut = where.rfind("/vllm/")
        where = (where[cut + 1:] if cut >= 0 else where) + f":{answer['line']}"
        out[target] = SourceView(target, answer["source"], answer["version"], where)
    return out


# ================================================================================================
# Running the installed vLLM's own functions (in the Python that imports it)
# ================================================================================================

OPS = ("expand", "decode", "mtp_qlen", "subpage", "about")


def ask_vllm(requests: list[dict], timeout: float = 600.0) -> list[dict]:
    """Answer ``requests`` with the installed vLLM's own functions, in one subprocess under the Python that
    imports vLLM (``.venv-vllm``; :func:`workbench.blocksize.vllm_python`). One request per dict, ``"op"`` one of
    :data:`OPS`:

    * ``{"op": "expand", "block_table": [[...]], "seq_lens": [...], "K": 16, "row_stride": None}``: vLLM's
      ``_expand_page_indices_kernel`` launched as its builder launches it (grid ``(num_reqs, num_chunks)``,
      ``BLOCK_SIZE=1024``), into a buffer pre-filled with -7; the block table is a view into a wider one when
      ``row_stride`` is given. Answer: ``{"kv_indices": [...], "tail": [...]}`` (the buffer past the total).
    * ``{"op": "decode", "qo_lens": [...], "seq_lens": [...], "num_decode_tokens": int, "num_heads": 16,
      "mtp_qlen": 4, "kv_cache_dtype": "auto", "causal": true, "full_cudagraph": false, "K": 16,
      "block_table": [[...]]}``: ``AiterMLAMetadataBuilder._build_decode`` on a stand-in builder carrying
      exactly the attributes it reads, then ``AiterMLAImpl._forward_mqa`` with a recording ``mla_decode_fwd``
      and an output allocator that fills NaN. Answer: ``has_persistent_metadata``, ``max_qo_len``,
      ``seq_lens``, ``qo_indptr``, ``paged_kv_indptr``, ``kv_indices``, the ``get_mla_metadata_v1`` keywords,
      ``output_zero_filled``.
    * ``{"op": "mtp_qlen", "num_speculative_tokens": k, "parallel_drafting": false}``: ``max_decode_query_len``.
    * ``{"op": "subpage", "block_sizes": [...]}``: ``_segmented_mla_page_size`` of each.
    * ``{"op": "about"}``: the vLLM version, where ``select_common_block_size`` lives, the AITER builder's
      ``query_len_support``.

    Raises:
        RuntimeError: no vLLM environment (the message says why) or the subprocess failed.
    """
    from workbench.blocksize.oracle import run_in_vllm

    bad = [r.get("op") for r in requests if r.get("op") not in OPS]
    if bad:
        raise ValueError(f"requests hold ops {bad}; each request's 'op' must be one of {OPS}")
    # vLLM replaces Triton by stubs when it finds no active GPU driver, unless the visible-device list is empty
    # (its rule for a distributed worker whose devices come later): an empty list keeps the real triton.jit,
    # which then runs vLLM's kernels in the interpreter (TRITON_INTERPRET=1, set by `import workbench`).
    return run_in_vllm(["workbench.upstream"], requests, timeout=timeout, extra_env={"CUDA_VISIBLE_DEVICES": ""})


def _serve() -> None:  # pragma: no cover - runs in the vLLM environment
    import json as _json
    import sys
    import types

    import workbench  # noqa: F401  (sets TRITON_INTERPRET=1 on a machine without a GPU, before vLLM's kernels)
    from workbench.blocksize.oracle import answer

    requests = _json.loads(sys.stdin.read())
    fake = types.ModuleType("aiter")
    fake.calls = []

    def get_mla_metadata_v1(*args, **kwargs):
        fake.calls.append({"num_heads": int(args[3]), "is_causal": bool(args[5]),
                           **{k: (v if isinstance(v, (int, bool, float)) or v is None else str(v))
                              for k, v in kwargs.items()}})

    fake.get_mla_metadata_v1 = get_mla_metadata_v1
    fake.dtypes = types.SimpleNamespace(bf16="bf16", fp16="fp16", fp8="fp8")
    # vLLM looks for a real aiter (importlib's find_spec) while its modules import, so the stand-in goes in
    # only afterwards, for the builder's lazy `from aiter import get_mla_metadata_v1`.
    importlib.import_module(AITER_MLA)
    sys.modules.setdefault("aiter", fake)
    answers = []
    for req in requests:
        try:
            answers.append(_OP_HANDLERS[req["op"]](req, fake))
        except Exception as exc:  # noqa: BLE001 - the answer is the error
            answers.append({"error": f"{type(exc).__name__}: {exc}"[:500]})
    answer(answers)


def _op_about(req, fake):  # pragma: no cover - runs in the vLLM environment
    import inspect

    import vllm
    from vllm.v1.worker.utils import select_common_block_size

    from typing import get_args

    from vllm.config.speculative import MTPModelTypes, SpeculativeMethod

    def names(t):
        return [x for a in get_args(t) for x in (names(a) if get_args(a) else [a])]

    m = importlib.import_module(AITER_MLA)
    return {"version": vllm.__version__, "select_common_block_size": inspect.getsourcefile(select_common_block_size),
            "speculative_methods": names(SpeculativeMethod), "mtp_methods": names(MTPModelTypes),
            "query_len_support": m.AiterMLAMetadataBuilder.query_len_support.name,
            "expand_kernel_args": list(m._expand_page_indices_kernel.arg_names)}


def _op_expand(req, fake):  # pragma: no cover - runs in the vLLM environment
    import torch

    m = importlib.import_module(AITER_MLA)
    rows = req["block_table"]
    width = max(1, max((len(r) for r in rows), default=1))
    stride = req.get("row_stride") or width
    wide = torch.full((len(rows), stride), -3, dtype=torch.int32)
    for i, r in enumerate(rows):
        wide[i, :len(r)] = torch.tensor(r, dtype=torch.int32)
    bt = wide[:, :width]
    seq_lens = torch.tensor(req["seq_lens"], dtype=torch.int32)
    cu = torch.zeros(len(rows) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(seq_lens, 0)
    total = int(cu[-1])
    out = torch.full((total + 64,), -7, dtype=torch.int32)
    K = int(req["K"])
    num_chunks = max(1, -(-bt.shape[1] * K // 1024))
    if len(rows):
        m._expand_page_indices_kernel[(len(rows), num_chunks)](
            out, bt, bt.stride(0), bt.stride(1), cu, seq_lens, KERNEL_BLOCK_SIZE=K, BLOCK_SIZE=1024,
            CLAMP_TAIL=False)
    return {"kv_indices": out[:total].tolist(), "tail": out[total:].tolist(), "num_chunks": num_chunks}


def _op_mtp_qlen(req, fake):  # pragma: no cover - runs in the vLLM environment
    from types import SimpleNamespace

    from vllm.v1.attention.backend import max_decode_query_len

    spec = SimpleNamespace(num_speculative_tokens=req["num_speculative_tokens"],
                           parallel_drafting=bool(req.get("parallel_drafting", False)))
    cfg = SimpleNamespace(speculative_config=spec if req["num_speculative_tokens"] else None,
                          use_v2_model_runner=False)
    return {"max_decode_query_len": int(max_decode_query_len(cfg))}


def _op_subpage(req, fake):  # pragma: no cover - runs in the vLLM environment
    m = importlib.import_module(AITER_MLA)
    return {"sizes": [int(m._segmented_mla_page_size(b)) for b in req["block_sizes"]]}


class _NanEmpty:  # pragma: no cover - runs in the vLLM environment
    """Stands in for the ``torch`` module inside the AITER MLA module: ``empty`` returns NaN-filled floats, so a
    buffer the code zero-fills is told apart from one it leaves uninitialised."""

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def empty(self, *args, **kwargs):
        t = self._torch.empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t


def _op_decode(req, fake):  # pragma: no cover - runs in the vLLM environment
    from types import SimpleNamespace

    import torch

    m = importlib.import_module(AITER_MLA)
    B = m.AiterMLAMetadataBuilder
    qo_lens, seq_lens = req["qo_lens"], req["seq_lens"]
    n, K = len(qo_lens), int(req["K"])
    full = bool(req["full_cudagraph"])
    heads = int(req["num_heads"])
    max_reqs, max_pages = n + 4, sum(seq_lens) + 64 * (n + 4) + 4096
    bt = torch.tensor(req["block_table"], dtype=torch.int32)
    kv = req["kv_cache_dtype"]
    builder = SimpleNamespace(
        _decode_causal=bool(req["causal"]), device=torch.device("cpu"), _varlen_decode_qlen=0,
        _uniform_padded_mtp_qo_len=B._uniform_padded_mtp_qo_len, dcp_world_size=1, dcp_rank=0,
        _graph_seq_lens=torch.zeros(max_reqs, dtype=torch.int32) if full else None,
        paged_kv_last_page_len=torch.ones(max_reqs, dtype=torch.int32), _decode_num_heads=heads,
        _kv_cache_dtype_str=kv, _kv_cache_bytes=None,
        compilation_config=SimpleNamespace(cudagraph_mode=SimpleNamespace(has_full_cudagraphs=lambda: full)),
        _supports_segmented_dcp_verify=False, _use_triton_dcp_verify=False, _asm_dcp_verify=False,
        _asm_dcp_verify_heads=0, paged_kv_indices=torch.full((max_pages,), -5, dtype=torch.int32),
        kernel_block_size=K, paged_kv_indptr=torch.zeros(max_reqs + 1, dtype=torch.int32),
        qo_indptr=torch.zeros(max_reqs + 1, dtype=torch.int32), _g_kv_indptr_buf=None,
        _mtp_decode_qlen=int(req["mtp_qlen"]), _mla_q_dtype="fp8" if kv == "fp8" else "bf16",
        _mla_kv_dtype="fp8" if kv == "fp8" else "bf16", _mla_max_split_per_batch=0,
        decode_attn_out_dtype=torch.float32,
        **{f"_mla_{name}": torch.zeros(4, dtype=torch.int32) for name in (
            "work_meta_data", "work_info_set", "work_indptr", "reduce_indptr", "reduce_final_map",
            "reduce_partial_map")})
    qsl = torch.zeros(n + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(qo_lens, dtype=torch.int32), 0)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    fake.calls.clear()
    md = B._build_decode(builder, bt, seq, int(max(seq_lens)), qsl, qsl.clone(), int(req["num_decode_tokens"]),
                         int(max(qo_lens)), None)
    kv_indptr = md.paged_kv_indptr.tolist()
    # The output buffer of the decode call: zero-filled or left as allocated (NaN here)?
    seen = {}

    def mla_decode_fwd(q, kv_buffer, o, scale, qo_indptr, max_qo_len, *args, **kwargs):
        seen["zero_filled"] = not bool(torch.isnan(o).any())
        seen["max_seqlen_q"] = int(max_qo_len)

    impl = SimpleNamespace(kv_lora_rank=512, qk_rope_head_dim=64, _decode_num_heads=heads, scale=0.1,
                           dcp_world_size=1, kv_cache_dtype=kv)
    attn = SimpleNamespace(decode=md, causal=bool(req["causal"]), work_meta_data=None)
    q = torch.zeros(int(req["num_decode_tokens"]), heads, 576)
    cache = torch.zeros(max(1, bt.numel()) * K + K, 1, 576)
    saved_torch, saved_ops = m.torch, m.rocm_aiter_ops
    m.torch, m.rocm_aiter_ops = _NanEmpty(torch), SimpleNamespace(mla_decode_fwd=mla_decode_fwd)
    try:
        m.AiterMLAImpl._forward_mqa(impl, q, cache, attn, SimpleNamespace(_q_scale=None, _k_scale=None))
    finally:
        m.torch, m.rocm_aiter_ops = saved_torch, saved_ops
    return {"has_persistent_metadata": bool(md.has_persistent_metadata), "max_qo_len": int(md.max_qo_len),
            "seq_lens": md.seq_lens.tolist(), "qo_indptr": md.qo_indptr.tolist(), "paged_kv_indptr": kv_indptr,
            "kv_indices": md.paged_kv_indices[:kv_indptr[-1]].tolist(),
            "metadata_call": fake.calls[-1] if fake.calls else None, "output_zero_filled": seen.get("zero_filled"),
            "kernel_max_seqlen_q": seen.get("max_seqlen_q")}


_OP_HANDLERS = {"expand": _op_expand, "decode": _op_decode, "mtp_qlen": _op_mtp_qlen, "subpage": _op_subpage,
                "about": _op_about}

if __name__ == "__main__":  # pragma: no cover - `python -m workbench.upstream` in the vLLM environment
    _serve()
