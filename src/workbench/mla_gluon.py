"""A Gluon split kernel for the compute-bound MLA decode (64 folded rows per program), Hopper only.

Chapter 3 found why the Triton kernel stops near 230 TFLOP/s at 128 heads: Triton's pipeliner issues the
copies of tile ``i+1`` only after the math of tile ``i`` (its loop is ``wait:0 dot ... dot copy copy``), and a
third 73.7 KB buffer, which would let them start earlier, does not fit beside the 73.7 KB query tile. With two
buffers the copies of tile ``i+1`` can still start *before* the math of tile ``i``: the buffer they overwrite held
tile ``i-1``, which is finished by then. Triton's language cannot say that order; Gluon (Triton's lower-level
language: explicit layouts, shared-memory buffers, ``cp.async`` groups and ``wgmma``) can. This module writes
that schedule and nothing else:

* one program: 64 folded rows (query position x head) of one request, one split of its tokens; 8 warps
  (two warpgroups, each owning half of the 512 output columns);
* shared memory: the query tile (latent and rope parts) and two buffers of 64 cache rows, 216 KB;
* per tile: wait for the wgmma work of the last tile, issue the gather of tile ``i+1`` (``cp.async``, rows by
  index, zero-filled past the end), load the indices of tile ``i+2`` into registers, wait for tile ``i``'s
  copies, ``S = q_lat k_lat^T + q_rope k_rope^T`` on ``wgmma``, the online softmax in registers, ``O += P V``
  with ``P`` from registers and ``V`` the first 512 columns of the same buffer.

The partial outputs have the Triton split kernel's format, so :func:`workbench.mla.mla_decode_triton`'s
merge kernel combines them. NVIDIA sm_90 only, 16-bit dtypes only; chosen by ``TritonConfig(gluon=True)``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

__all__ = ["BLOCK_M", "BLOCK_N", "NUM_WARPS", "mla_decode_gluon_split_kernel"]

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
def mla_decode_gluon_split_kernel(
    Q,  # (total_q * H, 576) 16-bit, folded rows
    KV,  # (num_rows, 576) cache rows, stride stride_kv
    KV_INDICES,  # (sum(seq_lens),) int32
    QO_INDPTR,  # (B + 1,) int32
    KV_INDPTR,  # (B + 1,) int32
    OUT,  # DIRECT: (total_q * H, 512) q.dtype; else (num_splits, total_rows, 512) fp32 partials
    LSE,  # DIRECT: (total_q * H,) fp32; else (num_splits, total_rows) fp32
    stride_kv,
    total_rows,
    qk_scale,  # sm_scale * log2(e)
    num_splits,
    NUM_HEADS: gl.constexpr,
    DIRECT: gl.constexpr,  # one split: write the final output
    D_LATENT: gl.constexpr,
    D_ROPE: gl.constexpr,
):
    BM: gl.constexpr = 64
    BN: gl.constexpr = 64
    dtype: gl.constexpr = Q.dtype.element_ty
    # register layouts: the gather (16-byte vectors, 8 warps cover 32 rows x 64 columns per step) and the two
    # wgmma accumulators, split between the warpgroups along N (S: 32 tokens each; O: 256 columns each)
    GATHER: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    LAT_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D_LATENT], dtype)
    ROPE_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D_ROPE], dtype)

    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    req = gl.program_id(2)
    q_start = gl.load(QO_INDPTR + req)
    s_q = gl.load(QO_INDPTR + req + 1) - q_start
    kv_start = gl.load(KV_INDPTR + req)
    s_k = gl.load(KV_INDPTR + req + 1) - kv_start
    n_rows = s_q * NUM_HEADS
    if pid_m * BM < n_rows:
        chunk = gl.cdiv(gl.cdiv(s_k, num_splits), BN) * BN
        k_lo = pid_s * chunk
        k_hi = gl.minimum(k_lo + chunk, s_k)
        n_tiles = gl.maximum(gl.cdiv(k_hi - k_lo, BN), 0)

        q_lat_s = gl.allocate_shared_memory(dtype, [BM, D_LATENT], LAT_SL)
        q_rope_s = gl.allocate_shared_memory(dtype, [BM, D_ROPE], ROPE_SL)
        k_lat_s = gl.allocate_shared_memory(dtype, [2, BN, D_LATENT], LAT_SL)
        k_rope_s = gl.allocate_shared_memory(dtype, [2, BN, D_ROPE], ROPE_SL)

        # the query tile: rows q_start * H + pid_m * 64 + r of the folded q
        g_rows = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, GATHER))
        g_row_ok = g_rows < n_rows
        q_base = Q + (q_start * NUM_HEADS + g_rows).to(gl.int64)[:, None] * (D_LATENT + D_ROPE)
        d_lat_g = gl.arange(0, D_LATENT, layout=gl.SliceLayout(0, GATHER))
        d_rope_g = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, GATHER))
        cp.async_copy_global_to_shared(q_lat_s, q_base + d_lat_g[None, :], mask=g_row_ok[:, None])
        cp.async_copy_global_to_shared(q_rope_s, q_base + D_LATENT + d_rope_g[None, :], mask=g_row_ok[:, None])

        # tile 0, and the indices of tile 1
        t_off = gl.arange(0, BN, layout=gl.SliceLayout(1, GATHER))
        cols0 = k_lo + t_off
        ok0 = cols0 < k_hi
        idx0 = gl.load(KV_INDICES + kv_start + cols0, mask=ok0, other=0)
        _gather_tile(k_lat_s.index(0), k_rope_s.index(0), KV, idx0, ok0, stride_kv, D_LATENT, D_ROPE, GATHER)
        cp.commit_group()
        cols1 = k_lo + BN + t_off
        ok1 = cols1 < k_hi
        idx1 = gl.load(KV_INDICES + kv_start + cols1, mask=ok1, other=0)

        # softmax state in the S layout's rows; the output accumulator in O's layout
        s_rows = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, S_L))
        limit = s_k - s_q + s_rows // NUM_HEADS  # bottom-right causal: key t is visible to its row if t <= limit
        s_cols = gl.arange(0, BN, layout=gl.SliceLayout(0, S_L))
        m_i = gl.full([BM], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_L))
        l_i = gl.zeros([BM], gl.float32, layout=gl.SliceLayout(1, S_L))
        acc = gl.zeros([BM, D_LATENT], gl.float32, layout=O_L)
        s_zero = gl.zeros([BM, BN], gl.float32, layout=S_L)

        for i in range(n_tiles):
            buf = i % 2
            # every warp is done with tile i-1 (its wgmma work was waited for at the end of the last iteration):
            # its buffer, (i+1) % 2, can take tile i+1
            _cta_barrier()
            cols_n = k_lo + (i + 1) * BN + t_off
            ok_n = cols_n < k_hi
            _gather_tile(k_lat_s.index(1 - buf), k_rope_s.index(1 - buf), KV, idx1, ok_n, stride_kv, D_LATENT,
                         D_ROPE, GATHER)
            cp.commit_group()
            cols_nn = k_lo + (i + 2) * BN + t_off
            idx1 = gl.load(KV_INDICES + kv_start + cols_nn, mask=cols_nn < k_hi, other=0)
            cp.wait_group(1)  # this thread's copies of tile i (and of q) have landed; tile i+1 stays in flight
            _cta_barrier()  # ... and every other thread's
            fence_async_shared()  # cp.async wrote through the generic proxy; wgmma reads through the async one

            k_lat = k_lat_s.index(buf)
            s = warpgroup_mma(q_lat_s, k_lat.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma(q_rope_s, k_rope_s.index(buf).permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))

            cols = k_lo + i * BN + s_cols
            visible = (cols[None, :] < k_hi) & (cols[None, :] <= limit[:, None])
            s = gl.where(visible, s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            p = gl.exp2(s - m_safe[:, None])
            alpha = gl.exp2(m_i - m_safe)
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
            p_op = gl.convert_layout(p.to(dtype), P_L)
            acc = warpgroup_mma(p_op, k_lat, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        cp.wait_group(0)  # the last, empty or masked, group

        o_rows = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, O_L))
        o_ok = o_rows < n_rows
        d_o = gl.arange(0, D_LATENT, layout=gl.SliceLayout(0, O_L))
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, O_L))
        has = l_o > 0.0
        out = acc / gl.where(has, l_o, 1.0)[:, None]
        lse_s = gl.where(l_i > 0.0, (m_i + gl.log2(gl.where(l_i > 0.0, l_i, 1.0))) * 0.6931471805599453,
                         float("-inf"))
        grow = (q_start * NUM_HEADS + o_rows).to(gl.int64)
        grow_s = (q_start * NUM_HEADS + s_rows).to(gl.int64)
        s_ok = s_rows < n_rows
        if DIRECT:
            gl.store(OUT + grow[:, None] * D_LATENT + d_o[None, :], out.to(OUT.dtype.element_ty), mask=o_ok[:, None])
            gl.store(LSE + grow_s, lse_s, mask=s_ok)
        else:
            base = pid_s.to(gl.int64) * total_rows
            gl.store(OUT + (base + grow)[:, None] * D_LATENT + d_o[None, :], out, mask=o_ok[:, None])
            gl.store(LSE + base + grow_s, lse_s, mask=s_ok)
