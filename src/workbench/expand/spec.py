"""The contract of the expansion: the spec, the int32 and byte-offset limits, and the checks of every input.

* :func:`expand_page_indices_ref`: the spec, a plain Python loop (introduced before the kernel);
* :func:`expand_bytes`: the bytes any expansion must move (the benchmark's formula);
* :func:`validate_expand_inputs`: the checks, each error naming the argument, the value, the rule and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from workbench import device as _device

__all__ = ["AITER_OFFSET_WINDOW_BYTES", "INT32_MAX", "expand_bytes", "expand_page_indices_ref",
           "rows_before_offset_wrap", "validate_expand_inputs"]

INT32_MAX = 2**31 - 1  # kv_indptr and kv_indices are int32 in aiter's interface
AITER_OFFSET_WINDOW_BYTES = 2**32  # aiter's asm MLA decode addresses the cache by a 32-bit byte offset (#2768)


def rows_before_offset_wrap(kv_bytes_per_elem: int = 2, row_width: int = 576) -> int:
    """Flat cache rows addressable before a 32-bit byte offset from the cache base wraps.

    aiter issue #2768 (and #5765 for the kernel variants PR #4156 did not fix): the asm MLA decode
    computes ``row * row_width * bytes`` in 32 bits, so rows at or beyond this count read the wrong
    memory, silently. bf16 (2 bytes) x 576 -> 3,728,270 rows; fp8 -> 7,456,540. Far below
    :data:`INT32_MAX`: the int32 ``kv_indices`` are not the binding limit, the byte offset is.
    """
    return AITER_OFFSET_WINDOW_BYTES // (row_width * kv_bytes_per_elem)


def expand_bytes(seq_lens: Sequence[int], kernel_block_size: int) -> int:
    """The least bytes an expansion moves: ``4 * sum_r (ceil(L_r / K) + L_r)``, the int32 block-table entries it
    must read plus one int32 index written per token (4.25 bytes per token at K = 16). The ``seq_lens`` read and
    the ``kv_indptr`` write (``8 * num_reqs + 4`` bytes) are left out."""
    K = int(kernel_block_size)
    return sum(4 * (-(-int(n) // K)) + 4 * int(n) for n in seq_lens)


# --------------------------------------------------------------------------------------------
# The spec: a plain loop, obviously right.
# --------------------------------------------------------------------------------------------


def expand_page_indices_ref(
    block_table: torch.Tensor, seq_lens: torch.Tensor | Sequence[int], kernel_block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The spec of the expansion, as a plain Python loop (no validation; use it on small inputs).

    Token ``t`` of request ``r`` lives in block ``block_table[r, t // K]`` at offset ``t % K``,
    which is row ``block_table[r, t // K] * K + t % K`` of the cache viewed with page_size 1.

    Args:
        block_table: ``(num_reqs, max_blocks_per_req)`` integer block ids.
        seq_lens: ``(num_reqs,)`` tokens per request (tensor or list).
        kernel_block_size: ``K``, tokens per block.

    Returns:
        ``(kv_indices, kv_indptr)``: ``(sum(seq_lens),) int32`` and ``(num_reqs + 1,) int32``, on
        ``block_table``'s device.
    """
    K = int(kernel_block_size)
    rows = block_table.tolist()
    lens = seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else list(seq_lens)
    kv_indices: list[int] = []
    kv_indptr = [0]
    for r, seq_len in enumerate(lens):
        for t in range(int(seq_len)):
            kv_indices.append(rows[r][t // K] * K + t % K)
        kv_indptr.append(kv_indptr[-1] + int(seq_len))
    dev = block_table.device
    return (torch.tensor(kv_indices, dtype=torch.int32, device=dev),
            torch.tensor(kv_indptr, dtype=torch.int32, device=dev))


# --------------------------------------------------------------------------------------------
# Validation: every bad input gets an error naming the argument, the value, the rule, the fix.
# --------------------------------------------------------------------------------------------

_INT_DTYPES = (torch.int32, torch.int64)


def _check_kernel_block_size(kernel_block_size: Any) -> int:
    if isinstance(kernel_block_size, bool) or not isinstance(kernel_block_size, int):
        raise TypeError(
            f"kernel_block_size must be a Python int, got {kernel_block_size!r} ({type(kernel_block_size).__name__}); "
            "pass the kernel block size as an int, e.g. 16"
        )
    if kernel_block_size <= 0:
        raise ValueError(
            f"kernel_block_size must be a positive number of tokens per block, got {kernel_block_size}; "
            "use the KV-cache group's kernel block size (e.g. 16)"
        )
    return kernel_block_size


def _check_int_tensor(t: Any, name: str, ndim: int, dtypes: tuple[torch.dtype, ...] = _INT_DTYPES) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}; convert it with torch.as_tensor")
    if t.dtype not in dtypes:
        allowed = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must have dtype {allowed}, got {t.dtype}; convert it with .to(torch.int32)")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """``[first, last)`` bytes of memory ``t`` can address (its elements lie inside; strided views have gaps)."""
    first = t.data_ptr()
    last = first + t.element_size() * (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())))
    return first, last


def _check_no_overlap(out_name: str, out: torch.Tensor, others: Sequence[tuple[str, torch.Tensor | None]]) -> None:
    """An output buffer must not share memory with another buffer of the call: the kernel would read what it has
    just written (or write one output over the other), a wrong answer."""
    if out.numel() == 0 or out.device.type == "meta":
        return
    lo, hi = _byte_span(out)
    for name, t in others:
        if t is None or t.numel() == 0 or t.device != out.device:
            continue
        t_lo, t_hi = _byte_span(t)
        if lo < t_hi and t_lo < hi:
            raise ValueError(f"{out_name} shares memory with {name}; the kernel writes {out_name} while it reads or "
                             f"writes {name}: pass a separate buffer")


def validate_expand_inputs(
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    kernel_block_size: int,
    *,
    num_blocks: int | None = None,
    out: torch.Tensor | None = None,
    kv_indptr: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    check_values: bool = True,
    precomputed_kv_indptr: bool = False,
) -> None:
    """Check the inputs of :func:`expand_page_indices`; raise ``TypeError``/``ValueError`` on the first problem.

    Structural checks (types, dtypes, shapes, devices, layouts, ``K``) never touch device memory. The layouts the
    kernels support: ``block_table`` with any row stride and storage offset, but the block ids of a row adjacent
    (column stride 1: a transposed table or a column-strided view is refused; ``.contiguous()`` fixes it);
    ``seq_lens`` in any layout (:func:`expand_page_indices` copies a strided one); ``out`` and ``kv_indptr``
    contiguous, and sharing memory with no other tensor of the call. With
    ``check_values`` (the default) it also reads ``seq_lens`` and the used part of ``block_table``
    on the host, which synchronises with the device: negative ``seq_lens``, a ``seq_len`` larger
    than its row holds (``max_blocks_per_req * K``), a ``seq_len`` above ``max_seq_len``, negative
    block ids or ids ``>= num_blocks`` (only the ``ceil(seq_len / K)`` entries each request uses are
    checked: the rest of a row is padding), ``sum(seq_lens)`` or the largest flat index beyond int32,
    and ``out`` too small for ``sum(seq_lens)``.

    Args:
        block_table: ``(num_reqs, max_blocks_per_req)`` int32 or int64.
        seq_lens: ``(num_reqs,)`` int32 or int64, same device.
        kernel_block_size: ``K > 0`` (Python int).
        num_blocks: number of blocks in the KV cache (of ``K`` tokens each), if known.
        out: ``(N,) int32`` destination for ``kv_indices``, if preallocated.
        kv_indptr: ``(num_reqs + 1,) int32`` destination for ``kv_indptr``, if preallocated.
        max_seq_len: host-side upper bound of ``seq_lens``, if given.
        check_values: also check the values (host sync); off for CUDA-graph capture.
        precomputed_kv_indptr: ``kv_indptr`` is an input holding ``[0, cumsum(seq_lens)]`` (required then;
            with ``check_values`` its values are compared with ``seq_lens``).
    """
    K = _check_kernel_block_size(kernel_block_size)
    _check_int_tensor(block_table, "block_table", 2)
    _check_int_tensor(seq_lens, "seq_lens", 1)
    num_reqs, max_blocks = block_table.shape
    if max_blocks > 1 and num_reqs > 0 and block_table.stride(1) != 1:
        raise ValueError(
            f"block_table has strides {tuple(block_table.stride())}: the kernels read the block ids of a row as "
            f"adjacent elements (column stride 1; any row stride works), got column stride {block_table.stride(1)} "
            "(a transposed table or a column-strided view); pass block_table.contiguous()"
        )
    if seq_lens.shape[0] != num_reqs:
        raise ValueError(
            f"seq_lens has {seq_lens.shape[0]} entries but block_table has {num_reqs} rows; "
            "there must be one seq_len per request (row)"
        )
    if seq_lens.device != block_table.device:
        raise ValueError(
            f"seq_lens is on {seq_lens.device} but block_table is on {block_table.device}; "
            "move both to the same device"
        )
    for name, t, n in (("out", out, None), ("kv_indptr", kv_indptr, num_reqs + 1)):
        if t is None:
            continue
        _check_int_tensor(t, name, 1, (torch.int32,))
        if t.device != block_table.device:
            raise ValueError(f"{name} is on {t.device} but block_table is on {block_table.device}; allocate it there")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (the kernel writes it as a flat array); pass a contiguous buffer")
        if n is not None and t.numel() != n:
            raise ValueError(f"kv_indptr must have num_reqs + 1 = {n} entries, got {t.numel()}")
    if out is not None:
        _check_no_overlap("out", out, (("kv_indptr", kv_indptr), ("block_table", block_table), ("seq_lens", seq_lens)))
    if kv_indptr is not None and not precomputed_kv_indptr:  # an input then: it may alias seq_lens' memory
        _check_no_overlap("kv_indptr", kv_indptr, (("block_table", block_table), ("seq_lens", seq_lens)))
    if num_blocks is not None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise ValueError(f"num_blocks must be a non-negative int (blocks in the KV cache), got {num_blocks!r}")
        if num_blocks * K - 1 > INT32_MAX:
            raise ValueError(
                f"num_blocks * kernel_block_size = {num_blocks} * {K} = {num_blocks * K} token rows exceed int32 "
                f"(max row index {INT32_MAX}); kv_indices are int32 in aiter's interface: use a smaller cache per view"
            )
    if precomputed_kv_indptr and kv_indptr is None:
        raise ValueError("precomputed_kv_indptr=True reads the request offsets from kv_indptr; pass kv_indptr "
                         "((num_reqs + 1,) int32 holding [0, cumsum(seq_lens)])")
    if max_seq_len is not None and (isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 0):
        raise ValueError(f"max_seq_len must be a non-negative Python int (a host-side bound), got {max_seq_len!r}")
    if not check_values or num_reqs == 0:
        return

    lens = seq_lens.to("cpu", torch.int64)
    if (lens < 0).any():
        r = int(torch.nonzero(lens < 0)[0, 0])
        raise ValueError(f"seq_lens[{r}] = {int(lens[r])} is negative; a request holds zero or more tokens")
    capacity = max_blocks * K
    if (lens > capacity).any():
        r = int(torch.nonzero(lens > capacity)[0, 0])
        raise ValueError(
            f"seq_lens[{r}] = {int(lens[r])} exceeds what its block_table row holds: {max_blocks} blocks x "
            f"kernel_block_size {K} = {capacity} tokens; widen block_table or check kernel_block_size"
        )
    if max_seq_len is not None and int(lens.max()) > max_seq_len:
        r = int(torch.argmax(lens))
        raise ValueError(
            f"seq_lens[{r}] = {int(lens[r])} exceeds max_seq_len = {max_seq_len}; max_seq_len is an upper bound of "
            "seq_lens (it sizes the grid and picks the launch parameters): pass a larger bound"
        )
    total = int(lens.sum())
    if total > INT32_MAX:
        raise ValueError(
            f"sum(seq_lens) = {total} exceeds int32 ({INT32_MAX}); kv_indptr and kv_indices are int32 in "
            "aiter's interface: split the batch"
        )
    if out is not None and out.numel() < total:
        raise ValueError(f"out has {out.numel()} entries but sum(seq_lens) = {total}; allocate at least that many")
    if precomputed_kv_indptr:
        given = kv_indptr.to("cpu", torch.int64)
        want = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lens, 0)])
        if not torch.equal(given, want):
            r = int(torch.nonzero(given != want)[0, 0])
            raise ValueError(
                f"kv_indptr[{r}] = {int(given[r])} but [0, cumsum(seq_lens)] has {int(want[r])} there; with "
                "precomputed_kv_indptr=True kv_indptr must hold the cumulative seq_lens (the kernel reads where each "
                "request starts and how long it is from it)"
            )
    # Only the entries each request actually uses: the rest of a row is padding (vLLM leaves zeros there).
    used = torch.arange(max_blocks)[None, :] < ((lens + K - 1) // K)[:, None]
    ids = block_table.to("cpu", torch.int64)
    if (ids[used] < 0).any():
        r, j = (int(x) for x in torch.nonzero(used & (ids < 0))[0])
        raise ValueError(f"block_table[{r}, {j}] = {int(ids[r, j])} is a negative block id; block ids are >= 0")
    if used.any():
        top = int(ids[used].max())
        if num_blocks is not None and top >= num_blocks:
            r, j = (int(x) for x in torch.nonzero(used & (ids >= num_blocks))[0])
            raise ValueError(
                f"block_table[{r}, {j}] = {int(ids[r, j])} is outside the KV cache of num_blocks = {num_blocks} "
                f"(valid ids 0..{num_blocks - 1})"
            )
        if top * K + K - 1 > INT32_MAX:
            raise ValueError(
                f"block id {top} with kernel_block_size {K} gives token row {top * K + K - 1}, beyond int32 "
                f"({INT32_MAX}); kv_indices are int32 in aiter's interface"
            )


def _check_runs_here(t: torch.Tensor) -> None:
    """The kernel runs natively on a GPU, or under the interpreter on CPU tensors."""
    if _device.interpreter_active():
        if t.device.type != "cpu":
            raise ValueError(
                f"block_table is on {t.device}, but Triton runs under the interpreter (TRITON_INTERPRET=1), "
                "which needs CPU tensors; move the inputs to the CPU or unset TRITON_INTERPRET"
            )
    elif t.device.type != "cuda":
        raise ValueError(f"block_table is on {t.device}, but the Triton kernel runs on the GPU; move the inputs to 'cuda'")
