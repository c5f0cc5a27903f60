"""A Gluon split kernel for memory-bound MLA decode with few rows per request (16 heads x qlen 1 or 2), Hopper only.

A Triton tile of 16 rows x 64 tokens on 8 warps (``mma.sync``) reads about 300 KB of shared memory per tile with
``ldmatrix``, half of it the 16-row query, which every one of the 8 warps reloads for its 8 tokens. This kernel puts
the tokens where ``wgmma`` wants its 64 rows instead (``swap AB``):

* ``S^T = K q^T``: A is the tile of 64 cache rows (tokens x 576, straight from the gather buffer), B the query
  (rows x 576; N = 16 or 32 folded rows). One warpgroup reads the tile and the query once each;
* ``O^T += V^T P^T``: A is the same buffer's first 512 columns read transposed (``wgmma`` takes 16-bit A in
  either major order from shared memory), B the 64 x rows probabilities, stored to a 2 KB shared buffer;
* the online softmax runs along the tokens (axis 0 of ``S^T``), the output accumulator is ``(512, rows)``.

About 170 KB of shared-memory reads per tile instead of about 300 KB, on 4 warps (one warpgroup: the M of both
products is a multiple of 64; on one warpgroup a ``(512, 64)`` fp32 accumulator would need 256 registers per
thread, so 64 rows go to :mod:`workbench.mla.gluon`). The gather pipeline (``cp.async`` rows by index, zero-filled
past the end, two tile buffers, indices one tile ahead) and the prologue are :mod:`workbench.mla.gluon`'s. The
output or partial leaves row-major in 16-byte vectors through the idle tile buffers; partials have the Triton
split kernel's format, so its merge kernel combines them. NVIDIA sm_90 only, 16-bit dtypes only.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from workbench.mla.gluon import (_cta_barrier, gather_step, lse_from_base2, program_range, staging_buffer,
                                  start_pipeline, store_rows_coalesced)

__all__ = ["BLOCK_N", "NUM_BUFFERS", "NUM_WARPS", "ROW_BLOCKS", "mla_decode_gluon_swap_kernel"]

BLOCK_N = 64  # cache rows (tokens) per tile: wgmma's M
NUM_BUFFERS = 2  # tile buffers (a third does not fit beside the query: 3 x 73.7 KB + 18.4 KB > 227 KB)
ROW_BLOCKS = (16, 32)  # folded rows per program (wgmma's N)
NUM_WARPS = 4  # one warpgroup


@gluon.jit
def _softmax_step_t(s, cols, k_hi, limit, qk_scale, m_prev, l_prev):
    """:func:`workbench.mla_gluon.online_softmax_step` for a transposed ``(tokens, rows)`` tile: keys along
    axis 0. Returns ``(p, m_new, alpha, l_new)``; rows that saw no key yet keep max -inf, sum 0, ``alpha`` 0."""
    visible = (cols[:, None] < k_hi) & (cols[:, None] <= limit[None, :])
    s = gl.where(visible, s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_prev, gl.max(s, axis=0))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s - m_safe[None, :])
    alpha = gl.exp2(m_prev - m_safe)
    return p, m_new, alpha, l_prev * alpha + gl.sum(p, axis=0)


@gluon.jit
def mla_decode_gluon_swap_kernel(
    Q,  # (total_q * H, 576) 16-bit, folded rows
    KV,  # (num_rows, 576) cache rows, stride stride_kv
    KV_INDICES,  # (sum(seq_lens),) int32
    QO_INDPTR,  # (B + 1,) int32
    KV_INDPTR,  # (B + 1,) int32
    OUT,  # DIRECT: (total_q * H, 512) q.dtype; else (num_splits, total_rows, 512) partials, fp32 or q.dtype
    LSE,  # DIRECT: (total_q * H,) fp32; else (num_splits, total_rows) fp32
    stride_kv,
    total_rows,
    qk_scale,  # sm_scale * log2(e)
    num_splits,
    NUM_HEADS: gl.constexpr,
    DIRECT: gl.constexpr,  # one split: write the final output
    D_LATENT: gl.constexpr,
    D_ROPE: gl.constexpr,
    PDL: gl.constexpr = False,  # launched with PDL: wait for the kernel before, then let the merge launch early
    BR: gl.constexpr = 16,  # folded rows per program: 16 or 32
):
    BN: gl.constexpr = 64
    NBUF: gl.constexpr = 2
    NUM_WARPS_C: gl.constexpr = gl.num_warps()
    gl.static_assert(NUM_WARPS_C == 4, "one warpgroup")
    dtype: gl.constexpr = Q.dtype.element_ty
    # the gather: 16-byte vectors, the warps cover 4 rows x 64 columns each per step; both accumulators, S^T
    # (64, BR) and O^T (512, BR), in the same wgmma layout (its row slices need no conversion): the warpgroup
    # reads the whole tile as A and q and P as B
    GATHER: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS_C, 1], [1, 0])
    ACC_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BR, 16])
    P_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BR], dtype)

    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    req = gl.program_id(2)
    q_start, s_q, kv_start, s_k, n_rows, k_lo, k_hi, n_tiles = program_range(QO_INDPTR, KV_INDPTR, req, pid_s,
                                                                              num_splits, NUM_HEADS, BN, PDL)
    if pid_m * BR < n_rows:
        # the query tile (rows q_start * H + pid_m * BR + r of the folded q, zero past the request's rows), the
        # copies of tile 0 (one group, the query in it) and the indices of tile 1; P's buffer
        q_lat_s, q_rope_s, k_lat_s, k_rope_s, t_off, idx1 = start_pipeline(
            Q, KV, KV_INDICES, q_start, kv_start, k_lo, k_hi, pid_m * BR, n_rows, stride_kv, BR, BN, NBUF, NUM_HEADS,
            D_LATENT, D_ROPE, GATHER)
        p_s = gl.allocate_shared_memory(dtype, [BN, BR], P_SL)

        # softmax state along the columns (rows of the request), the output accumulator transposed
        s_rows = pid_m * BR + gl.arange(0, BR, layout=gl.SliceLayout(0, ACC_L))
        limit = s_k - s_q + s_rows // NUM_HEADS  # bottom-right causal: key t is visible to its row if t <= limit
        s_cols = gl.arange(0, BN, layout=gl.SliceLayout(1, ACC_L))
        m_i = gl.full([BR], float("-inf"), gl.float32, layout=gl.SliceLayout(0, ACC_L))
        l_i = gl.zeros([BR], gl.float32, layout=gl.SliceLayout(0, ACC_L))
        acc = gl.zeros([D_LATENT, BR], gl.float32, layout=ACC_L)
        s_zero = gl.zeros([BN, BR], gl.float32, layout=ACC_L)

        for i in range(n_tiles):
            buf = i % NBUF
            # tile i-1's wgmma work was waited for at the end of the last iteration: its buffer takes tile i + 1;
            # then tile i has landed
            idx1 = gather_step(k_lat_s, k_rope_s, KV, KV_INDICES, kv_start, k_lo, k_hi, i, t_off, idx1, stride_kv, BN,
                               NBUF, D_LATENT, D_ROPE, GATHER)
            fence_async_shared()  # cp.async wrote through the generic proxy; wgmma reads through the async one

            k_lat = k_lat_s.index(buf)
            s = warpgroup_mma(k_lat, q_lat_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma(k_rope_s.index(buf), q_rope_s.permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))

            p, m_i, alpha, l_i = _softmax_step_t(s, k_lo + i * BN + s_cols, k_hi, limit, qk_scale, m_i, l_i)
            acc = acc * alpha[None, :]
            p_s.store(p.to(dtype))
            fence_async_shared()  # the generic-proxy stores of P, before wgmma reads them through the async proxy
            _cta_barrier()  # ... by every warp
            acc = warpgroup_mma(k_lat.permute((1, 0)), p_s, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        cp.wait_group(0)  # the last, empty or masked, group

        has = l_i > 0.0
        out = acc / gl.where(has, l_i, 1.0)[None, :]
        lse = lse_from_base2(m_i, l_i)
        base = pid_s.to(gl.int64) * total_rows  # 0 when DIRECT (one split)
        # the output (rows, 512) leaves row-major in 16-byte vectors through the idle tile buffers (every copy has
        # landed, every wgmma was waited for; the barrier covers the other threads)
        _cta_barrier()
        store_rows_coalesced(OUT, staging_buffer(k_lat_s, OUT.dtype.element_ty, BR, D_LATENT), gl.permute(out, (1, 0)),
                             base + q_start * NUM_HEADS + pid_m * BR, n_rows - pid_m * BR, 0, BR, D_LATENT,
                             NUM_WARPS_C)
        grow_s = (q_start * NUM_HEADS + s_rows).to(gl.int64)
        gl.store(LSE + base + grow_s, lse, mask=s_rows < n_rows)
