"""Which kernel block size a KV-cache group gets: vLLM's rules, the backend catalog, groups.

vLLM lets each attention backend declare the *kernel block sizes* its kernels accept, as data:
``get_supported_kernel_block_sizes() -> list[int | MultipleOf]`` (an ``int`` accepts exactly that
size, ``MultipleOf(b)`` any multiple of ``b``). Layers whose KV-cache specs have the same type and
block size form one KV-cache group with one block table, and every backend used by a layer of
the group must accept the group's kernel block size. :func:`select_common_block_size` picks it:

1. if every backend accepts the manager's block size (``--block-size``), use it unchanged;
2. else try the sizes that some backend declares as an exact ``int`` and that divide the manager
   block size, largest first; the first one every backend accepts wins, and each manager block is
   split into ``manager // kernel`` kernel blocks ("hybrid blocks", :func:`map_to_kernel_blocks`);
3. else fail with ``No common block size for {n}. `` (:class:`BlockSizeError`).

Before vLLM PR #39616 (first released in v0.20.0) ``ROCM_AITER_MLA`` declared ``[1]`` and an Eagle3
draft's FlashAttention-style backend ``[MultipleOf(16)]``: no size satisfies both, so the selector
failed. After it, ``ROCM_AITER_MLA`` declares ``[MultipleOf(1)]`` and the group keeps 16.

What is here:

* :class:`MultipleOf`, :func:`parse_sizes`, :func:`format_sizes` (the ``%16, 32`` notation of vLLM's docs),
  :func:`supports_block_size`;
* :func:`select_common_block_size`, which gives vLLM's answer for every input in its domain (checked
  against the real function of vLLM 0.32.0 by ``tests/test_blocksize_vllm_conformance.py``);
* the backend catalog for vLLM 0.19 and 0.20 (:func:`catalog`) and a reader of the *installed* vLLM's
  real backend classes (:func:`read_installed_backends`);
* the KV-cache-group model (:class:`Layer`, :func:`group_layers`, :func:`select_kernel_block_sizes`),
  hybrid splitting (:func:`kernel_block_ratio`, :func:`map_to_kernel_blocks`);
* :func:`check_spec_decode` (target + Eagle3 draft, a :class:`SpecDecodeReport`) and
  :func:`compatibility_matrix` (targets x drafts x block sizes);
* :func:`ask_real_vllm`: the same questions put to a real vLLM (in this process when it imports, else
  in the ``.venv-vllm`` environment made by ``scripts/vllm_env.sh``).

Where this model deliberately differs from vLLM (bad input only): vLLM returns an answer for a
manager block size of 0, for an empty backend list, for ``True`` or non-positive ``int`` entries,
and divides by zero on an entry ``0``; here those raise a ``ValueError`` that names the argument.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import json
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Union

import numpy as np

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "MAX_SUGGESTED_BLOCK_SIZE",
    "VLLM_VERSIONS",
    "Backend",
    "BlockSizeError",
    "CompatibilityMatrix",
    "GroupSelection",
    "InstalledBackends",
    "KVCacheGroup",
    "Layer",
    "MultipleOf",
    "SpecDecodeReport",
    "ask_real_vllm",
    "catalog",
    "catalog_table",
    "check_spec_decode",
    "compatibility_matrix",
    "format_sizes",
    "get_backend",
    "group_layers",
    "kernel_block_ratio",
    "map_to_kernel_blocks",
    "parse_sizes",
    "preferred_block_size",
    "read_installed_backends",
    "select_common_block_size",
    "select_kernel_block_sizes",
    "supports_block_size",
]

DEFAULT_BLOCK_SIZE = 16  # tokens: vLLM's default manager block size (--block-size) on CUDA and ROCm
MAX_SUGGESTED_BLOCK_SIZE = 1024  # tokens: manager block sizes up to this are suggested when selection fails
VLLM_VERSIONS = ("0.19", "0.20")  # catalog keys: before and after PR #39616
SPEC_KINDS = ("full", "mla", "sliding_window", "chunked_local")


# --------------------------------------------------------------------------------------------
# Declarations: MultipleOf, the docs notation, one backend's check
# --------------------------------------------------------------------------------------------

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
    """An entry as this module compares it: ints and MultipleOf checked, anything else kept as is.

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


# --------------------------------------------------------------------------------------------
# Backends: catalog descriptors, real classes, plain lists
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Backend:
    """One attention backend's declaration, as data. Quacks like a vLLM backend class.

    Attributes:
        name: the registry name (``AttentionBackendEnum`` member, what ``--attention-backend`` takes).
        sizes: declared kernel block sizes.
        kind: ``"mla"`` (its layers have MLA specs) or ``"full"`` (standard attention).
        class_path: where vLLM defines the class.
        platform: ``"cuda"``, ``"rocm"``, ``"cpu"`` or ``"any"`` (where it runs; informational).
        reported_name: what the class's ``get_name()`` returns when it differs from ``name``.
        note: provenance or caveat.
        preferred: the block size the backend asks for when ``--block-size`` is not given, where it
            overrides vLLM's default rule (:func:`preferred_block_size`); else ``None``.
    """

    name: str
    sizes: tuple
    kind: str = "full"
    class_path: str = ""
    platform: str = "any"
    reported_name: str | None = None
    note: str = ""
    preferred: int | None = None

    def get_supported_kernel_block_sizes(self, kv_cache_spec: Any = None) -> list:
        return list(self.sizes)

    def get_name(self) -> str:
        return self.name

    @property
    def sizes_text(self) -> str:
        return format_sizes(self.sizes)


_B = "vllm.v1.attention.backends."
# Declared kernel block sizes in vLLM v0.20.0, read from the sources of the released wheel
# (vllm-0.20.0, vllm/v1/attention/backends/). A backend without its own declaration inherits its base
# class's: AttentionBackend's default [MultipleOf(1)], or its parent backend's.
# (name, sizes in docs notation, kind, class path, platform, reported_name, note)
_DECLARED_0_20: tuple = (
    ("FLASH_ATTN", "%16", "full", _B + "flash_attn.FlashAttentionBackend", "cuda", None,
     "16, 32, 64 instead for hybrid models with a float32 Mamba cache"),
    ("FLASHINFER", "16, 32, 64", "full", _B + "flashinfer.FlashInferBackend", "cuda", None, ""),
    ("TRITON_ATTN", "%16", "full", _B + "triton_attn.TritonAttentionBackend", "any", None, ""),
    ("TREE_ATTN", "%16", "full", _B + "tree_attn.TreeAttentionBackend", "any", None, ""),
    ("FLEX_ATTENTION", "%1", "full", _B + "flex_attention.FlexAttentionBackend", "any", None,
     "inherits the base class default"),
    ("FLASH_ATTN_DIFFKV", "%16", "full", _B + "flash_attn_diffkv.FlashAttentionDiffKVBackend", "cuda", None,
     "inherits FLASH_ATTN's declaration"),
    ("CPU_ATTN", "%1", "full", _B + "cpu_attn.CPUAttentionBackend", "cpu", None, "inherits the base class default"),
    ("TURBOQUANT", "16, 32, 64, 128", "full", _B + "turboquant_attn.TurboQuantAttentionBackend", "any", None,
     "new in v0.20.0"),
    ("ROCM_ATTN", "%16", "full", _B + "rocm_attn.RocmAttentionBackend", "rocm", None, ""),
    ("ROCM_AITER_FA", "16, 32", "full", _B + "rocm_aiter_fa.AiterFlashAttentionBackend", "rocm", "FLASH_ATTN",
     "the class's get_name() returns 'FLASH_ATTN'"),
    ("ROCM_AITER_UNIFIED_ATTN", "%16", "full", _B + "rocm_aiter_unified_attn.RocmAiterUnifiedAttentionBackend",
     "rocm", None, "asks for --block-size 64 when none is given"),
    ("FLASHMLA", "64", "mla", _B + "mla.flashmla.FlashMLABackend", "cuda", None, ""),
    ("FLASHMLA_SPARSE", "64", "mla", _B + "mla.flashmla_sparse.FlashMLASparseBackend", "cuda", None, ""),
    ("FLASH_ATTN_MLA", "%16", "mla", _B + "mla.flashattn_mla.FlashAttnMLABackend", "cuda", None, ""),
    ("CUTLASS_MLA", "128", "mla", _B + "mla.cutlass_mla.CutlassMLABackend", "cuda", None, ""),
    ("TRITON_MLA", "%16", "mla", _B + "mla.triton_mla.TritonMLABackend", "any", None, ""),
    ("FLASHINFER_MLA", "32, 64", "mla", _B + "mla.flashinfer_mla.FlashInferMLABackend", "cuda", None, ""),
    ("ROCM_AITER_MLA", "%1", "mla", _B + "mla.rocm_aiter_mla.AiterMLABackend", "rocm", None,
     "PR #39616 changed [1] to [MultipleOf(1)]"),
    ("ROCM_AITER_TRITON_MLA", "%1", "mla", _B + "mla.aiter_triton_mla.AiterTritonMLABackend", "rocm",
     "AITER_TRITON_MLA", "inherits ROCM_AITER_MLA's declaration"),
    ("ROCM_AITER_MLA_SPARSE", "1", "mla", _B + "mla.rocm_aiter_mla_sparse.ROCMAiterMLASparseBackend", "rocm", None, ""),
)
# vLLM 0.19 (v0.19.1 wheel, before PR #39616): the PR's one-line declaration change, the subclass that
# inherits it, and the one backend that did not exist yet. Every other declaration is the same.
_CHANGED_IN_0_20 = {
    "ROCM_AITER_MLA": ("1", "declared [1] before PR #39616"),
    "ROCM_AITER_TRITON_MLA": ("1", "inherits ROCM_AITER_MLA's declaration"),
}
_NEW_IN_0_20 = {"TURBOQUANT"}
# Backends that override get_preferred_block_size() (both versions).
_PREFERRED = {"ROCM_AITER_UNIFIED_ATTN": 64}


def _build_catalogs() -> dict[str, dict[str, Backend]]:
    def make(row, sizes_text=None, note=None) -> Backend:
        name, text, kind, path, plat, reported, nt = row
        return Backend(name, tuple(parse_sizes(sizes_text or text)), kind, path, plat, reported,
                       nt if note is None else note, _PREFERRED.get(name))

    after = {row[0]: make(row) for row in _DECLARED_0_20}
    before = {row[0]: (make(row, *_CHANGED_IN_0_20[row[0]]) if row[0] in _CHANGED_IN_0_20 else make(row))
              for row in _DECLARED_0_20 if row[0] not in _NEW_IN_0_20}
    return {"0.19": before, "0.20": after}


_CATALOGS = _build_catalogs()


def _catalog_key(vllm_version: object) -> str:
    """``"0.19"``, ``"0.19.1"``, ``"v0.20.0"`` -> catalog key; ``"installed"`` passes through."""
    text = str(vllm_version).strip().lower()
    if text == "installed":
        return "installed"
    m = re.match(r"^v?(\d+)\.(\d+)(\.\S*)?$", text)
    if m and f"{m.group(1)}.{m.group(2)}" in _CATALOGS:
        return f"{m.group(1)}.{m.group(2)}"
    raise ValueError(
        f"vllm_version={vllm_version!r} is not in the catalog; choose '0.19' (before PR #39616), "
        "'0.20' (after it) or 'installed' (read the installed vLLM's backend classes)")


def catalog(vllm_version: str = "0.20") -> dict[str, Backend]:
    """The declared kernel block sizes of every backend, by registry name, for one vLLM version.

    ``vllm_version``: ``"0.19"`` (before PR #39616), ``"0.20"`` (after), or ``"installed"``: the
    classes of the vLLM importable here that could be read (raises ``ValueError`` with the reason
    when vLLM is not importable; :func:`read_installed_backends` reports per backend).
    """
    key = _catalog_key(vllm_version)
    if key == "installed":
        reading = read_installed_backends()
        if not reading.available:
            raise ValueError(f"vllm_version='installed': {reading.reason}")
        return dict(reading.backends)
    return dict(_CATALOGS[key])


def get_backend(name: str | Backend, vllm_version: str = "0.20") -> Backend:
    """Look a backend up by registry name (case-insensitive); suggest close names when unknown."""
    if isinstance(name, Backend):
        return name
    if not isinstance(name, str):
        raise TypeError(f"backend name {name!r}: expected a registry name such as 'ROCM_AITER_MLA'")
    table = catalog(vllm_version)
    key = name.strip().upper().replace("-", "_")
    if key in table:
        return table[key]
    elsewhere = [v for v in VLLM_VERSIONS if key in _CATALOGS[v]]
    if elsewhere:
        raise ValueError(f"attention backend {key!r} does not exist in vLLM {vllm_version}; "
                         f"it is in the catalog of vLLM {', '.join(elsewhere)}")
    close = difflib.get_close_matches(key, list(table), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ValueError(f"unknown attention backend {name!r} for vLLM {vllm_version}: {hint}"
                     f"known backends: {', '.join(sorted(table))}")


def preferred_block_size(backend: Any, default: int = DEFAULT_BLOCK_SIZE) -> int:
    """The manager block size vLLM picks when ``--block-size`` is not given (vLLM 0.19 and 0.20).

    vLLM asks the backend of the first attention layer (the target model's) for its preferred block
    size: a backend that accepts ``default`` (16) or one of its multiples keeps it; otherwise the
    smallest declared size or base wins (FLASHMLA ``[64]`` -> 64, CUTLASS_MLA ``[128]`` -> 128). A few
    backends override the rule (``Backend.preferred``, e.g. ROCM_AITER_UNIFIED_ATTN -> 64). As in
    vLLM, an int entry counts as accepting its multiples here, because blocks can be split.
    """
    default = _check_block_size(default, "default")
    if isinstance(backend, Backend) and backend.preferred is not None:
        return backend.preferred
    name, raw = _describe_backend(backend, 0)
    sizes = [_normalize_entry(x, f"{name} entry {j}") for j, x in enumerate(raw)]
    if not sizes:
        return default
    bases = []
    for x in sizes:
        if not isinstance(x, (int, MultipleOf)):
            raise ValueError(f"Unknown supported size: {x} (in {name})")
        bases.append(x.base if isinstance(x, MultipleOf) else x)
    if any(default % b == 0 for b in bases):
        return default
    return min(bases)


def catalog_table(vllm_version: str = "0.20", markdown: bool = False) -> str:
    """The catalog as a table (plain text, or Markdown like vLLM's docs table), generated, never typed."""
    table = catalog(vllm_version)
    key = _catalog_key(vllm_version)
    other = _CATALOGS["0.19"] if key == "0.20" else _CATALOGS["0.20"] if key == "0.19" else {}
    rows = []
    for b in sorted(table.values(), key=lambda b: (b.kind != "mla", b.platform, b.name)):
        changed = ""
        if b.name in other and other[b.name].sizes != b.sizes:
            changed = f"{'was' if key == '0.20' else 'becomes'} {other[b.name].sizes_text} (PR #39616)"
        elif key == "0.20" and b.name not in other:
            changed = "new in 0.20"
        rows.append((b.name, b.sizes_text, "MLA" if b.kind == "mla" else "standard", b.platform, changed))
    head = ("backend", "kernel block sizes", "attention", "platform", "changed")
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(f"`{c}`" if i == 0 else c for i, c in enumerate(r)) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    fmt = "  ".join(f"{{:{w}s}}" for w in widths)
    return "\n".join([fmt.format(*head).rstrip(), fmt.format(*("-" * w for w in widths)).rstrip()]
                     + [fmt.format(*r).rstrip() for r in rows])


@dataclasses.dataclass(frozen=True)
class InstalledBackends:
    """What :func:`read_installed_backends` found in the installed vLLM.

    Attributes:
        available: whether vLLM's backend registry could be imported at all.
        vllm_version: the installed version, or ``None``.
        backends: the backends whose class imported and whose declaration could be read.
        failures: registry name -> why that backend could not be read (e.g. needs CUDA).
        reason: a one-line summary.
    """

    available: bool
    vllm_version: str | None
    backends: Mapping[str, Backend]
    failures: Mapping[str, str]
    reason: str


@functools.cache
def read_installed_backends() -> InstalledBackends:
    """Import the installed vLLM's real backend classes and read their declarations.

    Never raises: when vLLM is missing every field says so, and a backend whose module fails to
    import (many need CUDA or ROCm libraries at import) is listed in ``failures`` with the reason.
    """
    from workbench import device

    status = device.vllm_status()
    if not status.available:
        return InstalledBackends(False, status.version, {}, {}, f"vLLM is not importable here: {status.reason}")
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except Exception as exc:  # noqa: BLE001 - any failure is the reason
        return InstalledBackends(False, status.version, {}, {},
                                 f"vllm.v1.attention.backends.registry failed to import: {type(exc).__name__}: {exc}")
    known = _CATALOGS["0.20"]
    backends: dict[str, Backend] = {}
    failures: dict[str, str] = {}
    for member in AttentionBackendEnum:
        name = member.name
        try:
            path = member.get_path()
        except Exception as exc:  # noqa: BLE001
            failures[name] = f"no class path: {type(exc).__name__}: {exc}"
            continue
        if not path:
            failures[name] = "no class path in the registry"
            continue
        try:
            module, _, cls_name = path.rpartition(".")
            cls = getattr(importlib.import_module(module), cls_name)
            sizes = tuple(_normalize_entry(x, f"{name}.get_supported_kernel_block_sizes()[{i}]")
                          for i, x in enumerate(cls.get_supported_kernel_block_sizes()))
            reported = cls.get_name()
        except Exception as exc:  # noqa: BLE001 - report per backend, never fail as a whole
            first = str(exc).splitlines()[0] if str(exc) else ""
            failures[name] = f"{type(exc).__name__}: {first[:200]}"
            continue
        kind = known[name].kind if name in known else ("mla" if "MLA" in name else "full")
        backends[name] = Backend(name, sizes, kind, path, known[name].platform if name in known else "any",
                                 reported if reported != name else None, f"read from vLLM {status.version}")
    reason = f"vLLM {status.version}: read {len(backends)} backends, {len(failures)} could not be read"
    return InstalledBackends(True, status.version, backends, failures, reason)


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

    The order of evaluation follows vLLM 0.32.0 (``vllm/v1/worker/utils.py``): a backend's whole
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


# --------------------------------------------------------------------------------------------
# KV-cache groups and hybrid blocks
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Layer:
    """One attention layer as the KV-cache manager sees it.

    Attributes:
        name: the layer's name, e.g. ``"model.layers.0.self_attn.attn"``.
        kind: spec kind: ``"full"``, ``"mla"`` (an MLA spec is a full-attention spec),
            ``"sliding_window"`` or ``"chunked_local"``.
        block_size: the manager block size of its spec, in tokens.
        backend: its attention backend (catalog :class:`Backend`, class, or list of sizes).
        window: the window (sliding_window) or chunk (chunked_local) size in tokens; else ``None``.
    """

    name: str
    kind: str
    block_size: int
    backend: Any
    window: int | None = None

    def __post_init__(self):
        if self.kind not in SPEC_KINDS:
            close = difflib.get_close_matches(str(self.kind), SPEC_KINDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"Layer {self.name!r}: kind={self.kind!r} is not one of {', '.join(SPEC_KINDS)}{hint}")
        _check_block_size(self.block_size, f"Layer {self.name!r}: block_size")
        if self.kind in ("sliding_window", "chunked_local"):
            _check_block_size(self.window, f"Layer {self.name!r}: window (needed for kind={self.kind!r})")

    @property
    def type_key(self) -> tuple:
        """Layers with equal type keys need the same token slots: MLA counts as full attention."""
        if self.kind in ("full", "mla"):
            return ("full_attention",)
        return (self.kind, self.window)


def _backend_key(backend: Any) -> Any:
    if isinstance(backend, Backend):
        return ("backend", backend.name, backend.sizes)
    if isinstance(backend, (list, tuple)):
        return ("sizes", repr(list(backend)))
    return ("object", id(backend))


@dataclasses.dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share one block table (one manager block size, one kernel block size)."""

    index: int
    type_key: tuple
    block_size: int
    layers: tuple[Layer, ...]

    @property
    def backends(self) -> list:
        """The distinct backends of the group's layers, in order of first appearance (one per class)."""
        seen, out = set(), []
        for layer in self.layers:
            key = _backend_key(layer.backend)
            if key not in seen:
                seen.add(key)
                out.append(layer.backend)
        return out

    @property
    def kind(self) -> str:
        return "full_attention" if self.type_key == ("full_attention",) else f"{self.type_key[0]}({self.type_key[1]})"


def group_layers(layers: Sequence[Layer]) -> list[KVCacheGroup]:
    """Group layers the way vLLM's uniform-type grouping does.

    Layers with the same type (full and MLA count as one type; sliding windows of different sizes
    are different types) and the same block size share one group and one block table. This is the
    rule for the common cases (one type: ``UniformTypeKVCacheSpecs``); for hybrid models vLLM's
    real grouping also balances group sizes and unifies page sizes, which this model does not do:
    it puts each (type, block size) in its own group, in order of first appearance.
    """
    layers = list(layers)
    if not layers:
        raise ValueError("layers is empty: describe at least one attention layer")
    for i, layer in enumerate(layers):
        if not isinstance(layer, Layer):
            raise TypeError(f"layers[{i}]={layer!r}: expected a blocksize.Layer")
    names = [layer.name for layer in layers]
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise ValueError(f"layers: duplicate layer names {dup}; every layer needs its own name")
    order: dict[tuple, list[Layer]] = {}
    for layer in layers:
        order.setdefault((layer.type_key, layer.block_size), []).append(layer)
    return [KVCacheGroup(i, key[0], key[1], tuple(members)) for i, (key, members) in enumerate(order.items())]


@dataclasses.dataclass(frozen=True)
class GroupSelection:
    """The kernel block size chosen for one group, or why there is none."""

    group: KVCacheGroup
    kernel_block_size: int | None
    error: BlockSizeError | None

    @property
    def ratio(self) -> int | None:
        """Kernel blocks per manager block (1: no split)."""
        return None if self.kernel_block_size is None else self.group.block_size // self.kernel_block_size

    @property
    def ok(self) -> bool:
        return self.kernel_block_size is not None


def select_kernel_block_sizes(layers: Sequence[Layer]) -> list[GroupSelection]:
    """Group the layers (:func:`group_layers`), then select one kernel block size per group."""
    out = []
    for group in group_layers(layers):
        try:
            out.append(GroupSelection(group, select_common_block_size(group.block_size, group.backends), None))
        except BlockSizeError as exc:
            out.append(GroupSelection(group, None, exc))
    return out


def kernel_block_ratio(kv_manager_block_size: int, kernel_block_size: int) -> int:
    """How many kernel blocks one manager block splits into; vLLM's error when it does not divide."""
    b = _check_block_size(kv_manager_block_size, "kv_manager_block_size")
    k = _check_block_size(kernel_block_size, "kernel_block_size")
    if b % k:
        raise ValueError(f"kernel_block_size {k} must divide kv_manager_block_size size {b} evenly")
    return b // k


def map_to_kernel_blocks(block_ids, ratio: int):
    """Split manager block ids into kernel block ids: id ``i`` becomes ``i*ratio .. i*ratio+ratio-1``.

    Args:
        block_ids: manager block ids, any shape, non-negative integers (list, numpy array or torch tensor).
        ratio: kernel blocks per manager block (:func:`kernel_block_ratio`).

    Returns:
        The kernel block ids, flattened to 1-D with ``len(block_ids) * ratio`` entries: a numpy
        ``int64`` array, or a torch tensor of the input's dtype and device for tensor input.
    """
    if isinstance(ratio, bool) or not isinstance(ratio, (int, np.integer)) or ratio < 1:
        raise ValueError(f"ratio={ratio!r}: must be a positive integer (kv_manager_block_size // kernel_block_size)")
    ratio = int(ratio)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if torch is not None and isinstance(block_ids, torch.Tensor):
        if block_ids.is_floating_point() or block_ids.dtype == torch.bool:
            raise TypeError(f"block_ids has dtype {block_ids.dtype}: block ids must be integers")
        if block_ids.numel() and int(block_ids.min()) < 0:
            raise ValueError("block_ids contains negative ids: block ids are non-negative")
        offs = torch.arange(ratio, dtype=block_ids.dtype, device=block_ids.device)
        return (block_ids.reshape(-1, 1) * ratio + offs).reshape(-1)
    ids = np.asarray(block_ids)
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"block_ids has dtype {ids.dtype}: block ids must be integers")
    if ids.min() < 0:
        raise ValueError("block_ids contains negative ids: block ids are non-negative")
    return (ids.astype(np.int64).reshape(-1, 1) * ratio + np.arange(ratio, dtype=np.int64)).reshape(-1)


# --------------------------------------------------------------------------------------------
# Target + Eagle3 draft, and the matrix over many pairs
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SpecDecodeReport:
    """Whether a target backend and an Eagle3 draft backend can share their KV-cache group.

    Attributes:
        target, draft: the two backends (catalog descriptors).
        vllm_version: the catalog used.
        kv_manager_block_size: the manager block size: ``--block-size``, or when it was not given,
            the target backend's preferred size (:func:`preferred_block_size`; 16 for most).
        block_size_given: whether ``--block-size`` was given.
        selections: one :class:`GroupSelection` per KV-cache group (here always one group: an MLA
            target and a Llama-style draft have full-attention specs of the same block size).
    """

    target: Backend
    draft: Backend
    vllm_version: str
    kv_manager_block_size: int
    block_size_given: bool
    selections: tuple[GroupSelection, ...]

    @property
    def compatible(self) -> bool:
        return all(s.ok for s in self.selections)

    @property
    def kernel_block_size(self) -> int | None:
        return self.selections[0].kernel_block_size if len(self.selections) == 1 else None

    @property
    def ratio(self) -> int | None:
        return self.selections[0].ratio if len(self.selections) == 1 else None

    @property
    def error(self) -> BlockSizeError | None:
        return next((s.error for s in self.selections if s.error is not None), None)

    @property
    def verdict(self) -> str:
        size = (f"--block-size {self.kv_manager_block_size}" if self.block_size_given
                else f"no --block-size: {self.target.name} picks {self.kv_manager_block_size}")
        pair = f"{self.target.name} + {self.draft.name} (vLLM {self.vllm_version}, {size})"
        if not self.compatible:
            fix = (f"try --block-size {self.error.suggestions[0]}" if self.error.suggestions
                   else "no --block-size works")
            return f"incompatible: {pair}: no common kernel block size; {fix}"
        k, n = self.kernel_block_size, self.kv_manager_block_size
        if k == n:
            return f"compatible: {pair}: kernel block size {k} (no split)"
        return f"compatible: {pair}: kernel block size {k}, each block of {n} splits into {n // k} kernel blocks"

    def to_dict(self) -> dict:
        return {
            "target": self.target.name, "target_sizes": self.target.sizes_text,
            "draft": self.draft.name, "draft_sizes": self.draft.sizes_text,
            "vllm_version": self.vllm_version,
            "kv_manager_block_size": self.kv_manager_block_size,
            "block_size_given": self.block_size_given,
            "compatible": self.compatible,
            "kernel_block_size": self.kernel_block_size,
            "ratio": self.ratio,
            "groups": [{
                "index": s.group.index, "kind": s.group.kind, "block_size": s.group.block_size,
                "layers": [layer.name for layer in s.group.layers],
                "backends": [b.name if isinstance(b, Backend) else repr(b) for b in s.group.backends],
                "kernel_block_size": s.kernel_block_size, "ratio": s.ratio,
                "error": None if s.error is None else str(s.error),
                "reasons": [] if s.error is None else list(s.error.reasons),
                "suggested_block_sizes": [] if s.error is None else list(s.error.suggestions),
            } for s in self.selections],
            "verdict": self.verdict,
        }

    def __str__(self) -> str:
        lines = [self.verdict]
        for s in self.selections:
            g = s.group
            lines.append(f"  group {g.index} ({g.kind}, block size {g.block_size}): "
                         + ", ".join(f"{layer.name} [{layer.backend.name}]" for layer in g.layers))
            for b in g.backends:
                lines.append(f"    {b.name:24s} declares {b.sizes_text}")
            if s.ok:
                lines.append(f"    -> kernel block size {s.kernel_block_size} (ratio {s.ratio})")
            else:
                lines.append(f"    -> {s.error}")
        return "\n".join(lines)


def _spec_decode_layers(target: Backend, draft: Backend, block_size: int) -> list[Layer]:
    # Two target layers stand for the whole model; an Eagle3 draft has one decoder layer.
    return [Layer("model.layers.0.attn", target.kind, block_size, target),
            Layer("model.layers.1.attn", target.kind, block_size, target),
            Layer("eagle3.layers.0.attn", "full", block_size, draft)]


def _resolve_pair(target, draft, vllm_version) -> tuple[Backend, Backend, str]:
    key = _catalog_key(vllm_version)
    t = get_backend(target, key)
    d = get_backend(draft, key)
    if d.kind == "mla":
        raise ValueError(f"draft={d.name!r} is an MLA backend, but an Eagle3 draft is a Llama-style model with "
                         "standard attention; choose a standard backend such as ROCM_ATTN or TRITON_ATTN")
    version = key if key != "installed" else f"installed {read_installed_backends().vllm_version}"
    return t, d, version


def check_spec_decode(target: str | Backend, draft: str | Backend, block_size: int | None = None,
                      vllm_version: str = "0.20") -> SpecDecodeReport:
    """Can an MLA (or standard) target backend run with an Eagle3 draft backend?

    Builds the layers (target layers of the target's kind, one standard-attention draft layer, all
    with manager block size ``block_size``), groups them (:func:`group_layers`: they form one group)
    and selects the group's kernel block size with vLLM's rule.

    Args:
        target, draft: registry names (e.g. ``"ROCM_AITER_MLA"``, ``"ROCM_ATTN"``) or catalog Backends.
        block_size: ``--block-size`` in tokens; ``None``: not given, so vLLM lets the target's backend
            (the first attention layer's) choose: :func:`preferred_block_size` (16 for most backends).
        vllm_version: ``"0.19"``, ``"0.20"`` or ``"installed"``.
    """
    t, d, version = _resolve_pair(target, draft, vllm_version)
    n = preferred_block_size(t) if block_size is None else _check_block_size(block_size, "block_size")
    selections = tuple(select_kernel_block_sizes(_spec_decode_layers(t, d, n)))
    return SpecDecodeReport(t, d, version, n, block_size is not None, selections)


DEFAULT_MATRIX_BLOCK_SIZES = (None, 1, 16, 32, 64, 128)  # None: no --block-size (the target's backend picks)


@dataclasses.dataclass(frozen=True)
class CompatibilityMatrix:
    """Kernel block sizes for every (target, draft, ``--block-size``).

    Attributes:
        targets, drafts, block_sizes: the axes; a block size of ``None`` means ``--block-size`` not given.
        kernel_block_size: ``(len(targets), len(drafts), len(block_sizes)) int64``; 0 = incompatible.
        manager_block_size: ``(len(targets), len(drafts), len(block_sizes)) int64``, the manager block
            size each cell used (the given one, or the target's preferred one for ``None``).
        vllm_version: the catalog used.
    """

    targets: tuple[str, ...]
    drafts: tuple[str, ...]
    block_sizes: tuple[int | None, ...]
    kernel_block_size: np.ndarray
    manager_block_size: np.ndarray
    vllm_version: str

    @property
    def compatible(self) -> np.ndarray:
        """``(T, D, S) bool``."""
        return self.kernel_block_size > 0

    def lookup(self, target: str, draft: str, block_size: int | None) -> int:
        """The kernel block size of one cell (0: incompatible)."""
        return int(self.kernel_block_size[self.targets.index(target), self.drafts.index(draft),
                                          self.block_sizes.index(block_size)])


def compatibility_matrix(targets: Sequence[str] | None = None, drafts: Sequence[str] | None = None,
                         block_sizes: Sequence[int] = DEFAULT_MATRIX_BLOCK_SIZES,
                         vllm_version: str = "0.20") -> CompatibilityMatrix:
    """:func:`check_spec_decode` over targets x drafts x block sizes (defaults: MLA targets, standard drafts)."""
    table = catalog(vllm_version)
    targets = tuple(targets) if targets is not None else tuple(sorted(n for n, b in table.items() if b.kind == "mla"))
    drafts = tuple(drafts) if drafts is not None else tuple(sorted(n for n, b in table.items() if b.kind == "full"))
    block_sizes = tuple(None if b is None else _check_block_size(b, f"block_sizes[{i}]")
                        for i, b in enumerate(block_sizes))
    for arg, axis in (("targets", targets), ("drafts", drafts), ("block_sizes", block_sizes)):
        if not axis:
            raise ValueError(f"{arg} is empty")
    shape = (len(targets), len(drafts), len(block_sizes))
    out, manager = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    for i, t in enumerate(targets):
        for j, d in enumerate(drafts):
            tb, db, _ = _resolve_pair(t, d, vllm_version)
            for k, given in enumerate(block_sizes):
                n = preferred_block_size(tb) if given is None else given
                # Target and draft always form one group (both full-attention type, same block size),
                # so the group's selection is the selection over the two declarations.
                chosen = _select(n, [list(tb.sizes), list(db.sizes)])
                out[i, j, k] = 0 if chosen is None else chosen
                manager[i, j, k] = n
    return CompatibilityMatrix(targets, drafts, block_sizes, out, manager, _catalog_key(vllm_version))


# --------------------------------------------------------------------------------------------
# Asking a real vLLM
# --------------------------------------------------------------------------------------------

_REPO = pathlib.Path(__file__).resolve().parents[2]


def _encode_entry(x: object) -> object:
    if isinstance(x, MultipleOf) or _is_foreign_multiple_of(x):
        return {"multiple_of": x.base}
    if isinstance(x, bool) or x is None or isinstance(x, (int, float, str)):
        return x if not isinstance(x, float) else {"float": x}
    raise TypeError(f"cannot send {x!r} to the vLLM oracle")


def _decode_entry(x: object, multiple_of: type) -> object:
    if isinstance(x, dict):
        if "multiple_of" in x:
            return multiple_of(x["multiple_of"])
        if "float" in x:
            return float(x["float"])
    return x


def vllm_python() -> tuple[str | None, str]:
    """The Python that can import a real vLLM: ``(path or None, reason)``.

    This process when vLLM imports here; else ``$WB_VLLM_PYTHON``; else ``.venv-vllm/bin/python``
    in the repository (made by ``scripts/vllm_env.sh``, which writes a stamp when it succeeded).
    """
    from workbench import device

    if device.vllm_status().available:
        return sys.executable, f"this Python ({device.vllm_status()})"
    explicit = os.environ.get("WB_VLLM_PYTHON")
    if explicit:
        return (explicit, "$WB_VLLM_PYTHON") if os.path.exists(explicit) else \
            (None, f"$WB_VLLM_PYTHON={explicit} does not exist")
    env = _REPO / ".venv-vllm"
    python = env / "bin" / "python"
    if not python.exists():
        return None, (f"vLLM is not importable here ({device.vllm_status().reason}) and {env} does not exist: "
                      "run `bash scripts/vllm_env.sh` to create it")
    if not (env / ".vllm-stamp").exists():
        return None, f"{env} exists but scripts/vllm_env.sh did not finish (no .vllm-stamp): run it again"
    return str(python), f"{python} (made by scripts/vllm_env.sh)"


def ask_real_vllm(requests: Sequence[Mapping], timeout: float = 600.0) -> list[dict]:
    """Answer requests with a real vLLM's ``select_common_block_size`` and backend classes.

    Each request is a dict with ``"op"``:

    * ``{"op": "select", "n": 16, "backends": [["%16"] ...]}``: stand-in backend classes declaring the
      given entries (encoded: ints, ``{"multiple_of": b}``, ``{"float": x}``, strings, ``None``; the names
      are ``backends[i]`` or ``"names"`` when given) go to vLLM's real function;
    * ``{"op": "select_real", "n": 16, "names": ["ROCM_AITER_MLA", "ROCM_ATTN"], "override": {name: entries}}``:
      the real classes, with a subclass overriding one declaration where ``override`` says so;
    * ``{"op": "read", "names": [...]}``: the declarations of the real classes, and what each returns
      from ``get_preferred_block_size(16)``;
    * ``{"op": "reader"}``: what :func:`read_installed_backends` reports, run in that environment.

    Answers are ``{"value": int}``, ``{"error": "ValueError", "message": str}``, or for ``read``
    ``{"sizes": {name: entries}, "failures": {name: reason}, "preferred": {name: int}, "version": str}``.

    Raises:
        RuntimeError: no real vLLM is available (the message says why) or the oracle failed.
    """
    python, reason = vllm_python()
    if python is None:
        raise RuntimeError(f"no real vLLM available: {reason}")
    payload = json.dumps(list(requests))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    proc = subprocess.run([python, "-m", "workbench.blocksize", "--oracle"], input=payload, capture_output=True,
                          text=True, timeout=timeout, env=env)
    marker = "@@WB-ORACLE@@"
    out = [line for line in proc.stdout.splitlines() if line.startswith(marker)]
    if proc.returncode != 0 or len(out) != 1:
        raise RuntimeError(f"the vLLM oracle ({python}) failed with exit code {proc.returncode}:\n"
                           f"{proc.stderr[-3000:]}\n{proc.stdout[-1000:]}")
    return json.loads(out[0][len(marker):])


def _oracle_main() -> None:
    """Run inside a Python with vLLM: read requests (JSON, stdin), print answers (one marked line)."""
    requests = json.loads(sys.stdin.read())
    from vllm.v1.attention.backend import MultipleOf as VMultipleOf
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.worker.utils import select_common_block_size as real_select

    def stand_in(name: str, entries: list):
        sizes = [_decode_entry(e, VMultipleOf) for e in entries]
        return type(name, (), {
            "get_supported_kernel_block_sizes": staticmethod(lambda kv_cache_spec=None, s=sizes: list(s)),
            "get_name": staticmethod(lambda n=name: n),
        })

    def real_class(name: str):
        path = AttentionBackendEnum[name].get_path()
        module, _, cls_name = path.rpartition(".")
        return getattr(importlib.import_module(module), cls_name)

    def call(n, classes) -> dict:
        try:
            return {"value": real_select(n, classes)}
        except Exception as exc:  # noqa: BLE001 - the answer is the error
            return {"error": type(exc).__name__, "message": str(exc)}

    answers = []
    for req in requests:
        op = req["op"]
        if op == "select":
            names = req.get("names") or [f"backends[{i}]" for i in range(len(req["backends"]))]
            answers.append(call(req["n"], [stand_in(nm, e) for nm, e in zip(names, req["backends"])]))
        elif op == "select_real":
            classes = []
            try:
                for name in req["names"]:
                    cls = real_class(name)
                    if name in req.get("override", {}):
                        sizes = [_decode_entry(e, VMultipleOf) for e in req["override"][name]]
                        cls = type(cls.__name__ + "Override", (cls,), {"get_supported_kernel_block_sizes":
                                   staticmethod(lambda kv_cache_spec=None, s=sizes: list(s))})
                    classes.append(cls)
            except Exception as exc:  # noqa: BLE001 - a class that does not import here
                answers.append({"error": "ImportError", "message": f"{name}: {type(exc).__name__}: {exc}"[:300]})
                continue
            answers.append(call(req["n"], classes))
        elif op == "read":
            sizes, failures, preferred = {}, {}, {}
            for name in req["names"]:
                try:
                    cls = real_class(name)
                    sizes[name] = [_encode_entry(x) for x in cls.get_supported_kernel_block_sizes()]
                    try:
                        preferred[name] = cls.get_preferred_block_size(16)
                    except Exception as exc:  # noqa: BLE001 - per backend
                        preferred[name] = f"{type(exc).__name__}: {exc}"[:200]
                except Exception as exc:  # noqa: BLE001 - per backend
                    failures[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
            import vllm
            answers.append({"sizes": sizes, "failures": failures, "preferred": preferred,
                            "version": vllm.__version__})
        elif op == "reader":  # this module's reader of the installed vLLM, run where vLLM is installed
            reading = read_installed_backends()
            answers.append({"available": reading.available, "version": reading.vllm_version,
                            "sizes": {n: [_encode_entry(x) for x in b.sizes] for n, b in reading.backends.items()},
                            "failures": dict(reading.failures), "reason": reading.reason})
        else:
            answers.append({"error": "ValueError", "message": f"unknown op {op!r}"})
    sys.__stdout__.write("@@WB-ORACLE@@" + json.dumps(answers) + "\n")
    sys.__stdout__.flush()


if __name__ == "__main__":  # pragma: no cover - runs in the vLLM environment
    if sys.argv[1:] == ["--oracle"]:
        _oracle_main()
    else:
        print("usage: python -m workbench.blocksize --oracle  (answers JSON requests with a real vLLM)")
        sys.exit(2)
