"""workbench.mla on any machine: the golden against a plain loop, the Triton kernel (the interpreter on CPU)
against the golden, the tuned tables and every config they can choose, dispatch and input checks.

Scenarios follow vLLM's attention tests: named batches with awkward sizes, permuted cache rows, unused rows filled
with NaN (a stray read turns the output into NaN), row 0 reserved. GPU-only tests: test_mla_gpu.py.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import workbench
from mla_cases import D, DV, assert_triton_exact, check_against_golden, loop_ref, make_case, metadata_of
from workbench import mla
from workbench.mla import policy

ON_GPU = workbench.device.on_gpu()
DEV = "cuda" if ON_GPU else "cpu"

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
    assert demo.flat_max_err < 1e-5
    assert demo.pages_rel_err > 0.5
    assert demo.detected
    assert demo.kv_indices_flat[:2] == [demo.kv_indices_pages[0] * 16, demo.kv_indices_pages[0] * 16 + 1]


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


# ----------------------------------------------------------------------------------------------
# the Triton kernel under the interpreter (CPU)
# ----------------------------------------------------------------------------------------------

# (qo_lens, kv_lens, heads): small and awkward
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


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("name", list(INTERP_SCENARIOS))
def test_triton_interpreter_matches_golden(name, dtype):
    qo, kv, heads = INTERP_SCENARIOS[name]
    case = make_case(qo, kv, heads, dtype=dtype, seed=sum(map(ord, name)) % 1000)
    res = mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case), sm_scale=0.08, backend="triton")
    assert res.backend == "triton" and res.out.dtype == dtype
    check_against_golden(case, res.out, res.lse, dtype, 0.08, f"{name} {dtype}")


@pytest.mark.interpreter
@pytest.mark.parametrize("qlen", range(1, 17))
def test_triton_every_qlen_interpreter(qlen):
    """Every query length 1..16 (not only powers of two): each position gets its own causal row."""
    case = make_case([qlen, qlen], [qlen, qlen + 19], 2, dtype=torch.float16, seed=qlen)
    out, lse = mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                     case["kv_indices"], qlen, 0.1, num_splits=2)
    check_against_golden(case, out, lse, torch.float16, 0.1, f"qlen {qlen}")
    if qlen > 1:  # positions differ (the aiter #2720 symptom would make them equal)
        assert (out[1] - out[0]).abs().max() > 1e-3


@pytest.mark.interpreter
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7])
@pytest.mark.parametrize("idx_ahead", [False, True])
def test_split_counts_agree(num_splits, idx_ahead):
    """Splits (some empty for the shorter request) merged by LSE give the single-split answer, in both loops of
    the split kernel (indices loaded with their tile, or one tile ahead)."""
    case = make_case([2, 2], [2, 50], 2, dtype=torch.float32, seed=3)
    cfg = dataclasses.replace(mla.interpreter_config(), idx_ahead=idx_ahead)
    assert_triton_exact(case, 2, num_splits, cfg)


@pytest.mark.interpreter
@pytest.mark.parametrize("num_splits", [3, 5])
def test_merge_kernel_chunks_and_column_blocks(num_splits):
    """The merge with its splits loaded in chunks (the last chunk partly past num_splits) and its columns cut
    into blocks (grid axis 1) gives the golden; 3 rows per request leave a partial row block."""
    case = make_case([1, 1], [3, 60], 3, dtype=torch.float32, seed=num_splits)
    cfg = dataclasses.replace(mla.interpreter_config(), merge_split_chunk=2, merge_block_d=128)
    assert_triton_exact(case, 1, num_splits, cfg)


@pytest.mark.interpreter
@pytest.mark.parametrize("qo_lens,kv_lens,heads", [([1, 1, 1], [1, 17, 100], 3), ([2, 5, 1], [9, 40, 33], 2)])
def test_narrow_partials_match_golden(qo_lens, kv_lens, heads):
    """``narrow_partials``: fp16 partial outputs (fp32 LSE), 3 splits (some empty), within the derived tolerance."""
    case = make_case(qo_lens, kv_lens, heads, dtype=torch.float16, seed=6)
    cfg = dataclasses.replace(mla.interpreter_config(), narrow_partials=True)
    assert mla.partial_dtype(cfg, torch.float16) == torch.float16
    out, lse = mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                     case["kv_indices"], max(qo_lens), 0.1, num_splits=3, config=cfg)
    check_against_golden(case, out, lse, torch.float16, 0.1, f"narrow {qo_lens}")


@pytest.mark.interpreter
def test_automatic_small_merge_tiles_match_golden_interpreter():
    """6 rows (2 requests x 3 heads) take the 8-row x 16-column merge tile: 32 column programs, a partial row
    block, 5 splits."""
    case = make_case([1, 1], [37, 70], 3, dtype=torch.float32, seed=3)
    cfg = dataclasses.replace(mla.interpreter_config(), merge_block_r=None, merge_block_d=None)
    assert cfg.merge_tile(6) == (8, 16)
    assert_triton_exact(case, 1, 5, cfg)


# ----------------------------------------------------------------------------------------------
# the tuned tables: well formed, every rule reached at its own points, every Triton config exact
# ----------------------------------------------------------------------------------------------

H200_SMS = 132
FAMILIES = {"nvidia": "cuda", "rocm": "hip"}


def _table_configs(family):
    return {rule["_config"].key: rule["_config"] for rule in policy.tuned_table(family)["rules"]}


@pytest.mark.parametrize("family", FAMILIES)
def test_tuned_table_is_well_formed(family):
    table = policy.tuned_table(family)
    assert table["generated_by"] and table["measured_on"] and table["how"]
    names = [r["name"] for r in table["rules"]]
    assert len(names) == len(set(names)), "rule names are unique"
    for rule in table["rules"]:
        assert isinstance(rule["_config"], mla.TritonConfig)
        for point in rule["points"]:
            heads, qlen, batch, context = point
            assert heads >= 1 and 1 <= qlen <= mla.MAX_QLEN and batch >= 1 and context >= qlen
        if family == "rocm":
            # no Gluon, no PDL on ROCm (tests/test_codegen.py compiles these against 64 KB of LDS)
            assert rule["_config"].kernel == "triton" and not rule["_config"].pdl


@pytest.mark.parametrize("family", FAMILIES)
def test_every_rule_is_chosen_at_its_own_points(family, monkeypatch):
    """Each rule's measured points fall in its class: the policy walking the table on an H200's 132 SMs picks that
    rule's config for them (with the Gluon kernels available on NVIDIA, and also without for non-Gluon rules)."""
    monkeypatch.setattr(workbench.device, "interpreter_active", lambda: False)
    for rule in policy.tuned_table(family)["rules"]:
        when = rule["when"]
        for heads, qlen, batch, context in rule["points"]:
            dtype = torch.float32 if when.get("fp32") else torch.bfloat16
            gluon = when.get("gluon", False)
            cfg = mla.triton_config(qlen * heads, dtype, batch * context, backend=FAMILIES[family], gluon=gluon,
                                    num_reqs=batch, sm_count=H200_SMS)
            assert cfg == rule["_config"], (rule["name"], (heads, qlen, batch, context), cfg.label)


def test_policy_walks_the_table_in_order(monkeypatch):
    monkeypatch.setattr(workbench.device, "interpreter_active", lambda: False)
    big = policy.tuned_table("nvidia")["small_batch_tokens"] + 1
    ws = dict(gluon=True, sm_count=H200_SMS)
    # no request count: the tokens-per-program rules cannot be decided, so the plain 64-row Gluon kernel
    assert mla.triton_config(64, torch.bfloat16, 64 * 4096, **ws).kernel == "gluon"
    assert mla.triton_config(64, torch.bfloat16, **ws).kernel == "gluon"
    # unknown size: the large-batch Triton tile
    assert mla.triton_config(16, torch.bfloat16, gluon=False) == mla.triton_config(16, torch.bfloat16, big, gluon=False)
    assert mla.triton_config(16, torch.bfloat16, gluon=False).programs_per_sm == 2
    # fp32 never takes a Gluon kernel, and keeps to 32-row tiles of 32 tokens (shared memory)
    for rows in (1, 16, 17, 64, 2048):
        c = mla.triton_config(rows, torch.float32, 1000, **ws)
        assert c.kernel == "triton" and c.block_n == 32 and c.block_m <= 32
    assert mla.triton_config(64, torch.bfloat16, backend="hip", gluon=True).kernel == "triton"  # ROCm tiles
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs sm_count"):
            mla.triton_config(64, torch.bfloat16, 64 * 4096, num_reqs=64, gluon=True)
    with pytest.raises(ValueError, match="rows_per_req is 0"):
        mla.triton_config(0, torch.bfloat16)
    with pytest.raises(ValueError, match="backend must be"):
        mla.triton_config(16, torch.bfloat16, backend="metal")


def test_table_config_is_what_a_gpu_of_the_family_gets(monkeypatch):
    """table_config walks the same table whatever runs here; on a GPU triton_config returns the same."""
    for rows, tokens, reqs in ((16, 64 * 32768, 64), (32, 64 * 4096, 64), (64, 16 * 4096, 16), (128, 64 * 4096, 64)):
        cfg = mla.table_config(rows, torch.bfloat16, tokens, num_reqs=reqs, sm_count=H200_SMS)
        monkeypatch.setattr(workbench.device, "interpreter_active", lambda: False)
        assert cfg == mla.triton_config(rows, torch.bfloat16, tokens, backend="cuda", gluon=True, num_reqs=reqs,
                                        sm_count=H200_SMS)
        monkeypatch.undo()
    assert mla.table_config(16, torch.bfloat16, family="nvidia", gluon=True).kernel == "gluon_swap"
    assert mla.table_config(64, torch.bfloat16, family="rocm").kernel == "triton"
    with pytest.raises(ValueError, match="family is 'metal'"):
        mla.table_config(16, torch.bfloat16, family="metal")


def test_gluon_is_chosen_only_where_it_runs(monkeypatch):
    monkeypatch.setattr(workbench.device, "interpreter_active", lambda: False)
    assert mla.triton_config(64, torch.bfloat16).kernel == ("gluon" if workbench.device.gluon_available() else "triton")
    monkeypatch.setattr("triton.__version__", "3.5.1")  # an older Gluon: never chosen by default
    assert not workbench.device.gluon_available() and mla.triton_config(64, torch.bfloat16).kernel == "triton"


@pytest.mark.interpreter
@pytest.mark.parametrize("family", FAMILIES)
def test_every_triton_config_of_the_tables_matches_golden_interpreter(family):
    """Every Triton-kernel config a table can choose, run under the interpreter (which ignores warps and stages but
    keeps the tile, the loop and the partial dtype) on a ragged fp16 batch with a request without queries, 3 splits
    (some empty), against the golden. The Gluon configs run on Hopper only (test_mla_gpu.py)."""
    for cfg in _table_configs(family).values():
        if cfg.kernel != "triton":
            continue
        case = make_case([2, 0, 3], [40, 5, 70], 8, dtype=torch.float16, seed=cfg.block_m + cfg.block_n)
        out, lse = mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                         case["kv_indices"], 3, 0.1, num_splits=3, config=cfg)
        check_against_golden(case, out, lse, torch.float16, 0.1, f"{family} {cfg.label}")


def test_config_is_checked():
    with pytest.raises(ValueError, match="kernel is 'cutlass'"):
        mla.TritonConfig(kernel="cutlass")
    with pytest.raises(ValueError, match="kernel 'gluon' has fixed tiles"):
        mla.TritonConfig(kernel="gluon", block_m=64, block_n=32, num_warps=8, num_stages=2)
    with pytest.raises(ValueError, match="kernel 'gluon_swap' has fixed tiles"):
        mla.TritonConfig(kernel="gluon_swap", block_m=64, block_n=64, num_warps=8, num_stages=2)
    with pytest.raises(ValueError, match="narrow_partials is a switch of the Triton split kernel"):
        mla.TritonConfig(kernel="gluon", block_m=64, block_n=64, num_warps=8, num_stages=2, narrow_partials=True)
    with pytest.raises(ValueError, match="idx_ahead applies to the 'triton' kernel"):
        mla.TritonConfig(kernel="gluon_swap", block_m=16, block_n=64, num_warps=4, num_stages=2, idx_ahead=True)
    with pytest.raises(ValueError, match="block_m is 24"):
        mla.TritonConfig(block_m=24)
    with pytest.raises(ValueError, match="merge_warps is 3"):
        mla.TritonConfig(merge_warps=3)
    cfg = mla.TritonConfig(block_m=16, block_n=64, num_warps=8, num_stages=3, narrow_partials=True, pdl=True)
    assert cfg.label == "triton 16x64 w8 s3 pdl np" and mla.partial_dtype(cfg, torch.bfloat16) == torch.bfloat16
    assert mla.partial_dtype(mla.TritonConfig(), torch.bfloat16) == torch.float32
    gluon = mla.TritonConfig(kernel="gluon", block_m=64, block_n=64, num_warps=8, num_stages=2)
    assert mla.partial_dtype(gluon, torch.bfloat16) == torch.bfloat16  # the Gluon kernels keep 16-bit partials


@pytest.mark.parametrize("kernel", ["gluon", "gluon_ws", "gluon_swap"])
def test_gluon_kernels_refuse_to_run_off_hopper(kernel):
    if workbench.device.gluon_available():
        pytest.skip("this machine runs the Gluon kernels (the refusal is for other GPUs and the interpreter)")
    cfg = next(c for c in _table_configs("nvidia").values() if c.kernel == kernel)
    case = make_case([1], [5], 16, dtype=torch.float16, device=DEV)
    with pytest.raises(ValueError, match=rf"TritonConfig\(kernel='{kernel}'\) needs compiled Triton on an NVIDIA"):
        mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"],
                              1, 0.07, config=cfg)


def test_splits_follow_the_wave_cost_model():
    cfg = policy.tuned_table("nvidia")["rules"][-1]["_config"]  # 64 rows, one program per SM
    assert mla.choose_num_splits(64, 1, 32768, cfg, 132) == 2  # 128 programs fill one wave; 256 would be two
    assert mla.choose_num_splits(1, 1, 32768, cfg, 132) > 64  # one long request: split across the GPU
    assert mla.choose_num_splits(128, 2, 4096, cfg, 132) == 1  # 256 programs already
    assert mla.choose_num_splits(4, 1, 20, cfg, 132) == 1  # never below one small tile
    assert mla.default_splits(cfg, 64, 1, 64 * 32768, 132) == 2


def test_merge_tile_follows_the_row_count_and_split_count_unless_set():
    cfg = mla.TritonConfig(block_m=16, block_n=64, num_warps=8, num_stages=3)
    assert [cfg.merge_tile(n, 87) for n in (6, 16, 64)] == [(8, 16)] * 3  # at most 64 rows: 8x16 on 4 warps
    assert [cfg.merge_num_warps(n) for n in (6, 64, 65, 4096)] == [4, 4, 1, 1]
    # above: one warp, 8 rows, the widest of 128/64/32 columns with <= 128 values per thread and >= 512 programs
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


@pytest.mark.parametrize("num_splits,rows,tile", [(2, 1100, (8, 128)), (5, 517, (8, 64)), (19, 101, (8, 32))])
def test_merge_kernel_automatic_tiles_over_many_rows(num_splits, rows, tile):
    """The merge with the one-warp tiles it takes above 64 rows (8 rows x 128, 64 or 32 columns by split and row
    count), each row count leaving a partial row block, 19 splits loaded in two chunks of 16, random fp32 partials
    and LSEs with some splits that saw no key (-inf), against a torch merge (log-sum-exp weights); NaN in the output
    buffer."""
    from workbench.mla.launch import _launch_merge

    dev = torch.device(DEV)
    cfg = dataclasses.replace(mla.interpreter_config(), merge_block_r=None, merge_block_d=None)
    assert cfg.merge_tile(rows, num_splits) == tile
    g = torch.Generator().manual_seed(num_splits)
    mid_o = torch.randn(num_splits, rows, 512, generator=g).to(dev)
    mid_lse = (3 * torch.randn(num_splits, rows, generator=g)).to(dev)
    mid_lse[0, ::7] = float("-inf")  # a split with no key for some rows (every row keeps at least one split)
    out = torch.full((rows, 512), float("nan"), device=dev)
    lse = torch.full((rows,), float("nan"), device=dev)
    _launch_merge(mid_o, mid_lse, out, lse, rows, num_splits, cfg)
    ref_lse = torch.logsumexp(mid_lse, 0)
    ref_out = (torch.exp(mid_lse - ref_lse)[:, :, None] * mid_o).sum(0)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------------
# backends and input checks
# ----------------------------------------------------------------------------------------------


def test_auto_states_its_choice_and_matches_golden():
    case = make_case([1, 1], [5, 9], 2, dtype=torch.float16 if not ON_GPU else torch.bfloat16, device=DEV)
    res = mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case))
    assert res.backend == "triton" and res.reason
    cfg, splits = mla.triton_launch_plan(case["q"], case["qo_indptr"], case["kv_indices"], 1)
    assert f"split kernel {cfg.label}, {splits} split" in res.reason  # which kernel ran, and how many splits
    gold, _ = mla.mla_decode_ref(**case)
    assert (res.out.float() - gold).abs().max() < 2e-2


@pytest.mark.interpreter
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
    gold, _ = mla.mla_decode_ref(**case, sm_scale=0.3)
    assert res.backend == "torch"
    torch.testing.assert_close(res.out, gold, rtol=0, atol=0)


@pytest.mark.skipif(workbench.device.aiter_status().available, reason="aiter is importable here")
def test_aiter_backend_says_why_not():
    case = make_case([1], [5], 16, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="backend='aiter' is unavailable here"):
        mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case), backend="aiter")


@pytest.mark.interpreter
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


@pytest.mark.parametrize("sm_scale", [0.0, -0.07, float("nan"), float("inf")])
def test_a_scale_that_is_not_finite_and_positive_is_refused(sm_scale):
    """The kernels take the row max of the unscaled scores and scale it (``max(s) * scale``), which is the max of
    the scaled scores only for a positive scale: any other is refused before a launch."""
    case = make_case([2, 2], [2, 7], 2, dtype=torch.float16, device=DEV)
    with pytest.raises(ValueError, match="sm_scale is .*; it must be finite and positive"):
        mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case), sm_scale=sm_scale, backend="triton")


def test_zero_length_kv_with_a_query_raises():
    """A request with query tokens and no KV has no defined output -> ValueError (never NaN or zeros)."""
    case = make_case([1, 1], [3, 1], 2)
    case["kv_indptr"] = torch.tensor([0, 3, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="0-length KV"):
        mla.mla_decode_ref(**case)


def test_request_without_queries_is_skipped():
    case = make_case([1, 0, 2], [4, 9, 5], 2)
    out, _ = mla.mla_decode_ref(**case)
    assert out.shape[0] == 3
    dtype = torch.bfloat16 if ON_GPU else torch.float16
    on = {k: v.to(DEV) for k, v in case.items()}
    res = mla.mla_decode(on["q"].to(dtype), on["kv_cache"].to(dtype), metadata_of(on), backend="triton")
    assert (res.out.float().cpu() - out).abs().max() < 2e-2


def test_device_mismatch_is_named():
    case = make_case([1], [3], 2)
    case["kv_indices"] = case["kv_indices"].to("meta")
    with pytest.raises(ValueError, match="kv_indices is on meta"):
        mla.mla_decode_ref(**case)
