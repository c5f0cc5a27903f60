"""Persistent scheduling for MLA decode (aiter-style, query length 1), and where ``has_persistent_metadata`` lives.

Two things, both made executable:

1. **The persistent schedule** (:mod:`~workbench.metadata.schedule`, :mod:`~workbench.metadata.execute`).
   :class:`PersistentSchedule` models aiter's ``get_mla_metadata_v1`` for single-token decode: the KV of
   all requests, counted in granules of ``kv_granularity = 16`` tokens, is split evenly over ``N`` units;
   each unit gets contiguous work items (request, query range, KV range, partial slot or ``-1`` for a
   direct write); a request cut across units becomes *partials*, merged afterwards by their log-sum-exp
   through three reduce maps. :func:`execute_schedule` runs a schedule and equals the golden decode
   (:func:`workbench.mla.mla_decode_ref`). Asked for query length > 1 it refuses, with the reason.

2. **The two builder designs** for the flag that says whether a step has a schedule
   (:mod:`~workbench.metadata.builders`): vLLM PR #39616's first revision kept it on the builder
   (:class:`InstanceFlagBuilder`), the merged version on the decode metadata (:class:`MetadataFlagBuilder`).
   :func:`replay` runs named interleavings of builds and runs through them
   (:mod:`~workbench.metadata.interleavings`); :func:`stress_test` runs thousands of builds from several
   threads and counts wrong decisions (:mod:`~workbench.metadata.stress`).

A model of aiter's scheduler and of the PR's builder, written from their documentation and described in
our own words; it is not their code.
"""

from workbench.decode_metadata import DecodeMetadata
from workbench.metadata.builders import DESIGNS, BufferSet, InstanceFlagBuilder, MetadataFlagBuilder, StepBuffers
from workbench.metadata.execute import execute_schedule
from workbench.metadata.interleavings import (
    INTERLEAVINGS,
    DecodeStep,
    ReplayEvent,
    StepResult,
    make_steps,
    replay,
    replay_all,
    run_step,
)
from workbench.metadata.schedule import (
    KV_GRANULARITY,
    WORK_INFO_FIELDS,
    PersistentBufferSizes,
    PersistentSchedule,
    WorkItem,
    persistent_buffer_sizes,
    step_supports_persistent,
)
from workbench.metadata.stress import StressResult, format_stress_table, stress_test

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
