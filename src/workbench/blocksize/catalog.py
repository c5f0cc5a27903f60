"""The backend catalog: every backend's declaration per vLLM release, and a reader of the installed vLLM.

The tables themselves are plain data in :mod:`workbench.blocksize.declarations`; this module turns
them into :class:`Backend` descriptors that quack like vLLM's backend classes.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import re
from collections.abc import Mapping
from typing import Any

from workbench.blocksize.declarations import CHANGED_BY, CLASS_PREFIX, DECLARED, PREFERRED
from workbench.blocksize.rules import (
    DEFAULT_BLOCK_SIZE, MultipleOf, _check_block_size, _describe_backend, _normalize_entry, format_sizes, parse_sizes,
)

VLLM_VERSIONS = tuple(DECLARED)  # catalog keys, oldest first: "0.19" (before PR #39616), "0.20" (after), "0.33"


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


def _build_catalog(version: str) -> dict[str, Backend]:
    preferred = PREFERRED.get(version, {})
    return {name: Backend(name, tuple(parse_sizes(sizes)), kind, path if path.startswith("vllm.") else CLASS_PREFIX + path,
                          platform, reported, note, preferred.get(name))
            for name, sizes, kind, path, platform, reported, note in DECLARED[version]}


_CATALOGS = {version: _build_catalog(version) for version in VLLM_VERSIONS}


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
        "'0.20' (after it), '0.33' (vLLM 0.33.0) or 'installed' (read the installed vLLM's backend classes)")


def catalog(vllm_version: str = "0.20") -> dict[str, Backend]:
    """The declared kernel block sizes of every backend, by registry name, for one vLLM version.

    ``vllm_version``: ``"0.19"`` (before PR #39616), ``"0.20"`` (after), ``"0.33"``, or ``"installed"``: the
    classes of the installed vLLM that could be read (here, or in the conformance environment; raises
    ``ValueError`` with the reason when neither has vLLM; :func:`read_installed_backends` reports per backend).
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
    """The manager block size vLLM picks when ``--block-size`` is not given (vLLM 0.19 through 0.33).

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


def _changes(key: str) -> dict[str, str]:
    """The "changed" column of :func:`catalog_table`: each release against the one before it (the
    oldest against the one after it), with what changed it where :data:`CHANGED_BY` says."""
    if key not in VLLM_VERSIONS or len(VLLM_VERSIONS) < 2:
        return {}
    i = VLLM_VERSIONS.index(key)
    other, word, by = ((VLLM_VERSIONS[i - 1], "was", CHANGED_BY.get(key)) if i > 0
                       else (VLLM_VERSIONS[1], "becomes", CHANGED_BY.get(VLLM_VERSIONS[1])))
    why = f" ({by})" if by else ""
    out = {}
    for name, b in _CATALOGS[key].items():
        if name in _CATALOGS[other] and _CATALOGS[other][name].sizes != b.sizes:
            out[name] = f"{word} {_CATALOGS[other][name].sizes_text}{why}"
        elif i > 0 and name not in _CATALOGS[other]:
            out[name] = f"new in {key}"
    return out


def catalog_table(vllm_version: str = "0.20", markdown: bool = False) -> str:
    """The catalog as a table (plain text, or Markdown like vLLM's docs table), generated, never typed."""
    table = catalog(vllm_version)
    changes = _changes(_catalog_key(vllm_version))
    rows = [(b.name, b.sizes_text, "MLA" if b.kind == "mla" else "standard", b.platform, changes.get(b.name, ""))
            for b in sorted(table.values(), key=lambda b: (b.kind != "mla", b.platform, b.name))]
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

    The installed vLLM is this process's when it imports here, else the one of the Python that
    :func:`workbench.blocksize.oracle.vllm_python` finds (``$WB_VLLM_PYTHON`` or the conformance
    environment ``.venv-vllm``), read there in a subprocess. Never raises: when no vLLM is reachable
    every field says so, and a backend whose module fails to import (many need CUDA or ROCm libraries
    at import) is listed in ``failures`` with the reason.
    """
    from workbench import device

    status = device.vllm_status()
    if not status.available:  # read it where it is installed: $WB_VLLM_PYTHON or .venv-vllm
        from workbench.blocksize.oracle import read_backends_elsewhere

        return read_backends_elsewhere()
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except Exception as exc:  # noqa: BLE001 - any failure is the reason
        return InstalledBackends(False, status.version, {}, {},
                                 f"vllm.v1.attention.backends.registry failed to import: {type(exc).__name__}: {exc}")
    known = _CATALOGS[VLLM_VERSIONS[-1]]
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
