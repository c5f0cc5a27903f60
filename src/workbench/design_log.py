"""The design log: every kernel idea that was built and measured, what it measured, and its verdict.

A variant that lost is deleted from the library; its row here says what it was, what it measured (on an H200
unless the row names another card), and where its code still lives (the git tag ``lab-2026-12``:
``git checkout lab-2026-12`` restores it). The rows are data (``data/design_log/<family>.json``, one file per
kernel family), read by the book's "what moved the numbers" sections and its design-log appendix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["FAMILIES", "FIELDS", "TAG", "load", "markdown"]

DATA_DIR = Path(__file__).resolve().parent / "data" / "design_log"
TAG = "lab-2026-12"  # the annotated git tag that keeps every deleted variant and its measurements
FIELDS = ("idea", "measured", "verdict", "code")  # every row has exactly these keys, each a non-empty string
FAMILIES = ("expand", "decode")


def load(family: str) -> list[dict[str, str]]:
    """The rows of ``family`` (one of :data:`FAMILIES`), in the file's order. A row that lacks a field, or a file
    that is missing or not a JSON list, raises ValueError naming the file and the rule."""
    if family not in FAMILIES:
        raise ValueError(f"family is {family!r}; it must be one of {FAMILIES}")
    path = DATA_DIR / f"{family}.json"
    if not path.exists():
        raise ValueError(f"{path} is missing: the design log of {family!r} ships with the package")
    try:
        rows: Any = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(rows, list):
        raise ValueError(f"{path} must hold a JSON list of rows, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or set(row) != set(FIELDS) or not all(
                isinstance(row[f], str) and row[f].strip() for f in FIELDS):
            raise ValueError(f"{path} row {i}: every row needs exactly the non-empty string fields {FIELDS}, "
                             f"got {row!r}")
    return rows


def markdown(family: str) -> str:
    """The rows of ``family`` as a Markdown table (the book shows it with ``IPython.display.Markdown``)."""
    head = "| idea | measured (H200 unless named) | verdict | code |\n|---|---|---|---|\n"
    esc = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
    return head + "\n".join(f"| {esc(r['idea'])} | {esc(r['measured'])} | {esc(r['verdict'])} | `{esc(r['code'])}` |"
                            for r in load(family))
