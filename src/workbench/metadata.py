"""Persistent scheduling for MLA decode (aiter-style, query length 1), and where ``has_persistent_metadata`` lives.

Two things, both made executable:

1. **The persistent schedule.** aiter's "persistent" MLA decode launches one long-lived workgroup per
   compute unit (CU) and hands each a precomputed list of work items, so that one long request is cut
   across many CUs and a batch of short ones is packed onto few. :class:`PersistentSchedule` models the
   scheduler that fills those lists (aiter's ``get_mla_metadata_v1``) for single-token decode: the KV of
   all requests, counted in granules of ``kv_granularity = 16`` tokens, is split evenly over ``N``
   units; each unit gets contiguous work items (request, query range, KV range, partial slot or ``-1``
   for a direct write); a request cut across units becomes *partials*, merged afterwards by their
   log-sum-exp through three reduce maps. :func:`execute_schedule` runs a schedule (partial attention
   per work item, then the LSE merge per request) and equals the golden decode
   (:func:`workbench.mla.mla_decode_ref`). Asked for query length > 1 it refuses, with the reason.

2. **The two builder designs** for the flag that says whether a step has a schedule. vLLM PR #39616
   computes the schedule only when every decode request has one query token (``max_qo_len == 1``) and
   records that choice in ``has_persistent_metadata``. Its first revision kept the flag on the builder
   (``self._has_persistent_metadata``, reset at the start of every decode build and read back later); a
   review flagged that as state that can leak between builds, and the merged version puts the flag on the
   decode metadata it returns. :class:`InstanceFlagBuilder` and :class:`MetadataFlagBuilder` model the two;
   :func:`replay` runs named interleavings of builds and runs through them, :func:`stress_test` runs
   thousands of builds from several threads and counts wrong decisions.

Both builders model CUDA-graph persistent buffers: fixed-size tensors allocated once (a small pool of
:class:`BufferSet`), ``kv_indptr``/``qo_indptr`` tails padded with their last value, unused
``kv_indices`` entries ``-1``, unused work rows ``-1``. This is a model of aiter's scheduler and of the
PR's builder, written from their documentation and described in our own words; it is not their code.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple

import torch

from workbench import mla
from workbench.expand import DecodeMetadata

__all__ = [
    "DecodeMetadata",
    "KV_GRANULARITY",
    "WORK_INFO_FIELDS",
    "PersistentBufferSizes",
    "persistent_buffer_sizes",
    "WorkItem",
    "PersistentSchedule",
    "StepBuffers",
    "execute_schedule",
    "step_supports_persistent",
    "BufferSet",
    "InstanceFlagBuilder",
    "MetadataFlagBuilder",
    "DESIGNS",
    "DecodeStep",
    "make_steps",
    "StepResult",
    "run_step",
    "ReplayEvent",
    "INTERLEAVINGS",
    "replay",
    "replay_all",
    "StressResult",
    "stress_test",
    "format_stress_table",
]

KV_GRANULARITY = 16  # tokens per KV granule: aiter's default kv_granularity
# The eight int32 columns of one work_info_set row (aiter's order, described in our words):
WORK_INFO_FIELDS = (
    "bs_index",  # request (batch) index
    "partial_index",  # slot in the partial-output buffer, or -1: write straight to the output
    "q_start",  # first query row (global, into q / qo_indptr order)
    "q_end",  # one past the last query row
    "kv_start",  # first position in kv_indices (global, kv_indptr order)
    "kv_end",  # one past the last position
    "kv_offset",  # KV tokens of this request after kv_end
    "pad",  # padding to 8 int32 (aiter packs head ranges here in some versions)
)

_QLEN_RULE = (
    "the persistent schedule is for query length 1 only: its buffers are sized for one query token per "
    "request (vLLM sizes aiter's with max_seqlen_qo=1) and there is no persistent kernel for longer queries "
    "(the PR notes that get_mla_metadata_v1 fails for qseqlen > 1). Run this step on the non-persistent "
    "path, as vLLM PR #39616 does: it computes the schedule only when max_qo_len == 1"
)


def _int_arg(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a Python int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


# ----------------------------------------------------------------------------------------------
# 1. Buffer sizes (the analogue of aiter's get_mla_metadata_info_v1)
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PersistentBufferSizes:
    """Sizes of the persistent work buffers, fixed before any step is seen (CUDA graphs need that).

    Attributes:
        max_num_reqs: most requests one step may hold.
        num_units: compute units (CUs) the work is spread over.
        max_work: rows of ``work_info_set``: ``max_num_reqs + num_units - 1`` (each of the
            ``num_units - 1`` boundaries between units cuts at most one request into one extra item).
        max_partials: rows of the partial buffer: ``min(max_num_reqs + num_units - 1, 2 * (num_units - 1))``
            (only requests crossing a boundary are split; at most ``num_units - 1`` of them, with at most
            ``2 * (num_units - 1)`` pieces in all).
    """

    max_num_reqs: int
    num_units: int
    max_work: int
    max_partials: int


def persistent_buffer_sizes(max_num_reqs: int, num_units: int, max_qo_len: int = 1) -> PersistentBufferSizes:
    """Size the work buffers for at most ``max_num_reqs`` single-token requests over ``num_units`` units.

    The same bounds as aiter's ``get_mla_metadata_info_v1`` in its fast mode, for one query tile per
    request. ``max_qo_len`` other than 1 is refused with the reason.
    """
    _int_arg("max_num_reqs", max_num_reqs, 0)
    _int_arg("num_units", num_units, 1)
    _int_arg("max_qo_len", max_qo_len, 1)
    if max_qo_len != 1:
        raise ValueError(f"max_qo_len is {max_qo_len}; {_QLEN_RULE}")
    return PersistentBufferSizes(
        max_num_reqs=max_num_reqs,
        num_units=num_units,
        max_work=max_num_reqs + num_units - 1,
        max_partials=min(max_num_reqs + num_units - 1, 2 * (num_units - 1)),
    )


# ----------------------------------------------------------------------------------------------
# 2. The schedule (the analogue of aiter's get_mla_metadata_v1, query length 1)
# ----------------------------------------------------------------------------------------------


class WorkItem(NamedTuple):
    """One row of ``work_info_set``, decoded, plus the unit that runs it."""

    unit: int
    request: int
    partial: int  # partial slot, or -1 for a direct write
    q_start: int
    q_end: int
    kv_start: int  # position in kv_indices
    kv_end: int
    kv_offset: int


@dataclasses.dataclass(eq=False)
class PersistentSchedule:
    """aiter-style persistent work buffers for single-token MLA decode, filled in place.

    Buffers (int32, fixed size, on ``device``; unused entries -1, ``*_indptr`` tails padded with the last value):

    * ``work_indptr`` ``(num_units + 1,)``: unit ``u`` runs rows ``work_indptr[u] : work_indptr[u+1]``
      of ``work_info_set``;
    * ``work_info_set`` ``(max_work, 8)``: one work item per row, columns :data:`WORK_INFO_FIELDS`;
    * ``reduce_indptr`` ``(max_num_reqs + 1,)``: request ``r``'s partial slots are
      ``reduce_partial_map[reduce_indptr[r] : reduce_indptr[r+1]]`` (empty when it was not split);
    * ``reduce_final_map`` ``(max_num_reqs, 2)``: the query rows ``[q_start, q_end)`` each request's
      merged result goes to;
    * ``reduce_partial_map`` ``(max_partials,)``: partial slots, grouped by request, in KV order.

    Host-side counts (``num_reqs``, ``num_work``, ``num_partials``) and copies of the offsets it was
    built from (``qo_indptr``, ``kv_indptr``) let :func:`execute_schedule` check that a schedule belongs
    to the step it is asked to run. ``generation`` counts fills: a holder of an older generation knows
    the buffers were refilled since.
    """

    sizes: PersistentBufferSizes
    kv_granularity: int
    work_indptr: torch.Tensor
    work_info_set: torch.Tensor
    reduce_indptr: torch.Tensor
    reduce_final_map: torch.Tensor
    reduce_partial_map: torch.Tensor
    num_reqs: int = 0
    num_work: int = 0
    num_partials: int = 0
    qo_indptr: torch.Tensor | None = None
    kv_indptr: torch.Tensor | None = None
    generation: int = 0

    @property
    def num_units(self) -> int:
        return self.sizes.num_units

    @classmethod
    def empty(cls, sizes: PersistentBufferSizes, kv_granularity: int = KV_GRANULARITY,
              device: torch.device | str = "cpu") -> PersistentSchedule:
        """Allocate the buffers once (all -1, ``*_indptr`` all 0), as a CUDA-graph builder does at start-up."""
        _int_arg("kv_granularity", kv_granularity, 1)

        def full(*shape, value=-1):
            return torch.full(shape, value, dtype=torch.int32, device=device)

        return cls(
            sizes=sizes, kv_granularity=kv_granularity,
            work_indptr=full(sizes.num_units + 1, value=0),
            work_info_set=full(sizes.max_work, len(WORK_INFO_FIELDS)),
            reduce_indptr=full(sizes.max_num_reqs + 1, value=0),
            reduce_final_map=full(sizes.max_num_reqs, 2),
            reduce_partial_map=full(sizes.max_partials),
        )

    @classmethod
    def build(cls, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, num_units: int,
              kv_granularity: int = KV_GRANULARITY, max_num_reqs: int | None = None) -> PersistentSchedule:
        """Size (for ``max_num_reqs``, default this step's request count), allocate and fill a schedule."""
        num_reqs = len(mla.check_indptr("qo_indptr", qo_indptr)) - 1
        sizes = persistent_buffer_sizes(num_reqs if max_num_reqs is None else max_num_reqs, num_units)
        return cls.empty(sizes, kv_granularity, qo_indptr.device).fill_(qo_indptr, kv_indptr)

    def fill_(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor) -> PersistentSchedule:
        """Fill the buffers in place for one decode step; return ``self``.

        Args:
            qo_indptr: ``(num_reqs + 1,) int32``; every request must have exactly one query token.
            kv_indptr: ``(num_reqs + 1,) int32`` cumulative KV lengths in tokens; every request >= 1.

        The split: request ``r`` holds ``ceil(kv_len_r / G)`` granules (``G = kv_granularity``); the
        granules of all requests, in order, are cut at ``floor(u * T / N)`` for ``u = 0 .. N`` (``T``
        granules, ``N`` units), so units' loads differ by at most one granule. Each unit's range becomes
        one work item per request it touches; a request touched by more than one unit is split, and each
        of its items writes a partial slot that the reduce maps merge.
        """
        qo = mla.check_indptr("qo_indptr", qo_indptr)
        kv = mla.check_indptr("kv_indptr", kv_indptr)
        if len(qo) != len(kv):
            raise ValueError(f"qo_indptr has {len(qo)} entries and kv_indptr {len(kv)}; both must be num_reqs + 1")
        num_reqs = len(qo) - 1
        if num_reqs > self.sizes.max_num_reqs:
            raise ValueError(f"the step has {num_reqs} requests but the buffers were sized for max_num_reqs = "
                             f"{self.sizes.max_num_reqs}; size them with persistent_buffer_sizes(max_num_reqs=...)")
        qlens = [b - a for a, b in zip(qo, qo[1:])]
        if any(n != 1 for n in qlens):
            bad = next(r for r, n in enumerate(qlens) if n != 1)
            raise ValueError(f"qo_indptr gives query length {qlens[bad]} for request {bad} (max_qo_len = "
                             f"{max(qlens)}); {_QLEN_RULE}")
        kvlens = [b - a for a, b in zip(kv, kv[1:])]
        if any(n < 1 for n in kvlens):
            bad = next(r for r, n in enumerate(kvlens) if n < 1)
            raise ValueError(f"kv_indptr gives request {bad} {kvlens[bad]} KV tokens; a decode request attends "
                             "to at least its own token (kv_len >= 1): drop empty requests before scheduling")

        self.generation += 1  # first: a reader holding the old generation now sees the refill
        G, N = self.kv_granularity, self.sizes.num_units
        first_granule = [0]
        for n in kvlens:
            first_granule.append(first_granule[-1] + -(-n // G))
        total = first_granule[-1]
        bounds = [u * total // N for u in range(N + 1)]

        rows: list[list[int]] = []
        work_indptr = [0]
        pieces: list[list[int]] = [[] for _ in range(num_reqs)]  # work-row numbers of each request
        r = 0
        for u in range(N):
            lo, hi = bounds[u], bounds[u + 1]
            while r < num_reqs and first_granule[r] < hi:
                g0, g1 = max(lo, first_granule[r]), min(hi, first_granule[r + 1])
                if g1 > g0:
                    kv_start = kv[r] + (g0 - first_granule[r]) * G
                    kv_end = kv[r] + min((g1 - first_granule[r]) * G, kvlens[r])
                    pieces[r].append(len(rows))
                    rows.append([r, -1, qo[r], qo[r + 1], kv_start, kv_end, kv[r + 1] - kv_end, 0])
                if first_granule[r + 1] <= hi:
                    r += 1
                else:
                    break  # the rest of request r goes to the next unit
            work_indptr.append(len(rows))

        reduce_indptr, partial_map = [0], []
        for r in range(num_reqs):
            if len(pieces[r]) > 1:
                for row in pieces[r]:
                    rows[row][1] = len(partial_map)  # the partial slot this item writes
                    partial_map.append(rows[row][1])
            reduce_indptr.append(len(partial_map))

        # Write the fixed-size buffers in place (a CUDA graph captured them by address).
        dev = self.work_info_set.device
        self.work_indptr.copy_(torch.tensor(work_indptr, dtype=torch.int32))
        self.work_info_set.fill_(-1)
        if rows:
            self.work_info_set[: len(rows)] = torch.tensor(rows, dtype=torch.int32, device=dev)
        self.reduce_indptr.fill_(reduce_indptr[-1])
        self.reduce_indptr[: num_reqs + 1] = torch.tensor(reduce_indptr, dtype=torch.int32, device=dev)
        self.reduce_final_map.fill_(-1)
        if num_reqs:
            self.reduce_final_map[:num_reqs] = torch.tensor([[qo[r], qo[r + 1]] for r in range(num_reqs)],
                                                            dtype=torch.int32, device=dev)
        self.reduce_partial_map.fill_(-1)
        if partial_map:
            self.reduce_partial_map[: len(partial_map)] = torch.tensor(partial_map, dtype=torch.int32, device=dev)
        self.num_reqs, self.num_work, self.num_partials = num_reqs, len(rows), len(partial_map)
        self.qo_indptr = torch.tensor(qo, dtype=torch.int32)
        self.kv_indptr = torch.tensor(kv, dtype=torch.int32)
        return self

    # -- reading the buffers back ---------------------------------------------------------------

    def work_items(self) -> list[WorkItem]:
        """Decode ``work_indptr`` and ``work_info_set`` into :class:`WorkItem` rows, unit by unit."""
        indptr = self.work_indptr.tolist()
        table = self.work_info_set[: indptr[-1]].tolist()
        items = []
        for u in range(self.num_units):
            for row in table[indptr[u]: indptr[u + 1]]:
                items.append(WorkItem(u, row[0], row[1], row[2], row[3], row[4], row[5], row[6]))
        return items

    def unit_loads(self) -> list[int]:
        """KV granules each unit processes (items start on granule boundaries, so ceil per item is exact)."""
        loads = [0] * self.num_units
        G = self.kv_granularity
        for it in self.work_items():
            loads[it.unit] += -(-(it.kv_end - it.kv_start) // G)
        return loads

    def split_requests(self) -> list[int]:
        """Requests whose KV was cut across units (they go through the reduce step)."""
        ptr = self.reduce_indptr.tolist()
        return [r for r in range(self.num_reqs) if ptr[r + 1] > ptr[r]]

    def describe(self) -> str:
        """One line: requests, units, work items, partials, and the load per unit in granules."""
        loads = self.unit_loads()
        return (f"{self.num_reqs} requests over {self.num_units} units: {self.num_work} work items, "
                f"{self.num_partials} partials from {len(self.split_requests())} split requests; "
                f"granules per unit {loads} (max - min = {max(loads) - min(loads)})")


# ----------------------------------------------------------------------------------------------
# 3. The executor: partial attention per work item, then an LSE merge per split request
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepBuffers:
    """What a step's metadata holds: its buffer set and the generation that set had when this step filled it."""

    buffers: BufferSet
    generation: int

    @property
    def schedule(self) -> PersistentSchedule:
        return self.buffers.schedule

    @property
    def current(self) -> bool:
        """False once another step has refilled the buffer set."""
        return self.buffers.generation == self.generation


def step_supports_persistent(metadata: DecodeMetadata | None) -> bool:
    """The step's own fact: it has decode requests and every one of them has exactly one query token."""
    if metadata is None or metadata.num_reqs == 0:
        return False
    qlens = torch.diff(metadata.qo_indptr)
    return bool((qlens == 1).all())


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


# ----------------------------------------------------------------------------------------------
# 4. Fixed-size buffers (CUDA-graph style) and the two builder designs
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class BufferSet:
    """One set of fixed-size buffers a builder fills for one step in flight (allocated once).

    Attributes:
        qo_indptr: ``(max_num_reqs + 1,) int32``; entries past the step's requests repeat the last value.
        kv_indptr: ``(max_num_reqs + 1,) int32``; tail padded with the last value (padded requests are empty).
        kv_indices: ``(max_num_kv_tokens,) int32``; entries past ``kv_indptr[num_reqs]`` are -1.
        kv_last_page_lens: ``(max_num_reqs,) int32``, ones (page_size 1).
        schedule: the persistent work buffers (filled only for single-token decode steps).
        generation: number of fills so far.
    """

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_lens: torch.Tensor
    schedule: PersistentSchedule
    generation: int = 0

    @classmethod
    def allocate(cls, sizes: PersistentBufferSizes, max_num_kv_tokens: int, kv_granularity: int = KV_GRANULARITY,
                 device: torch.device | str = "cpu") -> BufferSet:
        n = sizes.max_num_reqs
        return cls(
            qo_indptr=torch.zeros(n + 1, dtype=torch.int32, device=device),
            kv_indptr=torch.zeros(n + 1, dtype=torch.int32, device=device),
            kv_indices=torch.full((max_num_kv_tokens,), -1, dtype=torch.int32, device=device),
            kv_last_page_lens=torch.ones(n, dtype=torch.int32, device=device),
            schedule=PersistentSchedule.empty(sizes, kv_granularity, device),
        )

    def fill_(self, flat: DecodeMetadata) -> DecodeMetadata:
        """Copy one step's flat metadata into the fixed buffers; return metadata viewing them."""
        num_reqs, total = flat.num_reqs, int(flat.kv_indptr[-1])
        if num_reqs > self.kv_last_page_lens.numel():
            raise ValueError(f"the step has {num_reqs} requests but the buffers hold max_num_reqs = "
                             f"{self.kv_last_page_lens.numel()}; build the builder with a larger max_num_reqs")
        if total > self.kv_indices.numel():
            raise ValueError(f"the step has {total} KV tokens but kv_indices holds max_num_kv_tokens = "
                             f"{self.kv_indices.numel()}; build the builder with a larger max_num_kv_tokens")
        self.generation += 1
        for buf, src in ((self.qo_indptr, flat.qo_indptr), (self.kv_indptr, flat.kv_indptr)):
            buf[: num_reqs + 1] = src
            buf[num_reqs + 1:] = src[-1]  # padded requests: zero query tokens, zero KV tokens
        self.kv_indices[:total] = flat.kv_indices[:total]
        self.kv_indices[total:] = -1
        return DecodeMetadata(
            qo_indptr=self.qo_indptr[: num_reqs + 1], kv_indptr=self.kv_indptr[: num_reqs + 1],
            kv_indices=self.kv_indices[:total], kv_last_page_lens=self.kv_last_page_lens[:num_reqs],
            max_qo_len=flat.max_qo_len,
        )


class _DecodeMetadataBuilder:
    """What both designs share: a pool of buffer sets, the index expansion, the schedule.

    A step's buffer set is taken at build and given back by :meth:`release` after the step ran
    (:func:`run_step` does that), so ``num_buffer_sets`` steps can be built ahead of their runs. vLLM
    keeps one set and relies on build and run alternating; two let the interleavings of this chapter
    happen at all. The designs differ only in where the has-persistent-metadata flag lives.
    """

    design = "?"

    def __init__(self, *, max_num_reqs: int = 8, max_num_kv_tokens: int = 2048, kernel_block_size: int = 16,
                 num_units: int = 8, num_buffer_sets: int = 2, kv_granularity: int = KV_GRANULARITY,
                 device: torch.device | str = "cpu") -> None:
        _int_arg("max_num_kv_tokens", max_num_kv_tokens, 0)
        _int_arg("num_buffer_sets", num_buffer_sets, 1)
        self.kernel_block_size = _int_arg("kernel_block_size", kernel_block_size, 1)
        self.sizes = persistent_buffer_sizes(max_num_reqs, num_units)
        self.buffer_sets = [BufferSet.allocate(self.sizes, max_num_kv_tokens, kv_granularity, device)
                            for _ in range(num_buffer_sets)]
        self._free = list(self.buffer_sets)
        self._lock = threading.Lock()

    # -- buffer ownership ------------------------------------------------------------------------

    def _acquire(self) -> BufferSet:
        with self._lock:
            if not self._free:
                raise RuntimeError(
                    f"all {len(self.buffer_sets)} buffer sets are held by steps that were built but have not run; "
                    "CUDA-graph buffers can be refilled only after the step that filled them ran: run (or release) "
                    "a step first, or give the builder more buffer sets (num_buffer_sets)")
            return self._free.pop()

    def release(self, metadata: DecodeMetadata) -> None:
        """Give the step's buffer set back (after its run). Idempotent."""
        if isinstance(metadata.persistent, StepBuffers):
            with self._lock:
                if metadata.persistent.buffers not in self._free:
                    self._free.append(metadata.persistent.buffers)

    # -- building --------------------------------------------------------------------------------

    def build(self, block_table: torch.Tensor, seq_lens: torch.Tensor, query_lens) -> DecodeMetadata:
        """Build one step's decode metadata.

        Args:
            block_table: ``(num_reqs, max_blocks) int32`` (0 rows: a step with no decode requests).
            seq_lens: ``(num_reqs,) int32`` KV tokens per request, this step's queries included.
            query_lens: host-side query tokens per request (list or CPU tensor): all 1 for a decode
                step, all ``k + 1`` for a verify step.
        """
        from workbench import expand

        flat = expand.build_flat_decode_metadata(block_table, seq_lens, query_lens, self.kernel_block_size)
        return self.build_from_flat(flat)

    def build_from_flat(self, flat: DecodeMetadata) -> DecodeMetadata:
        """The rest of :meth:`build` once the flat indices exist (the stress test calls it with
        precomputed flat metadata: the expansion is a pure function of the step and irrelevant to the flag)."""
        if flat.num_reqs == 0:
            md = DecodeMetadata(flat.qo_indptr, flat.kv_indptr, flat.kv_indices, flat.kv_last_page_lens,
                                flat.max_qo_len)
            self._no_decode(md)
            return md
        buffers = self._acquire()
        md = buffers.fill_(flat)
        md.persistent = StepBuffers(buffers, buffers.generation)
        self._decode(md)
        return md

    def _fill_schedule(self, md: DecodeMetadata) -> bool:
        """Compute the persistent schedule when every request has one query token; say whether it did."""
        if md.max_qo_len != 1 or not step_supports_persistent(md):
            return False
        md.persistent.schedule.fill_(md.qo_indptr, md.kv_indptr)
        return True

    def _no_decode(self, md: DecodeMetadata) -> None:
        raise NotImplementedError

    def _decode(self, md: DecodeMetadata) -> None:
        raise NotImplementedError

    def decide(self, md: DecodeMetadata) -> tuple[bool, StepBuffers | None]:
        """At use time: does this step run the persistent path, and with which work buffers?"""
        raise NotImplementedError


class InstanceFlagBuilder(_DecodeMetadataBuilder):
    """The PR's first revision: the flag lives on the builder.

    ``has_persistent_metadata`` is reset to False at the start of every decode build, set to True once
    the schedule is filled, and read back from ``self`` when the step is used; the work buffers the
    use reaches are ``self.persistent``, the last ones this builder filled. A step with no decode
    requests does not reach the decode build, so it leaves the flag as the previous step set it.
    """

    design = "instance flag"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.has_persistent_metadata = False
        self.persistent: StepBuffers | None = None

    def _no_decode(self, md: DecodeMetadata) -> None:
        pass  # the decode build is skipped: self.has_persistent_metadata keeps its old value

    def _decode(self, md: DecodeMetadata) -> None:
        self.has_persistent_metadata = False
        if self._fill_schedule(md):
            self.persistent = md.persistent
            self.has_persistent_metadata = True

    def decide(self, md: DecodeMetadata) -> tuple[bool, StepBuffers | None]:
        return self.has_persistent_metadata, self.persistent


class MetadataFlagBuilder(_DecodeMetadataBuilder):
    """The merged design: the flag lives on the metadata the build returns.

    Each step's ``has_persistent_metadata`` and work buffers (``persistent``) travel with that step's
    metadata; the builder keeps no per-step facts, so no other build can change them.
    """

    design = "metadata flag"

    def _no_decode(self, md: DecodeMetadata) -> None:
        md.has_persistent_metadata = False

    def _decode(self, md: DecodeMetadata) -> None:
        md.has_persistent_metadata = self._fill_schedule(md)

    def decide(self, md: DecodeMetadata) -> tuple[bool, StepBuffers | None]:
        return md.has_persistent_metadata, md.persistent


DESIGNS = {"instance": InstanceFlagBuilder, "metadata": MetadataFlagBuilder}


# ----------------------------------------------------------------------------------------------
# 5. Steps, runs and named interleavings
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DecodeStep:
    """One step's inputs.

    Attributes:
        name: a label ("D", "V", "N", ...).
        kind: ``"decode"`` (every query length 1), ``"verify"`` (every query length ``k + 1``) or
            ``"none"`` (no decode requests).
        block_table: ``(num_reqs, max_blocks) int32``.
        seq_lens: ``(num_reqs,) int32``.
        query_lens: ``list[int]`` host-side.
        q: ``(sum(query_lens), H, 576) float32``.
    """

    name: str
    kind: str
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_lens: list[int]
    q: torch.Tensor


_KINDS = ("decode", "verify", "none")


def make_steps(kinds: dict[str, str] | None = None, *, num_reqs: int = 3, num_spec_tokens: int = 3,
               num_heads: int = 4, kernel_block_size: int = 16, max_seq_len: int = 70,
               seed: int = 0) -> tuple[torch.Tensor, dict[str, DecodeStep]]:
    """Random steps over one shared KV cache, in the style of vLLM's attention tests.

    Each request owns its own blocks, drawn from a random permutation with block 0 reserved; every
    cache row that no request's tokens cover is NaN, so a stray read shows up as NaN output.

    Args:
        kinds: step name -> kind (default ``{"D": "decode", "V": "verify", "N": "none"}``).
        num_reqs: requests per step (steps of kind ``"none"`` have 0).
        num_spec_tokens: ``k``; a verify step has ``k + 1`` query tokens per request.
        num_heads, kernel_block_size, max_seq_len, seed: sizes and the seed.

    Returns:
        ``kv_cache`` ``[num_blocks * kernel_block_size, 576] float32`` (the page_size-1 view) and the steps.
    """
    kinds = {"D": "decode", "V": "verify", "N": "none"} if kinds is None else dict(kinds)
    for name, kind in kinds.items():
        if kind not in _KINDS:
            raise ValueError(f"step {name!r} has kind {kind!r}; kinds are {_KINDS}")
    _int_arg("num_reqs", num_reqs, 1)
    _int_arg("num_spec_tokens", num_spec_tokens, 1)
    K = _int_arg("kernel_block_size", kernel_block_size, 1)
    _int_arg("max_seq_len", max_seq_len, num_spec_tokens + 1)
    g = torch.Generator().manual_seed(seed)
    max_blocks = -(-max_seq_len // K)
    plan = []
    for name, kind in kinds.items():
        qlen = {"decode": 1, "verify": num_spec_tokens + 1, "none": 0}[kind]
        n = 0 if kind == "none" else num_reqs
        lens = torch.randint(qlen, max_seq_len + 1, (n,), generator=g).tolist()
        plan.append((name, kind, qlen, lens))
    num_blocks = 1 + sum(len(lens) for *_, lens in plan) * max_blocks
    perm = (1 + torch.randperm(num_blocks - 1, generator=g)).tolist()  # block 0 is never handed out
    cache = torch.full((num_blocks * K, mla.QK_HEAD_DIM), float("nan"))
    steps = {}
    for name, kind, qlen, lens in plan:
        table = torch.zeros(len(lens), max_blocks, dtype=torch.int32)
        for r, seq_len in enumerate(lens):
            blocks = [perm.pop() for _ in range(max_blocks)]
            table[r] = torch.tensor(blocks, dtype=torch.int32)
            rows = torch.tensor([blocks[t // K] * K + t % K for t in range(seq_len)], dtype=torch.long)
            cache[rows] = torch.randn(seq_len, mla.QK_HEAD_DIM, generator=g)
        q = torch.randn(qlen * len(lens), num_heads, mla.QK_HEAD_DIM, generator=g)
        steps[name] = DecodeStep(name, kind, table, torch.tensor(lens, dtype=torch.int32), [qlen] * len(lens), q)
    return cache, steps


@dataclasses.dataclass
class StepResult:
    """What :func:`run_step` did: the output, the path, and the decision against the step's own facts."""

    out: torch.Tensor | None
    lse: torch.Tensor | None
    path: str  # "persistent" | "non-persistent" | "none"
    used_persistent: bool  # the design's decision
    supports_persistent: bool  # the step's own fact (step_supports_persistent)


def run_step(builder: _DecodeMetadataBuilder, md: DecodeMetadata, q: torch.Tensor, kv_cache: torch.Tensor,
             sm_scale: float | None = None, *, check: bool = True) -> StepResult:
    """Run one built step the way its builder's design decides, then give its buffers back.

    The persistent path is :func:`execute_schedule` (it refuses what it cannot run when ``check``);
    the non-persistent path is the golden :func:`workbench.mla.mla_decode_ref`, standing in for aiter's
    non-persistent kernel, which computes its own split.
    """
    used, work = builder.decide(md)
    truth = step_supports_persistent(md)
    try:
        if used:
            if work is None:
                raise ValueError("the design chose the persistent path but holds no work buffers")
            out, lse = execute_schedule(work, md, q, kv_cache, sm_scale, check=check)
            return StepResult(out, lse, "persistent", used, truth)
        if md.num_reqs == 0:
            return StepResult(None, None, "none", used, truth)
        out, lse = mla.mla_decode_ref(q, kv_cache, md.qo_indptr, md.kv_indptr, md.kv_indices, sm_scale)
        return StepResult(out, lse, "non-persistent", used, truth)
    finally:
        builder.release(md)


@dataclasses.dataclass(frozen=True)
class ReplayEvent:
    """One event of :func:`replay`."""

    t: int
    design: str
    action: str  # "build" | "run"
    step: str
    kind: str
    flag: bool  # the flag the design reports for this step at this moment
    truth: bool  # the step's own fact
    outcome: str  # "built", "ok", "slow path", "refused", "output differs"
    detail: str


# Named interleavings: (action, step) events over the steps of make_steps() (D decode, V verify, N none).
INTERLEAVINGS: dict[str, list[tuple[str, str]]] = {
    "in order": [("build", "D"), ("run", "D"), ("build", "V"), ("run", "V"), ("build", "N"), ("run", "N")],
    "verify built, decode built, verify runs": [("build", "V"), ("build", "D"), ("run", "V"), ("run", "D")],
    "decode built, verify built, decode runs": [("build", "D"), ("build", "V"), ("run", "D"), ("run", "V")],
    "a step without decodes after a decode": [("build", "D"), ("run", "D"), ("build", "N"), ("run", "N")],
}


def _golden_for(step: DecodeStep, kv_cache: torch.Tensor, kernel_block_size: int, sm_scale: float | None):
    """The step's golden output, computed from its block table (independent of any builder buffer)."""
    paged = kv_cache.reshape(-1, kernel_block_size, kv_cache.shape[-1])
    qo = torch.tensor([0] + list(torch.tensor(step.query_lens, dtype=torch.int64).cumsum(0).tolist()),
                      dtype=torch.int32)
    return mla.mla_decode_paged_ref(step.q, paged, qo, step.block_table, step.seq_lens, sm_scale)


def replay(design: str, events: Sequence[tuple[str, str]] | str, steps: dict[str, DecodeStep],
           kv_cache: torch.Tensor, *, check: bool = True, sm_scale: float | None = None,
           **builder_kwargs) -> list[ReplayEvent]:
    """Play builds and runs in the given order through one builder of the given design.

    Every run is judged by something real: the schedule refusing (``check``), or the output compared
    with the golden decode of the step computed from its own block table (NaN counts as a difference).

    Args:
        design: ``"instance"`` or ``"metadata"`` (:data:`DESIGNS`).
        events: a list of ``("build" | "run", step name)``, or a key of :data:`INTERLEAVINGS`.
        steps, kv_cache: from :func:`make_steps`.
        check: passed to :func:`execute_schedule`.
        builder_kwargs: passed to the builder (``kernel_block_size`` must match the steps').
    """
    if design not in DESIGNS:
        raise ValueError(f"design is {design!r}; choose one of {sorted(DESIGNS)}")
    if isinstance(events, str):
        if events not in INTERLEAVINGS:
            raise ValueError(f"no interleaving named {events!r}; named ones: {list(INTERLEAVINGS)}")
        events = INTERLEAVINGS[events]
    builder = DESIGNS[design](**builder_kwargs)
    built: dict[str, DecodeMetadata] = {}
    log = []
    for t, (action, name) in enumerate(events):
        if name not in steps:
            raise ValueError(f"event {t} names step {name!r}; the steps are {list(steps)}")
        step = steps[name]
        if action == "build":
            md = built[name] = builder.build(step.block_table, step.seq_lens, step.query_lens)
            flag = builder.decide(md)[0]
            log.append(ReplayEvent(t, design, action, name, step.kind, flag, step_supports_persistent(md), "built",
                                   f"flag now {flag}"))
            continue
        if action != "run":
            raise ValueError(f"event {t} has action {action!r}; actions are 'build' and 'run'")
        if name not in built:
            raise ValueError(f"event {t} runs step {name!r} before it was built")
        md = built.pop(name)
        flag = builder.decide(md)[0]
        truth = step_supports_persistent(md)
        try:
            result = run_step(builder, md, step.q, kv_cache, sm_scale, check=check)
        except ValueError as exc:
            log.append(ReplayEvent(t, design, action, name, step.kind, flag, truth, "refused", str(exc)))
            continue
        if result.out is None:
            log.append(ReplayEvent(t, design, action, name, step.kind, flag, truth, "ok", "nothing to run"))
            continue
        gold, _ = _golden_for(step, kv_cache, builder.kernel_block_size, sm_scale)
        err = (result.out - gold).abs()
        bad = bool(torch.isnan(result.out).any()) or not torch.allclose(result.out, gold, atol=1e-5, rtol=1e-5)
        detail = f"{result.path} path, max |out - golden| = {float(err.nan_to_num(float('inf')).max()):.1e}"
        if bad:
            outcome = "output differs"
        elif result.path == "non-persistent" and truth:
            outcome = "slow path"  # right numbers, but the step's schedule was built and then not used
        else:
            outcome = "ok"
        log.append(ReplayEvent(t, design, action, name, step.kind, flag, truth, outcome, detail))
    return log


def replay_all(steps: dict[str, DecodeStep], kv_cache: torch.Tensor, *, check: bool = True,
               **builder_kwargs) -> dict[str, list[ReplayEvent]]:
    """Every interleaving of :data:`INTERLEAVINGS` through both designs: name -> events of both."""
    return {name: [e for design in DESIGNS for e in replay(design, name, steps, kv_cache, check=check,
                                                              **builder_kwargs)]
            for name in INTERLEAVINGS}


# ----------------------------------------------------------------------------------------------
# 6. The threaded stress test
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StressResult:
    """Counts from :func:`stress_test` (decisions taken at use time, compared with the step's own facts)."""

    design: str
    mode: str
    threads: int
    builds: int
    wrong_flag: int  # decisions that differ from step_supports_persistent(step)
    persistent_on_verify: int  # would run the schedule for a qlen > 1 step (refused / wrong output)
    persistent_on_no_decode: int  # claims a schedule for a step with no decode requests (stale flag)
    skipped_on_decode: int  # a decode step sent to the slow path although its schedule was built
    foreign_schedule: int  # right flag, but the work buffers reached belong to another step
    seconds: float

    @property
    def mismatches(self) -> int:
        """Uses whose decision or work buffers were not this step's own."""
        return self.wrong_flag + self.foreign_schedule


def _stress_templates(seed: int) -> list[tuple[str, DecodeMetadata, bool]]:
    """Tiny precomputed flat metadata of each kind (built once with the real expansion)."""
    from workbench import expand

    cache_kinds = {"d1": "decode", "d2": "decode", "v1": "verify", "v2": "verify", "n": "none"}
    _, steps = make_steps(cache_kinds, num_reqs=2, num_spec_tokens=3, num_heads=1, max_seq_len=40, seed=seed)
    out = []
    for step in steps.values():
        flat = expand.build_flat_decode_metadata(step.block_table, step.seq_lens, step.query_lens, 16)
        out.append((step.kind, flat, step.kind == "decode"))
    return out


def stress_test(design: str, *, threads: int = 8, builds_per_thread: int = 10_000, mode: str = "natural",
                seed: int = 0, num_units: int = 4) -> StressResult:
    """Share one builder between threads; each thread builds random steps and uses each right away.

    A use asks the design :meth:`decide` and compares the answer with the step's own fact. In
    ``"natural"`` mode the threads run freely (whether a build of one thread lands between another's
    build and use is up to the interpreter's thread switching); in ``"barrier"`` mode every thread
    builds, all wait at a barrier, then all use: the interleaving is forced every round.

    Builds are cheap: the flat indices of five tiny steps are precomputed once with the real expansion
    (:func:`workbench.expand.build_flat_decode_metadata`) and every build runs the rest of the builder
    (:meth:`build_from_flat`: buffer copies, the schedule, the flag). Nothing is executed: the counts
    are decisions. The builder holds one buffer set per thread, so buffers are never short.
    """
    if design not in DESIGNS:
        raise ValueError(f"design is {design!r}; choose one of {sorted(DESIGNS)}")
    if mode not in ("natural", "barrier"):
        raise ValueError(f"mode is {mode!r}; choose 'natural' or 'barrier'")
    _int_arg("threads", threads, 1)
    _int_arg("builds_per_thread", builds_per_thread, 0)
    templates = _stress_templates(seed)
    builder = DESIGNS[design](max_num_reqs=2, max_num_kv_tokens=128, num_units=num_units, num_buffer_sets=threads)
    barrier = threading.Barrier(threads) if mode == "barrier" else None
    counts = [[0] * 5 for _ in range(threads)]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        rng = random.Random(seed * 1_000_003 + i)
        c = counts[i]
        try:
            for _ in range(builds_per_thread):
                kind, flat, truth = templates[rng.randrange(len(templates))]
                md = builder.build_from_flat(flat)
                if barrier is not None:
                    barrier.wait()
                used, work = builder.decide(md)
                if used != truth:
                    c[0] += 1
                    if used and kind == "verify":
                        c[1] += 1
                    elif used and kind == "none":
                        c[2] += 1
                    elif not used:
                        c[3] += 1
                elif used and (work is not md.persistent or not work.current):
                    c[4] += 1
                builder.release(md)
                if barrier is not None:
                    barrier.wait()
        except BaseException as exc:  # surface a worker's failure instead of a silent short count
            errors.append(exc)
            if barrier is not None:
                barrier.abort()

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"a stress-test thread failed: {errors[0]!r}") from errors[0]
    total = [sum(c[j] for c in counts) for j in range(5)]
    return StressResult(DESIGNS[design].design, mode, threads, threads * builds_per_thread, *total, seconds)


def format_stress_table(results: Sequence[StressResult]) -> str:
    """A plain-text table of stress results, one row per run."""
    head = ("design", "mode", "threads", "builds", "mismatches", "wrong flag", "sched. on verify",
            "stale on no-decode", "skipped decode", "foreign buffers")
    rows = [head] + [(r.design, r.mode, str(r.threads), f"{r.builds:,}", f"{r.mismatches:,}", f"{r.wrong_flag:,}",
                      f"{r.persistent_on_verify:,}", f"{r.persistent_on_no_decode:,}", f"{r.skipped_on_decode:,}",
                      f"{r.foreign_schedule:,}") for r in results]
    widths = [max(len(row[j]) for row in rows) for j in range(len(head))]
    lines = ["  ".join(cell.rjust(w) if j >= 2 else cell.ljust(w) for j, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
