"""Run a persistent schedule: what aiter's persistent MLA kernel plus its reduce (``mla_reduce_v1``) compute.

Each work item attends its query row to its KV range (fp32); a request cut across units writes partials,
merged afterwards by their log-sum-exp through the three reduce maps. The result equals the golden
decode (:func:`workbench.mla.mla_decode_ref`). Asked for query length > 1 it refuses, with the reason.
"""

from __future__ import annotations

import torch

from workbench import mla
from workbench.decode_metadata import DecodeMetadata
from workbench.metadata.builders import StepBuffers
from workbench.metadata.schedule import _QLEN_RULE, PersistentSchedule

__all__ = ["execute_schedule"]


def _partial_attention(q_rows: torch.Tensor, kv_rows: torch.Tensor, scale: float, dv: int):
    """softmax(q K^T * scale) V over the given keys, fp32: q_rows (s, H, D), kv_rows (n, D) -> (s, H, dv), (s, H)."""
    scores = torch.einsum("qhd,kd->qhk", q_rows.float(), kv_rows.float()) * scale
    lse = torch.logsumexp(scores, dim=-1)
    return torch.einsum("qhk,kd->qhd", torch.softmax(scores, dim=-1), kv_rows[:, :dv].float()), lse


def _gather_rows(cache: torch.Tensor, kv_indices: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Cache rows for kv_indices positions [start, end). Positions past kv_indices, and the -1 padding,
    read as NaN rows: what a stray read returns in a NaN-filled cache (only reachable with check=False)."""
    pos = torch.arange(start, end)
    rows = torch.full((end - start, cache.shape[-1]), float("nan"), dtype=torch.float32)
    inside = pos < kv_indices.numel()
    idx = torch.full_like(pos, -1)
    idx[inside] = kv_indices[pos[inside]].long()
    ok = (idx >= 0) & (idx < cache.shape[0])
    rows[ok] = cache[idx[ok]].float()
    return rows


def execute_schedule(work: PersistentSchedule | StepBuffers, metadata: DecodeMetadata, q: torch.Tensor,
                     kv_cache: torch.Tensor, sm_scale: float | None = None, *, check: bool = True,
                     kv_lora_rank: int = mla.KV_LORA_RANK) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a persistent schedule for one step: what aiter's persistent kernel plus ``mla_reduce_v1`` compute.

    Each work item attends its query row to its KV range (fp32); a direct item writes the output, a
    split item writes its partial slot; then each split request's partials are merged by log-sum-exp
    into the rows ``reduce_final_map`` names.

    Args:
        work: a :class:`PersistentSchedule`, or the :class:`StepBuffers` a step's metadata holds.
        metadata: the step's :class:`DecodeMetadata` (its ``kv_indices`` are read; with ``check`` its
            offsets are compared with the schedule's).
        q: ``(num_reqs, H, 576)`` float (one query token per request).
        kv_cache: ``[num_rows, 576]`` or ``[num_rows, 1, 1, 576]``.
        sm_scale: softmax scale; ``None`` means ``1/sqrt(576)``.
        check: refuse a step with query length > 1, a schedule built for another step, and buffers
            refilled since this step's build. ``False`` models the GPU kernel, which trusts its work
            buffers: it runs whatever they say, and stray reads show up as NaN.

    Returns:
        ``out`` ``(total_q, H, kv_lora_rank) float32`` and ``lse`` ``(total_q, H) float32``; rows no work
        item wrote stay NaN.
    """
    schedule = work.schedule if isinstance(work, StepBuffers) else work
    if check:
        qlens = torch.diff(metadata.qo_indptr).tolist()
        if any(n != 1 for n in qlens):
            raise ValueError(f"this step has max_qo_len = {metadata.max_qo_len} (query lengths {qlens[:8]}); "
                             f"{_QLEN_RULE}")
        if isinstance(work, StepBuffers) and not work.current:
            raise ValueError(f"the buffer set was refilled by a later build (generation {work.buffers.generation}, "
                             f"this step filled generation {work.generation}); a step must run before its buffers "
                             "are reused: run it earlier or give the builder more buffer sets")
        if (schedule.kv_indptr is None or schedule.num_reqs != metadata.num_reqs
                or not torch.equal(schedule.kv_indptr, metadata.kv_indptr.cpu().to(torch.int32))
                or not torch.equal(schedule.qo_indptr, metadata.qo_indptr.cpu().to(torch.int32))):
            built = None if schedule.kv_indptr is None else schedule.kv_indptr.tolist()[:6]
            raise ValueError(f"this schedule was built for another step ({schedule.num_reqs} requests, kv_indptr "
                             f"{built}...) but the step has {metadata.num_reqs} requests, kv_indptr "
                             f"{metadata.kv_indptr.tolist()[:6]}...; aiter's kernel cannot notice (it reads only "
                             "its work buffers): derive the decision and the buffers from this step's metadata")
    cache = kv_cache.reshape(-1, kv_cache.shape[-1])
    scale = mla.default_sm_scale(cache.shape[-1]) if sm_scale is None else float(sm_scale)
    total_q, heads, _ = q.shape
    nan = float("nan")
    out = torch.full((total_q, heads, kv_lora_rank), nan, dtype=torch.float32, device=q.device)
    lse = torch.full((total_q, heads), nan, dtype=torch.float32, device=q.device)
    part_out = torch.full((schedule.sizes.max_partials, heads, kv_lora_rank), nan, dtype=torch.float32)
    part_lse = torch.full((schedule.sizes.max_partials, heads), nan, dtype=torch.float32)
    kv_indices = metadata.kv_indices.cpu()
    for it in schedule.work_items():
        if it.q_start >= total_q:  # a row this step does not have: the write would land out of bounds
            continue
        rows = _gather_rows(cache.cpu(), kv_indices, it.kv_start, it.kv_end)
        o, l = _partial_attention(q[it.q_start: it.q_end].cpu(), rows, scale, kv_lora_rank)
        if it.partial < 0:
            out[it.q_start: it.q_end], lse[it.q_start: it.q_end] = o.to(out.device), l.to(out.device)
        else:
            part_out[it.partial], part_lse[it.partial] = o[0], l[0]
    # The reduce (mla_reduce_v1): out = sum_i exp(lse_i - lse) * out_i, lse = logsumexp_i lse_i.
    ptr = schedule.reduce_indptr.tolist()
    final = schedule.reduce_final_map.tolist()
    slots_all = schedule.reduce_partial_map.tolist()
    for r in range(schedule.num_reqs):
        if ptr[r + 1] == ptr[r] or final[r][0] >= total_q:
            continue
        slots = torch.tensor(slots_all[ptr[r]: ptr[r + 1]])
        merged_lse = torch.logsumexp(part_lse[slots], dim=0)  # (H,)
        weights = torch.exp(part_lse[slots] - merged_lse)  # (n, H)
        out[final[r][0]] = (weights[..., None] * part_out[slots]).sum(0).to(out.device)
        lse[final[r][0]] = merged_lse.to(out.device)
    return out, lse

