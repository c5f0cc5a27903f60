"""The adapter for aiter's MLA decode (``aiter.mla.mla_decode_fwd``), called the way vLLM's ROCM_AITER_MLA backend
calls it after PR #39616. Runs on ROCm only; here it is tested with a fake module that records its calls.

``mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q, ...)``: from
aiter v0.1.11 on, ``page_size`` and ``nhead_kv`` sit between ``max_seqlen_q`` and ``sm_scale``, so ``sm_scale`` and
everything after it go by keyword. The output is written into ``o``. Persistent scheduling
(``get_mla_metadata_info_v1`` sizes six work buffers, ``get_mla_metadata_v1`` fills them) is used only when every
query length is 1, as vLLM does after the PR (its qlen > 1 metadata path fails inside aiter's kernel heuristics).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch

from workbench import device
from workbench.decode_metadata import DecodeMetadata
from workbench.mla.inputs import KV_LORA_RANK, MAX_QLEN, QK_HEAD_DIM, flat_cache
from workbench.mla.ref import default_sm_scale

__all__ = ["AITER_HEADS", "aiter_unsupported_reasons", "mla_decode_aiter"]

AITER_HEADS = (16, 128)  # head counts aiter's bf16/fp16 MLA decode kernels run natively


def _import_aiter() -> Any:
    status = device.aiter_status()
    if not status.available:
        raise RuntimeError(f"backend='aiter' is unavailable here: {status.reason}. Use backend='triton' or 'torch'.")
    import aiter  # noqa: PLC0415 - guarded: raises RuntimeError without ROCm
    import aiter.mla  # noqa: F401, PLC0415

    return aiter


def _uniform_qlen(qo_indptr: torch.Tensor, max_qo_len: int, who: str) -> int:
    """The common query length of all requests, or a ValueError naming the rule (reads qo_indptr)."""
    lens = (qo_indptr[1:] - qo_indptr[:-1]).tolist()
    if any(n != max_qo_len for n in lens):
        raise ValueError(
            f"{who} needs every request to have the same query length (max_seqlen_q); got query lengths "
            f"{lens[:8]}{'...' if len(lens) > 8 else ''} with max_qo_len {max_qo_len}. Pad the queries to one "
            "length, split the batch by query length, or use backend='triton' (any lengths)"
        )
    return max_qo_len


def aiter_unsupported_reasons(q: torch.Tensor, kv_cache: torch.Tensor, metadata: DecodeMetadata) -> list[str]:
    """Why aiter's MLA decode cannot take this call (empty list: it can). Reads qo_indptr on the host."""
    reasons = []
    if q.dim() != 3 or q.shape[-1] != QK_HEAD_DIM:
        reasons.append(f"q shape {tuple(q.shape)} is not (total_q, H, {QK_HEAD_DIM})")
    elif q.shape[1] not in AITER_HEADS:
        reasons.append(f"{q.shape[1]} heads; aiter's kernels run {AITER_HEADS[0]} or {AITER_HEADS[1]} natively")
    if q.dtype not in (torch.bfloat16, torch.float16):
        reasons.append(f"dtype {q.dtype}; aiter takes bfloat16 or float16")
    if kv_cache.dtype != q.dtype:
        reasons.append(f"kv_cache dtype {kv_cache.dtype} differs from q dtype {q.dtype}")
    for name in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_lens"):
        t = getattr(metadata, name)
        if t.dim() != 1 or not t.is_contiguous():
            reasons.append(f"metadata.{name} is not a contiguous 1-D tensor (aiter reads it by raw pointer): "
                           f".contiguous() it")
    lens = (metadata.qo_indptr[1:] - metadata.qo_indptr[:-1]).tolist()
    if any(n != metadata.max_qo_len for n in lens):
        reasons.append(f"query lengths {sorted(set(lens))} are not uniform (aiter needs one max_seqlen_q)")
    if metadata.max_qo_len > MAX_QLEN:
        reasons.append(f"max_qo_len {metadata.max_qo_len} > {MAX_QLEN}")
    return reasons


def mla_decode_aiter(q: torch.Tensor, kv_cache: torch.Tensor, metadata: DecodeMetadata, sm_scale: float | None = None,
                     *, aiter_module: Any = None) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """Call ``aiter.mla.mla_decode_fwd`` the way vLLM's ROCM_AITER_MLA backend does after PR #39616.

    Args:
        q: ``(total_q, H, 576)`` bf16/fp16, contiguous, H in (16, 128).
        kv_cache: ``[num_rows, 576]`` or ``[num_rows, 1, 1, 576]``; handed to aiter as the page_size-1
            view ``[num_rows, 1, 1, 576]``.
        metadata: flat per-token :class:`DecodeMetadata`; every request must have ``max_qo_len`` queries.
        sm_scale: softmax scale (``None``: ``1/sqrt(576)``), passed by keyword.
        aiter_module: the ``aiter`` module to call (tests pass a recording fake); default: import it
            (guarded by :func:`workbench.device.aiter_status`).

    Returns:
        ``(out, lse, persistent)``: ``out`` ``(total_q, H, 512)`` in ``q.dtype``; ``lse`` ``(total_q, H)``
        fp32 when this aiter version returns it (``return_lse``), else ``None``; ``persistent`` True when
        the persistent-scheduling metadata was computed and passed (every query length is 1).
    """
    aiter = aiter_module if aiter_module is not None else _import_aiter()
    reasons = aiter_unsupported_reasons(q, kv_cache, metadata)
    if reasons:
        raise ValueError("backend='aiter' cannot run this call: " + "; ".join(reasons))
    if not q.is_contiguous():
        raise ValueError("q is not contiguous; aiter needs a contiguous (total_q, H, 576) tensor: q.contiguous()")
    qlen = metadata.max_qo_len
    total_q, heads, _ = q.shape
    num_reqs = metadata.num_reqs
    kv_buffer = flat_cache(kv_cache).view(-1, 1, 1, QK_HEAD_DIM)  # page_size-1 view, as vLLM passes it
    o = torch.empty(total_q, heads, KV_LORA_RANK, dtype=q.dtype, device=q.device)
    kwargs: dict[str, Any] = {"sm_scale": default_sm_scale() if sm_scale is None else float(sm_scale)}
    persistent = qlen == 1
    if persistent:
        info = aiter.get_mla_metadata_info_v1(num_reqs, qlen, heads, q.dtype, kv_buffer.dtype,
                                              is_sparse=False, fast_mode=True)
        (work_meta_data, work_indptr, work_info_set, reduce_indptr, reduce_final_map,
         reduce_partial_map) = [torch.empty(size, dtype=dtype, device=q.device) for size, dtype in info]
        # Positional order as vLLM v0.20 calls it: note work_info_set comes before work_indptr here.
        aiter.get_mla_metadata_v1(
            metadata.qo_indptr, metadata.kv_indptr, metadata.kv_last_page_lens, heads, 1, True,
            work_meta_data, work_info_set, work_indptr, reduce_indptr, reduce_final_map, reduce_partial_map,
            page_size=1, kv_granularity=16, max_seqlen_qo=qlen, uni_seqlen_qo=qlen, fast_mode=True,
        )
        kwargs.update(work_meta_data=work_meta_data, work_indptr=work_indptr, work_info_set=work_info_set,
                      reduce_indptr=reduce_indptr, reduce_final_map=reduce_final_map,
                      reduce_partial_map=reduce_partial_map)
    elif qlen & (qlen - 1):
        warnings.warn(f"aiter #2720: the non-persistent MLA decode may return the same output for every query "
                      f"position when max_seqlen_q ({qlen}) is not a power of two (seen under CUDA graphs); "
                      "compare with backend='torch' (chapter 5)", RuntimeWarning, stacklevel=2)
    decode_fwd = aiter.mla.mla_decode_fwd
    try:
        wants_lse = "return_lse" in inspect.signature(decode_fwd).parameters
    except (TypeError, ValueError):  # a compiled callable without a signature
        wants_lse = False
    if wants_lse:
        kwargs["return_lse"] = True
    result = decode_fwd(q, kv_buffer, o, metadata.qo_indptr, metadata.kv_indptr, metadata.kv_indices,
                        metadata.kv_last_page_lens, qlen, **kwargs)
    lse = None
    if wants_lse and isinstance(result, tuple) and len(result) > 1 and isinstance(result[1], torch.Tensor) \
            and tuple(result[1].shape) == (total_q, heads):
        lse = result[1]
    return o, lse, persistent
