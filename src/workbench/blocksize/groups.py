"""KV-cache groups: layers that share one block table, their kernel block size, and hybrid blocks.

Layers whose KV-cache specs have the same type and block size form one group with one block table;
every backend of the group must accept the group's kernel block size. When that size ``k`` is smaller
than the manager block size ``b``, each manager block splits into ``b // k`` kernel blocks
(``vllm/v1/worker/block_table.py``).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from typing import Any

import numpy as np

from workbench.blocksize.catalog import Backend
from workbench.blocksize.rules import BlockSizeError, _check_block_size, select_common_block_size

SPEC_KINDS = ("full", "mla", "sliding_window", "chunked_local")


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


def _check_split_fits(top: int, ratio: int, dtype_max: int, dtype: str, fix: str) -> None:
    """The largest kernel block id, ``top * ratio + ratio - 1``, must fit the output dtype (else it would wrap)."""
    if top * ratio + ratio - 1 > dtype_max:
        raise ValueError(f"block_ids holds {top}: split by ratio={ratio} it becomes kernel block id "
                         f"{top * ratio + ratio - 1}, beyond {dtype} (max {dtype_max}); pass {fix}")


def map_to_kernel_blocks(block_ids, ratio: int):
    """Split manager block ids into kernel block ids: id ``i`` becomes ``i*ratio .. i*ratio+ratio-1``.

    Args:
        block_ids: manager block ids, any shape, non-negative integers (list, numpy array or torch tensor).
        ratio: kernel blocks per manager block (:func:`kernel_block_ratio`).

    Returns:
        The kernel block ids, flattened to 1-D with ``len(block_ids) * ratio`` entries: a numpy
        ``int64`` array, or a torch tensor of the input's dtype and device for tensor input.

    Raises:
        ValueError: a kernel block id ``i*ratio + ratio - 1`` beyond the output dtype (an int32 tensor of
            ids near ``2**31 / ratio``): nothing wraps silently; pass int64 ids.
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
        if block_ids.numel():
            _check_split_fits(int(block_ids.max()), ratio, torch.iinfo(block_ids.dtype).max, str(block_ids.dtype),
                              "smaller block ids" if block_ids.dtype == torch.int64 else "int64 ids: block_ids.long()")
        offs = torch.arange(ratio, dtype=block_ids.dtype, device=block_ids.device)
        return (block_ids.reshape(-1, 1) * ratio + offs).reshape(-1)
    ids = np.asarray(block_ids)
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"block_ids has dtype {ids.dtype}: block ids must be integers")
    if ids.min() < 0:
        raise ValueError("block_ids contains negative ids: block ids are non-negative")
    _check_split_fits(int(ids.max()), ratio, np.iinfo(np.int64).max, "int64", "smaller block ids")
    return (ids.astype(np.int64).reshape(-1, 1) * ratio + np.arange(ratio, dtype=np.int64)).reshape(-1)
