"""The target model's forward pass: architecture, deployment, token laws, and their calibration.

The time of one target forward pass is a law for the non-attention part as a function of the tokens in
the batch (:class:`PowerLaw`, :class:`CoverageLaw`) plus an MLA attention term from the roofline
(:class:`TargetStepModel`). :func:`fit_target_step` calibrates the law on a no-speculation throughput
column only. Times are in milliseconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from workbench.perfmodel.roofline import (
    HARDWARE, Hardware, _check_nonnegative, _check_positive, _kv_bytes, mla_decode_roofline,
)


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
    assumed to reach. 0.8 is what a plain split-KV Triton kernel reached on an H200
    (3.85 of 4.8 TB/s at 16 heads, 64 x 32k: a peer of chapter 3); FlashMLA reports ~90 % on H800.
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

