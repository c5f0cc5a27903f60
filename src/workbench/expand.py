"""Block table -> flat per-token KV indices, and the ``DecodeMetadata`` built from them.

aiter's MLA decode addresses the KV cache with page_size 1 (vLLM views the cache as
``[num_blocks * K, 1, 1, 576]``), so block-table entries become per-token row indices:
block ``b`` with kernel block size ``K`` covers rows ``b*K .. b*K+K-1``.

:class:`~workbench.decode_metadata.DecodeMetadata` (defined in its own module) is built here and re-exported;
``workbench.metadata`` adds aiter-style persistent scheduling on top.

Contents, in the order the chapter introduces them:

* :func:`expand_page_indices_ref`: the spec, a plain Python loop;
* :func:`expand_page_indices`: the Triton kernel (2-D grid: request, or group of requests, x chunk of tokens);
* :func:`expand_page_indices_pre_pr`: the pre-PR path (hybrid split to kernel block size 1, then a copy);
* :func:`validate_expand_inputs`: the checks, each error naming the argument, the value, the rule and the fix;
* :func:`build_flat_decode_metadata`: the one builder of :class:`DecodeMetadata` the other chapters use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from workbench import blocksize as _blocksize
from workbench import device as _device
from workbench.decode_metadata import DecodeMetadata

__all__ = [
    "AITER_OFFSET_WINDOW_BYTES",
    "INT32_MAX",
    "DecodeMetadata",
    "ExpandConfig",
    "build_flat_decode_metadata",
    "expand_config",
    "expand_page_indices",
    "expand_page_indices_dense",
    "expand_page_indices_pre_pr",
    "expand_page_indices_ref",
    "expand_page_indices_serial",
    "rows_before_offset_wrap",
    "validate_expand_inputs",
]

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


# --------------------------------------------------------------------------------------------
# 1. The spec: a plain loop, obviously right.
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
# 2. Validation: every bad input gets an error naming the argument, the value, the rule, the fix.
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

    Structural checks (types, dtypes, shapes, devices, ``K``) never touch device memory. With
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


# --------------------------------------------------------------------------------------------
# 3. The kernel: a 2-D grid (request x chunk of tokens), so one long request spreads over the GPU.
# --------------------------------------------------------------------------------------------


@triton.jit
def pdl_wait_then_release():
    """The prologue of a PDL-launched kernel here. Launched with PDL, a grid may start while the kernel before
    it still runs (its programs become resident early: the launch cost overlaps that kernel), so it reads
    nothing before ``griddepcontrol.wait``, which returns once that kernel has finished and its stores are
    visible. Then it lets the next kernel be scheduled; a dependent waits in turn for this whole grid (stores
    included) before it reads anything. Compiled NVIDIA sm_90+ only (call it under a ``PDL`` constexpr)."""
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()


def pdl_launch_options(pdl: bool) -> dict[str, Any]:
    """Launch keywords of a kernel with a ``PDL`` constexpr: launched with PDL (and its prologue on) or not."""
    return dict(PDL=True, launch_pdl=True) if pdl else {}


@triton.jit
def _chunk_indices(row, max_blocks, tok0, K: tl.constexpr, BLOCK_T: tl.constexpr):
    """Flat rows of tokens ``tok0 .. tok0 + BLOCK_T - 1`` of one request: ``(BLOCK_T,) int32``.

    Reads only ``row[0 : max_blocks]`` (entries past the row are 0); it does not need the request's
    length, so it can be issued before that length is known.
    """
    # tok0 + lane < 2**31 + BLOCK_T fits uint32; unsigned // and % by the constexpr K are a shift and a mask.
    t = tok0.to(tl.uint32) + tl.arange(0, BLOCK_T).to(tl.uint32)
    b = t // K
    blk = tl.load(row + b, mask=b < max_blocks, other=0)
    return (blk * K + (t % K).to(tl.int32)).to(tl.int32)


@triton.jit
def _chunk_indices_bcast(row, max_blocks, tok0, K: tl.constexpr, BLOCK_T: tl.constexpr):
    """The same indices as :func:`_chunk_indices` (K a power of two), as a ``(BLOCK_T // KC, KC)`` tile with
    ``KC = min(K, BLOCK_T)``: the chunk's block ids are loaded once each (a ``BLOCK_T // K``-long vector, or one
    id when the chunk lies inside one block) and broadcast along the tile's rows, instead of one load per token
    (32 scalar loads per lane for 1024 tokens on one warp, every 16 of them reading the same id at K = 16).
    Element ``[i, j]`` is token ``tok0 + i * KC + j``: the tile is the chunk in row-major order."""
    KC: tl.constexpr = K if K < BLOCK_T else BLOCK_T
    NB: tl.constexpr = BLOCK_T // KC
    b = tok0 // K + tl.arange(0, NB)  # tok0 is a multiple of BLOCK_T, so of K when K <= BLOCK_T
    blk = tl.load(row + b, mask=b < max_blocks, other=0)
    return (blk[:, None] * K + (tok0 % K) + tl.arange(0, KC)[None, :]).to(tl.int32)


@triton.jit
def _chunk_lanes(K: tl.constexpr, BLOCK_T: tl.constexpr, BCAST: tl.constexpr):
    """Token offsets ``0 .. BLOCK_T - 1`` within a chunk, in the shape of its index tile: 1-D, or the
    ``(BLOCK_T // KC, KC)`` tile of :func:`_chunk_indices_bcast` (``BCAST``)."""
    if BCAST:
        KC: tl.constexpr = K if K < BLOCK_T else BLOCK_T
        return tl.arange(0, BLOCK_T // KC)[:, None] * KC + tl.arange(0, KC)[None, :]
    else:
        return tl.arange(0, BLOCK_T)


@triton.jit
def _indices_of_chunk(row, max_blocks, tok0, K: tl.constexpr, BLOCK_T: tl.constexpr, BCAST: tl.constexpr):
    if BCAST:
        return _chunk_indices_bcast(row, max_blocks, tok0, K, BLOCK_T)
    else:
        return _chunk_indices(row, max_blocks, tok0, K, BLOCK_T)


@triton.jit
def _store_chunk(kv_indices_ptr, vals, start, seq_len, tok0, BLOCK_T: tl.constexpr, STORE_CACHE: tl.constexpr,
                 K: tl.constexpr = 1, BCAST: tl.constexpr = False):
    """Write the chunk's indices at ``kv_indices[start + tok0 :]``, only the tokens below ``seq_len``."""
    lane = _chunk_lanes(K, BLOCK_T, BCAST)
    base = start + tok0  # int64: output position of token tok0 of this request
    if tok0 <= seq_len - BLOCK_T:  # a full chunk (written this way round so that it cannot overflow int32)
        if base % 4 == 0:  # 16-byte aligned: the stores can be 16-byte vector stores
            # (base // 4) * 4 equals base here, and the compiler can see that it is a multiple of 4. Not
            # tl.multiple_of(base, 4): that marks the value base itself, in every branch, so the unaligned
            # branch below became 16-byte stores too (a misaligned-address fault on an H200, first revision).
            tl.store(kv_indices_ptr + (base // 4) * 4 + lane, vals, cache_modifier=STORE_CACHE)
        else:
            tl.store(kv_indices_ptr + base + lane, vals, cache_modifier=STORE_CACHE)
    else:  # the request's last, partial chunk (or a chunk past its end: nothing is written)
        tl.store(kv_indices_ptr + base + lane, vals, mask=lane < seq_len - tok0, cache_modifier=STORE_CACHE)


@triton.jit
def _prefix_sum(seq_lens_ptr, r0, BLOCK_R: tl.constexpr, PREFIX_LOOP: tl.constexpr, PREFIX_U32: tl.constexpr,
                WIDE: tl.constexpr = False):
    """``sum(seq_lens[:r0])`` as an int64 scalar (where the request ``r0`` starts in ``kv_indices``).

    Default: summed in a 32-wide vector (every warp holds all of it) and reduced once at the end: the
    reduction stays inside a warp, with no shared memory and no barrier. A BLOCK_R-wide vector spans the
    warps, and its cross-warp reduction cost 256 x 4k about 0.4 us against 32 x 32k (same output, 32
    seq_lens summed). Each warp of each program loads the ``r0`` entries: the grid's prefix work is
    (programs x warps x r0), which is why :func:`expand_config` packs short requests into groups and uses one
    warp for large batches.

    ``WIDE`` (for one-warp programs): a BLOCK_R-wide accumulator, BLOCK_R / 32 neighbouring entries per lane,
    loaded in whole 16-byte groups (the mask ends on a multiple of 4, so the loads can be vector loads) plus a
    masked tail of at most 3, and reduced once at the end: BLOCK_R entries per step instead of 32.
    """
    acc_ty: tl.constexpr = tl.uint32 if PREFIX_U32 else tl.int64
    if WIDE:
        o = tl.arange(0, BLOCK_R)
        r4 = (r0 // 4) * 4
        acc = tl.zeros([BLOCK_R], dtype=acc_ty)
        for j in range(0, r4, BLOCK_R):
            acc += tl.load(seq_lens_ptr + j + o, mask=j + o < r4, other=0).to(acc_ty)
        tail = r4 + tl.arange(0, 4)
        total = tl.sum(acc) + tl.sum(tl.load(seq_lens_ptr + tail, mask=tail < r0, other=0).to(acc_ty))
    else:
        lanes = tl.arange(0, 32)
        part = tl.zeros([32], dtype=acc_ty)
        for i in tl.static_range(0, BLOCK_R, 32):  # BLOCK_R / 32 independent loads, issued back to back
            o = i + lanes
            part += tl.load(seq_lens_ptr + o, mask=o < r0, other=0).to(acc_ty)
        if PREFIX_LOOP:
            for j in range(BLOCK_R, r0, BLOCK_R):
                for i in tl.static_range(0, BLOCK_R, 32):
                    o = j + i + lanes
                    part += tl.load(seq_lens_ptr + o, mask=o < r0, other=0).to(acc_ty)
        total = tl.sum(part)
    return total.to(tl.int64)


@triton.jit
def _request_start(seq_lens_ptr, kv_indptr_ptr, r, c, tok0, BLOCK_R: tl.constexpr, PREFIX_LOOP: tl.constexpr,
                   INDPTR_IN: tl.constexpr, PREFIX_U32: tl.constexpr, WIDE: tl.constexpr, SKIP_IDLE: tl.constexpr):
    """Where request ``r`` starts in ``kv_indices`` and its length, ``(start int64, seq_len int32)``.

    ``start = sum(seq_lens[:r])``, computed here so that the whole expansion is one launch (no separate cumsum),
    in int64 (or uint32, exact below 2**32 tokens) so that nothing wraps near ``sum(seq_lens) = 2**31 - 1``.
    Chunk-program 0 of each request also writes ``kv_indptr[r + 1]`` (and request 0's ``kv_indptr[0]``).
    ``INDPTR_IN``: both are read from a precomputed ``kv_indptr`` instead, which is left unchanged."""
    if INDPTR_IN:
        start = tl.load(kv_indptr_ptr + r).to(tl.int64)
        seq_len = (tl.load(kv_indptr_ptr + r + 1) - tl.load(kv_indptr_ptr + r)).to(tl.int32)
    else:
        seq_len = tl.load(seq_lens_ptr + r).to(tl.int32)
        start = tl.zeros([], dtype=tl.int64)
        if (c == 0) | (tok0 < seq_len) | (not SKIP_IDLE):  # SKIP_IDLE: none past the request's end
            start = _prefix_sum(seq_lens_ptr, r, BLOCK_R, PREFIX_LOOP, PREFIX_U32, WIDE)
        if c == 0:
            tl.store(kv_indptr_ptr + r + 1, (start + seq_len).to(tl.int32))
            if r == 0:
                tl.store(kv_indptr_ptr, start.to(tl.int32))  # = 0
    return start, seq_len


@triton.jit
def _expand_group(
    block_table_ptr, block_table_stride, max_blocks, seq_lens_ptr, kv_indptr_ptr, kv_indices_ptr, num_reqs,
    g, c, n_c, K: tl.constexpr, BLOCK_T: tl.constexpr, GROUP: tl.constexpr, BLOCK_R: tl.constexpr,
    PREFIX_LOOP: tl.constexpr, INDPTR_IN: tl.constexpr, STORE_CACHE: tl.constexpr, PREFIX_U32: tl.constexpr,
    WIDE: tl.constexpr, SKIP_IDLE: tl.constexpr,
):
    """One program's work when it covers GROUP consecutive requests (``g * GROUP ..``) at once, as a
    ``(GROUP, BLOCK_T)`` tile: for batches of many short requests. The prefix sum is taken once for the
    group's first request and extended over the group by a cumulative sum, so the grid sums GROUP times
    fewer ``seq_lens`` than with one program per request, and launches GROUP times fewer programs."""
    req = g * GROUP + tl.arange(0, GROUP)
    valid = req < num_reqs
    rows = block_table_ptr + req.to(tl.int64) * block_table_stride
    if INDPTR_IN:
        st = tl.load(kv_indptr_ptr + req, mask=valid, other=0)
        lens = (tl.load(kv_indptr_ptr + req + 1, mask=valid, other=0) - st).to(tl.int32)
        start = st.to(tl.int64)
    else:
        lens = tl.load(seq_lens_ptr + req, mask=valid, other=0).to(tl.int32)
        lens64 = lens.to(tl.int64)
        start = tl.zeros([GROUP], dtype=tl.int64)
        # SKIP_IDLE: a chunk program past every request of its group (a loose max_seq_len bound, or a ragged
        # group) stores nothing, so it may skip the prefix sum (measured: not faster; off by default).
        if (c == 0) | (c * BLOCK_T < tl.max(lens, 0)) | (not SKIP_IDLE):
            start = (_prefix_sum(seq_lens_ptr, g * GROUP, BLOCK_R, PREFIX_LOOP, PREFIX_U32, WIDE)
                     + tl.cumsum(lens64, 0) - lens64)
        if c == 0:  # GROUP neighbouring kv_indptr entries in one store
            tl.store(kv_indptr_ptr + req + 1, (start + lens64).to(tl.int32), mask=valid)
            if g == 0:
                tl.store(kv_indptr_ptr, 0)
    for chunk in range(c, tl.cdiv(tl.max(lens, 0), BLOCK_T), n_c):
        t = chunk * BLOCK_T + tl.arange(0, BLOCK_T)
        b = t // K
        blk = tl.load(rows[:, None] + b[None, :], mask=valid[:, None] & (b < max_blocks)[None, :], other=0)
        tl.store(kv_indices_ptr + start[:, None] + t[None, :], (blk * K + (t % K)[None, :]).to(tl.int32),
                 mask=t[None, :] < lens[:, None], cache_modifier=STORE_CACHE)


@triton.jit
def _expand_page_indices_kernel(
    block_table_ptr,  # (num_reqs, max_blocks_per_req) int32/int64 block ids
    block_table_stride,  # elements between consecutive rows of block_table
    max_blocks,  # max_blocks_per_req (the row width): loads never go past it
    seq_lens_ptr,  # (num_reqs,) int32/int64 tokens per request
    kv_indptr_ptr,  # (num_reqs + 1,) int32: out (written by chunk-program 0 of each request), or in if INDPTR_IN
    kv_indices_ptr,  # (>= sum(seq_lens),) int32 out: flat token rows
    num_reqs,  # rows of block_table (only the GROUP > 1 path reads it)
    K: tl.constexpr,  # kernel block size (tokens per block); constexpr so // and % become shifts or multiplies
    BLOCK_T: tl.constexpr,  # tokens per chunk; chunk c of a request holds its tokens c*BLOCK_T .. (c+1)*BLOCK_T - 1
    BLOCK_R: tl.constexpr,  # seq_lens read per step of this request's prefix sum (a multiple of 32)
    PREFIX_LOOP: tl.constexpr,  # num_reqs > BLOCK_R: the prefix sum takes several steps
    INDPTR_IN: tl.constexpr,  # read start/end from a precomputed kv_indptr instead of summing seq_lens
    #                          (expand_page_indices(precomputed_kv_indptr=True))
    STORE_CACHE: tl.constexpr,  # cache modifier of the index stores ("" default, ".cs" streaming)
    CHUNKS_FIRST: tl.constexpr,  # grid is (chunks, requests) instead of (requests, chunks)
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (compiled NVIDIA, sm_90+)
    PREFIX_U32: tl.constexpr = False,  # sum seq_lens in uint32 (exact below 2**32 tokens), not int64
    GROUP: tl.constexpr = 1,  # requests per program (> 1: a (GROUP, BLOCK_T) tile, for many short requests)
    WIDE_PREFIX: tl.constexpr = False,  # the prefix sum in a BLOCK_R-wide accumulator (one-warp programs)
    SKIP_IDLE: tl.constexpr = False,  # chunk programs with nothing to store skip the prefix sum (not faster)
    BCAST: tl.constexpr = False,  # one load per block id, broadcast over its tokens (K a power of two)
    PREFIX_FIRST: tl.constexpr = False,  # issue the prefix sum's loads before the block ids' (one-request programs)
):
    # Programs start in grid order (axis 0 fastest). Chunks first: programs running together write
    # neighbouring output and read neighbouring block ids of one request, instead of one 4 KB piece in each
    # of hundreds of requests (regions a power-of-two apart in the 512 x 128k case).
    if CHUNKS_FIRST:
        r = tl.program_id(1)  # request (or group of requests)
        c = tl.program_id(0)  # this program's first chunk; it then strides by the grid's chunk dimension
        n_c = tl.num_programs(0)
    else:
        r = tl.program_id(0)
        c = tl.program_id(1)
        n_c = tl.num_programs(1)
    if PDL:  # block_table and seq_lens may be written by the kernel before: nothing is read until it is done
        pdl_wait_then_release()
    if GROUP > 1:
        _expand_group(block_table_ptr, block_table_stride, max_blocks, seq_lens_ptr, kv_indptr_ptr, kv_indices_ptr,
                      num_reqs, r, c, n_c, K, BLOCK_T, GROUP, BLOCK_R, PREFIX_LOOP, INDPTR_IN, STORE_CACHE,
                      PREFIX_U32, WIDE_PREFIX, SKIP_IDLE)
    else:
        row = block_table_ptr + r.to(tl.int64) * block_table_stride
        # 1. Load the first chunk's block ids and find where the request starts in the output (2.). Chunks are
        #    aligned to the request (not to the output), so neither waits for the other and the two memory
        #    latencies overlap instead of adding up. By default the block ids are loaded first; PREFIX_FIRST
        #    issues the prefix sum's loads first, so that its reduction overlaps the block ids' latency.
        tok0 = c * BLOCK_T
        if PREFIX_FIRST:
            start, seq_len = _request_start(seq_lens_ptr, kv_indptr_ptr, r, c, tok0, BLOCK_R, PREFIX_LOOP,
                                            INDPTR_IN, PREFIX_U32, WIDE_PREFIX, SKIP_IDLE)
        vals = _indices_of_chunk(row, max_blocks, tok0, K, BLOCK_T, BCAST)
        if not PREFIX_FIRST:
            start, seq_len = _request_start(seq_lens_ptr, kv_indptr_ptr, r, c, tok0, BLOCK_R, PREFIX_LOOP,
                                            INDPTR_IN, PREFIX_U32, WIDE_PREFIX, SKIP_IDLE)

        # 3. Store; the full chunks of a request are unmasked (16-byte vector stores when the output position is
        #    a multiple of 4), only its last chunk is masked. Programs then stride over the request's other chunks
        #    (only when the grid's second dimension is capped below the request's chunk count).
        _store_chunk(kv_indices_ptr, vals, start, seq_len, tok0, BLOCK_T, STORE_CACHE, K, BCAST)
        for chunk in range(c + n_c, tl.cdiv(seq_len, BLOCK_T), n_c):
            tok = chunk * BLOCK_T
            _store_chunk(kv_indices_ptr, _indices_of_chunk(row, max_blocks, tok, K, BLOCK_T, BCAST), start, seq_len,
                         tok, BLOCK_T, STORE_CACHE, K, BCAST)


@dataclasses.dataclass(frozen=True)
class ExpandConfig:
    """Launch parameters of :func:`expand_page_indices` (chosen from a sweep on an H200; see the benchmark)."""

    block_t: int = 1024  # tokens per chunk (power of two)
    num_warps: int = 4
    max_chunk_programs: int = 65535  # programs per request (grid's chunk dimension); programs then stride
    streaming_stores: bool = False  # ".cs" stores (evict-first), for outputs far larger than L2
    chunks_first: bool = True  # grid (chunks, requests): programs that run together write neighbouring output
    pdl: bool = True  # programmatic dependent launch where available (compiled NVIDIA, sm_90+); else ignored.
    # With PDL the kernel waits (griddepcontrol.wait) before its first read and then lets the next kernel launch.
    prefix_u32: bool = False  # the in-kernel prefix sum of seq_lens in uint32 (exact below 2**32) instead of int64
    group: int = 1  # requests per program (a power of two): > 1 packs short requests into one (group, block_t) tile
    wide_prefix: bool = False  # the prefix sum in a prefix_block-wide accumulator (for one-warp programs)
    prefix_block: int = 4096  # seq_lens summed per step of a program's prefix sum (a power of two >= 32)
    # (with the 32-wide accumulator every step is unrolled into prefix_block / 32 loads per lane, issued back to
    # back; the steps wait on each other, so batches of more requests than this pay one memory latency per step)
    skip_idle_prefix: bool = False  # chunk programs with nothing to store skip their prefix sum: not faster on an
    #                                 H200 (eleventh session, the committed JSON's idle_prefix_probe: 2048 x 200
    #                                 under a 128k bound 4.78 against 4.71 us, 16,384 x 32 6.66 against 6.83, tight
    #                                 bounds 0.06-0.18 us slower; one round), so off: the loose bound's cost is not
    #                                 those sums
    broadcast_blocks: bool = False  # load each block id of a chunk once and broadcast it over its K tokens (a
    #                                 (BLOCK_T // K, K) tile) instead of one load per token; K a power of two (other
    #                                 K keep the per-token load); one-request programs only (group == 1). Alone it
    #                                 was not faster on an H200 (twelfth session, the JSON's broadcast_probe: 256 x 4k
    #                                 2.28-2.40 against 2.15-2.20 us, mixed elsewhere); with prefix_first and
    #                                 prefix_u32 expand_config uses it for many short requests (nineteenth session)
    prefix_first: bool = False  # one-request programs issue the prefix sum's loads before the block ids' (its
    #                             reduction then overlaps their latency); otherwise the block ids are loaded first.
    #                             expand_config turns it on with prefix_u32 and broadcast_blocks for many short
    #                             requests (its docstring has the numbers)

    def __post_init__(self) -> None:
        for name in ("block_t", "num_warps", "group", "prefix_block"):
            v = getattr(self, name)
            least = 32 if name == "prefix_block" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < least or v & (v - 1):
                raise ValueError(f"ExpandConfig.{name} must be a power of two >= {least} (a Triton block shape), "
                                 f"got {v!r}")
        if isinstance(self.max_chunk_programs, bool) or not isinstance(self.max_chunk_programs, int) \
                or self.max_chunk_programs < 1:
            raise ValueError(f"ExpandConfig.max_chunk_programs must be an int >= 1, got {self.max_chunk_programs!r}")
        if self.broadcast_blocks and self.group > 1:
            raise ValueError(f"ExpandConfig.broadcast_blocks applies to one-request programs: it needs group == 1, "
                             f"got group={self.group} (request groups load their (group, block_t) tile's ids as is)")


# Output size (bytes) above which index stores stream past L2 (".cs"): the H200's L2 holds 50-60 MB.
STREAMING_STORE_BYTES = 64 << 20


FEW_REQS = 64  # below this many requests the prefix sums are cheap and 4 warps per program store faster
GROUP_PROGRAMS = 512  # with request groups, about this many groups (programs) per launch


# From BROADCAST_REQS one-request programs whose bound max_seq_len lies in BROADCAST_MIN_LEN..BROADCAST_MAX_LEN
# (tight bounds): the prefix sum's loads first, a uint32 sum, and each block id loaded once (expand_config;
# measured in the expansion JSON's rule_probe)
BROADCAST_REQS = 512
BROADCAST_MIN_LEN = 257  # chunks of 512 or 1024 tokens
BROADCAST_MAX_LEN = 2048
LOOSE_PROGRAM_BUDGET = 1024  # loose bounds: about this many programs in all (chunk programs capped, they stride)


def expand_config(num_reqs: int, max_seq_len: int, *, loose_bound: bool = False) -> ExpandConfig:
    """The launch parameters for a batch of ``num_reqs`` requests of at most ``max_seq_len`` tokens.

    ``loose_bound``: ``max_seq_len`` may be far above the real lengths (the model's maximum length, so that one
    CUDA graph serves every step). The grid is sized from the bound, and every program sums its request's
    prefix before it finds whether it has anything to store, so a loose bound costs in proportion to the bound
    (the committed JSON's ``loose_bound_probe``, under a 128k bound against the tight one: 256 x 4k 29.6 against
    2.3 us, 1024 x 1000 223 against 2.7 us, 16,384 x 32 27 ms against 4.4 us). With ``loose_bound`` the chunk
    programs per request are capped so that the grid holds about :data:`LOOSE_PROGRAM_BUDGET` programs (each
    then strides over its request's chunks), one warp from :data:`FEW_REQS` requests, request groups from
    ``4 * GROUP_PROGRAMS`` requests whatever the bound (sized as for short requests, up to 32, with chunks narrowed
    to a 4096-entry tile), and no streaming stores (the output size is unknown): in ``budget_probe`` a budget of
    1024 took the first two cases to 2.4-2.6 and 2.9-3.0 us, and 32 x 32k under a 128k bound from 5.6 to 1.9-2.0
    us (its tight time); 2048 and more were slower at every loose case. The wider groups took 16,384 x 32 from
    20.4 (groups of 4 by 1024 tokens) to 6.7-6.8 us and 8192 x 64 from 9.0-9.1 to 5.5-5.6
    (``loose_groups_probe``). The price is where the bound is tight and the output large: capped programs
    stride, and 512 x 128k took 77-83 us against 70.6 (``budget_probe``; ``stride_probe``: wider chunks and more
    warps did not win it back). So it is not the default.

    Every program sums ``seq_lens[:r]`` for its request, in every one of its warps, so the grid's prefix work
    grows as programs x warps x ``num_reqs``: quadratic in the batch size. The eighth session's H200 sweep
    (``scripts/expand_group_sweep.py``, the committed JSON's ``group_sweep``) chose, from 13 batches of 1 to
    16,384 requests:

    * 4 warps below :data:`FEW_REQS` requests and for streaming outputs (1 x 97k 0.95-1.09 us against
      1.06-1.17 with one warp; 512 x 128k 71.1-72.0 against 72.3-73.0), one warp otherwise (256 x 4k
      2.08-2.20 against 2.33-2.40; 1000 x 300 1.73-1.90 against 3.69-3.87; 1024 x ~1000 3.0 against 4.7);
    * chunks of ``next_pow2(max_seq_len)`` tokens, at most 1024 (fewer idle lanes for short requests);
    * request groups (``ExpandConfig.group``) only for batches of short requests (at most 1024 tokens) with
      at least ``4 * GROUP_PROGRAMS`` requests, sized to about :data:`GROUP_PROGRAMS` groups with tiles of at most
      4096 entries: 16,384 x 32 206 -> 7.3 us, 8192 x 64 57 -> 4.4, 4096 x 100 17.8 -> 2.9, 2048 x 200
      6.5 -> 2.3. Groups of 2 were slower than one request per program everywhere, and groups of long requests
      lose the 16-byte vector stores (32 x 32k and 256 x 4k took 2.6-3.5 us with groups of 2 or 4).

    ``prefix_block`` 4096 (4096 seq_lens summed per step of the prefix sum, not 1024) took 16,384 x 32 from
    7.3-7.5 to 5.7 us and 8192 x 64 from 4.4-4.6 to 3.5-3.6 (``scripts/expand_wide_prefix_probe.py``, the
    JSON's ``wide_prefix_probe``); batches of up to 1024 requests do not see it. ``wide_prefix`` (a
    prefix_block-wide accumulator loaded in 16-byte vectors) was slower below 2048 requests (1000 x 300 2.7
    against 1.75 us) and is off; spread over 4 warps it was the fastest at 16,384 x 32 (3.4-3.5 us) but not
    at 2048 or 4096 requests. A precomputed ``kv_indptr`` (about 2 us at every batch of 2048 requests or
    more) shows what the in-kernel prefix sum still costs there.

    The uint32 prefix sum (``prefix_u32``) with request groups: 2048 x 200 2.21-2.33 -> 1.95-2.09 us, 4096 x 100
    2.68-2.75 -> 2.37-2.50, 8192 x 64 3.66-3.69 -> 3.14-3.19, 16,384 x 32 5.74-5.85 -> 4.39-4.54 (the JSON's
    ``wide_prefix_probe``, ``--warps`` run). Without groups it was slower at 1024 x 1000 (2.93-3.09 against
    2.65-2.84 us, in two runs) and within noise at 256 x 4k.

    Many one-request programs of short requests (at least :data:`BROADCAST_REQS` requests, ``max_seq_len`` from
    :data:`BROADCAST_MIN_LEN` to :data:`BROADCAST_MAX_LEN`, one warp, no groups) take three switches together:
    ``prefix_first``, ``prefix_u32`` and ``broadcast_blocks``. In the nineteenth session's H200 runs (the JSON's ``rule_probe``,
    three rounds, against all three off) 768 x 900 took 2.02-2.09 against 2.30-2.33 us, 1024 x 1000 2.25-2.26
    against 2.60-2.79, 1536 x 700 2.81-2.86 against 3.74-3.90, 1024 x 1000 at K = 1 2.75-2.86 against 3.36-3.48
    (ragged 2.43-2.68 against 3.29-3.41), and 4096 ragged requests of up to 2048 tokens 10.4 against 13.4; 512 x
    1024 and 2047 x 1500 were level. The uint32 sum alone was slower (1024 x 1000 2.98-3.00 us); the broadcast
    carries the gain. Above 2048 tokens the three were level (1024 x 4096, 512 x 8192, 2048 x 4096) or slower
    (1536 ragged requests of up to 3000 tokens, 6.35-6.41 against 6.03-6.05 us), so they stay off there. With
    chunks under 512 tokens they were slower (512 x 16 1.43-1.45 against 1.31-1.35 us, 600 x 100 1.48-1.57
    against 1.43-1.55) or level (1024 x 64, 2047 x 200), so they start at 257 tokens; with 512-token chunks they
    were level (1000 x 300) or faster (2047 ragged requests of up to 500 tokens, 2.95-2.96 against 3.05 us).

    Earlier sweeps (``workbench bench expand --sweep``; the committed JSON's ``sweep_run`` and chapter 2): the
    chunks-first grid order took 512 x 128k from about 78 to 72 us; streaming stores helped only there
    (about 75 -> 72 us), where the output is far larger than L2.

    PDL (programmatic dependent launch) only below the streaming threshold: back to back it took 1 x 97k from
    1.46 to 0.97-1.08 us and 256 x 4k from 2.66-2.89 to 2.27-2.41 us, but made 512 x 128k (65,536 programs)
    12 % slower, 71 -> 80 us (a store-only kernel lost as much there with PDL: the launch mode, not this
    kernel). After a kernel that does not trigger its dependents early (a torch ``fill_``), PDL gained nothing
    measurable: the overlap needs a predecessor that triggers, as this kernel and the decode kernels do.
    """
    block_t = max(16, min(1024, triton.next_power_of_2(max(max_seq_len, 1))))
    # requests per group for about GROUP_PROGRAMS groups (a power of two); 1 below 4 per group
    per_group = 1 << ((num_reqs // GROUP_PROGRAMS).bit_length() - 1) if num_reqs >= 4 * GROUP_PROGRAMS else 1
    if loose_bound:  # groups as for short requests whatever the bound, chunks narrowed to a 4096-entry tile
        group = min(32, per_group)
        block_t = max(16, min(block_t, 4096 // group))
        groups = max(1, -(-num_reqs // group))
        return ExpandConfig(block_t=block_t, num_warps=4 if num_reqs < FEW_REQS else 1, group=group,
                            prefix_u32=group > 1, max_chunk_programs=max(1, LOOSE_PROGRAM_BUDGET // groups))
    streaming = 4 * num_reqs * max_seq_len > STREAMING_STORE_BYTES
    num_warps = 4 if num_reqs < FEW_REQS or streaming else 1
    group = min(4096 // block_t, per_group) if max_seq_len <= 1024 else 1
    # many one-request programs of short requests: the prefix sum first, in uint32, and each block id loaded once
    many = (group == 1 and num_warps == 1 and num_reqs >= BROADCAST_REQS
            and BROADCAST_MIN_LEN <= max_seq_len <= BROADCAST_MAX_LEN)
    return ExpandConfig(block_t=block_t, num_warps=num_warps, streaming_stores=streaming, pdl=not streaming,
                        group=group, prefix_u32=group > 1 or many, prefix_first=many, broadcast_blocks=many)


def broadcast_applies(broadcast_blocks: bool, K: int) -> bool:
    """Whether the kernel takes the one-load-per-block-id path (``ExpandConfig.broadcast_blocks``): only for a
    power-of-two ``K`` (the ``(block_t // K, K)`` tile needs one); other ``K`` keep the per-token load."""
    return broadcast_blocks and K & (K - 1) == 0


GRID_AXIS1_MAX = 65535  # CUDA's limit on grid axis 1 (axis 0 allows 2**31 - 1)


def _launch_expand(block_table, seq_lens, K, kv_indices, kv_indptr, max_seq_len, config: ExpandConfig,
                   indptr_in: bool = False) -> None:
    num_reqs = block_table.shape[0]
    groups = triton.cdiv(num_reqs, config.group)
    # CUDA allows 2**31 - 1 programs along grid axis 0 but only 65535 along axis 1.
    chunks_first = config.chunks_first and groups <= GRID_AXIS1_MAX
    chunks = max(1, min(triton.cdiv(max_seq_len, config.block_t), config.max_chunk_programs,
                        2**31 - 1 if chunks_first else GRID_AXIS1_MAX))
    # a power of two from 32 (the warp-wide vector the prefix sum adds into) to config.prefix_block
    block_r = max(32, min(triton.next_power_of_2(num_reqs), config.prefix_block))
    pdl = config.pdl and _device.pdl_available(block_table.device)
    _expand_page_indices_kernel[(chunks, groups) if chunks_first else (groups, chunks)](
        block_table, block_table.stride(0), block_table.shape[1], seq_lens, kv_indptr, kv_indices, num_reqs,
        K=K, BLOCK_T=config.block_t, BLOCK_R=block_r, PREFIX_LOOP=num_reqs > block_r, INDPTR_IN=indptr_in,
        STORE_CACHE=".cs" if config.streaming_stores else "", CHUNKS_FIRST=chunks_first,
        PREFIX_U32=config.prefix_u32, GROUP=config.group, WIDE_PREFIX=config.wide_prefix,
        SKIP_IDLE=config.skip_idle_prefix, BCAST=broadcast_applies(config.broadcast_blocks, K),
        PREFIX_FIRST=config.prefix_first, num_warps=config.num_warps, **pdl_launch_options(pdl),
    )


def expand_page_indices(
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    kernel_block_size: int,
    *,
    out: torch.Tensor | None = None,
    kv_indptr: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    validate: bool = True,
    num_blocks: int | None = None,
    config: ExpandConfig | None = None,
    precomputed_kv_indptr: bool = False,
    loose_bound: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand block-table entries into per-token flat KV indices, on the device, in one launch.

    ``kv_indices[kv_indptr[r] + t] = block_table[r, t // K] * K + t % K`` for ``t < seq_lens[r]``
    (:func:`expand_page_indices_ref` is the spec). One Triton launch with a 2-D grid (request x
    chunk of tokens) computes both outputs; ``kv_indptr`` is computed in the kernel too. For batches of
    thousands of short requests :func:`expand_config` packs neighbouring requests into one program
    (``ExpandConfig.group``), so the grid is then (request group x chunk).

    ``max_seq_len`` also sizes the grid and picks the launch parameters. A loose bound (say the model's
    maximum length, so that one CUDA graph serves every step) is correct for any batch, but by default it
    launches a program for every chunk up to the bound, and each of those sums its request's ``seq_lens``
    prefix before it finds that it has nothing to store: the call then costs time in proportion to the bound
    (on an H200 under a 128k bound, 256 x 4k took 29.6 us against 2.3 with the tight bound). Pass
    ``loose_bound=True`` in that case: :func:`expand_config` then caps the grid at about 1024 programs that
    stride over the chunks (2.2-2.6 us there), at some cost where the bound is tight and the output large
    (512 x 128k: 77-83 against 70.6 us). vLLM builds this metadata outside its CUDA graphs, with the step's
    host-side maximum length: the tight bound.

    Host synchronisation: none when ``out``, ``kv_indptr`` and ``max_seq_len`` are given and
    ``validate=False``; the call can then be captured in a CUDA graph (validate once outside the
    graph with :func:`validate_expand_inputs`). Otherwise ``sum(seq_lens)`` (to size ``out``) and
    ``max(seq_lens)`` (to size the grid) are read on the host.

    Args:
        block_table: ``(num_reqs, max_blocks_per_req)`` int32/int64 block ids (row stride may be > width).
        seq_lens: ``(num_reqs,)`` int32/int64 tokens per request, same device.
        kernel_block_size: ``K``, tokens per block (Python int > 0).
        out: optional ``(N,) int32`` buffer, ``N >= sum(seq_lens)``; entries from ``sum(seq_lens)`` on
            are left untouched.
        kv_indptr: optional ``(num_reqs + 1,) int32`` buffer that receives the cumulative seq_lens.
        max_seq_len: optional host-side bound ``>= max(seq_lens)``: it sizes the grid's chunk dimension and
            picks the launch parameters. ``validate`` refuses a smaller one; with ``validate=False`` a smaller
            one is still expanded exactly (programs stride over the chunks past the bound), only more slowly.
        validate: run :func:`validate_expand_inputs` (reads values on the host; refuses to run during
            CUDA-graph capture).
        num_blocks: KV-cache size in blocks, for the out-of-cache check.
        config: launch parameters (default: :func:`expand_config`).
        precomputed_kv_indptr: ``kv_indptr`` is given already filled with ``[0, cumsum(seq_lens)]`` (vLLM's
            metadata builder computes it before the expansion, and vLLM 0.20's kernel read it): the kernel reads
            each request's start and length from it instead of summing ``seq_lens``, and leaves it unchanged.
            One dependent read less per program: 1.89-2.04 us at 256 x 4k on the H200 against 2.16-2.34 (the
            benchmark's sweep row "precomputed kv_indptr", chapter 2). With ``validate`` its values are checked.
        loose_bound: ``max_seq_len`` may be far above the real lengths: launch parameters for that
            (:func:`expand_config`); ignored when ``config`` is given.

    Returns:
        ``(kv_indices, kv_indptr)``: ``(sum(seq_lens),) int32`` (the first ``sum(seq_lens)`` entries of
        ``out`` when given; all of ``out`` when ``validate=False``, because the total is not read then)
        and ``(num_reqs + 1,) int32``.
    """
    K = _check_kernel_block_size(kernel_block_size)
    if validate:
        if block_table.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "expand_page_indices(validate=True) reads seq_lens and block_table on the host, which is not "
                "allowed during CUDA-graph capture; call validate_expand_inputs(...) once before capturing and "
                "pass validate=False inside the graph"
            )
        validate_expand_inputs(block_table, seq_lens, K, num_blocks=num_blocks, out=out, kv_indptr=kv_indptr,
                               max_seq_len=max_seq_len, check_values=True, precomputed_kv_indptr=precomputed_kv_indptr)
    else:
        validate_expand_inputs(block_table, seq_lens, K, out=out, kv_indptr=kv_indptr, max_seq_len=max_seq_len,
                               check_values=False, precomputed_kv_indptr=precomputed_kv_indptr)
    _check_runs_here(block_table)
    num_reqs = block_table.shape[0]
    total = None
    if out is None or validate:
        total = int(seq_lens.sum()) if num_reqs else 0
    if out is None:
        out = torch.empty(total, dtype=torch.int32, device=block_table.device)
    if kv_indptr is None:
        kv_indptr = torch.empty(num_reqs + 1, dtype=torch.int32, device=block_table.device)
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max()) if num_reqs else 0
    if num_reqs == 0:
        if not precomputed_kv_indptr:
            kv_indptr.zero_()
    else:
        _launch_expand(block_table, seq_lens, K, out, kv_indptr, max_seq_len,
                       config or expand_config(num_reqs, max_seq_len, loose_bound=loose_bound),
                       indptr_in=precomputed_kv_indptr)
    return (out if total is None else out[:total]), kv_indptr


# --------------------------------------------------------------------------------------------
# 4. What it replaced, and the baselines the benchmark compares it with.
# --------------------------------------------------------------------------------------------


def expand_page_indices_pre_pr(
    block_table: torch.Tensor, seq_lens: torch.Tensor, kernel_block_size: int, *, validate: bool = True,
    num_blocks: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pre-PR path: kernel block size 1 through hybrid splitting, then a plain copy per row.

    Before vLLM PR #39616, AITER MLA declared kernel block size ``[1]``: the block table
    (manager blocks of ``K`` tokens) was split on the host into a ``K`` times wider table of
    one-token blocks (:func:`workbench.blocksize.map_to_kernel_blocks`), and a copy kernel took the
    first ``seq_lens[r]`` entries of each row. Same arguments and results as
    :func:`expand_page_indices`; it must give identical indices. Row padding must be non-negative
    (vLLM pads with 0): the split refuses negative ids anywhere in the table.
    """
    K = _check_kernel_block_size(kernel_block_size)
    if validate:
        validate_expand_inputs(block_table, seq_lens, K, num_blocks=num_blocks)
    # vLLM's hybrid-block split (manager blocks of K tokens -> kernel blocks of 1 token), on the host.
    ratio = _blocksize.kernel_block_ratio(K, 1)
    table_k1 = _blocksize.map_to_kernel_blocks(block_table.cpu(), ratio).reshape(block_table.shape[0], -1)
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
    block_table: torch.Tensor, seq_lens: torch.Tensor, kernel_block_size: int, *, max_seq_len: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch: build a dense ``(num_reqs, max_seq_len)`` index tensor, then keep the valid tokens.

    Bytes moved: it materialises ``num_reqs * max_seq_len`` indices (several int64 temporaries) and
    a boolean mask, then compacts them; the compaction (boolean indexing) synchronises with the host,
    so it cannot be captured in a CUDA graph. No validation (a baseline, not an API).
    """
    K = _check_kernel_block_size(kernel_block_size)
    num_reqs = block_table.shape[0]
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max()) if num_reqs else 0
    pos = torch.arange(max_seq_len, device=block_table.device)
    blk = block_table.gather(1, (pos // K).clamp_max(block_table.shape[1] - 1).expand(num_reqs, -1))
    dense = blk * K + pos % K  # (num_reqs, max_seq_len)
    kv_indices = dense[pos[None, :] < seq_lens[:, None]].to(torch.int32)
    kv_indptr = torch.zeros(num_reqs + 1, dtype=torch.int32, device=block_table.device)
    kv_indptr[1:] = torch.cumsum(seq_lens, 0)
    return kv_indices, kv_indptr


# --------------------------------------------------------------------------------------------
# 5. The metadata aiter's decode call needs, built in one place.
# --------------------------------------------------------------------------------------------


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
        num_blocks, validate, max_seq_len, out, kv_indptr, loose_bound: passed to :func:`expand_page_indices`.

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
        kv_indices_t, kv_indptr_t = expand_page_indices_dense(block_table, seq_lens, K, max_seq_len=max_seq_len)
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
