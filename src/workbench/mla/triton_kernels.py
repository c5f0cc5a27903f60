"""The Triton kernels of the MLA decode: a split-KV kernel over flat token indices and the merge of its splits.

Napkin math (bf16): every request reads its ``L`` cache rows once, 576 * 2 bytes each, whatever the head count;
it does ``2 * H * qlen * L * (576 + 512)`` FLOPs. Intensity ~1.89 * H * qlen FLOP/byte: 16 heads x qlen 1 = 30
(memory-bound), 16 x 8 or 128 x 1 = 242 (compute-bound on an H200).

Design. A request's query block is a contiguous ``(qlen * H, 576)`` matrix, so rows ``r = i * H + h`` fold the
query tokens into the head dimension: qlen 8 with 16 heads is one tile of 128 rows over the same keys, read once.
Row ``r`` sees keys ``0 .. s_k - s_q + r // H``. Grid: (row blocks, KV splits, requests), row blocks fastest so
that programs sharing keys run together and hit L2. Each program streams ``BLOCK_N``-token tiles of its split;
each tile (gathered by ``kv_indices``) serves both products (``QK`` over latent + rope, ``PV`` over its first 512
values), with an online softmax in base 2. With one split the program writes the final output; otherwise it
writes partials plus their LSE and :func:`mla_decode_merge_kernel` combines the splits by LSE.

``IDX_AHEAD``: the next tile's indices are loaded one tile early. Without it Triton gives the row gather a single
shared-memory buffer (the gather of tile ``i+1`` waits on its index load, issued only after tile ``i`` is
computed); with it the gather is double-buffered by Triton's pipeliner.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["LOG2E", "mla_decode_merge_kernel", "mla_decode_split_kernel"]

LOG2E = 1.4426950408889634  # scores are scaled by sm_scale * log2(e): the softmax runs in base 2


@triton.jit
def _load_q(q_row, row_ok, D_LATENT: tl.constexpr, D_ROPE: tl.constexpr):
    """The latent (BLOCK_M, 512) and rope (BLOCK_M, 64) parts of the query rows at ``q_row``; 0 where not ``row_ok``."""
    d_lat = tl.arange(0, D_LATENT)
    d_rope = tl.arange(0, D_ROPE)
    q_lat = tl.load(q_row[:, None] + d_lat[None, :], mask=row_ok[:, None], other=0.0)
    q_rope = tl.load(q_row[:, None] + D_LATENT + d_rope[None, :], mask=row_ok[:, None], other=0.0)
    return q_lat, q_rope


@triton.jit
def _softmax_tile(q_lat, q_rope, k_lat, k_rope, cols, col_ok, limit, qk_scale, m_i, l_i, acc,
                  DOT_PRECISION: tl.constexpr):
    """One KV tile of the online softmax: scores over 576 dims (latent + rope), the bottom-right causal mask
    (row r sees keys <= limit[r]), base-2 rescaling, and P @ V with V = the tile's first 512 dims."""
    s = tl.dot(q_lat, tl.trans(k_lat), input_precision=DOT_PRECISION)
    s = tl.dot(q_rope, tl.trans(k_rope), s, input_precision=DOT_PRECISION)
    s = s * qk_scale
    visible = col_ok[None, :] & (cols[None, :] <= limit[:, None])
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(k_lat.dtype), k_lat, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def mla_decode_split_kernel(
    Q,  # (total_q, H, 576) contiguous, fp16/bf16/fp32
    KV,  # (num_rows, 576) cache rows, row stride stride_kv
    KV_INDICES,  # (>= kv_indptr[-1],) int32: cache row of each token
    QO_INDPTR,  # (B + 1,) int32
    KV_INDPTR,  # (B + 1,) int32
    OUT,  # DIRECT: (total_q * H, 512) q.dtype; else partials (num_splits, total_q * H, 512), fp32 or q.dtype
    LSE,  # DIRECT: (total_q * H,) fp32; else (num_splits, total_q * H) fp32
    stride_kv,  # elements between consecutive cache rows
    total_rows,  # total_q * H (partials' split stride is total_rows rows)
    qk_scale,  # sm_scale * log2(e): scores in base 2
    num_splits,  # KV splits per request (grid axis 1)
    NUM_HEADS: tl.constexpr,
    DIRECT: tl.constexpr,  # num_splits == 1: write the final output and natural-log LSE
    IDX_AHEAD: tl.constexpr,  # the next tile's indices loaded one tile early (rows left to the pipeliner)
    LAUNCH_DEPENDENTS: tl.constexpr,  # PDL: let the next kernel be scheduled once this program's loop is done
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (no silent TF32); None (the default) for 16-bit
    BLOCK_M: tl.constexpr,  # folded (query, head) rows per program
    BLOCK_N: tl.constexpr,  # tokens per KV tile
    D_LATENT: tl.constexpr,  # 512
    D_ROPE: tl.constexpr,  # 64
    GDC_WAIT: tl.constexpr = False,  # launched with PDL: wait for the previous kernel before the first read
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    req = tl.program_id(2)
    if GDC_WAIT:  # nothing is read before this: every input may come from the kernel before
        tl.extra.cuda.gdc_wait()
    q_start = tl.load(QO_INDPTR + req)
    s_q = tl.load(QO_INDPTR + req + 1) - q_start
    kv_start = tl.load(KV_INDPTR + req)
    s_k = tl.load(KV_INDPTR + req + 1) - kv_start
    n_rows = s_q * NUM_HEADS
    if pid_m * BLOCK_M >= n_rows:  # this request has fewer query rows than the longest one
        return
    # This split's token range: equal chunks, whole tiles; late splits of short requests are empty.
    chunk = tl.cdiv(tl.cdiv(s_k, num_splits), BLOCK_N) * BLOCK_N
    k_lo = pid_s * chunk
    k_hi = tl.minimum(k_lo + chunk, s_k)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    limit = s_k - s_q + rows // NUM_HEADS  # last key each row may see (bottom-right causal)
    grow = (q_start * NUM_HEADS + rows).to(tl.int64)  # row in the flat (total_q * H) space
    d_lat = tl.arange(0, D_LATENT)
    d_rope = tl.arange(0, D_ROPE)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    q_row = Q + grow * (D_LATENT + D_ROPE)
    if IDX_AHEAD:
        # The first indices are requested before the query rows: the query tile goes to shared memory as soon as
        # it arrives, and Triton emits that wait where the load is written, so q first would put the index load's
        # latency after the query's instead of beside it.
        cols_n = k_lo + tl.arange(0, BLOCK_N)
        idx_n = tl.load(KV_INDICES + kv_start + cols_n, mask=cols_n < k_hi, other=0)
        q_lat, q_rope = _load_q(q_row, row_ok, D_LATENT, D_ROPE)
        acc = tl.zeros([BLOCK_M, D_LATENT], dtype=tl.float32)
        for start in range(k_lo, k_hi, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < k_hi
            idx = idx_n.to(tl.int64)
            idx_n = tl.load(KV_INDICES + kv_start + cols + BLOCK_N, mask=cols + BLOCK_N < k_hi, other=0)
            kv_row = KV + idx[:, None] * stride_kv
            k_lat = tl.load(kv_row + d_lat[None, :], mask=col_ok[:, None], other=0.0)
            k_rope = tl.load(kv_row + D_LATENT + d_rope[None, :], mask=col_ok[:, None], other=0.0)
            acc, m_i, l_i = _softmax_tile(q_lat, q_rope, k_lat, k_rope, cols, col_ok, limit, qk_scale, m_i, l_i,
                                          acc, DOT_PRECISION)
    else:
        q_lat, q_rope = _load_q(q_row, row_ok, D_LATENT, D_ROPE)
        acc = tl.zeros([BLOCK_M, D_LATENT], dtype=tl.float32)
        for start in tl.range(k_lo, k_hi, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < k_hi
            idx = tl.load(KV_INDICES + kv_start + cols, mask=col_ok, other=0).to(tl.int64)
            kv_row = KV + idx[:, None] * stride_kv
            k_lat = tl.load(kv_row + d_lat[None, :], mask=col_ok[:, None], other=0.0)  # (BLOCK_N, 512): K and V
            k_rope = tl.load(kv_row + D_LATENT + d_rope[None, :], mask=col_ok[:, None], other=0.0)  # (BLOCK_N, 64)
            acc, m_i, l_i = _softmax_tile(q_lat, q_rope, k_lat, k_rope, cols, col_ok, limit, qk_scale, m_i, l_i, acc,
                                          DOT_PRECISION)

    if LAUNCH_DEPENDENTS:  # the next kernel still waits (griddepcontrol.wait) for this whole grid's stores
        tl.extra.cuda.gdc_launch_dependents()
    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    # -inf for a row that saw no key; NaN stays NaN (a NaN score makes the sum NaN, as the golden's logsumexp)
    lse = tl.where(has_keys, (m_i + tl.log2(tl.where(has_keys, l_i, 1.0))) * 0.6931471805599453,
                   tl.where(l_i == l_i, float("-inf"), float("nan")))
    if DIRECT:
        tl.store(OUT + grow[:, None] * D_LATENT + d_lat[None, :], out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
        tl.store(LSE + grow, lse, mask=row_ok)
    else:
        prow = pid_s.to(tl.int64) * total_rows + grow
        tl.store(OUT + prow[:, None] * D_LATENT + d_lat[None, :], out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
        tl.store(LSE + prow, lse, mask=row_ok)


@triton.jit
def _merge_tile(MID_O, MID_LSE, rows, ok, d, total_rows, num_splits, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                SPLIT_CHUNK: tl.constexpr, D_LATENT: tl.constexpr):
    """Combine the splits of rows ``rows`` (where ``ok``), columns ``d``, by their LSE, loading the partials
    of SPLIT_CHUNK splits at once ((SPLIT_CHUNK, rows, cols) in flight, not one split after another).
    Returns (out fp32 (rows, cols), natural-log lse (rows,))."""
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for s0 in range(0, num_splits, SPLIT_CHUNK):
        sp = s0 + tl.arange(0, SPLIT_CHUNK)
        prow = sp[:, None].to(tl.int64) * total_rows + rows[None, :]  # (SPLIT_CHUNK, rows)
        valid = (sp[:, None] < num_splits) & ok[None, :]
        lse_s = tl.load(MID_LSE + prow, mask=valid, other=float("-inf"))
        o_s = tl.load(MID_O + prow[:, :, None] * D_LATENT + d[None, None, :], mask=valid[:, :, None],
                      other=0.0).to(tl.float32)
        m_new = tl.maximum(m, tl.max(lse_s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.exp(m - m_safe)
        w = tl.exp(lse_s - m_safe[None, :])  # (SPLIT_CHUNK, rows); 0 for splits that saw no key
        acc = acc * a[:, None] + tl.sum(w[:, :, None] * o_s, 0)
        denom = denom * a + tl.sum(w, 0)
        m = m_new
    has = denom > 0.0
    safe = tl.where(has, denom, 1.0)
    return acc / safe[:, None], tl.where(has, m + tl.log(safe), tl.where(denom == denom, float("-inf"), float("nan")))


@triton.jit
def mla_decode_merge_kernel(
    MID_O,  # (num_splits, total_rows, 512) partial outputs (each normalised within its split): fp32, or q's dtype
    MID_LSE,  # (num_splits, total_rows) fp32 natural-log LSE of each split (-inf: split saw no key)
    OUT,  # (total_rows, 512) q.dtype
    LSE,  # (total_rows,) fp32
    total_rows,
    num_splits,
    BLOCK_R: tl.constexpr,  # rows per program (grid axis 0)
    BLOCK_D: tl.constexpr,  # output columns per program (grid axis 1): D_LATENT // BLOCK_D programs per row block
    SPLIT_CHUNK: tl.constexpr,  # splits loaded at once: (SPLIT_CHUNK, BLOCK_R, BLOCK_D) partials in flight
    D_LATENT: tl.constexpr,
    GDC_WAIT: tl.constexpr = False,  # launched with PDL: wait for the split kernel's grid before reading partials
    LAUNCH_DEPENDENTS: tl.constexpr = False,  # PDL: let the next kernel (the next call's split) be scheduled now
):
    """Merge the splits of BLOCK_R rows x BLOCK_D columns. Many small programs, each loading the partials of
    up to SPLIT_CHUNK splits in one go (not one split after another), so the merge is short even when one
    request has many splits: it reads from L2 at the parallelism of the whole GPU."""
    if GDC_WAIT:
        tl.extra.cuda.gdc_wait()
    if LAUNCH_DEPENDENTS:  # a dependent waits (griddepcontrol.wait) for this whole grid before it reads anything
        tl.extra.cuda.gdc_launch_dependents()
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    ok = rows < total_rows
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    out, lse = _merge_tile(MID_O, MID_LSE, rows, ok, d, total_rows, num_splits, BLOCK_R, BLOCK_D, SPLIT_CHUNK,
                           D_LATENT)
    tl.store(OUT + rows[:, None] * D_LATENT + d[None, :], out.to(OUT.dtype.element_ty), mask=ok[:, None])
    if tl.program_id(1) == 0:
        tl.store(LSE + rows, lse, mask=ok)
