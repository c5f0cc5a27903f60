"""Block table -> flat per-token KV indices, and the ``DecodeMetadata`` built from them.

aiter's MLA decode addresses the KV cache with page_size 1 (vLLM views the cache as
``[num_blocks * K, 1, 1, 576]``), so block-table entries become per-token row indices:
block ``b`` with kernel block size ``K`` covers rows ``b*K .. b*K+K-1``.

:class:`~workbench.decode_metadata.DecodeMetadata` (defined in its own module) is built here and re-exported;
``workbench.metadata`` adds aiter-style persistent scheduling on top. One job per submodule, in the order the
chapter introduces them (every public name is re-exported here):

* :mod:`~workbench.expand.spec`: :func:`expand_page_indices_ref` (the spec, a plain Python loop), the int32 and
  byte-offset limits, :func:`expand_bytes` and :func:`validate_expand_inputs` (each error naming the argument,
  the value, the rule and the fix);
* :mod:`~workbench.expand.kernel`: :func:`expand_page_indices`, the Triton kernel (2-D grid: request, or group
  of requests, x chunk of tokens);
* :mod:`~workbench.expand.policy`: :class:`ExpandConfig` and :func:`expand_config`, whose thresholds come from
  a tuned table (``data/tuned/expand_nvidia.json``; set them in that module, not here);
* :mod:`~workbench.expand.baselines`: the pre-PR path, vLLM v0.20's serial design, plain torch;
* :mod:`~workbench.expand.builder`: :func:`build_flat_decode_metadata`, the one builder the other chapters use.
"""

from __future__ import annotations

from workbench.decode_metadata import DecodeMetadata
from workbench.expand.baselines import (expand_page_indices_dense, expand_page_indices_pre_pr,
                                        expand_page_indices_serial)
from workbench.expand.builder import build_flat_decode_metadata
from workbench.expand.kernel import _expand_page_indices_kernel, expand_page_indices  # noqa: F401 (codegen)
from workbench.expand.policy import (BROADCAST_MAX_LEN, BROADCAST_MIN_LEN, BROADCAST_REQS, FEW_REQS, GROUP_PROGRAMS,
                                     GROUP_TILE, LOOSE_MAX_GROUP, LOOSE_PROGRAM_BUDGET, MAX_BLOCK_T, MIN_PER_GROUP,
                                     PREFIX_BLOCK, STREAMING_STORE_BYTES, ExpandConfig, broadcast_applies,
                                     expand_config, load_tuned)
from workbench.expand.spec import (AITER_OFFSET_WINDOW_BYTES, INT32_MAX, expand_bytes, expand_page_indices_ref,
                                   rows_before_offset_wrap, validate_expand_inputs)

__all__ = [
    "AITER_OFFSET_WINDOW_BYTES",
    "BROADCAST_MAX_LEN",
    "BROADCAST_MIN_LEN",
    "BROADCAST_REQS",
    "FEW_REQS",
    "GROUP_PROGRAMS",
    "GROUP_TILE",
    "INT32_MAX",
    "LOOSE_MAX_GROUP",
    "LOOSE_PROGRAM_BUDGET",
    "MAX_BLOCK_T",
    "MIN_PER_GROUP",
    "PREFIX_BLOCK",
    "STREAMING_STORE_BYTES",
    "DecodeMetadata",
    "ExpandConfig",
    "broadcast_applies",
    "build_flat_decode_metadata",
    "expand_bytes",
    "expand_config",
    "expand_page_indices",
    "expand_page_indices_dense",
    "expand_page_indices_pre_pr",
    "expand_page_indices_ref",
    "expand_page_indices_serial",
    "load_tuned",
    "rows_before_offset_wrap",
    "validate_expand_inputs",
]
