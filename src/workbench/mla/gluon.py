"""A Gluon split kernel for the compute-bound MLA decode (64 folded rows per program), Hopper only, and the
pieces the three Gluon kernels share.

Triton's pipeliner issues the copies of tile ``i+1`` only after the math of tile ``i`` (its loop is
``wait:0 dot ... dot copy copy``), and a third 73.7 KB buffer, which would let them start earlier, does not fit
beside the 73.7 KB query tile. With two buffers the copies of tile ``i+1`` can still start *before* the math of
tile ``i``: the buffer they overwrite held tile ``i-1``, which is finished by then. Triton's language cannot say
that order; Gluon (Triton's lower-level language: explicit layouts, shared-memory buffers, ``cp.async`` groups
and ``wgmma``) can. This module writes that schedule:

* one program: 64 folded rows (query position x head) of one request, one split of its tokens; 8 warps
  (two warpgroups, each owning half of the 512 output columns);
* shared memory: the query tile (latent and rope parts) and two buffers of 64 cache rows, 216 KB;
* per tile: wait for the wgmma work of the last tile, issue the gather of tile ``i+1`` (``cp.async``, rows by
  index, zero-filled past the end), load the indices of tile ``i+2`` into registers, wait for tile ``i``'s
  copies, ``S = q_lat k_lat^T + q_rope k_rope^T`` on ``wgmma``, the online softmax in registers, ``O += P V``
  with ``P`` from registers and ``V`` the first 512 columns of the same buffer;
* the output or partial is staged in the idle tile buffers and stored row-major in 16-byte vectors
  (:func:`store_rows_coalesced`), not from the ``wgmma`` accumulator layout, whose warp stores write 32 bytes
  into each of 8 rows.

``PDL``: the kernel waits for the kernel before (``griddepcontrol.wait``) before its first read, then lets the
next kernel (the merge) launch. Partials have the Triton split kernel's format (in q's dtype), so its merge kernel
combines them. NVIDIA sm_90 only, 16-bit dtypes only.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

__all__ = ["BLOCK_M", "BLOCK_N", "NUM_WARPS", "gather_step", "issue_first_tiles", "load_query_tile",
           "lse_from_base2", "mla_decode_gluon_split_kernel", "online_softmax_step", "program_range", "staging_buffer",
           "start_pipeline", "store_rows_coalesced"]

BLOCK_M = 64  # folded rows per program (one warpgroup's wgmma M)
BLOCK_N = 64  # cache rows (tokens) per tile
NUM_WARPS = 8  # two warpgroups


# A CTA-wide barrier: gl.thread_barrier in Triton 3.6 (the GPU machine's), gl.barrier in 3.7
_cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier


@gluon.jit
def _gather_tile(k_lat_buf, k_rope_buf, KV, idx, ok, stride_kv, D_LATENT: gl.constexpr, D_ROPE: gl.constexpr,
                 GATHER: gl.constexpr):
    """Issue the cp.async copies of one tile: rows ``idx`` (where ``ok``; zero-filled elsewhere) of the cache into
    the latent and rope buffers. 16-byte copies: each thread moves 8 contiguous values of one row."""
    d_lat = gl.arange(0, D_LATENT, layout=gl.SliceLayout(0, GATHER))
    d_rope = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, GATHER))
    row = KV + idx.to(gl.int64)[:, None] * stride_kv
    cp.async_copy_global_to_shared(k_lat_buf, row + d_lat[None, :], mask=ok[:, None])
    cp.async_copy_global_to_shared(k_rope_buf, row + D_LATENT + d_rope[None, :], mask=ok[:, None])


@gluon.jit
def issue_first_tiles(k_lat_s, k_rope_s, KV, KV_INDICES, kv_start, k_lo, k_hi, stride_kv, BN: gl.constexpr,
                      NBUF: gl.constexpr, D_LATENT: gl.constexpr, D_ROPE: gl.constexpr, GATHER: gl.constexpr):
    """The start of the gather pipeline: the copies of tiles 0 .. NBUF-2 of this split (``k_lo .. k_hi`` of the
    request's tokens from ``kv_start``) into buffers 0 .. NBUF-2, one ``cp.async`` group each, and the indices of
    tile NBUF-1. Returns ``(t_off, idx)``: the token offsets of a tile (``arange(BN)``) and those indices."""
    t_off = gl.arange(0, BN, layout=gl.SliceLayout(1, GATHER))
    for j in gl.static_range(NBUF - 1):
        cols_j = k_lo + j * BN + t_off
        ok_j = cols_j < k_hi
        idx_j = gl.load(KV_INDICES + kv_start + cols_j, mask=ok_j, other=0)
        _gather_tile(k_lat_s.index(j), k_rope_s.index(j), KV, idx_j, ok_j, stride_kv, D_LATENT, D_ROPE, GATHER)
        cp.commit_group()
    cols1 = k_lo + (NBUF - 1) * BN + t_off
    return t_off, gl.load(KV_INDICES + kv_start + cols1, mask=cols1 < k_hi, other=0)


@gluon.jit
def load_query_tile(q_lat_s, q_rope_s, Q, q_start, row0, n_rows, BM: gl.constexpr, NUM_HEADS: gl.constexpr,
                    D_LATENT: gl.constexpr, D_ROPE: gl.constexpr, GATHER: gl.constexpr):
    """Issue the cp.async copies of the query tile: rows ``q_start * H + row0 + r`` (``r < BM``; zero-filled from
    ``n_rows`` on) of the folded q into the latent and rope buffers. No commit: the first tile's group takes them."""
    g_rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, GATHER))
    g_row_ok = g_rows < n_rows
    q_base = Q + (q_start * NUM_HEADS + g_rows).to(gl.int64)[:, None] * (D_LATENT + D_ROPE)
    d_lat_g = gl.arange(0, D_LATENT, layout=gl.SliceLayout(0, GATHER))
    d_rope_g = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, GATHER))
    cp.async_copy_global_to_shared(q_lat_s, q_base + d_lat_g[None, :], mask=g_row_ok[:, None])
    cp.async_copy_global_to_shared(q_rope_s, q_base + D_LATENT + d_rope_g[None, :], mask=g_row_ok[:, None])


@gluon.jit
def start_pipeline(Q, KV, KV_INDICES, q_start, kv_start, k_lo, k_hi, row0, n_rows, stride_kv, BM: gl.constexpr,
                   BN: gl.constexpr, NBUF: gl.constexpr, NUM_HEADS: gl.constexpr, D_LATENT: gl.constexpr,
                   D_ROPE: gl.constexpr, GATHER: gl.constexpr):
    """The shared memory of a gluon split program and the start of its pipeline: the query tile (``BM`` rows from
    ``row0``, :func:`load_query_tile`) and ``NBUF`` tile buffers of ``BN`` cache rows (128-byte swizzled, as wgmma
    reads them), the copies of the query and the first tiles, the indices of the next (:func:`issue_first_tiles`).
    Returns ``(q_lat_s, q_rope_s, k_lat_s, k_rope_s, t_off, idx)``."""
    dtype: gl.constexpr = Q.dtype.element_ty
    q_lat_s = gl.allocate_shared_memory(dtype, [BM, D_LATENT], gl.NVMMASharedLayout.get_default_for([BM, D_LATENT],
                                                                                                     dtype))
    q_rope_s = gl.allocate_shared_memory(dtype, [BM, D_ROPE], gl.NVMMASharedLayout.get_default_for([BM, D_ROPE], dtype))
    k_lat_s = gl.allocate_shared_memory(dtype, [NBUF, BN, D_LATENT],
                                        gl.NVMMASharedLayout.get_default_for([BN, D_LATENT], dtype))
    k_rope_s = gl.allocate_shared_memory(dtype, [NBUF, BN, D_ROPE],
                                         gl.NVMMASharedLayout.get_default_for([BN, D_ROPE], dtype))
    load_query_tile(q_lat_s, q_rope_s, Q, q_start, row0, n_rows, BM, NUM_HEADS, D_LATENT, D_ROPE, GATHER)
    t_off, idx = issue_first_tiles(k_lat_s, k_rope_s, KV, KV_INDICES, kv_start, k_lo, k_hi, stride_kv, BN, NBUF,
                                   D_LATENT, D_ROPE, GATHER)
    return q_lat_s, q_rope_s, k_lat_s, k_rope_s, t_off, idx


@gluon.jit
def gather_step(k_lat_s, k_rope_s, KV, KV_INDICES, kv_start, k_lo, k_hi, i, t_off, idx, stride_kv,
                BN: gl.constexpr, NBUF: gl.constexpr, D_LATENT: gl.constexpr, D_ROPE: gl.constexpr,
                GATHER: gl.constexpr):
    """The top of iteration ``i`` of the gather pipeline that :func:`issue_first_tiles` started. Once every warp is
    done with tile ``i - 1`` (a barrier; the caller has waited for its reads), its buffer takes the copies of tile
    ``i + NBUF - 1`` (rows ``idx``, one group), the indices of the tile after are loaded, and this thread waits for
    tile ``i``'s copies (``NBUF - 1`` groups stay in flight), then every thread (a barrier). Returns the new indices.
    A caller whose reads go through the async proxy (``wgmma``) still needs ``fence_async_shared()``."""
    _cta_barrier()
    nxt = (i + NBUF - 1) % NBUF
    cols_n = k_lo + (i + NBUF - 1) * BN + t_off
    _gather_tile(k_lat_s.index(nxt), k_rope_s.index(nxt), KV, idx, cols_n < k_hi, stride_kv, D_LATENT, D_ROPE, GATHER)
    cp.commit_group()
    cols_nn = cols_n + BN
    idx = gl.load(KV_INDICES + kv_start + cols_nn, mask=cols_nn < k_hi, other=0)
    cp.wait_group(NBUF - 1)  # this thread's copies of tile i (and of q) have landed; NBUF - 1 stay in flight
    _cta_barrier()  # ... and every other thread's
    return idx


@gluon.jit
def program_range(QO_INDPTR, KV_INDPTR, req, pid_s, num_splits, NUM_HEADS: gl.constexpr, BN: gl.constexpr,
                  PDL: gl.constexpr):
    """The prologue the gluon split kernels share: the PDL wait (nothing before it reads memory) and trigger,
    then request ``req``'s query and key ranges and this split's tokens (in whole tiles of BN): returns
    ``(q_start, s_q, kv_start, s_k, n_rows, k_lo, k_hi, n_tiles)``."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
    q_start = gl.load(QO_INDPTR + req)
    s_q = gl.load(QO_INDPTR + req + 1) - q_start
    kv_start = gl.load(KV_INDPTR + req)
    s_k = gl.load(KV_INDPTR + req + 1) - kv_start
    chunk = gl.cdiv(gl.cdiv(s_k, num_splits), BN) * BN
    k_lo = pid_s * chunk
    k_hi = gl.minimum(k_lo + chunk, s_k)
    n_tiles = gl.maximum(gl.cdiv(k_hi - k_lo, BN), 0)
    return q_start, s_q, kv_start, s_k, s_q * NUM_HEADS, k_lo, k_hi, n_tiles


@gluon.jit
def lse_from_base2(m, l):
    """The natural-log LSE of rows whose running max ``m`` and sum ``l`` are in base 2 (``exp2``); -inf for a row
    that saw no key (``l == 0``); NaN where the sum is NaN (a NaN score, as the golden's logsumexp gives)."""
    has = l > 0.0
    return gl.where(has, (m + gl.log2(gl.where(has, l, 1.0))) * 0.6931471805599453,
                    gl.where(l == l, float("-inf"), float("nan")))


@gluon.jit
def online_softmax_step(s, cols, k_hi, limit, qk_scale, m_prev, l_prev):
    """One tile of the online softmax (base 2): mask keys past the split (``cols >= k_hi``) or past a row's causal
    limit, scale, and update the running max and sum. Returns ``(p, m_new, alpha, l_new)``, ``alpha`` the factor
    for what was accumulated before; rows that saw no key yet keep max -inf, sum 0 and ``alpha`` 0."""
    visible = (cols[None, :] < k_hi) & (cols[None, :] <= limit[:, None])
    s = gl.where(visible, s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_prev, gl.max(s, axis=1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s - m_safe[:, None])
    alpha = gl.exp2(m_prev - m_safe)
    return p, m_new, alpha, l_prev * alpha + gl.sum(p, axis=1)


@gluon.jit
def mla_decode_gluon_split_kernel(
    Q,  # (total_q * H, 576) 16-bit, folded rows
    KV,  # (num_rows, 576) cache rows, stride stride_kv
    KV_INDICES,  # (sum(seq_lens),) int32
    QO_INDPTR,  # (B + 1,) int32
    KV_INDPTR,  # (B + 1,) int32
    OUT,  # DIRECT: (total_q * H, 512) q.dtype; else (num_splits, total_rows, 512) partials in q.dtype
    LSE,  # DIRECT: (total_q * H,) fp32; else (num_splits, total_rows) fp32
    stride_kv,
    total_rows,
    qk_scale,  # sm_scale * log2(e)
    num_splits,
    NUM_HEADS: gl.constexpr,
    DIRECT: gl.constexpr,  # one split: write the final output
    D_LATENT: gl.constexpr,
    D_ROPE: gl.constexpr,
    PDL: gl.constexpr = False,  # launched with PDL: wait for the kernel before (griddepcontrol.wait) before the
    #                             first read, then let the next kernel (the merge) launch early
):
    BM: gl.constexpr = 64
    BN: gl.constexpr = 64  # cache rows (tokens) per tile
    NBUF: gl.constexpr = 2  # tile buffers: the copies of tile i + 1 are in flight during tile i's math
    NUM_WARPS_C: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = Q.dtype.element_ty
    # register layouts: the gather (16-byte vectors, 8 warps cover 32 rows x 64 columns per step) and the two
    # wgmma accumulators, split between the warpgroups along N (S: BN / 2 tokens each; O: 256 columns each)
    GATHER: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, BN // 2, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)

    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    req = gl.program_id(2)
    q_start, s_q, kv_start, s_k, n_rows, k_lo, k_hi, n_tiles = program_range(QO_INDPTR, KV_INDPTR, req, pid_s,
                                                                              num_splits, NUM_HEADS, BN, PDL)
    if pid_m * BM < n_rows:
        # the query tile (rows q_start * H + pid_m * 64 + r of the folded q), the copies of tile 0 (one group, the
        # query in it) and the indices of tile 1
        q_lat_s, q_rope_s, k_lat_s, k_rope_s, t_off, idx1 = start_pipeline(
            Q, KV, KV_INDICES, q_start, kv_start, k_lo, k_hi, pid_m * BM, n_rows, stride_kv, BM, BN, NBUF, NUM_HEADS,
            D_LATENT, D_ROPE, GATHER)

        # softmax state in the S layout's rows; the output accumulator in O's layout
        s_rows = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, S_L))
        limit = s_k - s_q + s_rows // NUM_HEADS  # bottom-right causal: key t is visible to its row if t <= limit
        s_cols = gl.arange(0, BN, layout=gl.SliceLayout(0, S_L))
        m_i = gl.full([BM], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_L))
        l_i = gl.zeros([BM], gl.float32, layout=gl.SliceLayout(1, S_L))
        acc = gl.zeros([BM, D_LATENT], gl.float32, layout=O_L)
        s_zero = gl.zeros([BM, BN], gl.float32, layout=S_L)

        for i in range(n_tiles):
            buf = i % NBUF
            # tile i-1's wgmma work was waited for at the end of the last iteration: its buffer,
            # (i + NBUF - 1) % NBUF, takes tile i + NBUF - 1; then tile i has landed
            idx1 = gather_step(k_lat_s, k_rope_s, KV, KV_INDICES, kv_start, k_lo, k_hi, i, t_off, idx1, stride_kv, BN,
                               NBUF, D_LATENT, D_ROPE, GATHER)
            fence_async_shared()  # cp.async wrote through the generic proxy; wgmma reads through the async one

            k_lat = k_lat_s.index(buf)
            s = warpgroup_mma(q_lat_s, k_lat.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma(q_rope_s, k_rope_s.index(buf).permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))

            p, m_i, alpha, l_i = online_softmax_step(s, k_lo + i * BN + s_cols, k_hi, limit, qk_scale, m_i, l_i)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
            p_op = gl.convert_layout(p.to(dtype), P_L)
            acc = warpgroup_mma(p_op, k_lat, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        cp.wait_group(0)  # the last, empty or masked, group

        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, O_L))
        has = l_o > 0.0
        out = acc / gl.where(has, l_o, 1.0)[:, None]
        lse_s = lse_from_base2(m_i, l_i)
        grow_s = (q_start * NUM_HEADS + s_rows).to(gl.int64)
        s_ok = s_rows < n_rows
        _cta_barrier()  # every thread's copies have landed (wait_group(0)) and its wgmma reads are done
        if DIRECT:
            store_rows_coalesced(OUT, staging_buffer(k_lat_s, OUT.dtype.element_ty, BM, D_LATENT), out,
                                 q_start * NUM_HEADS + pid_m * BM, n_rows - pid_m * BM, 0, BM, D_LATENT, NUM_WARPS_C)
            gl.store(LSE + grow_s, lse_s, mask=s_ok)
        else:
            base = pid_s.to(gl.int64) * total_rows
            store_rows_coalesced(OUT, staging_buffer(k_lat_s, OUT.dtype.element_ty, BM, D_LATENT), out,
                                 base + q_start * NUM_HEADS + pid_m * BM, n_rows - pid_m * BM, 0, BM, D_LATENT,
                                 NUM_WARPS_C)
            gl.store(LSE + base + grow_s, lse_s, mask=s_ok)


@gluon.jit
def store_rows_coalesced(PTR, stage, vals, row_start, n_valid, col0, BM: gl.constexpr, WIDTH: gl.constexpr,
                         NUM_WARPS: gl.constexpr):
    """Store the (BM, WIDTH) tile ``vals`` (any register layout) at rows ``row_start + r`` (only ``r < n_valid``),
    columns ``col0 ..`` of the row-major (rows, 512) tensor ``PTR``, through the idle shared buffer ``stage``
    ((BM, WIDTH), PTR's dtype): read back row-major, each thread 16 contiguous bytes, so a warp's store covers
    512 contiguous bytes of one row, not 32 bytes in each of 8 rows as from a wgmma accumulator. The caller makes
    sure no thread still reads ``stage`` (copies landed, wgmma reads done) before the call."""
    dtype: gl.constexpr = PTR.dtype.element_ty
    VEC: gl.constexpr = 128 // dtype.primitive_bitwidth  # 16 bytes per thread
    stage.store(vals.to(dtype))
    _cta_barrier()  # every thread's part is in shared memory
    ROW_L: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [NUM_WARPS, 1], [1, 0])
    v = stage.load(ROW_L)
    r = gl.arange(0, BM, layout=gl.SliceLayout(1, ROW_L))
    c = col0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, ROW_L))
    gl.store(PTR + (row_start + r).to(gl.int64)[:, None] * 512 + c[None, :], v, mask=(r < n_valid)[:, None])


@gluon.jit
def staging_buffer(buf, dtype: gl.constexpr, BM: gl.constexpr, WIDTH: gl.constexpr):
    """The idle tile buffers ``buf`` viewed as a (BM, WIDTH) tile of the 16-bit ``dtype`` for
    :func:`store_rows_coalesced` (the default 128-byte swizzle: the accumulator's stores into it are free of bank
    conflicts). The Gluon kernels keep their partials in q's 16-bit dtype: half the bytes of fp32 partials; the
    merge is a convex combination, so this adds at most one rounding of the largest partial."""
    return buf._reinterpret(dtype, [BM, WIDTH], gl.NVMMASharedLayout.get_default_for([BM, WIDTH], dtype))
