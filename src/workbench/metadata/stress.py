"""The threaded stress test: one builder shared by several threads, wrong decisions counted.

Each thread builds random steps and uses each at once, asking the design for its decision and comparing
it with the step's own fact (:func:`workbench.metadata.step_supports_persistent`).
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Sequence

from workbench import expand
from workbench.decode_metadata import DecodeMetadata
from workbench.metadata.builders import DESIGNS
from workbench.metadata.interleavings import make_steps
from workbench.metadata.schedule import _int_arg

__all__ = ["StressResult", "stress_test", "format_stress_table"]


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
    builds, all wait at a barrier, then all use: the interleaving is forced at every build.

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
