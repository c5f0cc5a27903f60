"""Small worked examples: aiter #2996's failure shown with the golden, and a paged example batch.

aiter #2996: handing aiter's bf16 kernels a block table's *page* ids (they address the cache with page_size 1)
makes them read the wrong rows, silently. :func:`demo_page_indices_as_token_indices` shows it with the fp32 golden.
:func:`make_decode_example` builds a batch with vLLM's test habits: blocks handed out in a random order, block 0
reserved, every slot no request owns filled with NaN so that a stray read shows up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from workbench.decode_metadata import DecodeMetadata
from workbench.expand import build_flat_decode_metadata
from workbench.mla.inputs import QK_HEAD_DIM
from workbench.mla.ref import mla_decode_paged_ref, mla_decode_ref

__all__ = ["DecodeExample", "PageIndexMistake", "demo_page_indices_as_token_indices", "make_decode_example",
           "random_paged_cache"]


@dataclasses.dataclass
class PageIndexMistake:
    """The outcome of :func:`demo_page_indices_as_token_indices` (all errors against the paged golden)."""

    page_size: int
    flat_max_err: float  # per-token indices (what vLLM hands aiter after PR #39616): ~0
    pages_max_err: float  # page indices read as token rows (the #2996 failure): large
    pages_rel_err: float  # ||wrong - golden|| / ||golden||
    kv_indices_flat: list[int]  # request 0's first few per-token rows
    kv_indices_pages: list[int]  # request 0's page ids, as the mistaken call passes them

    @property
    def detected(self) -> bool:
        return self.flat_max_err < 1e-4 and self.pages_max_err > 1e-2


def demo_page_indices_as_token_indices(page_size: int = 16, seq_lens: tuple[int, ...] = (40, 23), heads: int = 16,
                                       seed: int = 0) -> PageIndexMistake:
    """Show the aiter #2996 failure mode with the golden: a paged cache addressed by *page* ids.

    aiter's bf16 kernels address the cache with page_size 1. Handing them a block table's page ids
    (with ``kv_indptr`` counting pages) makes them read row ``b`` of the flat view where block ``b``
    starts at row ``b * page_size``: the wrong rows, and too few of them. No error is raised: the
    output is silently wrong. Here both calls go through :func:`mla_decode_ref` (fp32), against
    :func:`mla_decode_paged_ref` on the paged cache; the correct flat indices come from
    ``workbench.expand.build_flat_decode_metadata``.
    """
    g = torch.Generator().manual_seed(seed)
    pages_per_req = [-(-n // page_size) for n in seq_lens]
    num_blocks = 1 + sum(pages_per_req) + 3  # block 0 reserved, a few spare
    cache = torch.randn(num_blocks, page_size, QK_HEAD_DIM, generator=g)
    perm = (1 + torch.randperm(num_blocks - 1, generator=g)).tolist()
    block_table = torch.zeros(len(seq_lens), max(pages_per_req), dtype=torch.int32)
    for r, n in enumerate(pages_per_req):
        block_table[r, :n] = torch.tensor(perm[:n], dtype=torch.int32)
        perm = perm[n:]
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    q = torch.randn(len(seq_lens), heads, QK_HEAD_DIM, generator=g)
    qo_indptr = torch.arange(len(seq_lens) + 1, dtype=torch.int32)
    golden, _ = mla_decode_paged_ref(q, cache, qo_indptr, block_table, seq)
    flat_view = cache.view(-1, QK_HEAD_DIM)  # what aiter sees: [num_blocks * page_size, 576]
    md = build_flat_decode_metadata(block_table, seq, [1] * len(seq_lens), page_size)
    flat, _ = mla_decode_ref(q, flat_view, md.qo_indptr, md.kv_indptr, md.kv_indices)
    page_ids = torch.cat([block_table[r, :n] for r, n in enumerate(pages_per_req)])
    page_indptr = torch.tensor([0] + torch.tensor(pages_per_req).cumsum(0).tolist(), dtype=torch.int32)
    wrong, _ = mla_decode_ref(q, flat_view, qo_indptr, page_indptr, page_ids)
    return PageIndexMistake(
        page_size=page_size,
        flat_max_err=float((flat - golden).abs().max()),
        pages_max_err=float((wrong - golden).abs().max()),
        pages_rel_err=float((wrong - golden).norm() / golden.norm()),
        kv_indices_flat=md.kv_indices[: min(6, seq_lens[0])].tolist(),
        kv_indices_pages=block_table[0, : pages_per_req[0]].tolist(),
    )


@dataclasses.dataclass
class DecodeExample:
    """A paged cache with a permuted block table, its flat metadata, and the query."""

    q: torch.Tensor  # (total_q, H, 576)
    kv_cache: torch.Tensor  # [num_blocks, K, 576]; rows no request owns are NaN (row 0 / block 0 reserved)
    block_table: torch.Tensor  # (num_reqs, max_blocks) int32
    seq_lens: torch.Tensor  # (num_reqs,) int32
    metadata: DecodeMetadata  # from workbench.expand.build_flat_decode_metadata

    @property
    def flat_cache(self) -> torch.Tensor:
        """The page_size-1 view ``[num_blocks * K, 1, 1, 576]`` aiter reads (no copy)."""
        return self.kv_cache.view(-1, 1, 1, QK_HEAD_DIM)


def random_paged_cache(seq_lens: Sequence[int], kernel_block_size: int,
                       generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A float32 cache ``[num_blocks, K, 576]`` and its int32 block table for requests of ``seq_lens`` tokens:
    blocks handed out in a random order (block 0 never, two spare), each request's tokens random, every slot no
    request owns NaN so that a stray read shows up. Draws from ``generator``."""
    K = kernel_block_size
    pages = [-(-n // K) for n in seq_lens]
    num_blocks = 1 + sum(pages) + 2
    cache = torch.full((num_blocks, K, QK_HEAD_DIM), float("nan"))
    perm = (1 + torch.randperm(num_blocks - 1, generator=generator)).tolist()
    block_table = torch.zeros(len(seq_lens), max(pages + [1]), dtype=torch.int32)
    for r, (n, p) in enumerate(zip(seq_lens, pages)):
        ids, perm = perm[:p], perm[p:]
        block_table[r, :p] = torch.tensor(ids, dtype=torch.int32)
        t = torch.arange(n)
        cache[torch.tensor(ids, dtype=torch.long)[t // K], t % K] = torch.randn(n, QK_HEAD_DIM, generator=generator)
    return cache, block_table


def make_decode_example(query_lens: list[int], seq_lens: list[int], heads: int, kernel_block_size: int, *,
                        dtype: torch.dtype = torch.float32, device_: str | torch.device = "cpu",
                        seed: int = 0) -> DecodeExample:
    """Random q and KV for a batch: blocks handed out in a random order (block 0 never), every slot no
    request owns filled with NaN so that a stray read shows up, and the flat metadata built by
    ``workbench.expand.build_flat_decode_metadata``."""
    K = kernel_block_size
    if not isinstance(K, int) or isinstance(K, bool) or K < 1:
        raise ValueError(f"kernel_block_size is {K!r}; it must be an int >= 1 (tokens per cache block)")
    if len(query_lens) != len(seq_lens) or any(q < 0 or n < q for q, n in zip(query_lens, seq_lens)):
        raise ValueError(f"query_lens {list(query_lens)} and seq_lens {list(seq_lens)} must have one entry per "
                         "request, with 0 <= query_len <= seq_len (the queries are the last tokens of the cache)")
    g = torch.Generator().manual_seed(seed)
    cache, block_table = random_paged_cache(seq_lens, K, g)
    q = torch.randn(sum(query_lens), heads, QK_HEAD_DIM, generator=g)
    dev = torch.device(device_)
    seq = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
    bt = block_table.to(dev)
    md = build_flat_decode_metadata(bt, seq, list(query_lens), K)
    return DecodeExample(q.to(dtype).to(dev), cache.to(dtype).to(dev), bt, seq, md)
