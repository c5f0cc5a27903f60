"""Fidelity against the installed vLLM's own code (``.venv-vllm``, vLLM 0.33.0 on CPU).

One subprocess (``workbench.upstream.ask_vllm``) runs, in the vLLM environment:

* the AITER MLA backend's ``_expand_page_indices_kernel`` itself, launched as its builder launches it, under
  the Triton interpreter, on generated cases (K = 1 included, block tables that are views into wider ones);
* ``AiterMLAMetadataBuilder._build_decode`` on a grid of decode and verify steps (a recording stand-in for
  ``aiter`` takes the ``get_mla_metadata_v1`` call), then ``AiterMLAImpl._forward_mqa``'s output buffer;
* ``max_decode_query_len``, ``_segmented_mla_page_size`` and the speculative method names.

Each answer is compared exactly with the workbench: the expansion spec and kernel (:mod:`workbench.expand`)
and the ``"0.33"`` rules of :mod:`workbench.since_pr`. The only skip: no vLLM environment (reason stated).
"""

from __future__ import annotations

import random

import pytest
import torch

from workbench import blocksize as bs
from workbench import since_pr as S
from workbench import upstream
from workbench.expand import expand_page_indices, expand_page_indices_ref

pytestmark = pytest.mark.vllm

MIN_EXPAND_CASES = 200


def expand_cases(seed: int = 0) -> list[dict]:
    """Named corner cases, then random ones: K in 1..128, ragged lengths (0 included), > 1024 tokens (several
    chunks), permuted block ids with block 0 reserved, and block tables that are views into wider ones."""
    rnd = random.Random(seed)
    cases = [
        dict(block_table=[[5]], seq_lens=[1], K=1),
        dict(block_table=[[0]], seq_lens=[0], K=16),
        dict(block_table=[[7, 3]], seq_lens=[17], K=16),
        dict(block_table=[[2, 9, 4]], seq_lens=[3 * 1024], K=1024),
        dict(block_table=[list(range(1, 101))], seq_lens=[100], K=1),   # K = 1: a copy
        dict(block_table=[[3, 1], [2, 0]], seq_lens=[20, 5], K=16, row_stride=9),
    ]
    while len(cases) < MIN_EXPAND_CASES + 20:
        K = rnd.choice([1, 1, 2, 3, 8, 16, 16, 32, 64, 128])
        n = rnd.randint(1, 6)
        lens = [rnd.choice([0, 1, K - 1 or 1, K, K + 1, rnd.randint(1, 3000)]) for _ in range(n)]
        width = max(1, max(-(-x // K) for x in lens))
        ids = rnd.sample(range(1, 40 * width + 50), n * width)  # block 0 reserved, ids permuted
        table = [ids[i * width:(i + 1) * width] for i in range(n)]
        case = dict(block_table=table, seq_lens=lens, K=K)
        if rnd.random() < 0.25:
            case["row_stride"] = width + rnd.randint(1, 5)
        cases.append(case)
    return cases


def decode_cases() -> list[dict]:
    """Decode and verify steps: heads 8 (a padded rank), 16, 128; qlen 1-8; buffers sized for qlen 1, for the
    step, or for 8; bf16 and fp8 caches; causal and not; eager and full CUDA graph (with dummy requests)."""
    def step(heads, q, mtp, kv, full):
        dummies = 2 if full and q > 1 else 0  # a full CUDA graph replays with dummy requests of query length 0
        return dict(qo_lens=[q] * 3 + [0] * dummies, seq_lens=[q + 37, q + 5, q + 1100] + [0] * dummies,
                    num_decode_tokens=q * (3 + dummies), num_heads=heads, mtp_qlen=mtp, kv_cache_dtype=kv,
                    causal=True, full_cudagraph=full)

    cases = [step(heads, q, mtp, "auto", q % 2 == 0) for heads in (8, 16, 128) for q in range(1, 9)
             for mtp in sorted({1, q, 8})]
    cases += [step(heads, q, 8, "fp8", True) for heads in (8, 16) for q in range(1, 9)]
    cases.append(step(16, 4, 4, "auto", False) | dict(qo_lens=[4, 4, 0], seq_lens=[9, 9, 0], num_decode_tokens=10))
    for heads, q, kv in ((8, 6, "auto"), (16, 6, "auto"), (16, 3, "fp8"), (32, 2, "fp8"), (16, 2, "fp8")):
        cases.append(dict(qo_lens=[q, q], seq_lens=[60, 70], num_decode_tokens=2 * q, num_heads=heads, mtp_qlen=8,
                          kv_cache_dtype=kv, causal=False, full_cudagraph=False))
    return [S.decode_request(c.pop("qo_lens"), c.pop("seq_lens"), seed=i, **c) for i, c in enumerate(cases)]


MTP_CASES = [dict(op="mtp_qlen", num_speculative_tokens=k, parallel_drafting=p) for k in range(0, 8)
             for p in (False, True)]
SUBPAGE = [1, 2, 3, 16, 24, 48, 64, 96, 128, 256, 1024]


@pytest.fixture(scope="module")
def real(vllm_env_python):
    ex, de = expand_cases(), decode_cases()
    requests = ([{"op": "about"}, {"op": "subpage", "block_sizes": SUBPAGE}] + [dict(op="expand", **c) for c in ex]
                + de + MTP_CASES)
    answers = upstream.ask_vllm(requests)
    assert len(answers) == len(requests)
    errors = [a for a in answers if "error" in a]
    i = 2
    return {"about": answers[0], "subpage": answers[1], "expand": (ex, answers[i:i + len(ex)]),
            "decode": (de, answers[i + len(ex):i + len(ex) + len(de)]), "mtp": answers[i + len(ex) + len(de):],
            "errors": errors}


def test_upstream_installed_version_and_locations(real):
    about = real["about"]
    assert about["version"] == "0.33.0", about
    # select_common_block_size lives in vllm/v1/worker/utils.py (its error text: the conformance test).
    assert about["select_common_block_size"].endswith("vllm/v1/worker/utils.py")
    # The AITER builder accepts multi-token decode, so its reorder threshold (the MTP qlen) follows the drafter.
    assert about["query_len_support"] != "SINGLE_ONLY"
    assert about["expand_kernel_args"][:6] == ["page_indices", "block_table", "block_table_stride_0",
                                               "block_table_stride_1", "cu_num_tokens", "num_real_tokens"]


def test_upstream_method_names_match_is_mtp_method(real):
    methods, mtp = real["about"]["speculative_methods"], set(real["about"]["mtp_methods"])
    assert "eagle3" in methods and "deepseek_mtp" in mtp and len(mtp) >= 10
    assert [m for m in methods if S.is_mtp_method(m) != (m in mtp)] == []


def test_upstream_expand_kernel_matches_the_spec_and_the_workbench_kernel(real):
    cases, answers = real["expand"]
    assert len(cases) >= MIN_EXPAND_CASES and any(c["K"] == 1 for c in cases)
    assert sum(c.get("row_stride") is not None for c in cases) >= 20
    assert sum(max(c["seq_lens"]) > 1024 for c in cases) >= 20  # several chunks per request
    for case, ans in zip(cases, answers):
        assert "error" not in ans, (case, ans)
        bt = torch.tensor(case["block_table"], dtype=torch.int32)
        lens = torch.tensor(case["seq_lens"], dtype=torch.int32)
        ref, _ = expand_page_indices_ref(bt, lens, case["K"])
        assert ans["kv_indices"] == ref.tolist(), case
        assert set(ans["tail"]) == {-7}, ("vLLM's kernel wrote past the total", case)
        assert ans["num_chunks"] == S.expand_num_chunks(bt.shape[1], case["K"])
    # The workbench's own kernel (Triton interpreter here) on every fourth case: the same answers.
    for case in cases[::4]:
        bt = torch.tensor(case["block_table"], dtype=torch.int32)
        lens = torch.tensor(case["seq_lens"], dtype=torch.int32)
        mine, _ = expand_page_indices(bt, lens, case["K"])
        assert mine.tolist() == expand_page_indices_ref(bt, lens, case["K"])[0].tolist(), case


def test_upstream_decode_decision_matches_since_pr(real):
    cases, answers = real["decode"]
    seen = {"persistent": 0, "non-persistent": 0, "padded": 0, "refused": 0}
    for case, ans in zip(cases, answers):
        kw = dict(num_heads=case["num_heads"], method="eagle3", num_speculative_tokens=max(1, case["mtp_qlen"] - 1),
                  num_decode_tokens=case["num_decode_tokens"], kv_cache_dtype=case["kv_cache_dtype"],
                  causal=case["causal"], full_cudagraph=case["full_cudagraph"])
        if case["mtp_qlen"] == 1:
            kw["method"] = None
        if "error" in ans:  # vLLM refused the step: the model must refuse it too
            assert "no non-causal fp8" in ans["error"], (case, ans)
            with pytest.raises(ValueError, match="no aiter kernel"):
                S.decode_decision("0.33", case["qo_lens"], case["seq_lens"], **kw)
            seen["refused"] += 1
            continue
        d = S.decode_decision("0.33", case["qo_lens"], case["seq_lens"], **kw)
        differ = {f: pair for f, pair in S.compare_decision(ans, d).items() if pair[0] != pair[1]}
        assert not differ, (case, differ)
        assert ans["max_qo_len"] == ans["kernel_max_seqlen_q"], case
        ref, kv_indptr = expand_page_indices_ref(torch.tensor(case["block_table"]), list(d.seq_lens), case["K"])
        assert ans["paged_kv_indptr"] == kv_indptr.tolist() and ans["kv_indices"] == ref.tolist(), case
        call = ans["metadata_call"]
        assert (call is not None) == d.persistent, case
        if call is not None:
            assert call["max_seqlen_qo"] == d.max_qo_len and call["uni_seqlen_qo"] == d.uni_qo_len, (case, call)
            assert call["num_heads"] == max(16, -(-case["num_heads"] // 16) * 16) and call["page_size"] == 1
            assert call["dtype_q"] == call["dtype_kv"] == ("fp8" if case["kv_cache_dtype"] == "fp8" else "bf16")
            assert call["is_causal"] == case["causal"]
        seen["persistent" if d.persistent else "non-persistent"] += 1
        seen["padded"] += d.padded_qo_len > 0
    # The grid must reach every branch, or the agreement above proves little.
    assert seen["persistent"] >= 40 and seen["non-persistent"] >= 25 and seen["padded"] >= 30, seen
    assert seen["refused"] >= 1, seen


def test_upstream_mtp_qlen_matches_since_pr(real):
    for case, ans in zip(MTP_CASES, real["mtp"]):
        k = case["num_speculative_tokens"]
        want = S.mtp_decode_qlen("0.33", "eagle3" if k else None, max(k, 1) if k else 1,
                                 parallel_drafting=case["parallel_drafting"])
        assert ans["max_decode_query_len"] == want, (case, ans)


def test_upstream_dcp_subpage_size_matches_since_pr(real):
    assert real["subpage"]["sizes"] == [S.dcp_subpage_size(b) for b in SUBPAGE]
