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

Contents, in the order chapter 3 introduces them:

* :func:`mla_decode_ref` (fp32 golden) and :func:`mla_decode_paged_ref` (block table + page size);
* :func:`mla_decode_torch`: the same computation batched in the input precision (tolerance baseline,
  benchmark torch path);
* :func:`mla_decode_triton`: the Triton kernel (split-KV, query rows folded into heads, LSE merge),
  :func:`triton_config` and :func:`choose_num_splits` for its launch;
* :func:`mla_decode_aiter`: the adapter for ``aiter.mla.mla_decode_fwd`` (ROCm);
* :func:`mla_decode`: one entry point over ``"auto" | "triton" | "torch" | "aiter"``;
* :func:`demo_page_indices_as_token_indices`: aiter #2996's failure mode, shown with the golden;
* :func:`make_decode_example`: a small paged batch with NaN-filled unused rows, for chapters and checks.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import warnings
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from workbench import device
from workbench.expand import DecodeMetadata, build_flat_decode_metadata

__all__ = [
    "AITER_HEADS",
    "BACKENDS",
    "check_indptr",
    "KV_LORA_RANK",
    "MAX_QLEN",
    "QK_HEAD_DIM",
    "QK_ROPE_HEAD_DIM",
    "DecodeExample",
    "DecodeOutput",
    "GLUON_CONFIG",
    "GLUON_SWAP_CONFIG",
    "PageIndexMistake",
    "TritonConfig",
    "aiter_unsupported_reasons",
    "choose_backend",
    "choose_balanced_programs",
    "choose_num_splits",
    "default_splits",
    "default_sm_scale",
    "gluon_available",
    "gluon_swap_config",
    "demo_page_indices_as_token_indices",
    "make_decode_example",
    "mla_decode",
    "mla_decode_aiter",
    "mla_decode_paged_ref",
    "mla_decode_ref",
    "mla_decode_torch",
    "mla_decode_triton",
    "triton_config",
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


# ----------------------------------------------------------------------------------------------
# A batched torch path in the input precision (the "same-precision" baseline, and the benchmark's
# torch path). One gather of every request's rows padded to the longest, two einsums.
# ----------------------------------------------------------------------------------------------


def mla_decode_torch(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                     kv_indices: torch.Tensor, sm_scale: float | None, max_qo_len: int, max_kv_len: int,
                     kv_lora_rank: int = KV_LORA_RANK) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA decode with plain torch ops in ``q.dtype`` (matmuls in that precision, softmax in fp32).

    Same semantics as :func:`mla_decode_ref`, but batched over requests padded to ``max_qo_len``
    queries and ``max_kv_len`` keys (host-side ints, so no device sync), so it runs at GPU speed.
    It serves as the same-precision torch computation of the tolerance rule and as the torch path of
    the benchmark. No input checks: call it on inputs :func:`mla_decode_ref` accepts.

    Returns:
        ``out`` ``(total_q, H, kv_lora_rank)`` in ``q.dtype`` and ``lse`` ``(total_q, H) float32``.
    """
    cache = _flat_cache(kv_cache)
    scale = default_sm_scale(cache.shape[-1]) if sm_scale is None else float(sm_scale)
    dev, total_q = q.device, q.shape[0]
    kv_lens = (kv_indptr[1:] - kv_indptr[:-1]).long()  # (B,)
    qo_lens = (qo_indptr[1:] - qo_indptr[:-1]).long()
    pos = torch.arange(max_kv_len, device=dev)
    slot = (kv_indptr[:-1, None].long() + pos).clamp(max=max(kv_indices.numel() - 1, 0))  # (B, Lmax)
    rows = cache[kv_indices[slot].long()]  # (B, Lmax, D), padded slots hold some request's row (masked below)
    qpos = torch.arange(max_qo_len, device=dev)
    qslot = (qo_indptr[:-1, None].long() + qpos).clamp(max=max(total_q - 1, 0))  # (B, Qmax)
    qb = q[qslot]  # (B, Qmax, H, D)
    scores = torch.einsum("bqhd,bkd->bqhk", qb, rows).float() * scale
    limit = kv_lens[:, None] - qo_lens[:, None] + qpos[None, :]  # (B, Qmax) last visible key
    visible = (pos[None, None, :] <= limit[:, :, None]) & (pos[None, None, :] < kv_lens[:, None, None])
    scores = scores.masked_fill(~visible[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (B, Qmax, H)
    p = torch.softmax(scores, dim=-1).nan_to_num_(0.0).to(q.dtype)  # padded query rows are all -inf
    out = torch.einsum("bqhk,bkd->bqhd", p, rows[..., :kv_lora_rank])
    real = qpos[None, :] < qo_lens[:, None]  # (B, Qmax): rows that are real queries, in order
    return out[real], lse[real]


# ----------------------------------------------------------------------------------------------
# The Triton kernel: split-KV over flat token indices, query rows folded into the head dimension
# ----------------------------------------------------------------------------------------------
#
# Napkin math (bf16): every request reads its L cache rows once, 576 * 2 bytes each, whatever the
# head count; it does 2 * H * qlen * L * (576 + 512) FLOPs. Intensity ~1.89 * H * qlen FLOP/byte:
# 16 heads x qlen 1 = 30 (memory-bound), 16 x 8 or 128 x 1 = 242 (compute-bound on an H200).
#
# Design. A request's query block is a contiguous (qlen * H, 576) matrix (q is (total_q, H, 576)),
# so rows r = i * H + h fold the query tokens into the head dimension: qlen 8 with 16 heads is one
# tile of 128 rows over the same keys, the keys read once. Row r sees keys 0 .. s_k - s_q + r // H.
# Grid: (row blocks, KV splits, requests), row blocks fastest so that programs sharing keys run
# together and hit L2. Each program streams BLOCK_N-token tiles of its split; each tile (gathered by
# kv_indices) is used for QK (latent 512 + rope 64, two dots) and for PV (its first 512 dims), with
# an online softmax in base 2. With one split the program writes the final output; otherwise it
# writes fp32 partials plus their LSE and a second small kernel merges the splits by LSE.

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


@triton.jit
def _load_q(q_row, row_ok, D_LATENT: tl.constexpr, D_ROPE: tl.constexpr):
    """The latent (BLOCK_M, 512) and rope (BLOCK_M, 64) parts of the query rows at ``q_row``; 0 where not ``row_ok``."""
    d_lat = tl.arange(0, D_LATENT)
    d_rope = tl.arange(0, D_ROPE)
    q_lat = tl.load(q_row[:, None] + d_lat[None, :], mask=row_ok[:, None], other=0.0)
    q_rope = tl.load(q_row[:, None] + D_LATENT + d_rope[None, :], mask=row_ok[:, None], other=0.0)
    return q_lat, q_rope


@triton.jit
def _prefetch_l2(ptrs):
    """Ask the L2 cache to fetch the line holding each address of ``ptrs`` (a hint: no register is written,
    nothing waits for it). NVIDIA PTX only."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _prefetch_l1(ptrs):
    """Ask for the line holding each address of ``ptrs`` to be fetched into this SM's L1 (a hint, as
    :func:`_prefetch_l2`). NVIDIA PTX only."""
    tl.inline_asm_elementwise("prefetch.global.L1 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _prefetch_rows_l2(rows):
    """Ask L2 for whole 16-bit cache rows starting at ``rows`` (pointers): the nine 128-byte lines of 576 values."""
    _prefetch_l2(rows[:, None] + (tl.arange(0, 8) * 64)[None, :])
    _prefetch_l2(rows + 8 * 64)


@triton.jit
def _prefetch_indices(KV_INDICES, lo, hi, LEVEL: tl.constexpr):
    """Prefetch the lines of ``KV_INDICES[lo:hi]`` (128 bytes = 32 indices each) into L1 (LEVEL 1) or L2
    (LEVEL 2), so that each tile's index load in the loop hits a cache instead of DRAM: that load is on the
    loop's critical path (the next tile's gather waits for it)."""
    for p0 in range(lo, hi, 32 * 256):
        line = p0 + tl.arange(0, 256) * 32
        addr = KV_INDICES + tl.minimum(line, hi - 1)  # never past the range (repeats the last line instead)
        if LEVEL == 1:
            _prefetch_l1(addr)
        else:
            _prefetch_l2(addr)


@triton.jit
def _softmax_tile(q_lat, q_rope, k_lat, k_rope, cols, col_ok, limit, qk_scale, m_i, l_i, acc,
                  DOT_PRECISION: tl.constexpr):
    """One KV tile of the online softmax: scores over 576 dims (latent + rope), the bottom-right causal mask
    (row r sees keys <= limit[r]), base-2 rescaling, and P @ V with V = the tile's first 512 dims."""
    s = tl.dot(q_lat, tl.trans(k_lat), input_precision=DOT_PRECISION)
    s = tl.dot(q_rope, tl.trans(k_rope), s, input_precision=DOT_PRECISION)
    s = s * qk_scale
    visible = col_ok[None, :] & (cols[None, :] <= limit[:, None])
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(k_lat.dtype), k_lat, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _load_q_t(q_row, row_ok, D_LATENT: tl.constexpr, D_ROPE: tl.constexpr):
    """The query rows at ``q_row`` transposed: latent (512, BLOCK_M) and rope (64, BLOCK_M); 0 where not ``row_ok``."""
    d_lat = tl.arange(0, D_LATENT)
    d_rope = tl.arange(0, D_ROPE)
    qt_lat = tl.load(q_row[None, :] + d_lat[:, None], mask=row_ok[None, :], other=0.0)
    qt_rope = tl.load(q_row[None, :] + D_LATENT + d_rope[:, None], mask=row_ok[None, :], other=0.0)
    return qt_lat, qt_rope


@triton.jit
def _softmax_tile_t(qt_lat, qt_rope, k_lat, k_rope, cols, col_ok, limit, qk_scale, m_i, l_i, acc_t,
                    DOT_PRECISION: tl.constexpr):
    """:func:`_softmax_tile` transposed (``swap_ab``): S^T = K q^T is (BLOCK_N keys, BLOCK_M rows) and
    O^T = V^T P^T is (512, BLOCK_M), so the keys fill the matrix unit's M dimension (64 on Hopper's wgmma) and a
    tile of 16 rows does not waste it; the same shared-memory K tile serves both products (once as is, once
    transposed). Returns the transposed accumulator ``acc_t`` (512, BLOCK_M)."""
    s = tl.dot(k_lat, qt_lat, input_precision=DOT_PRECISION)
    s = tl.dot(k_rope, qt_rope, s, input_precision=DOT_PRECISION)  # (BLOCK_N, BLOCK_M)
    s = s * qk_scale
    visible = col_ok[:, None] & (cols[:, None] <= limit[None, :])
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[None, :])
    l_i = l_i * alpha + tl.sum(p, 0)
    acc_t = tl.dot(tl.trans(k_lat), p.to(k_lat.dtype), acc_t * alpha[None, :], input_precision=DOT_PRECISION)
    return acc_t, m_new, l_i


@triton.jit
def _prefetch_before_wait(KV, KV_INDICES, KV_INDPTR, req, pid_s, num_splits, stride_kv, num_idx, num_rows,
                          BLOCK_N: tl.constexpr, TILES: tl.constexpr):
    """Before the PDL wait (the kernel before may still be writing the metadata): ask L2 for the cache rows of this
    program's first TILES tiles of BLOCK_N tokens, so that their DRAM reads overlap the kernel before instead of
    following it.
    Everything read here may be stale and is used only to form prefetch addresses, never a result: the loads go
    to L2 only (``.cg``), so that no stale line is left in L1 for the loads after the wait (L2 is where the
    kernel before's writes become visible); every address is clamped into its tensor (``num_idx`` indices,
    ``num_rows`` cache rows), so stale values cannot fault; and a prefetch is a hint that writes no register.
    16-bit rows (:func:`_prefetch_rows_l2`)."""
    kv_s = tl.load(KV_INDPTR + req, cache_modifier=".cg").to(tl.int64)
    s_k = tl.load(KV_INDPTR + req + 1, cache_modifier=".cg").to(tl.int64) - kv_s
    chunk = tl.cdiv(tl.cdiv(s_k, num_splits), BLOCK_N) * BLOCK_N
    hi = tl.minimum(pid_s * chunk + chunk, s_k)
    for t in tl.static_range(TILES):
        cols = pid_s * chunk + t * BLOCK_N + tl.arange(0, BLOCK_N)
        pos = kv_s + cols
        ok = (cols < hi) & (pos >= 0) & (pos < num_idx)
        idx = tl.load(KV_INDICES + tl.where(ok, pos, 0), mask=ok, other=0, cache_modifier=".cg").to(tl.int64)
        _prefetch_rows_l2(KV + tl.minimum(tl.maximum(idx, 0), num_rows - 1) * stride_kv)


TRACE_TILES = tl.constexpr(60)  # tiles whose end time a traced program records (later tiles are not recorded)
TRACE_SLOTS = tl.constexpr(4 + 60)  # per program: SM id, entry, after the PDL wait, exit, then one per tile
MERGE_TRACE_SLOTS = tl.constexpr(4)  # per merge program: SM id, entry, after the PDL wait, exit


@triton.jit
def _trace_tile(trace, i, l_i):
    """Record the time after tile ``i`` (if ``i < TRACE_TILES``). The timer is read only once ``l_i``, a
    result of that tile's softmax, is known (an asm that consumes it), so it is not hoisted above the tile."""
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [tl.max(l_i, 0).to(tl.int32, bitcast=True)],
                                  dtype=tl.int64, is_pure=False, pack=1)
    if i < TRACE_TILES:
        tl.store(trace + 4 + i, t)


@triton.jit
def _mla_decode_split_kernel(
    Q,  # (total_q, H, 576) contiguous, fp16/bf16/fp32
    KV,  # (num_rows, 576) cache rows, row stride stride_kv
    KV_INDICES,  # (>= kv_indptr[-1],) int32: cache row of each token
    QO_INDPTR,  # (B + 1,) int32
    KV_INDPTR,  # (B + 1,) int32
    OUT,  # DIRECT: (total_q * H, 512) q.dtype; else partials (num_splits, total_q * H, 512) fp32
    LSE,  # DIRECT: (total_q * H,) fp32; else (num_splits, total_q * H) fp32
    FINAL_O,  # FUSED_MERGE: (total_q * H, 512) q.dtype, the merged output
    FINAL_LSE,  # FUSED_MERGE: (total_q * H,) fp32
    COUNTERS,  # FUSED_MERGE: (B * row_blocks,) int32 zeros; splits finished per (request, row block)
    stride_kv,  # elements between consecutive cache rows
    total_rows,  # total_q * H (partials' split stride is total_rows rows)
    qk_scale,  # sm_scale * log2(e): scores in base 2
    num_splits,  # KV splits per request (grid axis 1)
    NUM_HEADS: tl.constexpr,
    DIRECT: tl.constexpr,  # num_splits == 1: write the final output and natural-log LSE
    FUSED_MERGE: tl.constexpr,  # the last split of each row block merges (else a second kernel does)
    SWAP_AB: tl.constexpr,  # compute the transposed problem: keys as the MMA's M dimension (few rows)
    PREFETCH: tl.constexpr,  # register double-buffering: the next tile's rows and the one after's indices in flight
    WARP_SPECIALIZE: tl.constexpr,  # Triton's automatic warp specialisation of the default loop
    IDX_AHEAD: tl.constexpr,  # the next tile's indices loaded one tile early (rows left to the pipeliner)
    IDX_DIST: tl.constexpr,  # IDX_AHEAD: indices loaded this many tiles early (1-3)
    IDX_PREFETCH: tl.constexpr,  # IDX_AHEAD: prefetch this split's indices into L1 (1) or L2 (2) first; 0 off
    LAUNCH_DEPENDENTS: tl.constexpr,  # PDL: let the merge kernel be scheduled once this program's loop is done
    L2_AHEAD: tl.constexpr,  # IDX_AHEAD only: prefetch the rows of the tile this many tiles ahead into L2 (0: off)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (no silent TF32); None (the default) for 16-bit
    BLOCK_M: tl.constexpr,  # folded (query, head) rows per program
    BLOCK_N: tl.constexpr,  # tokens per KV tile
    D_LATENT: tl.constexpr,  # 512
    D_ROPE: tl.constexpr,  # 64
    GDC_WAIT: tl.constexpr = False,  # launched with PDL: wait for the previous kernel before the first read
    META_BEFORE_WAIT: tl.constexpr = False,  # GDC_WAIT: read the indptrs and the first indices before the wait
    TRACE_BUF=None,  # TRACE: (programs, TRACE_SLOTS) int64 timestamps (see trace_layout())
    TRACE: tl.constexpr = False,  # record %globaltimer at entry, after each tile and at exit (compiled NVIDIA)
    SIGNAL: tl.constexpr = False,  # spin merge: count each stored partial row in COUNTERS ((total_rows,) int32),
    #                               and let the merge launch right after the PDL wait (it spins on the counts)
    SPLIT_MERGE: tl.constexpr = False,  # every split of a row block merges a slice of its columns once all of the
    #                                     block's partials are stored (counted in COUNTERS); the whole grid must
    #                                     be resident at once (the host checks): no second kernel
    MERGE_D: tl.constexpr = 64,  # SPLIT_MERGE: columns per merge slice (slices c = pid_s, pid_s + num_splits, ...)
    MERGE_CHUNK: tl.constexpr = 8,  # SPLIT_MERGE: partials loaded at once (a power of two)
    MAX_SPIN: tl.constexpr = 1 << 22,  # SPLIT_MERGE: polls before a row block still short of partials is NaN
    PART_DESC=None,  # TMA_STORE: descriptor of OUT viewed (num_splits * total_rows, 512), (BLOCK_M, 512) blocks
    TMA_STORE: tl.constexpr = False,  # partials: a program whose BLOCK_M rows are all real writes its partial with
    #                                   one descriptor store (TMA on Hopper); others store by mask
    PBW_TILES: tl.constexpr = 0,  # GDC_WAIT: before the wait, prefetch the rows of this program's first PBW_TILES
    #                               tiles into L2 (hints from possibly stale metadata; see _prefetch_before_wait)
    NUM_IDX=0,  # PBW_TILES: kv_indices.numel() (the pre-wait index loads stay inside it)
    NUM_ROWS=0,  # PBW_TILES: rows of the cache (the prefetched addresses stay inside it)
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    req = tl.program_id(2)
    if PBW_TILES > 0 and GDC_WAIT and not META_BEFORE_WAIT:
        _prefetch_before_wait(KV, KV_INDICES, KV_INDPTR, req, pid_s, num_splits, stride_kv, NUM_IDX, NUM_ROWS, BLOCK_N,
                              PBW_TILES)
    if TRACE:
        trace = TRACE_BUF + (pid_m + tl.num_programs(0) * (pid_s + tl.num_programs(1) * req)) * TRACE_SLOTS
        tl.store(trace + 1, tl.extra.cuda.globaltimer())
    if GDC_WAIT and not META_BEFORE_WAIT:  # nothing is read before this: every input may come from the kernel before
        tl.extra.cuda.gdc_wait()
    if SIGNAL and LAUNCH_DEPENDENTS:  # (after the wait: a kernel let in early still knows all before this is done)
        tl.extra.cuda.gdc_launch_dependents()  # the spin merge's programs wait on COUNTERS, not on this grid
    if TRACE:
        tl.store(trace, tl.extra.cuda.smid().to(tl.int64))
        if not META_BEFORE_WAIT:
            tl.store(trace + 2, tl.extra.cuda.globaltimer())
    q_start = tl.load(QO_INDPTR + req)
    s_q = tl.load(QO_INDPTR + req + 1) - q_start
    kv_start = tl.load(KV_INDPTR + req)
    s_k = tl.load(KV_INDPTR + req + 1) - kv_start
    n_rows = s_q * NUM_HEADS
    if pid_m * BLOCK_M >= n_rows:  # this request has fewer query rows than the longest one
        if TRACE:
            tl.store(trace + 3, tl.extra.cuda.globaltimer())
        return
    # This split's token range: equal chunks, whole tiles; late splits of short requests are empty.
    chunk = tl.cdiv(tl.cdiv(s_k, num_splits), BLOCK_N) * BLOCK_N
    k_lo = pid_s * chunk
    k_hi = tl.minimum(k_lo + chunk, s_k)

    if GDC_WAIT and META_BEFORE_WAIT and not IDX_AHEAD:  # (the IDX_AHEAD loop waits after its first indices)
        tl.extra.cuda.gdc_wait()
        if TRACE:
            tl.store(trace + 2, tl.extra.cuda.globaltimer())
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    limit = s_k - s_q + rows // NUM_HEADS  # last key each row may see (bottom-right causal)
    grow = (q_start * NUM_HEADS + rows).to(tl.int64)  # row in the flat (total_q * H) space
    d_lat = tl.arange(0, D_LATENT)
    d_rope = tl.arange(0, D_ROPE)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    q_row = Q + grow * (D_LATENT + D_ROPE)
    if SWAP_AB and not IDX_AHEAD:  # the transposed products (_softmax_tile_t) in the plain loop
        qt_lat, qt_rope = _load_q_t(q_row, row_ok, D_LATENT, D_ROPE)
        acc_t = tl.zeros([D_LATENT, BLOCK_M], dtype=tl.float32)
        for start in range(k_lo, k_hi, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < k_hi
            idx = tl.load(KV_INDICES + kv_start + cols, mask=col_ok, other=0).to(tl.int64)
            kv_row = KV + idx[:, None] * stride_kv
            k_lat = tl.load(kv_row + d_lat[None, :], mask=col_ok[:, None], other=0.0)  # (BLOCK_N, 512): K and V
            k_rope = tl.load(kv_row + D_LATENT + d_rope[None, :], mask=col_ok[:, None], other=0.0)
            acc_t, m_i, l_i = _softmax_tile_t(qt_lat, qt_rope, k_lat, k_rope, cols, col_ok, limit, qk_scale, m_i, l_i,
                                              acc_t, DOT_PRECISION)
        acc = tl.trans(acc_t)
    elif PREFETCH:
        # Latency-bound short programs: each tile's rows wait on its indices, then on the gather. Here the
        # loads for tile i+1 (and the indices of tile i+2) are issued before tile i is computed, so one
        # program keeps two dependent load chains in flight instead of one.
        q_lat, q_rope = _load_q(q_row, row_ok, D_LATENT, D_ROPE)
        acc = tl.zeros([BLOCK_M, D_LATENT], dtype=tl.float32)
        cols = k_lo + tl.arange(0, BLOCK_N)
        col_ok = cols < k_hi
        idx = tl.load(KV_INDICES + kv_start + cols, mask=col_ok, other=0).to(tl.int64)
        k_lat = tl.load(KV + idx[:, None] * stride_kv + d_lat[None, :], mask=col_ok[:, None], other=0.0)
        k_rope = tl.load(KV + idx[:, None] * stride_kv + D_LATENT + d_rope[None, :], mask=col_ok[:, None], other=0.0)
        idx = tl.load(KV_INDICES + kv_start + cols + BLOCK_N, mask=cols + BLOCK_N < k_hi, other=0).to(tl.int64)
        for start in range(k_lo, k_hi, BLOCK_N):
            cols_n = cols + BLOCK_N
            ok_n = cols_n < k_hi
            k_lat_n = tl.load(KV + idx[:, None] * stride_kv + d_lat[None, :], mask=ok_n[:, None], other=0.0)
            k_rope_n = tl.load(KV + idx[:, None] * stride_kv + D_LATENT + d_rope[None, :], mask=ok_n[:, None],
                               other=0.0)
            idx = tl.load(KV_INDICES + kv_start + cols_n + BLOCK_N, mask=cols_n + BLOCK_N < k_hi, other=0).to(tl.int64)
            acc, m_i, l_i = _softmax_tile(q_lat, q_rope, k_lat, k_rope, cols, col_ok, limit, qk_scale, m_i, l_i, acc,
                                          DOT_PRECISION)
            k_lat = k_lat_n
            k_rope = k_rope_n
            cols = cols_n
            col_ok = ok_n
    elif IDX_AHEAD:
        # Only the indices run ahead: the next tile's 64 indices are loaded (into a few registers) one tile
        # early, so the gather of each tile does not wait on a dependent index load; the rows themselves are
        # left to Triton's pipeliner (unlike PREFETCH, which holds whole KV tiles in registers and spills).
        # The first indices are requested before the query rows: the query tile goes to shared memory as
        # soon as it arrives, and Triton emits that wait where the load is written, so q first would put the
        # index load's latency after the query's instead of beside it (measured: within noise, round 13).
        if IDX_PREFETCH > 0:
            if k_hi > k_lo:
                _prefetch_indices(KV_INDICES, kv_start + k_lo, kv_start + k_hi, IDX_PREFETCH)
        cols_n = k_lo + tl.arange(0, BLOCK_N)
        idx_n = tl.load(KV_INDICES + kv_start + cols_n, mask=cols_n < k_hi, other=0)
        if IDX_DIST >= 2:  # the indices of tiles 1 (and 2) too: the loop then loads those of tile i + IDX_DIST
            c2 = cols_n + BLOCK_N
            idx_n2 = tl.load(KV_INDICES + kv_start + c2, mask=c2 < k_hi, other=0)
        if IDX_DIST >= 3:
            c3 = cols_n + 2 * BLOCK_N
            idx_n3 = tl.load(KV_INDICES + kv_start + c3, mask=c3 < k_hi, other=0)
        if GDC_WAIT and META_BEFORE_WAIT:  # the metadata and first indices are loaded: now wait for q and the cache
            tl.extra.cuda.gdc_wait()
            if TRACE:
                tl.store(trace + 2, tl.extra.cuda.globaltimer())
        if L2_AHEAD > 0:  # rows of tile i + L2_AHEAD prefetched into L2 (their indices loaded a tile earlier)
            far = cols_n + L2_AHEAD * BLOCK_N
            idx_far = tl.load(KV_INDICES + kv_start + far, mask=far < k_hi, other=0)  # row 0 where out of range
        if SWAP_AB:  # the transposed products (_softmax_tile_t), indices one tile ahead
            qt_lat, qt_rope = _load_q_t(q_row, row_ok, D_LATENT, D_ROPE)
            acc_t = tl.zeros([D_LATENT, BLOCK_M], dtype=tl.float32)
        else:
            q_lat, q_rope = _load_q(q_row, row_ok, D_LATENT, D_ROPE)
            acc = tl.zeros([BLOCK_M, D_LATENT], dtype=tl.float32)
        for start in range(k_lo, k_hi, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < k_hi
            idx = idx_n.to(tl.int64)
            if IDX_DIST == 1:
                idx_n = tl.load(KV_INDICES + kv_start + cols + BLOCK_N, mask=cols + BLOCK_N < k_hi, other=0)
            else:  # the indices of tile i + IDX_DIST, and the ones loaded before move one place down
                far_c = cols + IDX_DIST * BLOCK_N
                far_i = tl.load(KV_INDICES + kv_start + far_c, mask=far_c < k_hi, other=0)
                if IDX_DIST == 2:
                    idx_n = idx_n2
                    idx_n2 = far_i
                else:
                    idx_n = idx_n2
                    idx_n2 = idx_n3
                    idx_n3 = far_i
            if L2_AHEAD > 0:
                _prefetch_rows_l2(KV + idx_far.to(tl.int64) * stride_kv)
                far = cols + (L2_AHEAD + 1) * BLOCK_N
                idx_far = tl.load(KV_INDICES + kv_start + far, mask=far < k_hi, other=0)
            kv_row = KV + idx[:, None] * stride_kv
            k_lat = tl.load(kv_row + d_lat[None, :], mask=col_ok[:, None], other=0.0)
            k_rope = tl.load(kv_row + D_LATENT + d_rope[None, :], mask=col_ok[:, None], other=0.0)
            if SWAP_AB:
                acc_t, m_i, l_i = _softmax_tile_t(qt_lat, qt_rope, k_lat, k_rope, cols, col_ok, limit, qk_scale, m_i,
                                                  l_i, acc_t, DOT_PRECISION)
            else:
                acc, m_i, l_i = _softmax_tile(q_lat, q_rope, k_lat, k_rope, cols, col_ok, limit, qk_scale, m_i, l_i,
                                              acc, DOT_PRECISION)
            if TRACE:
                _trace_tile(trace, (start - k_lo) // BLOCK_N, l_i)
        if SWAP_AB:
            acc = tl.trans(acc_t)
    else:
        q_lat, q_rope = _load_q(q_row, row_ok, D_LATENT, D_ROPE)
        acc = tl.zeros([BLOCK_M, D_LATENT], dtype=tl.float32)
        for start in tl.range(k_lo, k_hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < k_hi
            idx = tl.load(KV_INDICES + kv_start + cols, mask=col_ok, other=0).to(tl.int64)
            kv_row = KV + idx[:, None] * stride_kv
            k_lat = tl.load(kv_row + d_lat[None, :], mask=col_ok[:, None], other=0.0)  # (BLOCK_N, 512): K and V
            k_rope = tl.load(kv_row + D_LATENT + d_rope[None, :], mask=col_ok[:, None], other=0.0)  # (BLOCK_N, 64)
            acc, m_i, l_i = _softmax_tile(q_lat, q_rope, k_lat, k_rope, cols, col_ok, limit, qk_scale, m_i, l_i, acc,
                                          DOT_PRECISION)
            if TRACE:
                _trace_tile(trace, (start - k_lo) // BLOCK_N, l_i)

    if LAUNCH_DEPENDENTS and not SIGNAL:  # the merge still waits (griddepcontrol.wait) for this whole grid's stores
        tl.extra.cuda.gdc_launch_dependents()
    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, (m_i + tl.log2(tl.where(has_keys, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    if DIRECT:
        tl.store(OUT + grow[:, None] * D_LATENT + d_lat[None, :], out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
        tl.store(LSE + grow, lse, mask=row_ok)
        if TRACE:
            tl.store(trace + 3, tl.extra.cuda.globaltimer())
    else:
        prow = pid_s.to(tl.int64) * total_rows + grow
        if TMA_STORE:
            if pid_m * BLOCK_M + BLOCK_M <= n_rows:  # every row real: the next request's rows are not in the block
                PART_DESC.store([(pid_s * total_rows + q_start * NUM_HEADS + pid_m * BLOCK_M).to(tl.int32), 0], out)
            else:
                tl.store(OUT + prow[:, None] * D_LATENT + d_lat[None, :], out, mask=row_ok[:, None])
        else:  # fp32 partials, or (narrow_partials) q's dtype
            tl.store(OUT + prow[:, None] * D_LATENT + d_lat[None, :], out.to(OUT.dtype.element_ty),
                     mask=row_ok[:, None])
        tl.store(LSE + prow, lse, mask=row_ok)
        if SIGNAL:
            # Every thread's partial stores precede the release (barrier, then a release at GPU scope): a merge
            # program that acquires a count of num_splits for a row sees every split's partial of that row.
            tl.debug_barrier()
            tl.atomic_add(COUNTERS + grow, 1, mask=row_ok, sem="release", scope="gpu")
        if SPLIT_MERGE:
            # All num_splits programs of this row block merge it together, each a slice of the columns, once the
            # block's count reaches num_splits (barrier, then release: every thread's partial stores come first;
            # the polls acquire). The second counter lets the last one out reset both for the next launch.
            tl.debug_barrier()
            counter = COUNTERS + (req * tl.num_programs(0) + pid_m) * 2
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") + 1
            polls = 0
            while (arrived < num_splits) & (polls < MAX_SPIN):
                arrived = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
                polls += 1
            tl.debug_barrier()  # every thread's partial loads below come after the acquire above
            short = arrived < num_splits  # MAX_SPIN polls and still short: NaN, not a silently partial merge
            for c in range(pid_s, D_LATENT // MERGE_D, num_splits):
                d_m = c * MERGE_D + tl.arange(0, MERGE_D)
                final, final_lse = _merge_tile(OUT, LSE, grow, row_ok, d_m, total_rows, num_splits, BLOCK_M, MERGE_D,
                                               MERGE_CHUNK, D_LATENT, True)
                final = tl.where(short, float("nan"), final)
                tl.store(FINAL_O + grow[:, None] * D_LATENT + d_m[None, :], final.to(FINAL_O.dtype.element_ty),
                         mask=row_ok[:, None])
                if c == 0:
                    tl.store(FINAL_LSE + grow, tl.where(short, float("nan"), final_lse), mask=row_ok)
            tl.debug_barrier()  # every thread is past its polls before the counters can be reset
            if tl.atomic_add(counter + 1, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(counter + 1, 0, sem="relaxed", scope="gpu")
        if TRACE:
            tl.store(trace + 3, tl.extra.cuda.globaltimer())
        if FUSED_MERGE:
            # The last split to finish for these rows merges them (no second launch). Barrier: every
            # thread's partial stores precede the release; the acquire orders the reads after it.
            tl.debug_barrier()
            counter = COUNTERS + req * tl.num_programs(0) + pid_m
            ticket = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if ticket == num_splits - 1:
                tl.store(counter, 0)  # every other split has counted: reset for the next launch
                # One split at a time over all 512 columns. (Loading 8 splits at once in column chunks, round 14,
                # made this merge 4-10x slower on the H200.)
                final, final_lse = _merge_tile(OUT, LSE, grow, row_ok, d_lat, total_rows, num_splits, BLOCK_M,
                                               D_LATENT, 1, D_LATENT, True)
                tl.store(FINAL_O + grow[:, None] * D_LATENT + d_lat[None, :], final.to(FINAL_O.dtype.element_ty),
                         mask=row_ok[:, None])
                tl.store(FINAL_LSE + grow, final_lse, mask=row_ok)


@triton.jit
def _merge_tile(MID_O, MID_LSE, rows, ok, d, total_rows, num_splits, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                SPLIT_CHUNK: tl.constexpr, D_LATENT: tl.constexpr, BYPASS_L1: tl.constexpr):
    """Combine the splits of rows ``rows`` (where ``ok``), columns ``d``, by their LSE, loading the partials
    of SPLIT_CHUNK splits at once ((SPLIT_CHUNK, rows, cols) in flight, not one split after another).
    Returns (out fp32 (rows, cols), natural-log lse (rows,)). ``BYPASS_L1``: the partials were written by
    other programs of the same launch, so read them from L2."""
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for s0 in range(0, num_splits, SPLIT_CHUNK):
        sp = s0 + tl.arange(0, SPLIT_CHUNK)
        prow = sp[:, None].to(tl.int64) * total_rows + rows[None, :]  # (SPLIT_CHUNK, rows)
        valid = (sp[:, None] < num_splits) & ok[None, :]
        if BYPASS_L1:
            lse_s = tl.load(MID_LSE + prow, mask=valid, other=float("-inf"), cache_modifier=".cg")
            o_s = tl.load(MID_O + prow[:, :, None] * D_LATENT + d[None, None, :], mask=valid[:, :, None], other=0.0,
                          cache_modifier=".cg").to(tl.float32)
        else:
            lse_s = tl.load(MID_LSE + prow, mask=valid, other=float("-inf"))
            o_s = tl.load(MID_O + prow[:, :, None] * D_LATENT + d[None, None, :], mask=valid[:, :, None],
                          other=0.0).to(tl.float32)
        m_new = tl.maximum(m, tl.max(lse_s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.exp(m - m_safe)
        w = tl.exp(lse_s - m_safe[None, :])  # (SPLIT_CHUNK, rows); 0 for splits that saw no key
        acc = acc * a[:, None] + tl.sum(w[:, :, None] * o_s, 0)
        denom = denom * a + tl.sum(w, 0)
        m = m_new
    has = denom > 0.0
    safe = tl.where(has, denom, 1.0)
    return acc / safe[:, None], tl.where(has, m + tl.log(safe), float("-inf"))


@triton.jit
def _mla_decode_merge_kernel(
    MID_O,  # (num_splits, total_rows, 512) partial outputs (each normalised within its split): fp32, or q's dtype
    MID_LSE,  # (num_splits, total_rows) fp32 natural-log LSE of each split (-inf: split saw no key)
    OUT,  # (total_rows, 512) q.dtype
    LSE,  # (total_rows,) fp32
    total_rows,
    num_splits,
    BLOCK_R: tl.constexpr,  # rows per program (grid axis 0)
    BLOCK_D: tl.constexpr,  # output columns per program (grid axis 1): D_LATENT // BLOCK_D programs per row block
    SPLIT_CHUNK: tl.constexpr,  # splits loaded at once: (SPLIT_CHUNK, BLOCK_R, BLOCK_D) partials in flight
    D_LATENT: tl.constexpr,
    GDC_WAIT: tl.constexpr = False,  # launched with PDL: wait for the split kernel's grid before reading partials
    LAUNCH_DEPENDENTS: tl.constexpr = False,  # PDL: let the next kernel (the next call's split) be scheduled now
    TRACE_BUF=None,  # TRACE: (programs, MERGE_TRACE_SLOTS) int64
    TRACE: tl.constexpr = False,
    COUNTERS=None,  # SPIN: (total_rows,) int32 partials stored per row (the split kernel's SIGNAL); left zeroed
    DONE=None,  # SPIN: (cdiv(total_rows, BLOCK_R),) int32 column programs past their spin, per row block; left zeroed
    SPIN: tl.constexpr = False,  # wait for this tile's rows' counts instead of for the whole split grid
    MAX_SPIN: tl.constexpr = 1 << 22,  # SPIN: polls before the rows still short of num_splits are written as NaN
):
    """Merge the splits of BLOCK_R rows x BLOCK_D columns. Many small programs, each loading the partials of
    up to SPLIT_CHUNK splits in one go (not one split after another), so the merge is short even when one
    request has many splits: it reads from L2 at the parallelism of the whole GPU.

    ``SPIN`` (the spin merge): no PDL wait; the program polls (acquire, GPU scope) the counts its rows' split
    programs release after storing their partials, and merges as soon as its rows are complete, while other
    requests' splits still run. It cannot deadlock: with PDL this grid is launched only once every split
    program has reached its trigger (all of them are resident, and none waits on this grid); without PDL it
    runs after the split grid. A row whose count never completes (inputs that break the launch's contract, such
    as a query longer than ``max_qo_len``) is written as NaN after ``MAX_SPIN`` polls, not left wrong."""
    if TRACE:
        trace = TRACE_BUF + (tl.program_id(0) + tl.num_programs(0) * tl.program_id(1)) * MERGE_TRACE_SLOTS
        tl.store(trace + 1, tl.extra.cuda.globaltimer())
    if GDC_WAIT:
        tl.extra.cuda.gdc_wait()
    if LAUNCH_DEPENDENTS:  # a dependent waits (griddepcontrol.wait) for this whole grid before it reads anything
        tl.extra.cuda.gdc_launch_dependents()
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    ok = rows < total_rows
    if SPIN:
        done = tl.where(ok, tl.atomic_add(COUNTERS + rows, 0, mask=ok, sem="acquire", scope="gpu"), num_splits)
        polls = 0
        while (tl.min(done, 0) < num_splits) & (polls < MAX_SPIN):
            done = tl.where(ok, tl.atomic_add(COUNTERS + rows, 0, mask=ok, sem="acquire", scope="gpu"), num_splits)
            polls += 1
        tl.debug_barrier()  # every thread's loads below come after every thread's acquire above
        ticket = tl.atomic_add(DONE + tl.program_id(0), 1, sem="acq_rel", scope="gpu")
        if ticket == tl.num_programs(1) - 1:  # the row block's last column program: reset for the next launch
            tl.atomic_xchg(COUNTERS + rows, 0, mask=ok, sem="relaxed", scope="gpu")
            tl.atomic_xchg(DONE + tl.program_id(0), 0, sem="relaxed", scope="gpu")
    if TRACE:
        tl.store(trace, tl.extra.cuda.smid().to(tl.int64))
        tl.store(trace + 2, tl.extra.cuda.globaltimer())
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    out, lse = _merge_tile(MID_O, MID_LSE, rows, ok, d, total_rows, num_splits, BLOCK_R, BLOCK_D, SPLIT_CHUNK,
                           D_LATENT, SPIN)
    if SPIN:  # rows whose partials never all arrived (MAX_SPIN polls): NaN, not a silently partial merge
        out = tl.where((done < num_splits)[:, None], float("nan"), out)
        lse = tl.where(done < num_splits, float("nan"), lse)
    tl.store(OUT + rows[:, None] * D_LATENT + d[None, :], out.to(OUT.dtype.element_ty), mask=ok[:, None])
    if tl.program_id(1) == 0:
        tl.store(LSE + rows, lse, mask=ok)
    if TRACE:
        tl.store(trace + 3, tl.extra.cuda.globaltimer())


# ----------------------------------------------------------------------------------------------
# Balanced schedule: equal token ranges per program, across request boundaries
# ----------------------------------------------------------------------------------------------
#
# With a uniform split count per request, B * splits programs rarely match the slots of the GPU
# (132 SMs x 2 resident programs on an H200): B=128 with 2 splits fills 256 of 264 slots, and one
# request's splits are all the same length however long the request is. Here program p of P takes the
# tokens g of the whole batch (requests concatenated, as kv_indptr lays them out) with
# floor(g * P / T) == p, T = kv_indptr[B]: ranges equal to a token, crossing request boundaries. A
# request that one program holds whole is written directly; the other requests leave one partial per
# program that touches them, in slot p + r (program p, request r: request r's programs are consecutive,
# so its slots are too, and no two requests share one), and a second kernel merges those.


@triton.jit
def _mla_decode_balanced_kernel(
    Q, KV, KV_INDICES, QO_INDPTR, KV_INDPTR,
    OUT,  # (total_q * H, 512) q.dtype: requests held whole by one program
    LSE,  # (total_q * H,) fp32
    MID_O,  # (P + B, ROWS_PER_REQ, 512) fp32 partials, slot p + r
    MID_LSE,  # (P + B, ROWS_PER_REQ) fp32
    stride_kv, qk_scale, num_reqs, num_programs,
    NUM_HEADS: tl.constexpr, ROWS_PER_REQ: tl.constexpr, BLOCK_B: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_LATENT: tl.constexpr, D_ROPE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    p = tl.program_id(1).to(tl.int64)
    total = tl.load(KV_INDPTR + num_reqs).to(tl.int64)
    # P <= T, so that every program's range holds a token: then the programs that touch a request are
    # exactly p_first .. p_last below, and each of them writes its slot.
    n_prog = tl.minimum(num_programs, total)
    if p >= n_prog:
        return
    g0 = (p * total + n_prog - 1) // n_prog  # ceil(p T / P): the first token g with g P // T == p
    g1 = ((p + 1) * total + n_prog - 1) // n_prog
    # The request holding token g0: how many kv_indptr[1:] entries are <= g0 (one vector load per BLOCK_B).
    r = tl.program_id(0) * 0  # an int32 scalar
    for c in range(0, num_reqs, BLOCK_B):
        o = c + 1 + tl.arange(0, BLOCK_B)
        ends = tl.load(KV_INDPTR + o, mask=o <= num_reqs, other=2147483647).to(tl.int64)
        r += tl.sum((ends <= g0).to(tl.int32))
    d_lat = tl.arange(0, D_LATENT)
    d_rope = tl.arange(0, D_ROPE)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    kv_start = tl.load(KV_INDPTR + r, mask=r < num_reqs, other=0).to(tl.int64)
    while (r < num_reqs) & (kv_start < g1):
        kv_end = tl.load(KV_INDPTR + r + 1).to(tl.int64)
        q_start = tl.load(QO_INDPTR + r)
        s_q = tl.load(QO_INDPTR + r + 1) - q_start
        s_k = (kv_end - kv_start).to(tl.int32)
        k_lo = (tl.maximum(g0, kv_start) - kv_start).to(tl.int32)
        k_hi = (tl.minimum(g1, kv_end) - kv_start).to(tl.int32)
        n_rows = s_q * NUM_HEADS
        if (pid_m * BLOCK_M < n_rows) & (k_lo < k_hi):
            row_ok = rows < n_rows
            limit = s_k - s_q + rows // NUM_HEADS
            grow = (q_start * NUM_HEADS + rows).to(tl.int64)
            q_row = Q + grow * (D_LATENT + D_ROPE)
            q_lat, q_rope = _load_q(q_row, row_ok, D_LATENT, D_ROPE)
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, D_LATENT], dtype=tl.float32)
            for start in range(k_lo, k_hi, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                col_ok = cols < k_hi
                idx = tl.load(KV_INDICES + kv_start + cols, mask=col_ok, other=0).to(tl.int64)
                kv_row = KV + idx[:, None] * stride_kv
                k_lat = tl.load(kv_row + d_lat[None, :], mask=col_ok[:, None], other=0.0)
                k_rope = tl.load(kv_row + D_LATENT + d_rope[None, :], mask=col_ok[:, None], other=0.0)
                acc, m_i, l_i = _softmax_tile(q_lat, q_rope, k_lat, k_rope, cols, col_ok, limit, qk_scale, m_i, l_i,
                                              acc, DOT_PRECISION)
            has_keys = l_i > 0.0
            o = acc / tl.where(has_keys, l_i, 1.0)[:, None]
            lse = tl.where(has_keys, (m_i + tl.log2(tl.where(has_keys, l_i, 1.0))) * 0.6931471805599453,
                           float("-inf"))
            if (k_lo == 0) & (k_hi == s_k):  # the whole request: final output
                tl.store(OUT + grow[:, None] * D_LATENT + d_lat[None, :], o.to(OUT.dtype.element_ty),
                         mask=row_ok[:, None])
                tl.store(LSE + grow, lse, mask=row_ok)
            else:
                slot = (p + r) * ROWS_PER_REQ + rows
                tl.store(MID_O + slot[:, None] * D_LATENT + d_lat[None, :], o, mask=row_ok[:, None])
                tl.store(MID_LSE + slot, lse, mask=row_ok)
        r += 1
        kv_start = kv_end


@triton.jit
def _mla_decode_balanced_merge_kernel(
    MID_O, MID_LSE, OUT, LSE, QO_INDPTR, KV_INDPTR, num_reqs, num_programs,
    NUM_HEADS: tl.constexpr, ROWS_PER_REQ: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr, D_LATENT: tl.constexpr,
):
    """Merge the partials of request ``program_id(0)`` (rows ``program_id(1)`` block, columns ``program_id(2)``
    block): slots p + r for the programs p that touched it; requests held whole were written already."""
    r = tl.program_id(0)
    total = tl.load(KV_INDPTR + num_reqs).to(tl.int64)
    kv_start = tl.load(KV_INDPTR + r).to(tl.int64)
    kv_end = tl.load(KV_INDPTR + r + 1).to(tl.int64)
    q_start = tl.load(QO_INDPTR + r)
    n_rows = (tl.load(QO_INDPTR + r + 1) - q_start) * NUM_HEADS
    if (kv_end <= kv_start) | (tl.program_id(1) * BLOCK_R >= n_rows):
        return
    n_prog = tl.minimum(num_programs, total)  # as the attention kernel: P <= T
    p_first = kv_start * n_prog // total
    p_last = (kv_end - 1) * n_prog // total
    if p_first == p_last:
        return
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < n_rows
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    n = (p_last - p_first + 1).to(tl.int32)
    for s0 in range(0, n, SPLIT_CHUNK):
        sp = s0 + tl.arange(0, SPLIT_CHUNK)
        slot = (p_first + r + sp[:, None]) * ROWS_PER_REQ + rows[None, :]  # (SPLIT_CHUNK, BLOCK_R)
        valid = (sp[:, None] < n) & ok[None, :]
        lse_s = tl.load(MID_LSE + slot, mask=valid, other=float("-inf"))
        o_s = tl.load(MID_O + slot[:, :, None] * D_LATENT + d[None, None, :], mask=valid[:, :, None], other=0.0)
        m_new = tl.maximum(m, tl.max(lse_s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.exp(m - m_safe)
        w = tl.exp(lse_s - m_safe[None, :])
        acc = acc * a[:, None] + tl.sum(w[:, :, None] * o_s, 0)
        denom = denom * a + tl.sum(w, 0)
        m = m_new
    has = denom > 0.0
    safe = tl.where(has, denom, 1.0)
    grow = (q_start * NUM_HEADS + rows).to(tl.int64)
    tl.store(OUT + grow[:, None] * D_LATENT + d[None, :], (acc / safe[:, None]).to(OUT.dtype.element_ty),
             mask=ok[:, None])
    if tl.program_id(2) == 0:
        tl.store(LSE + grow, tl.where(has, m + tl.log(safe), float("-inf")), mask=ok)


@dataclasses.dataclass(frozen=True)
class TritonConfig:
    """Launch parameters of the Triton decode (see :func:`triton_config`)."""

    block_m: int  # folded (query, head) rows per program: 16, 32, 64 or 128
    block_n: int  # tokens per KV tile
    num_warps: int
    num_stages: int
    split_overhead_tokens: int = 128  # a program's fixed cost (prologue, partial write) in tokens' worth of time
    merge_overhead_tokens: int = 64  # the merge's fixed cost (a second launch) in tokens' worth of time
    merge_tokens_per_split: int = 4  # the merge's cost per split (fused: one program reads every partial)
    programs_per_sm: int | None = None  # resident programs per SM; None: estimated from shared memory/registers
    max_splits: int = 128
    merge_block_r: int | None = None  # second-kernel merge: rows per program (None: merge_tile() picks)
    merge_block_d: int | None = None  # second-kernel merge: output columns per program, divides 512 (None: picks)
    merge_split_chunk: int = 16  # second-kernel merge: splits loaded at once (a power of two)
    merge_warps: int | None = None  # second-kernel merge: warps per program (None: merge_num_warps() picks)
    fused_merge: bool = False  # last split merges (atomic ticket) instead of a second kernel
    swap_ab: bool = False  # transposed products (keys as the MMA's M dimension): for tiles of few rows
    prefetch: bool = False  # register double-buffering of KV tiles (with num_stages=1: no Triton pipelining)
    balanced: bool = False  # equal token ranges per program across requests (the balanced schedule)
    min_tokens_per_program: int = 128  # balanced: fewer programs than slots when the batch is small
    max_regs: int | None = None  # cap on registers per thread (more resident warps, maybe spills); NVIDIA only
    warp_specialize: bool = False  # Triton's automatic warp specialisation of the default loop
    idx_ahead: bool = False  # the next tile's indices loaded one tile early, rows left to Triton's pipeliner
    idx_dist: int = 1  # idx_ahead: how many tiles early the indices are loaded (1-3; more lets a deeper pipeline
    #                    issue the row gather further ahead)
    idx_prefetch: int = 0  # idx_ahead: prefetch the split's indices into L1 (1) or L2 (2) before the loop
    #                        (compiled NVIDIA only; 0: off)
    pdl: bool = False  # launch the second-kernel merge with programmatic dependent launch (NVIDIA sm90+ only)
    pdl_split: bool = False  # also launch the split kernel with PDL (it waits before its first read), and let
    #                          the merge release the next kernel early: launches overlap the kernel before them
    #                          (the balanced kernels have no PDL launches: there it changes nothing)
    meta_before_wait: bool = False  # pdl_split: read qo_indptr, kv_indptr and the first tile's kv_indices before
    #                                 the PDL wait (they must not be written by the kernel just before this call)
    l2_ahead: int = 0  # idx_ahead only: L2 prefetch of the rows this many tiles ahead (compiled NVIDIA only)
    gluon: bool = False  # the split kernel of workbench.mla_gluon (Hopper, 16-bit, 64x64 w8; copies of the next
    #                      tile issued before the math of this one) instead of the Triton one
    gluon_ws: bool = False  # gluon only: the warp-specialised split kernel of workbench.mla_gluon_ws (GLUON_WS_CONFIG)
    #                         (two warpgroups take turns on 32-token tiles, a loader warpgroup gathers; round 22)
    cluster_merge: bool = False  # gluon only: when the split count is 2, 4 or 8, the splits of a row block run as one
    #                              thread-block cluster and merge their partials after a cluster barrier (no
    #                              second kernel); other split counts use the second-kernel merge
    spin_merge: bool = False  # Triton split kernel only: each split program counts its stored partial rows (release)
    #                           and lets the merge launch right after its PDL wait; each merge program polls its
    #                           rows' counts (acquire) instead of waiting for the whole split grid. Exact (outputs
    #                           bit-identical), but slower at every point of round 26 (B=16 L=4k 32.8-33.9 against
    #                           30.9-31.6 us; B=64 L=4k +7 %): the polling programs slow the split kernel
    split_merge: bool = False  # Triton split kernel only: no second kernel; every split program of a row block, once
    #                            the block's partials are all stored (a counter it polls), merges a slice of the
    #                            block's columns. Needs the whole grid resident at once (checked with CUDA's
    #                            occupancy query at launch; where it is not, or under the interpreter or on ROCm,
    #                            the second-kernel merge runs). Slower at every point of round 28 (B=16 L=4k
    #                            +3.3-3.9 us; B=1 L=32k, 87 splits, 3.1x): each program waits for the slowest of
    #                            its row block, then reads all the block's partials for its slice
    narrow_partials: bool = False  # the partial outputs in q's dtype (16-bit) instead of fp32, as FlashInfer's
    #                                split-KV decode keeps them (its tmp_v is in the output dtype); LSE stays fp32.
    #                                Half the partial bytes written and merged; each partial is rounded once more
    #                                (the merge is a convex combination: at most one more rounding of the largest
    #                                partial). Not with balanced or tma_store. Mixed in round 29: 0.7-0.9 us faster
    #                                at B=16 L=4k qlen 1 (Triton, before round 30's merge; no consistent gain after),
    #                                2.3-2.9 us slower at qlen 4 (gluon), 12 % slower with the large-batch tile.
    #                                With coalesced_store (round 32) the gluon kernels gain 9-15 % at small calls:
    #                                both are in GLUON_CONFIG and GLUON_WS_CONFIG
    tma_store: bool = False  # partials leave by TMA: a program whose rows fill its whole row block stages its fp32
    #                          partial in shared memory and writes it with bulk (TMA) copies (NVIDIA sm90+,
    #                          compiled; the gluon kernel, and the Triton split kernel; partial row blocks store by
    #                          mask). Slower at every point of round 27 (B=16 L=4k +0.3-0.8 us; B=128 L=8k +5 %:
    #                          the Triton kernel's staging buffer leaves room for one program per SM, not two)
    prefetch_before_wait: int = 0  # Triton split kernel with pdl_split (not meta_before_wait), 16-bit: before its PDL
    #                                wait each program asks L2 for the rows of its first this-many tiles, found from
    #                                metadata read L2-only before the wait (possibly stale: used for addresses only,
    #                                clamped into the tensors; the loads after the wait are unchanged). Exact, but
    #                                slower in round 33 (B=16 L=4k +0.4-3 us, more with more tiles): opt-in
    coalesced_store: bool = False  # gluon kernels only (not with cluster_merge or tma_store): the output or partial
    #                                is staged in the idle tile buffers and stored row-major in 16-byte vectors (512
    #                                contiguous bytes per warp store) instead of from the wgmma accumulator layout
    #                                (8 rows x 32 bytes per warp store). Round 32: level alone with fp32 partials,
    #                                9-15 % faster at small calls with narrow_partials (in GLUON_CONFIG)
    ws_handoff: bool = False  # gluon_ws with coalesced_store only: the hand-over schedule (round 38): only the
    #                           running max passes between the two warpgroups in tile order (published before the
    #                           exponentials); each keeps its own share of the running sum, added after the last tile
    ws_idx_ahead: bool = False  # ws_handoff only: the loader warpgroup loads each tile's indices one tile ahead
    #                             (round 39: GLUON_WS_IDX_AHEAD_CONFIG, chosen by gluon_ws_config)
    ws_early_q: bool = False  # ws_handoff only: the query tile's copies arrive on an mbarrier the consumer
    #                           warpgroups wait on, instead of being waited for before the partitions start, so the
    #                           loader's first index loads and gathers overlap them
    ws_split_merge: bool = False  # ws_idx_ahead only: with 8 splits, the programs of a row block merge their
    #                               partials themselves (each warpgroup a 32-column slice, after a count in global
    #                               memory says all are stored), launched cooperatively so that all are resident at
    #                               once; no second kernel. Other split counts, or a grid that does not fit, take the
    #                               merge kernel. Round 40: slower than the merge kernel everywhere it ran (opt-in)
    gluon_swap: bool = False  # the split kernel of workbench.mla_gluon_swap (Hopper, 16-bit, 16 or 32 rows x 64
    #                           tokens on one warpgroup): the products transposed on wgmma (tokens as M), so the
    #                           query and each tile are read from shared memory once per tile (thirteenth session,
    #                           round 36: the default up to 32 rows). On 8 warps (two warpgroups side by side along
    #                           the rows; the only way to 64 rows) it was slower everywhere measured (round 36b)

    def __post_init__(self) -> None:
        if self.gluon_swap and ((self.block_m, self.num_warps) not in ((16, 4), (32, 4), (16, 8), (32, 8), (64, 8))
                                or (self.block_n, self.num_stages) != (64, 2)):
            raise ValueError(f"gluon_swap needs block_m 16 or 32 on 4 or 8 warps, or 64 on 8 (one or two warpgroups "
                             f"side by side along the rows; 64 rows on one would need 256 accumulator registers per "
                             f"thread), block_n=64 and num_stages=2 (the tile workbench.mla_gluon_swap has), got "
                             f"{self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}")
        if self.gluon_swap and (self.gluon or self.balanced or self.fused_merge or self.meta_before_wait
                                or self.idx_ahead or self.warp_specialize or self.swap_ab or self.prefetch
                                or self.spin_merge or self.split_merge or self.tma_store or self.coalesced_store
                                or self.prefetch_before_wait or self.max_regs is not None):
            raise ValueError("gluon_swap replaces the split kernel: gluon (and its modes), balanced, fused_merge, "
                             "meta_before_wait, idx_ahead, warp_specialize, swap_ab, prefetch, spin_merge, "
                             "split_merge, tma_store, prefetch_before_wait and max_regs do not apply to it")
        if self.prefetch_before_wait and (self.prefetch_before_wait < 0 or not self.pdl_split or self.meta_before_wait
                                          or self.gluon or self.balanced):
            raise ValueError(f"prefetch_before_wait is {self.prefetch_before_wait}; it must be >= 0, and above 0 only "
                             "with pdl_split=True (it runs before the split kernel's PDL wait), without "
                             "meta_before_wait, gluon or balanced")
        if self.coalesced_store and (not self.gluon or self.cluster_merge or self.tma_store):
            raise ValueError("coalesced_store is a mode of the gluon split kernels' output and partial stores: it needs "
                             "gluon=True and does not go with cluster_merge or tma_store")
        if self.gluon and ((self.block_m, self.num_warps) != (64, 8)
                           or (self.block_n, self.num_stages) not in ((64, 2), (32, 4))):
            raise ValueError(f"gluon needs block_m=64, num_warps=8 and 64-token tiles in 2 buffers or 32-token tiles "
                             f"in 4 (num_stages; the tiles workbench.mla_gluon has), got {self.block_m}x"
                             f"{self.block_n} w{self.num_warps} s{self.num_stages}")
        if self.gluon and (self.balanced or self.fused_merge or self.meta_before_wait or self.idx_ahead
                           or self.warp_specialize or self.swap_ab or self.prefetch):
            raise ValueError("gluon replaces the Triton split kernel: balanced, fused_merge, meta_before_wait, "
                             "idx_ahead, warp_specialize, swap_ab and prefetch do not apply to it")
        if self.spin_merge and (self.gluon or self.balanced or self.fused_merge or self.meta_before_wait):
            raise ValueError("spin_merge is a mode of the Triton split kernel's second-kernel merge: it does not go "
                             "with gluon, balanced, fused_merge or meta_before_wait (its early trigger comes right "
                             "after the split kernel's PDL wait, which meta_before_wait moves)")
        if self.cluster_merge and not self.gluon:
            raise ValueError("cluster_merge is a mode of the gluon split kernel; it needs gluon=True")
        if self.merge_warps not in (None, 1, 2, 4, 8):
            raise ValueError(f"merge_warps is {self.merge_warps}; it must be 1, 2, 4 or 8")
        if self.narrow_partials and (self.balanced or self.tma_store):
            raise ValueError("narrow_partials does not go with balanced (its partials are fp32) or tma_store (its "
                             "descriptor is fp32)")
        if self.split_merge and (self.gluon or self.balanced or self.fused_merge or self.spin_merge or self.tma_store):
            raise ValueError("split_merge is a mode of the Triton split kernel: it does not go with gluon, balanced, "
                             "fused_merge, spin_merge or tma_store")
        if self.tma_store and (self.gluon_ws or self.balanced or self.fused_merge or self.spin_merge):
            raise ValueError("tma_store is a mode of the gluon split kernel and of the Triton split kernel with the "
                             "second-kernel merge: it does not go with gluon_ws, balanced, fused_merge or spin_merge")
        if self.ws_handoff and not (self.gluon_ws and self.coalesced_store):
            raise ValueError("ws_handoff is a schedule of the warp-specialised gluon kernel with the coalesced store: it "
                             "needs gluon_ws=True and coalesced_store=True")
        if (self.ws_idx_ahead or self.ws_early_q) and not self.ws_handoff:
            raise ValueError("ws_idx_ahead and ws_early_q are modes of the hand-over schedule: they need "
                             "ws_handoff=True")
        if self.ws_split_merge and not self.ws_idx_ahead:
            raise ValueError("ws_split_merge is written for the warp-specialised kernel's idx-ahead loader: it needs "
                             "ws_idx_ahead=True (and so ws_handoff, gluon_ws and coalesced_store)")
        if self.gluon_ws and (not self.gluon or self.cluster_merge or self.block_n != 64):
            raise ValueError("gluon_ws replaces the gluon split kernel: it needs gluon=True, no cluster_merge and the "
                             "64-token config (it has its own 32-token tiles and four buffers)")
        if self.warp_specialize and (self.block_m < 64 or self.num_warps != 8):
            raise ValueError(f"warp_specialize needs block_m >= 64 and num_warps == 8, got block_m {self.block_m} "
                             f"and num_warps {self.num_warps}: Triton 3.6's warp-specialisation pass compiled only "
                             "those on an H200 (the 16-row mma.sync tiles and 64-row tiles on 4 warps failed)")
        if self.idx_dist not in (1, 2, 3) or (self.idx_dist > 1 and not self.idx_ahead):
            raise ValueError(f"idx_dist is {self.idx_dist}; it must be 1, 2 or 3, and above 1 only with "
                             "idx_ahead=True")
        if self.idx_prefetch not in (0, 1, 2) or (self.idx_prefetch and not self.idx_ahead):
            raise ValueError(f"idx_prefetch is {self.idx_prefetch}; it must be 0 (off), 1 (L1) or 2 (L2), and "
                             "non-zero only with idx_ahead=True")
        if self.meta_before_wait and not self.pdl_split:
            raise ValueError("meta_before_wait moves reads before the PDL wait of pdl_split; it needs pdl_split=True")
        if self.l2_ahead < 0 or (self.l2_ahead and not self.idx_ahead):
            raise ValueError(f"l2_ahead is {self.l2_ahead}; it must be >= 0, and > 0 only with idx_ahead=True "
                             "(the prefetch reads indices loaded ahead by that loop)")
        if self.max_regs is not None:
            need = self.block_m * KV_LORA_RANK // (32 * self.num_warps) + 32
            if not 32 <= self.max_regs <= 255 or self.max_regs < need:
                raise ValueError(
                    f"max_regs is {self.max_regs}; it must be in 32..255 and leave room for the fp32 accumulator: "
                    f"block_m * 512 / (32 * num_warps) + 32 = {need} registers per thread for a {self.block_m}-row "
                    f"tile on {self.num_warps} warps")

    def merge_tile(self, total_rows: int, num_splits: int = 1) -> tuple[int, int]:
        """(rows, columns) per program of the second-kernel merge of ``num_splits`` partials of ``total_rows``
        folded rows: the configured ones, else (round 30, ``scripts/merge_only_sweep.py``) one-warp programs of 8
        rows (:meth:`merge_num_warps`) and the widest of 128, 64 or 32 columns that keeps at most 128 partial
        values per thread (the split chunk loaded at once x 8 x columns / 32) and still makes at least 512
        programs. On the H200 the merge alone then took 3.9 us at B=16 L=4k qlen 4 (1024 rows, 8 splits: 8x64)
        against 7.0 with round 25's 16x16 tile on 4 warps, 2.3 against 2.9 at qlen 1 (256 rows: 8x32), 2.9
        against 4.4 at qlen 2 and 2.9 against 4.1 at B=128 L=8k (2048 rows, 2 splits: 8x128); a warp sums its
        splits in registers and shuffles instead of through shared memory and a barrier. At most 64 rows (one
        or a few requests, many splits) the 8x16 tile of round 19 stays, on 4 warps."""
        if total_rows <= 64:
            auto = (8, 16)
        else:
            chunk = min(triton.next_power_of_2(max(num_splits, 1)), self.merge_split_chunk)
            auto = (8, 32)
            for cols in (128, 64):
                if chunk * 8 * cols <= 128 * 32 and triton.cdiv(total_rows, 8) * (KV_LORA_RANK // cols) >= 512:
                    auto = (8, cols)
                    break
        return (self.merge_block_r or auto[0], self.merge_block_d or auto[1])

    def merge_num_warps(self, total_rows: int) -> int:
        """Warps per program of the second-kernel merge: ``merge_warps`` if set; else one above 64 rows with the
        automatic tile (:meth:`merge_tile`), four with a configured tile or at most 64 rows."""
        if self.merge_warps is not None:
            return self.merge_warps
        return 1 if total_rows > 64 and self.merge_block_r is None and self.merge_block_d is None else 4

    def launch_options(self) -> dict[str, Any]:
        """Triton launch keywords of the split kernel."""
        opts: dict[str, Any] = dict(num_warps=self.num_warps, num_stages=self.num_stages)
        if self.max_regs is not None and not device.interpreter_active() and torch.version.hip is None:
            opts["maxnreg"] = self.max_regs
        return opts

    @property
    def key(self) -> tuple:
        """What selects a compiled split kernel (its resources are recorded under this key)."""
        return (self.block_m, self.block_n, self.num_warps, self.num_stages, self.swap_ab, self.prefetch,
                self.balanced, self.max_regs, self.warp_specialize, self.idx_ahead, self.pdl, self.l2_ahead,
                self.pdl_split, self.idx_dist, self.idx_prefetch, self.meta_before_wait, self.gluon,
                self.cluster_merge, self.gluon_ws, self.spin_merge, self.tma_store, self.split_merge,
                self.narrow_partials, self.coalesced_store, self.prefetch_before_wait, self.gluon_swap, self.ws_handoff,
                self.ws_idx_ahead, self.ws_early_q, self.ws_split_merge)

    @property
    def label(self) -> str:
        return (("gluon " if self.gluon else "") + ("gswap " if self.gluon_swap else "")
                + ("bal " if self.balanced else "") + ("swap " if self.swap_ab else "")
                + ("pf " if self.prefetch else "")
                + f"{self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}"
                + (f" r{self.max_regs}" if self.max_regs else "") + (" ws" if self.warp_specialize else "") + (" ia" if self.idx_ahead else "") + (str(self.idx_dist) if self.idx_dist > 1 else "")
                + (f" ip{self.idx_prefetch}" if self.idx_prefetch else "")
                + (f" l2+{self.l2_ahead}" if self.l2_ahead else "") + (" pdl" if self.pdl else "")
                + (" pdls" if self.pdl_split else "") + (" mbw" if self.meta_before_wait else "")
                + (" cm" if self.cluster_merge else "") + (" ws" if self.gluon_ws else "")
                + (" spin" if self.spin_merge else "") + (" tma" if self.tma_store else "")
                + (" sm" if self.split_merge else "") + (" np" if self.narrow_partials else "")
                + (" cst" if self.coalesced_store else "") + (" ho" if self.ws_handoff else "")
                + (" wia" if self.ws_idx_ahead else "") + (" weq" if self.ws_early_q else "")
                + (" wsm" if self.ws_split_merge else "")
                + (f" pbw{self.prefetch_before_wait}" if self.prefetch_before_wait else ""))

    def resident_per_sm(self) -> int:
        """Programs that fit on one SM at once: ``programs_per_sm`` if set; else from the registers and
        shared memory of this config's compiled kernel once one was compiled in this process; else an
        estimate (shared memory: the q tile and one KV tile; registers: the fp32 accumulator + 96)."""
        if self.programs_per_sm is not None:
            return self.programs_per_sm
        seen = _RESOURCES.get(self.key)
        if seen is not None:
            regs_per_thread, smem = seen
        else:
            smem = (self.block_m + self.block_n) * QK_HEAD_DIM * 2
            regs_per_thread = self.block_m * KV_LORA_RANK // (32 * self.num_warps) + 96
        threads = 32 * self.num_warps
        return max(1, min(device.HOPPER_SHARED_MEMORY // max(smem, 1), 65_536 // max(regs_per_thread * threads, 1), 2048 // threads))


_RESOURCES: dict[tuple, tuple[int, int]] = {}  # config -> (registers/thread, shared bytes)
RESOURCE_LABELS: dict[tuple, str] = {}  # config key -> its label (the whole config, for reports)


def _record_resources(config: TritonConfig, compiled: Any) -> None:
    """Remember the compiled kernel's registers and shared memory (GPU only; the interpreter has none)."""
    n_regs = getattr(compiled, "n_regs", None)
    smem = getattr(getattr(compiled, "metadata", None), "shared", None)
    if isinstance(n_regs, int) and isinstance(smem, int) and n_regs > 0:
        key = config.key
        old = _RESOURCES.get(key, (0, 0))
        _RESOURCES[key] = (max(old[0], n_regs), max(old[1], smem))
        RESOURCE_LABELS[key] = config.label


_COUNTERS: dict[torch.device, torch.Tensor] = {}
LAST_COMPILED: dict[str, Any] = {}  # the last compiled split kernel (registers, spills, shared memory, PTX)


def compiled_kernel_report() -> dict[str, Any]:
    """Resource use of the last compiled split kernel (GPU only): registers, spills, shared memory, and
    which matrix instructions its PTX uses (``wgmma`` is Hopper's; ``mma.sync`` the older path)."""
    k = LAST_COMPILED.get("split")
    if k is None or not hasattr(k, "asm"):
        return {}
    ptx = k.asm.get("ptx", "")
    return {"n_regs": getattr(k, "n_regs", None), "n_spills": getattr(k, "n_spills", None),
            "shared_bytes": getattr(k.metadata, "shared", None), "wgmma": "wgmma" in ptx,
            "mma_sync": "mma.sync" in ptx, "cp_async": "cp.async" in ptx}


def _counter_workspace(dev: torch.device, n: int) -> torch.Tensor:
    """A zeroed int32 buffer of at least ``n`` ticket counters, kept per device (the kernel leaves it
    zeroed after each launch, so it can be reused by the next launch and inside CUDA graphs)."""
    buf = _COUNTERS.get(dev)
    if buf is None or buf.numel() < n:
        if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the counter workspace of the fused and spin merges must be allocated before "
                               "CUDA-graph capture: run the same call once eagerly first")
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=dev)
        _COUNTERS[dev] = buf
    return buf


SMALL_BATCH_TOKENS = 262_144  # at most this many KV tokens in a call: the one-program-per-SM configs


ROCM_LDS_BYTES = 65_536  # shared memory (LDS) per workgroup on CDNA3 (MI300X, gfx942) and CDNA2 (gfx90a)


def rocm_triton_config(rows_per_req: int, dtype: torch.dtype) -> TritonConfig:
    """Launch parameters for Triton's AMD backend, chosen to fit, not measured (there is no ROCm GPU here).

    The NVIDIA tiles need up to 221 KB of shared memory; an MI300X workgroup has 64 KB of LDS, and Triton
    cannot launch a kernel that asks for more. These tiles compile for ``gfx942`` within 64 KB and without
    scratch (spills), as ``workbench.codegen.amd_kernel_report`` shows and ``tests/test_codegen.py`` checks
    on every CI run: 16-bit up to 16 rows ``16x16 w4 s2`` (18 KB), up to 32 rows ``32x16 w4 s2`` (32 KB), more
    ``64x16 w4 s2`` (64 KB); fp32 ``16x16 w4 s2`` (37 KB) or ``32x16 w4 s2`` (64 KB; fp32 tiles of 64 rows do
    not fit). No PDL (NVIDIA only). Their speed on ROCm is unmeasured. The 16-bit 16-row tile was first
    ``16x32 w4 s2`` (36 KB): no scratch with Triton 3.7.1, but 12 bytes of it with Triton 3.6.0 (its 256 VGPRs
    full), found when the CI check ran on the GPU machine's Triton; ``16x16 w4 s2`` has none with either."""
    if dtype.itemsize > 2:
        if rows_per_req <= 16:
            return TritonConfig(block_m=16, block_n=16, num_warps=4, num_stages=2, programs_per_sm=1)
        return TritonConfig(block_m=32, block_n=16, num_warps=4, num_stages=2, programs_per_sm=1)
    if rows_per_req <= 16:
        return TritonConfig(block_m=16, block_n=16, num_warps=4, num_stages=2, programs_per_sm=1)
    if rows_per_req <= 32:
        return TritonConfig(block_m=32, block_n=16, num_warps=4, num_stages=2, programs_per_sm=2)
    return TritonConfig(block_m=64, block_n=16, num_warps=4, num_stages=2, programs_per_sm=1)


# The gluon split kernel PDL-launched (pdl_split, round 21: 0.6-4.9 % faster at every compute-bound bar point, e.g.
# B=16 L=4k qlen 4 44.7 against 47.0 us); the in-cluster merge (cluster_merge) stays opt-in: it helped only
# where every cluster fits at once (B=64 L=4k qlen 4, 2 splits: 107.0 against 109.0 us), and it launches
# through Triton's packed launch metadata, an internal.
# Round 32 (eleventh session): 16-bit partials stored row-major (narrow_partials + coalesced_store): the partial of
# a 64-row program is 64 KB instead of 128 KB and leaves in 16-byte vectors instead of 4- or 8-byte stores from the
# wgmma accumulator layout (scripts/decode_coalesced_store_probe.py, two H200s, three rounds each): B=16 L=4k
# qlen 4 34.4-36.2 against 37.7-41.6 us, 128 heads B=8 L=4k 33.0-36.7 against 36.5-39.5, B=32 L=1k qlen 4
# 22.1-23.5 against 26.2-27.3, and on the warp-specialised kernel qlen 8 B=16 L=4k 53.5-53.8 against 59.1-63.5;
# within run-to-run noise at the long calls (one split, or two splits of 16k tokens). Either switch alone was
# not faster (16-bit partials alone 2-3 us slower: their 4-byte stores).
GLUON_CONFIG = TritonConfig(block_m=64, block_n=64, num_warps=8, num_stages=2, programs_per_sm=1, pdl=True,
                            pdl_split=True, gluon=True, narrow_partials=True, coalesced_store=True)


# At most 32 rows (16 heads x qlen 1 or 2), 16-bit, on Hopper: the swapped gluon kernel (workbench.mla_gluon_swap,
# thirteenth session, scripts/decode_gluon_swap_probe.py, three rounds on an H200): tokens as wgmma's M, the query and
# each tile read from shared memory once per tile. Faster than the defaults before it at all 16 points measured:
# qlen 1 B=16 L=4k 28.2-28.8 against 30.6-31.2 us, B=1 L=32k 21.6-21.7 against 26.9-27.4, B=64 L=32k 573-578
# against 595-601, B=128 L=8k 291-292 against 305-311; qlen 2 (against GLUON_WS_CONFIG) B=16 L=4k 30.3-30.5 against
# 34.6-35.0. 16-bit partials; block_m 32 for 17-32 rows (gluon_swap_config).
GLUON_SWAP_CONFIG = TritonConfig(block_m=16, block_n=64, num_warps=4, num_stages=2, programs_per_sm=1, pdl=True,
                                 pdl_split=True, narrow_partials=True, gluon_swap=True)


def gluon_swap_config(rows_per_req: int) -> TritonConfig:
    """:data:`GLUON_SWAP_CONFIG` with the row block that holds ``rows_per_req`` folded rows: 16 up to 16 rows, 32
    up to 32 (more rows: the 64-row gluon kernels, where the query is as large as a tile)."""
    if not 1 <= rows_per_req <= 32:
        raise ValueError(f"rows_per_req is {rows_per_req}; the swapped gluon kernel takes 1 to 32 rows per request")
    return GLUON_SWAP_CONFIG if rows_per_req <= 16 else dataclasses.replace(GLUON_SWAP_CONFIG, block_m=32)


# The warp-specialised gluon kernel (workbench.mla_gluon_ws) for calls whose programs each take at least
# GLUON_WS_MIN_TOKENS KV tokens (round 23, 53 points on a second H200, two rounds each: 5-12 % faster at every
# point with >= 2048 tokens per program, within 1 % or faster at 1024; at 512 and 256 mixed, up to 9 % slower,
# e.g. B=16 L=4k qlen 4 with 8 splits 46.2 against 45.4 us, and B=32 L=1k qlen 4 35.7 against 32.9). Its
# programs have fixed costs (the loader's start, the warpgroups' hand-overs) that short programs do not repay.
# Round 38 (fourteenth session): the hand-over schedule (ws_handoff), 3-10 % faster than the first schedule at 9 of
# 10 compute-bound points over three rounds (scripts/decode_ws_handoff_probe.py), e.g. 16 heads qlen 8 B=128 L=8k
# 627-641 against 695-701 us, 128 heads B=16 L=4k 49.8-52.1 against 53.2-55.6; the tenth, B=64 L=4k qlen 4, level.
GLUON_WS_CONFIG = dataclasses.replace(GLUON_CONFIG, gluon_ws=True, ws_handoff=True)
# With the hand-over schedule the rule was measured again (scripts/decode_ws_min_tokens_probe.py, 44 points, two
# rounds): with one 64-row block per request (33-64 rows) the ws kernel still wins only from 1024 tokens per program
# (3-9 %; at 128-512 within -4..+2 %, at 64 up to 9 % slower); with two or more (128 heads, qlen 8 at 16 heads) it
# wins from 128 tokens (7-19 % at 256-2048, e.g. 128 heads B=16 L=1k 20.4-20.6 against 22.5-23.1 us; 1-3 % at 128;
# 2-9 % slower at 64).
# Round 39 (fifteenth session): the ws kernel's loader loading each tile's indices one tile ahead (ws_idx_ahead;
# scripts/decode_ws_loader_probe.py). With one row block per request (26 of its 31 points, three rounds) it was
# 2-7 % faster than the committed loader at 16 points (median of the rounds), e.g. B=16 L=4k qlen 4 34.6-34.7
# against 35.3-35.4 us and B=64 L=32k 639-655 against 693-702, within 1 % at 9 (the smallest calls), and 6 %
# slower at B=128 L=8k qlen 4, whose times scattered for every variant (level in the two repeats, round39_focus and
# round39_focus_b); and so the ws kernel wins over the plain one from 128 tokens per program there too (1-6 % at
# 128-512, e.g. B=16 L=4k qlen 4 34.6-34.7 against 36.1-36.4; at 64 from 3 % faster to 8 % slower). With two or
# more row blocks ('multi', 51 points, three rounds) it was faster or level at every point of at most 2048 tokens
# per program (median ratio 0.91-1.01, e.g. 128 heads B=128 L=1k 95.1-98.1 against 104.3-105.2
# us, 16 heads qlen 8 B=16 L=4k 48.5-51.0 against 49.9-52.2) and 1-4 % slower at three of the nine points of
# 4096 (128 heads B=64 L=4k 170.2-172.9 against 161.7-167.5), so there it stops at GLUON_WS_IDX_AHEAD_MAX_TOKENS.
GLUON_WS_IDX_AHEAD_CONFIG = dataclasses.replace(GLUON_WS_CONFIG, ws_idx_ahead=True)
GLUON_WS_IDX_AHEAD_MAX_TOKENS = 2048  # two or more row blocks: GLUON_WS_IDX_AHEAD_CONFIG up to this many per program
GLUON_WS_MIN_TOKENS = 128  # one 64-row block per request (1024 before round 39)
GLUON_WS_MIN_TOKENS_MULTI = 128  # the same with two or more 64-row blocks per request


def prefer_gluon_ws(total_tokens: int, num_reqs: int, row_blocks: int, sm_count: int) -> bool:
    """Whether a gluon call of ``num_reqs`` requests, ``total_tokens`` KV tokens (an upper bound is fine) and
    ``row_blocks`` 64-row blocks per request runs the warp-specialised kernel: its programs (at the split
    count :data:`GLUON_CONFIG` gets, which :data:`GLUON_WS_CONFIG` shares) each take at least
    :data:`GLUON_WS_MIN_TOKENS` tokens on average, or :data:`GLUON_WS_MIN_TOKENS_MULTI` with two or more row
    blocks per request (:func:`gluon_ws_config` is not None)."""
    return gluon_ws_config(total_tokens, num_reqs, row_blocks, sm_count) is not None


def gluon_tokens_per_program(total_tokens: int, num_reqs: int, row_blocks: int, sm_count: int) -> float:
    """KV tokens per program, on average, of a gluon call at the split count :data:`GLUON_CONFIG` gets (which
    every gluon 64-row config shares)."""
    return total_tokens / (num_reqs * default_splits(GLUON_CONFIG, num_reqs, row_blocks, total_tokens, sm_count))


def gluon_ws_config(total_tokens: int, num_reqs: int, row_blocks: int, sm_count: int) -> TritonConfig | None:
    """The warp-specialised config a gluon call runs (arguments as for :func:`prefer_gluon_ws`), or None where its
    programs are too short for it and the plain kernel runs: :data:`GLUON_WS_IDX_AHEAD_CONFIG` with one row block
    per request, or with more and at most :data:`GLUON_WS_IDX_AHEAD_MAX_TOKENS` tokens per program; else
    :data:`GLUON_WS_CONFIG` (round 39)."""
    if num_reqs <= 0 or total_tokens <= 0:
        return None
    per_program = gluon_tokens_per_program(total_tokens, num_reqs, row_blocks, sm_count)
    if per_program < (GLUON_WS_MIN_TOKENS_MULTI if row_blocks >= 2 else GLUON_WS_MIN_TOKENS):
        return None
    if row_blocks == 1 or per_program <= GLUON_WS_IDX_AHEAD_MAX_TOKENS:
        return GLUON_WS_IDX_AHEAD_CONFIG
    return GLUON_WS_CONFIG


GLUON_MIN_TRITON = (3, 6)  # Gluon is experimental; the kernel ran with 3.6 (H200) and compiles with 3.7 (CI)


def gluon_available() -> bool:
    """The gluon split kernels can run here: compiled Triton of version :data:`GLUON_MIN_TRITON` or newer (older
    Gluon APIs differ) on an NVIDIA Hopper GPU (compute capability 9.x; :func:`workbench.device.hopper`: they are
    written with ``wgmma``, which Blackwell does not have, so a B200 gets the Triton kernels)."""
    try:
        version = tuple(int(x) for x in triton.__version__.split(".")[:2])
    except ValueError:
        return False
    return version >= GLUON_MIN_TRITON and torch.cuda.is_available() and device.hopper(torch.device("cuda"))


def triton_config(rows_per_req: int, dtype: torch.dtype, total_tokens: int | None = None, *,
                  backend: str | None = None, gluon: bool | None = None, num_reqs: int | None = None,
                  sm_count: int | None = None) -> TritonConfig:
    """The launch parameters used for ``rows_per_req = max_qo_len * H`` folded rows and a batch of
    ``total_tokens`` KV tokens (an upper bound is fine, such as ``kv_indices.numel()``; None: a large batch).
    ``backend``: ``"cuda"`` or ``"hip"`` (default: the one this torch was built for); ROCm gets
    :func:`rocm_triton_config`, whose tiles fit a 64 KB LDS. ``num_reqs`` (with ``total_tokens``) and
    ``sm_count`` (default: the current CUDA device's) select between the two gluon kernels.

    Under the interpreter: the smallest legal tiles (``tl.dot`` needs 16 in every dimension).
    On a GPU: the configs the focused sweeps of ``workbench.bench.decode.explore`` chose on an H200
    (tables under ``explore`` in src/workbench/data/bench_decode_h200.json). Up to 32 rows they load the
    next tile's indices one tile ahead (``idx_ahead``): without it Triton 3.6 gave the row gather a single
    shared-memory buffer (the gather of tile i+1 waited on its index load and was issued only after tile i was
    computed), with it the gather is double-buffered (round 8, +6 % bandwidth at B=64 L=32k).

    * up to 32 rows (16 heads x qlen 1 or 2) on an NVIDIA Hopper GPU (compute capability 9.x; ``gluon``, None: when
      one is present), 16-bit: :func:`gluon_swap_config`, the swapped split kernel of
      :mod:`workbench.mla_gluon_swap` (thirteenth session, ``scripts/decode_gluon_swap_probe.py``, 16 points,
      three rounds: faster at every one, e.g. qlen 1 B=16 L=4k 28.2-28.8 against 30.6-31.2 us, B=64 L=32k
      573-578 against 595-601, qlen 2 B=16 L=4k 30.3-30.5 against 34.6-35.0); elsewhere (``gluon=False``, ROCm,
      older Triton) the Triton tiles of the next three items;
    * up to 16 rows (16 heads x qlen 1, memory-bound): 16-row x 32-token tiles, 4 warps, 3 stages, two
      programs per SM; for small batches (at most ``SMALL_BATCH_TOKENS`` tokens) 16x64 tiles on 8 warps,
      3 stages, one program per SM, whose shorter programs finish sooner (rounds 9-10), with 16-bit partials
      (``narrow_partials``; twelfth session, ``scripts/decode_small_narrow_probe.py``, 11 points, three rounds:
      0.4-0.8 us faster at B=1 (at L=8k in two rounds of three), 0.5-1.2 at B=16 L=1k, 0.6 at B=32 L=1k, level
      at B=16 L=4k and L=8k, 0.3-0.5 us slower at B=64 L=4k of 91-94; the large-batch tile lost with them in
      round 29, so it keeps fp32);
    * up to 32 rows: the same with 32-row tiles (32x32 w4 s3; small batches 32x64 w8 s3). (From round 31 to the
      twelfth session 17-32 rows on Hopper took :data:`GLUON_WS_CONFIG`, whose half-empty 64-row programs were
      10-25 % faster than these tiles, ``scripts/decode_gluon_qlen2_probe.py``; the swapped kernel replaced it.)
    * more rows on an NVIDIA Hopper GPU (``gluon``), 16-bit:
      :data:`GLUON_CONFIG`, the split kernel of :mod:`workbench.mla_gluon` (round 20: 128 heads B=64 L=4k
      198 against 318 us; qlen 4 and 8 at 16 heads 1.2-1.6x faster than the Triton tile below), PDL-launched
      (round 21); when ``num_reqs`` is given and its programs take at least :data:`GLUON_WS_MIN_TOKENS` tokens
      each (:data:`GLUON_WS_MIN_TOKENS_MULTI` with two or more 64-row blocks per request), :data:`GLUON_WS_CONFIG`,
      the warp-specialised kernel of :mod:`workbench.mla_gluon_ws` with its hand-over schedule (rounds 23 and 38,
      :func:`prefer_gluon_ws`), or :data:`GLUON_WS_IDX_AHEAD_CONFIG`, whose loader loads the indices one tile
      ahead, with one row block per request or programs of at most :data:`GLUON_WS_IDX_AHEAD_MAX_TOKENS` tokens
      (round 39, :func:`gluon_ws_config`); all with 16-bit partials stored row-major
      (``narrow_partials`` + ``coalesced_store``, round 32: B=16 L=4k qlen 4 37.7-41.6 -> 34.4-36.2 us);
    * more rows otherwise (qlen >= 4 at 16 heads, 128 heads; compute-bound): 64-row tiles on Hopper's ``wgmma``,
      8 warps, 3 stages (indices prefetched by Triton's pipeliner at 3 stages): 20-30 % faster than 32-row
      tiles; ``idx_ahead`` there (which needs 2 stages to fit) was mixed in rounds 8-9: 3-4 % faster at 128
      heads, about 3 % slower at qlen 8, so it stays off.

    fp32 inputs (for exactness checks) get 32-token tiles of at most 32 rows, which fit in shared memory.

    The second-kernel merge is launched with programmatic dependent launch on sm90+ (``pdl``), which
    overlaps its launch with the split kernel's tail; so is the split kernel (``pdl_split``): it waits
    (griddepcontrol.wait) before its first read, so only its launch overlaps the kernel before it, and the
    merge releases the next kernel early (round 15: -1 us at B=16 L=4k, neutral elsewhere). Not on by
    default: ``meta_before_wait`` (round 18: a further -0.9 us there), which reads the indptrs and the first
    indices before that wait and so needs them written before the kernel that precedes the call. The merge's
    tile follows the call's row count (:meth:`TritonConfig.merge_tile`, round 19). The other switches of
    :class:`TritonConfig` (``swap_ab``, ``prefetch``, ``balanced``, ``max_regs``, ``warp_specialize``) are the
    designs of rounds 3-7 of those sweeps, and ``spin_merge`` that of round 26: each is exact, none was faster on
    the H200 (chapter 3).

    Other NVIDIA GPUs (Ampere, Ada, Blackwell) get the Triton tiles above, which were tuned on an H200 and may ask
    for more shared memory than the GPU has (64x64 tiles need 345 KB on sm_100, the 16x64 small-batch tile 164 KB
    against an A100's 163 KB). :func:`mla_decode_triton` then steps down :func:`shared_memory_ladder` until the
    kernel fits (:data:`SHARED_MEMORY_FALLBACKS` remembers the step; the choice is not tuned there).
    """
    backend = backend or ("hip" if torch.version.hip is not None else "cuda")
    if backend not in ("cuda", "hip"):
        raise ValueError(f"backend must be 'cuda' or 'hip', got {backend!r}")
    if gluon is None:
        gluon = backend == "cuda" and gluon_available()
    if device.interpreter_active():
        return TritonConfig(block_m=16, block_n=16, num_warps=1, num_stages=1, split_overhead_tokens=16,
                            merge_overhead_tokens=8, programs_per_sm=1, max_splits=4, merge_block_r=16,
                            merge_block_d=KV_LORA_RANK)
    if backend == "hip":
        return rocm_triton_config(rows_per_req, dtype)
    if dtype.itemsize > 2:
        # fp32 (exactness checks, not speed): rows twice as wide in shared memory, so tiles that fit
        # 227 KB with the query tile and two KV buffers: 16 rows 184 KB, 32 rows 221 KB.
        return TritonConfig(block_m=16 if rows_per_req <= 16 else 32, block_n=32, num_warps=4, num_stages=3,
                            programs_per_sm=1, idx_ahead=True, pdl=True, pdl_split=True)
    small = total_tokens is not None and total_tokens <= SMALL_BATCH_TOKENS
    if gluon and rows_per_req <= 32:  # thirteenth session: faster than the tiles below at all 16 points measured
        return gluon_swap_config(rows_per_req)
    if rows_per_req <= 32:
        block_m = 16 if rows_per_req <= 16 else 32
        if small:  # 16 rows: 16-bit partials (twelfth session's small_narrow probe; 32 rows unmeasured)
            return TritonConfig(block_m=block_m, block_n=64, num_warps=8, num_stages=3, programs_per_sm=1,
                                idx_ahead=True, pdl=True, pdl_split=True, narrow_partials=block_m == 16)
        return TritonConfig(block_m=block_m, block_n=32, num_warps=4, num_stages=3, programs_per_sm=2,
                            idx_ahead=True, pdl=True, pdl_split=True)
    if gluon:
        if num_reqs is not None and total_tokens is not None:
            if sm_count is None and not torch.cuda.is_available():
                raise ValueError("triton_config(gluon=True, num_reqs=...) needs sm_count (the GPU's SM count) when no "
                                 "CUDA device is present to read it from")
            sms = sm_count if sm_count is not None else _sm_count(torch.device("cuda", torch.cuda.current_device()))
            ws = gluon_ws_config(total_tokens, num_reqs, -(-rows_per_req // GLUON_CONFIG.block_m), sms)
            if ws is not None:
                return ws
        return GLUON_CONFIG
    return TritonConfig(block_m=64, block_n=64, num_warps=8, num_stages=3, programs_per_sm=1, pdl=True,
                        pdl_split=True)


def _dot_precision(dtype: torch.dtype) -> str | None:
    """fp32 inputs are multiplied in full fp32 ("ieee"); Triton's default would round them to TF32 on
    NVIDIA (10-bit mantissa), which an fp32 caller would not expect. 16-bit inputs: the backend's default."""
    return "ieee" if dtype == torch.float32 else None


def _note_compiled(config: TritonConfig, compiled: Any) -> None:
    LAST_COMPILED["split"] = compiled
    if compiled is not None:
        _record_resources(config, compiled)


def _sm_count(dev: torch.device) -> int:
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).multi_processor_count
    return 4  # interpreter: a few splits, to exercise the merge


def choose_num_splits(num_reqs: int, row_blocks: int, avg_kv_len: float, config: TritonConfig,
                      sm_count: int) -> int:
    """KV splits per request, from a wave-quantisation cost model.

    With ``s`` splits there are ``P = num_reqs * row_blocks * s`` programs, run in
    ``ceil(P / (sm_count * resident_per_sm))`` waves, each program costing its ``ceil(L / s)`` tokens
    plus a fixed overhead; any ``s > 1`` adds the merge. Pick the ``s`` with the smallest
    ``waves * (ceil(L / s) + split_overhead) + merge(s)``: one full wave of long programs beats 1.1
    waves. The fused merge's cost grows with ``s`` (one program reads all partials of its rows).
    """
    slots = max(sm_count * config.resident_per_sm(), 1)
    programs = max(num_reqs * row_blocks, 1)
    length = max(avg_kv_len, 1.0)
    best, best_cost = 1, float("inf")
    for s in range(1, config.max_splits + 1):
        if s > 1 and length / s < 16:  # never split below one small tile
            break
        waves = math.ceil(programs * s / slots)
        cost = waves * (math.ceil(length / s) + config.split_overhead_tokens)
        cost += config.merge_overhead_tokens + config.merge_tokens_per_split * s if s > 1 else 0
        if cost < best_cost:
            best, best_cost = s, cost
    return best


def choose_balanced_programs(row_blocks: int, total_tokens: int, config: TritonConfig, sm_count: int) -> int:
    """Programs per row block of the balanced schedule: every resident slot of the GPU once, or fewer when
    the batch holds under ``config.min_tokens_per_program`` tokens per program (``total_tokens`` may be an
    upper bound, such as ``kv_indices.numel()``: it only sizes the grid)."""
    slots = max(sm_count * config.resident_per_sm() // max(row_blocks, 1), 1)
    return max(1, min(slots, -(-max(total_tokens, 1) // config.min_tokens_per_program)))


_BALANCED_MAX_BLOCK_B = 1024  # kv_indptr entries one vector load of the balanced kernel's request search reads


def default_splits(config: TritonConfig, num_reqs: int, row_blocks: int, total_tokens: int, sm_count: int) -> int:
    """The launch's split count when the caller gives none: :func:`choose_num_splits` per request, or for a
    ``balanced`` config the programs per row block (:func:`choose_balanced_programs`). ``total_tokens`` may
    be an upper bound such as ``kv_indices.numel()``."""
    if config.balanced:
        return choose_balanced_programs(row_blocks, total_tokens, config, sm_count)
    return choose_num_splits(num_reqs, row_blocks, total_tokens / max(num_reqs, 1), config, sm_count)


def _launch_balanced(q, cache, qo_indptr, kv_indptr, kv_indices, out, lse, max_qo_len, scale, cfg, programs):
    total_q, heads, _ = q.shape
    num_reqs = qo_indptr.numel() - 1
    rows_per_req = max_qo_len * heads
    row_blocks = triton.cdiv(rows_per_req, cfg.block_m)
    mid_o = torch.empty(programs + num_reqs, rows_per_req, KV_LORA_RANK, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(programs + num_reqs, rows_per_req, dtype=torch.float32, device=q.device)
    compiled = _mla_decode_balanced_kernel[(row_blocks, programs)](
        q, cache, kv_indices, qo_indptr, kv_indptr, out, lse, mid_o, mid_lse, cache.stride(0), scale * _LOG2E,
        num_reqs, programs, NUM_HEADS=heads, ROWS_PER_REQ=rows_per_req,
        BLOCK_B=min(triton.next_power_of_2(max(num_reqs, 16)), _BALANCED_MAX_BLOCK_B),
        DOT_PRECISION=_dot_precision(q.dtype),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, D_LATENT=KV_LORA_RANK, D_ROPE=QK_ROPE_HEAD_DIM,
        **cfg.launch_options())
    _note_compiled(cfg, compiled)
    chunk = cfg.merge_split_chunk
    br, bd = cfg.merge_tile(rows_per_req * num_reqs)
    _mla_decode_balanced_merge_kernel[(num_reqs, triton.cdiv(rows_per_req, br), KV_LORA_RANK // bd)](
        mid_o, mid_lse, out, lse, qo_indptr, kv_indptr, num_reqs, programs, NUM_HEADS=heads,
        ROWS_PER_REQ=rows_per_req, BLOCK_R=br, BLOCK_D=bd, SPLIT_CHUNK=chunk,
        D_LATENT=KV_LORA_RANK, num_warps=4 if not device.interpreter_active() else 1)


def shared_memory_ladder(cfg: TritonConfig) -> list[TritonConfig]:
    """Smaller launch configs of the Triton split kernel, in the order :func:`mla_decode_triton` falls back on
    them when ``cfg``'s kernel asks for more shared memory than the GPU gives one program (Triton raises
    ``OutOfResources`` when it loads the kernel, before anything runs): two pipeline stages; then a 32-token tile;
    then 32 rows (from 64); then the library's 16-row tile (16x32, 4 warps, 3 stages), and smaller. Every rung with
    two or more stages loads the next tile's indices one tile ahead (``idx_ahead``): without it Triton gives the
    row gather one buffer. The order is what an H200 measured for those tiles at the 64-row points
    (``scripts/decode_ladder_probe.py``, the committed JSON's ``explore["ladder_probe"]``; 128 heads B=64 L=4k:
    64x64 s2 306 us, 64x32 s2 433, 32x64 s2 537, 16x32 w4 s3 684, all with ``idx_ahead``, against 315 for the
    Hopper Triton default; a first ladder's 32x16 tile without ``idx_ahead`` took 1696). A GPU takes the first
    rung that fits, so a rung may ask for more shared memory than one after it. Each rung keeps ``cfg``'s other
    switches (a rung they do not allow is skipped) and estimates its residency (``programs_per_sm=None``). The
    gluon kernels have no ladder: they run on Hopper only, where the library's configs fit.
    """
    if cfg.gluon or cfg.gluon_swap:
        return []
    M, N, W, S = cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages
    shapes = [(M, N, W, 2)] if S > 2 else []
    if N > 32:
        shapes.append((M, 32, W, 2))
    if M > 32:
        shapes.append((32, N, W, 2))
    shapes += [(16, min(N, 32), 4, 3), (16, min(N, 32), 4, 2), (16, 16, 4, 2), (16, 16, 4, 1)]
    ahead = not (cfg.prefetch or cfg.balanced)  # the register double-buffering and the balanced kernel have none
    rungs: list[TritonConfig] = []
    seen = {(M, N, W, S)}
    for m, n, w, st in shapes:
        if (m, n, w, st) in seen or m > M or n > N or st > S or (m, n, st) == (M, N, S):  # smaller tiles only
            continue
        seen.add((m, n, w, st))
        try:
            rungs.append(dataclasses.replace(cfg, block_m=m, block_n=n, num_warps=w, num_stages=st,
                                             idx_ahead=cfg.idx_ahead or (ahead and st > 1), programs_per_sm=None))
        except ValueError:  # a switch of cfg that this shape does not allow (e.g. warp_specialize below 64 rows)
            continue
    return rungs


SHARED_MEMORY_FALLBACKS: dict[tuple[int, tuple], TritonConfig] = {}  # (CUDA device, chosen config's key) -> the rung
#                                                                        that fitted there (the chosen one did not)


def _fall_back(err: Exception, cfg: TritonConfig, chosen: TritonConfig, explicit: bool,
               dev: torch.device) -> TritonConfig:
    """The next config after ``cfg`` ran out of shared memory (``err``: Triton's ``OutOfResources``), or a
    ValueError for a config the caller gave."""
    required, limit = getattr(err, "required", "?"), getattr(err, "limit", "?")
    if explicit:
        raise ValueError(f"config {cfg.label!r}: its split kernel needs {required} bytes of shared memory and this GPU "
                         f"gives a program {limit}; pass a config with fewer num_stages or a smaller block_n or "
                         f"block_m, or config=None (the library then steps down until one fits)") from err
    ladder = shared_memory_ladder(chosen)  # walked in its order, from the rung after cfg
    rest = ladder[ladder.index(cfg) + 1:] if cfg in ladder else ladder
    if not rest:
        raise RuntimeError(f"the decode config {cfg.label!r} needs {required} bytes of shared memory, this GPU gives "
                           f"a program {limit}, and no smaller config is left to try") from err
    nxt = rest[0]
    SHARED_MEMORY_FALLBACKS[(dev.index or 0, chosen.key)] = nxt
    warnings.warn(f"MLA decode: the config {cfg.label!r} (tuned on an H200) needs {required} bytes of shared memory "
                  f"and this GPU gives a program {limit}; trying {nxt.label!r} (not tuned for this GPU)",
                  RuntimeWarning, stacklevel=3)
    return nxt


def _is_shared_memory_error(err: Exception) -> bool:
    return type(err).__name__ == "OutOfResources" and getattr(err, "name", "") == "shared memory"


def mla_decode_triton(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                      kv_indices: torch.Tensor, max_qo_len: int, sm_scale: float | None = None, *,
                      num_splits: int | None = None, config: TritonConfig | None = None,
                      out: torch.Tensor | None = None,
                      trace: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton MLA decode over flat token indices (no host sync: CUDA-graph capturable).

    Inputs as :func:`mla_decode_ref` (``q`` ``(total_q, H, 576)`` fp16/bf16/fp32, same dtype as the
    cache); ``max_qo_len`` is the longest query (host int, <= 16); requests may differ in query length.
    Only cheap checks run here (shapes, dtypes, devices); :func:`mla_decode` validates values.

    ``trace``: buffers from :func:`trace_buffers` (compiled NVIDIA only), into which every program writes
    %globaltimer stamps (entry, after the PDL wait, after each tile of the default and ``idx_ahead`` loops,
    exit): where the time of a call goes (``workbench.bench.decode.trace_point``). The stamps cost a few
    stores per tile; the results are unchanged.

    Returns:
        ``out`` ``(total_q, H, 512)`` in ``q.dtype`` and ``lse`` ``(total_q, H) float32``.
    """
    cache = _flat_cache(kv_cache)
    _check_kernel_args(q, cache, qo_indptr, kv_indptr, kv_indices, max_qo_len)
    total_q, heads, _ = q.shape
    num_reqs = qo_indptr.numel() - 1
    if out is None:
        out = torch.empty(total_q, heads, KV_LORA_RANK, dtype=q.dtype, device=q.device)
    lse = torch.empty(total_q, heads, dtype=torch.float32, device=q.device)
    if total_q == 0 or num_reqs == 0:
        return out, lse
    cfg, splits = triton_launch_plan(q, qo_indptr, kv_indices, max_qo_len, config=config, num_splits=num_splits)
    chosen = cfg
    scale = default_sm_scale() if sm_scale is None else float(sm_scale)
    while True:
        try:
            _launch_triton(q, cache, qo_indptr, kv_indptr, kv_indices, out, lse, max_qo_len, scale, cfg, splits, trace)
            return out, lse
        except Exception as err:  # noqa: BLE001 - only Triton's shared-memory OutOfResources is handled
            if not _is_shared_memory_error(err):
                raise
            # raised when the kernel is loaded, before it runs: nothing was written, the call starts again
            cfg, splits = triton_launch_plan(q, qo_indptr, kv_indices, max_qo_len, num_splits=num_splits,
                                             config=_fall_back(err, cfg, chosen, config is not None, q.device))


def _launch_triton(q, cache, qo_indptr, kv_indptr, kv_indices, out, lse, max_qo_len, scale, cfg, num_splits,
                   trace) -> None:
    """:func:`mla_decode_triton`'s launches for one config and split count (the outputs already allocated)."""
    total_q, heads, _ = q.shape
    num_reqs = qo_indptr.numel() - 1
    row_blocks = triton.cdiv(max_qo_len * heads, cfg.block_m)
    if trace is not None and (cfg.balanced or cfg.warp_specialize):
        raise ValueError(f"trace is not available for config {cfg.label!r}: the balanced kernels and Triton's "
                         "warp-specialised loop are not instrumented")
    if cfg.balanced:  # num_splits is the number of programs per row block
        _launch_balanced(q, cache, qo_indptr, kv_indptr, kv_indices, out, lse, max_qo_len, scale, cfg, num_splits)
        return
    if cfg.gluon:
        if trace is not None:
            raise ValueError("trace is not available for the gluon split kernel (it is not instrumented)")
        _launch_gluon(q, cache, qo_indptr, kv_indptr, kv_indices, out, lse, scale, cfg, num_splits, row_blocks)
        return
    if cfg.gluon_swap:
        if trace is not None:
            _check_trace(trace, q.device, *_trace_programs(cfg, row_blocks, num_splits, num_reqs, total_q * heads))
        _launch_gluon_swap(q, cache, qo_indptr, kv_indptr, kv_indices, out, lse, scale, cfg, num_splits, row_blocks,
                           trace)
        return
    total_rows = total_q * heads
    pdl = cfg.pdl and num_splits > 1 and not cfg.fused_merge and device.pdl_available(q.device)
    pdl_split = cfg.pdl_split and device.pdl_available(q.device)
    # The split kernel lets the kernel after it launch early: the second-kernel merge (pdl), or, when it is
    # itself PDL-launched (pdl_split), whatever comes next (with one split or the fused merge, the next call's
    # split kernel), which waits for this whole grid before its first read.
    common = split_kernel_options(cfg, heads, q.dtype, q.device, launch_dependents=pdl or pdl_split,
                                  pdl_split=pdl_split)
    grid = (row_blocks, num_splits, num_reqs)
    if common.get("PBW_TILES"):
        common.update(NUM_IDX=kv_indices.numel(), NUM_ROWS=cache.shape[0])
    if trace is not None:
        _check_trace(trace, q.device, *_trace_programs(cfg, row_blocks, num_splits, num_reqs, total_rows))
        common.update(TRACE_BUF=trace[0], TRACE=True)
    if num_splits == 1:
        compiled = _mla_decode_split_kernel[grid](
            q, cache, kv_indices, qo_indptr, kv_indptr, out, lse, out, lse, kv_indptr, cache.stride(0), total_rows,
            scale * _LOG2E, num_splits, DIRECT=True, FUSED_MERGE=False, **common)
        _note_compiled(cfg, compiled)
        return
    mid_o = torch.empty(num_splits, total_rows, KV_LORA_RANK, dtype=partial_dtype(cfg, q.dtype), device=q.device)
    mid_lse = torch.empty(num_splits, total_rows, dtype=torch.float32, device=q.device)
    if cfg.fused_merge:
        counters = _counter_workspace(q.device, num_reqs * row_blocks)
        compiled = _mla_decode_split_kernel[grid](
            q, cache, kv_indices, qo_indptr, kv_indptr, mid_o, mid_lse, out, lse, counters, cache.stride(0),
            total_rows, scale * _LOG2E, num_splits, DIRECT=False, FUSED_MERGE=True, **common)
        _note_compiled(cfg, compiled)
        return
    if cfg.split_merge:
        counters = _counter_workspace(q.device, 2 * num_reqs * row_blocks)
        args = (q, cache, kv_indices, qo_indptr, kv_indptr, mid_o, mid_lse, out, lse, counters, cache.stride(0),
                total_rows, scale * _LOG2E, num_splits)
        consts = dict(common, DIRECT=False, FUSED_MERGE=False, SPLIT_MERGE=True,
                      MERGE_CHUNK=min(triton.next_power_of_2(num_splits), cfg.merge_split_chunk))
        if grid[0] * grid[1] * grid[2] <= resident_capacity(_mla_decode_split_kernel, grid, args, consts, q.device):
            compiled = _mla_decode_split_kernel[grid](*args, **consts)
            _note_compiled(cfg, compiled)
            return
    merge_opts: dict[str, Any] = dict(GDC_WAIT=True, launch_pdl=True) if pdl else {}
    counters = kv_indptr  # (unused by the kernel unless SIGNAL)
    if cfg.spin_merge:
        # per-row counts, then one ticket per merge row block; both left zeroed by the merge
        merge_rows = triton.cdiv(total_rows, cfg.merge_tile(total_rows, num_splits)[0])
        ws = _counter_workspace(q.device, total_rows + merge_rows)
        counters = ws[:total_rows]
        common["SIGNAL"] = True
        merge_opts.update(SPIN=True, COUNTERS=counters, DONE=ws[total_rows:total_rows + merge_rows])
        merge_opts.pop("GDC_WAIT", None)  # the counts order the merge after each row's splits, not the PDL wait
    if cfg.tma_store:
        common.update(PART_DESC=_partial_descriptor(mid_o, cfg.block_m), TMA_STORE=True)
    compiled = _mla_decode_split_kernel[grid](
        q, cache, kv_indices, qo_indptr, kv_indptr, mid_o, mid_lse, out, lse, counters, cache.stride(0), total_rows,
        scale * _LOG2E, num_splits, DIRECT=False, FUSED_MERGE=False, **common)
    _note_compiled(cfg, compiled)
    if pdl_split:
        merge_opts["LAUNCH_DEPENDENTS"] = True
    if trace is not None:
        merge_opts.update(TRACE_BUF=trace[1], TRACE=True)
    _launch_merge(mid_o, mid_lse, out, lse, total_rows, num_splits, cfg, **merge_opts)


def triton_launch_plan(q: torch.Tensor, qo_indptr: torch.Tensor, kv_indices: torch.Tensor, max_qo_len: int, *,
                       config: TritonConfig | None = None, num_splits: int | None = None) -> tuple[TritonConfig, int]:
    """The config and split count :func:`mla_decode_triton` launches with for these inputs (host-side
    arithmetic only: no device sync): ``config`` or :func:`triton_config`'s choice for this call's rows,
    dtype, KV tokens (``kv_indices.numel()``, an upper bound), request count and SM count (or the smaller config
    :data:`SHARED_MEMORY_FALLBACKS` recorded for that choice on this GPU); ``num_splits`` or
    :func:`default_splits`'s."""
    heads = q.shape[1]
    num_reqs = qo_indptr.numel() - 1
    sms = _sm_count(q.device)
    cfg = config
    if cfg is None:
        cfg = triton_config(max_qo_len * heads, q.dtype, kv_indices.numel(), num_reqs=num_reqs, sm_count=sms)
        if q.device.type == "cuda":  # a config this GPU ran out of shared memory for: the rung that fitted
            cfg = SHARED_MEMORY_FALLBACKS.get((q.device.index or 0, cfg.key), cfg)
    if num_splits is None:
        row_blocks = triton.cdiv(max_qo_len * heads, cfg.block_m)
        num_splits = default_splits(cfg, num_reqs, row_blocks, kv_indices.numel(), sms)
    return cfg, num_splits


def partial_dtype(cfg: TritonConfig, dtype: torch.dtype) -> torch.dtype:
    """The dtype of a split call's partial outputs: fp32, or ``dtype`` (q's) with ``cfg.narrow_partials``."""
    return dtype if cfg.narrow_partials else torch.float32


_CAPACITY: dict[tuple, int] = {}  # (kernel hash, threads, device) -> programs resident on the whole GPU at once


def resident_capacity(kernel: Any, grid: tuple[int, int, int], args: tuple, consts: dict[str, Any],
                      dev: torch.device) -> int:
    """How many programs of ``kernel`` (compiled for ``args`` and ``consts``, not launched) the GPU holds at
    once: CUDA's occupancy query (registers, shared memory, threads of the compiled kernel) times the SM count.
    0 under the interpreter and on ROCm (programs there run one after another, or the query is not wired):
    a launch whose programs wait for each other must not be made there."""
    if device.interpreter_active() or dev.type != "cuda" or torch.version.hip is not None:
        return 0
    import ctypes

    compiled = kernel.warmup(*args, grid=grid, **consts)
    threads = 32 * compiled.metadata.num_warps
    key = (compiled.hash, threads, dev.index)
    if key not in _CAPACITY:
        compiled._init_handles()
        blocks = ctypes.c_int(0)
        rc = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), ctypes.c_void_p(compiled.function), ctypes.c_int(threads),
            ctypes.c_size_t(compiled.metadata.shared))
        _CAPACITY[key] = blocks.value * _sm_count(dev) if rc == 0 else 0
    return _CAPACITY[key]


def _partial_descriptor(mid_o: torch.Tensor, block_m: int) -> Any:
    """A tensor descriptor of the partials ``mid_o`` ``(num_splits, total_rows, 512)`` fp32 viewed as
    ``(num_splits * total_rows, 512)``, in blocks of one program's ``block_m`` rows (``tma_store``)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    flat = mid_o.view(-1, KV_LORA_RANK)
    return TensorDescriptor(flat, list(flat.shape), [KV_LORA_RANK, 1], [block_m, KV_LORA_RANK])


def _launch_merge(mid_o, mid_lse, out, lse, total_rows: int, num_splits: int, cfg: TritonConfig, **opts) -> None:
    """The second-kernel merge of ``num_splits`` partials of ``total_rows`` rows into ``out`` and ``lse``
    (``opts``: its PDL and trace switches)."""
    br, bd = cfg.merge_tile(total_rows, num_splits)
    _mla_decode_merge_kernel[(triton.cdiv(total_rows, br), KV_LORA_RANK // bd)](
        mid_o, mid_lse, out, lse, total_rows, num_splits, BLOCK_R=br, BLOCK_D=bd,
        SPLIT_CHUNK=min(triton.next_power_of_2(num_splits), cfg.merge_split_chunk), D_LATENT=KV_LORA_RANK,
        num_warps=cfg.merge_num_warps(total_rows) if not device.interpreter_active() else 1, **opts)


def _gluon_destinations(q, out, lse, cfg, num_splits, total_rows):
    """Where a gluon split kernel writes: ``out`` and ``lse`` with one split (direct), else fresh partials
    ``(num_splits, total_rows, 512)`` in :func:`partial_dtype` and ``(num_splits, total_rows)`` fp32 LSE."""
    if num_splits == 1:
        return out, lse
    return (torch.empty(num_splits, total_rows, KV_LORA_RANK, dtype=partial_dtype(cfg, q.dtype), device=q.device),
            torch.empty(num_splits, total_rows, dtype=torch.float32, device=q.device))


def _merge_after_gluon(o_dst, lse_dst, out, lse, total_rows, num_splits, cfg, pdl_split, trace=None) -> None:
    """The second-kernel merge after a gluon split kernel with more than one split: PDL-launched with ``cfg.pdl``,
    releasing the next kernel early when the split kernel was PDL-launched too; ``trace``: its stamps."""
    if num_splits == 1:
        return
    merge_opts: dict[str, Any] = dict(GDC_WAIT=True, launch_pdl=True) if cfg.pdl else {}
    if pdl_split:  # the next call's split kernel waits for the merge: let it launch early
        merge_opts["LAUNCH_DEPENDENTS"] = True
    if trace is not None:
        merge_opts.update(TRACE_BUF=trace[1], TRACE=True)
    _launch_merge(o_dst, lse_dst, out, lse, total_rows, num_splits, cfg, **merge_opts)


def _launch_gluon(q, cache, qo_indptr, kv_indptr, kv_indices, out, lse, scale, cfg, num_splits, row_blocks) -> None:
    """The split kernel of :mod:`workbench.mla_gluon`, then (more than one split) the second-kernel merge."""
    _check_gluon_call(q, "gluon")
    from workbench import mla_gluon

    total_q, heads, _ = q.shape
    num_reqs = qo_indptr.numel() - 1
    total_rows = total_q * heads
    grid = (row_blocks, num_splits, num_reqs)
    common = dict(NUM_HEADS=heads, D_LATENT=KV_LORA_RANK, D_ROPE=QK_ROPE_HEAD_DIM, num_warps=mla_gluon.NUM_WARPS,
                  COALESCED_STORE=cfg.coalesced_store)
    direct = num_splits == 1  # one split writes the final output; more write partials for the merge
    o_dst, lse_dst = _gluon_destinations(q, out, lse, cfg, num_splits, total_rows)
    # both kernels take (head, tail); the cluster-capable one also the final outputs between them
    head = (q, cache, kv_indices, qo_indptr, kv_indptr, o_dst, lse_dst)
    tail = (cache.stride(0), total_rows, scale * _LOG2E, num_splits)
    args = (*head, out, lse, *tail)
    if cfg.pdl_split and device.pdl_available(q.device):  # waits before its first read; the merge launches early
        common.update(PDL=True, launch_pdl=True)
    if cfg.gluon_ws:  # the warp-specialised kernel (GLUON_WS_CONFIG)
        from workbench import mla_gluon_ws

        ws_consts = dict(DIRECT=direct, HANDOFF=cfg.ws_handoff, IDX_AHEAD=cfg.ws_idx_ahead, EARLY_Q=cfg.ws_early_q,
                         **dict(common, num_warps=mla_gluon_ws.NUM_WARPS, maxnreg=mla_gluon_ws.MAX_REGS))
        if cfg.ws_split_merge and num_splits == mla_gluon_ws.SM_MAX_SPLITS.value:
            # the programs of each row block merge their partials themselves (no second kernel), when the whole
            # grid is resident at once: launched cooperatively, which CUDA refuses rather than run it otherwise
            counters = _counter_workspace(q.device, 2 * num_reqs * row_blocks)
            sm_args = (*head, *tail)
            sm_consts = dict(ws_consts, COUNTERS=counters, FINAL_O=out, FINAL_LSE=lse, SPLIT_MERGE=True,
                             launch_cooperative_grid=True)
            if num_reqs * row_blocks * num_splits <= resident_capacity(
                    mla_gluon_ws.mla_decode_gluon_ws_kernel, grid, sm_args, sm_consts, q.device):
                compiled = mla_gluon_ws.mla_decode_gluon_ws_kernel[grid](*sm_args, **sm_consts)
                _note_compiled(cfg, compiled)
                return
        compiled = mla_gluon_ws.mla_decode_gluon_ws_kernel[grid](*head, *tail, **ws_consts)
    else:
        if cfg.cluster_merge and num_splits in mla_gluon.CLUSTER_SPLITS:
            # clusters of num_splits programs along axis 0 (row block x split), merged in the kernel; only when
            # all the clusters fit on the GPU at once (else None: the second-kernel merge below)
            compiled = mla_gluon.launch_clustered(
                mla_gluon.mla_decode_gluon_split_kernel, (row_blocks, 1, num_reqs), num_splits, args,
                dict(DIRECT=False, CLUSTER=num_splits, MERGE_L=mla_gluon.cluster_merge_layout(num_splits),
                     BN=cfg.block_n, NBUF=cfg.num_stages, **common))
            if compiled is not None:
                _note_compiled(cfg, compiled)
                return
        if cfg.tma_store and not direct:
            common.update(PART_DESC=mla_gluon.partial_descriptor(o_dst), TMA_STORE=True)
        compiled = mla_gluon.mla_decode_gluon_split_kernel[grid](*args, DIRECT=direct, BN=cfg.block_n,
                                                                  NBUF=cfg.num_stages, **common)
    _note_compiled(cfg, compiled)
    _merge_after_gluon(o_dst, lse_dst, out, lse, total_rows, num_splits, cfg, bool(common.get("PDL")))


def _check_gluon_call(q: torch.Tensor, what: str) -> None:
    if not device.hopper(q.device):
        cap = (f"compute capability {'.'.join(map(str, torch.cuda.get_device_capability(q.device)))}"
               if device.compiled_nvidia(q.device) else f"the interpreter {'on' if device.interpreter_active() else 'off'}")
        raise ValueError(f"TritonConfig({what}=True) needs compiled Triton on an NVIDIA Hopper GPU (compute capability "
                         f"9.x): it is written with Hopper's wgmma, which Blackwell (10.x, 12.x) does not have; this call "
                         f"runs on {q.device} with {cap}. Use config=None (the Triton kernels there)")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"TritonConfig({what}=True) takes float16 or bfloat16 q, got {q.dtype}")


def _launch_gluon_swap(q, cache, qo_indptr, kv_indptr, kv_indices, out, lse, scale, cfg, num_splits,
                       row_blocks, trace=None) -> None:
    """The split kernel of :mod:`workbench.mla_gluon_swap`, then (more than one split) the second-kernel merge;
    ``trace`` (checked by the caller): both write their timestamps, as the Triton split kernel's call does."""
    _check_gluon_call(q, "gluon_swap")
    from workbench import mla_gluon_swap

    total_q, heads, _ = q.shape
    num_reqs = qo_indptr.numel() - 1
    total_rows = total_q * heads
    o_dst, lse_dst = _gluon_destinations(q, out, lse, cfg, num_splits, total_rows)
    opts: dict[str, Any] = {}
    if cfg.pdl_split and device.pdl_available(q.device):  # waits before its first read; the merge launches early
        opts.update(PDL=True, launch_pdl=True)
    if trace is not None:
        opts.update(TRACE_BUF=trace[0], TRACE=True, TRACE_SLOTS=TRACE_SLOTS.value, TRACE_TILES=TRACE_TILES.value)
    compiled = mla_gluon_swap.mla_decode_gluon_swap_kernel[(row_blocks, num_splits, num_reqs)](
        q, cache, kv_indices, qo_indptr, kv_indptr, o_dst, lse_dst, cache.stride(0), total_rows, scale * _LOG2E,
        num_splits, NUM_HEADS=heads, DIRECT=num_splits == 1, D_LATENT=KV_LORA_RANK, D_ROPE=QK_ROPE_HEAD_DIM,
        BR=cfg.block_m, num_warps=cfg.num_warps, **opts)
    _note_compiled(cfg, compiled)
    _merge_after_gluon(o_dst, lse_dst, out, lse, total_rows, num_splits, cfg, bool(opts.get("PDL")), trace)


def merge_programs(total_rows: int, cfg: TritonConfig, num_splits: int = 1) -> int:
    """Programs of the second-kernel merge of ``num_splits`` partials of ``total_rows`` folded rows."""
    br, bd = cfg.merge_tile(total_rows, num_splits)
    return triton.cdiv(total_rows, br) * (KV_LORA_RANK // bd)


def _trace_programs(cfg: TritonConfig, row_blocks: int, num_splits: int, num_reqs: int,
                    total_rows: int) -> tuple[int, int]:
    """(split programs, merge programs) of a call: the rows of its two trace buffers."""
    n_merge = 0 if num_splits == 1 or cfg.fused_merge else merge_programs(total_rows, cfg, num_splits)
    return row_blocks * num_splits * num_reqs, n_merge


def trace_buffers(q: torch.Tensor, max_qo_len: int, num_reqs: int, num_splits: int,
                  cfg: TritonConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed int64 timestamp buffers for ``mla_decode_triton(..., trace=)``: ``(split programs,
    TRACE_SLOTS)`` and ``(merge programs, MERGE_TRACE_SLOTS)`` (0 rows when the call has no second-kernel
    merge). Split program ``pid_m + row_blocks * (split + num_splits * request)`` writes row of that number:
    its SM, its entry time, the time after its PDL wait, its exit time, then the time after each of its first
    TRACE_TILES tiles (0: not reached). Times are the GPU's %globaltimer in ns."""
    n_split, n_merge = _trace_programs(cfg, triton.cdiv(max_qo_len * q.shape[1], cfg.block_m), num_splits,
                                       num_reqs, q.shape[0] * q.shape[1])
    return (torch.zeros(n_split, TRACE_SLOTS.value, dtype=torch.int64, device=q.device),
            torch.zeros(n_merge, MERGE_TRACE_SLOTS.value, dtype=torch.int64, device=q.device))


def _check_trace(trace: Any, dev: torch.device, n_split: int, n_merge: int) -> None:
    if not device.compiled_nvidia(dev):
        raise ValueError("trace needs compiled Triton on an NVIDIA GPU (it reads the PTX register %globaltimer); "
                         f"this call runs on {dev} with the interpreter "
                         f"{'on' if device.interpreter_active() else 'off'}")
    if not (isinstance(trace, tuple) and len(trace) == 2):
        raise TypeError("trace must be the (split, merge) pair of int64 tensors from trace_buffers()")
    for t, n, slots, name in ((trace[0], n_split, TRACE_SLOTS.value, "split"),
                              (trace[1], n_merge, MERGE_TRACE_SLOTS.value, "merge")):
        if t.dtype != torch.int64 or t.device != dev or tuple(t.shape) != (n, slots) or not t.is_contiguous():
            raise ValueError(f"trace {name} buffer must be a contiguous int64 ({n}, {slots}) tensor on {dev} "
                             f"(from trace_buffers() with this call's splits), got {tuple(t.shape)} {t.dtype} "
                             f"on {t.device}")


def split_kernel_options(cfg: TritonConfig, heads: int, dtype: torch.dtype, dev: torch.device, *,
                         launch_dependents: bool = False, pdl_split: bool = False) -> dict[str, Any]:
    """The compile-time arguments and launch options of ``_mla_decode_split_kernel`` for ``cfg`` (all but
    DIRECT and FUSED_MERGE, which depend on the split count and merge design of the launch). ``pdl_split``:
    launched with PDL, waiting for the previous kernel before its first read."""
    opts = dict(NUM_HEADS=heads, SWAP_AB=cfg.swap_ab, PREFETCH=cfg.prefetch, WARP_SPECIALIZE=cfg.warp_specialize,
                IDX_AHEAD=cfg.idx_ahead, IDX_DIST=cfg.idx_dist, IDX_PREFETCH=idx_prefetch_for(cfg, dev),
                LAUNCH_DEPENDENTS=launch_dependents, L2_AHEAD=l2_ahead_for(cfg, dev),
                DOT_PRECISION=_dot_precision(dtype), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                D_LATENT=KV_LORA_RANK, D_ROPE=QK_ROPE_HEAD_DIM, **cfg.launch_options())
    if pdl_split:
        opts.update(GDC_WAIT=True, launch_pdl=True, META_BEFORE_WAIT=cfg.meta_before_wait)
        if cfg.prefetch_before_wait and device.compiled_nvidia(dev) and dtype.itemsize == 2:
            opts["PBW_TILES"] = cfg.prefetch_before_wait
    return opts


def l2_ahead_for(cfg: TritonConfig, dev: torch.device) -> int:
    """The L2 prefetch distance the kernel gets: ``cfg.l2_ahead`` with ``idx_ahead`` on compiled NVIDIA
    (the prefetch is PTX), else 0."""
    return cfg.l2_ahead if cfg.idx_ahead and device.compiled_nvidia(dev) else 0


def idx_prefetch_for(cfg: TritonConfig, dev: torch.device) -> int:
    """The index prefetch level the kernel gets: ``cfg.idx_prefetch`` on compiled NVIDIA (PTX), else 0."""
    return cfg.idx_prefetch if cfg.idx_ahead and device.compiled_nvidia(dev) else 0


def _check_kernel_args(q: torch.Tensor, cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                       kv_indices: torch.Tensor, max_qo_len: int) -> None:
    """Checks that need no device sync (the value checks live in :func:`_check_common`)."""
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
    if qo_indptr.shape != kv_indptr.shape or qo_indptr.dim() != 1:
        raise ValueError(f"qo_indptr {tuple(qo_indptr.shape)} and kv_indptr {tuple(kv_indptr.shape)} must both be "
                         "(num_reqs + 1,)")
    _check_max_qo_len(max_qo_len)
    if q.device.type == "cpu" and not device.interpreter_active():
        raise RuntimeError("the Triton kernel needs a GPU, or the interpreter (TRITON_INTERPRET=1, set by "
                           "`import workbench` on machines without a GPU) for CPU tensors")


def _check_max_qo_len(max_qo_len: int) -> None:
    if not isinstance(max_qo_len, int) or isinstance(max_qo_len, bool) or max_qo_len < 1:
        raise ValueError(f"max_qo_len is {max_qo_len!r}; it must be a host-side int >= 1")
    if max_qo_len > MAX_QLEN:
        raise ValueError(f"max_qo_len is {max_qo_len}, above the decode limit of {MAX_QLEN} query tokens per "
                         "request (speculative verification uses k + 1 <= 16); run longer queries as prefill")


# ----------------------------------------------------------------------------------------------
# The aiter adapter (ROCm only)
# ----------------------------------------------------------------------------------------------
#
# aiter.mla.mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
# max_seqlen_q, ...): from aiter v0.1.11 on, page_size and nhead_kv sit between max_seqlen_q and
# sm_scale, so sm_scale and everything after it go by keyword. The output is written into o.
# Persistent scheduling (aiter.get_mla_metadata_info_v1 sizes six work buffers,
# aiter.get_mla_metadata_v1 fills them) is used only when every query length is 1, as vLLM does
# after PR #39616 (its qlen > 1 metadata path fails inside aiter's kernel heuristics).

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
    kv_buffer = _flat_cache(kv_cache).view(-1, 1, 1, QK_HEAD_DIM)  # page_size-1 view, as vLLM passes it
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


# ----------------------------------------------------------------------------------------------
# One entry point, four backends
# ----------------------------------------------------------------------------------------------

BACKENDS = ("auto", "triton", "torch", "aiter")
INTERPRETER_MAX_WORK = 1 << 22  # rows x keys the interpreter handles in a few seconds


class DecodeOutput(NamedTuple):
    """What :func:`mla_decode` returns: the output, its LSE, and which backend ran and why."""

    out: torch.Tensor  # (total_q, H, 512): q.dtype (triton, aiter) or float32 (torch golden)
    lse: torch.Tensor | None  # (total_q, H) float32 natural-log LSE; None if the aiter version gives none
    backend: str  # "triton" | "torch" | "aiter"
    reason: str  # why this backend (for "auto"), and which path (aiter: persistent or not; triton: the kernel,
    #              its config label and split count)


def choose_backend(q: torch.Tensor, kv_cache: torch.Tensor, metadata: DecodeMetadata) -> tuple[str, str]:
    """The backend ``"auto"`` picks here, and why: aiter on ROCm when importable and the call fits it,
    else Triton on a GPU, else Triton in the interpreter for small fp16/fp32 problems, else the golden."""
    plat = device.platform()
    prefix = ""
    if plat.kind == "rocm":
        status = device.aiter_status()
        if status.available:
            reasons = aiter_unsupported_reasons(q, kv_cache, metadata)
            if not reasons:
                return "aiter", "ROCm with aiter importable"
            prefix = "aiter cannot take this call (" + "; ".join(reasons) + "); "
        else:
            prefix = f"aiter unavailable ({status.reason}); "
        if device.on_gpu():
            return "triton", f"{prefix}Triton on the GPU (Triton's AMD backend)"
    elif device.on_gpu():
        return "triton", f"{plat.kind} GPU ({plat.device_name}): compiled Triton kernel (aiter needs ROCm)"
    if device.interpreter_active():
        work = q.shape[0] * q.shape[1] * metadata.kv_indices.numel() // max(metadata.num_reqs, 1)
        if q.dtype == torch.bfloat16:
            return "torch", f"{prefix}Triton interpreter computes bfloat16 wrongly (triton #11584); fp32 golden instead"
        if work <= INTERPRETER_MAX_WORK:
            return "triton", f"{prefix}no GPU: Triton interpreter (small problem, {work} row-keys)"
        return "torch", f"{prefix}no GPU and a large problem ({work} row-keys > {INTERPRETER_MAX_WORK}): fp32 golden"
    return "torch", f"{prefix}no GPU and no Triton interpreter: fp32 golden"


def mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, metadata: DecodeMetadata, *, sm_scale: float | None = None,
               backend: str = "auto", validate: bool = True) -> DecodeOutput:
    """MLA decode over flat per-token indices (``metadata`` from ``workbench.expand.build_flat_decode_metadata``).

    Args:
        q: ``(total_q, H, 576)`` contiguous; bf16/fp16 on a GPU, fp16/fp32 under the interpreter.
        kv_cache: ``[num_rows, 576]`` or the page_size-1 view ``[num_rows, 1, 1, 576]``, q's dtype.
        metadata: :class:`workbench.expand.DecodeMetadata` (``qo_indptr``, ``kv_indptr``, ``kv_indices``,
            ``kv_last_page_lens``, ``max_qo_len``).
        sm_scale: softmax scale; ``None`` = ``1/sqrt(576)`` (aiter's default; DeepSeek's models use another).
        backend: ``"triton"`` (this project's kernel: any query lengths 1..16, any head count),
            ``"torch"`` (fp32 golden, :func:`mla_decode_ref`), ``"aiter"`` (ROCm only: uniform query
            lengths, 16 or 128 heads), or ``"auto"`` (:func:`choose_backend`).
        validate: check offsets, index ranges, ``kv_len >= qo_len`` and ``max_qo_len`` on the host
            (a device sync; pass False inside CUDA-graph capture after validating once).

    Returns:
        :class:`DecodeOutput` ``(out, lse, backend, reason)``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend is {backend!r}; choose one of {BACKENDS}")
    if not isinstance(metadata, DecodeMetadata):
        raise TypeError(f"metadata is a {type(metadata).__name__}; build a DecodeMetadata with "
                        "workbench.expand.build_flat_decode_metadata(block_table, seq_lens, query_lens, K)")
    _check_max_qo_len(metadata.max_qo_len)
    if validate:
        _, qo, _ = _check_common(q, kv_cache, metadata.qo_indptr, metadata.kv_indptr, metadata.kv_indices, KV_LORA_RANK)
        actual = max((b - a for a, b in zip(qo, qo[1:])), default=0)
        if actual != metadata.max_qo_len:
            raise ValueError(f"metadata.max_qo_len is {metadata.max_qo_len} but the longest query in qo_indptr has "
                             f"{actual} tokens; they must agree (rebuild the metadata)")
    reason = "requested"
    if backend == "auto":
        backend, reason = choose_backend(q, kv_cache, metadata)
    if backend == "torch":
        out, lse = mla_decode_ref(q, kv_cache, metadata.qo_indptr, metadata.kv_indptr, metadata.kv_indices, sm_scale)
        return DecodeOutput(out, lse, "torch", reason)
    if backend == "triton":
        out, lse = mla_decode_triton(q, kv_cache, metadata.qo_indptr, metadata.kv_indptr, metadata.kv_indices,
                                     metadata.max_qo_len, sm_scale)
        # what that call launched (the same host-side choice, made again after its input checks)
        cfg, splits = triton_launch_plan(q, metadata.qo_indptr, metadata.kv_indices, metadata.max_qo_len)
        kernel = ("gluon, warp-specialised" if cfg.gluon_ws else "gluon" if cfg.gluon
                  else "gluon, swapped" if cfg.gluon_swap else "triton")
        return DecodeOutput(out, lse, "triton",
                            f"{reason}; {kernel} split kernel {cfg.label}, {splits} split{'s' if splits > 1 else ''}")
    out, lse, persistent = mla_decode_aiter(q, kv_cache, metadata, sm_scale)
    path = "persistent (get_mla_metadata_v1)" if persistent else "non-persistent (qlen > 1)"
    return DecodeOutput(out, lse, "aiter", f"{reason}; {path}")


# ----------------------------------------------------------------------------------------------
# aiter #2996: page indices handed over as token indices
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class PageIndexMistake:
    """The outcome of :func:`demo_page_indices_as_token_indices` (all errors against the paged golden)."""

    page_size: int
    flat_max_err: float  # per-token indices (what vLLM hands aiter after PR #39616): ~0
    pages_max_err: float  # page indices read as token rows (the #2996 failure): large
    pages_rel_err: float  # ||wrong - golden|| / ||golden||
    kv_indices_flat: list[int]  # request 0's first few per-token rows
    kv_indices_pages: list[int]  # request 0's page ids, as the mistaken call passes them

    @property
    def detected(self) -> bool:
        return self.flat_max_err < 1e-4 and self.pages_max_err > 1e-2


def demo_page_indices_as_token_indices(page_size: int = 16, seq_lens: tuple[int, ...] = (40, 23), heads: int = 16,
                                       seed: int = 0) -> PageIndexMistake:
    """Show the aiter #2996 failure mode with the golden: a paged cache addressed by *page* ids.

    aiter's bf16 kernels address the cache with page_size 1. Handing them a block table's page ids
    (with ``kv_indptr`` counting pages) makes them read row ``b`` of the flat view where block ``b``
    starts at row ``b * page_size``: the wrong rows, and too few of them. No error is raised: the
    output is silently wrong. Here both calls go through :func:`mla_decode_ref` (fp32), against
    :func:`mla_decode_paged_ref` on the paged cache; the correct flat indices come from
    ``workbench.expand.build_flat_decode_metadata``.
    """
    g = torch.Generator().manual_seed(seed)
    pages_per_req = [-(-n // page_size) for n in seq_lens]
    num_blocks = 1 + sum(pages_per_req) + 3  # block 0 reserved, a few spare
    cache = torch.randn(num_blocks, page_size, QK_HEAD_DIM, generator=g)
    perm = (1 + torch.randperm(num_blocks - 1, generator=g)).tolist()
    block_table = torch.zeros(len(seq_lens), max(pages_per_req), dtype=torch.int32)
    for r, n in enumerate(pages_per_req):
        block_table[r, :n] = torch.tensor(perm[:n], dtype=torch.int32)
        perm = perm[n:]
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    q = torch.randn(len(seq_lens), heads, QK_HEAD_DIM, generator=g)
    qo_indptr = torch.arange(len(seq_lens) + 1, dtype=torch.int32)
    golden, _ = mla_decode_paged_ref(q, cache, qo_indptr, block_table, seq)
    flat_view = cache.view(-1, QK_HEAD_DIM)  # what aiter sees: [num_blocks * page_size, 576]
    md = build_flat_decode_metadata(block_table, seq, [1] * len(seq_lens), page_size)
    flat, _ = mla_decode_ref(q, flat_view, md.qo_indptr, md.kv_indptr, md.kv_indices)
    page_ids = torch.cat([block_table[r, :n] for r, n in enumerate(pages_per_req)])
    page_indptr = torch.tensor([0] + torch.tensor(pages_per_req).cumsum(0).tolist(), dtype=torch.int32)
    wrong, _ = mla_decode_ref(q, flat_view, qo_indptr, page_indptr, page_ids)
    return PageIndexMistake(
        page_size=page_size,
        flat_max_err=float((flat - golden).abs().max()),
        pages_max_err=float((wrong - golden).abs().max()),
        pages_rel_err=float((wrong - golden).norm() / golden.norm()),
        kv_indices_flat=md.kv_indices[: min(6, seq_lens[0])].tolist(),
        kv_indices_pages=block_table[0, : pages_per_req[0]].tolist(),
    )


# ----------------------------------------------------------------------------------------------
# A small example batch (for chapters and quick checks)
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class DecodeExample:
    """A paged cache with a permuted block table, its flat metadata, and the query."""

    q: torch.Tensor  # (total_q, H, 576)
    kv_cache: torch.Tensor  # [num_blocks, K, 576]; rows no request owns are NaN (row 0 / block 0 reserved)
    block_table: torch.Tensor  # (num_reqs, max_blocks) int32
    seq_lens: torch.Tensor  # (num_reqs,) int32
    metadata: DecodeMetadata  # from workbench.expand.build_flat_decode_metadata

    @property
    def flat_cache(self) -> torch.Tensor:
        """The page_size-1 view ``[num_blocks * K, 1, 1, 576]`` aiter reads (no copy)."""
        return self.kv_cache.view(-1, 1, 1, QK_HEAD_DIM)


def make_decode_example(query_lens: list[int], seq_lens: list[int], heads: int, kernel_block_size: int, *,
                        dtype: torch.dtype = torch.float32, device_: str | torch.device = "cpu",
                        seed: int = 0) -> DecodeExample:
    """Random q and KV for a batch: blocks handed out in a random order (block 0 never), every slot no
    request owns filled with NaN so that a stray read shows up, and the flat metadata built by
    ``workbench.expand.build_flat_decode_metadata``."""
    K = kernel_block_size
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // K) for n in seq_lens]
    num_blocks = 1 + sum(pages) + 2
    cache = torch.full((num_blocks, K, QK_HEAD_DIM), float("nan"))
    perm = (1 + torch.randperm(num_blocks - 1, generator=g)).tolist()
    block_table = torch.zeros(len(seq_lens), max(pages + [1]), dtype=torch.int32)
    for r, (n, p) in enumerate(zip(seq_lens, pages)):
        ids, perm = perm[:p], perm[p:]
        block_table[r, :p] = torch.tensor(ids, dtype=torch.int32)
        t = torch.arange(n)
        cache[torch.tensor(ids, dtype=torch.long)[t // K], t % K] = torch.randn(n, QK_HEAD_DIM, generator=g)
    q = torch.randn(sum(query_lens), heads, QK_HEAD_DIM, generator=g)
    dev = torch.device(device_)
    seq = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
    bt = block_table.to(dev)
    md = build_flat_decode_metadata(bt, seq, list(query_lens), K)
    return DecodeExample(q.to(dtype).to(dev), cache.to(dtype).to(dev), bt, seq, md)
