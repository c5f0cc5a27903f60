"""benchmarks/decode.py, benchmarks/compare.py and benchmarks/profile_decode.py on CPU: the point grid and its bars,
the layouts both kernels read (checked with a stand-in for FlashMLA that reads the block table through the paged
golden), the bar logic on synthetic rows, and loading another revision side by side. No timing is asserted (the
timer is faked)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

import workbench  # noqa: F401
from workbench import mla

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import compare  # noqa: E402
import decode as bench  # noqa: E402
import profile_decode  # noqa: E402


def test_points_cover_the_bars_of_the_peer_comparison():
    keys = {p.key for p in bench.POINTS}
    for need in ("16x1:64:32k", "16x1:128:8k", "16x1:16:4k", "16x1:64:4k", "16x2:64:4k", "16x4:16:4k", "16x4:64:4k",
                 "16x4:64:32k", "16x4:128:8k", "16x6:64:4k", "16x8:16:4k", "16x8:64:4k", "16x8:64:32k",
                 "16x8:128:8k", "128x1:64:4k", "128x1:16:4k", "128x1:64:8k", "16x3:64:4k", "16x5:64:4k",
                 "16x7:64:4k"):
        assert need in keys, need
    assert {p.key: p.peer_bar for p in bench.POINTS}["16x2:64:4k"] == 1.00
    assert {p.key: p.peer_bar for p in bench.POINTS}["16x3:64:4k"] == 1.10
    assert {p.key: p.peer_bar for p in bench.POINTS}["128x1:16:4k"] == 1.10
    assert bench.parse_point("16x1:64:32k") == bench.Point(16, 1, 64, 32768)
    assert bench.parse_point("128x1:16:1000").context == 1000
    with pytest.raises(ValueError, match="is not HEADSxQLEN:BATCH:CONTEXT"):
        bench.parse_point("16:1:64")
    assert bench.n_sets(bench.parse_point("16x1:16:4k")) == 4 and bench.n_sets(bench.parse_point("16x1:64:32k")) == 1


class FakeFlashMLA(types.ModuleType):
    """FlashMLA's interface, computed with the paged golden: it reads the block table, as the real one does."""

    def __init__(self):
        super().__init__("flash_mla_dense")
        self.calls = 0

    def precompute_mla_metadata(self, cache_seqlens, seqlen_q, num_heads_q, num_heads_k=1, causal=False):
        assert num_heads_k == 1 and causal == (seqlen_q > 1)
        return ("meta", seqlen_q, num_heads_q)

    def flash_mla_with_kvcache(self, q, k_cache, block_table, cache_seqlens, head_dim_v, meta, softmax_scale, causal):
        self.calls += 1
        B, s_q, H, D = q.shape
        assert k_cache.shape[1] == 64 and head_dim_v == 512 and meta == ("meta", s_q, H)
        qo = torch.arange(0, B * s_q + 1, s_q, dtype=torch.int32)
        out, lse = mla.mla_decode_paged_ref(q.reshape(B * s_q, H, D), k_cache, qo, block_table, cache_seqlens,
                                            softmax_scale)
        return out.to(q.dtype).view(B, s_q, H, 512), lse


@pytest.mark.interpreter
def test_measure_reads_the_same_tokens_on_both_layouts_as_the_peer():
    """On a tiny point under the interpreter (fp16), the workbench on the expansion's flat indices and the stand-in
    FlashMLA on the block table compute the same attention; the scattered layout matches its own golden; the repeats
    run in mirrored order; the ratios are medians of per-repeat ratios."""
    p = bench.Point(16, 2, 3, 150)
    cache = bench.make_cache([p], torch.device("cpu"), dtype=torch.float16, sets=lambda _: 2)
    order = []

    def fake_timer(fn, calls):
        fn()
        order.append(fn)
        return 10.0 + len(order) % 3

    fm = FakeFlashMLA()
    row = bench.measure(p, cache, fm, repeats=3, log=lambda *_: None, sets=2, timer=fake_timer)
    assert row["golden_max_abs_err"] < 5e-3 and row["scattered_golden_max_abs_err"] < 5e-3
    assert row["flashmla_golden_max_abs_err"] < 5e-3 and row["vs_flashmla_max_ulp"] < 64
    assert len(row["repeats"]) == 3 and set(row["repeats"][0]) == {"workbench", "scattered", "flashmla"}
    assert len(order) == 3 * 6  # each repeat times each of the three calls twice
    assert [order[i] is order[5 - i] for i in range(3)] == [True] * 3  # mirrored within a repeat (A B C C B A)
    assert len({id(f) for f in order[:3]}) == 3 and order[6] is order[2]  # the next repeat starts from the other end
    assert row["ratio"] == pytest.approx(sorted(t["workbench"] / t["flashmla"] for t in row["repeats"])[1])
    assert fm.calls >= 2 * 4  # two sets per call; one correctness call and three repeats


def test_bars_from_synthetic_rows():
    rows = [dict(key="16x1:64:32k", ratio=0.97, scattered_ratio=1.02, kv_gb_s=4100.0, tflops=1.0),
            dict(key="16x8:64:4k", ratio=1.2, scattered_ratio=1.08, kv_gb_s=1.0, tflops=400.0),
            dict(key="128x1:64:4k", scattered_ratio=1.0, kv_gb_s=1.0, tflops=450.0)]  # FlashMLA not run there
    bars = {b["name"]: b for b in bench.evaluate_bars(rows, {"copy": {"gb_s": 4300.0}})}
    assert bars["16x1:64:32k: time <= 1.00x FlashMLA's (same cache, same run)"]["verdict"] == "PASS"
    assert bars["16x8:64:4k: time <= 1.10x FlashMLA's (same cache, same run)"]["verdict"] == "MISS"
    peer_128 = bars["128x1:64:4k: time <= 1.10x FlashMLA's (same cache, same run)"]
    assert peer_128["verdict"] == "MISS" and peer_128["note"] == "FlashMLA not run"
    assert bars["16x8:64:4k: token-scattered layout <= 1.05x the paged-64 time"]["verdict"] == "MISS"
    assert bars["16x1:64:32k: KV bandwidth >= 90% of copy"]["value"] == pytest.approx(4100 / 4300)
    assert bars["128x1:64:4k: >= 300 TFLOP/s"]["verdict"] == "PASS"
    missing = bars["16x1:16:4k: KV bandwidth >= 2.5 TB/s"]
    assert missing["verdict"] == "MISS" and missing["note"] == "point not measured"
    assert all("FlashMLA" in name for name in bars if "FlashMLA" in name)
    assert sum("FlashMLA" in name for name in bars) == len(bench.POINTS)


def test_peer_path_is_checked(tmp_path, monkeypatch):
    monkeypatch.delenv("WORKBENCH_FLASHMLA", raising=False)
    assert bench.find_flashmla(None) is None
    with pytest.raises(FileNotFoundError, match="no flash_mla_dense.py there"):
        bench.find_flashmla(str(tmp_path))


def test_tune_candidates_follow_the_rule():
    rules = {r["name"]: r for r in mla.tuned_table("nvidia")["rules"]}
    tri = bench.candidates(rules["up to 16 rows"])
    assert len(tri) == 64 and all(c.block_m == 16 and c.kernel == "triton" for c in tri)
    assert rules["up to 16 rows"]["_config"] in tri  # the table's choice is among what it re-measures
    fp32 = bench.candidates(rules["fp32"])
    assert not any(c.narrow_partials for c in fp32) and rules["fp32"]["_config"] in fp32
    ws_rule = rules["Hopper, >= 128 tokens per program"]
    ws = bench.candidates(ws_rule)
    assert {c.kernel for c in ws} == {"gluon", "gluon_ws"} and ws_rule["_config"] in ws
    assert bench.candidates(rules["Hopper, up to 16 rows"]) == [rules["Hopper, up to 16 rows"]["_config"]]


def test_another_revision_loads_side_by_side(tmp_path):
    """The comparison loads a checkout's package as workbench_baseline (imports rewritten) beside this one."""
    base = compare.load_baseline(str(ROOT / "src"))
    assert base.__name__ == "workbench_baseline" and base.mla is not mla
    assert base.mla.__name__ == "workbench_baseline.mla" and "workbench_baseline" in base.mla.launch.__name__
    with pytest.raises(FileNotFoundError, match="no workbench/__init__.py there"):
        compare.load_baseline(str(tmp_path))


def test_comparison_refuses_a_malformed_point_before_the_gpu(monkeypatch, capsys):
    """compare.py --points names the option and the point's form, before it loads the baseline or needs a GPU."""
    monkeypatch.setattr(compare, "run", lambda *a, **k: pytest.fail("ran with a malformed point"))
    monkeypatch.setattr(sys, "argv", ["compare.py", "--baseline", str(ROOT / "src"), "--points", "16x8:64:4k,16x8"])
    with pytest.raises(SystemExit) as exit_info:
        compare.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--points" in err and "'16x8' is not HEADSxQLEN:BATCH:CONTEXT" in err


def test_profile_tool_checks_its_arguments_before_the_gpu(monkeypatch, tmp_path):
    """The profiling helper refuses a malformed point, and a peer folder without FlashMLA, before it allocates."""
    monkeypatch.setattr(sys, "argv", ["profile_decode.py", "16x8:64"])
    with pytest.raises(ValueError, match="HEADSxQLEN:BATCH:CONTEXT"):
        profile_decode.main()
    monkeypatch.setattr(bench, "make_cache", lambda *a, **k: pytest.fail("allocated before the peer was found"))
    monkeypatch.setattr(bench, "Inputs", lambda *a, **k: None)
    monkeypatch.setattr(sys, "argv", ["profile_decode.py", "16x8:64:4k", "--peer-path", str(tmp_path)])
    with pytest.raises(FileNotFoundError, match="no flash_mla_dense.py there"):
        profile_decode.main()
