"""What the probe, the tiny model and their tests share: one step's flat metadata, a paged example batch, and one CPU
thread for tiny tensors."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from workbench import device, mla
from workbench.decode_metadata import DecodeMetadata
from workbench.expand import build_flat_decode_metadata, expand_page_indices_ref


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
    """Random q ``(len(kv_lens) * qlen, heads, 576)``, a paged cache viewed flat ``(num_blocks * K, 576)`` (block 0
    reserved, blocks permuted, unused slots NaN) and its :func:`flat_metadata`, every request with ``qlen``
    queries; ``seed`` seeds the generator."""
    g = torch.Generator().manual_seed(seed)
    K = kernel_block_size
    pages = [-(-n // K) for n in kv_lens]
    num_blocks = 1 + sum(pages) + 2
    cache = torch.full((num_blocks * K, mla.QK_HEAD_DIM), float("nan"))
    perm = (1 + torch.randperm(num_blocks - 1, generator=g)).tolist()
    block_table = torch.zeros(len(kv_lens), max(pages), dtype=torch.int32)
    for r, (n, p) in enumerate(zip(kv_lens, pages)):
        block_table[r, :p] = torch.tensor(perm[:p], dtype=torch.int32)
        perm = perm[p:]
        t = torch.arange(n)
        cache[block_table[r, t // K].long() * K + t % K] = torch.randn(n, mla.QK_HEAD_DIM, generator=g)
    q = torch.randn(len(kv_lens) * qlen, heads, mla.QK_HEAD_DIM, generator=g)
    md = flat_metadata(block_table.to(dev), kv_lens, [qlen] * len(kv_lens), K)
    return q.to(dtype).to(dev), cache.to(dtype).to(dev), md
