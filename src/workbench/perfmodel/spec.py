"""The Eagle3 draft, one speculative step, throughput, and the choice of ``k``.

One speculative step = draft time for ``k`` tokens + target verify at ``qlen = k + 1`` + a fixed
overhead (:func:`spec_step`); throughput, speed-up, the best ``k`` with or without the power-of-two
restriction of aiter #2720 (:func:`best_k`, :func:`power_of_two_cost`), and the verify cost per accepted
token at long context (:func:`verify_cost_trend`). Times are in milliseconds; throughput is output tokens
per second per GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from workbench.perfmodel.acceptance import AITER_2720_RATES, _tokens, expected_tokens_per_step, is_power_of_two_qlen
from workbench.perfmodel.roofline import _check_nonnegative, _check_positive, roofline_time_s
from workbench.perfmodel.target import Deployment, TargetStepModel

# ================================================================================================
# The draft model
# ================================================================================================


@dataclasses.dataclass(frozen=True)
class DraftModel:
    """A draft model costed from first principles: a fixed cost per forward pass plus the roofline of
    reading its weights (and its KV cache) and doing its matrix products, split over ``tp`` GPUs.

    ``weight_bytes``: bytes of weights one forward pass reads (whole model, before the ``tp`` split);
    ``params``: parameters one token multiplies with (2 FLOPs each);
    ``kv_bytes_per_token``: draft KV-cache bytes per cached token (its own attention);
    ``fixed_ms``: launch and synchronisation cost per forward pass (a stated assumption).
    """

    name: str
    weight_bytes: float
    params: float
    kv_bytes_per_token: float
    fixed_ms: float
    source: str = ""

    def forward_ms(self, deployment: Deployment, n_tokens: int, batch: int, context: float) -> float:
        """One draft forward over ``n_tokens`` tokens of ``batch`` requests with ``context`` cached tokens."""
        _check_nonnegative(n_tokens=n_tokens, batch=batch, context=context)
        hw, tp = deployment.hardware, deployment.tp
        nbytes = (self.weight_bytes + batch * context * self.kv_bytes_per_token) / tp
        flops = 2.0 * self.params * n_tokens / tp
        return self.fixed_ms + roofline_time_s(hw, flops, nbytes) * 1e3

    def draft_ms(self, deployment: Deployment, k: int, batch: int, context: float) -> float:
        """Drafting ``k`` tokens per request, as vLLM's Eagle proposer does: the first forward runs over the
        ``k + 1`` positions of the last verify (``batch * (k + 1)`` tokens), each further one over ``batch``."""
        if k == 0:
            return 0.0
        first = self.forward_ms(deployment, batch * (k + 1), batch, context)
        return first + (k - 1) * self.forward_ms(deployment, batch, batch, context)


# Eagle3 draft of Kimi-K2.5 (lightseekorg/kimi-k2.5-eagle3, LlamaForCausalLMEagle3): one Llama decoder
# layer at hidden 7168 whose attention reads the concatenation of embedding and hidden state (2 x 7168),
# an fc layer fusing three target hidden states (3 x 7168 -> 7168), and a full-vocabulary lm_head
# (163840 x 7168). Stated assumptions where the card is silent: 64 query heads and 8 KV heads of 128,
# MLP width 18432. Parameter counts (millions): q 117.4, k+v 29.4, o 58.7, MLP 396.4, fc 154.1,
# lm_head 1174.4; with the 163840 x 7168 input embedding (a lookup, not read in full) that is
# ~6.2 GB in BF16, matching the ~6.0 GB the published BF16 checkpoint is reported at.
_EAGLE3_MIDLAYER_PARAMS = 117.4e6 + 29.4e6 + 58.7e6 + 396.4e6
_EAGLE3_FC_PARAMS = 154.1e6
_EAGLE3_LM_HEAD_PARAMS = 1174.4e6
_EAGLE3_KV_BYTES_PER_TOKEN = 2 * 8 * 128 * 2.0  # K and V, 8 KV heads x 128 dims, bf16


def eagle3_draft(dtype: str = "bf16", fixed_ms: float = 0.1) -> DraftModel:
    """The Kimi-K2.5 Eagle3 draft with its decoder layer in ``bf16`` or ``fp8``.

    The FP8 variant (amd/Kimi-K2.5-Eagle3-FP8, AMD Quark) quantizes the layer's q/k/v/o and MLP
    projections only; fc and lm_head stay BF16, so FP8 saves ~0.6 GB of the ~3.9 GB one forward reads.
    ``fixed_ms`` is the per-forward overhead; :func:`draft_fixed_ms_from_target` derives it.
    """
    layer_bytes = {"bf16": 2.0, "fp8": 1.0}.get(dtype)
    if layer_bytes is None:
        raise ValueError(f"dtype={dtype!r} must be 'bf16' or 'fp8' (the two published draft checkpoints)")
    _check_nonnegative(fixed_ms=fixed_ms)
    weight_bytes = _EAGLE3_MIDLAYER_PARAMS * layer_bytes + (_EAGLE3_FC_PARAMS + _EAGLE3_LM_HEAD_PARAMS) * 2.0
    params = _EAGLE3_MIDLAYER_PARAMS + _EAGLE3_FC_PARAMS + _EAGLE3_LM_HEAD_PARAMS
    return DraftModel(f"Eagle3 draft ({dtype.upper()} layer)", weight_bytes, params, _EAGLE3_KV_BYTES_PER_TOKEN,
                      fixed_ms, source="lightseekorg/kimi-k2.5-eagle3; amd/Kimi-K2.5-Eagle3-FP8 (Quark, PTPC FP8)")


def draft_fixed_ms_from_target(target: TargetStepModel, draft_layers: int = 1) -> float:
    """The draft's per-forward overhead, from the target fit and nothing else: the target's fitted fixed
    cost is charged per decoder layer (launches, two all-reduces, norms), and the draft runs
    ``draft_layers`` of them. Not fitted to any speculative-decoding number."""
    _check_positive(draft_layers=draft_layers)
    return target.law.fixed_ms / target.deployment.arch.layers * draft_layers


# ================================================================================================
# One speculative step, throughput, speed-up, the choice of k
# ================================================================================================


@dataclasses.dataclass(frozen=True)
class SpecStep:
    """One engine step: ``k`` drafts, one verify at ``qlen = k + 1``, a fixed overhead (all ms)."""

    k: int
    concurrency: int
    context: float
    tokens_per_step: float  # per request
    draft_ms: float
    verify_ms: float
    overhead_ms: float
    tp: int

    @property
    def step_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.overhead_ms

    @property
    def tok_s_per_gpu(self) -> float:
        return throughput_per_gpu(self.concurrency, self.tokens_per_step, self.step_ms, self.tp)

    @property
    def verify_ms_per_token(self) -> float:
        """Target verify time per token a request gets from the step (``verify_ms / tokens_per_step``)."""
        return self.verify_ms / self.tokens_per_step


def throughput_per_gpu(concurrency: int, tokens_per_step: float, step_ms: float, tp: int) -> float:
    """Output tokens per second per GPU: ``concurrency * tokens_per_step / step_s / tp``."""
    _check_positive(concurrency=concurrency, tokens_per_step=tokens_per_step, step_ms=step_ms, tp=tp)
    return concurrency * tokens_per_step / (step_ms * 1e-3) / tp


def spec_step(target: TargetStepModel, draft: DraftModel | None, concurrency: int, context: float, k: int, *,
              rates: Sequence[float] | None = None, alpha: float | None = None, overhead_ms: float = 0.0) -> SpecStep:
    """One speculative step with ``k`` draft tokens (``k = 0``: plain decoding, no draft, no overhead).

    ``step = draft.draft_ms(k) + target.step_ms(qlen = k + 1) + overhead_ms``; the tokens per step come
    from per-position ``rates`` or an i.i.d. ``alpha``.
    """
    if k < 0:
        raise ValueError(f"k={k} must be >= 0")
    _check_positive(concurrency=concurrency, context=context)
    _check_nonnegative(overhead_ms=overhead_ms)
    if k == 0:
        return SpecStep(0, concurrency, context, 1.0, 0.0, target.step_ms(concurrency, context, 1), 0.0,
                        target.deployment.tp)
    if draft is None:
        raise ValueError(f"k={k} > 0 needs a draft model (pass draft=eagle3_draft(...))")
    tokens = _tokens(k, rates, alpha)
    return SpecStep(k, concurrency, context, tokens, draft.draft_ms(target.deployment, k, concurrency, context),
                    target.step_ms(concurrency, context, k + 1), overhead_ms, target.deployment.tp)


@dataclasses.dataclass(frozen=True)
class KChoice:
    """The best number of draft tokens under a rule, with its step and the whole scan."""

    k: int
    step: SpecStep
    speedup: float  # vs plain decoding on the same target model
    scan: tuple[SpecStep, ...]  # every k considered (k >= 1)
    power_of_two: bool


def best_k(target: TargetStepModel, draft: DraftModel, concurrency: int, context: float, *,
           rates: Sequence[float] | None = None, alpha: float | None = None, k_max: int | None = None,
           power_of_two: bool = False, overhead_ms: float = 0.0) -> KChoice:
    """The ``k`` in ``1..k_max`` with the highest throughput; with ``power_of_two=True`` only ``k`` with
    ``k + 1`` a power of two (1, 3, 7, 15, ...: what aiter's non-persistent MLA decode gets right, #2720).

    ``k_max`` defaults to ``len(rates)`` for per-position rates, 15 for an i.i.d. rate.
    """
    if k_max is None:
        k_max = len(rates) if rates is not None else 15
    if k_max < 1:
        raise ValueError(f"k_max={k_max} must be >= 1")
    ks = [k for k in range(1, k_max + 1) if not power_of_two or is_power_of_two_qlen(k)]
    scan = tuple(spec_step(target, draft, concurrency, context, k, rates=rates, alpha=alpha, overhead_ms=overhead_ms)
                 for k in ks)
    best = max(scan, key=lambda s: s.tok_s_per_gpu)
    base = spec_step(target, None, concurrency, context, 0)
    return KChoice(best.k, best, best.tok_s_per_gpu / base.tok_s_per_gpu, scan, power_of_two)


@dataclasses.dataclass(frozen=True)
class PowerOfTwoCost:
    """What restricting ``k + 1`` to powers of two costs: the two best choices and the lost throughput."""

    free: KChoice
    restricted: KChoice

    @property
    def cost(self) -> float:
        """Fraction of throughput lost: ``1 - restricted / free`` (0 when the free optimum is allowed)."""
        return 1.0 - self.restricted.step.tok_s_per_gpu / self.free.step.tok_s_per_gpu


def power_of_two_cost(target: TargetStepModel, draft: DraftModel, concurrency: int, context: float, **kw
                      ) -> PowerOfTwoCost:
    """:func:`best_k` without and with the power-of-two restriction (same keyword arguments)."""
    return PowerOfTwoCost(best_k(target, draft, concurrency, context, power_of_two=False, **kw),
                          best_k(target, draft, concurrency, context, power_of_two=True, **kw))


# ================================================================================================
# Long context: the verify cost per accepted token
# ================================================================================================


def verify_cost_trend(target: TargetStepModel, concurrency: Sequence[int] = (4, 8, 16, 32, 64), *,
                      input_len: int = 8192, output_len: int = 1024, k: int = 7,
                      rates: Sequence[float] = AITER_2720_RATES) -> list[dict[str, float]]:
    """Target verify cost per accepted token at each concurrency, split into its parts.

    For each ``c``: the verify pass at ``qlen = k + 1`` and mean context ``input_len + output_len / 2``,
    its attention part (the KV read, ``c * L * 576 * 2`` bytes per layer, grows with ``c * L``) and its
    weight/token part, each divided by the tokens a request gets per step (``1 + r_1 + ... + r_k``).
    """
    tokens = expected_tokens_per_step(rates, k)
    ctx = input_len + output_len / 2
    out = []
    for c in concurrency:
        parts = target.parts_ms(c, ctx, k + 1)
        verify = sum(parts.values())
        out.append(dict(concurrency=c, context=ctx, verify_ms=verify, attention_ms=parts["attention"],
                        weights_tokens_ms=parts["fixed"] + parts["tokens"],
                        verify_ms_per_accepted_token=verify / tokens,
                        attention_ms_per_accepted_token=parts["attention"] / tokens,
                        attention_share=parts["attention"] / verify))
    return out

