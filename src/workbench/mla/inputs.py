"""MLA's dimensions and the input rules every decode backend applies, each error naming the argument and the rule.

Rules (explained when broken):

* ``q`` is ``(total_q, H, 576)``; a cache row has the same width (512 latent values + 64 rope values);
* ``qo_indptr`` and ``kv_indptr`` are ``(num_reqs + 1,)`` cumulative offsets from 0, never decreasing;
* a request with query tokens needs at least as many keys (``kv_len >= qo_len``: its query tokens are the last
  ``qo_len`` tokens of its cache); a request with ``qo_len == 0`` contributes nothing and may have any ``kv_len``;
* ``kv_indices[kv_indptr[b] : kv_indptr[b+1]]`` are rows ``0 .. num_rows - 1`` of the page_size-1 cache view.
"""

from __future__ import annotations

import torch

from workbench import device

__all__ = ["KV_LORA_RANK", "MAX_QLEN", "QK_HEAD_DIM", "QK_ROPE_HEAD_DIM", "check_indptr", "check_kernel_args",
           "check_max_qo_len", "check_values", "flat_cache"]

KV_LORA_RANK = 512  # latent width: V is the first 512 values of a cache row
QK_ROPE_HEAD_DIM = 64  # rotary part appended to the latent
QK_HEAD_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576: K's width and one cache row
MAX_QLEN = 16  # longest query per request that the decode path accepts (speculative verify k+1 <= 16)


def flat_cache(kv_cache: torch.Tensor) -> torch.Tensor:
    """``[num_rows, D]`` view of a cache given as ``[num_rows, D]`` or the 4-D ``[num_rows, 1, 1, D]`` (any row
    stride: the kernels take it as an argument)."""
    if not isinstance(kv_cache, torch.Tensor):
        raise TypeError(f"kv_cache must be a torch.Tensor, got {type(kv_cache).__name__}")
    if kv_cache.dim() == 2:
        return kv_cache
    if kv_cache.dim() == 4 and kv_cache.shape[1] == 1 and kv_cache.shape[2] == 1:
        return kv_cache[:, 0, 0, :]
    raise ValueError(
        f"kv_cache has shape {tuple(kv_cache.shape)}; expected [num_rows, D] or the page_size-1 view "
        "[num_rows, 1, 1, D] (vLLM passes kv_cache.view(-1, 1, 1, 576)). A paged cache [num_blocks, "
        "page_size, 1, D] must be flattened first: kv_cache.view(-1, 1, 1, D) with per-token kv_indices."
    )


def check_indptr(name: str, indptr: torch.Tensor, total: int | None = None, total_name: str = "") -> list[int]:
    """Validate a ``(num_reqs + 1,)`` cumulative-offset tensor (``qo_indptr``, ``kv_indptr``); return it as a list.

    Rules: a 1-D int32/int64 tensor, starting at 0, never decreasing, and (when ``total`` is given) ending at
    ``total``. Each violation raises an error that names ``name``, the value and the rule. Reads the values on
    the host: a validation step, not for a hot path.
    """
    if not isinstance(indptr, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of cumulative offsets, got {type(indptr).__name__}")
    if indptr.dim() != 1 or indptr.numel() < 1:
        raise ValueError(f"{name} must be a 1-D tensor of num_reqs + 1 offsets, got shape {tuple(indptr.shape)}")
    if indptr.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} has dtype {indptr.dtype}; expected torch.int32 (aiter) or torch.int64")
    values = indptr.tolist()
    if values[0] != 0:
        raise ValueError(f"{name}[0] is {values[0]}; cumulative offsets must start at 0")
    if any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"{name} = {values[:8]}... is not non-decreasing; it holds cumulative lengths")
    if total is not None and values[-1] != total:
        raise ValueError(f"{name}[-1] is {values[-1]} but {total_name} is {total}; the last offset must equal it")
    return values


def check_values(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                 kv_indices: torch.Tensor, kv_lora_rank: int) -> tuple[torch.Tensor, list[int], list[int]]:
    """Validate shapes, dtypes, devices and offsets (reads them on the host); return the flat cache and the host
    offsets ``(cache, qo, kv)``."""
    cache = flat_cache(kv_cache)
    if q.dim() != 3:
        raise ValueError(f"q has shape {tuple(q.shape)}; expected (total_q, num_heads, {QK_HEAD_DIM})")
    if q.shape[-1] != cache.shape[-1]:
        raise ValueError(
            f"q's head dim is {q.shape[-1]} but a kv_cache row has {cache.shape[-1]} values; they must match "
            f"(absorbed MLA: {KV_LORA_RANK} latent + {QK_ROPE_HEAD_DIM} rope = {QK_HEAD_DIM})"
        )
    if not 0 < kv_lora_rank <= cache.shape[-1]:
        raise ValueError(f"kv_lora_rank is {kv_lora_rank}; it must be in 1..{cache.shape[-1]} "
                         "(V = the first kv_lora_rank values of a row)")
    if not q.is_contiguous():
        raise ValueError("q is not contiguous; aiter and the Triton kernel need a contiguous "
                         "(total_q, H, 576) tensor: pass q.contiguous()")
    named = (("kv_cache", cache), ("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices))
    for name, t in named:
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; move both to one device")
    if kv_indices.dim() != 1:
        raise ValueError(f"kv_indices must be 1-D (one cache row per token), got shape {tuple(kv_indices.shape)}")
    if kv_indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"kv_indices has dtype {kv_indices.dtype}; expected torch.int32")
    qo = check_indptr("qo_indptr", qo_indptr, q.shape[0], "total_q = q.shape[0]")
    kv = check_indptr("kv_indptr", kv_indptr)
    if kv[-1] > kv_indices.numel():
        raise ValueError(f"kv_indptr[-1] is {kv[-1]} but kv_indices has only {kv_indices.numel()} entries; "
                         "kv_indices must hold at least kv_indptr[-1] token rows")
    if len(qo) != len(kv):
        raise ValueError(f"qo_indptr has {len(qo)} entries and kv_indptr {len(kv)}; both must be num_reqs + 1")
    for b in range(len(qo) - 1):
        s_q, s_k = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        if s_q > 0 and s_k < s_q:
            raise ValueError(
                f"request {b} has qo_len {s_q} but kv_len {s_k}; a request with query tokens needs "
                "kv_len >= qo_len (its query tokens are the last qo_len tokens of its cache). A 0-length KV "
                "with a query has no defined attention output: drop the request or write its KV first"
            )
    used = kv_indices[:kv[-1]]
    if used.numel():
        lo, hi = int(used.min()), int(used.max())
        if lo < 0 or hi >= cache.shape[0]:
            raise ValueError(f"kv_indices range over [{lo}, {hi}] but kv_cache has {cache.shape[0]} rows; "
                             "indices are token rows of the page_size-1 view, 0 .. num_rows-1")
    return cache, qo, kv


def check_max_qo_len(max_qo_len: int) -> None:
    if not isinstance(max_qo_len, int) or isinstance(max_qo_len, bool) or max_qo_len < 1:
        raise ValueError(f"max_qo_len is {max_qo_len!r}; it must be a host-side int >= 1")
    if max_qo_len > MAX_QLEN:
        raise ValueError(f"max_qo_len is {max_qo_len}, above the decode limit of {MAX_QLEN} query tokens per "
                         "request (speculative verification uses k + 1 <= 16); run longer queries as prefill")


def check_kernel_args(q: torch.Tensor, cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                      kv_indices: torch.Tensor, max_qo_len: int, out: torch.Tensor | None = None) -> None:
    """The checks of the kernel entry point that need no device sync (the value checks are :func:`check_values`):
    what the kernels assume of every tensor they are handed (shapes, dtypes, devices, the strides they support)."""
    for name, t in (("q", q), ("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 3 or q.shape[-1] != QK_HEAD_DIM:
        raise ValueError(f"q has shape {tuple(q.shape)}; the Triton kernel needs (total_q, H, {QK_HEAD_DIM}) "
                         f"({KV_LORA_RANK} latent + {QK_ROPE_HEAD_DIM} rope)")
    if cache.shape[-1] != QK_HEAD_DIM or cache.stride(-1) != 1:
        raise ValueError(f"kv_cache rows have {cache.shape[-1]} values (last-dim stride {cache.stride(-1)}); "
                         f"the Triton kernel needs contiguous rows of {QK_HEAD_DIM}")
    if not q.is_contiguous():
        raise ValueError("q is not contiguous; pass q.contiguous() (the kernel folds (qlen, H) rows of a "
                         "contiguous (total_q, H, 576) tensor)")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"q has dtype {q.dtype}; the Triton kernel takes float16, bfloat16 or float32")
    if cache.dtype != q.dtype:
        raise TypeError(f"kv_cache has dtype {cache.dtype} but q has {q.dtype}; cast one so that they match")
    device.check_kernel_dtype(q.dtype, "q")
    named = (("kv_cache", cache), ("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices))
    for name, t in named:
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; move both to one device")
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
        if t.dtype != torch.int32:
            raise TypeError(f"{name} has dtype {t.dtype}; the kernel reads int32 (aiter's index type): "
                            ".to(torch.int32)")
        if t.dim() != 1 or (t.numel() > 1 and t.stride(0) != 1):
            raise ValueError(f"{name} must be a contiguous 1-D tensor (the kernel reads element i at offset i), got "
                             f"shape {tuple(t.shape)} with strides {t.stride()}: pass {name}.contiguous()")
    if qo_indptr.shape != kv_indptr.shape:
        raise ValueError(f"qo_indptr {tuple(qo_indptr.shape)} and kv_indptr {tuple(kv_indptr.shape)} must both be "
                         "(num_reqs + 1,)")
    check_max_qo_len(max_qo_len)
    if cache.dim() != 2 or cache.shape[0] > 0 and cache.stride(0) < QK_HEAD_DIM:
        raise ValueError(f"kv_cache rows overlap (row stride {cache.stride(0) if cache.dim() == 2 else '?'} < "
                         f"{QK_HEAD_DIM}); pass [num_rows, {QK_HEAD_DIM}] or [num_rows, 1, 1, {QK_HEAD_DIM}]")
    if out is not None:
        want = (q.shape[0], q.shape[1], KV_LORA_RANK)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != want or out.dtype != q.dtype \
                or out.device != q.device or not out.is_contiguous():
            got = (f"{tuple(out.shape)} {out.dtype} on {out.device}, contiguous={out.is_contiguous()}"
                   if isinstance(out, torch.Tensor) else type(out).__name__)
            raise ValueError(f"out must be a contiguous {want} tensor of q's dtype {q.dtype} on {q.device}, got {got}")
    if q.device.type == "cpu" and not device.interpreter_active():
        raise RuntimeError("the Triton kernel needs a GPU, or the interpreter (TRITON_INTERPRET=1, set by "
                           "`import workbench` on machines without a GPU) for CPU tensors")
