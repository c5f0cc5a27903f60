"""The persistent schedule for single-token MLA decode: buffer sizes and the scheduler that fills them.

aiter's "persistent" MLA decode launches one long-lived workgroup per compute unit (CU) and hands each a
precomputed list of work items, so that one long request is cut across many CUs and a batch of short ones
is packed onto few. :class:`PersistentSchedule` models the scheduler that fills those lists (aiter's
``get_mla_metadata_v1``) for query length 1, and :func:`persistent_buffer_sizes` the sizing that precedes
it (``get_mla_metadata_info_v1``). :func:`step_supports_persistent` is the one fact that decides whether a
step can use a schedule. A model written from aiter's documentation, in our own words; not aiter's code.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from workbench import mla
from workbench.decode_metadata import DecodeMetadata

__all__ = [
    "KV_GRANULARITY",
    "WORK_INFO_FIELDS",
    "PersistentBufferSizes",
    "persistent_buffer_sizes",
    "WorkItem",
    "PersistentSchedule",
    "step_supports_persistent",
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
# Buffer sizes (the analogue of aiter's get_mla_metadata_info_v1)
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
# The schedule (the analogue of aiter's get_mla_metadata_v1, query length 1)
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


def step_supports_persistent(metadata: DecodeMetadata | None) -> bool:
    """The step's own fact: it has decode requests and every one of them has exactly one query token."""
    if metadata is None or metadata.num_reqs == 0:
        return False
    qlens = torch.diff(metadata.qo_indptr)
    return bool((qlens == 1).all())
