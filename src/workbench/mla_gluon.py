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

Two launch modes on top (round 21, chapter 3): ``PDL`` (wait for the kernel before, then let the merge launch),
and ``CLUSTER`` (``TritonConfig(cluster_merge=True)``): the 2, 4 or 8 splits of a row block run as one
thread-block cluster, store their partials, meet at a cluster barrier and each merge a slice of the columns, so
no second kernel runs. :func:`launch_clustered` launches that only when all the clusters fit on the GPU at once.

``COALESCED_STORE`` (round 32, with 16-bit partials the library's default for both gluon kernels): the output or
partial is staged in the idle tile buffers and stored row-major in 16-byte vectors (:func:`store_rows_coalesced`),
not from the ``wgmma`` accumulator layout, whose warp stores write 32 bytes into each of 8 rows.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma, warpgroup_mma, warpgroup_mma_wait

__all__ = ["BLOCK_M", "BLOCK_N", "CLUSTER_SPLITS", "NUM_WARPS", "PARTIAL_LAYOUT", "cluster_capacity",
           "cluster_merge_layout", "gather_step", "globaltimer", "issue_first_tiles", "launch_clustered",
           "load_query_tile", "lse_from_base2", "mla_decode_gluon_split_kernel", "partial_descriptor",
           "staging_buffer", "start_pipeline", "store_rows_coalesced"]

BLOCK_M = 64  # folded rows per program (one warpgroup's wgmma M)
BLOCK_N = 64  # cache rows (tokens) per tile
NUM_WARPS = 8  # two warpgroups

CLUSTER_SPLITS = (2, 4, 8)  # split counts that can merge inside a thread-block cluster (8: CUDA's portable limit)

# The shared-memory layout of one program's (64, 512) fp32 partial on its way out by TMA: 128-byte swizzle, so the
# accumulator's register-to-shared store is free of bank conflicts; the TMA writes it in boxes of 64 x 32 values
PARTIAL_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)


def partial_descriptor(mid_o):
    """The TMA descriptor of the partials ``mid_o`` ``(num_splits, total_rows, 512)`` fp32 for the split kernel's
    ``TMA_STORE``: a 2-D view ``(num_splits * total_rows, 512)`` written in blocks of one program's 64 rows."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if mid_o.dim() != 3 or mid_o.shape[2] != 512 or not mid_o.is_contiguous():
        raise ValueError(f"mid_o must be a contiguous (num_splits, total_rows, 512) tensor, got shape "
                         f"{tuple(mid_o.shape)} with strides {mid_o.stride()}")
    flat = mid_o.view(-1, 512)
    return TensorDescriptor(flat, list(flat.shape), [512, 1], [BLOCK_M, 512], PARTIAL_LAYOUT)


def cluster_merge_layout(splits: int, num_warps: int = NUM_WARPS) -> gl.BlockedLayout:
    """The register layout of the in-cluster merge's ``(splits, 64 rows, 512 / splits columns)`` partial slice:
    16-byte vectors along the columns, the warps along the rows, so that the sum over splits stays in a thread."""
    if splits not in CLUSTER_SPLITS:
        raise ValueError(f"splits is {splits}; a cluster merge takes one of {CLUSTER_SPLITS}")
    tc = min(32, 512 // splits // 4)  # threads along the columns
    return gl.BlockedLayout([1, 1, 4], [1, 32 // tc, tc], [1, num_warps, 1], [2, 1, 0])


@gluon.jit
def _cluster_barrier(NUM_THREADS: gl.constexpr):
    """Every thread of every CTA of this thread-block cluster arrives (release: its global stores are ordered
    before) and waits (acquire: stores the others made before arriving are visible after). One element per
    thread, so each thread runs the asm once (``.aligned``: all threads of a warp execute it together)."""
    one: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_THREADS // 32], [0])
    x = gl.arange(0, NUM_THREADS, layout=one)
    gl.inline_asm_elementwise(
        "barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n\tmov.b32 $0, $1;",
        "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


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
def globaltimer():
    """The GPU's nanosecond timer (PTX ``%globaltimer``)."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def program_range(QO_INDPTR, KV_INDPTR, req, pid_s, num_splits, NUM_HEADS: gl.constexpr, BN: gl.constexpr,
                  PDL: gl.constexpr, trace=None, TRACE: gl.constexpr = False):
    """The prologue the gluon split kernels share: the PDL wait (nothing before it reads memory) and trigger,
    then request ``req``'s query and key ranges and this split's tokens (in whole tiles of BN): returns
    ``(q_start, s_q, kv_start, s_k, n_rows, k_lo, k_hi, n_tiles)``. ``TRACE``: stores the SM id, the entry time
    and the time after the wait at ``trace[0..2]`` (the layout of :func:`workbench.mla.trace_buffers`)."""
    if TRACE:
        gl.store(trace + 1, globaltimer())
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
    if TRACE:
        sm = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=True, pack=1)
        gl.store(trace, sm.to(gl.int64))
        gl.store(trace + 2, globaltimer())
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
    that saw no key (``l == 0``)."""
    has = l > 0.0
    return gl.where(has, (m + gl.log2(gl.where(has, l, 1.0))) * 0.6931471805599453, float("-inf"))


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
def _cluster_merge(PART_O, PART_LSE, FINAL_O, FINAL_LSE, row0, n_valid, total_rows, pid_s, CLUSTER: gl.constexpr,
                   BM: gl.constexpr, D_LATENT: gl.constexpr, MERGE_L: gl.constexpr):
    """Merge columns ``pid_s * CW .. (pid_s + 1) * CW`` (CW = D_LATENT / CLUSTER) of rows ``row0 ..`` (``n_valid``
    of the BM are real) over the CLUSTER partials: the second-kernel merge's arithmetic, on one slice. The
    partial loads skip L1 (``.cg``): the other programs of the cluster wrote them from other SMs."""
    CW: gl.constexpr = D_LATENT // CLUSTER
    SR_L: gl.constexpr = gl.SliceLayout(2, MERGE_L)  # (splits, rows)
    sp = gl.arange(0, CLUSTER, layout=gl.SliceLayout(1, SR_L))
    r = gl.arange(0, BM, layout=gl.SliceLayout(0, SR_L))
    c = pid_s * CW + gl.arange(0, CW, layout=gl.SliceLayout(0, gl.SliceLayout(1, MERGE_L)))
    rows = (row0 + r).to(gl.int64)
    ok = r < n_valid
    slot = sp.to(gl.int64)[:, None] * total_rows + rows[None, :]  # (splits, rows): partial row of split s
    lse = gl.load(PART_LSE + slot, mask=ok[None, :], other=float("-inf"), cache_modifier=".cg")
    m = gl.max(lse, axis=0)
    m_safe = gl.where(m == float("-inf"), 0.0, m)
    w = gl.exp(lse - m_safe[None, :])  # 0 for a split that saw no key of the row
    denom = gl.sum(w, axis=0)
    parts = gl.load(PART_O + slot[:, :, None] * D_LATENT + c[None, None, :], mask=ok[None, :, None], other=0.0,
                    cache_modifier=".cg").to(gl.float32)
    acc = gl.sum(parts * w[:, :, None], axis=0)  # (rows, CW) in SliceLayout(0, MERGE_L)
    has = denom > 0.0
    safe = gl.where(has, denom, 1.0)
    O_SL: gl.constexpr = gl.SliceLayout(0, MERGE_L)
    rows_o = gl.convert_layout(rows, gl.SliceLayout(1, O_SL))
    ok_o = gl.convert_layout(ok, gl.SliceLayout(1, O_SL))
    c_o = gl.convert_layout(c, gl.SliceLayout(0, O_SL))
    out = acc / gl.convert_layout(safe, gl.SliceLayout(1, O_SL))[:, None]
    gl.store(FINAL_O + rows_o[:, None] * D_LATENT + c_o[None, :], out.to(FINAL_O.dtype.element_ty), mask=ok_o[:, None])
    if pid_s == 0:
        gl.store(FINAL_LSE + rows, gl.where(has, m_safe + gl.log(safe), float("-inf")), mask=ok)


@gluon.jit
def mla_decode_gluon_split_kernel(
    Q,  # (total_q * H, 576) 16-bit, folded rows
    KV,  # (num_rows, 576) cache rows, stride stride_kv
    KV_INDICES,  # (sum(seq_lens),) int32
    QO_INDPTR,  # (B + 1,) int32
    KV_INDPTR,  # (B + 1,) int32
    OUT,  # DIRECT: (total_q * H, 512) q.dtype; else (num_splits, total_rows, 512) partials, fp32 or q.dtype
    LSE,  # DIRECT: (total_q * H,) fp32; else (num_splits, total_rows) fp32
    FINAL_O,  # CLUSTER: (total_q * H, 512) q.dtype, the merged output (else unused)
    FINAL_LSE,  # CLUSTER: (total_q * H,) fp32 (else unused)
    stride_kv,
    total_rows,
    qk_scale,  # sm_scale * log2(e)
    num_splits,
    NUM_HEADS: gl.constexpr,
    DIRECT: gl.constexpr,  # one split: write the final output
    D_LATENT: gl.constexpr,
    D_ROPE: gl.constexpr,
    CLUSTER: gl.constexpr = 0,  # > 0: launched as clusters of CLUSTER = num_splits CTAs along axis 0 (the
    #                             splits of one row block), which merge their partials here; no second kernel
    MERGE_L: gl.constexpr = None,  # CLUSTER: cluster_merge_layout(CLUSTER)
    PDL: gl.constexpr = False,  # launched with PDL: wait for the kernel before (griddepcontrol.wait) before the
    #                             first read, then let the next kernel (the merge) launch early
    BN: gl.constexpr = 64,  # cache rows (tokens) per tile: 64, or 32 (with NBUF up to 4)
    NBUF: gl.constexpr = 2,  # tile buffers: the copies of NBUF - 1 tiles are in flight during a tile's math
    PART_DESC=None,  # TMA_STORE: partial_descriptor(OUT)
    TMA_STORE: gl.constexpr = False,  # partials (not DIRECT, not CLUSTER): a program whose 64 rows are all real
    #                                   stages its partial in the (then idle) tile buffers and writes it with
    #                                   one TMA store instead of 128 KB of register stores
    COALESCED_STORE: gl.constexpr = False,  # the output (DIRECT) or partial (not CLUSTER, not TMA_STORE) staged in
    #                                         the idle tile buffers and read back row-major, so each warp store
    #                                         writes 512 contiguous bytes (16-byte vectors) instead of 8 rows x
    #                                         32 bytes from the wgmma accumulator layout
):
    BM: gl.constexpr = 64
    NUM_WARPS_C: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = Q.dtype.element_ty
    # register layouts: the gather (16-byte vectors, 8 warps cover 32 rows x 64 columns per step) and the two
    # wgmma accumulators, split between the warpgroups along N (S: BN / 2 tokens each; O: 256 columns each)
    GATHER: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, BN // 2, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)

    if CLUSTER > 0:  # axis 0 holds row block x split; a cluster is the CLUSTER consecutive programs of a row block
        pid_m = gl.program_id(0) // CLUSTER
        pid_s = gl.program_id(0) % CLUSTER
    else:
        pid_m = gl.program_id(0)
        pid_s = gl.program_id(1)
    req = gl.program_id(2)
    q_start, s_q, kv_start, s_k, n_rows, k_lo, k_hi, n_tiles = program_range(QO_INDPTR, KV_INDPTR, req, pid_s,
                                                                              num_splits, NUM_HEADS, BN, PDL)
    if pid_m * BM < n_rows:
        # the query tile (rows q_start * H + pid_m * 64 + r of the folded q), the copies of tiles 0 .. NBUF-2 (one
        # group each, the query in the first) and the indices of tile NBUF-1
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

        o_rows = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, O_L))
        o_ok = o_rows < n_rows
        d_o = gl.arange(0, D_LATENT, layout=gl.SliceLayout(0, O_L))
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, O_L))
        has = l_o > 0.0
        out = acc / gl.where(has, l_o, 1.0)[:, None]
        lse_s = lse_from_base2(m_i, l_i)
        grow = (q_start * NUM_HEADS + o_rows).to(gl.int64)
        grow_s = (q_start * NUM_HEADS + s_rows).to(gl.int64)
        s_ok = s_rows < n_rows
        if DIRECT:
            if COALESCED_STORE:
                _cta_barrier()  # every thread's copies have landed and its wgmma reads are done
                store_rows_coalesced(OUT, staging_buffer(k_lat_s, OUT.dtype.element_ty, BM, D_LATENT), out,
                                     q_start * NUM_HEADS + pid_m * BM, n_rows - pid_m * BM, 0, BM, D_LATENT,
                                     NUM_WARPS_C)
            else:
                gl.store(OUT + grow[:, None] * D_LATENT + d_o[None, :], out.to(OUT.dtype.element_ty),
                         mask=o_ok[:, None])
            gl.store(LSE + grow_s, lse_s, mask=s_ok)
        else:
            base = pid_s.to(gl.int64) * total_rows
            if TMA_STORE and CLUSTER == 0:
                if pid_m * BM + BM <= n_rows:  # a whole row block of this request: one bulk store
                    _store_partial_tma(PART_DESC, k_lat_s, out, (pid_s * total_rows + q_start * NUM_HEADS
                                                                  + pid_m * BM).to(gl.int32), BM, D_LATENT)
                else:  # the last rows of a request: the next request's rows follow, so store by mask
                    gl.store(OUT + (base + grow)[:, None] * D_LATENT + d_o[None, :], out, mask=o_ok[:, None])
            elif COALESCED_STORE and CLUSTER == 0:
                _cta_barrier()  # every thread's copies have landed (wait_group(0)) and its wgmma reads are done
                store_rows_coalesced(OUT, staging_buffer(k_lat_s, OUT.dtype.element_ty, BM, D_LATENT), out,
                                     base + q_start * NUM_HEADS + pid_m * BM, n_rows - pid_m * BM, 0, BM, D_LATENT,
                                     NUM_WARPS_C)
            else:  # fp32 partials, or (narrow_partials) q's dtype
                gl.store(OUT + (base + grow)[:, None] * D_LATENT + d_o[None, :], out.to(OUT.dtype.element_ty),
                         mask=o_ok[:, None])
            gl.store(LSE + base + grow_s, lse_s, mask=s_ok)
            if CLUSTER > 0:
                # every split of this row block has stored its partial (the whole cluster runs this branch:
                # its programs share pid_m and req); program pid_s then merges columns pid_s * CW ... of them
                _cluster_barrier(NUM_WARPS_C * 32)
                _cluster_merge(OUT, LSE, FINAL_O, FINAL_LSE, q_start * NUM_HEADS + pid_m * BM, n_rows - pid_m * BM,
                               total_rows, pid_s, CLUSTER, BM, D_LATENT, MERGE_L)


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
    """The idle tile buffers ``buf`` viewed as a (BM, WIDTH) tile of ``dtype`` (fp32 or 16-bit) for
    :func:`store_rows_coalesced` (128-byte swizzle: the accumulator's stores into it are free of bank conflicts)."""
    if dtype == gl.float32:
        stage = buf._reinterpret(gl.float32, [BM, WIDTH],
                                 gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
    else:
        stage = buf._reinterpret(dtype, [BM, WIDTH], gl.NVMMASharedLayout.get_default_for([BM, WIDTH], dtype))
    return stage


@gluon.jit
def _store_partial_tma(PART_DESC, k_lat_s, out, row0, BM: gl.constexpr, D_LATENT: gl.constexpr):
    """Write the (BM, D_LATENT) fp32 partial ``out`` to rows ``row0 ..`` of ``PART_DESC`` through shared memory:
    the latent tile buffers (2 x BM x D_LATENT 16-bit values: the same 128 KB) are idle once every copy has
    landed and every wgmma has been waited for, so the partial is staged there and leaves by TMA."""
    _cta_barrier()  # every thread's copies have landed (wait_group(0)) and its wgmma reads are done
    part_s = k_lat_s._reinterpret(gl.float32, [BM, D_LATENT], PART_DESC.layout)
    part_s.store(out)
    fence_async_shared()  # the generic-proxy stores above, before the async proxy (TMA) reads them
    _cta_barrier()  # ... by every thread
    tma.async_copy_shared_to_global(PART_DESC, [row0, 0], part_s)
    tma.store_wait(0)  # the buffer must outlive the copy


_CAPACITY: dict[tuple, int] = {}  # (kernel hash, cluster size, device) -> clusters resident at once


def cluster_capacity(compiled, cluster: int) -> int:
    """How many clusters of ``cluster`` programs of ``compiled`` the GPU holds at once (CUDA's occupancy query:
    a cluster's programs must sit on the SMs of one GPC, so this is not simply SMs / cluster)."""
    import torch
    from triton.runtime import driver

    key = (compiled.hash, cluster, torch.cuda.current_device())
    if key not in _CAPACITY:
        compiled._init_handles()
        _CAPACITY[key] = int(driver.active.utils.cuOccupancyMaxActiveClusters(compiled.function,
                                                                                compiled.metadata.shared, cluster))
    return _CAPACITY[key]


def launch_clustered(kernel, grid: tuple[int, int, int], cluster: int, args: tuple, constexprs: dict):
    """Launch ``kernel[grid](*args, **constexprs)`` as thread-block clusters of ``cluster`` programs along axis 0
    (``grid[0] * cluster`` programs in all) if all its clusters fit on the GPU at once, and return the compiled
    kernel; else launch nothing and return None (the caller takes another path: a second wave of clusters
    would double the time, round 21).

    The kernel is compiled as usual (one CTA per program); only its launch changes: Triton's NVIDIA launcher
    multiplies axis 0 by, and sets the cluster size to, the ``num_ctas`` it finds in the compiled kernel's
    packed metadata, ``(num_warps, num_ctas, shared)`` in Triton 3.6 and 3.7. That entry is set here for this
    kernel's compiled variant (its constexprs make it one of its own). A Triton whose metadata differs gets
    None too."""
    compiled = kernel.warmup(*args, grid=grid, **constexprs)
    meta = getattr(compiled, "packed_metadata", None)
    if not (isinstance(meta, tuple) and len(meta) == 3 and meta[1] in (1, cluster)):
        return None
    if grid[0] * grid[1] * grid[2] > cluster_capacity(compiled, cluster):
        return None
    compiled.packed_metadata = (meta[0], cluster, meta[2])
    kernel[grid](*args, **constexprs)
    return compiled
