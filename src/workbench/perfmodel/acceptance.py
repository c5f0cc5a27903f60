"""Acceptance: the expected tokens one verify step yields.

``1 + r_1 + ... + r_k`` from per-position rates (:func:`expected_tokens_per_step`) or
``(1 - a^(k+1)) / (1 - a)`` from an i.i.d. rate (:func:`expected_tokens_iid`).
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.pow2 import check_count, is_pow2

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
    """True when the verify query length ``k + 1`` is a power of two (safe with aiter, issue #2720); ``k`` (draft
    tokens) an int >= 0."""
    return is_pow2(check_count("k", k, 0) + 1)
