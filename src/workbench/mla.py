"""MLA decode over flat per-token indices: golden reference, Triton kernel, aiter adapter, backend choice.

Absorbed MLA (DeepSeek-V2/V3, Kimi-K2): the KV cache holds one row of ``D = 576`` values per token,
a 512-value latent ``c`` plus 64 rotary values ``k_rope``. After the key/value up-projections are
absorbed into the query and the output projection, every head attends over the *same* rows:

* ``K = row[:, :576]`` (latent and rope together), ``V = row[:, :512]`` (the latent alone);
* ``q`` is ``(total_q, H, 576)``, the output ``(total_q, H, 512)``;
* ``out[t, h] = softmax(q[t, h] . K^T * sm_scale) V`` over the request's keys, with, for a request
  of ``s_q`` query tokens and ``s_k`` keys, query ``i`` seeing keys ``0 .. s_k - s_q + i``
  (a bottom-right-aligned causal mask: the query tokens are the last ``s_q`` tokens of the cache);
* ``lse[t, h] = log(sum(exp(scores)))`` (natural log, scores already scaled).

The cache is addressed with page size 1 (aiter's convention; vLLM passes ``kv_cache.view(-1, 1, 1, 576)``):
``kv_indices[kv_indptr[b] : kv_indptr[b+1]]`` are the cache rows of request ``b`` in token order.

Rules every entry point applies (and explains when broken):

* a request with query tokens needs at least as many keys as query tokens (``kv_len >= qo_len``:
  the query tokens are already in the cache). A 0-length KV with a query is an error, never a
  silent zero or NaN; a request with ``qo_len == 0`` contributes nothing and may have any ``kv_len``;
* ``q`` is contiguous, its last dim equals the cache row width; the Triton kernel and aiter need 576.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from workbench import device

__all__ = [
    "KV_LORA_RANK",
    "QK_HEAD_DIM",
    "QK_ROPE_HEAD_DIM",
    "MAX_QLEN",
    "mla_decode_ref",
    "mla_decode_paged_ref",
]

KV_LORA_RANK = 512  # latent width: V is the first 512 values of a cache row
QK_ROPE_HEAD_DIM = 64  # rotary part appended to the latent
QK_HEAD_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576: K's width and one cache row
MAX_QLEN = 16  # longest query per request that the decode path accepts (speculative verify k+1 <= 16)


# ----------------------------------------------------------------------------------------------
# Input checks (shared by every backend)
# ----------------------------------------------------------------------------------------------


def _flat_cache(kv_cache: torch.Tensor) -> torch.Tensor:
    """``[num_rows, D]`` view of a cache given as ``[num_rows, D]`` or the 4-D ``[num_rows, 1, 1, D]``."""
    if kv_cache.dim() == 2:
        return kv_cache
    if kv_cache.dim() == 4 and kv_cache.shape[1] == 1 and kv_cache.shape[2] == 1:
        return kv_cache.view(kv_cache.shape[0], kv_cache.shape[3])
    raise ValueError(
        f"kv_cache has shape {tuple(kv_cache.shape)}; expected [num_rows, D] or the page_size-1 view "
        "[num_rows, 1, 1, D] (vLLM passes kv_cache.view(-1, 1, 1, 576)). A paged cache [num_blocks, "
        "page_size, 1, D] must be flattened first: kv_cache.view(-1, 1, 1, D) with per-token kv_indices."
    )


def _check_indptr(name: str, indptr: torch.Tensor, total: int, total_name: str) -> list[int]:
    if indptr.dim() != 1 or indptr.numel() < 1:
        raise ValueError(f"{name} must be a 1-D tensor of num_reqs + 1 offsets, got shape {tuple(indptr.shape)}")
    if indptr.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} has dtype {indptr.dtype}; expected torch.int32 (aiter) or torch.int64")
    values = indptr.tolist()
    if values[0] != 0:
        raise ValueError(f"{name}[0] is {values[0]}; cumulative offsets must start at 0")
    if any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"{name} = {values[:8]}... is not non-decreasing; it holds cumulative lengths")
    if values[-1] != total:
        raise ValueError(f"{name}[-1] is {values[-1]} but {total_name} is {total}; the last offset must equal it")
    return values


def _check_common(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                  kv_indices: torch.Tensor, kv_lora_rank: int) -> tuple[torch.Tensor, list[int], list[int]]:
    """Validate shapes, dtypes, devices and offsets; return the flat cache and the host offsets."""
    cache = _flat_cache(kv_cache)
    if q.dim() != 3:
        raise ValueError(f"q has shape {tuple(q.shape)}; expected (total_q, num_heads, {QK_HEAD_DIM})")
    if q.shape[-1] != cache.shape[-1]:
        raise ValueError(
            f"q's head dim is {q.shape[-1]} but a kv_cache row has {cache.shape[-1]} values; they must match "
            f"(absorbed MLA: {KV_LORA_RANK} latent + {QK_ROPE_HEAD_DIM} rope = {QK_HEAD_DIM})"
        )
    if not 0 < kv_lora_rank <= cache.shape[-1]:
        raise ValueError(f"kv_lora_rank is {kv_lora_rank}; it must be in 1..{cache.shape[-1]} (V = first kv_lora_rank dims)")
    if not q.is_contiguous():
        raise ValueError("q is not contiguous; aiter and the Triton kernel need a contiguous "
                         "(total_q, H, 576) tensor: pass q.contiguous()")
    for name, t in (("kv_cache", cache), ("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; move both to one device")
    if kv_indices.dim() != 1:
        raise ValueError(f"kv_indices must be 1-D (one cache row per token), got shape {tuple(kv_indices.shape)}")
    if kv_indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"kv_indices has dtype {kv_indices.dtype}; expected torch.int32")
    qo = _check_indptr("qo_indptr", qo_indptr, q.shape[0], "total_q = q.shape[0]")
    kv = _check_indptr("kv_indptr", kv_indptr, kv_indices.numel(), "kv_indices.numel()")
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
    if kv_indices.numel():
        lo, hi = int(kv_indices.min()), int(kv_indices.max())
        if lo < 0 or hi >= cache.shape[0]:
            raise ValueError(f"kv_indices range over [{lo}, {hi}] but kv_cache has {cache.shape[0]} rows; "
                             "indices are token rows of the page_size-1 view, 0 .. num_rows-1")
    return cache, qo, kv


# ----------------------------------------------------------------------------------------------
# Golden references
# ----------------------------------------------------------------------------------------------


def default_sm_scale(head_dim: int = QK_HEAD_DIM) -> float:
    """aiter's default softmax scale, ``1/sqrt(576)``. DeepSeek's real models use a different one
    (the scale of the un-absorbed 192-dim q/k head, with a YaRN factor), passed as ``sm_scale``."""
    return 1.0 / math.sqrt(head_dim)


def mla_decode_ref(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                   kv_indices: torch.Tensor, sm_scale: float | None = None,
                   kv_lora_rank: int = KV_LORA_RANK) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 golden MLA decode with aiter's semantics (the spec every backend is checked against).

    Args:
        q: ``(total_q, H, D)`` any float dtype, contiguous; ``D`` = cache row width (576).
        kv_cache: ``[num_rows, D]`` or the page_size-1 view ``[num_rows, 1, 1, D]``.
        qo_indptr: ``(num_reqs + 1,) int32``, cumulative query lengths.
        kv_indptr: ``(num_reqs + 1,) int32``, cumulative KV lengths in tokens.
        kv_indices: ``(kv_indptr[-1],) int32``, cache rows of each request, in token order.
        sm_scale: softmax scale; ``None`` means ``1/sqrt(D)``.
        kv_lora_rank: V's width: the first ``kv_lora_rank`` values of a row (512).

    Returns:
        ``out`` ``(total_q, H, kv_lora_rank) float32`` and ``lse`` ``(total_q, H) float32`` (natural log).
    """
    cache, qo, kv = _check_common(q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_lora_rank)
    scale = default_sm_scale(cache.shape[-1]) if sm_scale is None else float(sm_scale)
    total_q, heads, _ = q.shape
    out = torch.zeros(total_q, heads, kv_lora_rank, dtype=torch.float32, device=q.device)
    lse = torch.zeros(total_q, heads, dtype=torch.float32, device=q.device)
    for b in range(len(qo) - 1):
        s_q, s_k = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        if s_q == 0:
            continue
        rows = cache[kv_indices[kv[b]:kv[b + 1]].long()].float()  # (s_k, D): gather by token index
        qb = q[qo[b]:qo[b + 1]].float()  # (s_q, H, D)
        scores = torch.einsum("qhd,kd->qhk", qb, rows) * scale  # (s_q, H, s_k)
        # bottom-right causal: query i sees keys 0 .. s_k - s_q + i
        limit = torch.arange(s_q, device=q.device) + (s_k - s_q)  # (s_q,)
        masked = torch.arange(s_k, device=q.device)[None, :] > limit[:, None]  # (s_q, s_k)
        scores = scores.masked_fill(masked[:, None, :], float("-inf"))
        lse[qo[b]:qo[b + 1]] = torch.logsumexp(scores, dim=-1)
        out[qo[b]:qo[b + 1]] = torch.einsum("qhk,kd->qhd", torch.softmax(scores, dim=-1), rows[:, :kv_lora_rank])
    return out, lse


def mla_decode_paged_ref(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor,
                         block_table: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float | None = None,
                         kv_lora_rank: int = KV_LORA_RANK) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 golden over a *paged* cache, addressed through a block table (no flat indices involved).

    Token ``t`` of request ``b`` lives at ``kv_cache[block_table[b, t // page_size], t % page_size]``.

    Args:
        q: ``(total_q, H, D)``.
        kv_cache: ``[num_blocks, page_size, D]`` or ``[num_blocks, page_size, 1, D]``.
        qo_indptr: ``(num_reqs + 1,) int32``.
        block_table: ``(num_reqs, max_blocks) int32``; entries past a request's last block are ignored.
        seq_lens: ``(num_reqs,) int32`` KV lengths in tokens.

    Returns:
        ``out`` ``(total_q, H, kv_lora_rank) float32`` and ``lse`` ``(total_q, H) float32``.
    """
    if kv_cache.dim() == 4:
        if kv_cache.shape[2] != 1:
            raise ValueError(f"kv_cache has shape {tuple(kv_cache.shape)}; expected [num_blocks, page_size, 1, D]")
        kv_cache = kv_cache.view(kv_cache.shape[0], kv_cache.shape[1], kv_cache.shape[3])
    if kv_cache.dim() != 3:
        raise ValueError(f"kv_cache has shape {tuple(kv_cache.shape)}; expected [num_blocks, page_size, D]")
    if block_table.dim() != 2 or seq_lens.dim() != 1 or block_table.shape[0] != seq_lens.numel():
        raise ValueError(f"block_table {tuple(block_table.shape)} and seq_lens {tuple(seq_lens.shape)} must be "
                         "(num_reqs, max_blocks) and (num_reqs,)")
    page_size = kv_cache.shape[1]
    lens = seq_lens.tolist()
    need = max([-(-n // page_size) for n in lens], default=0)
    if need > block_table.shape[1]:
        raise ValueError(f"seq_lens need up to {need} blocks of {page_size} tokens but block_table has "
                         f"{block_table.shape[1]} columns")
    # Gather each request's tokens block by block (a loop a reader can check by eye).
    rows, kv_offsets = [], [0]
    for b, n in enumerate(lens):
        t = torch.arange(n, device=kv_cache.device)
        rows.append(kv_cache[block_table[b, t // page_size].long(), t % page_size])  # (n, D)
        kv_offsets.append(kv_offsets[-1] + n)
    width = kv_cache.shape[-1]
    gathered = torch.cat(rows) if rows else kv_cache.new_zeros(0, width)
    kv_indptr = torch.tensor(kv_offsets, dtype=torch.int32, device=q.device)
    kv_indices = torch.arange(gathered.shape[0], dtype=torch.int32, device=q.device)
    return mla_decode_ref(q, gathered, qo_indptr, kv_indptr, kv_indices, sm_scale, kv_lora_rank)
