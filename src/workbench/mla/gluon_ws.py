"""A warp-specialised Gluon split kernel for the 64-row MLA decode (Hopper), the "seesaw".

:mod:`workbench.mla.gluon` runs its two warpgroups in lockstep: both wait for a tile, both compute half of ``S``
(32 tokens each), exchange the row maxima and ``P`` through shared memory, and both multiply ``P V``; the tensor
cores idle during every softmax. Here the warpgroups take turns instead (FlashMLA's idea, written from its
description): tile ``j`` (32 tokens) belongs to warpgroup ``j % 2``, which computes all of its ``S`` and its
softmax and publishes ``P_j`` in shared memory; both warpgroups then add ``P_j V_j`` into their half of the output
columns. A warpgroup issues ``S`` of its next tile before it waits for the other one's ``P``, so one warpgroup's
softmax runs while the other one's products keep the tensor cores busy. A third partition (a loader warpgroup)
gathers the cache rows with ``cp.async`` into four buffers, signalled by mbarriers.

The hand-over schedule (:func:`_consumer`) shortens what must pass between the warpgroups in tile order to the
running row max: each warpgroup publishes ``m_t`` as soon as it has ``S_t``'s row maxima, then its ``P_t``, and
keeps its own share of the running sum, rescaled by every tile's factor; the shares are added after the last tile.
A warpgroup reads the other's ``P_u`` into registers and scales it to the max after its own next tile, so that one
rescale of its accumulator (128 values a thread) serves both products of the pair instead of one each (FlashMLA
scales ``P`` the same way); the ``P`` slot is free as soon as it is read.
Waiting for the other warpgroup's whole softmax per link of the chain (publishing ``P`` and the sum together) left
the consumers idle about a fifth of their time in an Nsight Compute profile.

The hand-overs between the two consumer warpgroups are hardware named barriers of 256 threads, as FlashMLA's are:
the publishing warpgroup's threads arrive without waiting (``bar.arrive``) right after their shared-memory
stores, the other warpgroup waits (``bar.sync``). An mbarrier hand-over costs the publisher a barrier of its own
128 threads before one arrival, and the receiver a polling wait; named barriers make the 64-row decode 5-8 %
faster with two row blocks. Gluon has no named-barrier operation, so they are one PTX instruction each
(:func:`_bar_arrive`, :func:`_bar_sync`), on ids above the compiler's (it uses 0-3 for its partition barriers).
Every arrival has its wait: a named barrier counts arrivals, so a second arrival before the wait would complete
the barrier without it. Each hand-over alternates by construction: a warpgroup publishes its next max only after
it has used the other's, its next ``P`` only after the other has read the last one (``_BAR_F``).

``S`` is two wgmma, one over the 512 latent columns of a tile's buffer and one over its 64 rope columns; each
warpgroup's ``V`` is its half of the same buffer. The scores stay unscaled: ``qk_scale`` goes into the exponent
(``exp2(s * qk_scale - m)``, one FFMA) and into the row max, and only a tile that some row does not see whole (the
split's end, the causal edge) is masked. Against three ``S`` products, each score scaled and every tile masked,
this is 1-3 % faster where the decode is compute-bound at batches of 64 or more.

Each warpgroup stages its half of the output or partial in the idle latent tile buffers and stores it row-major in
16-byte vectors. NVIDIA sm_90, 16-bit. Partials have the format of :mod:`workbench.mla.gluon`'s.
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
BLOCK_N = 32  # tokens per tile
NUM_BUFFERS = 4  # cache tiles in shared memory
NUM_WARPS = 4  # the default partition: warpgroup 0 (warpgroup 1 and the loader are worker partitions)
MAX_REGS = 168  # registers per thread for the launch: 12 warps (the loader's warpgroup counted whole) x 168
CONSUMER_REGS = gl.constexpr(232)  # warpgroup 1's registers (warpgroup 0 gets what is left: 168 * 3 - 232 - 40 = 232)
LOADER_REGS = gl.constexpr(40)
LOADER_WARPS = gl.constexpr(4)  # the loader's warpgroup is allocated whole anyway; one warp issues too slowly

_D_LATENT = gl.constexpr(512)  # MLA's latent width (also V's)
_D_ROPE = gl.constexpr(64)
# named barriers of the two consumer warpgroups (256 threads; ids above the compiler's partition barriers, 0-3)
_BAR_M = gl.constexpr(8)  # 8 + w: warpgroup w's running max is out
_BAR_P = gl.constexpr(10)  # 10 + w: warpgroup w's P is out
_BAR_F = gl.constexpr(12)  # 12 + w: the other warpgroup has read warpgroup w's last P (its slot is free)


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
def _s_product(Q_LAT, Q_ROPE, K_LAT, K_ROPE, buf, s_zero):
    """Issue ``S = q k^T`` of the tile in buffer ``buf`` (latent part and rope part; two async wgmma)."""
    s_tok = warpgroup_mma(Q_LAT, K_LAT.index(buf).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return warpgroup_mma(Q_ROPE, K_ROPE.index(buf).permute((1, 0)), s_tok, is_async=True)


@gluon.jit
def _v_half(K_LAT, buf, W: gl.constexpr):
    """Warpgroup ``W``'s half of the latent columns of buffer ``buf`` (its V)."""
    return K_LAT.index(buf).slice(W * 256, 256, dim=1)


@gluon.jit
def _consumer(a, W: gl.constexpr, DIRECT: gl.constexpr):
    """Warpgroup ``W``'s part of the hand-over schedule.

    What must pass from one warpgroup to the other in tile order is only the running row maximum. Each warpgroup
    therefore publishes ``m_t`` (named barrier ``_BAR_M + W``) as soon as it has ``S_t``'s row maxima and
    ``m_{t-1}``, before its exponentials, and ``P_t`` (``_BAR_P + W``) after them. Each keeps its own share
    ``l_W`` of the running sum (its tiles' row sums, rescaled by every tile's factor ``exp2(m_{t-1} - m_t)``, which
    both warpgroups compute from the published maxima); the two shares are added once, after the last tile. A
    ``P`` slot is overwritten only after the other warpgroup has read it into registers (``_BAR_F + W``,
    arrived on only where another ``P`` will follow, so that every arrival has its wait)."""
    (Q_LAT, Q_ROPE, K_LAT, K_ROPE, P_S, M0, M1, L0, L1, FULL, EMPTY, DONE,
     Q_BAR, OUT, LSE, row0, n_rows, m0, k_lo, k_hi, n_tiles, limit_base, qk_scale, out_base, KV, KV_INDICES,
     kv_start, stride_kv, num_heads) = a
    D_LATENT: gl.constexpr = _D_LATENT
    if W == 0:  # slot W: this warpgroup's maxima and, at the end, its share of the sum
        MY_M, MY_L, OT_M, OT_L = M0, L0, M1, L1
    else:
        MY_M, MY_L, OT_M, OT_L = M1, L1, M0, L0
    BM: gl.constexpr = 64
    BN: gl.constexpr = 32
    NBUF: gl.constexpr = 4
    HALF: gl.constexpr = D_LATENT // 2
    dtype: gl.constexpr = Q_LAT.dtype
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)

    s_rows = gl.arange(0, BM, layout=ROW_S)
    limit = limit_base + (m0 + s_rows) // num_heads  # key t is visible to its row if t <= limit (bottom-right causal)
    lim_min = limit_base + m0 // num_heads  # row 0's limit, the smallest
    s_cols = gl.arange(0, BN, layout=gl.SliceLayout(0, S_L))
    s_zero = gl.zeros([BM, BN], gl.float32, layout=S_L)
    acc = gl.zeros([BM, HALF], gl.float32, layout=O_L)
    m_run = gl.full([BM], float("-inf"), gl.float32, layout=ROW_S)  # the running max after the last tile seen
    l_w = gl.zeros([BM], gl.float32, layout=ROW_S)  # this warpgroup's share of the running sum, at m_run
    mbarrier.wait(Q_BAR.index(0), 0)  # the query tile has landed (the default partition's copies, waited for)
    fence_async_shared()
    if W == 0:
        if n_tiles > 0:  # tile 0: no tile of the other warpgroup before it
            s = _masked_scores(Q_LAT, Q_ROPE, K_LAT, K_ROPE, FULL, 0, NBUF, s_zero, k_lo + s_cols, k_hi,
                               limit, k_lo + BN - 1, lim_min)
            m_new = _hand_over_max(s, m_run, MY_M, W, qk_scale)
            p16, l_w = _probabilities(s, m_run, m_new, l_w, dtype, qk_scale)
            _publish_p(P_S, W, p16)
            acc = _own_product(p16, _v_half(K_LAT, 0, W), 0, acc, EMPTY, P_L)
            m_run = m_new
    for t in range(2 - W, n_tiles, 2):  # this warpgroup's later tiles: each follows the other's tile t-1
        buf = t % NBUF
        u = t - 1
        s = _masked_scores(Q_LAT, Q_ROPE, K_LAT, K_ROPE, FULL, t, NBUF, s_zero, k_lo + t * BN + s_cols,
                           k_hi, limit, k_lo + t * BN + BN - 1, lim_min)
        # the other warpgroup's tile u: its max, then this tile's max goes out at once
        _bar_sync(_BAR_M + 1 - W)
        m_u = OT_M.load(ROW_S)
        m_new = _hand_over_max(s, m_u, MY_M, W, qk_scale)
        acc_tok, l_w = _other_product(P_S, _v_half(K_LAT, u % NBUF, W), W, m_run, m_u, m_new, acc, l_w, S_L, P_L,
                                      ROW_O)
        if u + 2 < n_tiles:  # the other's P is in registers: it may publish another P into that slot
            _bar_arrive(_BAR_F + 1 - W)
        # this tile's probabilities, published once the other has read this slot's last P
        p16, l_w = _probabilities(s, m_u, m_new, l_w, dtype, qk_scale)
        if t - W >= 2:
            _bar_sync(_BAR_F + W)
        _publish_p(P_S, W, p16)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, ))
        _cta_barrier()  # every warp of this warpgroup is done with buffer u % NBUF
        mbarrier.arrive(EMPTY.index(u % NBUF))
        acc = _own_product(p16, _v_half(K_LAT, buf, W), buf, acc, EMPTY, P_L)
        m_run = m_new
    # the last tile, when it is the other warpgroup's
    u = n_tiles - 1
    if (u >= 0) & (u % 2 != W):
        _bar_sync(_BAR_M + 1 - W)
        m_u = OT_M.load(ROW_S)
        acc_tok, l_w = _other_product(P_S, _v_half(K_LAT, u % NBUF, W), W, m_run, m_u, m_u, acc, l_w, S_L, P_L,
                                      ROW_O)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, ))
        m_run = m_u

    # epilogue: the two shares of the sum meet (each warpgroup stores its own, both arrive on DONE, which also
    # says that both are done with every tile buffer), then each stages and stores its half of the columns
    MY_L.store(l_w)
    _cta_barrier()
    mbarrier.arrive(DONE.index(0))
    mbarrier.wait(DONE.index(0), 0)
    l_s = l_w + OT_L.load(ROW_S)
    l_o = gl.convert_layout(l_s, ROW_O)
    out = acc / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
    staging = staging_buffer(K_LAT, OUT.dtype.element_ty, 2 * BM, HALF).slice(W * BM, BM, dim=0)  # one tile each
    store_rows_coalesced(OUT, staging, out,
                         row0 if DIRECT else out_base + row0, n_rows, W * HALF, BM, HALF, 4)
    if W == 0:
        gl.store(LSE + out_base + (row0 + s_rows).to(gl.int64), lse_from_base2(m_run, l_s), mask=s_rows < n_rows)


@gluon.jit
def _own_product(p16, V, buf, acc, EMPTY, P_L: gl.constexpr):
    """``O += P V`` for this warpgroup's own tile (P from registers, V its half of buffer ``buf``; the accumulator
    is already at this tile's max, :func:`_other_product`), waited for; then the warpgroup releases the buffer
    (every warp done: the partition's barrier, one arrival)."""
    acc_tok = warpgroup_mma(gl.convert_layout(p16, P_L), V, acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, ))
    _cta_barrier()
    mbarrier.arrive(EMPTY.index(buf))
    return acc


@gluon.jit
def _other_product(P_S, V, W: gl.constexpr, m_run, m_u, m_new, acc, l_w, S_L: gl.constexpr, P_L: gl.constexpr,
                   ROW_O: gl.constexpr):
    """The hand-over schedule's step for the other warpgroup's tile ``u`` (``V``: this warpgroup's half of its
    buffer), whose running max ``m_u`` has arrived: this warpgroup's share of the sum takes the tile's factor
    ``exp2(m_run - m_u)``; once ``P_u`` is published it is read into registers and scaled from ``m_u`` to
    ``m_new`` (the max after this warpgroup's own next tile, or ``m_u`` when there is none), and
    ``O = O * exp2(m_run - m_new) + P_u V_u`` is issued. One rescale of the accumulator (128 values a thread)
    thus serves both products of a tile pair, at the cost of scaling ``P_u``
    (16 values a thread), as FlashMLA does. Returns ``(acc_tok, l_w)``."""
    l_w = l_w * gl.exp2(m_run - _finite(m_u))
    m_ref = _finite(m_new)
    _bar_sync(_BAR_P + 1 - W)
    p_u = P_S.index(1 - W).load(S_L).to(gl.float32) * gl.exp2(m_u - m_ref)[:, None]
    acc_tok = warpgroup_mma(gl.convert_layout(p_u.to(P_S.dtype), P_L), V,
                            acc * gl.convert_layout(gl.exp2(m_run - m_ref), ROW_O)[:, None], is_async=True)
    return acc_tok, l_w


@gluon.jit
def _finite(m):
    """A running max with -inf (a row that saw no key yet) as 0, for the exponent's reference."""
    return gl.where(m == float("-inf"), 0.0, m)


@gluon.jit
def _masked_scores(Q_LAT, Q_ROPE, K_LAT, K_ROPE, FULL, t, NBUF: gl.constexpr, s_zero, cols, k_hi, limit,
                   c_last, lim_min):
    """``S`` of tile ``t`` (in buffer ``t % NBUF``, once it has landed), waited for, unscaled (``qk_scale`` goes
    into the exponent, :func:`_probabilities`), masked (-inf past the split's end or a row's causal limit) only
    where the tile has such keys: past ``k_hi`` or past ``lim_min``, the first row's limit (``c_last``: the tile's
    last key). Every other tile skips the mask's compares and selects."""
    mbarrier.wait(FULL.index(t % NBUF), (t // NBUF) & 1)
    fence_async_shared()  # cp.async wrote through the generic proxy; wgmma reads through the async one
    s = _s_product(Q_LAT, Q_ROPE, K_LAT, K_ROPE, t % NBUF, s_zero)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    if (c_last >= k_hi) | (c_last > lim_min):  # a tile some row does not see whole
        visible = (cols[None, :] < k_hi) & (cols[None, :] <= limit[:, None])
        s = gl.where(visible, s, float("-inf"))
    return s


@gluon.jit
def _hand_over_max(s, m_prev, MY_M, W: gl.constexpr, qk_scale):
    """The running max after this tile (base 2, scaled), ``max(m_prev, rowmax(s) * qk_scale)``, stored to this
    warpgroup's slot and signalled to the other warpgroup (each thread arrives on the named barrier after its own
    stores)."""
    m_new = gl.maximum(m_prev, gl.max(s, axis=1) * qk_scale)
    MY_M.store(m_new)
    _bar_arrive(_BAR_M + W)
    return m_new


@gluon.jit
def _probabilities(s, m_prev, m_new, l_w, dtype: gl.constexpr, qk_scale):
    """This tile's ``P = exp2(s * qk_scale - m_new)`` (one FFMA an element; in ``dtype``) and this warpgroup's share
    of the sum after it (the share before rescaled by ``exp2(m_prev - m_new)``)."""
    m_ref = _finite(m_new)
    p = gl.exp2(gl.fma(s, qk_scale, -m_ref[:, None]))
    return p.to(dtype), l_w * gl.exp2(m_prev - m_ref) + gl.sum(p, axis=1)


@gluon.jit
def _publish_p(P_S, W: gl.constexpr, p16):
    """Store a tile's ``P`` to slot ``W`` for the other warpgroup's product (which reads it into registers), signal."""
    P_S.index(W).store(p16)
    _bar_arrive(_BAR_P + W)


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
def _loader(a):
    """The loader warpgroup: gather tile t's rows by index into buffer t % 4 once both warpgroups released it;
    each lane's copies arrive on the buffer's mbarrier when they land (count LOADER_WARPS * 32)."""
    _load_tiles(a, False)


@gluon.jit
def _loader_ahead(a):
    """:func:`_loader` with each tile's indices loaded one tile ahead (``TritonConfig.idx_ahead``)."""
    _load_tiles(a, True)


@gluon.jit
def _load_tiles(a, AHEAD: gl.constexpr):
    """The loader's loop. ``AHEAD``: the indices of tile t+1 are loaded right after tile t's copies are issued, so
    their latency overlaps the wait for the next free buffer instead of following it (the launch policy says where
    that pays: :mod:`workbench.mla.policy`)."""
    (Q_LAT, Q_ROPE, K_LAT, K_ROPE, P_S, M0, M1, L0, L1, FULL, EMPTY, DONE,
     Q_BAR, OUT, LSE, row0, n_rows, m0, k_lo, k_hi, n_tiles, limit_base, qk_scale, out_base, KV, KV_INDICES,
     kv_start, stride_kv, num_heads) = a
    D_LATENT: gl.constexpr = _D_LATENT
    D_ROPE: gl.constexpr = _D_ROPE
    BN: gl.constexpr = 32
    NBUF: gl.constexpr = 4
    G: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [LOADER_WARPS, 1], [1, 0])
    t_off = gl.arange(0, BN, layout=gl.SliceLayout(1, G))
    d_lat = gl.arange(0, D_LATENT, layout=gl.SliceLayout(0, G))
    d_rope = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, G))
    if AHEAD:
        idx = gl.load(KV_INDICES + kv_start + k_lo + t_off, mask=k_lo + t_off < k_hi, other=0)
    else:
        idx = gl.zeros([BN], gl.int32, layout=gl.SliceLayout(1, G))
    for t in range(n_tiles):
        buf = t % NBUF
        mbarrier.wait(EMPTY.index(buf), ((t // NBUF) & 1) ^ 1)
        cols = k_lo + t * BN + t_off
        ok = cols < k_hi
        if not AHEAD:
            idx = gl.load(KV_INDICES + kv_start + cols, mask=ok, other=0)
        row = KV + idx.to(gl.int64)[:, None] * stride_kv
        cp.async_copy_global_to_shared(K_LAT.index(buf), row + d_lat[None, :], mask=ok[:, None])
        cp.async_copy_global_to_shared(K_ROPE.index(buf), row + D_LATENT + d_rope[None, :], mask=ok[:, None])
        cp.mbarrier_arrive(FULL.index(buf), increment_count=False)
        if AHEAD:
            idx = gl.load(KV_INDICES + kv_start + cols + BN, mask=cols + BN < k_hi, other=0)


@gluon.jit
def mla_decode_gluon_ws_kernel(
    Q, KV, KV_INDICES, QO_INDPTR, KV_INDPTR,
    OUT,  # DIRECT: (total_q * H, 512) q.dtype; else (num_splits, total_rows, 512) partials in q.dtype
    LSE,  # DIRECT: (total_q * H,) fp32; else (num_splits, total_rows) fp32
    stride_kv, total_rows, qk_scale, num_splits,
    NUM_HEADS: gl.constexpr, DIRECT: gl.constexpr, D_LATENT: gl.constexpr, D_ROPE: gl.constexpr,
    PDL: gl.constexpr = False,  # launched with PDL: wait for the kernel before, then let the next one launch early
    IDX_AHEAD: gl.constexpr = False,  # the loader loads each tile's indices one tile ahead
):
    BM: gl.constexpr = 64
    BN: gl.constexpr = 32
    NBUF: gl.constexpr = 4
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
        KLAT_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D_LATENT], dtype)
        KROPE_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D_ROPE], dtype)
        P_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], dtype)
        ST_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
        # one buffer of all 512 latent columns (S in two wgmma: latent, rope); warpgroup w's V is its half w
        q_lat = gl.allocate_shared_memory(dtype, [BM, D_LATENT], LAT_SL)
        q_rope = gl.allocate_shared_memory(dtype, [BM, D_ROPE], ROPE_SL)
        k_lat = gl.allocate_shared_memory(dtype, [NBUF, BN, D_LATENT], KLAT_SL)
        k_rope = gl.allocate_shared_memory(dtype, [NBUF, BN, D_ROPE], KROPE_SL)
        p_s = gl.allocate_shared_memory(dtype, [2, BM, BN], P_SL)
        m0 = gl.allocate_shared_memory(gl.float32, [BM], ST_SL)  # the running max after warpgroup 0's latest tile
        m1 = gl.allocate_shared_memory(gl.float32, [BM], ST_SL)
        l0 = gl.allocate_shared_memory(gl.float32, [BM], ST_SL)  # warpgroup 0's share of the sum, after its last tile
        l1 = gl.allocate_shared_memory(gl.float32, [BM], ST_SL)
        full = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
        done = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mbarrier.init(done.index(0), count=2)  # both warpgroups, after their last tile
        mbarrier.init(q_bar.index(0), count=128)  # the query tile has landed: one arrival per default-partition lane
        for i in gl.static_range(NBUF):
            mbarrier.init(full.index(i), count=LOADER_WARPS * 32)  # one arrival per loader lane, when its copies land
            mbarrier.init(empty.index(i), count=2)  # both warpgroups

        # the query tile, copied by the default partition and waited for before the partitions start
        G4: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        g_rows = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, G4))
        q_base = Q + (q_start * NUM_HEADS + g_rows).to(gl.int64)[:, None] * (D_LATENT + D_ROPE)
        d_lat_g = gl.arange(0, D_LATENT, layout=gl.SliceLayout(0, G4))
        d_rope_g = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, G4))
        cp.async_copy_global_to_shared(q_lat, q_base + d_lat_g[None, :], mask=(g_rows < n_rows)[:, None])
        cp.async_copy_global_to_shared(q_rope, q_base + D_LATENT + d_rope_g[None, :], mask=(g_rows < n_rows)[:, None])
        cp.commit_group()
        cp.wait_group(0)
        mbarrier.arrive(q_bar.index(0), count=128)
        _cta_barrier()
        fence_async_shared()

        row0 = q_start * NUM_HEADS + pid_m * BM
        out_base = pid_s.to(gl.int64) * total_rows
        args = (q_lat, q_rope, k_lat, k_rope, p_s, m0, m1, l0, l1, full, empty, done,
                q_bar, OUT, LSE, row0, n_rows - pid_m * BM, pid_m * BM, k_lo, k_hi, n_tiles, s_k - s_q, qk_scale,
                out_base, KV, KV_INDICES, kv_start, stride_kv, NUM_HEADS)
        # (constexprs do not pass into the partitions: one function per case)
        if DIRECT:
            if IDX_AHEAD:
                gl.warp_specialize([(_consumer0_direct, (args, )), (_consumer1_direct, (args, )),
                                    (_loader_ahead, (args, ))], [4, LOADER_WARPS], [CONSUMER_REGS, LOADER_REGS])
            else:
                gl.warp_specialize([(_consumer0_direct, (args, )), (_consumer1_direct, (args, )),
                                    (_loader, (args, ))], [4, LOADER_WARPS], [CONSUMER_REGS, LOADER_REGS])
        elif IDX_AHEAD:
            gl.warp_specialize([(_consumer0_partial, (args, )), (_consumer1_partial, (args, )),
                                (_loader_ahead, (args, ))], [4, LOADER_WARPS], [CONSUMER_REGS, LOADER_REGS])
        else:
            gl.warp_specialize([(_consumer0_partial, (args, )), (_consumer1_partial, (args, )),
                                (_loader, (args, ))], [4, LOADER_WARPS], [CONSUMER_REGS, LOADER_REGS])
