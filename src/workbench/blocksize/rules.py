"""vLLM's block-size rules: declarations (``int | MultipleOf``), their notation, and the selector.

:func:`select_common_block_size` gives vLLM's answer for every input in its domain (checked against
the real function of the installed vLLM (0.33.0) by ``tests/test_blocksize_vllm_conformance.py``). Where it differs
from vLLM (bad input only): vLLM returns an answer for a manager block size of 0, for an empty backend
list, for ``True`` or non-positive ``int`` entries, and divides by zero on an entry ``0``; here those
raise a ``ValueError`` that names the argument.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Union

import numpy as np

DEFAULT_BLOCK_SIZE = 16  # tokens: vLLM's default manager block size (--block-size) on CUDA and ROCm
MAX_SUGGESTED_BLOCK_SIZE = 1024  # tokens: manager block sizes up to this are suggested when selection fails


# ---- declarations ------------------------------------------------------------------------------

class MultipleOf:
    """A declared kernel block size that accepts every multiple of ``base`` (vLLM's ``MultipleOf``).

    ``MultipleOf(16)`` accepts 16, 32, 48, ...; ``MultipleOf(1)`` accepts every size.
    """

    __slots__ = ("base",)

    def __init__(self, base: int):
        if isinstance(base, bool) or not isinstance(base, (int, np.integer)) or base < 1:
            raise ValueError(f"MultipleOf(base={base!r}): base must be a positive integer (MultipleOf(1) accepts any size)")
        object.__setattr__(self, "base", int(base))

    def __setattr__(self, name, value):  # immutable, so it can be hashed
        raise AttributeError("MultipleOf is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MultipleOf) and other.base == self.base

    def __hash__(self) -> int:
        return hash(("MultipleOf", self.base))

    def __repr__(self) -> str:
        return f"MultipleOf({self.base})"

    def __reduce__(self):
        return (MultipleOf, (self.base,))


SizeEntry = Union[int, MultipleOf]


def _is_foreign_multiple_of(x: object) -> bool:
    """A ``MultipleOf`` from another module (vLLM's own): same name, an integer ``base``."""
    return type(x).__name__ == "MultipleOf" and not isinstance(x, MultipleOf) \
        and isinstance(getattr(x, "base", None), int)


def _normalize_entry(x: object, where: str) -> object:
    """An entry as this package compares it: ints and MultipleOf checked, anything else kept as is.

    Unknown types are kept so that :func:`select_common_block_size` can raise vLLM's
    ``Unknown supported size`` at the moment vLLM would (it checks entries lazily).
    """
    if isinstance(x, bool):
        raise ValueError(f"{where} is {x!r}: a kernel block size must be a positive int or MultipleOf, not a bool")
    if isinstance(x, np.integer):
        x = int(x)
    if isinstance(x, int):
        if x < 1:
            raise ValueError(f"{where} is {x}: an exact kernel block size must be a positive int "
                             "(use MultipleOf(1) for 'any size')")
        return x
    if isinstance(x, MultipleOf):
        return x
    if _is_foreign_multiple_of(x):
        return MultipleOf(x.base)
    return x


def _entry_accepts(entry: object, block_size: int) -> bool:
    """vLLM's per-entry rule: an int accepts only itself, a MultipleOf its multiples."""
    if isinstance(entry, int):
        return block_size == entry
    if isinstance(entry, MultipleOf):
        return block_size % entry.base == 0
    raise ValueError(f"Unknown supported size: {entry} (type {type(entry).__name__}; a backend must declare "
                     "int or MultipleOf entries)")


def _accepts_all_entries(sizes: Sequence[object], block_size: int) -> bool:
    # Like vLLM, look at every entry of the backend (no early exit), so that an unknown entry
    # raises whenever this backend is consulted.
    ok = False
    for entry in sizes:
        if _entry_accepts(entry, block_size):
            ok = True
    return ok


def supports_block_size(sizes: Sequence[SizeEntry], block_size: int) -> bool:
    """Whether a backend that declares ``sizes`` accepts kernel block size ``block_size``.

    >>> supports_block_size([MultipleOf(16)], 32), supports_block_size([1], 16)
    (True, False)
    """
    block_size = _check_block_size(block_size, "block_size")
    entries = [_normalize_entry(x, f"sizes[{i}]") for i, x in enumerate(_as_list(sizes, "sizes"))]
    return _accepts_all_entries(entries, block_size)


def _check_block_size(value: object, arg: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{arg}={value!r}: a block size must be a positive integer number of tokens")
    if value < 1:
        raise ValueError(f"{arg}={value}: a block size must be a positive integer number of tokens (vLLM's default is 16)")
    return int(value)


def _as_list(sizes: object, arg: str) -> list:
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Iterable):
        raise TypeError(f"{arg}={sizes!r}: expected a list of int | MultipleOf (parse a string with parse_sizes)")
    return list(sizes)


# ---- the notation of vLLM's docs ---------------------------------------------------------------

_TOKEN = re.compile(r"^(%)?\s*(\d+)$")


def parse_sizes(text: str) -> list[SizeEntry]:
    """Parse the notation of vLLM's attention-backend docs table into declarations.

    ``"%16"`` -> ``[MultipleOf(16)]``; ``"16, 32, 64"`` -> ``[16, 32, 64]``; ``"Any"`` -> ``[MultipleOf(1)]``;
    mixed entries are allowed: ``"1, %16"``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text={text!r}: expected a string such as '%16, 32'")
    if text.strip().lower() == "any":
        return [MultipleOf(1)]
    out: list[SizeEntry] = []
    for token in text.split(","):
        token = token.strip()
        m = _TOKEN.match(token)
        if not m:
            raise ValueError(f"text={text!r}: cannot read {token!r}; write sizes as '%N' (multiple of N), "
                             "'N' (exactly N) or 'Any', separated by commas")
        value = int(m.group(2))
        if value < 1:
            raise ValueError(f"text={text!r}: {token!r} is not a positive size")
        out.append(MultipleOf(value) if m.group(1) else value)
    return out


def format_sizes(sizes: Sequence[SizeEntry]) -> str:
    """Write declarations in the docs notation: ``[MultipleOf(16), 32]`` -> ``"%16, 32"``."""
    parts = []
    for i, x in enumerate(_as_list(sizes, "sizes")):
        x = _normalize_entry(x, f"sizes[{i}]")
        if isinstance(x, MultipleOf):
            parts.append(f"%{x.base}")
        elif isinstance(x, int):
            parts.append(str(x))
        else:
            raise ValueError(f"sizes[{i}]={x!r}: cannot format; entries must be int or MultipleOf")
    return ", ".join(parts)


# ---- the selector ------------------------------------------------------------------------------

def _describe_backend(item: object, index: int) -> tuple[str, list]:
    """``(name, raw sizes)`` of one item of ``backends`` (descriptor, class, or plain list)."""
    where = f"backends[{index}]"
    if hasattr(item, "get_supported_kernel_block_sizes"):
        sizes = item.get_supported_kernel_block_sizes()
        try:
            name = str(item.get_name())
        except Exception:  # noqa: BLE001 - abstract or failing get_name(): fall back to the class name
            name = getattr(item, "__name__", type(item).__name__)
        return name, _as_list(sizes, f"{where}.get_supported_kernel_block_sizes()")
    if isinstance(item, str):
        raise TypeError(f"{where}={item!r}: a name is not a backend; use "
                        f"blocksize.get_backend({item!r}, vllm_version) to look it up in the catalog")
    if isinstance(item, (list, tuple)):
        return where, list(item)
    raise TypeError(f"{where}={item!r}: expected a catalog Backend, a class with get_supported_kernel_block_sizes(), "
                    "or a list of int | MultipleOf")


def _prepare(kv_manager_block_size: object, backends: object) -> tuple[int, list[tuple[str, list]]]:
    n = _check_block_size(kv_manager_block_size, "kv_manager_block_size")
    if isinstance(backends, (str, bytes)) or not isinstance(backends, Iterable):
        raise TypeError(f"backends={backends!r}: expected a sequence of backends")
    items = list(backends)
    if not items:
        raise ValueError("backends is empty: a KV-cache group has at least one attention backend "
                         "(vLLM would return any size for an empty list)")
    described = []
    for i, item in enumerate(items):
        name, raw = _describe_backend(item, i)
        described.append((name, [_normalize_entry(x, f"{name} entry {j}") for j, x in enumerate(raw)]))
    return n, described


def _select(n: int, sizes: Sequence[Sequence[object]]) -> int | None:
    """vLLM's selection on normalized declarations; ``None`` when no size works.

    The order of evaluation follows vLLM 0.32-0.33 (``vllm/v1/worker/utils.py``): a backend's whole
    list is scanned, backends are consulted in order and the scan stops at the first that rejects,
    so an unknown entry raises exactly when vLLM would raise.
    """
    if all(_accepts_all_entries(s, n) for s in sizes):
        return n
    candidates = {x for s in sizes for x in s if isinstance(x, int) and n % x == 0}
    for size in sorted(candidates, reverse=True):
        if all(_accepts_all_entries(s, size) for s in sizes):
            return size
    return None


class BlockSizeError(ValueError):
    """No kernel block size satisfies every backend of a KV-cache group.

    The message starts with vLLM's own text ``No common block size for {n}. ``. The same facts are
    attributes:

    Attributes:
        kv_manager_block_size: the manager block size that was asked for.
        backends: ``((name, declared sizes), ...)`` in the order given.
        reasons: why each option failed, one sentence each.
        suggestions: manager block sizes up to :data:`MAX_SUGGESTED_BLOCK_SIZE` for which selection
            succeeds with these backends (empty: they can never share a group).
    """

    def __init__(self, kv_manager_block_size: int, backends: Sequence[tuple[str, Sequence[object]]],
                 reasons: Sequence[str], suggestions: Sequence[int]):
        self.kv_manager_block_size = kv_manager_block_size
        self.backends = tuple((name, tuple(s)) for name, s in backends)
        self.reasons = tuple(reasons)
        self.suggestions = tuple(suggestions)
        listing = "; ".join(f"{name}: {list(s)!r}" for name, s in self.backends)
        if self.suggestions:
            shown = ", ".join(str(x) for x in self.suggestions[:6])
            more = f", ... ({len(self.suggestions)} sizes)" if len(self.suggestions) > 6 else ""
            fix = f"Manager block sizes (--block-size) up to {MAX_SUGGESTED_BLOCK_SIZE} that work: {shown}{more}."
        else:
            fix = (f"No manager block size up to {MAX_SUGGESTED_BLOCK_SIZE} works: these backends cannot share "
                   "one KV-cache group; choose other backends.")
        super().__init__(f"No common block size for {kv_manager_block_size}. ({listing}). "
                         + " ".join(self.reasons) + " " + fix)


def _accepts_known_entries(sizes: Sequence[object], block_size: int) -> bool:
    """For explanations only: entries of unknown type (that vLLM never reached) accept nothing."""
    return any(_entry_accepts(e, block_size) for e in sizes if isinstance(e, (int, MultipleOf)))


def _explain(n: int, described: Sequence[tuple[str, Sequence[object]]]) -> BlockSizeError:
    sizes = [s for _, s in described]
    reasons = [f"{name} declares {list(s)!r} and does not accept {n}."
               for name, s in described if not _accepts_known_entries(s, n)]
    candidates = sorted({x for s in sizes for x in s if isinstance(x, int) and n % x == 0}, reverse=True)
    if not candidates:
        reasons.append(f"No backend declares an exact size that divides {n}, so the blocks cannot be split "
                       "into smaller kernel blocks.")
    for c in candidates:
        rejecting = [name for name, s in described if not _accepts_known_entries(s, c)]
        reasons.append(f"Splitting into kernel blocks of {c} fails: {', '.join(rejecting)} "
                       f"{'does' if len(rejecting) == 1 else 'do'} not accept {c}.")
    suggestions = []
    for m in range(1, MAX_SUGGESTED_BLOCK_SIZE + 1):
        try:
            if _select(m, sizes) is not None:
                suggestions.append(m)
        except ValueError:  # an unknown entry: vLLM would raise for this size too
            pass
    return BlockSizeError(n, described, reasons, suggestions)


def select_common_block_size(kv_manager_block_size: int, backends: Sequence[Any]) -> int:
    """The kernel block size vLLM selects for one KV-cache group.

    Args:
        kv_manager_block_size: the group's block size in tokens (``--block-size``), a positive int.
        backends: the group's attention backends, each a catalog :class:`Backend`, anything with a
            ``get_supported_kernel_block_sizes()`` method (real vLLM classes included), or a plain list
            of ``int | MultipleOf``.

    Returns:
        ``kv_manager_block_size`` itself when every backend accepts it, else the largest exact size
        declared by some backend that divides it and that every backend accepts.

    Raises:
        BlockSizeError: no size works (message starts with ``No common block size for {n}. ``).
        ValueError: ``Unknown supported size: ...`` for an entry that is neither int nor MultipleOf
            (raised when vLLM would raise it), or bad input (non-positive sizes, empty ``backends``).
    """
    n, described = _prepare(kv_manager_block_size, backends)
    chosen = _select(n, [s for _, s in described])
    if chosen is None:
        raise _explain(n, described)
    return chosen
