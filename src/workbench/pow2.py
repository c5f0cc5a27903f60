"""The power-of-two rule of aiter's non-persistent MLA decode, as plain integer functions.

aiter #2720: when ``max_seqlen_q`` is not a power of two, the non-persistent path returns the same output for
every query position of a request. A speculative verify step runs ``k + 1`` query tokens, so only draft lengths
``k`` with ``k + 1`` a power of two (1, 3, 7, 15) are safe there. The probe (:mod:`workbench.qlen`), the padding
and the throughput model (:mod:`workbench.perfmodel`) share these helpers; they import nothing but Python.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_count", "is_pow2", "next_pow2", "safe_num_spec_tokens"]


def check_count(name: str, value: Any, minimum: int) -> int:
    """``value`` if it is an int (not a bool) ``>= minimum``; else a ValueError naming ``name`` and the rule."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} is {value!r}; it must be an int >= {minimum}")
    return value


def is_pow2(n: int) -> bool:
    """True when ``n`` (an int >= 1) is a power of two: 1, 2, 4, 8, 16, ..."""
    check_count("n", n, 1)
    return n & (n - 1) == 0


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (an int >= 1): 1 -> 1, 3 -> 4, 6 -> 8, 9 -> 16."""
    check_count("n", n, 1)
    return 1 << (n - 1).bit_length()


def safe_num_spec_tokens(max_k: int) -> list[int]:
    """Draft lengths ``k`` in ``1..max_k`` whose verification length ``k + 1`` is a power of two.

    These are the ``num_speculative_tokens`` values that never hit aiter #2720: 1, 3, 7, 15, ...
    """
    check_count("max_k", max_k, 0)
    return [k for k in range(1, max_k + 1) if is_pow2(k + 1)]
