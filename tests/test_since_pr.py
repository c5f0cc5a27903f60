"""workbench.since_pr: the PR-era and the newer rules, side by side (no vLLM needed; the comparison with the
installed vLLM's own code is tests/test_upstream_fidelity.py)."""

from __future__ import annotations

import pytest
import torch

from workbench import mla, perfmodel, qlen, since_pr as S
from workbench.qlen._shared import paged_batch

ERAS = S.ERAS
KS = range(1, 8)


# ---- sizing and the gate ------------------------------------------------------------------------

@pytest.mark.parametrize("method,mtp", [("mtp", True), ("deepseek_mtp", True), ("qwen3_next_mtp", True),
                                        ("eagle3", False), ("eagle", False), ("dflash", False), ("ngram", False)])
def test_mtp_methods(method, mtp):
    assert S.is_mtp_method(method) is mtp
    for k in (1, 3, 7):
        assert S.mtp_decode_qlen("0.20", method, k) == 1
        assert S.mtp_decode_qlen("45227", method, k) == (k + 1 if mtp else 1)
        assert S.mtp_decode_qlen("0.33", method, k) == k + 1
    assert S.mtp_decode_qlen("0.33", method, 3, parallel_drafting=True) == 7
    assert S.mtp_decode_qlen("0.33", None, 3) == 1


@pytest.mark.parametrize("bad", ["", None, 3])
def test_is_mtp_method_refuses_non_names(bad):
    with pytest.raises(ValueError, match="speculative method name"):
        S.is_mtp_method(bad)


def test_gate_of_each_era():
    # The PR: only single-token decode.
    assert [S.persistent_gate("0.20", q, mtp_qlen=8) for q in range(0, 9)] == [False, True] + [False] * 7
    # #45227: sized verify length, 16+ heads.
    assert [S.persistent_gate("45227", q, mtp_qlen=4) for q in range(0, 6)] == [False, True, True, True, True, False]
    assert not S.persistent_gate("45227", 1, num_heads=8, mtp_qlen=4)
    # 0.33: a padded rank (8 heads) keeps it up to qlen 4 (bf16, causal), or always with fp8 or non-causal.
    assert [S.persistent_gate("0.33", q, num_heads=8, mtp_qlen=8) for q in (1, 4, 5, 8)] == [True, True, False, False]
    assert S.persistent_gate("0.33", 8, num_heads=8, mtp_qlen=8, kv_cache_dtype="fp8")
    assert S.persistent_gate("0.33", 8, num_heads=8, mtp_qlen=8, causal=False)
    assert S.persistent_gate("0.33", 8, num_heads=16, mtp_qlen=8)
    assert not S.persistent_gate("0.33", 9, num_heads=16, mtp_qlen=8)
    # Gluon (small heads on gfx950) never takes the persistent schedule.
    assert not S.persistent_gate("0.33", 1, num_heads=8, mtp_qlen=1, gluon=True)
    assert S.persistent_gate("0.33", 1, num_heads=8, mtp_qlen=1, gluon=True, kv_cache_dtype="fp8")


@pytest.mark.parametrize("kwargs,match", [(dict(era="0.21"), "choose one of"), (dict(max_qo_len=-1), "max_qo_len"),
                                          (dict(kv_cache_dtype="int8"), "kv_cache_dtype")])
def test_gate_errors_name_the_argument(kwargs, match):
    args = dict(era="0.33", max_qo_len=2) | kwargs
    with pytest.raises(ValueError, match=match):
        S.persistent_gate(args.pop("era"), args.pop("max_qo_len"), **args)


# ---- CUDA-graph dummy rows ----------------------------------------------------------------------

@pytest.mark.parametrize("qo,tokens,want", [
    ([4, 4, 0, 0], 16, 4),   # two live requests of 4, two dummies: pad
    ([4, 4, 4, 4], 16, 0),   # nothing to pad
    ([4, 0, 4, 0], 16, 0),   # live requests not a prefix
    ([4, 3, 0, 0], 16, 0),   # not uniform
    ([1, 1, 0, 0], 4, 0),    # qlen 1 is never padded
    ([0, 0, 0], 12, 4),      # all dummies (capture)
    ([4, 4, 0], 13, 0),      # token count not a multiple of the requests
])
def test_uniform_padded_mtp_qo_len(qo, tokens, want):
    assert S.uniform_padded_mtp_qo_len(qo, max(qo), tokens) == want


def test_dummy_rows_get_synthetic_lengths_and_a_uniform_indptr():
    d = S.decode_decision("0.33", [4, 4, 0, 0], [100, 50, 0, 0], num_speculative_tokens=3, num_decode_tokens=16)
    assert d.padded_qo_len == 4 and d.seq_lens == (100, 50, 4, 4) and d.qo_indptr == (0, 4, 8, 12, 16)
    assert d.persistent and d.uni_qo_len == 4 and not d.zero_filled_output
    # Eagle3 k = 3 under #45227: sized for qlen 1, so the verify is non-persistent (and no dummy synthesis).
    old = S.decode_decision("45227", [4, 4], [100, 50], num_speculative_tokens=3)
    assert not old.persistent and old.uni_qo_len is None and old.qo_indptr == (0, 4, 8)
    # A full-graph single-token step keeps its own query_start_loc (dummies of length 0 included).
    g = S.decode_decision("0.33", [1, 1, 0], [9, 9, 0], num_decode_tokens=3, full_cudagraph=True)
    assert g.qo_indptr == (0, 1, 2, 2) and not g.padded_qo_len
    assert S.decode_decision("0.33", [1, 1, 0], [9, 9, 0], num_decode_tokens=3).qo_indptr == (0, 1, 2, 3)


def test_zero_fill_only_without_persistent_metadata():
    small = S.decode_decision("0.33", [6, 6], [50, 60], num_heads=8, num_speculative_tokens=5)
    assert not small.persistent and small.zero_filled_output
    assert not S.decode_decision("0.20", [6, 6], [50, 60], num_speculative_tokens=5).zero_filled_output


def test_expand_grid_and_dcp_subpages():
    assert S.expand_num_chunks(0, 16) == 1 and S.expand_num_chunks(64, 16) == 1 and S.expand_num_chunks(65, 16) == 2
    assert S.expand_num_chunks(6100, 16) == 96  # ~97k-token context: 96 programs instead of one serial loop
    assert [S.dcp_subpage_size(b) for b in (1, 16, 48, 64, 256, 1024)] == [1, 16, 16, 64, 128, 128]


# ---- aiter's kernels and the verdicts ------------------------------------------------------------

def test_aiter_kernel_dispatch():
    np_ = [S.aiter_kernel(q, persistent=False).qseqlen for q in range(1, 9)]
    assert np_ == [1, 4, 4, 4, 8, 8, 8, 8]
    ps950 = [S.aiter_kernel(q, persistent=True).qseqlen for q in range(1, 9)]
    assert ps950 == [4, 4, 4, 1, None, None, None, 4]
    ps942 = [S.aiter_kernel(q, persistent=True, arch="gfx942").qseqlen for q in range(1, 9)]
    assert ps942 == [4, 4, 4, 4, None, None, None, None]
    assert S.aiter_kernel(8, persistent=True).gqa == 32 and S.aiter_kernel(4, persistent=True).gqa == 64
    assert not S.aiter_kernel(5, persistent=False, kv_dtype="fp8").exists


def test_safe_num_spec_tokens_by_era():
    assert S.safe_num_spec_tokens_for("0.20") == [1, 3, 7] == qlen.safe_num_spec_tokens(7)
    assert S.safe_num_spec_tokens_for("45227") == [1, 3, 7]  # Eagle3 still on the non-persistent path
    assert S.safe_num_spec_tokens_for("45227", method="deepseek_mtp") == [1, 2, 3, 7]
    assert S.safe_num_spec_tokens_for("0.33") == [1, 2, 3, 7]
    assert S.safe_num_spec_tokens_for("0.33", arch="gfx942") == [1, 2, 3]
    assert S.safe_num_spec_tokens_for("0.33", num_heads=8, arch="gfx942") == [1, 2, 3]
    assert S.safe_num_spec_tokens_for("0.33", kv_dtype="fp8") == [1, 2, 3]
    assert S.safe_num_spec_tokens_for("0.20", arch="gfx942") == [1, 3]


def test_verdicts_separate_silent_from_loud():
    assert S.verify_outcome("0.20", 5).verdict == "wrong (silent)"
    assert S.verify_outcome("0.33", 5).verdict == "refused (loud)"
    assert S.verify_outcome("0.33", 5, num_heads=8, arch="gfx942").verdict == "wrong (silent)"
    with pytest.raises(ValueError, match="Gluon MTP kernel"):
        S.verify_outcome("0.33", 3, num_heads=8, gluon=True)
    table = S.format_outcomes([("PR", "0.20", {}), ("0.33", "0.33", {})], markdown=True).splitlines()
    assert len(table) == 2 + 7 and "WRONG (NP, q8)" in table[6] and "refused (P)" in table[6]


# ---- main's padding, through the emulated fault ---------------------------------------------------

def test_main_padding_rule():
    assert [S.padded_verify_qlen_main(q) for q in range(1, 9)] == [1, 4, 4, 4, 5, 6, 7, 8]


def _batch(qlen_, kv_lens=(40, 63), heads=16, K=16, seed=0):
    return paged_batch(qlen_, heads, kv_lens, torch.float32, torch.device("cpu"), seed, K)


@pytest.mark.parametrize("qlen_", [2, 3, 5, 6])
def test_front_padding_keeps_every_real_row(qlen_):
    q, cache, md = _batch(qlen_)
    gold, _ = mla.mla_decode_ref(q, cache, md.qo_indptr, md.kv_indptr, md.kv_indices)
    pad = S.padded_verify_qlen_main(qlen_)
    out = S.decode_with_padding(q, cache, md, pad, backend="torch")
    assert torch.allclose(out, gold, atol=1e-5)
    faulty = S.decode_with_padding(q, cache, md, pad)  # through the emulated aiter #2720 fault
    assert torch.equal(faulty, out) == qlen.is_pow2(pad)
    padded = S.pad_queries_front(q, md, pad)
    assert padded.extra_rows == 2 * (pad - qlen_) and bool((padded.q[: pad - qlen_] == 0).all())


def test_front_padding_errors():
    q, cache, md = _batch(3, kv_lens=(3, 40))
    with pytest.raises(ValueError, match="every padded row must see a key"):
        S.pad_queries_front(q, md, 4)
    with pytest.raises(ValueError, match="pad_len"):
        S.pad_queries_front(q, md, 2)


# ---- the throughput model under the newer rules ----------------------------------------------------

def test_best_k_allowed_matches_best_k_on_its_own_sets():
    pred = perfmodel.predict_published()
    target, draft = pred.target, pred.drafts["BF16 draft"]
    alpha = perfmodel.fit_iid_alpha(perfmodel.AITER_2720_RATES)
    free = perfmodel.best_k(target, draft, 16, 1536, alpha=alpha, k_max=7)
    pow2 = perfmodel.best_k(target, draft, 16, 1536, alpha=alpha, k_max=7, power_of_two=True)
    assert S.best_k_allowed(target, draft, 16, 1536, range(1, 8), alpha=alpha).k == free.k
    got = S.best_k_allowed(target, draft, 16, 1536, [1, 3, 7], alpha=alpha)
    assert got.k == pow2.k and got.speedup == pytest.approx(pow2.speedup)
    rows = S.recommendations(target, draft, (4, 64), 1536, {"PR": [1, 3, 7], "0.33": [1, 2, 3, 7]}, alpha=alpha)
    assert len(rows) == 4 and all(0 < r["vs_free"] <= 1 + 1e-12 for r in rows)
    with pytest.raises(ValueError, match="speculative decoding is off"):
        S.best_k_allowed(target, draft, 16, 1536, [], alpha=alpha)
