"""workbench.mla: the golden against a plain loop, the Triton kernel against the golden, input checks.

Scenarios follow vLLM's attention tests: named batches with awkward sizes, permuted cache rows,
unused rows filled with NaN (a stray read turns the output into NaN), row 0 reserved.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import workbench  # noqa: F401  (sets TRITON_INTERPRET on CPU before kernels import)
from workbench import mla

D, DV = mla.QK_HEAD_DIM, mla.KV_LORA_RANK


# ----------------------------------------------------------------------------------------------
# fixtures: a flat page_size-1 cache with permuted rows, NaN in every row nobody owns
# ----------------------------------------------------------------------------------------------


def make_case(qo_lens, kv_lens, heads, dtype=torch.float32, device="cpu", seed=0, spare_rows=7):
    """Random q, a cache whose unused rows are NaN, and the aiter-style offsets and indices.

    Row 0 is reserved (never handed out); rows are handed out in a random permutation.
    """
    g = torch.Generator().manual_seed(seed)
    total_q, total_kv = sum(qo_lens), sum(kv_lens)
    num_rows = 1 + total_kv + spare_rows
    cache = torch.full((num_rows, D), float("nan"), dtype=torch.float32)
    rows = 1 + torch.randperm(num_rows - 1, generator=g)[:total_kv]
    cache[rows] = torch.randn(total_kv, D, generator=g)
    q = torch.randn(total_q, heads, D, generator=g)
    cum = lambda xs: torch.tensor([0] + list(torch.tensor(xs).cumsum(0).tolist()), dtype=torch.int32)  # noqa: E731
    return dict(
        q=q.to(dtype).to(device), kv_cache=cache.to(dtype).to(device),
        qo_indptr=cum(qo_lens).to(device), kv_indptr=cum(kv_lens).to(device),
        kv_indices=rows.to(torch.int32).to(device),
    )


def loop_ref(q, kv_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    """The plainest possible spec: one (request, query token, head) at a time, in float64."""
    out = torch.zeros(q.shape[0], q.shape[1], DV, dtype=torch.float64)
    lse = torch.zeros(q.shape[0], q.shape[1], dtype=torch.float64)
    cache = kv_cache.reshape(-1, D).double()
    for b in range(qo_indptr.numel() - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k0, k1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
        s_q, s_k = q1 - q0, k1 - k0
        for i in range(s_q):
            visible = s_k - s_q + i + 1  # keys 0 .. s_k - s_q + i
            rows = cache[kv_indices[k0:k0 + visible].long()]
            for h in range(q.shape[1]):
                s = rows @ q[q0 + i, h].double() * sm_scale
                p = torch.exp(s - s.max())
                out[q0 + i, h] = (p / p.sum()) @ rows[:, :DV]
                lse[q0 + i, h] = s.max() + torch.log(p.sum())
    return out, lse


GOLDEN_SCENARIOS = {
    "one_token": ([1], [1], 1),
    "decode_mixed_lens": ([1, 1, 1], [1, 17, 100], 3),
    "verify_qlen3": ([3, 3], [3, 40], 2),
    "ragged_qlen": ([2, 5, 1, 0], [9, 5, 33, 4], 4),
}


@pytest.mark.parametrize("name", list(GOLDEN_SCENARIOS))
def test_golden_matches_plain_loop(name):
    qo, kv, heads = GOLDEN_SCENARIOS[name]
    case = make_case(qo, kv, heads)
    scale = 0.1
    out, lse = mla.mla_decode_ref(**case, sm_scale=scale)
    out_l, lse_l = loop_ref(**case, sm_scale=scale)
    assert out.shape == (sum(qo), heads, DV) and lse.shape == (sum(qo), heads)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.double(), out_l, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), lse_l, atol=1e-5, rtol=1e-5)


def test_golden_accepts_4d_page_size_1_view_and_default_scale():
    case = make_case([2], [7], 2)
    out2, lse2 = mla.mla_decode_ref(**case)
    case4 = dict(case, kv_cache=case["kv_cache"].view(-1, 1, 1, D))
    out4, lse4 = mla.mla_decode_ref(**case4, sm_scale=1 / math.sqrt(576))
    torch.testing.assert_close(out2, out4, rtol=0, atol=0)
    torch.testing.assert_close(lse2, lse4, rtol=0, atol=0)


def test_golden_single_key_returns_that_value_row():
    case = make_case([1], [1], 3)
    out, lse = mla.mla_decode_ref(**case, sm_scale=0.3)
    row = case["kv_cache"][case["kv_indices"][0].long()]
    torch.testing.assert_close(out[0], row[:DV].expand(3, DV))
    torch.testing.assert_close(lse[0], (case["q"][0] @ row) * 0.3)


# ----------------------------------------------------------------------------------------------
# metadata: the one builder (workbench.expand.build_flat_decode_metadata, through mla.make_decode_example)
# ----------------------------------------------------------------------------------------------

from workbench.expand import DecodeMetadata  # noqa: E402

ON_GPU = workbench.device.on_gpu()
DEV = "cuda" if ON_GPU else "cpu"


def metadata_of(case, max_qo_len=None):
    qo = case["qo_indptr"]
    lens = (qo[1:] - qo[:-1]).tolist()
    return DecodeMetadata(qo_indptr=qo, kv_indptr=case["kv_indptr"], kv_indices=case["kv_indices"],
                          kv_last_page_lens=torch.ones(len(lens), dtype=torch.int32, device=qo.device),
                          max_qo_len=max(lens) if max_qo_len is None else max_qo_len)


# ----------------------------------------------------------------------------------------------
# flat == paged, for K in {1, 16, 64}
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("K", [1, 16, 64])
def test_flat_expanded_equals_paged(K):
    qo, kv = [1, 2, 1], [1, 70, 17]
    ex = mla.make_decode_example(qo, kv, 3, K, device_=DEV)
    q, cache, block_table, seq_lens, md = ex.q, ex.kv_cache, ex.block_table, ex.seq_lens, ex.metadata
    paged_out, paged_lse = mla.mla_decode_paged_ref(q, cache, md.qo_indptr, block_table, seq_lens, 0.2)
    flat_out, flat_lse = mla.mla_decode_ref(q, cache.view(-1, 1, 1, D), md.qo_indptr, md.kv_indptr, md.kv_indices, 0.2)
    assert not torch.isnan(flat_out).any()
    torch.testing.assert_close(flat_out, paged_out, rtol=0, atol=0)
    torch.testing.assert_close(flat_lse, paged_lse, rtol=0, atol=0)
    res = mla.mla_decode(q.half(), cache.half().view(-1, D), md, sm_scale=0.2, backend="triton")
    assert (res.out.float() - paged_out).abs().max() < 5e-3


def test_page_indices_as_token_indices_is_detected():
    demo = mla.demo_page_indices_as_token_indices(page_size=16)
    print(demo)
    assert demo.flat_max_err < 1e-5
    assert demo.pages_rel_err > 0.5
    assert demo.detected
    assert demo.kv_indices_flat[:2] == [demo.kv_indices_pages[0] * 16, demo.kv_indices_pages[0] * 16 + 1]


# ----------------------------------------------------------------------------------------------
# Triton vs golden: tolerances derived from a same-precision torch computation
# ----------------------------------------------------------------------------------------------


def check_against_golden(case, out, lse, dtype, scale, label=""):
    """flash-attention's rule: kernel error <= 2 x (same-precision torch error) + floor, both against
    the fp32 golden on the same (rounded) inputs; LSE by absolute and cosine difference."""
    qo = case["qo_indptr"]
    kv = case["kv_indptr"]
    max_q = int((qo[1:] - qo[:-1]).max())
    max_k = int((kv[1:] - kv[:-1]).max())
    gold_out, gold_lse = mla.mla_decode_ref(**case, sm_scale=scale)
    pt_out, pt_lse = mla.mla_decode_torch(**case, sm_scale=scale, max_qo_len=max_q, max_kv_len=max_k)
    assert not torch.isnan(out).any(), f"{label}: NaN in kernel output (a stray read of an unused row?)"
    eps = torch.finfo(dtype).eps
    err = (out.float() - gold_out).abs()
    err_pt = (pt_out.float() - gold_out).abs().max().item()
    # floor: two ulps of the output's dtype, plus flash-attention's absolute 1e-5 (in fp32 the torch path
    # *is* the golden, error 0, and the kernel's different summation order still rounds differently)
    floor = 2 * eps * max(1.0, gold_out.abs().max().item()) + 1e-5
    lse_err = (lse - gold_lse).abs().max().item()
    lse_err_pt = (pt_lse - gold_lse).abs().max().item()
    cos = torch.nn.functional.cosine_similarity(lse.flatten().double(), gold_lse.flatten().double(), dim=0).item()
    print(f"{label}: out max {err.max().item():.2e} mean {err.mean().item():.2e} (torch {err_pt:.2e}); "
          f"lse max {lse_err:.2e} (torch {lse_err_pt:.2e}) 1-cos {1 - cos:.1e}")
    assert err.max().item() <= 2 * err_pt + floor, label
    # LSE is an fp32 computation in every path (scores accumulate in fp32): its floor is a few fp32 ulps.
    lse_floor = 8 * torch.finfo(torch.float32).eps * max(1.0, gold_lse.abs().max().item()) + 1e-5
    assert lse_err <= 2 * lse_err_pt + lse_floor, label
    assert 1 - cos < 1e-6, label


def assert_triton_exact(case, max_qo_len, num_splits, cfg):
    """``mla_decode_triton`` on an fp32 case (scale 0.1) equals the golden to fp32 rounding; returns its output."""
    out, lse = mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                     case["kv_indices"], max_qo_len, 0.1, num_splits=num_splits, config=cfg)
    gold_out, gold_lse = mla.mla_decode_ref(**case, sm_scale=0.1)
    torch.testing.assert_close(out, gold_out, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse, gold_lse, atol=2e-5, rtol=1e-5)
    return out, lse


# Interpreter grid (CPU): small, awkward. (qo_lens, kv_lens, heads)
INTERP_SCENARIOS = {
    "single_token_single_key": ([1], [1], 1),
    "decode_1_17_100": ([1, 1, 1], [1, 17, 100], 3),
    "sixteen_heads": ([1, 1], [33, 5], 16),
    "verify_qlen3": ([3, 3], [3, 40], 2),
    "verify_qlen5_one_req": ([5], [37], 3),
    "verify_qlen6": ([6, 6], [6, 21], 2),
    "verify_qlen7": ([7], [50], 2),
    "ragged_qlen": ([2, 5, 1], [9, 40, 33], 2),
    "qlen16": ([16], [20], 1),
    "128_heads": ([1], [24], 128),
}


@pytest.mark.skipif(ON_GPU, reason="interpreter grid; the GPU grid below covers compiled kernels")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("name", list(INTERP_SCENARIOS))
def test_triton_interpreter_matches_golden(name, dtype):
    qo, kv, heads = INTERP_SCENARIOS[name]
    case = make_case(qo, kv, heads, dtype=dtype, seed=hash(name) % 1000)
    res = mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case), sm_scale=0.08, backend="triton")
    assert res.backend == "triton" and res.out.dtype == dtype
    check_against_golden(case, res.out, res.lse, dtype, 0.08, f"{name} {dtype}")


@pytest.mark.skipif(ON_GPU, reason="interpreter only")
@pytest.mark.parametrize("qlen", range(1, 17))
def test_triton_every_qlen_interpreter(qlen):
    """Every query length 1..16 (not only powers of two): each position gets its own causal row."""
    case = make_case([qlen, qlen], [qlen, qlen + 19], 2, dtype=torch.float16, seed=qlen)
    out, lse = mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                     case["kv_indices"], qlen, 0.1, num_splits=2)
    check_against_golden(case, out, lse, torch.float16, 0.1, f"qlen {qlen}")
    if qlen > 1:  # positions differ (the aiter #2720 symptom would make them equal)
        assert (out[1] - out[0]).abs().max() > 1e-3


@pytest.mark.skipif(ON_GPU, reason="interpreter only")
@pytest.mark.parametrize("merge", ["kernel", "fused", "spin"])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7])
def test_split_counts_agree(num_splits, merge):
    """Splits (some empty for the shorter request) merged by LSE give the single-split answer, whether a
    second kernel merges (after the split grid, or as each row's counts complete: the spin merge) or the last
    split of each row block does; the fused and spin merges leave their counters at zero."""
    case = make_case([2, 2], [2, 50], 2, dtype=torch.float32, seed=3)
    cfg = dataclasses.replace(mla.triton_config(4, torch.float32), fused_merge=merge == "fused",
                              spin_merge=merge == "spin")
    for _ in range(2):  # twice: the second launch relies on the counters the first one reset
        out, _ = assert_triton_exact(case, 2, num_splits, cfg)
    if merge != "kernel" and num_splits > 1:
        assert int(mla._COUNTERS[out.device].abs().sum()) == 0


@pytest.mark.skipif(ON_GPU, reason="interpreter only")
@pytest.mark.parametrize("num_splits", [3, 5])
def test_merge_kernel_chunks_and_column_blocks(num_splits):
    """The second-kernel merge with its splits loaded in chunks (the last chunk partly past num_splits) and
    its columns cut into blocks (grid axis 1) gives the golden; 3 rows per request leave a partial row block."""
    case = make_case([1, 1], [3, 60], 3, dtype=torch.float32, seed=num_splits)
    cfg = dataclasses.replace(mla.triton_config(3, torch.float32), merge_split_chunk=2, merge_block_d=128)
    assert_triton_exact(case, 1, num_splits, cfg)


@pytest.mark.skipif(ON_GPU, reason="interpreter only")
def test_spin_merge_writes_nan_for_rows_whose_counts_never_complete():
    """The spin merge on its own: partials of 3 splits for 5 rows (one partial row block of 4-row tiles), with
    every row's count complete but row 2's (one split short, as if a split program never stored it). The others
    merge exactly (against a torch log-sum-exp merge); row 2 is NaN after MAX_SPIN polls, not a partial merge;
    counters and tickets are left zeroed for the next launch."""
    g = torch.Generator().manual_seed(4)
    S, R, D = 3, 5, mla.KV_LORA_RANK
    mid_o, mid_lse = torch.randn(S, R, D, generator=g), torch.randn(S, R, generator=g)
    mid_lse[1, 4] = float("-inf")  # a split that saw no key
    counters = torch.full((R,), S, dtype=torch.int32)
    counters[2] = S - 1
    done = torch.zeros(2, dtype=torch.int32)
    out, lse = torch.empty(R, D, dtype=torch.float16), torch.empty(R)
    mla._mla_decode_merge_kernel[(2, D // 128)](mid_o, mid_lse, out, lse, R, S, BLOCK_R=4, BLOCK_D=128,
                                                 SPLIT_CHUNK=2, D_LATENT=D, COUNTERS=counters, DONE=done, SPIN=True,
                                                 MAX_SPIN=3, num_warps=1)
    want_lse = torch.logsumexp(mid_lse, 0)
    want = (torch.exp(mid_lse - want_lse)[:, :, None] * mid_o).sum(0)
    keep = torch.tensor([0, 1, 3, 4])
    torch.testing.assert_close(out[keep].float(), want[keep], atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(lse[keep], want_lse[keep], atol=1e-5, rtol=1e-5)
    assert out[2].isnan().all() and lse[2].isnan()
    assert int(counters.abs().sum()) == 0 and int(done.abs().sum()) == 0


@pytest.mark.skipif(ON_GPU, reason="interpreter only")
@pytest.mark.parametrize("heads,qo_lens,kv_lens", [(8, [3, 2, 1], [5, 40, 17]), (16, [1, 2, 1], [70, 3, 9])])
def test_tma_store_partials_match_golden(heads, qo_lens, kv_lens):
    """``tma_store``: programs whose 16 rows are all real write their partial with one descriptor store, the
    others (8 heads: the last rows of a 3-token and of a 1-token request) by mask; three splits, some empty or
    ending inside a tile, merged by the second kernel, give the golden."""
    case = make_case(qo_lens, kv_lens, heads, dtype=torch.float32, seed=5)
    cfg = mla.TritonConfig(16, 16, 1, 1, tma_store=True)
    assert_triton_exact(case, max(qo_lens), 3, cfg)


@pytest.mark.skipif(ON_GPU, reason="interpreter only")
def test_split_merge_kernel_merges_its_slice_and_writes_nan_for_short_blocks():
    """``SPLIT_MERGE`` in the split kernel, launched by hand under the interpreter, where programs run one after
    another: in each row block only the last of the 3 splits finds every partial stored; it merges its column
    slices (64-column slices 2 and 5 of 8) exactly, while the first two time out after MAX_SPIN polls and write
    NaN over theirs (and the LSE, which split 0 writes), not a partial merge. The counters are left zeroed.
    On a GPU all splits are resident at once and wait for each other (the GPU tests)."""
    heads, splits = 4, 3
    case = make_case([2, 1], [70, 9], heads, dtype=torch.float32, seed=8)
    cfg = mla.TritonConfig(16, 16, 1, 1)
    total_q = case["q"].shape[0]
    total_rows, row_blocks = total_q * heads, 1
    mid_o = torch.zeros(splits, total_rows, DV)
    mid_lse = torch.zeros(splits, total_rows)
    out, lse = torch.zeros(total_q, heads, DV), torch.zeros(total_q, heads)
    counters = torch.zeros(2 * 2 * row_blocks, dtype=torch.int32)
    opts = mla.split_kernel_options(cfg, heads, torch.float32, torch.device("cpu"))
    mla._mla_decode_split_kernel[(row_blocks, splits, 2)](
        case["q"], case["kv_cache"].reshape(-1, D), case["kv_indices"], case["qo_indptr"], case["kv_indptr"], mid_o,
        mid_lse, out, lse, counters, D, total_rows, 0.1 * mla._LOG2E, splits, DIRECT=False, FUSED_MERGE=False,
        SPLIT_MERGE=True, MERGE_CHUNK=4, MAX_SPIN=3, **opts)
    gold_out, _ = mla.mla_decode_ref(**case, sm_scale=0.1)
    last = torch.cat([torch.arange(64 * c, 64 * c + 64) for c in (2, 5)])
    rest = torch.tensor([i for i in range(DV) if i not in set(last.tolist())])
    torch.testing.assert_close(out[..., last], gold_out[..., last], atol=2e-5, rtol=1e-5)
    assert out[..., rest].isnan().all() and lse.isnan().all()
    assert int(counters.abs().sum()) == 0


def test_split_merge_config_is_checked():
    for other in (dict(fused_merge=True), dict(balanced=True), dict(spin_merge=True), dict(tma_store=True)):
        with pytest.raises(ValueError, match="split_merge is a mode of the Triton split kernel"):
            mla.TritonConfig(16, 64, 8, 3, split_merge=True, **other)
    with pytest.raises(ValueError, match="split_merge is a mode of the Triton split kernel"):
        mla.TritonConfig(64, 64, 8, 2, gluon=True, split_merge=True)
    assert mla.TritonConfig(16, 64, 8, 3, split_merge=True).label.endswith(" sm")


@pytest.mark.skipif(ON_GPU, reason="interpreter only")
def test_split_merge_falls_back_to_the_merge_kernel_under_the_interpreter():
    """Programs of the interpreter run one after another, so a launch whose programs wait for each other is not
    made there: ``split_merge`` takes the second-kernel merge and still gives the golden."""
    case = make_case([2, 2], [2, 50], 2, dtype=torch.float32, seed=3)
    cfg = dataclasses.replace(mla.triton_config(4, torch.float32), split_merge=True)
    assert_triton_exact(case, 2, 3, cfg)


@pytest.mark.skipif(ON_GPU, reason="interpreter only")
@pytest.mark.parametrize("merge", ["kernel", "fused"])
@pytest.mark.parametrize("qo_lens,kv_lens,heads", [([1, 1, 1], [1, 17, 100], 3), ([2, 5, 1], [9, 40, 33], 2)])
def test_narrow_partials_match_golden(qo_lens, kv_lens, heads, merge):
    """``narrow_partials``: fp16 partial outputs (fp32 LSE) merged by the second kernel or by the last split,
    3 splits (some empty), within the derived tolerance of the golden."""
    case = make_case(qo_lens, kv_lens, heads, dtype=torch.float16, seed=6)
    cfg = dataclasses.replace(mla.triton_config(max(qo_lens) * heads, torch.float16), narrow_partials=True,
                              fused_merge=merge == "fused")
    assert mla.partial_dtype(cfg, torch.float16) == torch.float16
    out, lse = mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                     case["kv_indices"], max(qo_lens), 0.1, num_splits=3, config=cfg)
    check_against_golden(case, out, lse, torch.float16, 0.1, f"narrow {merge} {qo_lens}")


def test_narrow_partials_config_is_checked():
    for other in (dict(balanced=True), dict(tma_store=True)):
        with pytest.raises(ValueError, match="narrow_partials does not go with"):
            mla.TritonConfig(16, 64, 8, 3, narrow_partials=True, **other)
    cfg = mla.TritonConfig(16, 64, 8, 3, narrow_partials=True)
    assert cfg.label.endswith(" np") and mla.partial_dtype(cfg, torch.bfloat16) == torch.bfloat16
    assert mla.partial_dtype(mla.TritonConfig(16, 64, 8, 3), torch.bfloat16) == torch.float32


def test_tma_store_config_is_checked():
    for other in (dict(fused_merge=True), dict(balanced=True), dict(spin_merge=True)):
        with pytest.raises(ValueError, match="tma_store is a mode of the gluon split kernel"):
            mla.TritonConfig(16, 64, 8, 3, tma_store=True, **other)
    with pytest.raises(ValueError, match="tma_store is a mode of the gluon split kernel"):
        mla.TritonConfig(64, 64, 8, 2, gluon=True, gluon_ws=True, tma_store=True)
    assert mla.TritonConfig(16, 64, 8, 3, tma_store=True).label.endswith(" tma")


def test_spin_merge_config_is_checked():
    for other in (dict(fused_merge=True), dict(balanced=True), dict(meta_before_wait=True, pdl_split=True)):
        with pytest.raises(ValueError, match="spin_merge is a mode of the Triton split kernel"):
            mla.TritonConfig(16, 64, 8, 3, spin_merge=True, **other)
    with pytest.raises(ValueError, match="spin_merge is a mode of the Triton split kernel"):
        mla.TritonConfig(64, 64, 8, 2, gluon=True, spin_merge=True)
    assert mla.TritonConfig(16, 64, 8, 3, spin_merge=True).label.endswith(" spin")


# The kernel variants the H200 sweeps tried (rounds 3-6 under `explore` in the decode JSON; all slower than
# the defaults there, kept so that the measurements can be reproduced): each must still be exact.
VARIANTS = {
    "swap_ab": dict(swap_ab=True, idx_ahead=False),  # the transposed products in the plain loop (rounds 3-7)
    "swap_ab_idx_ahead": dict(swap_ab=True, idx_ahead=True),  # ... in the loop that loads indices a tile ahead
    "prefetch": dict(prefetch=True),
    "balanced": dict(balanced=True, merge_split_chunk=2),
    "max_regs": dict(max_regs=128, num_warps=4),  # a launch option (the interpreter ignores it)
    "warp_specialize": dict(warp_specialize=True, block_m=64, num_warps=8, num_stages=3),  # see TritonConfig
    "idx_ahead": dict(idx_ahead=True),
    "l2_ahead": dict(idx_ahead=True, l2_ahead=2),  # the prefetch is PTX: compiled NVIDIA only
    "idx_dist2": dict(idx_ahead=True, idx_dist=2),
    "idx_dist3": dict(idx_ahead=True, idx_dist=3, num_stages=4),
    "idx_prefetch_l1": dict(idx_ahead=True, idx_prefetch=1),  # the prefetch is PTX: compiled NVIDIA only
    "idx_prefetch_l2": dict(idx_ahead=True, idx_prefetch=2),
    "pdl_split": dict(pdl_split=True, pdl=True),
    "meta_before_wait": dict(pdl_split=True, pdl=True, meta_before_wait=True),  # PDL launches: compiled NVIDIA sm90+ only (else plain launches)
    "prefetch_before_wait": dict(pdl_split=True, pdl=True, prefetch_before_wait=2),  # PTX: compiled NVIDIA only
}
# (qo_lens, kv_lens, heads, splits or programs): ragged queries, a request with no query tokens, keys shorter
# than one tile, splits/programs that leave some empty, more programs than tokens.
VARIANT_CASES = [
    ([1, 1, 1], [1, 40, 70], 16, 3),
    ([3, 3], [3, 50], 5, 2),
    ([2, 1, 4], [2, 33, 4], 16, 7),
    ([1, 0, 2], [17, 5, 30], 3, 6),
    ([2, 2], [2, 2], 3, 9),
]


@pytest.mark.skipif(ON_GPU, reason="interpreter only")
@pytest.mark.parametrize("case_id", range(len(VARIANT_CASES)))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_kernel_variants_match_golden_interpreter(variant, case_id):
    qo, kv, heads, splits = VARIANT_CASES[case_id]
    case = make_case(qo, kv, heads, dtype=torch.float32, seed=case_id)
    cfg = dataclasses.replace(mla.triton_config(max(qo) * heads, torch.float32), **VARIANTS[variant])
    assert_triton_exact(case, max(qo), splits, cfg)


@pytest.mark.skipif(ON_GPU, reason="interpreter only")
def test_balanced_request_search_over_several_chunks(monkeypatch):
    """The balanced kernel finds each program's first request by counting kv_indptr entries in chunks of
    BLOCK_B; with the chunk capped at 16, 40 ragged requests (some of one key) need three chunks."""
    monkeypatch.setattr(mla, "_BALANCED_MAX_BLOCK_B", 16)
    kv = [1 + (7 * i) % 23 for i in range(40)]
    case = make_case([1] * 40, kv, 1, dtype=torch.float32, seed=40)
    cfg = dataclasses.replace(mla.triton_config(1, torch.float32), balanced=True)
    assert_triton_exact(case, 1, 7, cfg)


def test_register_cap_must_leave_room_for_the_accumulator():
    mla.TritonConfig(16, 64, 4, 2, max_regs=128)  # 64 + 32 registers: fine
    with pytest.raises(ValueError, match=r"max_regs is 128.*160 registers per thread for a 64-row tile on 8 warps"):
        mla.TritonConfig(64, 64, 8, 3, max_regs=128)
    with pytest.raises(ValueError, match="32..255"):
        mla.TritonConfig(16, 64, 4, 2, max_regs=300)


def test_warp_specialize_refuses_small_tiles():
    with pytest.raises(ValueError, match="warp_specialize needs block_m >= 64 and num_warps == 8"):
        mla.TritonConfig(16, 64, 4, 2, warp_specialize=True)
    with pytest.raises(ValueError, match="got block_m 64 and num_warps 4"):
        mla.TritonConfig(64, 64, 4, 2, warp_specialize=True)
    mla.TritonConfig(64, 64, 8, 3, warp_specialize=True)


def test_l2_ahead_needs_idx_ahead():
    with pytest.raises(ValueError, match="l2_ahead is 2; .* only with idx_ahead=True"):
        mla.TritonConfig(16, 64, 4, 2, l2_ahead=2)
    with pytest.raises(ValueError, match="l2_ahead is -1"):
        mla.TritonConfig(16, 64, 4, 2, idx_ahead=True, l2_ahead=-1)
    assert mla.l2_ahead_for(mla.TritonConfig(16, 64, 4, 2, idx_ahead=True, l2_ahead=2), torch.device("cpu")) == 0


def test_balanced_programs_follow_the_slots_and_small_batches():
    cfg = mla.TritonConfig(16, 64, 4, 2, programs_per_sm=2, balanced=True)
    assert mla.choose_balanced_programs(1, 128 * 8192, cfg, 132) == 264  # every slot once
    assert mla.choose_balanced_programs(2, 128 * 8192, cfg, 132) == 132  # per row block
    assert mla.choose_balanced_programs(1, 1000, cfg, 132) == 8  # >= 128 tokens per program
    assert mla.choose_balanced_programs(1, 0, cfg, 132) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA or ROCm GPU (compiled Triton)")
@pytest.mark.parametrize("qlen", [1, 3, 8])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_kernel_variants_gpu(variant, qlen):
    kv = [max(n, qlen) for n in GPU_KV_LENS_VARIANTS]
    case = make_case([qlen] * len(kv), kv, 16, dtype=torch.bfloat16, device="cuda", seed=qlen)
    base = mla.triton_config(qlen * 16, torch.bfloat16, gluon=False)  # the Triton kernel's switches
    if variant == "max_regs" and base.block_m * 512 // (32 * base.num_warps) + 32 > 128:
        with pytest.raises(ValueError, match="max_regs is 128"):  # no room for this tile's accumulator
            dataclasses.replace(base, **VARIANTS[variant])
        return
    cfg = dataclasses.replace(base, **VARIANTS[variant])
    if cfg.block_m > 32 and (cfg.swap_ab or cfg.idx_ahead):
        cfg = dataclasses.replace(cfg, num_stages=2)  # 64 rows with 3 stages of these exceed shared memory
    out, lse = mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                     case["kv_indices"], qlen, 0.07, config=cfg)
    check_against_golden(case, out, lse, torch.bfloat16, 0.07, f"{variant} qlen {qlen}")


GPU_KV_LENS_VARIANTS = [1, 17, 100, 1000, 4099]


# GPU grid: every qlen 1..16, 16 and 128 heads (and an odd count), bf16 and fp16.
GPU_KV_LENS = [1, 17, 100, 1000, 4099]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA or ROCm GPU (compiled Triton)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads", [16, 128, 3])
@pytest.mark.parametrize("qlen", range(1, 17))
def test_triton_gpu_matches_golden(qlen, heads, dtype):
    kv = [max(n, qlen) for n in GPU_KV_LENS]
    case = make_case([qlen] * len(kv), kv, heads, dtype=dtype, device="cuda", seed=qlen * 7 + heads)
    res = mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case), sm_scale=0.07, backend="triton")
    check_against_golden(case, res.out, res.lse, dtype, 0.07, f"qlen {qlen} H {heads} {dtype}")


def assert_graph_replays_equal(call, eager_out):
    """``call(out)`` captured in a CUDA graph (after one eager warm-up call, which compiles and allocates the
    fused merge's counters): three replays, each into a NaN-filled ``out``, must give ``eager_out`` bit for bit
    (the replays also reuse the counters the previous launch reset)."""
    out = torch.empty_like(eager_out)
    call(out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(out)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, eager_out, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA or ROCm GPU (compiled Triton)")
@pytest.mark.parametrize("merge", ["kernel", "fused", "spin"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_gpu_ragged_and_cuda_graph(dtype, merge):
    """Ragged query lengths, the three merge designs, and CUDA-graph replays giving the eager answer."""
    case = make_case([1, 4, 7, 2], [300, 5000, 7, 64], 16, dtype=dtype, device="cuda", seed=11)
    md = metadata_of(case)
    cfg = dataclasses.replace(mla.triton_config(7 * 16, dtype, gluon=False), fused_merge=merge == "fused",
                              spin_merge=merge == "spin")
    args = (case["q"], case["kv_cache"], md.qo_indptr, md.kv_indptr, md.kv_indices, md.max_qo_len, 0.07)
    eager_out, eager_lse = mla.mla_decode_triton(*args, config=cfg, num_splits=8)
    check_against_golden(case, eager_out, eager_lse, dtype, 0.07, f"ragged {dtype} merge={merge}")
    assert_graph_replays_equal(lambda out: mla.mla_decode_triton(*args, config=cfg, num_splits=8, out=out), eager_out)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA or ROCm GPU (compiled Triton)")
@pytest.mark.parametrize("pdl", [True, False, "split", "meta", "spin"])
@pytest.mark.parametrize("batch_tokens", [None, 65536])  # the large- and the small-batch defaults
@pytest.mark.parametrize("qlen", [1, 2, 3])
def test_default_configs_gpu_eager_and_graph(qlen, batch_tokens, pdl):
    """Both size classes of the default config (the tests' own batches are small, so the large-batch
    config is forced here), with and without the PDL-launched merge (and with both kernels PDL-launched),
    eagerly and under CUDA-graph replay."""
    case = make_case([qlen] * 5, [max(n, qlen) for n in GPU_KV_LENS], 16, dtype=torch.bfloat16, device="cuda",
                     seed=qlen)
    cfg = dataclasses.replace(mla.triton_config(qlen * 16, torch.bfloat16, batch_tokens, gluon=False), pdl=bool(pdl),
                              pdl_split=pdl in ("split", "meta", "spin"), meta_before_wait=pdl == "meta",
                              spin_merge=pdl == "spin")
    args = (case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"], qlen, 0.07)
    eager_out, eager_lse = mla.mla_decode_triton(*args, config=cfg, num_splits=6)
    check_against_golden(case, eager_out, eager_lse, torch.bfloat16, 0.07, f"{cfg.label} qlen {qlen}")
    assert_graph_replays_equal(lambda out: mla.mla_decode_triton(*args, config=cfg, num_splits=6, out=out), eager_out)


# the gluon kernels' GPU tests
NEEDS_HOPPER = pytest.mark.skipif(
    not (ON_GPU and torch.version.hip is None and torch.cuda.get_device_capability()[0] == 9),
    reason="the gluon kernels need an NVIDIA Hopper GPU, compute capability 9.x (wgmma)")
def ragged_gpu_case(qo_lens, heads, dtype, seed):
    """The GPU tests' ragged batch: three requests of query lengths ``qo_lens`` and 4099, 1 and 100 keys (at least
    their query length), NaN in unused cache rows; returns the case and ``mla_decode_triton``'s positional
    arguments (scale 0.07)."""
    kv_lens = [max(n, q) for n, q in zip([4099, 1, 100], qo_lens)]
    case = make_case(qo_lens, kv_lens, heads, dtype=dtype, device="cuda", seed=seed)
    return case, (case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"],
                  max(qo_lens), 0.07)


@pytest.mark.gpu
@NEEDS_HOPPER
@pytest.mark.parametrize("pbw", [1, 2, 3])
@pytest.mark.parametrize("qo_lens,seq_lens", [([1, 1, 1], [4099, 1, 100]), ([2, 1, 4], [700, 3, 1500])])
def test_prefetch_before_wait_is_exact_right_after_the_metadata_is_built(pbw, qo_lens, seq_lens):
    """``prefetch_before_wait`` reads the metadata before the split kernel's PDL wait, but only to form prefetch
    addresses. Here the metadata is written by the index expansion launched just before (PDL: the split programs
    can start while it still writes) into buffers that held out-of-range garbage: the pre-wait reads see it, and
    the clamped prefetches must neither fault nor change a bit of the output (the default config's, with the same
    split count), eager and under CUDA-graph replay; the output also matches the golden."""
    from workbench.expand import expand_page_indices

    ex = mla.make_decode_example(qo_lens, seq_lens, 16, 16, dtype=torch.bfloat16, device_="cuda", seed=pbw)
    md = ex.metadata
    base = mla.TritonConfig(16, 64, 8, 3, programs_per_sm=1, idx_ahead=True, pdl=True, pdl_split=True)
    cfg = dataclasses.replace(base, prefetch_before_wait=pbw)
    want, want_lse = mla.mla_decode_triton(ex.q, ex.flat_cache, md.qo_indptr, md.kv_indptr, md.kv_indices,
                                           max(qo_lens), 0.07, config=base, num_splits=5)
    idx = torch.full_like(md.kv_indices, 2**31 - 1)
    indptr = torch.full_like(md.kv_indptr, -(2**30))

    def call(o):
        idx.fill_(2**31 - 1)  # garbage the pre-wait reads may see: the expansion below rewrites both buffers
        indptr.fill_(-(2**30))
        expand_page_indices(ex.block_table, ex.seq_lens, 16, out=idx, kv_indptr=indptr, max_seq_len=max(seq_lens),
                            validate=False)
        return mla.mla_decode_triton(ex.q, ex.flat_cache, md.qo_indptr, indptr, idx, max(qo_lens), 0.07,
                                     config=cfg, num_splits=5, out=o)

    out = torch.full_like(want, float("nan"))
    out, lse = call(out)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=0)
    case = dict(q=ex.q, kv_cache=ex.flat_cache.view(-1, 576), qo_indptr=md.qo_indptr, kv_indptr=md.kv_indptr,
                kv_indices=md.kv_indices)
    check_against_golden(case, out, lse, torch.bfloat16, 0.07, f"{cfg.label} q{qo_lens}")
    assert_graph_replays_equal(lambda o: call(o)[0], out)


def test_prefetch_before_wait_config_is_checked():
    for other in (dict(), dict(pdl_split=True, meta_before_wait=True), dict(pdl_split=True, balanced=True)):
        with pytest.raises(ValueError, match="prefetch_before_wait is 2"):
            mla.TritonConfig(16, 64, 8, 3, prefetch_before_wait=2, **other)
    with pytest.raises(ValueError, match="prefetch_before_wait is -1"):
        mla.TritonConfig(16, 64, 8, 3, pdl_split=True, prefetch_before_wait=-1)
    assert mla.TritonConfig(16, 64, 8, 3, pdl_split=True, prefetch_before_wait=2).label.endswith(" pdls pbw2")


GLUON = mla.TritonConfig(64, 64, 8, 2, programs_per_sm=1, gluon=True)
GLUON_PDLS = dataclasses.replace(GLUON, pdl=True, pdl_split=True)  # split kernel and merge PDL-launched
GLUON_32X4 = dataclasses.replace(GLUON_PDLS, block_n=32, num_stages=4)  # 32-token tiles, three in flight
# (heads, query lengths) of the gluon kernels' golden tests: 128 heads, ragged and causal qlen up to 16
GLUON_CASES = [(128, [1, 1, 1]), (16, [4, 4, 4]), (16, [3, 1, 4]), (16, [1, 2, 1]), (16, [16, 7, 1])]


@pytest.mark.gpu
@NEEDS_HOPPER
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,qo_lens", GLUON_CASES)
@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("pdl", [False, True, "32x4"])
def test_gluon_split_kernel_matches_golden(heads, qo_lens, num_splits, dtype, pdl):
    """The gluon split kernel: 64-row programs (two of them for 128 heads, a partly empty one for 48 rows),
    ragged and causal query lengths, splits that are empty or end inside a tile, lengths 1..4099, against the
    golden; NaN in every unused cache row. ``32x4``: 32-token tiles in four buffers (three tiles in flight)."""
    case, args = ragged_gpu_case(qo_lens, heads, dtype, seed=heads + num_splits)
    cfg = {False: GLUON, True: GLUON_PDLS, "32x4": GLUON_32X4}[pdl]
    out, lse = mla.mla_decode_triton(*args, config=cfg, num_splits=num_splits)
    check_against_golden(case, out, lse, dtype, 0.07, f"{cfg.label} H{heads} q{qo_lens} s{num_splits} {dtype}")
    assert_graph_replays_equal(lambda o: mla.mla_decode_triton(*args, config=cfg, num_splits=num_splits, out=o), out)


GLUON_CLUSTER = dataclasses.replace(GLUON_PDLS, cluster_merge=True)
GLUON_WS = dataclasses.replace(GLUON_PDLS, gluon_ws=True)


@pytest.mark.gpu
@pytest.mark.skipif(not (ON_GPU and torch.version.hip is None), reason="needs an NVIDIA GPU (CUDA's occupancy query)")
@pytest.mark.parametrize("block_m,qo_lens", [(16, [1, 1, 1]), (16, [2, 2, 2]), (32, [2, 2, 2]), (32, [3, 1, 4]),
                                             (16, [16, 7, 1])])
@pytest.mark.parametrize("num_splits", [3, 8, 64])
def test_split_merge_matches_golden_and_falls_back_when_the_grid_does_not_fit(block_m, qo_lens, num_splits):
    """``split_merge``: the splits of each row block merge it themselves (no second kernel) when the whole grid
    fits on the GPU at once; 64 splits of up to 7 row blocks of 3 requests do not fit and take the second-kernel
    merge. Ragged and causal query lengths, splits that are empty or end inside a tile; NaN in unused cache rows
    and in the output buffer; the counters left zeroed; graph replays bit-exact; within rounding of the
    second-kernel merge."""
    case, args = ragged_gpu_case(qo_lens, 16, torch.bfloat16, seed=block_m + num_splits + 400)
    base = mla.TritonConfig(block_m, 64, 8, 3, idx_ahead=True, pdl=True, pdl_split=True)
    cfg = dataclasses.replace(base, split_merge=True)
    out = torch.full_like(case["q"][..., :512], float("nan"))
    out, lse = mla.mla_decode_triton(*args, config=cfg, num_splits=num_splits, out=out)
    check_against_golden(case, out, lse, torch.bfloat16, 0.07, f"{cfg.label} q{qo_lens} s{num_splits}")
    plain, _ = mla.mla_decode_triton(*args, config=base, num_splits=num_splits)
    torch.testing.assert_close(out, plain, rtol=1e-2, atol=1e-2)
    assert int(mla._COUNTERS[out.device].abs().sum()) == 0
    assert_graph_replays_equal(lambda o: mla.mla_decode_triton(*args, config=cfg, num_splits=num_splits, out=o), out)
    assert int(mla._COUNTERS[out.device].abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not (ON_GPU and torch.version.hip is None), reason="needs an NVIDIA GPU (CUDA's occupancy query)")
def test_resident_capacity_is_the_occupancy_times_the_sms():
    """The capacity the split merge relies on: 1 program per SM for the 168 KB small-batch tile, 2 for the 93 KB
    large-batch one (an H100/H200's 228 KB per SM)."""
    case = make_case([1, 1], [100, 100], 16, dtype=torch.bfloat16, device="cuda", seed=1)
    sms = mla._sm_count(torch.device("cuda"))
    caps = {}
    for cfg in (mla.TritonConfig(16, 64, 8, 3, idx_ahead=True), mla.TritonConfig(16, 32, 4, 3, idx_ahead=True)):
        opts = mla.split_kernel_options(cfg, 16, torch.bfloat16, torch.device("cuda"))
        total = 2 * 16
        mid_o = torch.empty(4, total, 512, device="cuda")
        mid_lse = torch.empty(4, total, device="cuda")
        cache = case["kv_cache"].reshape(-1, D)
        args = (case["q"], cache, case["kv_indices"], case["qo_indptr"], case["kv_indptr"], mid_o, mid_lse,
                case["q"][..., :512], mid_lse, case["kv_indptr"], D, total, 1.0, 4)
        caps[cfg.block_n] = mla.resident_capacity(mla._mla_decode_split_kernel, (1, 4, 2), args,
                                                  dict(opts, DIRECT=False, FUSED_MERGE=False, SPLIT_MERGE=True),
                                                  torch.device("cuda"))
    if torch.cuda.get_device_capability()[0] == 9:
        assert caps == {64: sms, 32: 2 * sms}, caps
    assert all(c >= sms for c in caps.values()), caps


@pytest.mark.gpu
@NEEDS_HOPPER
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kernel", ["gluon", "gluon_ws", "gluon_cluster", "triton16", "triton32", "fused"])
@pytest.mark.parametrize("heads,qo_lens", [(16, [4, 4, 4]), (16, [3, 1, 4]), (128, [1, 2, 1]), (16, [1, 1, 1])])
def test_narrow_partials_match_golden_gpu(kernel, heads, qo_lens, dtype):
    """``narrow_partials`` (16-bit partial outputs) on every split kernel and merge that takes them: within the
    derived tolerance of the golden; against the fp32-partial result within the rounding bound (each partial
    rounded once more, and the merge a convex combination of partials no larger than the largest value of V:
    eps * max|V| + eps * |out|); NaN in the output buffer and in unused cache rows; graph replays bit-exact."""
    case, args = ragged_gpu_case(qo_lens, heads, dtype, seed=heads + len(kernel) + 500)
    base = {"gluon": GLUON_PDLS, "gluon_ws": GLUON_WS, "gluon_cluster": GLUON_CLUSTER,
            "triton16": mla.TritonConfig(16, 64, 8, 3, idx_ahead=True, pdl=True, pdl_split=True),
            "triton32": mla.TritonConfig(32, 64, 8, 3, idx_ahead=True, pdl=True, pdl_split=True),
            "fused": mla.TritonConfig(16, 64, 8, 3, fused_merge=True)}[kernel]
    cfg = dataclasses.replace(base, narrow_partials=True)
    out = torch.full_like(case["q"][..., :512], float("nan"))
    out, lse = mla.mla_decode_triton(*args, config=cfg, num_splits=8, out=out)
    check_against_golden(case, out, lse, dtype, 0.07, f"{cfg.label} H{heads} q{qo_lens} {dtype}")
    wide, wide_lse = mla.mla_decode_triton(*args, config=base, num_splits=8)
    eps = torch.finfo(dtype).eps
    v_max = case["kv_cache"].reshape(-1, D)[case["kv_indices"].long(), :DV].float().abs().max()
    diff = (out.float() - wide.float()).abs()
    assert (diff <= eps * v_max + eps * wide.float().abs() + 1e-6).all(), float(diff.max())
    torch.testing.assert_close(lse, wide_lse, rtol=0, atol=1e-5)
    assert_graph_replays_equal(lambda o: mla.mla_decode_triton(*args, config=cfg, num_splits=8, out=o), out)


@pytest.mark.gpu
@NEEDS_HOPPER
@pytest.mark.parametrize("kernel", ["gluon", "triton16", "triton32"])
@pytest.mark.parametrize("heads,qo_lens", [(16, [4, 4, 4]), (16, [3, 1, 4]), (128, [1, 2, 1]), (16, [1, 1, 1])])
@pytest.mark.parametrize("num_splits", [3, 8])
def test_tma_store_matches_default_bit_for_bit(kernel, heads, qo_lens, num_splits):
    """``tma_store`` on the gluon kernel and on the Triton split kernel (16- and 32-row tiles): whole row blocks
    leave by TMA, partial ones (48 rows; a 16-row request in a 32-row tile) by mask. The partials hold the same
    values either way, so the merged output must equal the default's bit for bit; NaN in the output buffer and
    in unused cache rows; graph replays bit-exact."""
    case, args = ragged_gpu_case(qo_lens, heads, torch.bfloat16, seed=heads + num_splits + 300)
    base = {"gluon": GLUON_PDLS, "triton16": mla.TritonConfig(16, 64, 8, 3, idx_ahead=True, pdl=True, pdl_split=True),
            "triton32": mla.TritonConfig(32, 64, 8, 2, pdl=True, pdl_split=True)}[kernel]
    assert_same_bits_as(case, args, base, dataclasses.replace(base, tma_store=True), num_splits)


def assert_same_bits_as(case, args, base, cfg, num_splits):
    """``cfg`` (a variant that changes how values travel, not what they are) gives ``base``'s output and LSE bit
    for bit on ``ragged_gpu_case``'s batch, into a NaN-filled buffer, matches the golden, and replays bit-exact."""
    want, want_lse = mla.mla_decode_triton(*args, config=base, num_splits=num_splits)
    out = torch.full_like(case["q"][..., :512], float("nan"))
    out, lse = mla.mla_decode_triton(*args, config=cfg, num_splits=num_splits, out=out)
    check_against_golden(case, out, lse, torch.bfloat16, 0.07, f"{cfg.label} s{num_splits}")
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=0)
    assert_graph_replays_equal(lambda o: mla.mla_decode_triton(*args, config=cfg, num_splits=num_splits, out=o), out)


@pytest.mark.gpu
@NEEDS_HOPPER
@pytest.mark.parametrize("kernel", ["gluon", "gluon_ws"])
@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("heads,qo_lens", [(16, [4, 4, 4]), (16, [3, 1, 4]), (128, [1, 2, 1]), (16, [1, 1, 1])])
@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_coalesced_store_matches_default_bit_for_bit(kernel, narrow, heads, qo_lens, num_splits):
    """``coalesced_store`` on both gluon kernels: the output (one split) or partial is staged in shared memory and
    stored row-major (rows past the request's end masked: 48 of 64 rows, 16 of 64). Same values either way, so
    the output equals the default's (with the same partial dtype) bit for bit; NaN in the output buffer and in
    unused cache rows; graph replays bit-exact."""
    case, args = ragged_gpu_case(qo_lens, heads, torch.bfloat16, seed=heads + num_splits + 400)
    base = dataclasses.replace(GLUON_PDLS if kernel == "gluon" else GLUON_WS, narrow_partials=narrow)
    assert_same_bits_as(case, args, base, dataclasses.replace(base, coalesced_store=True), num_splits)


def test_coalesced_store_config_is_checked():
    for other in (dict(), dict(gluon=True, cluster_merge=True), dict(gluon=True, tma_store=True)):
        with pytest.raises(ValueError, match="coalesced_store is a mode of the gluon split kernels"):
            mla.TritonConfig(64, 64, 8, 2, coalesced_store=True, **other)
    assert mla.TritonConfig(64, 64, 8, 2, gluon=True, coalesced_store=True).label.endswith(" cst")


GLUON_WS_HANDOFF = dataclasses.replace(GLUON_WS, coalesced_store=True, ws_handoff=True)


@pytest.mark.gpu
@NEEDS_HOPPER
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,qo_lens", GLUON_CASES)
@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("schedule", ["first", "handoff"])
def test_gluon_ws_kernel_matches_golden(heads, qo_lens, num_splits, dtype, schedule):
    """The warp-specialised gluon kernel (TritonConfig.gluon_ws), its first schedule and the hand-over schedule
    (``ws_handoff``, round 38): the cases of the gluon test above (32-token tiles here, so splits end inside a tile
    differently), against the golden, NaN in unused cache rows and in the output buffer, graph replays
    bit-exact."""
    cfg = {"first": GLUON_WS, "handoff": GLUON_WS_HANDOFF}[schedule]
    case, args = ragged_gpu_case(qo_lens, heads, dtype, seed=heads + num_splits + (200 if schedule == "first" else 250))
    out = torch.full_like(case["q"][..., :512], float("nan"))
    out, lse = mla.mla_decode_triton(*args, config=cfg, num_splits=num_splits, out=out)
    check_against_golden(case, out, lse, dtype, 0.07, f"{cfg.label} H{heads} q{qo_lens} s{num_splits} {dtype}")
    assert_graph_replays_equal(lambda o: mla.mla_decode_triton(*args, config=cfg, num_splits=num_splits, out=o), out)


@pytest.mark.gpu
@NEEDS_HOPPER
@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("heads,qo_lens", [(16, [4, 4, 4]), (16, [3, 1, 4]), (128, [1, 2, 1]), (16, [16, 7, 1]),
                                           (16, [1, 1, 1])])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 8, 40])
def test_gluon_ws_handoff_schedule_agrees_with_first_schedule(narrow, heads, qo_lens, num_splits):
    """``ws_handoff`` adds the same products in the same order; only the running sum is formed as two shares
    added at the end instead of one chain (fp32 sums of at most 2^-24 relative difference), so its output is
    within one rounding of the output dtype of the first schedule's and its LSE within 1e-5. The split counts
    give programs of 0, 1, 2, 4, 10, 17 and 129 tiles of 32 tokens (odd and even: the last tile is either
    warpgroup's), where the peeled first tile and the last tile's hand-over meet. NaN in the output buffer and in
    unused cache rows."""
    case, args = ragged_gpu_case(qo_lens, heads, torch.bfloat16, seed=heads + num_splits + 450)
    base = dataclasses.replace(GLUON_WS, coalesced_store=True, narrow_partials=narrow)
    want, want_lse = mla.mla_decode_triton(*args, config=base, num_splits=num_splits)
    out = torch.full_like(case["q"][..., :512], float("nan"))
    out, lse = mla.mla_decode_triton(*args, config=dataclasses.replace(base, ws_handoff=True), num_splits=num_splits,
                                     out=out)
    eps = torch.finfo(torch.bfloat16).eps
    diff = (out.float() - want.float()).abs()
    bound = 2 * eps * want.float().abs() + 1e-6 + (eps * want.float().abs().max() if narrow else 0.0)
    assert (diff <= bound).all(), float(diff.max())
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-5)
    check_against_golden(case, out, lse, torch.bfloat16, 0.07, f"ws ho s{num_splits} q{qo_lens}")


@pytest.mark.gpu
@NEEDS_HOPPER
@pytest.mark.parametrize("mode", ["ws_idx_ahead", "ws_early_q", "both"])
@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("heads,qo_lens", [(16, [4, 4, 4]), (16, [3, 1, 4]), (128, [1, 2, 1]), (16, [16, 7, 1])])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 40])
def test_gluon_ws_loader_modes_match_handoff_bit_for_bit(mode, narrow, heads, qo_lens, num_splits):
    """``ws_idx_ahead`` and ``ws_early_q`` (round 39) change when the indices and the query tile arrive, not what is
    computed: output and LSE equal the hand-over schedule's bit for bit, over programs of 0 to 129 tiles (40 splits
    leave some programs without a tile, where the loader's first index load is masked off entirely), NaN in the
    output buffer and in unused cache rows, golden check, graph replays bit-exact."""
    case, args = ragged_gpu_case(qo_lens, heads, torch.bfloat16, seed=heads + num_splits + 470)
    base = dataclasses.replace(GLUON_WS_HANDOFF, narrow_partials=narrow)
    flags = dict(ws_idx_ahead=mode != "ws_early_q", ws_early_q=mode != "ws_idx_ahead")
    assert_same_bits_as(case, args, base, dataclasses.replace(base, **flags), num_splits)


def test_ws_loader_modes_config_is_checked():
    for flag in ("ws_idx_ahead", "ws_early_q"):
        with pytest.raises(ValueError, match="modes of the hand-over schedule: they need ws_handoff=True"):
            dataclasses.replace(GLUON_WS, coalesced_store=True, **{flag: True})
    both = dataclasses.replace(GLUON_WS_HANDOFF, ws_idx_ahead=True, ws_early_q=True)
    assert both.label.endswith(" ho wia weq") and both.key != GLUON_WS_HANDOFF.key


def test_ws_split_merge_config_is_checked():
    with pytest.raises(ValueError, match="ws_split_merge is written for the warp-specialised kernel's idx-ahead loader"):
        dataclasses.replace(GLUON_WS_HANDOFF, ws_split_merge=True)
    cfg = dataclasses.replace(GLUON_WS_HANDOFF, ws_idx_ahead=True, ws_split_merge=True)
    assert cfg.label.endswith(" ho wia wsm") and cfg.key != dataclasses.replace(cfg, ws_split_merge=False).key


@pytest.mark.gpu
@NEEDS_HOPPER
@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("heads,qo_lens", [(16, [4, 4, 4]), (16, [3, 1, 4]), (128, [1, 2, 1]), (16, [16, 7, 1])])
@pytest.mark.parametrize("num_splits", [8, 3])
def test_gluon_ws_split_merge_agrees_with_the_merge_kernel(narrow, heads, qo_lens, num_splits):
    """``ws_split_merge`` (round 40, opt-in): with 8 splits the programs merge their own partials (the compiled
    kernel has the count's release), the same weights applied in another order, so the output is within one
    rounding of the merge kernel's and the LSE within 1e-5; the counter workspace is left zeroed for the next
    launch; graph replays bit-exact; golden check. Other split counts (3) take the merge kernel and give its bits.
    NaN in the output buffer and in unused cache rows; requests of 1 to 16 query tokens (48 of 64 rows, 16 heads
    x 3; two row blocks with 128 heads)."""
    case, args = ragged_gpu_case(qo_lens, heads, torch.bfloat16, seed=heads + num_splits + 490)
    base = dataclasses.replace(GLUON_WS_HANDOFF, ws_idx_ahead=True, narrow_partials=narrow)
    cfg = dataclasses.replace(base, ws_split_merge=True)
    want, want_lse = mla.mla_decode_triton(*args, config=base, num_splits=num_splits)
    out = torch.full_like(case["q"][..., :512], float("nan"))
    out, lse = mla.mla_decode_triton(*args, config=cfg, num_splits=num_splits, out=out)
    ran = "red.release.gpu" in mla.LAST_COMPILED["split"].asm["ptx"]
    assert ran == (num_splits == 8)
    counters = mla._COUNTERS.get(out.device)
    assert counters is None or int(counters.abs().sum()) == 0
    check_against_golden(case, out, lse, torch.bfloat16, 0.07, f"{cfg.label} s{num_splits}")
    if ran:
        eps = torch.finfo(torch.bfloat16).eps
        diff = (out.float() - want.float()).abs()
        assert (diff <= 2 * eps * want.float().abs() + 1e-6).all(), float(diff.max())
        torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-5)
    else:
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        torch.testing.assert_close(lse, want_lse, rtol=0, atol=0)
    assert_graph_replays_equal(lambda o: mla.mla_decode_triton(*args, config=cfg, num_splits=num_splits, out=o), out)
    assert counters is None or int(counters.abs().sum()) == 0


@pytest.mark.gpu
@NEEDS_HOPPER
@pytest.mark.parametrize("heads,qlen,kernel,kv_base", [(128, 1, "ws", 8000), (16, 6, "ws", 8000),
                                                       (128, 1, "ws_ia", 2500), (16, 4, "ws_ia", 2500),
                                                       (16, 2, "swap", 2500), (16, 1, "swap", 2500)])
def test_default_picks_gluon_ws_for_long_programs_and_matches_golden(heads, qlen, kernel, kv_base):
    """By default a batch of more than 32 rows per request whose programs take >= GLUON_WS_MIN_TOKENS tokens runs
    the warp-specialised kernel (40 ragged requests of ``kv_base`` + 37 i tokens), with the idx-ahead loader for one
    row block per request (16 heads qlen 4) or programs of at most GLUON_WS_IDX_AHEAD_MAX_TOKENS (3 splits of about
    1070 tokens on an H200), and the committed loader with two row blocks and longer programs (about 2900: 128 heads,
    16 heads qlen 6); one of at most 32 rows (16 heads x qlen 1 or 2) runs the swapped kernel at any size
    (thirteenth session); all match the golden."""
    kv_lens = [kv_base + 37 * i for i in range(40)]
    case = make_case([qlen] * 40, kv_lens, heads, dtype=torch.bfloat16, device="cuda", seed=heads + qlen)
    sms = mla._sm_count(torch.device("cuda"))
    total = case["kv_indices"].numel()
    cfg = mla.triton_config(qlen * heads, torch.bfloat16, total, num_reqs=40, sm_count=sms)
    if kernel == "swap":
        assert cfg == mla.gluon_swap_config(qlen * heads)
    else:  # the rule's choice, and the case exercises the loader it is meant to on this GPU
        assert cfg == mla.gluon_ws_config(total, 40, -(-qlen * heads // 64), sms)
        assert cfg.ws_idx_ahead == (kernel == "ws_ia"), (cfg.label, sms)
    res = mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case), sm_scale=0.07, backend="triton")
    want = "gluon, swapped split kernel" if kernel == "swap" else "gluon, warp-specialised split kernel"
    assert want in res.reason, res.reason
    check_against_golden(case, res.out, res.lse, torch.bfloat16, 0.07, f"default {kernel} H{heads} qlen {qlen}")


@pytest.mark.gpu
@NEEDS_HOPPER
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,qo_lens", [(128, [1, 1, 1]), (16, [4, 4, 4]), (16, [3, 1, 4]), (16, [16, 7, 1])])
@pytest.mark.parametrize("num_splits", [2, 4, 8, 3])
def test_gluon_cluster_merge_matches_golden(heads, qo_lens, num_splits, dtype):
    """The gluon split kernel launched as thread-block clusters of its splits, merging them after a cluster
    barrier (2, 4, 8 splits; 3 is not a cluster size here and takes the second-kernel merge): the same ragged,
    causal cases as above, against the golden, with NaN in unused cache rows and in the output buffer (every
    real row must be written by the in-cluster merge), and graph replays bit-exact."""
    case, args = ragged_gpu_case(qo_lens, heads, dtype, seed=heads + num_splits + 100)
    out = torch.full_like(case["q"][..., :512], float("nan"))
    out, lse = mla.mla_decode_triton(*args, config=GLUON_CLUSTER, num_splits=num_splits, out=out)
    check_against_golden(case, out, lse, dtype, 0.07, f"gluon cluster H{heads} q{qo_lens} s{num_splits} {dtype}")
    plain, _ = mla.mla_decode_triton(*args, config=GLUON, num_splits=num_splits)
    torch.testing.assert_close(out, plain, rtol=1e-2, atol=1e-2)  # the same partials, merged by the other kernel
    assert_graph_replays_equal(
        lambda o: mla.mla_decode_triton(*args, config=GLUON_CLUSTER, num_splits=num_splits, out=o), out)


@pytest.mark.gpu
@NEEDS_HOPPER
def test_gluon_cluster_merge_falls_back_when_clusters_do_not_fit():
    """More clusters than the GPU holds at once (a second wave would double the time): the call takes the
    second-kernel merge instead, and is still right. CUDA's occupancy query gives the capacity."""
    from workbench import mla_gluon

    reqs = 200
    case = make_case([1] * reqs, [300 + 7 * i for i in range(reqs)], 64, dtype=torch.bfloat16, device="cuda", seed=5)
    args = (case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"], 1, 0.07)
    out, lse = mla.mla_decode_triton(*args, config=GLUON_CLUSTER, num_splits=2)
    check_against_golden(case, out, lse, torch.bfloat16, 0.07, "gluon cluster fallback")
    caps = {k[1]: v for k, v in mla_gluon._CAPACITY.items()}
    assert 2 in caps and 0 < caps[2] < reqs, caps  # 200 clusters of 2 do not fit on one GPU: the fallback ran
    print(f"clusters of 2 resident at once: {caps[2]}")


def test_cluster_launch_checks_and_falls_back_without_a_gpu():
    """The in-cluster merge's pieces that need no GPU: the merge layout takes only 2, 4 or 8 splits, and a
    Triton whose compiled-kernel metadata is not the (num_warps, num_ctas, shared) tuple that the cluster launch
    edits gets None back (the caller then merges in a second kernel), with nothing launched."""
    from workbench import mla_gluon

    with pytest.raises(ValueError, match="a cluster merge takes one of"):
        mla_gluon.cluster_merge_layout(3)
    assert mla_gluon.cluster_merge_layout(8) != mla_gluon.cluster_merge_layout(2)

    class FakeKernel:
        launched = 0

        def __init__(self, meta):
            self.compiled = type("Compiled", (), {"packed_metadata": meta})()

        def warmup(self, *args, grid, **kw):
            return self.compiled

        def __getitem__(self, grid):
            def run(*args, **kw):
                FakeKernel.launched += 1
            return run

    for meta in (None, (8, 1), (8, 2, 1024), [8, 1, 1024]):  # missing, short, another cluster size, not a tuple
        assert mla_gluon.launch_clustered(FakeKernel(meta), (1, 1, 1), 4, (), {}) is None
    assert FakeKernel.launched == 0


def test_gluon_config_is_checked():
    with pytest.raises(ValueError, match="gluon needs block_m=64"):
        mla.TritonConfig(16, 64, 8, 2, gluon=True)
    for bn, stages in ((64, 3), (32, 2), (32, 3), (16, 4)):  # 64x3 does not fit; 32x4 fills what 64x2 fills
        with pytest.raises(ValueError, match="gluon needs block_m=64"):
            mla.TritonConfig(64, bn, 8, stages, gluon=True)
    assert mla.TritonConfig(64, 32, 8, 4, gluon=True).label.startswith("gluon 64x32 w8 s4")
    with pytest.raises(ValueError, match="gluon_ws replaces the gluon split kernel"):
        mla.TritonConfig(64, 32, 8, 4, gluon=True, gluon_ws=True)
    with pytest.raises(ValueError, match="gluon replaces the Triton split kernel"):
        mla.TritonConfig(64, 64, 8, 2, gluon=True, idx_ahead=True)
    with pytest.raises(ValueError, match="cluster_merge is a mode of the gluon split kernel"):
        mla.TritonConfig(64, 64, 8, 2, cluster_merge=True)
    with pytest.raises(ValueError, match="gluon_ws replaces the gluon split kernel"):
        mla.TritonConfig(64, 64, 8, 2, gluon=True, gluon_ws=True, cluster_merge=True)
    for other in (dict(gluon=True, coalesced_store=True), dict(gluon=True, gluon_ws=True), dict()):
        with pytest.raises(ValueError, match="ws_handoff is a schedule of the warp-specialised gluon kernel"):
            mla.TritonConfig(64, 64, 8, 2, ws_handoff=True, **other)
    assert dataclasses.replace(mla.GLUON_WS_CONFIG, ws_handoff=True).label.endswith(" cst ho")
    if not ON_GPU:
        case = make_case([1], [5], 64, dtype=torch.float16, device=DEV)
        with pytest.raises(ValueError, match="needs compiled Triton on an NVIDIA Hopper GPU"):
            mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                  case["kv_indices"], 1, 0.07, config=GLUON)


GLUON_SWAP = mla.TritonConfig(16, 64, 4, 2, programs_per_sm=1, pdl=True, pdl_split=True, gluon_swap=True)
# (block_m, warps, heads, query lengths) of the swapped gluon kernel's golden tests: one or several 16-, 32- or
# 64-row blocks per request on one or two warpgroups, partly empty blocks, ragged and causal query lengths
GLUON_SWAP_CASES = [(16, 4, 16, [1, 1, 1]), (16, 4, 128, [1, 1, 1]), (16, 4, 16, [2, 1, 3]), (16, 4, 16, [16, 7, 1]),
                    (32, 4, 16, [2, 2, 2]), (32, 4, 16, [3, 1, 4]), (32, 4, 8, [1, 1, 1]), (16, 8, 16, [1, 2, 1]),
                    (32, 8, 16, [2, 1, 2]), (64, 8, 16, [4, 4, 4]), (64, 8, 16, [3, 1, 4]), (64, 8, 16, [16, 7, 1]),
                    (64, 8, 128, [1, 2, 1])]


@pytest.mark.gpu
@NEEDS_HOPPER
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_m,warps,heads,qo_lens", GLUON_SWAP_CASES)
@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("variant", ["fp32", "narrow", "no_pdl"])
def test_gluon_swap_kernel_matches_golden(block_m, warps, heads, qo_lens, num_splits, dtype, variant):
    """The swapped gluon split kernel (``S^T = K q^T`` and ``O^T = V^T P^T`` on wgmma, tokens as M): 16-, 32- and
    64-row programs on one or two warpgroups, several row blocks per request and partly empty ones, ragged and
    causal query lengths, splits that are empty or end inside a tile, lengths 1..4099, NaN in every unused cache
    row and in the output buffer, against the golden; fp32 or 16-bit partials, with and without the PDL launches;
    graph replays bit-exact."""
    case, args = ragged_gpu_case(qo_lens, heads, dtype, seed=block_m + warps + heads + num_splits)
    cfg = dataclasses.replace(GLUON_SWAP, block_m=block_m, num_warps=warps, narrow_partials=variant == "narrow",
                              pdl=variant != "no_pdl", pdl_split=variant != "no_pdl")
    out = torch.full_like(case["q"][..., :512], float("nan"))
    out, lse = mla.mla_decode_triton(*args, config=cfg, num_splits=num_splits, out=out)
    check_against_golden(case, out, lse, dtype, 0.07, f"{cfg.label} H{heads} q{qo_lens} s{num_splits} {dtype}")
    assert_graph_replays_equal(lambda o: mla.mla_decode_triton(*args, config=cfg, num_splits=num_splits, out=o), out)


def test_gluon_swap_config_is_checked():
    assert GLUON_SWAP.label.startswith("gswap 16x64 w4 s2")
    for bad in (dict(block_m=64), dict(block_m=128, num_warps=8), dict(block_n=32), dict(num_warps=2),
                dict(num_stages=3)):
        with pytest.raises(ValueError, match="gluon_swap needs block_m 16 or 32 on 4 or 8 warps, or 64 on 8"):
            dataclasses.replace(GLUON_SWAP, **bad)
    assert dataclasses.replace(GLUON_SWAP, block_m=64, num_warps=8).label.startswith("gswap 64x64 w8 s2")
    for other in (dict(idx_ahead=True), dict(swap_ab=True), dict(fused_merge=True), dict(tma_store=True),
                  dict(max_regs=128), dict(spin_merge=True)):
        with pytest.raises(ValueError, match="gluon_swap replaces the split kernel"):
            dataclasses.replace(GLUON_SWAP, **other)
    with pytest.raises(ValueError):  # gluon=True with a 16-row tile is refused by either rule
        dataclasses.replace(GLUON_SWAP, gluon=True)
    if not ON_GPU:
        case = make_case([1], [5], 16, dtype=torch.float16, device=DEV)
        with pytest.raises(ValueError, match=r"TritonConfig\(gluon_swap=True\) needs compiled Triton on an NVIDIA"):
            mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                  case["kv_indices"], 1, 0.07, config=GLUON_SWAP)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA or ROCm GPU (compiled Triton)")
def test_gpu_steps_expand_then_decode_in_one_graph():
    """A serving step's chain, six steps in one CUDA graph: torch copies write the step's block table, seq_lens
    and q; the index expansion (PDL-launched on sm_90+, it lets its dependents launch early) writes kv_indptr and
    kv_indices; the decode's split kernel (PDL-launched, it waits before its first read) reads them at once.
    Every step has other tables and lengths, so a decode that read the previous step's indices, or a half-written
    index buffer, would be wrong: each step's output must match the golden on that step's own inputs."""
    from workbench import expand as E

    K, R, H, max_blocks, steps, scale = 16, 6, 16, 40, 6, 0.07
    g = torch.Generator().manual_seed(21)
    num_blocks = 1 + R * max_blocks
    cache = torch.randn(num_blocks, K, D, generator=g).to(torch.bfloat16)
    cache[0] = float("nan")  # block 0 is never handed out
    cache = cache.cuda()
    tables, lens, qs = [], [], []
    for _ in range(steps):
        tables.append((1 + torch.randperm(num_blocks - 1, generator=g)).to(torch.int32).reshape(R, max_blocks))
        lens.append(torch.randint(1, max_blocks * K + 1, (R,), generator=g, dtype=torch.int32))
        qs.append(torch.randn(R, H, D, generator=g).to(torch.bfloat16))
    src = [(t.cuda(), n.cuda(), q.cuda()) for t, n, q in zip(tables, lens, qs)]
    block_table = torch.zeros(R, max_blocks, dtype=torch.int32, device="cuda")
    seq_lens = torch.zeros(R, dtype=torch.int32, device="cuda")
    q = torch.zeros(R, H, D, dtype=torch.bfloat16, device="cuda")
    qo_indptr = torch.arange(R + 1, dtype=torch.int32, device="cuda")
    kv_indices = torch.zeros(R * max_blocks * K, dtype=torch.int32, device="cuda")
    kv_indptr = torch.zeros(R + 1, dtype=torch.int32, device="cuda")
    outs = torch.zeros(steps, R, H, DV, dtype=torch.bfloat16, device="cuda")
    lses = []

    def run_steps():
        lses.clear()
        for i, (t, n, qi) in enumerate(src):
            block_table.copy_(t)
            seq_lens.copy_(n)
            q.copy_(qi)
            E.expand_page_indices(block_table, seq_lens, K, out=kv_indices, kv_indptr=kv_indptr,
                                  max_seq_len=max_blocks * K, validate=False)
            lses.append(mla.mla_decode_triton(q, cache.view(-1, 1, 1, D), qo_indptr, kv_indptr, kv_indices, 1, scale,
                                              out=outs[i])[1])

    run_steps()  # compiles outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_steps()
    for _ in range(2):
        outs.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for i, (t, n, qi) in enumerate(zip(tables, lens, qs)):
            ref_indices, ref_indptr = E.expand_page_indices_ref(t, n, K)
            case = dict(q=qi.cuda(), kv_cache=cache.view(-1, D), qo_indptr=qo_indptr, kv_indptr=ref_indptr.cuda(),
                        kv_indices=ref_indices.cuda())
            check_against_golden(case, outs[i], lses[i], torch.bfloat16, scale, f"step {i}")


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA or ROCm GPU (compiled Triton)")
@pytest.mark.parametrize("qlen", [1, 2, 3, 8])
def test_triton_gpu_fp32_every_row_class(qlen):
    """fp32 rows are twice as wide in shared memory: the defaults must still fit for every row count."""
    case = make_case([qlen] * 3, [max(n, qlen) for n in (33, 700, 4099)], 16, dtype=torch.float32, device="cuda",
                     seed=qlen)
    res = mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case), sm_scale=0.07, backend="triton")
    check_against_golden(case, res.out, res.lse, torch.float32, 0.07, f"fp32 qlen {qlen}")


def test_default_configs_follow_the_batch_size(monkeypatch):
    monkeypatch.setattr(mla.device, "interpreter_active", lambda: False)
    small = mla.triton_config(16, torch.bfloat16, mla.SMALL_BATCH_TOKENS, gluon=False)
    large = mla.triton_config(16, torch.bfloat16, mla.SMALL_BATCH_TOKENS + 1, gluon=False)
    assert (small.block_n, small.num_warps, small.programs_per_sm) == (64, 8, 1)
    assert (large.block_n, large.num_warps, large.programs_per_sm) == (32, 4, 2)
    assert mla.triton_config(16, torch.bfloat16, gluon=False) == large  # unknown size: the large-batch config
    assert all(c.idx_ahead and c.pdl and c.pdl_split and not c.meta_before_wait for c in (small, large))
    # 16-bit partials for the small-batch 16-row tile only (the large-batch tile was slower with them, round 29)
    assert small.narrow_partials and not large.narrow_partials
    assert not mla.triton_config(32, torch.bfloat16, mla.SMALL_BATCH_TOKENS, gluon=False).narrow_partials
    assert mla.triton_config(32, torch.bfloat16, gluon=False).block_m == 32
    assert mla.triton_config(33, torch.bfloat16, gluon=False).block_m == 64
    # more than 32 rows, 16-bit, on Hopper: the gluon kernel (asked for here; by default only where one is present)
    assert mla.triton_config(33, torch.bfloat16, gluon=True) == mla.GLUON_CONFIG
    assert mla.triton_config(33, torch.bfloat16, gluon=False).gluon is False
    # the warp-specialised gluon kernel where each program takes >= GLUON_WS_MIN_TOKENS tokens with one row block
    # per request, with the loader that loads indices one tile ahead (round 39; 132 SMs: B=64 L=4k qlen 4 runs 2
    # splits of 2048 tokens, B=16 L=4k qlen 4 8 splits of 512, B=4 L=1k qlen 4 16 splits of 64: the plain one)
    ws = dict(gluon=True, sm_count=132)
    assert mla.triton_config(64, torch.bfloat16, 64 * 4096, num_reqs=64, **ws) == mla.GLUON_WS_IDX_AHEAD_CONFIG
    # two row blocks: the idx-ahead loader only up to GLUON_WS_IDX_AHEAD_MAX_TOKENS tokens per program (128 heads
    # B=64 L=4k: one split of 4096 tokens; B=64 L=2k: one of 2048)
    assert mla.triton_config(128, torch.bfloat16, 64 * 4096, num_reqs=64, **ws) == mla.GLUON_WS_CONFIG
    assert mla.triton_config(128, torch.bfloat16, 64 * 2048, num_reqs=64, **ws) == mla.GLUON_WS_IDX_AHEAD_CONFIG
    for b, l, rb in ((64, 4096, 2), (64, 2048, 2), (16, 4096, 2), (1, 100_000, 3), (16, 4096, 1), (128, 32768, 1)):
        tpp = mla.gluon_tokens_per_program(b * l, b, rb, 132)
        assert tpp == l / mla.default_splits(mla.GLUON_CONFIG, b, rb, b * l, 132)
        ia = rb == 1 or tpp <= mla.GLUON_WS_IDX_AHEAD_MAX_TOKENS
        assert mla.gluon_ws_config(b * l, b, rb, 132) == (mla.GLUON_WS_IDX_AHEAD_CONFIG if ia else mla.GLUON_WS_CONFIG)
    assert mla.triton_config(64, torch.bfloat16, 16 * 4096, num_reqs=16, **ws) == mla.GLUON_WS_IDX_AHEAD_CONFIG
    assert mla.triton_config(64, torch.bfloat16, 4 * 1024, num_reqs=4, **ws) == mla.GLUON_CONFIG
    assert mla.GLUON_WS_IDX_AHEAD_CONFIG == dataclasses.replace(mla.GLUON_WS_CONFIG, ws_idx_ahead=True)
    assert mla.triton_config(64, torch.bfloat16, 64 * 4096, **ws) == mla.GLUON_CONFIG  # no num_reqs: the plain one
    # at most 32 rows, 16-bit, on Hopper: the swapped gluon kernel at any batch size (thirteenth session)
    assert mla.triton_config(16, torch.bfloat16, 64 * 4096, num_reqs=64, **ws) == mla.GLUON_SWAP_CONFIG
    assert not mla.prefer_gluon_ws(0, 0, 1, 132) and not mla.prefer_gluon_ws(4096, 0, 1, 132)
    assert mla.gluon_ws_config(4 * 1024, 4, 1, 132) is None and mla.gluon_ws_config(0, 0, 1, 132) is None
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs sm_count"):
            mla.triton_config(64, torch.bfloat16, 64 * 4096, num_reqs=64, gluon=True)
    for b, l, rb in ((16, 4096, 1), (64, 4096, 1), (64, 1024, 2), (128, 8192, 2), (1, 100_000, 1), (3, 17, 4)):
        splits = mla.default_splits(mla.GLUON_CONFIG, b, rb, b * l, 132)
        # the two kernels share the split count, so the rule's tokens per program are the ws kernel's
        assert splits == mla.default_splits(mla.GLUON_WS_CONFIG, b, rb, b * l, 132)
        least = mla.GLUON_WS_MIN_TOKENS if rb == 1 else mla.GLUON_WS_MIN_TOKENS_MULTI
        assert mla.prefer_gluon_ws(b * l, b, rb, 132) == (l / splits >= least)
    # two row blocks per request: the ws kernel from 128 tokens per program (round 38: 128 heads B=16 L=1k runs 4
    # splits of 256 tokens on it; B=1 L=1k, 16 splits of 64, keeps the plain one)
    assert mla.triton_config(128, torch.bfloat16, 16 * 1024, num_reqs=16, **ws) == mla.GLUON_WS_IDX_AHEAD_CONFIG
    assert mla.triton_config(128, torch.bfloat16, 1024, num_reqs=1, **ws) == mla.GLUON_CONFIG
    assert mla.GLUON_WS_CONFIG.ws_handoff and mla.GLUON_WS_CONFIG.coalesced_store
    # 17-32 rows (qlen 2 at 16 heads): the same kernel with 32-row blocks, at any size
    for rows, tokens, reqs in ((32, 16 * 4096, 16), (17, 64 * 32768, 64), (32, 4096, 1), (32, None, None)):
        cfg = mla.triton_config(rows, torch.bfloat16, tokens, num_reqs=reqs, **ws)
        assert cfg == mla.gluon_swap_config(rows) == dataclasses.replace(mla.GLUON_SWAP_CONFIG, block_m=32)
    for rows, tokens in ((1, 4096), (16, None), (16, 16 * 4096)):
        assert mla.triton_config(rows, torch.bfloat16, tokens, num_reqs=1, **ws) == mla.GLUON_SWAP_CONFIG
    assert mla.GLUON_SWAP_CONFIG.narrow_partials and mla.GLUON_SWAP_CONFIG.pdl_split
    for bad in (0, 33):
        with pytest.raises(ValueError, match="the swapped gluon kernel takes 1 to 32 rows"):
            mla.gluon_swap_config(bad)
    assert not mla.triton_config(32, torch.float16, gluon=False).gluon
    assert not mla.triton_config(64, torch.float32, gluon=True).gluon  # fp32: the Triton tile
    assert not mla.triton_config(64, torch.bfloat16, backend="hip", gluon=True).gluon  # ROCm tiles
    assert mla.triton_config(64, torch.bfloat16).gluon == mla.gluon_available()
    monkeypatch.setattr(mla.triton, "__version__", "3.5.1")  # an older Gluon: never chosen by default
    assert not mla.gluon_available() and not mla.triton_config(64, torch.bfloat16).gluon
    for rows in (1, 16, 17, 64, 2048):  # fp32: 32-token tiles of <= 32 rows (shared memory)
        c = mla.triton_config(rows, torch.float32, 1000)
        assert c.block_n == 32 and c.block_m <= 32 and c.num_stages == 3


# ----------------------------------------------------------------------------------------------
# backends and input checks
# ----------------------------------------------------------------------------------------------


def test_auto_states_its_choice_and_matches_golden():
    case = make_case([1, 1], [5, 9], 2, dtype=torch.float16 if not ON_GPU else torch.bfloat16, device=DEV)
    res = mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case))
    assert res.backend == "triton" and res.reason
    cfg, splits = mla.triton_launch_plan(case["q"], case["qo_indptr"], case["kv_indices"], 1)
    assert f"split kernel {cfg.label}, {splits} split" in res.reason  # which kernel ran, and how many splits
    print(res.backend, "-", res.reason)
    gold, _ = mla.mla_decode_ref(**case)
    assert (res.out.float() - gold).abs().max() < 2e-2


@pytest.mark.skipif(ON_GPU, reason="the choice differs on a GPU")
def test_auto_on_cpu_falls_back_to_golden_for_bf16_and_large():
    case = make_case([1], [5], 2, dtype=torch.bfloat16)
    res = mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case))
    assert res.backend == "torch" and "bfloat16" in res.reason
    big = make_case([1], [40000], 128, dtype=torch.float16, spare_rows=0)
    name, reason = mla.choose_backend(big["q"], big["kv_cache"], metadata_of(big))
    assert name == "torch" and "large" in reason


def test_torch_backend_is_the_golden():
    case = make_case([2, 1], [6, 3], 2)
    res = mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case), sm_scale=0.3, backend="torch")
    gold, lse = mla.mla_decode_ref(**case, sm_scale=0.3)
    assert res.backend == "torch"
    torch.testing.assert_close(res.out, gold, rtol=0, atol=0)


@pytest.mark.skipif(workbench.device.aiter_status().available, reason="aiter is importable here")
def test_aiter_backend_says_why_not():
    case = make_case([1], [5], 16, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="backend='aiter' is unavailable here"):
        mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case), backend="aiter")


@pytest.mark.skipif(ON_GPU, reason="interpreter dtype rule")
def test_bf16_refused_under_interpreter():
    case = make_case([1], [5], 2, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16"):
        mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case), backend="triton")


def _bad(case, **changes):
    case = dict(case)
    md = changes.pop("metadata", None)
    case.update(changes)
    return case, md or metadata_of(case)


BAD_INPUTS = {
    "qlen_above_16": (lambda c: _bad(c, metadata=metadata_of(c, max_qo_len=17)), ValueError, "above the decode limit"),
    "wrong_head_dim": (lambda c: _bad(c, q=c["q"][..., :512].contiguous()), ValueError, "head dim"),
    "dtype_mismatch": (lambda c: _bad(c, kv_cache=c["kv_cache"].double()), TypeError, "dtype"),
    "non_contiguous_q": (lambda c: _bad(c, q=c["q"].transpose(0, 1).contiguous().transpose(0, 1)), ValueError,
                         "not contiguous"),
    "kv_shorter_than_q": (lambda c: _bad(c, kv_indptr=torch.tensor([0, 1, 4], dtype=torch.int32,
                                                                    device=c["q"].device)), ValueError,
                          "kv_len >= qo_len"),
    "index_out_of_cache": (lambda c: _bad(c, kv_indices=c["kv_indices"] + 10_000), ValueError, "kv_indices range"),
    "max_qo_len_lies": (lambda c: _bad(c, metadata=metadata_of(c, max_qo_len=1)), ValueError, "longest query"),
    "kv_cache_paged_4d": (lambda c: _bad(c, kv_cache=c["kv_cache"][:8].view(2, 4, 1, D)), ValueError,
                          "page_size-1 view"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_gets_a_clear_error(name):
    case = make_case([2, 2], [2, 7], 2, dtype=torch.float16, device=DEV)
    make, exc, match = BAD_INPUTS[name]
    bad, md = make(case)
    with pytest.raises(exc, match=match):
        mla.mla_decode(bad["q"], bad["kv_cache"], md, backend="triton")


def test_zero_length_kv_with_a_query_raises():
    """Decision: a request with query tokens and no KV has no defined output -> ValueError (never NaN/zeros)."""
    case = make_case([1, 1], [3, 1], 2)
    case["kv_indptr"] = torch.tensor([0, 3, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="0-length KV"):
        mla.mla_decode_ref(**case)


def test_request_without_queries_is_skipped():
    case = make_case([1, 0, 2], [4, 9, 5], 2)
    out, lse = mla.mla_decode_ref(**case)
    assert out.shape[0] == 3
    res = mla.mla_decode(case["q"].half(), case["kv_cache"].half(), metadata_of(case), backend="triton") \
        if not ON_GPU else None
    if res is not None:
        assert (res.out.float() - out).abs().max() < 5e-3


def test_device_mismatch_is_named():
    case = make_case([1], [3], 2)
    case["kv_indices"] = case["kv_indices"].to("meta")
    with pytest.raises(ValueError, match="kv_indices is on meta"):
        mla.mla_decode_ref(**case)


# ----------------------------------------------------------------------------------------------
# the benchmark's plumbing (no timing asserted: a fake timer; the bars' logic on synthetic rows)
# ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(ON_GPU, reason="CPU smoke run of the benchmark plumbing through the interpreter")
def test_bench_decode_plumbing_runs_on_cpu():
    from workbench.bench import decode as bench

    calls = []

    def fake_timer(fn):
        fn()
        calls.append(1)
        return 100.0

    ceilings = {"copy": {"gb_s": 4000.0}, "matmul_bf16": {"tflops": 700.0}}
    payload = bench.run(grid=[(16, 1, 2, 64), (16, 4, 2, 64)], do_tune=False, device=torch.device("cpu"),
                        dtype=torch.float16, timer=fake_timer, torch_timer=fake_timer, log=lambda *_: None,
                        ceilings=ceilings)
    assert len(payload["results"]) == 2 and len(calls) == 4
    r = payload["results"][0]
    assert r["kv_gb_s"] == pytest.approx(2 * 64 * 576 * 2 / 100e-6 / 1e9)
    assert r["tflops"] == pytest.approx(2 * 16 * 64 * 2 * 1088 / 100e-6 / 1e12)
    assert {b["verdict"] for b in payload["bars"]} == {"MISS"}  # bar points not measured in this tiny grid


def test_bench_decode_bars_logic():
    from workbench.bench import decode as bench

    rows = [dict(heads=16, qlen=1, batch=64, context=32768, triton_us=100.0, kv_gb_s=3900.0, tflops=1.0),
            dict(heads=16, qlen=4, batch=64, context=32768, triton_us=120.0, kv_gb_s=3000.0, tflops=1.0),
            dict(heads=16, qlen=8, batch=64, context=32768, triton_us=200.0, kv_gb_s=2000.0, tflops=1.0),
            dict(heads=128, qlen=1, batch=64, context=4096, triton_us=1.0, kv_gb_s=1.0, tflops=250.0)]
    bars = {b["name"]: b for b in bench.evaluate_bars(rows, copy_gb_s=4200.0)}
    assert bars["16 heads qlen 1 B=64 L=32k: KV bandwidth >= 90% of copy"]["verdict"] == "PASS"
    assert bars["16 heads qlen 4 B=64 L=32k: time <= 1.25x qlen 1"]["verdict"] == "PASS"
    assert bars["16 heads qlen 8 B=64 L=32k: time <= 1.25x qlen 1"]["value"] == pytest.approx(2.0)
    assert bars["16 heads qlen 8 B=64 L=32k: time <= 1.25x qlen 1"]["verdict"] == "MISS"
    assert bars["128 heads qlen 1 B=64 L=4k: >= 300 TFLOP/s"]["verdict"] == "MISS"
    assert bars["16 heads qlen 1 B=16 L=4k: KV bandwidth >= 2.5 TB/s"]["value"] is None


def test_bench_decode_ratio_bars_take_the_median_of_paired_rounds():
    from workbench.bench import decode as bench

    name = "16 heads qlen 4 B=16 L=4k: time <= 1.25x qlen 1"
    rows = [dict(heads=16, qlen=1, batch=16, context=4096, triton_us=28.0, kv_gb_s=1.0, tflops=1.0),
            dict(heads=16, qlen=4, batch=16, context=4096, triton_us=36.4, kv_gb_s=1.0, tflops=1.0)]
    rounds = [dict(round=i, qlen1_us=b, us=u, ratio=u / b)
              for i, (b, u) in enumerate([(30.0, 36.0), (29.0, 37.0), (28.0, 36.0), (30.0, 35.0), (31.0, 38.0)])]
    bars = {b["name"]: b for b in bench.evaluate_bars(rows, copy_gb_s=4200.0, paired={name: rounds})}
    bar = bars[name]
    ratios = sorted(r["ratio"] for r in rounds)
    assert bar["value"] == pytest.approx(ratios[2]) and bar["verdict"] == "PASS"  # 36/30 = 1.2
    assert bar["sweep_value"] == pytest.approx(1.3) and bar["method"] == "median of 5 paired rounds"
    assert (bar["ratio_min"], bar["ratio_max"]) == (pytest.approx(ratios[0]), pytest.approx(ratios[-1]))
    assert bar["rounds"] == rounds
    # a median over the bar fails it even where the sweep's single ratio passed
    slow = [dict(r, us=r["qlen1_us"] * 1.3, ratio=1.3) for r in rounds]
    rows[1]["triton_us"] = 30.0
    again = {b["name"]: b for b in bench.evaluate_bars(rows, 4200.0, paired={name: slow})}
    assert again[name]["sweep_value"] == pytest.approx(30.0 / 28.0) and again[name]["verdict"] == "MISS"
    # without rounds: the sweep's ratio, and no paired fields
    plain = {b["name"]: b for b in bench.evaluate_bars(rows, copy_gb_s=4200.0)}[name]
    assert plain["value"] == pytest.approx(30.0 / 28.0) and "rounds" not in plain


@pytest.mark.skipif(ON_GPU, reason="CPU check of the pairing order, with a fake timer (no kernel runs)")
def test_bench_decode_ratio_rounds_alternate_the_order():
    from workbench.bench import decode as bench

    pool = bench.CachePool(2 * 64, torch.float16, torch.device("cpu"))
    bar = bench.Bar("t", "qlen_time_ratio", 16, 2, 64, 1.25, 4)
    seen = []
    first = {}

    def fake_timer(fn):
        first.setdefault("base", fn)  # round 0 times qlen 1 first
        seen.append("base" if fn is first["base"] else "q")
        return 10.0 if fn is first["base"] else 12.0

    out = bench.ratio_rounds(pool, bar, config_for=lambda rows: None, timer=fake_timer, rounds=4)
    assert seen == ["base", "q", "q", "base", "base", "q", "q", "base"]
    assert [r["round"] for r in out] == [0, 1, 2, 3]
    assert all(r["qlen1_us"] == 10.0 and r["us"] == 12.0 and r["ratio"] == pytest.approx(1.2) for r in out)
    with pytest.raises(ValueError, match="rounds is 0"):
        bench.ratio_rounds(pool, bar, config_for=lambda rows: None, timer=fake_timer, rounds=0)
    with pytest.raises(ValueError, match="bar.kind"):
        bench.ratio_rounds(pool, bench.BARS[0], config_for=lambda rows: None, timer=fake_timer)


def test_explore_best_takes_the_minimum_over_splits_per_point():
    from workbench.bench import decode as bench

    row = dict(label="a", heads=16, qlen=1, batch=16, context=4096)
    sweep = {"ceilings": {"copy": {"gb_s": 4000.0}},
             "rows": [dict(row, us=50.0), dict(row, us=40.0), dict(row, label="b", us=45.0),
                      dict(row, label="a", error="OutOfResources")]}  # a failed launch has no time
    out = bench.explore_best({"r": sweep}, rounds=("r",), points=((16, 1, 16, 4096), (128, 1, 64, 4096)))
    assert [(o["label"], o["best_us"][(16, 1, 16, 4096)], o["best_us"][(128, 1, 64, 4096)]) for o in out] == \
        [("a", 40.0, None), ("b", 45.0, None)]
    assert out[0]["copy_gb_s"] == 4000.0


@pytest.mark.skipif(ON_GPU, reason="checks the no-GPU message")
def test_bench_decode_cli_modes_without_gpu_say_why(capsys):
    from workbench import cli

    for extra in (["--explore", "3"], ["--layouts"], ["--quick"], ["--trace"]):
        assert cli.main(["bench", "decode", "--out", "/dev/null", *extra]) == 2
        assert "benchmarks need a CUDA or ROCm GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: rounds are 1-21
        cli.main(["bench", "decode", "--explore", "22"])
    for bad in ("-1", "two"):  # argparse: paired rounds are a whole number >= 0
        with pytest.raises(SystemExit):
            cli.main(["bench", "decode", "--ratio-rounds", bad])
        assert "--ratio-rounds is" in capsys.readouterr().err


def test_cache_pool_runs_keep_blocks_contiguous():
    from workbench.bench import decode as bench

    idx = bench.CachePool(1000, torch.float16, torch.device("cpu"), seed=1, run=16).indices(64)
    assert len(set(idx.tolist())) == 64 and int(idx.min()) >= 1
    blocks = idx.view(4, 16)
    assert torch.equal(blocks - blocks[:, :1], torch.arange(16).expand(4, 16).to(idx.dtype))  # 16 consecutive rows
    assert ((blocks[:, 0] - 1) % 16 == 0).all()  # aligned to 16-row blocks


# ----------------------------------------------------------------------------------------------
# the chapter's helpers and figures
# ----------------------------------------------------------------------------------------------


def test_make_decode_example_is_consistent():
    ex = mla.make_decode_example([1, 3], [40, 23], heads=4, kernel_block_size=16, seed=5)
    md = ex.metadata
    assert md.max_qo_len == 3 and md.kv_indices.numel() == 63
    assert torch.isnan(ex.kv_cache[0]).all()  # block 0 reserved, NaN
    rows = ex.flat_cache.view(-1, D)[md.kv_indices.long()]
    assert not torch.isnan(rows).any()  # every indexed row is a real token
    out, _ = mla.mla_decode_ref(ex.q, ex.flat_cache, md.qo_indptr, md.kv_indptr, md.kv_indices)
    paged, _ = mla.mla_decode_paged_ref(ex.q, ex.kv_cache, md.qo_indptr, ex.block_table, ex.seq_lens)
    torch.testing.assert_close(out, paged, rtol=0, atol=0)


def test_decode_figures_from_committed_results():
    pytest.importorskip("plotly", reason="the figures need plotly (the GPU image has none)")
    from workbench.viz import mla as vmla

    data = vmla.load_decode_results()
    assert data is not None and data["results"], "src/workbench/data/bench_decode_h200.json is missing"
    fig = vmla.decode_roofline_figure(data)
    names = [t.name for t in fig.data]
    assert any(n.startswith("measured roof") for n in names)
    assert any(n == "this kernel: H=16, qlen=1" for n in names) and any("peers" in n for n in names)
    assert len(vmla.decode_bandwidth_figure(data).data) >= 4
    empty = vmla.decode_roofline_figure({})
    assert "no measurements" in empty.layout.title.text
    assert fig.to_json() == vmla.decode_roofline_figure(data).to_json()  # deterministic


def test_fixed_cost_fit_recovers_a_synthetic_line():
    """time = 10 us + bytes / 4000 GB/s for the full call, 7 us + bytes / 4100 GB/s for the split kernel."""
    pytest.importorskip("plotly", reason="workbench.viz needs plotly (the GPU image has none)")
    from workbench.viz import mla as vmla

    rows = []
    for L in (1024, 4096, 8192):
        gb = 128 * L * D * 2 / 1e9
        rows += [dict(kind="full", batch=128, context=L, us=10 + gb / 4000 * 1e6),
                 dict(kind="split only", batch=128, context=L, us=7 + gb / 4100 * 1e6),
                 dict(kind="merge only", batch=128, context=L, us=3.0)]
    rows.append(dict(kind="full", batch=1, context=64, us=6.5))
    data = {"explore": {"fixed_cost": {"ceilings": {"copy": {"gb_s": 4200.0}}, "rows": rows}}}
    fit = vmla.fixed_cost_fit(data)
    assert fit["full"]["fixed_us"] == pytest.approx(10, abs=1e-6)
    assert fit["full"]["rate_gb_s"] == pytest.approx(4000, rel=1e-9)
    assert fit["split_only"]["fixed_us"] == pytest.approx(7, abs=1e-6)
    assert fit["merge_only_us"] == 3.0 and fit["one_tile_us"] == 6.5
    assert vmla.fixed_cost_fit({}) is None
    assert len(vmla.decode_fixed_cost_figure(data).data) == 5
    assert "no data" in vmla.decode_fixed_cost_figure({}).layout.title.text


# ----------------------------------------------------------------------------------------------
# tracing a call: %globaltimer stamps per program
# ----------------------------------------------------------------------------------------------


def test_trace_and_pdl_split_refuse_what_they_cannot_do():
    case = make_case([1], [40], 16, dtype=torch.float32, device="cuda" if ON_GPU else "cpu")
    cfg = mla.triton_config(16, torch.float32)
    bufs = mla.trace_buffers(case["q"], 1, 1, 2, cfg)
    if not ON_GPU:  # CPU tensors: no %globaltimer
        with pytest.raises(ValueError, match="trace needs compiled Triton on an NVIDIA GPU"):
            mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                  case["kv_indices"], 1, 0.1, num_splits=2, config=cfg, trace=bufs)
    with pytest.raises(ValueError, match="trace is not available for config 'bal "):
        mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"],
                              1, 0.1, num_splits=2, config=dataclasses.replace(cfg, balanced=True), trace=bufs)
    with pytest.raises(ValueError, match="meta_before_wait .* needs pdl_split=True"):
        dataclasses.replace(cfg, pdl_split=False, meta_before_wait=True)
    assert dataclasses.replace(cfg, pdl_split=True, meta_before_wait=True).label.endswith(" pdls mbw")
    assert bufs[0].shape == (2, mla.TRACE_SLOTS.value) and bufs[1].shape == (mla.merge_programs(16, cfg), 4)
    assert mla.trace_buffers(case["q"], 1, 1, 1, cfg)[1].shape == (0, 4)  # one split: no merge kernel


def _synthetic_call(t0, n_prog=4, tiles=3, tile_ns=1000, first_ns=3000, merge_ns=2000):
    """Split programs entering 100 ns apart, waiting 200 ns, a first tile of first_ns, then tile_ns per
    tile, exiting 500 ns after their last tile; two merge programs starting after the last split exit."""
    split, last_exit = [], 0
    for p in range(n_prog):
        entry = t0 + 100 * p
        wait = entry + 200
        ts = [wait + first_ns + i * tile_ns for i in range(tiles)]
        exit_ = ts[-1] + 500
        last_exit = max(last_exit, exit_)
        split.append([p, entry, wait, exit_] + ts + [0] * (mla.TRACE_TILES.value - tiles))
    merge = [[0, last_exit - 300, last_exit + 400, last_exit + 400 + merge_ns],
             [1, last_exit - 200, last_exit + 450, last_exit + 450 + merge_ns]]
    return split, merge


def test_summarize_trace_reads_synthetic_stamps():
    from workbench.bench import decode as bench

    calls = [_synthetic_call(t0) for t0 in (10_000, 30_000, 50_000)]
    s = bench.summarize_trace(calls)
    m = s["median"]
    assert m["split_entry_spread"] == pytest.approx(0.3)
    assert m["split_wait"] == pytest.approx(0.2)
    assert m["first_tile"] == pytest.approx(3.0) and m["per_tile"] == pytest.approx(1.0)
    # last program: entry 0.3 + wait 0.2 + first 3 + 2 tiles + 0.5 = 6.0 us after the first entry
    assert m["split_exit_last"] == pytest.approx(6.0)
    assert m["merge_wait_done"] == pytest.approx(6.4) and m["merge_exit_last"] == pytest.approx(8.45)
    assert m["merge_after_split"] == pytest.approx(2.45)
    assert m["period"] == pytest.approx(20.0)
    assert m["gap_from_previous"] == pytest.approx(20.0 - 8.45)
    assert s["per_call"][0].get("gap_from_previous") is None and s["per_call"][-1].get("period") is None
    assert s["timer_step_ns"] == 50
    with pytest.raises(ValueError, match="no split-program stamps"):
        bench.summarize_trace([([[0] * mla.TRACE_SLOTS.value], [])])


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU or torch.version.hip is not None, reason="needs an NVIDIA GPU (%globaltimer)")
@pytest.mark.parametrize("kernel,pdl_split", [("triton", False), ("triton", True), ("triton", "meta"),
                                              ("gswap", False), ("gswap", True)])
@pytest.mark.parametrize("qlen,heads", [(1, 16), (3, 16), (1, 128)])
def test_trace_stamps_are_ordered_and_complete(qlen, heads, kernel, pdl_split):
    """Traced calls give the golden; every split program stamps entry <= wait <= tiles <= exit with one stamp
    per tile it owns; and a PDL-launched merge gets past its wait only after every split program has exited
    (what griddepcontrol.wait promises), as does the next call's split kernel after the merge with pdl_split.
    ``gswap``: the swapped gluon kernel (Hopper; 16- or 64-row blocks), stamped the same way."""
    if kernel == "gswap" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the swapped gluon kernel needs an NVIDIA Hopper GPU, compute capability 9.x (wgmma)")
    kv = [max(n, qlen) for n in (1, 100, 1000, 4099)]
    case = make_case([qlen] * len(kv), kv, heads, dtype=torch.bfloat16, device="cuda", seed=5)
    if kernel == "gswap":
        base = (mla.gluon_swap_config(qlen * heads) if qlen * heads <= 32
                else dataclasses.replace(mla.GLUON_SWAP_CONFIG, block_m=64, num_warps=8))
        cfg = dataclasses.replace(base, pdl_split=bool(pdl_split))
    else:
        cfg = dataclasses.replace(mla.triton_config(qlen * heads, torch.bfloat16, gluon=False),
                                  pdl_split=bool(pdl_split), meta_before_wait=pdl_split == "meta")
    splits = 5
    args = (case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"], qlen, 0.07)
    bufs = [mla.trace_buffers(case["q"], qlen, len(kv), splits, cfg) for _ in range(2)]
    for b in bufs:
        out, lse = mla.mla_decode_triton(*args, num_splits=splits, config=cfg, trace=b)
    torch.cuda.synchronize()
    check_against_golden(case, out, lse, torch.bfloat16, 0.07, f"traced {cfg.label}")
    row_blocks = -(-qlen * heads // cfg.block_m)
    for split, merge in ((b[0].cpu(), b[1].cpu()) for b in bufs):
        for p, row in enumerate(split.tolist()):
            pid_m, rest = p % row_blocks, p // row_blocks
            s, req = rest % splits, rest // splits
            chunk = -(-(-(-kv[req] // splits)) // cfg.block_n) * cfg.block_n
            n_tiles = max(0, -(-(min(kv[req], (s + 1) * chunk) - s * chunk) // cfg.block_n))
            ts = row[4:4 + n_tiles]
            assert row[0] >= 0 and 0 < row[1] <= row[2], (p, row[:4])
            assert all(t > 0 for t in ts) and all(t == 0 for t in row[4 + n_tiles:]), (p, n_tiles, row[4:12])
            assert ts == sorted(ts) and all(row[2] <= t <= row[3] for t in ts), (p, row[:4], ts)
        last_split_exit = int(split[:, 3].max())
        if cfg.pdl and len(merge):
            assert int(merge[:, 2].min()) >= last_split_exit
            assert (merge[:, 1] <= merge[:, 2]).all() and (merge[:, 2] <= merge[:, 3]).all()
    if pdl_split:
        assert int(bufs[1][0][:, 2].min()) >= int(bufs[0][1][:, 3].max())


def test_decode_trace_figure_from_committed_trace():
    pytest.importorskip("plotly", reason="workbench.viz needs plotly (the GPU image has none)")
    from workbench.viz import mla as vmla

    data = vmla.load_decode_results()
    rows = data["explore"]["trace"]["rows"]
    with_tl = [r for r in rows if r.get("timeline")]
    assert with_tl and all((r["heads"], r["batch"], r["context"]) == (16, 16, 4096) for r in with_tl)
    for r in with_tl:
        seg = vmla.trace_segments(r)
        programs = r["num_splits"] * 16  # one row block per request at 16 heads, 16 requests
        assert len(seg["split"]) == programs and len(seg["merge"]) == mla.merge_programs(256, mla.TritonConfig(
            **r["config"]))
        assert all(length >= 0 for p in seg["split"] for _, length in p)
        # every merge program gets past its PDL wait only after the last split program has exited
        last_split_exit = max(p[3][0] + p[3][1] for p in seg["split"])
        assert min(m[2] for m in seg["merge"]) >= last_split_exit
    fig = vmla.decode_trace_figure(data)
    assert [t.name for t in fig.data] == [n for n, _ in vmla.TRACE_PHASES] + ["merge program"]
    assert len(fig.data[0].y) == with_tl[0]["num_splits"] * 16
    assert "no trace yet" in vmla.decode_trace_figure({}).layout.title.text
    with pytest.raises(ValueError, match="no traced config 'nope'"):
        vmla.decode_trace_figure(data, label="nope")
    with pytest.raises(ValueError, match="has no per-program timeline"):
        vmla.trace_segments(next(r for r in rows if not r.get("timeline")))
    # the swapped gluon kernel's trace (round 36): its merge programs launch early and wait at their PDL wait
    swap = [r for r in data["explore"]["trace_round36"]["rows"] if r.get("timeline")]
    assert len(swap) == 1 and swap[0]["label"].startswith("gswap 16x64 w4")
    seg = vmla.trace_segments(swap[0])
    assert len(seg["split"]) == swap[0]["num_splits"] * 16
    last_split_exit = max(p[3][0] + p[3][1] for p in seg["split"])
    assert min(m[2] for m in seg["merge"]) >= last_split_exit > min(m[0] for m in seg["merge"])
    fig = vmla.decode_trace_figure(data, source="trace_round36")
    assert fig.data[-1].name == "merge program" and min(fig.data[-1].base) >= last_split_exit
    assert "gswap" in fig.layout.title.text


def test_quick_grid_has_every_point_the_bars_need():
    from workbench.bench import decode as bench_decode

    need = {(b.heads, q, b.batch, b.context) for b in bench_decode.BARS for q in {1, b.qlen}}
    assert set(bench_decode.QUICK_GRID) == need and len(bench_decode.QUICK_GRID) == len(need)
    assert set(bench_decode.QUICK_GRID) <= set(bench_decode.MAIN_GRID + bench_decode.QLEN_GRID)


def test_merge_tile_follows_the_row_count_and_split_count_unless_set():
    cfg = mla.TritonConfig(16, 64, 8, 3)
    # at most 64 rows: round 19's 8x16 tile on 4 warps
    assert [cfg.merge_tile(n, 87) for n in (6, 16, 64)] == [(8, 16)] * 3
    assert [cfg.merge_num_warps(n) for n in (6, 64, 65, 4096)] == [4, 4, 1, 1]
    # above: one warp, 8 rows, the widest of 128/64/32 columns with <= 128 values per thread and >= 512 programs
    # (round 30: B=16 L=4k qlen 1, 2, 4 are 256, 512 and 1024 rows of 8 splits; B=128 L=8k 2048 rows of 2)
    assert [cfg.merge_tile(n, 8) for n in (256, 512, 1024)] == [(8, 32), (8, 64), (8, 64)]
    assert cfg.merge_tile(2048, 2) == (8, 128) and cfg.merge_tile(2048, 4) == (8, 128)
    assert [cfg.merge_tile(1024, s) for s in (1, 2, 4, 5, 8, 16, 87)] == \
        [(8, 128), (8, 128), (8, 128), (8, 64), (8, 64), (8, 32), (8, 32)]
    assert cfg.merge_tile(1000, 2) == (8, 64)  # 125 x 4 programs are too few for 128 columns
    pinned = dataclasses.replace(cfg, merge_block_r=32)
    assert pinned.merge_tile(16) == (32, 16) and pinned.merge_num_warps(4096) == 4
    assert dataclasses.replace(cfg, merge_block_d=64).merge_tile(4096, 4) == (8, 64)
    assert dataclasses.replace(cfg, merge_warps=2).merge_num_warps(4096) == 2
    assert mla.merge_programs(1024, cfg, 4) == (1024 // 8) * (512 // 128)
    with pytest.raises(ValueError, match="merge_warps is 3"):
        mla.TritonConfig(16, 64, 8, 3, merge_warps=3)


@pytest.mark.parametrize("num_splits,rows,tile", [(2, 1100, (8, 128)), (5, 517, (8, 64)), (19, 101, (8, 32))])
def test_merge_kernel_automatic_tiles_over_many_rows(num_splits, rows, tile):
    """The second-kernel merge with the one-warp tiles it takes above 64 rows (round 30: 8 rows x 128, 64 or 32
    columns by split and row count), each row count leaving a partial row block, 19 splits loaded in two chunks
    of 16, random fp32 partials and LSEs with some splits that saw no key (-inf), against a torch merge
    (log-sum-exp weights); NaN in the output buffer."""
    dev = torch.device("cuda") if ON_GPU else torch.device("cpu")
    # the automatic tiles (the interpreter's config pins one whole-row tile; unpinned here)
    cfg = dataclasses.replace(mla.triton_config(16, torch.float32), merge_block_r=None, merge_block_d=None)
    assert cfg.merge_tile(rows, num_splits) == tile
    g = torch.Generator().manual_seed(num_splits)
    mid_o = torch.randn(num_splits, rows, 512, generator=g).to(dev)
    mid_lse = (3 * torch.randn(num_splits, rows, generator=g)).to(dev)
    mid_lse[0, ::7] = float("-inf")  # a split with no key for some rows (every row keeps at least one split)
    out = torch.full((rows, 512), float("nan"), device=dev)
    lse = torch.full((rows,), float("nan"), device=dev)
    mla._launch_merge(mid_o, mid_lse, out, lse, rows, num_splits, cfg)
    ref_lse = torch.logsumexp(mid_lse, 0)
    ref_out = (torch.exp(mid_lse - ref_lse)[:, :, None] * mid_o).sum(0)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(ON_GPU, reason="interpreter only (the GPU grid covers the automatic tiles)")
def test_automatic_small_merge_tiles_match_golden_interpreter():
    """6 rows (2 requests x 3 heads) take the 8-row x 16-column merge tile: 32 column programs, a partial row
    block, 5 splits."""
    case = make_case([1, 1], [37, 70], 3, dtype=torch.float32, seed=3)
    cfg = dataclasses.replace(mla.triton_config(3, torch.float32), merge_block_r=None, merge_block_d=None)
    assert cfg.merge_tile(6) == (8, 16)
    assert_triton_exact(case, 1, 5, cfg)
