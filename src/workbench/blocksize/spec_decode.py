"""A target backend with an Eagle3 draft backend: one report per pair, and the matrix over many pairs.

An Eagle3 draft is a Llama-style model with one decoder layer of standard attention. Its spec is full
attention with the target's block size, and MLA counts as full attention when grouping, so the
target's layers and the draft's form one KV-cache group and both backends enter one selection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from workbench.blocksize.catalog import (
    Backend, _catalog_key, catalog, get_backend, preferred_block_size, read_installed_backends,
)
from workbench.blocksize.groups import GroupSelection, Layer, select_kernel_block_sizes
from workbench.blocksize.rules import BlockSizeError, _check_block_size, _select

DEFAULT_MATRIX_BLOCK_SIZES = (None, 1, 16, 32, 64, 128)  # None: no --block-size (the target's backend picks)


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
