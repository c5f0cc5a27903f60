"""What the kernel replaced, and the baselines it is measured against: the pre-PR path (hybrid split to kernel
block size 1, then a copy), the one-program-per-request design vLLM v0.20 shipped, and plain torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench import blocksize as _blocksize
from workbench.expand.spec import _check_kernel_block_size, _check_runs_here, validate_expand_inputs

__all__ = ["expand_page_indices_dense", "expand_page_indices_pre_pr", "expand_page_indices_serial"]


def expand_page_indices_pre_pr(
    block_table: torch.Tensor, seq_lens: torch.Tensor, kernel_block_size: int, *, validate: bool = True,
    num_blocks: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pre-PR path: kernel block size 1 through hybrid splitting, then a plain copy per row.

    Before vLLM PR #39616, AITER MLA declared kernel block size ``[1]``: the block table
    (manager blocks of ``K`` tokens) was split on the host into a ``K`` times wider table of
    one-token blocks (:func:`workbench.blocksize.map_to_kernel_blocks`), and a copy kernel took the
    first ``seq_lens[r]`` entries of each row. Same arguments, checks (the layouts included) and results as
    :func:`expand_page_indices`; it must give identical indices. Row padding must be non-negative
    (vLLM pads with 0): the split refuses negative ids anywhere in the table. ``validate=False`` skips the
    value checks only (:func:`validate_expand_inputs` with ``check_values=False``).
    """
    K = _check_kernel_block_size(kernel_block_size)
    validate_expand_inputs(block_table, seq_lens, K, num_blocks=num_blocks, check_values=validate)
    # vLLM's hybrid-block split (manager blocks of K tokens -> kernel blocks of 1 token), on the host, in int64:
    # the whole table is split, padding included, and a padding id times K may exceed int32 (the ids used may not:
    # validate_expand_inputs checks them).
    ratio = _blocksize.kernel_block_ratio(K, 1)
    num_reqs, max_blocks = block_table.shape
    table_k1 = _blocksize.map_to_kernel_blocks(block_table.to("cpu", torch.int64), ratio).reshape(num_reqs,
                                                                                               max_blocks * K)
    table_k1 = table_k1.to(block_table.device)  # (num_reqs, max_blocks * K)
    keep = torch.arange(table_k1.shape[1], device=block_table.device)[None, :] < seq_lens[:, None]
    kv_indices = table_k1[keep].to(torch.int32)  # row-major: request 0's tokens, then request 1's, ...
    kv_indptr = torch.zeros(block_table.shape[0] + 1, dtype=torch.int32, device=block_table.device)
    kv_indptr[1:] = torch.cumsum(seq_lens, 0)
    return kv_indices, kv_indptr


@triton.jit
def _expand_serial_kernel(
    block_table_ptr,  # (num_reqs, max_blocks_per_req) block ids
    block_table_stride,  # elements between rows of block_table
    kv_indptr_ptr,  # (num_reqs + 1,) int32 in: cumulative seq_lens (computed before the launch)
    kv_indices_ptr,  # (sum(seq_lens),) int32 out
    K: tl.constexpr,  # kernel block size
    BLOCK_T: tl.constexpr,  # tokens per loop iteration (1024 in the design it mirrors)
):
    r = tl.program_id(0)  # one program per request ...
    start = tl.load(kv_indptr_ptr + r)
    seq_len = tl.load(kv_indptr_ptr + r + 1) - start
    row = block_table_ptr + r.to(tl.int64) * block_table_stride
    for i in range(0, seq_len, BLOCK_T):  # ... which walks its whole request serially
        t = i + tl.arange(0, BLOCK_T)
        m = t < seq_len
        blk = tl.load(row + t // K, mask=m, other=0)
        tl.store(kv_indices_ptr + start + t, (blk * K + t % K).to(tl.int32), mask=m)


def _launch_serial(block_table: torch.Tensor, kv_indptr: torch.Tensor, K: int, out: torch.Tensor,
                   block_t: int = 1024) -> None:
    _expand_serial_kernel[(block_table.shape[0],)](
        block_table, block_table.stride(0), kv_indptr, out, K=K, BLOCK_T=block_t, num_warps=4)


def expand_page_indices_serial(
    block_table: torch.Tensor, seq_lens: torch.Tensor, kernel_block_size: int, *, validate: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """The design vLLM v0.20 shipped, rewritten from its description, for comparison only.

    One program per request, looping over its tokens in 1024-token chunks; ``kv_indptr`` is a
    ``torch.cumsum`` before the launch. A single long request therefore runs on one SM (vLLM PRs
    #57978/#58661 later fixed the slowness this causes at low concurrency). Same results as
    :func:`expand_page_indices`.
    """
    K = _check_kernel_block_size(kernel_block_size)
    validate_expand_inputs(block_table, seq_lens, K, check_values=validate)
    _check_runs_here(block_table)
    num_reqs = block_table.shape[0]
    kv_indptr = torch.zeros(num_reqs + 1, dtype=torch.int32, device=block_table.device)
    kv_indptr[1:] = torch.cumsum(seq_lens, 0)
    out = torch.empty(int(kv_indptr[-1]), dtype=torch.int32, device=block_table.device)
    if num_reqs:
        _launch_serial(block_table, kv_indptr, K, out)
    return out, kv_indptr


def expand_page_indices_dense(
    block_table: torch.Tensor, seq_lens: torch.Tensor, kernel_block_size: int, *, max_seq_len: int | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch: build a dense ``(num_reqs, max_seq_len)`` index tensor, then keep the valid tokens.

    Bytes moved: it materialises ``num_reqs * max_seq_len`` indices (several int64 temporaries) and
    a boolean mask, then compacts them; the compaction (boolean indexing) synchronises with the host,
    so it cannot be captured in a CUDA graph. The same checks as :func:`expand_page_indices`
    (:func:`validate_expand_inputs`; ``validate=False`` skips the value checks, which read ``seq_lens`` and
    the block table on the host: time the baseline that way). Any layout would do for torch, but the same
    layouts are refused as by the kernels, so that every expansion takes the same inputs. ``max_seq_len`` (default:
    ``max(seq_lens)``, read on the host) sizes the dense tensor: it must be ``>= max(seq_lens)``, which ``validate``
    checks (unlike the kernel's bound, a smaller one would drop tokens).
    """
    K = _check_kernel_block_size(kernel_block_size)
    validate_expand_inputs(block_table, seq_lens, K, max_seq_len=max_seq_len, check_values=validate)
    num_reqs, max_blocks = block_table.shape
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max()) if num_reqs else 0
    max_seq_len = min(max_seq_len, max_blocks * K)  # a row holds no more (a looser bound selects nothing more)
    pos = torch.arange(max_seq_len, device=block_table.device)
    blk = block_table.gather(1, (pos // K).expand(num_reqs, -1)).long()
    dense = blk * K + pos % K  # (num_reqs, max_seq_len), int64: nothing wraps before the checked int32 cast
    kv_indices = dense[pos[None, :] < seq_lens[:, None]].to(torch.int32)
    kv_indptr = torch.zeros(num_reqs + 1, dtype=torch.int32, device=block_table.device)
    kv_indptr[1:] = torch.cumsum(seq_lens, 0)
    return kv_indices, kv_indptr
