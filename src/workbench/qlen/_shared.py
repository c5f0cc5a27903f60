"""What the probe, the tiny model and their tests share: one step's flat metadata, a paged example batch, and one CPU
thread for tiny tensors."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from workbench import device, mla
from workbench.decode_metadata import DecodeMetadata
from workbench.expand import build_flat_decode_metadata, expand_page_indices_ref
from workbench.mla.examples import random_paged_cache


@contextlib.contextmanager
def one_cpu_thread(dev: torch.device):
    """Run CPU ops on one intra-op thread (restored afterwards). The probe's and the tiny model's tensors
    are a few KB, far below the size where torch's threads pay off; on a busy shared CPU the thread hand-offs made a
    greedy run of 4 prompts x 20 tokens take 0.9 s against 0.2 s on one thread."""
    if dev.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def flat_metadata(block_table: torch.Tensor, seq_lens: Sequence[int], query_lens: Sequence[int],
                  kernel_block_size: int) -> DecodeMetadata:
    """:class:`DecodeMetadata` for one step. On a GPU: the project's builder
    (:func:`workbench.expand.build_flat_decode_metadata`). Under the interpreter the builder's Triton
    expansion costs ~0.2 s a call, so the same indices come from its spec,
    :func:`workbench.expand.expand_page_indices_ref` (tests/test_expand.py checks that they agree)."""
    if not device.interpreter_active():
        return build_flat_decode_metadata(block_table, torch.tensor(list(seq_lens), dtype=torch.int32,
                                                                    device=block_table.device), list(query_lens),
                                          kernel_block_size)
    kv_indices, kv_indptr = expand_page_indices_ref(block_table, list(seq_lens), kernel_block_size)
    cum = [0]
    for n in query_lens:
        cum.append(cum[-1] + n)
    dev = block_table.device
    return DecodeMetadata(qo_indptr=torch.tensor(cum, dtype=torch.int32, device=dev), kv_indptr=kv_indptr,
                          kv_indices=kv_indices, kv_last_page_lens=torch.ones(len(query_lens), dtype=torch.int32,
                                                                              device=dev),
                          max_qo_len=max(query_lens, default=0))


def paged_batch(qlen: int, heads: int, kv_lens: Sequence[int], dtype: torch.dtype, dev: torch.device,
                seed: int, kernel_block_size: int = 16):
    """Random q ``(len(kv_lens) * qlen, heads, 576)``, a paged cache viewed flat ``(num_blocks * K, 576)``
    (:func:`workbench.mla.examples.random_paged_cache`) and its :func:`flat_metadata`, every request with ``qlen``
    queries; ``seed`` seeds the generator. The data of :func:`workbench.mla.make_decode_example`, with the
    metadata from :func:`flat_metadata` (cheap under the interpreter)."""
    g = torch.Generator().manual_seed(seed)
    cache, block_table = random_paged_cache(kv_lens, kernel_block_size, g)
    q = torch.randn(len(kv_lens) * qlen, heads, mla.QK_HEAD_DIM, generator=g)
    md = flat_metadata(block_table.to(dev), kv_lens, [qlen] * len(kv_lens), kernel_block_size)
    return q.to(dtype).to(dev), cache.view(-1, mla.QK_HEAD_DIM).to(dtype).to(dev), md
