"""The references of the MLA decode: the fp32 golden (the spec), a paged golden, and a batched torch path.

:func:`mla_decode_ref` is the spec every backend is checked against: gather each request's rows by token index,
``K = row[:, :576]``, ``V = row[:, :512]``, ``softmax(q K^T * sm_scale) V`` with the bottom-right causal mask
(query ``i`` of an ``s_q``-token request sees keys ``0 .. s_k - s_q + i``), and ``lse = log(sum(exp(scores)))``.
:func:`mla_decode_paged_ref` addresses a paged cache through a block table instead (no flat indices involved);
:func:`mla_decode_torch` is the same computation batched in the input precision: the same-precision baseline of
the tolerance rule (flash-attention's: a kernel's error at most twice that of a same-precision PyTorch computation
plus a floor) and the torch path of the benchmark.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from workbench.mla.inputs import KV_LORA_RANK, QK_HEAD_DIM, check_values, flat_cache

__all__ = ["GoldenCheck", "check_against_golden", "default_sm_scale", "mla_decode_paged_ref", "mla_decode_ref",
           "mla_decode_torch", "tolerance"]


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
    cache, qo, kv = check_values(q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_lora_rank)
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
    cache = flat_cache(kv_cache)
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


def tolerance(gold: torch.Tensor, same_precision: torch.Tensor, dtype: torch.dtype) -> float:
    """flash-attention's rule, derived rather than guessed: a kernel's max error against the fp32 golden may be at
    most twice that of the same computation in ``dtype`` with plain torch ops (``same_precision``, e.g.
    :func:`mla_decode_torch`) plus a floor of two ulps of ``dtype`` at the output's scale and 1e-5 (in fp32 the torch
    path is the golden itself, error 0, and a kernel's other summation order still rounds differently)."""
    floor = 2 * torch.finfo(dtype).eps * max(1.0, gold.abs().max().item()) + 1e-5
    return 2 * (same_precision.float() - gold).abs().max().item() + floor


@dataclasses.dataclass(frozen=True)
class GoldenCheck:
    """A kernel's output against the golden under :func:`tolerance`, and its LSE against the golden's."""

    max_err: float  # max |out - golden|
    mean_err: float
    torch_err: float  # the same-precision torch path's max error
    bound: float  # tolerance(...)
    lse_err: float  # max |lse - golden lse|
    lse_bound: float  # 2 x the torch path's LSE error + a few fp32 ulps
    lse_cosine_gap: float  # 1 - cos(lse, golden lse)
    nan: bool  # any NaN in the output (a stray read of an unused row, in a NaN-filled cache)

    @property
    def ok(self) -> bool:
        return (not self.nan and self.max_err <= self.bound and self.lse_err <= self.lse_bound
                and self.lse_cosine_gap < 1e-6)

    def __str__(self) -> str:
        return (f"out max {self.max_err:.2e} mean {self.mean_err:.2e} (bound {self.bound:.2e}, torch "
                f"{self.torch_err:.2e}); lse max {self.lse_err:.2e} (bound {self.lse_bound:.2e}); "
                f"1-cos {self.lse_cosine_gap:.1e}{'; NaN in the output' if self.nan else ''}")


def check_against_golden(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                         kv_indices: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, dtype: torch.dtype,
                         sm_scale: float | None = None) -> GoldenCheck:
    """Compare a decode's ``out`` and ``lse`` with :func:`mla_decode_ref` under :func:`tolerance` (the torch path of
    :func:`mla_decode_torch` in ``dtype`` on the same, rounded inputs sets the bound). The LSE is an fp32 computation
    in every path, so its floor is a few fp32 ulps."""
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    max_q = max((b - a for a, b in zip(qo, qo[1:])), default=1)
    max_k = max((b - a for a, b in zip(kv, kv[1:])), default=1)
    gold, gold_lse = mla_decode_ref(q, kv_cache, qo_indptr, kv_indptr, kv_indices, sm_scale)
    same, same_lse = mla_decode_torch(q, kv_cache, qo_indptr, kv_indptr, kv_indices, sm_scale, max_q, max_k)
    err = (out.float() - gold).abs()
    lse_err = (lse - gold_lse).abs().max().item() if lse.numel() else 0.0
    lse_floor = 8 * torch.finfo(torch.float32).eps * max(1.0, gold_lse.abs().max().item() if lse.numel() else 1.0)
    lse_bound = 2 * ((same_lse - gold_lse).abs().max().item() if lse.numel() else 0.0) + lse_floor + 1e-5
    cos = torch.nn.functional.cosine_similarity(lse.flatten().double(), gold_lse.flatten().double(), dim=0).item() \
        if lse.numel() else 1.0
    return GoldenCheck(max_err=err.max().item() if err.numel() else 0.0,
                       mean_err=err.mean().item() if err.numel() else 0.0,
                       torch_err=(same.float() - gold).abs().max().item() if err.numel() else 0.0,
                       bound=tolerance(gold, same, dtype) if err.numel() else 0.0, lse_err=lse_err,
                       lse_bound=lse_bound, lse_cosine_gap=1 - cos, nan=bool(torch.isnan(out).any()))
