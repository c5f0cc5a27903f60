"""Hardware figures, rooflines, and the speculative-decoding throughput model.

Napkin math first: the MLA decode of one layer reads each request's latent KV cache once
(``L`` tokens x 576 values, shared by every head) and does two matrix products per head
(scores over 576 dims, values over 512 dims). Its arithmetic intensity is therefore about
``2 * H * qlen * (576 + 512) / (576 * kv_bytes)`` FLOP per byte: ~1.89 * H * qlen for bf16 KV
(shared/CONTEXT.md section 4). Compare it with each GPU's ridge point (peak FLOP/s over bandwidth).

The second half of the module is the speculative-decoding step model of chapter 6:

* acceptance: the expected tokens per verify step, ``1 + r_1 + ... + r_k`` from per-position rates
  (:func:`expected_tokens_per_step`) or ``(1 - a^(k+1)) / (1 - a)`` from an i.i.d. rate
  (:func:`expected_tokens_iid`);
* the target step: a law for the time of one forward pass as a function of the tokens in the batch
  (:class:`PowerLaw`, :class:`CoverageLaw`) plus an MLA attention term from the roofline
  (:class:`TargetStepModel`);
* the draft: Eagle3's one-layer draft model, costed from its weight bytes and a stated per-forward
  overhead (:class:`DraftModel`, :func:`eagle3_draft`);
* one speculative step = draft time for ``k`` tokens + target verify at ``qlen = k + 1`` + a fixed
  overhead (:func:`spec_step`); throughput, speed-up, the best ``k`` with or without the
  power-of-two restriction of aiter #2720 (:func:`best_k`, :func:`power_of_two_cost`);
* calibration on the no-speculation column of AMD's MI355X table only (:func:`fit_target_step`),
  and prediction of the two Eagle3 columns (:func:`predict_published`).

Times are in milliseconds unless a name says otherwise (``_s``, ``_us``); throughput is output tokens
per second per GPU, as in the published table.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.pow2 import is_pow2, next_pow2

__all__ = [
    "AITER_2720_RATES",
    "BLOG_MI355X_KIMI",
    "CoverageLaw",
    "Deployment",
    "DraftModel",
    "HARDWARE",
    "Hardware",
    "KChoice",
    "KIMI_K25",
    "KIMI_K25_MI355X_TP4",
    "KV_DTYPE_BYTES",
    "KV_LORA_RANK",
    "MeasurementFile",
    "ModelArch",
    "PowerLaw",
    "PowerOfTwoCost",
    "Prediction",
    "PredictionRow",
    "PublishedTable",
    "QK_HEAD_DIM",
    "QK_ROPE_HEAD_DIM",
    "RooflinePoint",
    "SERIAL_EXPAND_MI355X",
    "SpecStep",
    "TargetStepModel",
    "best_k",
    "draft_fixed_ms_from_target",
    "eagle3_draft",
    "expansion_cost_per_step",
    "expected_tokens_iid",
    "expected_tokens_per_step",
    "fit_iid_alpha",
    "fit_target_step",
    "iid_rates",
    "is_power_of_two_qlen",
    "measured_padding_overhead",
    "padding_cost_rows",
    "load_measurement",
    "mla_decode_bytes",
    "mla_decode_flops",
    "mla_decode_intensity",
    "mla_decode_roofline",
    "no_spec_step_ms",
    "power_of_two_cost",
    "predict_published",
    "roofline_time_s",
    "serial_expansion_published",
    "spec_step",
    "throughput_per_gpu",
    "verify_cost_trend",
]

KV_LORA_RANK = 512  # latent (compressed KV) width: V is these first 512 dims of a cache row
QK_ROPE_HEAD_DIM = 64  # decoupled rotary part appended to the latent
QK_HEAD_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576: one cache row, and K's width

KV_DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}  # bytes per cached value


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Datasheet figures of one accelerator (leads, not measurements)."""

    name: str
    vendor: str
    memory_gb: float  # device memory, GB
    bandwidth_tb_s: float  # peak HBM bandwidth, TB/s
    bf16_tflops: float  # dense bf16 matrix rate, TFLOP/s
    source: str

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound on this device."""
        return self.bf16_tflops * 1e12 / (self.bandwidth_tb_s * 1e12)


HARDWARE: dict[str, Hardware] = {
    "H200": Hardware("H200", "NVIDIA", 141, 4.8, 990,
                     "NVIDIA H200 Tensor Core GPU datasheet (SXM: 141 GB HBM3e, 4.8 TB/s, ~990 TFLOP/s dense "
                     "BF16, i.e. half the 1979 'with sparsity' figure); shared/CONTEXT.md section 4"),
    "MI300X": Hardware("MI300X", "AMD", 192, 5.3, 1307,
                       "AMD Instinct MI300X datasheet (192 GB HBM3, 5.3 TB/s, 1307.4 TFLOP/s dense BF16); "
                       "shared/CONTEXT.md section 4"),
    "MI355X": Hardware("MI355X", "AMD", 288, 8.0, 2500,
                       "AMD Instinct MI355X datasheet (288 GB HBM3E, 8 TB/s, ~2.5 PFLOP/s dense BF16); "
                       "shared/CONTEXT.md section 4"),
}


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")


def _check_nonnegative(**values: float) -> None:
    for name, value in values.items():
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")


def mla_decode_bytes(heads: int, batch: int, context: int, qlen: int = 1, kv_bytes: float = 2.0,
                     act_bytes: float = 2.0) -> float:
    """Fewest bytes one MLA decode layer must move: KV read once, q read once, output written once.

    Per request: ``context * 576 * kv_bytes`` (cache) + ``qlen * heads * 576 * act_bytes`` (q)
    + ``qlen * heads * 512 * act_bytes`` (output).
    """
    _check_positive(heads=heads, batch=batch, context=context, qlen=qlen, kv_bytes=kv_bytes, act_bytes=act_bytes)
    per_request = context * QK_HEAD_DIM * kv_bytes + qlen * heads * (QK_HEAD_DIM + KV_LORA_RANK) * act_bytes
    return batch * per_request


def mla_decode_flops(heads: int, batch: int, context: int, qlen: int = 1) -> float:
    """FLOPs of one MLA decode layer: ``2 * H * qlen * L * (576 + 512)`` per request (QK^T and PV).

    The causal mask of a multi-token query removes under ``qlen / L`` of it; ignored here.
    """
    _check_positive(heads=heads, batch=batch, context=context, qlen=qlen)
    return batch * 2.0 * heads * qlen * context * (QK_HEAD_DIM + KV_LORA_RANK)


def mla_decode_intensity(heads: int, qlen: int = 1, context: int = 8192, kv_bytes: float = 2.0) -> float:
    """FLOP per byte of MLA decode (about 1.89 * heads * qlen for bf16 KV at long context)."""
    return mla_decode_flops(heads, 1, context, qlen) / mla_decode_bytes(heads, 1, context, qlen, kv_bytes)


def roofline_time_s(hw: Hardware, flops: float, nbytes: float) -> float:
    """Lower bound on a kernel's time: the larger of compute time and memory time."""
    return max(flops / (hw.bf16_tflops * 1e12), nbytes / (hw.bandwidth_tb_s * 1e12))


# ================================================================================================
# MLA decode roofline per layer, with the KV dtype by name
# ================================================================================================


@dataclasses.dataclass(frozen=True)
class RooflinePoint:
    """One MLA decode layer on one device: bytes, FLOPs, and the roofline's time bound."""

    hardware: str
    heads: int
    batch: int
    context: int
    qlen: int
    kv_dtype: str
    bytes: float
    flops: float
    time_s: float  # max(compute, memory) at the datasheet peaks divided by ``efficiency``
    efficiency: float

    @property
    def intensity(self) -> float:
        """FLOP per byte."""
        return self.flops / self.bytes

    @property
    def bound(self) -> str:
        """``"memory"`` or ``"compute"``: which roof limits this point."""
        return "compute" if self.intensity > HARDWARE[self.hardware].ridge_flop_per_byte else "memory"


def _kv_bytes(kv_dtype: str | float) -> float:
    if isinstance(kv_dtype, str):
        try:
            return KV_DTYPE_BYTES[kv_dtype.lower()]
        except KeyError:
            raise ValueError(f"kv_dtype={kv_dtype!r} is not one of {sorted(KV_DTYPE_BYTES)}; "
                             "pass one of those names or a number of bytes per value") from None
    _check_positive(kv_dtype=kv_dtype)
    return float(kv_dtype)


def mla_decode_roofline(hw: Hardware | str, heads: int, batch: int, context: int, qlen: int = 1,
                        kv_dtype: str | float = "bf16", efficiency: float = 1.0) -> RooflinePoint:
    """Bytes, FLOPs and roofline time of one MLA decode layer.

    ``heads`` are the heads on this GPU (a model's heads divided by tensor parallelism). ``efficiency``
    is the fraction of the datasheet bandwidth and FLOP rate the kernel is assumed to reach (1.0 = the
    bound itself); it divides the time.
    """
    hw = HARDWARE[hw] if isinstance(hw, str) else hw
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency!r}")
    kvb = _kv_bytes(kv_dtype)
    nbytes = mla_decode_bytes(heads, batch, context, qlen, kvb)
    flops = mla_decode_flops(heads, batch, context, qlen)
    name = kv_dtype if isinstance(kv_dtype, str) else f"{kvb:g} B"
    return RooflinePoint(hw.name, heads, batch, context, qlen, name, nbytes, flops,
                         roofline_time_s(hw, flops, nbytes) / efficiency, efficiency)


# ================================================================================================
# Acceptance: expected tokens per verify step
# ================================================================================================

# aiter #2720: Eagle3 per-position acceptance rates measured with k = 7 (qlen 8, a power of two).
AITER_2720_RATES: tuple[float, ...] = (0.730, 0.609, 0.537, 0.493, 0.457, 0.408, 0.394)


def _check_rates(rates: Sequence[float]) -> tuple[float, ...]:
    rates = tuple(float(r) for r in rates)
    for i, r in enumerate(rates):
        if not 0.0 <= r <= 1.0:
            raise ValueError(f"rates[{i}]={r!r} is not a probability in [0, 1]")
    for i in range(1, len(rates)):
        if rates[i] > rates[i - 1] + 1e-12:
            raise ValueError(
                f"rates must be non-increasing: rates[{i}]={rates[i]} > rates[{i - 1}]={rates[i - 1]}. "
                "Per-position rates of a chain draft are unconditional (position i is accepted only if "
                "positions 1..i-1 were), so they cannot rise; pass unconditional rates, not conditional ones")
    return rates


def expected_tokens_per_step(rates: Sequence[float], k: int | None = None) -> float:
    """Mean tokens one verify step yields: ``1 + r_1 + ... + r_k`` (the bonus token plus accepted drafts).

    ``rates[i]`` is the fraction of drafts whose position ``i + 1`` was accepted (unconditional,
    non-increasing). ``k`` defaults to ``len(rates)``; a larger ``k`` is refused (the rates of the
    extra positions are unknown: use :func:`fit_iid_alpha` to extrapolate).
    """
    rates = _check_rates(rates)
    k = len(rates) if k is None else k
    if not 0 <= k <= len(rates):
        raise ValueError(f"k={k} needs per-position rates for positions 1..{k}, but only {len(rates)} were "
                         "given; pass k <= len(rates) or extrapolate with fit_iid_alpha()/expected_tokens_iid()")
    return 1.0 + sum(rates[:k])


def expected_tokens_iid(alpha: float, k: int) -> float:
    """Mean tokens per verify step when each draft token is accepted with probability ``alpha``
    independently: ``1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)`` (``k + 1`` when ``a = 1``)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha!r} must be a probability in [0, 1]")
    if k < 0:
        raise ValueError(f"k={k} must be >= 0 (number of draft tokens)")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def iid_rates(alpha: float, k: int) -> tuple[float, ...]:
    """Per-position (unconditional) rates of an i.i.d. acceptance ``alpha``: ``(a, a^2, ..., a^k)``."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha!r} must be a probability in [0, 1]")
    return tuple(alpha ** i for i in range(1, k + 1))


def fit_iid_alpha(rates: Sequence[float]) -> float:
    """The i.i.d. rate with the same expected tokens per step as ``rates`` at ``k = len(rates)`` (bisection)."""
    target = expected_tokens_per_step(rates)
    k = len(rates)
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if expected_tokens_iid(mid, k) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _tokens(k: int, rates: Sequence[float] | None, alpha: float | None) -> float:
    if (rates is None) == (alpha is None):
        raise ValueError("pass exactly one of rates= (per-position rates) or alpha= (an i.i.d. rate)")
    return expected_tokens_per_step(rates, k) if rates is not None else expected_tokens_iid(alpha, k)


def is_power_of_two_qlen(k: int) -> bool:
    """True when the verify query length ``k + 1`` is a power of two (safe with aiter, issue #2720)."""
    return is_pow2(k + 1)


# ================================================================================================
# The target model and its deployment
# ================================================================================================


@dataclasses.dataclass(frozen=True)
class ModelArch:
    """The numbers of a DeepSeek-V3-style MoE model that the step model needs."""

    name: str
    layers: int  # decoder layers (each has MLA attention)
    heads: int  # attention heads of the whole model
    routed_experts: int  # routed experts per MoE layer
    experts_per_token: int  # routed experts each token activates
    source: str


KIMI_K25 = ModelArch(
    "Kimi-K2.5", layers=61, heads=64, routed_experts=384, experts_per_token=8,
    source="moonshotai/Kimi-K2.5 config (DeepSeek-V3 architecture: 61 layers, 64 MLA heads, kv_lora_rank 512, "
           "384 routed experts, 8 per token; 1.04T total / 32B active parameters)")


@dataclasses.dataclass(frozen=True)
class Deployment:
    """A model on ``tp`` GPUs of one kind, with the assumptions of the attention term stated.

    ``attn_efficiency``: the fraction of the datasheet bandwidth (and FLOP rate) that MLA decode is
    assumed to reach. 0.8 is what a plain split-KV Triton kernel measured on an H200
    (3.85 of 4.8 TB/s, shared/CONTEXT.md section 5); FlashMLA reports ~90 % on H800.
    """

    hardware: Hardware
    arch: ModelArch
    tp: int
    kv_dtype: str = "bf16"
    attn_efficiency: float = 0.8

    def __post_init__(self):
        _check_positive(tp=self.tp)
        if self.arch.heads % self.tp:
            raise ValueError(f"tp={self.tp} must divide the model's {self.arch.heads} attention heads")
        _kv_bytes(self.kv_dtype)
        if not 0 < self.attn_efficiency <= 1:
            raise ValueError(f"attn_efficiency must be in (0, 1], got {self.attn_efficiency!r}")

    @property
    def heads_per_gpu(self) -> int:
        return self.arch.heads // self.tp

    def attention_ms(self, batch: int, context: float, qlen: int = 1) -> float:
        """MLA decode time of one forward pass on one GPU: ``layers`` x the per-layer roofline.

        The latent KV cache is replicated on every tensor-parallel rank (each rank reads all of it for
        its ``heads / tp`` heads), so the bytes per GPU do not shrink with ``tp``.
        """
        if batch == 0:
            return 0.0
        p = mla_decode_roofline(self.hardware, self.heads_per_gpu, batch, max(1, round(context)), qlen,
                                self.kv_dtype, self.attn_efficiency)
        return self.arch.layers * p.time_s * 1e3


KIMI_K25_MI355X_TP4 = Deployment(HARDWARE["MI355X"], KIMI_K25, tp=4)


# ------------------------------------------------------------------------------------------------
# Token laws: how the non-attention part of a forward pass grows with the tokens in the batch
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PowerLaw:
    """``fixed_ms + token_ms * N**gamma`` for ``N`` tokens in the batch (``N = concurrency * qlen``).

    Empirical: a MoE forward pass costs more as more tokens touch more experts and do more work, with
    diminishing growth. ``gamma`` is fitted, like the other two parameters.
    """

    fixed_ms: float
    token_ms: float
    gamma: float
    name: str = "power"

    def ms(self, n_tokens: float) -> float:
        _check_nonnegative(n_tokens=n_tokens)
        return self.fixed_ms + self.token_ms * n_tokens ** self.gamma

    def params(self) -> dict[str, float]:
        return {"fixed_ms": self.fixed_ms, "token_ms": self.token_ms, "gamma": self.gamma}

    def describe(self) -> str:
        return f"{self.fixed_ms:.2f} ms + {self.token_ms:.3f} ms x N^{self.gamma:.3f}"


@dataclasses.dataclass(frozen=True)
class CoverageLaw:
    """``fixed_ms + expert_ms * coverage(N) + per_token_ms * N``: streaming the experts that ``N`` tokens touch.

    ``coverage(N) = 1 - (1 - experts_per_token / routed_experts) ** N`` is the expected fraction of a
    layer's routed experts that at least one of ``N`` tokens (independent, uniform routing) selects;
    reading those experts' weights is the dominant memory traffic of a MoE decode step. It saturates
    at 1: beyond a few hundred tokens every expert is read anyway.
    """

    fixed_ms: float
    expert_ms: float
    per_token_ms: float
    routed_experts: int
    experts_per_token: int
    name: str = "coverage"

    def coverage(self, n_tokens: float) -> float:
        _check_nonnegative(n_tokens=n_tokens)
        return 1.0 - (1.0 - self.experts_per_token / self.routed_experts) ** n_tokens

    def ms(self, n_tokens: float) -> float:
        return self.fixed_ms + self.expert_ms * self.coverage(n_tokens) + self.per_token_ms * n_tokens

    def params(self) -> dict[str, float]:
        return {"fixed_ms": self.fixed_ms, "expert_ms": self.expert_ms, "per_token_ms": self.per_token_ms}

    def describe(self) -> str:
        return (f"{self.fixed_ms:.2f} ms + {self.expert_ms:.2f} ms x coverage(N) + {self.per_token_ms:.4f} ms x N "
                f"(coverage of {self.routed_experts} experts, {self.experts_per_token} per token)")


TokenLaw = PowerLaw | CoverageLaw


@dataclasses.dataclass(frozen=True)
class TargetStepModel:
    """Time of one target forward pass: ``law.ms(batch * qlen) + deployment.attention_ms(batch, context, qlen)``."""

    law: TokenLaw
    deployment: Deployment
    fit_context: float  # the mean context the law was fitted at (for reference)
    fit_residuals: tuple[float, ...] = ()  # relative residuals of the fit, (model - published) / published

    def step_ms(self, batch: int, context: float, qlen: int = 1) -> float:
        _check_positive(batch=batch, qlen=qlen)
        return self.law.ms(batch * qlen) + self.deployment.attention_ms(batch, context, qlen)

    def parts_ms(self, batch: int, context: float, qlen: int = 1) -> dict[str, float]:
        """The step split into the law's fixed part, its token-dependent part and attention."""
        fixed = self.law.fixed_ms
        law = self.law.ms(batch * qlen)
        return {"fixed": fixed, "tokens": law - fixed, "attention": self.deployment.attention_ms(batch, context, qlen)}


# ------------------------------------------------------------------------------------------------
# Calibration: fit the law on the no-speculation column only
# ------------------------------------------------------------------------------------------------


def _lstsq_nonneg(columns: list[list[float]], y: list[float], w: list[float]) -> tuple[list[float], float]:
    """Weighted least squares with non-negative coefficients (tiny problems: try every active set)."""
    import numpy as np

    A = np.array(columns, dtype=float).T * np.array(w)[:, None]
    b = np.array(y, dtype=float) * np.array(w)
    n = A.shape[1]
    best: tuple[list[float], float] | None = None
    for mask in range(1, 1 << n):
        idx = [j for j in range(n) if mask >> j & 1]
        coef, *_ = np.linalg.lstsq(A[:, idx], b, rcond=None)
        if np.any(coef < 0):
            continue
        full = [0.0] * n
        for j, c in zip(idx, coef):
            full[j] = float(c)
        res = float(np.sum((A @ np.array(full) - b) ** 2))
        if best is None or res < best[1] - 1e-15:
            best = (full, res)
    if best is None:
        return [0.0] * n, float(np.sum(b ** 2))
    return best


_GAMMA_GRID = tuple(i / 1000 for i in range(50, 1501))  # power-law exponents tried, step 0.001


def _fit_power(n_tokens: Sequence[float], y: Sequence[float], w: Sequence[float]) -> tuple[float, float, float]:
    """``fixed + token * n**gamma`` (``fixed, token >= 0``) by weighted least squares for every gamma of the
    grid at once; returns the best ``(fixed, token, gamma)`` (first one on ties)."""
    import numpy as np

    g = np.array(_GAMMA_GRID)[:, None]
    x = np.array(n_tokens, dtype=float)[None, :] ** g  # (G, n)
    w2 = np.array(w, dtype=float) ** 2
    yv = np.array(y, dtype=float)
    s1, sx, sxx = w2.sum(), (w2 * x).sum(1), (w2 * x * x).sum(1)
    sy, sxy = (w2 * yv).sum(), (w2 * x * yv).sum(1)
    det = s1 * sxx - sx * sx
    with np.errstate(divide="ignore", invalid="ignore"):
        token = np.where(det > 0, (s1 * sxy - sx * sy) / det, -1.0)
        fixed = np.where(det > 0, (sy - token * sx) / s1, -1.0)
        cands = [(fixed, token),  # interior
                 (np.full_like(sx, sy / s1), np.zeros_like(sx)),  # token = 0
                 (np.zeros_like(sx), np.where(sxx > 0, sxy / sxx, 0.0))]  # fixed = 0
    best_res = np.full(sx.shape, np.inf)
    best_f, best_t = np.zeros_like(sx), np.zeros_like(sx)
    for f, t in cands:
        ok = (f >= 0) & (t >= 0)
        res = (w2 * (f[:, None] + t[:, None] * x - yv) ** 2).sum(1)
        better = ok & (res < best_res - 1e-15)
        best_res = np.where(better, res, best_res)
        best_f, best_t = np.where(better, f, best_f), np.where(better, t, best_t)
    i = int(np.argmin(best_res))
    return float(best_f[i]), float(best_t[i]), _GAMMA_GRID[i]


def no_spec_step_ms(concurrency: Sequence[int], tok_s_per_gpu: Sequence[float], tp: int) -> list[float]:
    """Step time implied by a no-speculation throughput: ``concurrency / (tp * tok_s_per_gpu)`` (one token
    per request per step)."""
    out = []
    for c, t in zip(concurrency, tok_s_per_gpu):
        _check_positive(concurrency=c, tok_s_per_gpu=t)
        out.append(c / (tp * t) * 1e3)
    return out


def fit_target_step(concurrency: Sequence[int], no_spec_tok_s_per_gpu: Sequence[float], *,
                    deployment: Deployment = KIMI_K25_MI355X_TP4, context: float, law: str = "power"
                    ) -> TargetStepModel:
    """Fit the target step on a NO-SPECULATION throughput column, and nothing else.

    ``concurrency[i]`` requests decode one token each per step at throughput ``no_spec_tok_s_per_gpu[i]``
    (output tokens/s/GPU), so a step takes ``c / (tp * thr)``. The attention term (roofline, stated
    efficiency) is computed, not fitted; the law's parameters are fitted to what remains, minimising the
    squared *relative* error of the step time:

    * ``law="power"``: ``fixed_ms, token_ms >= 0`` by least squares for each ``gamma`` on a grid of
      step 0.001 in [0.05, 1.5], keeping the best (3 parameters);
    * ``law="coverage"``: ``fixed_ms, expert_ms, per_token_ms >= 0`` by non-negative least squares
      (3 parameters; the expert count and top-k come from the architecture).

    The function never sees speculative-decoding numbers: that is the point (tests check it).
    """
    concurrency = [int(c) for c in concurrency]
    if len(concurrency) != len(no_spec_tok_s_per_gpu):
        raise ValueError(f"concurrency ({len(concurrency)} values) and no_spec_tok_s_per_gpu "
                         f"({len(no_spec_tok_s_per_gpu)} values) must have the same length")
    if len(concurrency) < 3:
        raise ValueError(f"need at least 3 points to fit 3 parameters, got {len(concurrency)}")
    _check_positive(context=context)
    step = no_spec_step_ms(concurrency, no_spec_tok_s_per_gpu, deployment.tp)
    attn = [deployment.attention_ms(c, context, 1) for c in concurrency]
    rest = [s - a for s, a in zip(step, attn)]
    w = [1.0 / s for s in step]
    if law == "power":
        fixed, token, g = _fit_power(concurrency, rest, w)
        fitted: TokenLaw = PowerLaw(fixed, token, g)
    elif law == "coverage":
        arch = deployment.arch
        p = arch.experts_per_token / arch.routed_experts
        cols = [[1.0] * len(concurrency), [1 - (1 - p) ** c for c in concurrency], [float(c) for c in concurrency]]
        (fixed, expert, per_token), _ = _lstsq_nonneg(cols, rest, w)
        fitted = CoverageLaw(fixed, expert, per_token, arch.routed_experts, arch.experts_per_token)
    else:
        raise ValueError(f"law={law!r} must be 'power' or 'coverage'")
    model = TargetStepModel(fitted, deployment, float(context))
    residuals = tuple(model.step_ms(c, context) / s - 1 for c, s in zip(concurrency, step))
    return dataclasses.replace(model, fit_residuals=residuals)


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
# The published table, and prediction of its Eagle3 columns
# ================================================================================================


@dataclasses.dataclass(frozen=True)
class PublishedTable:
    """A throughput table: tok/s/GPU without speculation and with one or more Eagle3 drafts."""

    source: str
    hardware: str
    model: str
    tp: int
    input_len: int
    output_len: int
    concurrency: tuple[int, ...]
    no_spec: tuple[float, ...]
    eagle3: Mapping[str, tuple[float, ...]]  # column name -> tok/s/GPU, aligned with concurrency

    def __post_init__(self):
        n = len(self.concurrency)
        for name, col in [("no_spec", self.no_spec), *self.eagle3.items()]:
            if len(col) != n:
                raise ValueError(f"column {name!r} has {len(col)} values for {n} concurrencies")

    @property
    def mean_context(self) -> float:
        """Mean cached tokens per request over the decode: ``input_len + output_len / 2``."""
        return self.input_len + self.output_len / 2

    def replace_eagle3(self, columns: Mapping[str, Sequence[float]]) -> PublishedTable:
        """A copy with different Eagle3 columns (the no-speculation column untouched)."""
        return dataclasses.replace(self, eagle3={k: tuple(v) for k, v in columns.items()})


BLOG_MI355X_KIMI = PublishedTable(
    source="AMD ROCm blog, 3 July 2026: 'Accelerating Large-Scale LLM Inference on AMD Instinct MI350X/MI355X "
           "with Eagle3 and AMD Quark' (credits vLLM PR #39616); shared/CONTEXT.md section 4",
    hardware="MI355X", model="Kimi-K2.5-MXFP4", tp=4, input_len=1024, output_len=1024,
    concurrency=(4, 8, 16, 32, 64),
    no_spec=(82.7, 142.2, 220.5, 342.2, 533.3),
    eagle3={"BF16 draft": (157.0, 269.1, 399.6, 627.6, 901.6),
            "FP8 draft": (165.2, 270.1, 412.7, 633.8, 936.6)},
)

_DRAFT_DTYPE = {"BF16 draft": "bf16", "FP8 draft": "fp8"}


@dataclasses.dataclass(frozen=True)
class PredictionRow:
    column: str
    concurrency: int
    published: float
    predicted: float
    fitted: bool  # True for the no-speculation column (the fit), False for a prediction

    @property
    def error(self) -> float:
        """(predicted - published) / published."""
        return self.predicted / self.published - 1.0


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The published table beside the model: fitted no-speculation rows and predicted Eagle3 rows."""

    table: PublishedTable
    target: TargetStepModel
    drafts: Mapping[str, DraftModel]
    k: int
    tokens_per_step: float
    overhead_ms: float
    rows: tuple[PredictionRow, ...]
    steps: Mapping[tuple[str, int], SpecStep]

    @property
    def predicted_rows(self) -> tuple[PredictionRow, ...]:
        return tuple(r for r in self.rows if not r.fitted)

    @property
    def max_abs_error(self) -> float:
        """Largest |error| over the predicted (Eagle3) rows."""
        return max(abs(r.error) for r in self.predicted_rows)

    def within(self, tolerance: float = 0.10) -> bool:
        return self.max_abs_error <= tolerance

    def records(self) -> list[dict[str, Any]]:
        return [dict(column=r.column, concurrency=r.concurrency, published=r.published, predicted=r.predicted,
                     error=r.error, fitted=r.fitted) for r in self.rows]

    def gaps(self) -> list[dict[str, float]]:
        """Diagnostics of each predicted row (nothing here feeds back into the model).

        ``published_step_ms``: the step time the published throughput implies *if* a step yields the
        model's tokens per step (``c * tokens / (tp * thr)``); ``missing_ms``: that minus the modelled
        step; ``missing_ms_per_draft``: the same spread over the ``k`` draft forwards;
        ``implied_tokens_per_step``: the tokens per step that would reconcile the published throughput
        with the modelled step time (``thr * tp * step / c``).
        """
        out = []
        for r in self.predicted_rows:
            s = self.steps[(r.column, r.concurrency)]
            pub_step = r.concurrency * s.tokens_per_step / (s.tp * r.published) * 1e3
            out.append(dict(column=r.column, concurrency=r.concurrency, model_step_ms=s.step_ms,
                            published_step_ms=pub_step, missing_ms=pub_step - s.step_ms,
                            missing_ms_per_draft=(pub_step - s.step_ms) / s.k,
                            implied_tokens_per_step=r.published * s.tp * s.step_ms * 1e-3 / r.concurrency))
        return out

    def format(self, tolerance: float = 0.10) -> str:
        """A text table: column, concurrency, published, predicted, error, and the verdict per row."""
        lines = [f"{'column':12} {'conc':>5} {'published':>10} {'predicted':>10} {'error':>8}  note",]
        for r in self.rows:
            note = "fitted" if r.fitted else ("within" if abs(r.error) <= tolerance else "MISS") + \
                f" +/-{tolerance:.0%}"
            lines.append(f"{r.column:12} {r.concurrency:5d} {r.published:10.1f} {r.predicted:10.1f} "
                         f"{r.error:+8.1%}  {note}")
        return "\n".join(lines)


def predict_published(table: PublishedTable = BLOG_MI355X_KIMI, *, law: str = "power",
                      deployment: Deployment = KIMI_K25_MI355X_TP4, rates: Sequence[float] = AITER_2720_RATES,
                      k: int | None = None, overhead_ms: float = 0.0,
                      drafts: Mapping[str, DraftModel] | None = None) -> Prediction:
    """Fit the target on ``table.no_spec`` (only), then predict every Eagle3 column.

    Acceptance: ``rates`` (default: aiter #2720, k = 7) give ``1 + sum(rates[:k])`` tokens per step.
    Drafts: by default :func:`eagle3_draft` in the column's dtype with its per-forward overhead from
    :func:`draft_fixed_ms_from_target`, so no parameter is fitted to an Eagle3 number.
    """
    if deployment.hardware.name != table.hardware or deployment.tp != table.tp:
        raise ValueError(f"deployment ({deployment.hardware.name}, tp={deployment.tp}) does not match the table "
                         f"({table.hardware}, tp={table.tp})")
    k = len(rates) if k is None else k
    target = fit_target_step(table.concurrency, table.no_spec, deployment=deployment, context=table.mean_context,
                             law=law)
    if drafts is None:
        fixed = draft_fixed_ms_from_target(target)
        drafts = {}
        for name in table.eagle3:
            if name not in _DRAFT_DTYPE:
                raise ValueError(f"no default draft for column {name!r}: pass drafts={{{name!r}: DraftModel(...)}}")
            drafts[name] = eagle3_draft(_DRAFT_DTYPE[name], fixed_ms=fixed)
    rows: list[PredictionRow] = []
    steps: dict[tuple[str, int], SpecStep] = {}
    ctx = table.mean_context
    for c, pub in zip(table.concurrency, table.no_spec):
        s = spec_step(target, None, c, ctx, 0)
        steps[("no speculation", c)] = s
        rows.append(PredictionRow("no spec", c, pub, s.tok_s_per_gpu, True))
    for name, col in table.eagle3.items():
        if name not in drafts:
            raise ValueError(f"drafts has no model for column {name!r} (has {sorted(drafts)})")
        for c, pub in zip(table.concurrency, col):
            s = spec_step(target, drafts[name], c, ctx, k, rates=rates, overhead_ms=overhead_ms)
            steps[(name, c)] = s
            rows.append(PredictionRow(name, c, pub, s.tok_s_per_gpu, False))
    return Prediction(table, target, dict(drafts), k, expected_tokens_per_step(rates, k), overhead_ms,
                      tuple(rows), steps)


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


# ================================================================================================
# The index expansion: published serial-loop cost, and committed H200 measurements
# ================================================================================================

DATA_DIR = Path(__file__).resolve().parent / "data"

# vLLM #57978 / #58661: v0.20's one-program-per-request expansion on MI355X at ~97k context,
# concurrency 1: 61.6 us per call, 7 calls per engine step (shared/CONTEXT.md section 2).
SERIAL_EXPAND_MI355X = {"us_per_call": 61.6, "calls_per_step": 7, "context": 97_000, "concurrency": 1,
                        "source": "vLLM PRs #57978 and #58661 (MI355X, ~97k context, concurrency 1)"}


@dataclasses.dataclass(frozen=True)
class MeasurementFile:
    """A committed benchmark result, or the explicit reason there is none."""

    name: str
    path: Path
    payload: dict[str, Any] | None
    reason: str

    @property
    def available(self) -> bool:
        return self.payload is not None


_REQUIRED_KEYS = {"expand": ("cases",), "decode": ("results",)}


def load_measurement(name: str, device: str = "h200", data_dir: Path | str | None = None) -> MeasurementFile:
    """Read ``data/bench_<name>_<device>.json`` (written by ``workbench bench <name>``).

    A missing file is not an error: the result says so (``available`` False, ``reason`` why) and no
    number is made up. A file that exists but lacks the benchmark's keys raises, naming what is missing.
    """
    if name not in _REQUIRED_KEYS:
        raise ValueError(f"name={name!r} must be one of {sorted(_REQUIRED_KEYS)}")
    path = Path(data_dir or DATA_DIR) / f"bench_{name}_{device}.json"
    if not path.exists():
        return MeasurementFile(name, path, None,
                               f"{path.name} is not committed (run `workbench bench {name}` on the GPU and commit "
                               f"its JSON under src/workbench/data/); the figures that need it are left out")
    payload = json.loads(path.read_text())
    missing = [k for k in _REQUIRED_KEYS[name] if k not in payload]
    if missing:
        raise ValueError(f"{path} has no key(s) {missing}: is it the output of `workbench bench {name}`?")
    device_name = payload.get("provenance", {}).get("device", "?")
    return MeasurementFile(name, path, payload, f"{path.name}: measured on {device_name}, "
                                                f"{payload.get('provenance', {}).get('date_utc', 'date unknown')}")


def _nearest_decode(results: list[dict[str, Any]], batch: int, context: int, heads: int) -> dict[str, Any] | None:
    pts = [r for r in results if r.get("heads") == heads and r.get("qlen") == 1 and r.get("kv_gb_s")]
    if not pts:
        return None
    return min(pts, key=lambda r: (math.log(r["batch"] / batch)) ** 2 + (math.log(r["context"] / context)) ** 2)


def expansion_cost_per_step(expand: dict[str, Any], decode: dict[str, Any], *, layers: int = 61, heads: int = 16,
                            calls_per_step: int = SERIAL_EXPAND_MI355X["calls_per_step"]) -> list[dict[str, Any]]:
    """Per engine step, the index expansion beside the MLA decode it feeds, from H200 measurements.

    For each case of ``workbench bench expand`` (``num_reqs`` x ``seq_len``): expansion per step =
    ``calls_per_step`` x the measured time of the 2-D-grid kernel and of the serial (v0.20) kernel. The
    kernel's time is the one measured right after a torch kernel (``kernel_after_fill_us``) where the results
    have it: in a step the expansion follows kernels that do not trigger a PDL launch early, so the launch
    overlap that back-to-back replay (``kernel_us``) credits it with is not there;
    decode per step = ``layers`` x one decode layer at that batch and context, estimated from the
    measured ``heads``-head qlen-1 decode point nearest in (log batch, log context), scaled by its KV
    bytes (decode is memory-bound there: its effective KV bandwidth is reused). Where the case's context
    exceeds the measured one at the same batch (1 x 97k from 1 x 32k), the kernel's bandwidth would still
    be rising, so the decode estimate is an upper bound and the expansion's share a lower bound.
    Returns one dict per case.
    """
    cases = expand.get("cases")
    results = decode.get("results")
    if not cases or not results:
        raise ValueError("expand must have 'cases' and decode 'results' (outputs of `workbench bench expand|decode`)")
    out = []
    for case in cases:
        b, L = int(case["num_reqs"]), int(case["seq_len"])
        ref = _nearest_decode(results, b, L, heads)
        if ref is None:
            raise ValueError(f"decode results have no {heads}-head qlen-1 point to scale from")
        kv_bytes = b * L * QK_HEAD_DIM * 2
        decode_layer_us = kv_bytes / (ref["kv_gb_s"] * 1e9) * 1e6
        decode_step_us = layers * decode_layer_us
        kernel_us = case.get("kernel_after_fill_us", case["kernel_us"])
        row = dict(num_reqs=b, seq_len=L, calls_per_step=calls_per_step,
                   kernel_us_per_call=kernel_us, serial_us_per_call=case["serial_us"],
                   kernel_us_per_step=calls_per_step * kernel_us,
                   serial_us_per_step=calls_per_step * case["serial_us"],
                   decode_us_per_step=decode_step_us,
                   decode_ref=dict(batch=ref["batch"], context=ref["context"], kv_gb_s=ref["kv_gb_s"]))
        row["kernel_vs_decode"] = row["kernel_us_per_step"] / decode_step_us
        row["serial_vs_decode"] = row["serial_us_per_step"] / decode_step_us
        out.append(row)
    return out


def serial_expansion_published(target: TargetStepModel | None = None, *, k: int = 7) -> dict[str, float]:
    """The published serial-loop cost on MI355X (61.6 us x 7 calls per step, ~97k context, concurrency 1)
    beside the modelled MLA decode attention of one step there, and (given a calibrated ``target``) beside
    the whole verify step at ``qlen = k + 1``."""
    d = SERIAL_EXPAND_MI355X
    dep = target.deployment if target is not None else KIMI_K25_MI355X_TP4
    expand_ms = d["us_per_call"] * d["calls_per_step"] / 1e3
    attn = dep.attention_ms(d["concurrency"], d["context"], 1)
    out = dict(expand_ms_per_step=expand_ms, attention_ms_per_step=attn, expand_vs_attention=expand_ms / attn)
    if target is not None:
        verify = target.step_ms(d["concurrency"], d["context"], k + 1)
        out.update(verify_ms=verify, expand_vs_verify=expand_ms / verify)
    return out


# ================================================================================================
# Padding verification to a power of two (the mitigation of aiter #2720, chapter 5)
# ================================================================================================


def padding_cost_rows(ks: Sequence[int] = range(1, 16), *, heads: int = 16, batch: int = 64, context: int = 4096,
                      hardware: str | Hardware = "H200") -> list[dict[str, Any]]:
    """The cost model of padding verification from ``qlen = k + 1`` to ``P = next_pow2(k + 1)``, per layer.

    For each ``k``: extra query rows ``batch * (P - qlen)``; bytes and FLOPs from
    :func:`mla_decode_bytes` / :func:`mla_decode_flops` at ``qlen``
    and at ``P``; roofline times (:func:`roofline_time_s`) on ``hardware``'s datasheet
    figures (or a :class:`~workbench.Hardware` with measured ceilings). While both calls are
    memory-bound the time grows only with the extra q and output bytes.
    """
    if isinstance(hardware, Hardware):
        hw = hardware
    elif hardware in HARDWARE:
        hw = HARDWARE[hardware]
    else:
        raise ValueError(f"hardware is {hardware!r}; choose one of {sorted(HARDWARE)} "
                         "or pass a Hardware")
    rows = []
    for k in ks:
        q = k + 1
        P = next_pow2(q)
        b0, b1 = (mla_decode_bytes(heads, batch, context, n) for n in (q, P))
        f0, f1 = (mla_decode_flops(heads, batch, context, n) for n in (q, P))
        mem0, mem1 = (b / (hw.bandwidth_tb_s * 1e12) for b in (b0, b1))
        cmp0, cmp1 = (f / (hw.bf16_tflops * 1e12) for f in (f0, f1))
        t0, t1 = roofline_time_s(hw, f0, b0), roofline_time_s(hw, f1, b1)
        rows.append(dict(k=k, qlen=q, padded_qlen=P, extra_rows=batch * (P - q), heads=heads, batch=batch,
                         context=context, hardware=hw.name, bytes_pct=100 * (b1 / b0 - 1),
                         flops_pct=100 * (f1 / f0 - 1),
                         time_us=t0 * 1e6, padded_time_us=t1 * 1e6, time_pct=100 * (t1 / t0 - 1),
                         bound="memory" if mem0 >= cmp0 else "compute",
                         padded_bound="memory" if mem1 >= cmp1 else "compute"))
    return rows


def measured_padding_overhead(path: str | Path | None = None) -> tuple[list[dict[str, Any]], str]:
    """Padding overhead measured by ``workbench bench decode`` (Triton kernel, CUDA-graph replay).

    For every (heads, batch, context) measured at a non-power-of-two ``qlen`` and at ``next_pow2(qlen)``,
    one row with both times, the measured overhead, and two model predictions for the same shapes
    (:func:`padding_cost_rows`): on the datasheet H200 (``model_pct``) and on a roofline built from the
    ceilings measured in the same run (``model_measured_pct``: read-only bandwidth, else copy bandwidth,
    and the bf16 matmul rate). Returns ``(rows, note)``; ``rows`` is empty and ``note`` says why when the
    file is missing or holds no such pair. Nothing is invented: only measured pairs.
    """
    p = Path(path) if path is not None else DATA_DIR / "bench_decode_h200.json"
    if not p.exists():
        return [], f"{p.name} is not in the repository yet: no measured padding overhead to show"
    payload = json.loads(p.read_text())
    results = payload.get("results", [])
    times = {(r["heads"], r["batch"], r["context"], r["qlen"]): r["triton_us"] for r in results if "triton_us" in r}
    ceilings = payload.get("ceilings", {})
    bw = (ceilings.get("read_only") or ceilings.get("copy") or {}).get("gb_s")
    tf = (ceilings.get("matmul_bf16") or {}).get("tflops")
    measured_hw = Hardware("measured", "", 0, bw / 1e3, tf, f"ceilings in {p.name}") if bw and tf else None
    rows = []
    for (h, b, ctx, q), us in sorted(times.items()):
        P = next_pow2(q)
        if q == P or (h, b, ctx, P) not in times:
            continue
        up = times[(h, b, ctx, P)]
        row = dict(heads=h, batch=b, context=ctx, qlen=q, padded_qlen=P, us=us, padded_us=up,
                   overhead_pct=100 * (up / us - 1),
                   model_pct=padding_cost_rows([q - 1], heads=h, batch=b, context=ctx, hardware="H200")[0]["time_pct"])
        if measured_hw is not None:
            row["model_measured_pct"] = padding_cost_rows([q - 1], heads=h, batch=b, context=ctx,
                                                          hardware=measured_hw)[0]["time_pct"]
        rows.append(row)
    prov = payload.get("provenance", {})
    where = ", ".join(str(prov[k]) for k in ("device", "date_utc") if k in prov) or "no provenance recorded"
    note = f"{p.name} ({where}): {len(rows)} measured (qlen, next power of two) pairs"
    return rows, note
