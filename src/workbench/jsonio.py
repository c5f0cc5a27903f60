"""Strict JSON for everything the library writes: JSON has no NaN or infinity, so a non-finite float is written as
``null`` (Python's ``json`` would write ``NaN``, which other readers reject)."""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "finite"]


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float inside dicts, lists and tuples replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`finite` ``(value)`` with ``allow_nan=False`` (any keyword of ``json.dumps`` else)."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)
