"""Speculative decoding on :class:`~workbench.qlen.TinyMLA`, and the losslessness check against greedy decoding.

A cheap draft proposes ``k`` tokens; the target verifies them in one ``qlen = k + 1`` decode call per
layer (as vLLM verifies); acceptance statistics are counted as vLLM counts them. With a correct target,
speculative decoding emits exactly what plain greedy decoding emits (:func:`check_lossless`,
:func:`sweep_k`); under the emulated aiter #2720 fault it does not when ``k + 1`` is not a power of two.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from workbench import mla
from workbench.pow2 import check_count as _check_count, is_pow2, next_pow2
from workbench.qlen._shared import one_cpu_thread
from workbench.qlen.fault import BACKENDS
from workbench.qlen.model import KVState, TinyMLA

__all__ = ["DRAFTS", "Divergence", "LosslessReport", "LossyDecoding", "SpecRun", "check_lossless",
           "default_prompts", "format_sweep", "greedy_decode", "speculative_decode", "sweep_k"]

DRAFTS = ("frozen-context", "ngram")


class LossyDecoding(AssertionError):
    """Speculative decoding emitted something plain greedy decoding of the same target would not."""


def default_prompts(num_prompts: int = 4, prompt_len: int = 12, vocab_size: int = 64, seed: int = 1) -> list[list[int]]:
    """``num_prompts`` seeded random prompts of ``prompt_len`` tokens."""
    _check_count("num_prompts", num_prompts, 1)
    _check_count("prompt_len", prompt_len, 1)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (num_prompts, prompt_len), generator=g).tolist()


def _check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int) -> list[list[int]]:
    if not prompts:
        raise ValueError("prompts is empty; pass at least one prompt (a list of token ids)")
    out = []
    for i, p in enumerate(prompts):
        p = list(p)
        if not p:
            raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token")
        if not all(isinstance(t, int) and 0 <= t < vocab_size for t in p):
            raise ValueError(f"prompts[{i}] holds {p[:8]}...; token ids must be ints in 0..{vocab_size - 1}")
        out.append(p)
    return out


def _prefill(model: TinyMLA, state: KVState, prompts: list[list[int]], backend: str) -> list[int]:
    """Feed the prompts one token per step (qlen 1, a power of two); return each request's first new token."""
    first = [0] * len(prompts)
    for t in range(max(len(p) for p in prompts)):
        ids = [r for r, p in enumerate(prompts) if t < len(p)]
        tok = torch.tensor([[prompts[r][t]] for r in ids], device=model.device)
        out = model.forward(state, ids, tok, backend=backend)
        for i, r in enumerate(ids):
            state.seq_lens[r] += 1
            if t == len(prompts[r]) - 1:
                first[r] = int(out.logits[i, 0].argmax())
    return first


def greedy_decode(model: TinyMLA, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                  backend: str = "torch") -> tuple[list[list[int]], float]:
    """Plain greedy decoding, one token per step (every decode call has ``qlen = 1``).

    Returns:
        ``(tokens, min_margin)``: the ``max_new_tokens`` new tokens of each prompt, and the smallest gap
        between the best and second-best logit over all choices (how far the run is from a tie).
    """
    prompts = _check_prompts(prompts, model.config.vocab_size)
    _check_count("max_new_tokens", max_new_tokens, 1)
    with one_cpu_thread(model.device):
        return _greedy(model, prompts, max_new_tokens, backend)


def _greedy(model: TinyMLA, prompts: list[list[int]], max_new_tokens: int, backend: str):
    state = model.new_state(len(prompts), max(map(len, prompts)) + max_new_tokens + 1)
    out = [[t] for t in _prefill(model, state, prompts, backend)]
    margin = math.inf
    ids = list(range(len(prompts)))
    for _ in range(max_new_tokens - 1):
        res = model.forward(state, ids, torch.tensor([[o[-1]] for o in out], device=model.device), backend=backend)
        top2 = res.logits[:, 0].topk(2, dim=-1).values
        margin = min(margin, float((top2[:, 0] - top2[:, 1]).min()))
        for r in ids:
            state.seq_lens[r] += 1
            out[r].append(int(res.logits[r, 0].argmax()))
    return out, margin


def _ngram_draft(history: list[int], k: int, n_max: int = 3) -> list[int]:
    """Prompt-lookup draft: find the latest earlier occurrence of the last ``n`` tokens (``n_max`` down to 1)
    and propose the ``k`` tokens that followed it; with no match, repeat the last token."""
    for n in range(min(n_max, len(history) - 1), 0, -1):
        tail = history[-n:]
        for start in range(len(history) - n - 1, -1, -1):
            if history[start:start + n] == tail:
                follow = history[start + n:start + n + k]
                return follow + [follow[-1]] * (k - len(follow))
    return [history[-1]] * k


@dataclasses.dataclass
class SpecRun:
    """One speculative-decoding run and its statistics, counted the way vLLM counts them
    (``SpecDecodingStats.observe_draft``: one draft per request per verification step)."""

    k: int
    backend: str
    pad_to_pow2: bool
    draft: str
    tokens: list[list[int]]
    num_drafts: int
    num_accepted_tokens: int
    accepted_per_pos: list[int]  # drafts whose position i+1 was accepted (a prefix: decreasing)

    @property
    def verify_qlen(self) -> int:
        """Query tokens per request in the verification call: the last token plus k drafts."""
        return self.k + 1

    @property
    def call_qlen(self) -> int:
        """``max_seqlen_q`` the attention backend sees: ``k + 1``, or the next power of two when padded."""
        return next_pow2(self.k + 1) if self.pad_to_pow2 else self.k + 1

    @property
    def acceptance_rates(self) -> list[float]:
        """vLLM's per-position acceptance rates: accepted at position i / number of drafts."""
        return [n / self.num_drafts for n in self.accepted_per_pos] if self.num_drafts else [math.nan] * self.k

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted tokens per draft (vLLM counts the bonus token)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else math.nan

    @property
    def draft_acceptance_rate(self) -> float:
        """Accepted / drafted tokens."""
        return self.num_accepted_tokens / (self.num_drafts * self.k) if self.num_drafts else math.nan

    def vllm_log_line(self) -> str:
        """The statistics in the shape of vLLM's ``SpecDecoding metrics`` log line (without throughputs)."""
        rates = ", ".join(f"{r:.3f}" for r in self.acceptance_rates)
        return (f"SpecDecoding metrics: Mean acceptance length: {self.mean_acceptance_length:.2f}, "
                f"Accepted: {self.num_accepted_tokens} tokens, Drafted: {self.num_drafts * self.k} tokens, "
                f"Per-position acceptance rate: {rates}, "
                f"Avg Draft acceptance rate: {100 * self.draft_acceptance_rate:.1f}%")


def speculative_decode(model: TinyMLA, prompts: Sequence[Sequence[int]], max_new_tokens: int, k: int, *,
                       backend: str = "torch", pad_to_pow2: bool = False, draft: str = "frozen-context",
                       draft_noise: float = 0.1, draft_seed: int = 7) -> SpecRun:
    """Greedy chain speculative decoding: ``k`` draft tokens per step, verified in ONE decode call per
    layer with ``max_qo_len = k + 1`` (the last emitted token followed by the drafts), as vLLM verifies.

    Each step, per request: draft ``d_1..d_k``; run the target on ``[x_last, d_1..d_k]``; its greedy
    choices ``t_0..t_k``; accept the longest prefix with ``d_i == t_{i-1}`` (``a`` tokens), emit
    ``d_1..d_a`` and the bonus ``t_a``; keep ``a + 1`` new cache rows. With a correct target this emits
    exactly what :func:`greedy_decode` emits.

    Drafts (both cheap next to the target's verification):

    * ``"frozen-context"``: a stand-in for Eagle's reuse of the target's features. One target step on
      ``x_last`` alone (``qlen 1``) gives each layer's attention output for ``x_last``; the draft then
      proposes with the token-local layers only (:meth:`TinyMLA.forward_frozen`), every layer's
      attention frozen at that value, and a head perturbed by ``draft_noise`` (relative, seeded).
      Note what this means under the #2720 fault: there the target's positions 1..k *also* receive
      position 0's (``x_last``'s) attention, so the faulty target computes what this draft computes.
    * ``"ngram"``: prompt lookup (:func:`_ngram_draft`); no model at all.

    Args:
        backend: attention backend of every target step (see :data:`BACKENDS`).
        pad_to_pow2: verify with the queries padded to ``next_pow2(k + 1)`` (:func:`pad_queries_to_pow2`).
    """
    prompts = _check_prompts(prompts, model.config.vocab_size)
    _check_count("max_new_tokens", max_new_tokens, 1)
    _check_count("k", k, 1)
    if k + 1 > mla.MAX_QLEN:
        raise ValueError(f"k is {k}; verification runs k + 1 = {k + 1} query tokens but the decode path takes "
                         f"at most {mla.MAX_QLEN}: use k <= {mla.MAX_QLEN - 1}")
    if draft not in DRAFTS:
        raise ValueError(f"draft is {draft!r}; choose one of {DRAFTS}")
    if backend not in BACKENDS:
        raise ValueError(f"backend is {backend!r}; choose one of {BACKENDS}")
    with one_cpu_thread(model.device):
        return _speculative(model, prompts, max_new_tokens, k, backend, pad_to_pow2, draft, draft_noise, draft_seed)


def _speculative(model: TinyMLA, prompts: list[list[int]], max_new_tokens: int, k: int, backend: str,
                 pad_to_pow2: bool, draft: str, draft_noise: float, draft_seed: int) -> SpecRun:
    dev = model.device
    g = torch.Generator().manual_seed(draft_seed)
    draft_head = model.head + draft_noise * model.head.std() * torch.randn(model.head.shape, generator=g).to(dev)
    n = len(prompts)
    state = model.new_state(n, max(map(len, prompts)) + max_new_tokens + 2 * k + 2)
    out = [[t] for t in _prefill(model, state, prompts, backend)]
    num_drafts = num_accepted = 0
    per_pos = [0] * k
    while True:
        ids = [r for r in range(n) if len(out[r]) < max_new_tokens]
        if not ids:
            break
        x_last = torch.tensor([out[r][-1] for r in ids], device=dev)
        if draft == "frozen-context":
            # writes x_last's cache rows; the verification below rewrites them with the same values
            ctx = model.forward(state, ids, x_last[:, None], backend=backend)
            frozen = [a[:, 0] for a in ctx.attn]
            tok = (ctx.hidden[:, 0] @ draft_head).argmax(-1)
            cols = [tok]
            p0 = torch.tensor([state.seq_lens[r] for r in ids], device=dev)  # x_last's position
            for j in range(1, k):
                tok = (model.forward_frozen(tok, p0 + j, frozen) @ draft_head).argmax(-1)
                cols.append(tok)
            drafts = torch.stack(cols, dim=1)  # (R, k)
        else:
            drafts = torch.tensor([_ngram_draft(prompts[r] + out[r], k) for r in ids], device=dev)
        verify = model.forward(state, ids, torch.cat([x_last[:, None], drafts], dim=1), backend=backend,
                               pad_to_pow2=pad_to_pow2)
        target = verify.logits.argmax(-1)  # (R, k + 1): t_0 .. t_k
        match = (drafts == target[:, :k]).int().cumprod(dim=1)  # 1 while the prefix still matches
        for i, r in enumerate(ids):
            a = int(match[i].sum())
            num_drafts += 1
            num_accepted += a
            for j in range(a):
                per_pos[j] += 1
            state.seq_lens[r] += a + 1  # x_last and the accepted drafts stay in the cache
            new = drafts[i, :a].tolist() + [int(target[i, a])]
            out[r].extend(new[:max_new_tokens - len(out[r])])
    return SpecRun(k, backend, pad_to_pow2, draft, out, num_drafts, num_accepted, per_pos)


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Where a speculative output first differs from plain greedy decoding."""

    request: int
    index: int  # position among the new tokens (0 = the first generated token)
    expected: int  # greedy decoding's token
    got: int  # speculative decoding's token


@dataclasses.dataclass
class LosslessReport:
    """A speculative run next to plain greedy decoding of the same target on the same backend."""

    run: SpecRun
    reference: list[list[int]]
    reference_margin: float  # smallest top-1 / top-2 logit gap of the reference (distance from a tie)

    @property
    def first_divergence(self) -> Divergence | None:
        """The earliest (by token index, then request) token where the outputs differ, or None."""
        found = []
        for r, (ref, got) in enumerate(zip(self.reference, self.run.tokens)):
            for i, (a, b) in enumerate(zip(ref, got)):
                if a != b:
                    found.append(Divergence(r, i, a, b))
                    break
        return min(found, key=lambda d: (d.index, d.request)) if found else None

    @property
    def lossless(self) -> bool:
        return self.run.tokens == self.reference

    def raise_if_lossy(self) -> LosslessReport:
        """Return ``self`` if lossless, else raise :class:`LossyDecoding` naming the first divergent token."""
        div = self.first_divergence
        if div is not None:
            raise LossyDecoding(
                f"speculative decoding with k={self.run.k} on backend {self.run.backend!r} (verification max_seqlen_q "
                f"{self.run.call_qlen}) diverges from greedy decoding at request {div.request}, new token {div.index}: "
                f"greedy {div.expected}, speculative {div.got}. With aiter's non-persistent MLA decode, use k + 1 a "
                "power of two or pad_to_pow2=True (aiter #2720)")
        return self

    def summary(self) -> str:
        run = self.run
        div = self.first_divergence
        verdict = "lossless" if div is None else \
            f"DIVERGES at request {div.request} token {div.index} (greedy {div.expected}, speculative {div.got})"
        return (f"k={run.k:2d} verify qlen {run.verify_qlen:2d} -> call qlen {run.call_qlen:2d} "
                f"({'pow2' if is_pow2(run.call_qlen) else 'not pow2'}) {run.backend}"
                f"{' padded' if run.pad_to_pow2 else ''}: mean acceptance length {run.mean_acceptance_length:.2f}; "
                f"{verdict}")


_REFERENCE_CACHE: dict[tuple, tuple[list[list[int]], float]] = {}


def _reference(model: TinyMLA, prompts: list[list[int]], max_new_tokens: int, backend: str):
    key = (model.config, tuple(map(tuple, prompts)), max_new_tokens, backend)
    if key not in _REFERENCE_CACHE:
        _REFERENCE_CACHE[key] = greedy_decode(model, prompts, max_new_tokens, backend=backend)
    return _REFERENCE_CACHE[key]


def check_lossless(k: int, *, backend: str = "torch", pad_to_pow2: bool = False, draft: str = "frozen-context",
                   model: TinyMLA | None = None, prompts: Sequence[Sequence[int]] | None = None,
                   max_new_tokens: int = 40, **spec_kwargs: Any) -> LosslessReport:
    """Speculative decoding with ``k`` drafts against plain greedy decoding, both on ``backend``.

    The reference runs on the same backend: its decode calls all have ``qlen = 1``, a power of two, so
    even ``"aiter-pow2-fault"`` computes it correctly. Defaults: ``TinyMLA()`` and
    :func:`default_prompts` (4 prompts of 12 tokens), 40 new tokens each.
    """
    model = model or TinyMLA()
    prompts = _check_prompts(prompts if prompts is not None else default_prompts(vocab_size=model.config.vocab_size),
                             model.config.vocab_size)
    ref, margin = _reference(model, prompts, max_new_tokens, backend)
    run = speculative_decode(model, prompts, max_new_tokens, k, backend=backend, pad_to_pow2=pad_to_pow2,
                             draft=draft, **spec_kwargs)
    return LosslessReport(run, ref, margin)


def sweep_k(ks: Iterable[int] = range(1, 16), *, backend: str = "torch", pad_to_pow2: bool = False,
            **kwargs: Any) -> list[LosslessReport]:
    """:func:`check_lossless` for every ``k`` in ``ks`` (one shared model and reference)."""
    model = kwargs.pop("model", None) or TinyMLA()
    return [check_lossless(k, backend=backend, pad_to_pow2=pad_to_pow2, model=model, **kwargs) for k in ks]


def format_sweep(reports: Sequence[LosslessReport]) -> str:
    """A table: k, verification qlen, call qlen, power of two?, mean acceptance length, result."""
    lines = [f"{'k':>3} {'qlen':>4} {'call':>4} {'pow2':>5} {'backend':>17} {'pad':>4} {'mean len':>8}  result"]
    for rep in reports:
        run, div = rep.run, rep.first_divergence
        result = "lossless" if div is None else \
            f"diverges: req {div.request} token {div.index} ({div.expected} -> {div.got})"
        pow2 = "yes" if is_pow2(run.call_qlen) else "no"
        lines.append(f"{run.k:3d} {run.verify_qlen:4d} {run.call_qlen:4d} {pow2:>5} {run.backend:>17} "
                     f"{'yes' if run.pad_to_pow2 else 'no':>4} {run.mean_acceptance_length:8.2f}  {result}")
    return "\n".join(lines)
