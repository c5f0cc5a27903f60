"""Steps, runs and named interleavings of builds and runs through one builder of either design.

:func:`make_steps` draws steps over one NaN-filled KV cache (vLLM's test style: block 0 reserved, blocks
permuted); :func:`run_step` runs a built step on the path its design chooses; :func:`replay` plays a
named order of builds and runs and judges every run by something real: the executor refusing, or the
output compared with the golden decode computed from the step's own block table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from workbench import mla
from workbench.decode_metadata import DecodeMetadata
from workbench.metadata.builders import DESIGNS, _DecodeMetadataBuilder
from workbench.metadata.execute import execute_schedule
from workbench.metadata.schedule import _int_arg, step_supports_persistent

__all__ = ["DecodeStep", "make_steps", "StepResult", "run_step", "ReplayEvent", "INTERLEAVINGS", "replay",
           "replay_all"]


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

