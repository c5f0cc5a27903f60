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

One job per submodule, every public name re-exported here:

* :mod:`~workbench.blocksize.rules`: :class:`MultipleOf`, :func:`parse_sizes`, :func:`format_sizes`
  (the ``%16, 32`` notation of vLLM's docs), :func:`supports_block_size`, :func:`select_common_block_size`
  and :class:`BlockSizeError`;
* :mod:`~workbench.blocksize.declarations`: the declared sizes of every backend, one table per vLLM release;
* :mod:`~workbench.blocksize.catalog`: :func:`catalog`, :func:`get_backend`, :func:`catalog_table`,
  :func:`preferred_block_size`, and :func:`read_installed_backends` (the installed vLLM's real classes);
* :mod:`~workbench.blocksize.groups`: :class:`Layer`, :func:`group_layers`, :func:`select_kernel_block_sizes`,
  :func:`kernel_block_ratio`, :func:`map_to_kernel_blocks`;
* :mod:`~workbench.blocksize.spec_decode`: :func:`check_spec_decode` (target + Eagle3 draft, a
  :class:`SpecDecodeReport`) and :func:`compatibility_matrix` (targets x drafts x block sizes);
* :mod:`~workbench.blocksize.oracle`: :func:`ask_real_vllm`, the same questions put to a real vLLM (in
  this process when it imports, else in the ``.venv-vllm`` environment made by ``scripts/vllm_env.sh``).
"""

from __future__ import annotations

from workbench.blocksize.catalog import (
    VLLM_VERSIONS, Backend, InstalledBackends, catalog, catalog_table, get_backend, preferred_block_size,
    read_installed_backends,
)
from workbench.blocksize.groups import (
    SPEC_KINDS, GroupSelection, KVCacheGroup, Layer, group_layers, kernel_block_ratio, map_to_kernel_blocks,
    select_kernel_block_sizes,
)
from workbench.blocksize.oracle import ask_real_vllm, vllm_python
from workbench.blocksize.rules import (
    DEFAULT_BLOCK_SIZE, MAX_SUGGESTED_BLOCK_SIZE, BlockSizeError, MultipleOf, SizeEntry, format_sizes, parse_sizes,
    select_common_block_size, supports_block_size,
)
from workbench.blocksize.spec_decode import (
    DEFAULT_MATRIX_BLOCK_SIZES, CompatibilityMatrix, SpecDecodeReport, check_spec_decode, compatibility_matrix,
)

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MATRIX_BLOCK_SIZES",
    "MAX_SUGGESTED_BLOCK_SIZE",
    "SPEC_KINDS",
    "VLLM_VERSIONS",
    "Backend",
    "BlockSizeError",
    "CompatibilityMatrix",
    "GroupSelection",
    "InstalledBackends",
    "KVCacheGroup",
    "Layer",
    "MultipleOf",
    "SizeEntry",
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
    "vllm_python",
]
