"""The builder side: CUDA-graph buffer sets, and the two designs for ``has_persistent_metadata``.

vLLM PR #39616 computes the persistent schedule only when every decode request has one query token
(``max_qo_len == 1``) and records that choice in ``has_persistent_metadata``. Its first revision kept the
flag on the builder (``self._has_persistent_metadata``, reset at the start of every decode build and read
back later); a review flagged that as state that can leak between builds, and the merged version puts the
flag on the decode metadata it returns. :class:`InstanceFlagBuilder` and :class:`MetadataFlagBuilder`
model the two on one base class that does everything else identically.

Both model CUDA-graph persistent buffers: fixed-size tensors allocated once (a small pool of
:class:`BufferSet`), ``kv_indptr``/``qo_indptr`` tails padded with their last value, unused
``kv_indices`` entries ``-1``, unused work rows ``-1``. A model of the PR's builder written from its
description, in our own words; not its code.
"""

from __future__ import annotations

import dataclasses
import threading

import torch

from workbench import expand
from workbench.decode_metadata import DecodeMetadata
from workbench.metadata.schedule import (
    KV_GRANULARITY,
    PersistentBufferSizes,
    PersistentSchedule,
    _int_arg,
    persistent_buffer_sizes,
    step_supports_persistent,
)

__all__ = ["BufferSet", "StepBuffers", "InstanceFlagBuilder", "MetadataFlagBuilder", "DESIGNS"]


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



class _DecodeMetadataBuilder:
    """What both designs share: a pool of buffer sets, the index expansion, the schedule.

    A step's buffer set is taken at build and given back by :meth:`release` after the step ran
    (:func:`~workbench.metadata.run_step` does that), so ``num_buffer_sets`` steps can be built ahead of
    their runs. vLLM keeps one set and relies on build and run alternating; two let the interleavings of
    :func:`~workbench.metadata.replay` happen at all. The designs differ only in where the
    has-persistent-metadata flag lives.
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
