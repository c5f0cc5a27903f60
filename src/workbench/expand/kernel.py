"""The expansion kernel: one Triton launch with a 2-D grid (request, or group of requests, x chunk of tokens)
computes ``kv_indices`` and ``kv_indptr``, so one long request spreads over the GPU; :func:`expand_page_indices`
checks the inputs and launches it with :func:`~workbench.expand.policy.expand_config`'s parameters.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from workbench import device as _device
from workbench.expand import policy as _policy
from workbench.expand.policy import ExpandConfig, broadcast_applies
from workbench.expand.spec import _check_kernel_block_size, _check_runs_here, validate_expand_inputs

__all__ = ["GRID_AXIS1_MAX", "expand_page_indices", "pdl_launch_options", "pdl_wait_then_release"]


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
    if tok0 <= seq_len - BLOCK_T:  # a full chunk (a subtraction, so that it cannot overflow int32)
        if base % 4 == 0:  # 16-byte aligned: the stores can be 16-byte vector stores
            # (base // 4) * 4 equals base here, and the compiler can see that it is a multiple of 4. Not
            # tl.multiple_of(base, 4): that marks the value base itself, in every branch, so the unaligned
            # branch below became 16-byte stores too (a misaligned-address fault on an H200).
            tl.store(kv_indices_ptr + (base // 4) * 4 + lane, vals, cache_modifier=STORE_CACHE)
        else:
            tl.store(kv_indices_ptr + base + lane, vals, cache_modifier=STORE_CACHE)
    else:  # the request's last, partial chunk (or a chunk past its end: nothing is written)
        tl.store(kv_indices_ptr + base + lane, vals, mask=lane < seq_len - tok0, cache_modifier=STORE_CACHE)


@triton.jit
def _prefix_sum(seq_lens_ptr, r0, BLOCK_R: tl.constexpr, PREFIX_LOOP: tl.constexpr, PREFIX_U32: tl.constexpr):
    """``sum(seq_lens[:r0])`` as an int64 scalar (where the request ``r0`` starts in ``kv_indices``).

    Summed in a 32-wide vector (every warp holds all of it) and reduced once at the end: the reduction stays
    inside a warp, with no shared memory and no barrier. (A BLOCK_R-wide vector spans the warps, and its
    cross-warp reduction made 256 x 4k about 0.4 us slower than 32 x 32k on an H200, same output, 32 seq_lens
    summed.) Each warp of each program loads the ``r0`` entries: the grid's prefix work is
    (programs x warps x r0), which is why :func:`expand_config` packs short requests into groups and uses one
    warp for large batches. ``PREFIX_U32``: the sum in uint32 (exact below 2**32 tokens), half the instructions.
    """
    acc_ty: tl.constexpr = tl.uint32 if PREFIX_U32 else tl.int64
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
    return tl.sum(part).to(tl.int64)


@triton.jit
def _request_start(seq_lens_ptr, kv_indptr_ptr, r, c, BLOCK_R: tl.constexpr, PREFIX_LOOP: tl.constexpr,
                   INDPTR_IN: tl.constexpr, PREFIX_U32: tl.constexpr):
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
        start = _prefix_sum(seq_lens_ptr, r, BLOCK_R, PREFIX_LOOP, PREFIX_U32)
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
        start = (_prefix_sum(seq_lens_ptr, g * GROUP, BLOCK_R, PREFIX_LOOP, PREFIX_U32)
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
    CHUNKS_FIRST: tl.constexpr,  # grid is (chunks, requests); False only past grid axis 1's limit of requests
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (compiled NVIDIA, sm_90+)
    PREFIX_U32: tl.constexpr = False,  # sum seq_lens in uint32 (exact below 2**32 tokens), not int64
    GROUP: tl.constexpr = 1,  # requests per program (> 1: a (GROUP, BLOCK_T) tile, for many short requests)
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
                      PREFIX_U32)
    else:
        row = block_table_ptr + r.to(tl.int64) * block_table_stride
        # 1. Load the first chunk's block ids and find where the request starts in the output (2.). Chunks are
        #    aligned to the request (not to the output), so neither waits for the other and the two memory
        #    latencies overlap instead of adding up. By default the block ids are loaded first; PREFIX_FIRST
        #    issues the prefix sum's loads first, so that its reduction overlaps the block ids' latency.
        tok0 = c * BLOCK_T
        if PREFIX_FIRST:
            start, seq_len = _request_start(seq_lens_ptr, kv_indptr_ptr, r, c, BLOCK_R, PREFIX_LOOP, INDPTR_IN,
                                            PREFIX_U32)
        vals = _indices_of_chunk(row, max_blocks, tok0, K, BLOCK_T, BCAST)
        if not PREFIX_FIRST:
            start, seq_len = _request_start(seq_lens_ptr, kv_indptr_ptr, r, c, BLOCK_R, PREFIX_LOOP, INDPTR_IN,
                                            PREFIX_U32)

        # 3. Store; the full chunks of a request are unmasked (16-byte vector stores when the output position is
        #    a multiple of 4), only its last chunk is masked. Programs then stride over the request's other chunks
        #    (only when the grid's second dimension is capped below the request's chunk count).
        _store_chunk(kv_indices_ptr, vals, start, seq_len, tok0, BLOCK_T, STORE_CACHE, K, BCAST)
        for chunk in range(c + n_c, tl.cdiv(seq_len, BLOCK_T), n_c):
            tok = chunk * BLOCK_T
            _store_chunk(kv_indices_ptr, _indices_of_chunk(row, max_blocks, tok, K, BLOCK_T, BCAST), start, seq_len,
                         tok, BLOCK_T, STORE_CACHE, K, BCAST)


GRID_AXIS1_MAX = 65535  # CUDA's limit on grid axis 1 (axis 0 allows 2**31 - 1)


def _launch_expand(block_table, seq_lens, K, kv_indices, kv_indptr, max_seq_len, config: ExpandConfig,
                   indptr_in: bool = False) -> None:
    num_reqs = block_table.shape[0]
    groups = triton.cdiv(num_reqs, config.group)
    # Chunks first (requests on grid axis 1) unless there are more groups than axis 1 allows.
    chunks_first = groups <= GRID_AXIS1_MAX
    chunks = max(1, min(triton.cdiv(max_seq_len, config.block_t), config.max_chunk_programs,
                        2**31 - 1 if chunks_first else GRID_AXIS1_MAX))
    # a power of two from 32 (the warp-wide vector the prefix sum adds into) to PREFIX_BLOCK
    block_r = max(32, min(triton.next_power_of_2(num_reqs), _policy.PREFIX_BLOCK))
    pdl = config.pdl and _device.pdl_available(block_table.device)
    _expand_page_indices_kernel[(chunks, groups) if chunks_first else (groups, chunks)](
        block_table, block_table.stride(0), block_table.shape[1], seq_lens, kv_indptr, kv_indices, num_reqs,
        K=K, BLOCK_T=config.block_t, BLOCK_R=block_r, PREFIX_LOOP=num_reqs > block_r, INDPTR_IN=indptr_in,
        STORE_CACHE=".cs" if config.streaming_stores else "", CHUNKS_FIRST=chunks_first,
        PREFIX_U32=config.prefix_u32, GROUP=config.group, BCAST=broadcast_applies(config.broadcast_blocks, K),
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
    ``loose_bound=True`` in that case: :func:`expand_config` then caps the grid at about
    :data:`~workbench.expand.policy.LOOSE_PROGRAM_BUDGET` programs that stride over the chunks (2.1 us there).
    vLLM builds this metadata outside its CUDA graphs, with the step's host-side maximum length: the tight bound.

    Host synchronisation: none when ``out``, ``kv_indptr`` and ``max_seq_len`` are given and
    ``validate=False``; the call can then be captured in a CUDA graph (validate once outside the
    graph with :func:`validate_expand_inputs`). Otherwise ``sum(seq_lens)`` (to size ``out``) and
    ``max(seq_lens)`` (to size the grid) are read on the host.

    Layouts: ``block_table`` may have any row stride and storage offset (a view into a wider table), but the
    block ids of a row must be adjacent (column stride 1; a transposed table is refused: pass
    ``block_table.contiguous()``). ``seq_lens`` may be a strided view: it is copied to a contiguous tensor first
    (``num_reqs`` entries, on the device; captured in a CUDA graph like the kernel). ``out`` and ``kv_indptr`` must
    be contiguous and must not share memory with the inputs or each other (refused otherwise).

    Args:
        block_table: ``(num_reqs, max_blocks_per_req)`` int32/int64 block ids (row stride may be > width;
            column stride 1).
        seq_lens: ``(num_reqs,)`` int32/int64 tokens per request, same device (any stride).
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
            One dependent read less per program: on an H200, 256 x 4k took 1.98 us against 2.31. With
            ``validate`` its values are checked.
        loose_bound: ``max_seq_len`` may be far above the real lengths: launch parameters for that
            (:func:`expand_config`); ignored when ``config`` is given.

    Returns:
        ``(kv_indices, kv_indptr)``: ``(sum(seq_lens),) int32`` (the first ``sum(seq_lens)`` entries of
        ``out`` when given; all of ``out`` when ``validate=False``, because the total is not read then)
        and ``(num_reqs + 1,) int32``.
    """
    K = _check_kernel_block_size(kernel_block_size)
    if config is not None and not isinstance(config, ExpandConfig):
        raise TypeError(f"config must be an ExpandConfig or None (the launch parameters; None: expand_config picks "
                        f"them), got {config!r} ({type(config).__name__}); pass workbench.expand.ExpandConfig(...)")
    if validate:
        if isinstance(block_table, torch.Tensor) and block_table.is_cuda and torch.cuda.is_current_stream_capturing():
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
    seq_lens = seq_lens.contiguous()  # the kernel reads seq_lens[i] at offset i: a strided view is copied (num_reqs)
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
                       config or _policy.expand_config(num_reqs, max_seq_len, loose_bound=loose_bound),
                       indptr_in=precomputed_kv_indptr)
    return (out if total is None else out[:total]), kv_indptr
