"""The metadata aiter's decode call needs, built in one place: :func:`build_flat_decode_metadata`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from workbench import device as _device
from workbench.decode_metadata import DecodeMetadata
from workbench.expand.baselines import expand_page_indices_dense
from workbench.expand.kernel import expand_page_indices
from workbench.expand.spec import INT32_MAX, _check_int_tensor, _check_kernel_block_size, validate_expand_inputs

__all__ = ["build_flat_decode_metadata"]


def _host_query_lens(query_lens: Any, num_reqs: int) -> list[int]:
    if isinstance(query_lens, torch.Tensor):
        if query_lens.device.type != "cpu":
            raise ValueError(
                f"query_lens is on {query_lens.device}; it must be host-side (a list, tuple or CPU tensor) so that "
                "max_qo_len needs no device sync: pass the CPU copy (vLLM keeps query_start_loc_cpu) or .tolist()"
            )
        if query_lens.dim() != 1 or query_lens.dtype.is_floating_point or query_lens.dtype == torch.bool:
            raise TypeError(f"query_lens must be a 1-D integer tensor, got shape {tuple(query_lens.shape)} "
                            f"dtype {query_lens.dtype}")
        lens = [int(x) for x in query_lens.tolist()]
    elif isinstance(query_lens, (list, tuple)):
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in query_lens):
            raise TypeError(f"query_lens must hold Python ints, got {list(query_lens)!r}")
        lens = list(query_lens)
    else:
        raise TypeError(
            f"query_lens must be a list, tuple or CPU tensor of ints, got {type(query_lens).__name__}"
        )
    if len(lens) != num_reqs:
        raise ValueError(f"query_lens has {len(lens)} entries but block_table has {num_reqs} rows; one per request")
    bad = [i for i, x in enumerate(lens) if x < 0]
    if bad:
        raise ValueError(f"query_lens[{bad[0]}] = {lens[bad[0]]} is negative; a request decodes zero or more tokens")
    return lens


def build_flat_decode_metadata(
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int] | torch.Tensor,
    kernel_block_size: int,
    *,
    num_blocks: int | None = None,
    validate: bool = True,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
    kv_indptr: torch.Tensor | None = None,
    loose_bound: bool = False,
) -> DecodeMetadata:
    """The metadata an aiter-style MLA decode call needs, for one step (the builder every chapter uses).

    Args:
        block_table: ``(num_reqs, max_blocks_per_req)`` int32/int64 block ids of blocks of ``K`` tokens.
        seq_lens: ``(num_reqs,)`` int32/int64 KV tokens per request (including this step's queries).
        query_lens: host-side query tokens per request (list, tuple or CPU tensor), so ``max_qo_len``
            needs no device sync.
        kernel_block_size: ``K``.
        num_blocks, validate, max_seq_len, out, kv_indptr, loose_bound: passed to :func:`expand_page_indices`
            (which states the layouts it takes: any row stride of ``block_table``, a strided ``seq_lens``).

    Returns:
        :class:`DecodeMetadata` with ``qo_indptr`` ``(num_reqs + 1,) int32``, ``kv_indptr``
        ``(num_reqs + 1,) int32``, ``kv_indices`` ``(sum(seq_lens),) int32`` (page_size-1 rows),
        ``kv_last_page_lens`` ``(num_reqs,) int32`` ones, ``max_qo_len`` (int, 0 for an empty batch).
    """
    K = _check_kernel_block_size(kernel_block_size)
    _check_int_tensor(block_table, "block_table", 2)
    num_reqs = block_table.shape[0]
    lens = _host_query_lens(query_lens, num_reqs)
    dev = block_table.device
    cum = [0]
    for q in lens:
        cum.append(cum[-1] + q)
    if cum[-1] > INT32_MAX:
        raise ValueError(f"sum(query_lens) = {cum[-1]} exceeds int32 ({INT32_MAX}); qo_indptr is int32 in aiter's "
                         "interface: split the batch")
    qo_host = torch.tensor(cum, dtype=torch.int32)
    if dev.type == "cuda":
        qo_indptr = qo_host.pin_memory().to(dev, non_blocking=True)  # no wait for the device
    else:
        qo_indptr = qo_host.to(dev)
    if dev.type == "cpu" and not _device.interpreter_active():
        # CPU tensors on a machine whose Triton compiles for a GPU (the CPU-side models of chapter 4 run
        # there too): the kernel cannot take them, so expand with plain torch, after the same validation.
        validate_expand_inputs(block_table, seq_lens, K, num_blocks=num_blocks, out=out, kv_indptr=kv_indptr,
                               max_seq_len=max_seq_len, check_values=validate)
        # validated just above; no max_seq_len: with validate=False a bound below a length would truncate the dense
        # expansion (the kernel only slows down), and the dense path reads max(seq_lens) on the host anyway
        kv_indices_t, kv_indptr_t = expand_page_indices_dense(block_table, seq_lens, K, validate=False)
        kv_indices = kv_indices_t if out is None else out[: kv_indices_t.numel()].copy_(kv_indices_t)
        kv_indptr = kv_indptr_t if kv_indptr is None else kv_indptr.copy_(kv_indptr_t)
    else:
        kv_indices, kv_indptr = expand_page_indices(
            block_table, seq_lens, K, out=out, kv_indptr=kv_indptr, max_seq_len=max_seq_len,
            validate=validate, num_blocks=num_blocks, loose_bound=loose_bound,
        )
    return DecodeMetadata(
        qo_indptr=qo_indptr,
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        kv_last_page_lens=torch.ones(num_reqs, dtype=torch.int32, device=dev),
        max_qo_len=max(lens, default=0),
    )
