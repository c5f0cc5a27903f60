"""``DecodeMetadata``: what one MLA decode step hands the kernel, in aiter's names.

Every layer shares it: :mod:`workbench.expand` builds it, :mod:`workbench.mla` reads it, :mod:`workbench.metadata`
adds the persistent schedule to it, :mod:`workbench.qlen` probes with it. It imports nothing of the workbench.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["DecodeMetadata"]


@dataclasses.dataclass
class DecodeMetadata:
    """Everything an aiter-style MLA decode call needs for one step, in aiter's names.

    Attributes:
        qo_indptr: ``(num_reqs + 1,) int32``, cumulative query lengths (``query_start_loc``).
        kv_indptr: ``(num_reqs + 1,) int32``, cumulative KV lengths in tokens.
        kv_indices: ``(sum(seq_lens),) int32``, flat token rows of the page_size-1 cache view.
        kv_last_page_lens: ``(num_reqs,) int32``, all ones (every "page" holds one token).
        max_qo_len: largest query length of the step (a host-side int; no device sync).
        has_persistent_metadata: True when this step's persistent-scheduling buffers were computed
            (only for steps whose every query length is 1). It lives on the metadata, not on the
            builder, so that one step's choice cannot leak into another step (the PR's review fix).
        persistent: the persistent work buffers (``workbench.metadata``'s schedule), or ``None``.
    """

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_lens: torch.Tensor
    max_qo_len: int
    has_persistent_metadata: bool = False
    persistent: Any = None

    @property
    def num_reqs(self) -> int:
        return self.qo_indptr.numel() - 1
