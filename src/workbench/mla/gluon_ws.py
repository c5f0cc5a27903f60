"""A warp-specialised Gluon split kernel for the 64-row MLA decode (Hopper): FlashMLA's "seesaw" on 64-token tiles.

:mod:`workbench.mla.gluon` runs its two warpgroups in lockstep, and the tensor cores idle during every softmax.
Here the warpgroups take turns, in the order of FlashMLA's dense decode (its 2025-04-22 deep-dive, written here from
that description). The output's 512 columns are split in halves, ``O_L`` in warpgroup 0's registers and ``O_R`` in
warpgroup 1's. The tokens come in pairs of 64-token tiles: tile ``a`` (buffer 0) belongs to warpgroup 0, tile ``b``
(buffer 1) to warpgroup 1. Per pair, with ``m`` the running row max:

1. [0] ``S_a = q K_a^T``; ``m_a = max(m, rowmax S_a)``, published; ``P_a = exp2(S_a - m_a)``;
   ``O_L = O_L * exp2(m - m_a) + P_a V_aL`` (``P_a`` from registers);
2. [1] ``S_b = q K_b^T``; once ``m_a`` is out, ``m_b = max(m_a, rowmax S_b)``, published; ``P_b = exp2(S_b - m_b)``,
   stored; ``O_R = O_R * exp2(m - m_b) + P_b V_bR``;
3. [0] once ``m_b`` is out: ``P_a`` scaled to ``m_b`` and published;
4. [1] once ``P_a`` is out: ``O_R += P_a V_aR`` is issued, and then ``P_b`` is published;
5. [0] once ``P_b`` is out: ``O_L = O_L * exp2(m_a - m_b) + P_b V_bL``.

So one warpgroup's softmax runs while the other's products keep the tensor cores busy, and only the row max has to
pass between them before the exponentials. The published ``P`` tiles live in shared memory, where the other
warpgroup's product reads them as its A operand: ``P_a`` in the rope rows of buffer 0 and ``P_b`` in those of
buffer 1, which no product reads once that tile's ``S`` is done. The hand-overs are hardware named barriers of 256
threads (``_BAR_M``, ``_BAR_P``): the publishing warpgroup's threads arrive without waiting (``bar.arrive``) right
after their stores, the other waits (``bar.sync``). Gluon has no named-barrier operation, so each is one PTX
instruction (:func:`_bar_arrive`, :func:`_bar_sync`), on ids above the compiler's (0-3, its partition barriers).
Every arrival has its wait before the next arrival on the same barrier, by the order of the steps above and the
buffer hand-backs below. ``P_b`` goes out only after step 4 is issued (as FlashMLA orders its warpgroups), so that
warpgroup 1's ``P_a V_aR`` enters the tensor cores ahead of warpgroup 0's ``P_b V_bL`` and hands buffer 0's
second column group back sooner: the next ``S_a`` waits on it.

A third partition (a loader warpgroup) gathers the cache rows by index with ``cp.async``. Shared memory holds the
query tile and two 64-token tiles (221 KB of an H200 program's 227 KB), so each buffer is handed back in two
column groups as soon as its readers are done with them: a tile's owner's half of the latent columns (group A)
after the owner's own ``P V``, the other half and the rope columns (group B) after the other warpgroup's. Each
``S`` reads group A first, which was handed back early, and waits for group B only after it. Against the 32-token
schedule that came before (four buffers, the other's ``P`` read into registers and rescaled there), this is
9-12 % faster with two row blocks per request at B >= 64 and within about 1 % elsewhere; with its gathers left out
it runs level with FlashMLA at those points, so the gap there comes with the rows' copies: their wait or their
share of the shared-memory port (design log).

The scores stay unscaled: ``qk_scale`` goes into the row max and into the exponent (``exp2(s * qk_scale - m)``, one
FFMA), and only a tile that some row does not see whole (the split's end, the causal edge) is masked. The query
tiles and the buffer an ``S`` reads are indexed by an opaque zero (:func:`_opaque_zero`), so that the compiler
builds the 36 k-steps' wgmma descriptors where they are used instead of hoisting them into registers, which
spills. Each warpgroup stages its half of the output or partial in the idle latent tile buffers and stores it
row-major in 16-byte vectors. NVIDIA sm_90, 16-bit. Partials have the format of :mod:`workbench.mla.gluon`'s.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from workbench.mla.gluon import _cta_barrier, lse_from_base2, program_range, staging_buffer, store_rows_coalesced

__all__ = ["BLOCK_M", "BLOCK_N", "MAX_REGS", "NUM_BUFFERS", "NUM_WARPS", "mla_decode_gluon_ws_kernel"]

BLOCK_M = 64  # folded rows per program
BLOCK_N = 64  # tokens per tile
NUM_BUFFERS = 2  # cache tiles in shared memory (one per warpgroup)
NUM_WARPS = 4  # the default partition: warpgroup 0 (warpgroup 1 and the loader are worker partitions)
MAX_REGS = 168  # registers per thread for the launch: 12 warps (the loader's warpgroup counted whole) x 168
CONSUMER_REGS = gl.constexpr(232)  # warpgroup 1's registers (warpgroup 0 gets what is left: 168 * 3 - 232 - 40 = 232)
LOADER_REGS = gl.constexpr(40)
LOADER_WARPS = gl.constexpr(4)  # the loader's warpgroup is allocated whole anyway; one warp issues too slowly

_D_LATENT = gl.constexpr(512)  # MLA's latent width (also V's)
_D_ROPE = gl.constexpr(64)
# named barriers of the two consumer warpgroups (256 threads; ids above the compiler's partition barriers, 0-3)
_BAR_M = gl.constexpr(8)  # 8 + w: warpgroup w's running max is out
_BAR_P = gl.constexpr(10)  # 10 + w: warpgroup w's P is out (in the rope rows of buffer w)


@gluon.jit
def _bar_arrive(bar_id: gl.constexpr):
    """This thread's arrival on named barrier ``bar_id`` (count 256: one warpgroup arrives, the other waits), without
    waiting: what this thread wrote to shared memory before is visible to the waiting warpgroup once it passes."""
    gl.inline_asm_elementwise("bar.arrive $1, 256; mov.u32 $0, 0;", "=r,n", [gl.to_tensor(bar_id)], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _bar_sync(bar_id: gl.constexpr):
    """Wait on named barrier ``bar_id`` until the other warpgroup's 128 threads have arrived (count 256)."""
    gl.inline_asm_elementwise("bar.sync $1, 256; mov.u32 $0, 0;", "=r,n", [gl.to_tensor(bar_id)], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _opaque_zero():
    """0, from an instruction the compiler cannot see through: an index that keeps a shared-memory address (and the
    wgmma descriptors made from it) inside the loop."""
    return gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _finite(m):
    """A running max with -inf (a row that saw no key yet) as 0, for the exponent's reference."""
    return gl.where(m == float("-inf"), 0.0, m)


@gluon.jit
def _scores(Q_LAT, Q_ROPE, K_LAT, K_ROPE, FULL_A, FULL_B, W: gl.constexpr, phase, s_zero, cols, k_hi, limit,
            c_last, lim_min):
    """``S = q k^T`` of warpgroup ``W``'s tile (buffer ``W``, phase ``phase`` of its mbarriers), waited for: over its
    own half of the latent columns first (group A), then the other half and the rope columns (group B), each once
    it has landed. Unscaled; masked (-inf past the split's end ``k_hi`` or a row's causal ``limit``) only on a tile
    some row does not see whole: past ``k_hi`` or past ``lim_min``, the first row's limit (``c_last``: the tile's
    last key)."""
    z = _opaque_zero()  # the descriptors are made here, per k-step, not hoisted out of the loop
    q = Q_LAT.index(z)
    k = K_LAT.index(z + W)
    mbarrier.wait(FULL_A.index(W), phase)
    fence_async_shared()  # cp.async wrote through the generic proxy; wgmma reads through the async one
    s = warpgroup_mma(q.slice(W * 256, 256, dim=1), k.slice(W * 256, 256, dim=1).permute((1, 0)), s_zero,
                      use_acc=False, is_async=True)
    mbarrier.wait(FULL_B.index(W), phase)
    fence_async_shared()
    s = warpgroup_mma(q.slice((1 - W) * 256, 256, dim=1), k.slice((1 - W) * 256, 256, dim=1).permute((1, 0)), s,
                      is_async=True)
    s = warpgroup_mma(Q_ROPE.index(z), K_ROPE.index(z + W).permute((1, 0)), s, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    if (c_last >= k_hi) | (c_last > lim_min):
        visible = (cols[None, :] < k_hi) & (cols[None, :] <= limit[:, None])
        s = gl.where(visible, s, float("-inf"))
    return s


@gluon.jit
def _consumer(a, W: gl.constexpr, DIRECT: gl.constexpr):
    """Warpgroup ``W``'s part of the schedule (the module's steps 1-5), pair by pair; after the last pair the two
    shares of the row sum meet and each warpgroup stores its half of the columns.

    Each warpgroup keeps its own share ``l_w`` of the running sum (its tiles' row sums), rescaled whenever its
    accumulator is; the shares are added once, after the last tile. A rescale factor is ``exp2(m_old - ref)`` with
    ``ref`` the new max made finite (:func:`_finite`): a row that saw no key yet keeps factor 0, never ``inf * 0``.
    An odd last tile is warpgroup 0's alone: warpgroup 1 then only adds ``P_a V_aR``."""
    (Q_LAT, Q_ROPE, K_LAT, K_ROPE, M0, M1, L0, L1, FULL_A, FULL_B, EMPTY_A, EMPTY_B, DONE,
     Q_BAR, OUT, LSE, row0, n_rows, m0, k_lo, k_hi, n_tiles, limit_base, qk_scale, out_base, KV, KV_INDICES,
     kv_start, stride_kv, num_heads) = a
    if W == 0:
        MY_L, OT_L = L0, L1
    else:
        MY_L, OT_L = L1, L0
    BM: gl.constexpr = 64
    BN: gl.constexpr = 64
    HALF: gl.constexpr = 256
    dtype: gl.constexpr = Q_LAT.dtype
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)

    s_rows = gl.arange(0, BM, layout=ROW_S)
    limit = limit_base + (m0 + s_rows) // num_heads  # key t is visible to its row if t <= limit (bottom-right causal)
    lim_min = limit_base + m0 // num_heads
    s_cols = gl.arange(0, BN, layout=gl.SliceLayout(0, S_L))
    s_zero = gl.zeros([BM, BN], gl.float32, layout=S_L)
    acc = gl.zeros([BM, HALF], gl.float32, layout=O_L)
    m_run = gl.full([BM], float("-inf"), gl.float32, layout=ROW_S)
    l_w = gl.zeros([BM], gl.float32, layout=ROW_S)
    mbarrier.wait(Q_BAR.index(0), 0)  # the query tile has landed (the default partition's copies, waited for)
    fence_async_shared()
    n_pairs = gl.cdiv(n_tiles, 2)
    for k in range(n_pairs):
        ph = k & 1  # each buffer is filled once per pair
        has_b = 2 * k + 1 < n_tiles
        if W == 0:  # step 1: S_a, its max out, P_a, O_L += P_a V_aL
            c0 = k_lo + 2 * k * BN
            s = _scores(Q_LAT, Q_ROPE, K_LAT, K_ROPE, FULL_A, FULL_B, 0, ph, s_zero, c0 + s_cols, k_hi, limit,
                        c0 + BN - 1, lim_min)
            m_new0 = gl.maximum(m_run, gl.max(s, axis=1) * qk_scale)
            M0.store(m_new0)
            _bar_arrive(_BAR_M + 0)
            r0 = _finite(m_new0)
            scale0 = gl.exp2(m_run - r0)
            p = gl.exp2(gl.fma(s, qk_scale, -r0[:, None]))
            l_w = l_w * scale0 + gl.sum(p, axis=1)
            tok = warpgroup_mma(gl.convert_layout(p.to(dtype), P_L), K_LAT.index(0).slice(0, HALF, dim=1),
                                acc * gl.convert_layout(scale0, ROW_O)[:, None], is_async=True)
            if has_b:  # steps 3 and 5: P_a at m_b out, then O_L += P_b V_bL (one rescale to m_b)
                _bar_sync(_BAR_M + 1)
                m_new1 = M1.load(ROW_S)
                scale1 = gl.exp2(m_new0 - _finite(m_new1))
                K_ROPE.index(0).store((p * scale1[:, None]).to(dtype))
                fence_async_shared()
                _bar_arrive(_BAR_P + 0)
                l_w = l_w * scale1
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok, ))
                _cta_barrier()  # every warp of this warpgroup is done with group A of buffer 0
                mbarrier.arrive(EMPTY_A.index(0))
                _bar_sync(_BAR_P + 1)
                tok = warpgroup_mma(K_ROPE.index(1), K_LAT.index(1).slice(0, HALF, dim=1),
                                    acc * gl.convert_layout(scale1, ROW_O)[:, None], is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok, ))
                _cta_barrier()
                mbarrier.arrive(EMPTY_B.index(1))
                m_run = m_new1
            else:  # an odd last tile: P_a at m_a
                K_ROPE.index(0).store(p.to(dtype))
                fence_async_shared()
                _bar_arrive(_BAR_P + 0)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok, ))
                _cta_barrier()
                mbarrier.arrive(EMPTY_A.index(0))
                m_run = m_new0
        else:
            if has_b:  # steps 2 and 4
                c1 = k_lo + (2 * k + 1) * BN
                s = _scores(Q_LAT, Q_ROPE, K_LAT, K_ROPE, FULL_A, FULL_B, 1, ph, s_zero, c1 + s_cols, k_hi, limit,
                            c1 + BN - 1, lim_min)
                _bar_sync(_BAR_M + 0)
                m_new0 = M0.load(ROW_S)
                m_new1 = gl.maximum(m_new0, gl.max(s, axis=1) * qk_scale)
                M1.store(m_new1)
                _bar_arrive(_BAR_M + 1)
                r1 = _finite(m_new1)
                p16 = gl.exp2(gl.fma(s, qk_scale, -r1[:, None])).to(dtype)
                K_ROPE.index(1).store(p16)
                fence_async_shared()
                f = gl.exp2(m_run - r1)
                l_w = l_w * f + gl.sum(p16.to(gl.float32), axis=1)
                tok = warpgroup_mma(gl.convert_layout(p16, P_L), K_LAT.index(1).slice(HALF, HALF, dim=1),
                                    acc * gl.convert_layout(f, ROW_O)[:, None], is_async=True)
                _bar_sync(_BAR_P + 0)
                tok = warpgroup_mma(K_ROPE.index(0), K_LAT.index(0).slice(HALF, HALF, dim=1), tok, is_async=True)
                _bar_arrive(_BAR_P + 1)  # P_b is out, and P_a V_aR is issued ahead of warpgroup 0's P_b V_bL
                warpgroup_mma_wait(num_outstanding=1, deps=(tok, ))  # P_b V_bR is done: group A of buffer 1 is free
                _cta_barrier()
                mbarrier.arrive(EMPTY_A.index(1))
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok, ))
                _cta_barrier()
                mbarrier.arrive(EMPTY_B.index(0))
                m_run = m_new1
            else:  # an odd last tile: step 4 alone
                _bar_sync(_BAR_M + 0)
                m_new0 = M0.load(ROW_S)
                f = gl.exp2(m_run - _finite(m_new0))
                l_w = l_w * f
                _bar_sync(_BAR_P + 0)
                tok = warpgroup_mma(K_ROPE.index(0), K_LAT.index(0).slice(HALF, HALF, dim=1),
                                    acc * gl.convert_layout(f, ROW_O)[:, None], is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok, ))
                _cta_barrier()
                mbarrier.arrive(EMPTY_B.index(0))
                m_run = m_new0

    # the two shares of the sum meet (each warpgroup stores its own, both arrive on DONE, which also says that both
    # are done with every tile buffer), then each stages and stores its half of the columns
    MY_L.store(l_w)
    _cta_barrier()
    mbarrier.arrive(DONE.index(0))
    mbarrier.wait(DONE.index(0), 0)
    l_s = l_w + OT_L.load(ROW_S)
    l_o = gl.convert_layout(l_s, ROW_O)
    out = acc / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
    staging = staging_buffer(K_LAT, OUT.dtype.element_ty, 2 * BM, HALF).slice(W * BM, BM, dim=0)
    store_rows_coalesced(OUT, staging, out,
                         row0 if DIRECT else out_base + row0, n_rows, W * HALF, BM, HALF, 4)
    if W == 0:
        gl.store(LSE + out_base + (row0 + s_rows).to(gl.int64), lse_from_base2(m_run, l_s), mask=s_rows < n_rows)


@gluon.jit
def _consumer0_direct(a):
    _consumer(a, 0, True)


@gluon.jit
def _consumer1_direct(a):
    _consumer(a, 1, True)


@gluon.jit
def _consumer0_partial(a):
    _consumer(a, 0, False)


@gluon.jit
def _consumer1_partial(a):
    _consumer(a, 1, False)


@gluon.jit
def _copy_cols(dst, row, c0: gl.constexpr, d_half, ok):
    """Issue the copies of latent columns ``c0 .. c0 + 255`` of a tile's rows (``row``: their addresses; zero-filled
    where not ``ok``) into the same columns of ``dst``."""
    cp.async_copy_global_to_shared(dst.slice(c0, 256, dim=1), row + c0 + d_half[None, :], mask=ok[:, None])


@gluon.jit
def _loader(a):
    """The loader warpgroup, pair by pair: the indices of both tiles first, then each column group once its buffer's
    readers handed it back (group A of both tiles, then group B of both: the order in which the consumers hand
    them back), each arriving on its mbarrier as its copies land (count LOADER_WARPS * 32, one per lane)."""
    (Q_LAT, Q_ROPE, K_LAT, K_ROPE, M0, M1, L0, L1, FULL_A, FULL_B, EMPTY_A, EMPTY_B, DONE,
     Q_BAR, OUT, LSE, row0, n_rows, m0, k_lo, k_hi, n_tiles, limit_base, qk_scale, out_base, KV, KV_INDICES,
     kv_start, stride_kv, num_heads) = a
    BN: gl.constexpr = 64
    G: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [LOADER_WARPS, 1], [1, 0])
    t_off = gl.arange(0, BN, layout=gl.SliceLayout(1, G))
    d_half = gl.arange(0, 256, layout=gl.SliceLayout(0, G))
    d_rope = gl.arange(0, 64, layout=gl.SliceLayout(0, G))
    n_pairs = gl.cdiv(n_tiles, 2)
    for k in range(n_pairs):
        e_ph = (k & 1) ^ 1
        ca = k_lo + 2 * k * BN + t_off
        cb = ca + BN
        ok_a = ca < k_hi
        ok_b = cb < k_hi
        idx_a = gl.load(KV_INDICES + kv_start + ca, mask=ok_a, other=0)
        idx_b = gl.load(KV_INDICES + kv_start + cb, mask=ok_b, other=0)
        row_a = KV + idx_a.to(gl.int64)[:, None] * stride_kv
        row_b = KV + idx_b.to(gl.int64)[:, None] * stride_kv
        has_b = 2 * k + 1 < n_tiles
        mbarrier.wait(EMPTY_A.index(0), e_ph)
        _copy_cols(K_LAT.index(0), row_a, 0, d_half, ok_a)
        cp.mbarrier_arrive(FULL_A.index(0), increment_count=False)
        if has_b:
            mbarrier.wait(EMPTY_A.index(1), e_ph)
            _copy_cols(K_LAT.index(1), row_b, 256, d_half, ok_b)
            cp.mbarrier_arrive(FULL_A.index(1), increment_count=False)
        mbarrier.wait(EMPTY_B.index(0), e_ph)
        _copy_cols(K_LAT.index(0), row_a, 256, d_half, ok_a)
        cp.async_copy_global_to_shared(K_ROPE.index(0), row_a + 512 + d_rope[None, :], mask=ok_a[:, None])
        cp.mbarrier_arrive(FULL_B.index(0), increment_count=False)
        if has_b:
            mbarrier.wait(EMPTY_B.index(1), e_ph)
            _copy_cols(K_LAT.index(1), row_b, 0, d_half, ok_b)
            cp.async_copy_global_to_shared(K_ROPE.index(1), row_b + 512 + d_rope[None, :], mask=ok_b[:, None])
            cp.mbarrier_arrive(FULL_B.index(1), increment_count=False)


@gluon.jit
def mla_decode_gluon_ws_kernel(
    Q, KV, KV_INDICES, QO_INDPTR, KV_INDPTR, OUT, LSE,
    stride_kv, total_rows, qk_scale, num_splits,
    NUM_HEADS: gl.constexpr, DIRECT: gl.constexpr, D_LATENT: gl.constexpr, D_ROPE: gl.constexpr,
    PDL: gl.constexpr = False,  # launched with PDL: wait for the kernel before, then let the next one launch early
):
    BM: gl.constexpr = 64
    BN: gl.constexpr = 64
    gl.static_assert((D_LATENT == 512) & (D_ROPE == 64), "MLA's 512 + 64 head dims")
    dtype: gl.constexpr = Q.dtype.element_ty
    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    req = gl.program_id(2)
    q_start, s_q, kv_start, s_k, n_rows, k_lo, k_hi, n_tiles = program_range(QO_INDPTR, KV_INDPTR, req, pid_s,
                                                                              num_splits, NUM_HEADS, BN, PDL)
    if pid_m * BM < n_rows:
        LAT_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D_LATENT], dtype)
        ROPE_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D_ROPE], dtype)
        ST_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
        # the query tile (indexed by an opaque zero where S reads it), two 64-token tiles (buffer w: warpgroup w's
        # tiles; its rope rows later hold that tile's P), the published maxima and the shares of the sum
        q_lat = gl.allocate_shared_memory(dtype, [1, BM, D_LATENT], LAT_SL)
        q_rope = gl.allocate_shared_memory(dtype, [1, BM, D_ROPE], ROPE_SL)
        k_lat = gl.allocate_shared_memory(dtype, [2, BN, D_LATENT], LAT_SL)
        k_rope = gl.allocate_shared_memory(dtype, [2, BN, D_ROPE], ROPE_SL)
        m0 = gl.allocate_shared_memory(gl.float32, [BM], ST_SL)
        m1 = gl.allocate_shared_memory(gl.float32, [BM], ST_SL)
        l0 = gl.allocate_shared_memory(gl.float32, [BM], ST_SL)
        l1 = gl.allocate_shared_memory(gl.float32, [BM], ST_SL)
        full_a = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        full_b = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        empty_a = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        empty_b = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        done = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mbarrier.init(done.index(0), count=2)  # both warpgroups, after their last tile
        mbarrier.init(q_bar.index(0), count=128)  # the query tile has landed: one arrival per default-partition lane
        for i in gl.static_range(2):
            mbarrier.init(full_a.index(i), count=LOADER_WARPS * 32)
            mbarrier.init(full_b.index(i), count=LOADER_WARPS * 32)
            mbarrier.init(empty_a.index(i), count=1)  # group A handed back by the tile's owner
            mbarrier.init(empty_b.index(i), count=1)  # group B handed back by the other warpgroup

        # the query tile, copied by the default partition and waited for before the partitions start
        G4: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        g_rows = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, G4))
        q_base = Q + (q_start * NUM_HEADS + g_rows).to(gl.int64)[:, None] * (D_LATENT + D_ROPE)
        d_lat_g = gl.arange(0, D_LATENT, layout=gl.SliceLayout(0, G4))
        d_rope_g = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, G4))
        cp.async_copy_global_to_shared(q_lat.index(0), q_base + d_lat_g[None, :], mask=(g_rows < n_rows)[:, None])
        cp.async_copy_global_to_shared(q_rope.index(0), q_base + D_LATENT + d_rope_g[None, :],
                                       mask=(g_rows < n_rows)[:, None])
        cp.commit_group()
        cp.wait_group(0)
        mbarrier.arrive(q_bar.index(0), count=128)
        _cta_barrier()
        fence_async_shared()

        row0 = q_start * NUM_HEADS + pid_m * BM
        out_base = pid_s.to(gl.int64) * total_rows
        args = (q_lat, q_rope, k_lat, k_rope, m0, m1, l0, l1, full_a, full_b, empty_a, empty_b, done,
                q_bar, OUT, LSE, row0, n_rows - pid_m * BM, pid_m * BM, k_lo, k_hi, n_tiles, s_k - s_q, qk_scale,
                out_base, KV, KV_INDICES, kv_start, stride_kv, NUM_HEADS)
        if DIRECT:
            gl.warp_specialize([(_consumer0_direct, (args, )), (_consumer1_direct, (args, )),
                                (_loader, (args, ))], [4, LOADER_WARPS], [CONSUMER_REGS, LOADER_REGS])
        else:
            gl.warp_specialize([(_consumer0_partial, (args, )), (_consumer1_partial, (args, )),
                                (_loader, (args, ))], [4, LOADER_WARPS], [CONSUMER_REGS, LOADER_REGS])
