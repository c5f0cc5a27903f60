"""workbench.perfmodel: byte and FLOP formulas of MLA decode, checked against hand counts."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from workbench import perfmodel


def test_bytes_and_flops_by_hand():
    # one request, 16 heads, 1 query token, 4 cached tokens, bf16
    assert perfmodel.mla_decode_bytes(16, 1, 4, 1) == 4 * 576 * 2 + 16 * (576 + 512) * 2
    assert perfmodel.mla_decode_flops(16, 1, 4, 1) == 2 * 16 * 4 * (576 + 512)
    assert perfmodel.mla_decode_flops(16, 3, 4, 2) == 3 * 2 * perfmodel.mla_decode_flops(16, 1, 4, 1)


@pytest.mark.parametrize("heads,qlen", [(16, 1), (16, 8), (128, 1), (128, 4)])
def test_intensity_is_about_1_89_h_qlen_at_long_context(heads, qlen):
    # ~1.89 * H * qlen FLOP/byte for bf16 KV (the q/out bytes vanish at long context)
    ai = perfmodel.mla_decode_intensity(heads, qlen, context=1 << 20)
    assert ai == pytest.approx(2 * (576 + 512) / (576 * 2) * heads * qlen, rel=1e-3)
    assert ai == pytest.approx(1.89 * heads * qlen, rel=0.01)


def test_ridges_and_roofline():
    h200 = perfmodel.HARDWARE["H200"]
    assert h200.ridge_flop_per_byte == pytest.approx(990 / 4.8)
    # 16 heads qlen 1 is memory-bound everywhere; 128 heads qlen 1 compute-bound on H200
    for hw in perfmodel.HARDWARE.values():
        assert perfmodel.mla_decode_intensity(16, 1) < hw.ridge_flop_per_byte
    assert perfmodel.mla_decode_intensity(128, 1) > h200.ridge_flop_per_byte
    t = perfmodel.roofline_time_s(h200, flops=990e12, nbytes=1.0)
    assert t == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_input_named(bad):
    with pytest.raises(ValueError, match="context must be positive"):
        perfmodel.mla_decode_bytes(16, 1, bad)


def test_package_reexports_every_public_name_and_imports_no_kernel_module():
    from workbench.perfmodel import acceptance, measured, published, roofline, spec, target

    for mod in (acceptance, measured, published, roofline, spec, target):
        public = [n for n, v in vars(mod).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)
                  and getattr(v, "__module__", mod.__name__) in (mod.__name__, "builtins")]
        for name in public:
            assert name in perfmodel.__all__ and getattr(perfmodel, name) is getattr(mod, name), (mod.__name__, name)
    assert perfmodel.DATA_DIR.name == "data" and perfmodel.DATA_DIR.parent.name == "workbench"
    # the model is pure Python and numpy: importing it must load neither Triton nor a kernel module
    code = ("import sys, workbench.perfmodel; print([m for m in sys.modules if m.startswith("
            "('triton', 'workbench.mla', 'workbench.qlen', 'workbench.expand'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ================================================================================================
# Chapter 6: acceptance, step model, calibration on the no-speculation column only, choice of k
# ================================================================================================

import dataclasses  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402

P = perfmodel
RATES = P.AITER_2720_RATES
# A device so fast that attention and draft rooflines are ~0: isolates the token law and acceptance.
INSTANT = P.Hardware("instant", "test", 1, 1e12, 1e15, "test only")


def _instant_deployment(**kw):
    return P.Deployment(INSTANT, P.KIMI_K25, tp=4, **kw)


def test_expected_tokens_from_rates_by_hand():
    assert P.expected_tokens_per_step(RATES) == pytest.approx(1 + 0.730 + 0.609 + 0.537 + 0.493 + 0.457 + 0.408 + 0.394)
    assert P.expected_tokens_per_step(RATES) == pytest.approx(4.628)  # 4.63 tokens per step at k = 7
    assert P.expected_tokens_per_step(RATES, 3) == pytest.approx(1 + 0.730 + 0.609 + 0.537)
    assert P.expected_tokens_per_step(RATES, 0) == 1.0
    assert P.expected_tokens_per_step([]) == 1.0


@pytest.mark.parametrize("rates,k,match", [
    (RATES, 8, "k=8 needs per-position rates"),
    (RATES, 15, r"k=15 needs per-position rates for positions 1..15, but only 7 were given"),  # chapter 6 cell
    ((0.5, 0.6), None, "non-increasing"),
    ((1.2,), None, r"rates\[0\]=1.2 is not a probability"),
    ((0.5, -0.1), None, r"rates\[1\]"),
])
def test_bad_rates_are_refused(rates, k, match):
    with pytest.raises(ValueError, match=match):
        P.expected_tokens_per_step(rates, k)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 0.835, 0.99, 1.0])
@pytest.mark.parametrize("k", [0, 1, 2, 3, 7, 15])
def test_iid_closed_form_matches_the_sum_of_iid_rates(alpha, k):
    assert P.expected_tokens_iid(alpha, k) == pytest.approx(P.expected_tokens_per_step(P.iid_rates(alpha, k)))
    assert P.expected_tokens_iid(alpha, k) == pytest.approx(sum(alpha ** i for i in range(k + 1)))


def test_iid_edges_and_errors():
    assert P.expected_tokens_iid(1.0, 7) == 8.0
    assert P.expected_tokens_iid(0.0, 7) == 1.0
    with pytest.raises(ValueError, match="alpha=1.5"):
        P.expected_tokens_iid(1.5, 3)
    with pytest.raises(ValueError, match="k=-1"):
        P.expected_tokens_iid(0.5, -1)


@pytest.mark.parametrize("alpha,k", [(0.7, 5), (0.2, 1), (0.95, 7)])
def test_fit_iid_alpha_round_trip(alpha, k):
    assert P.fit_iid_alpha(P.iid_rates(alpha, k)) == pytest.approx(alpha, abs=1e-9)
    a = P.fit_iid_alpha(RATES)
    assert P.expected_tokens_iid(a, 7) == pytest.approx(P.expected_tokens_per_step(RATES))


def test_power_of_two_qlen():
    assert [k for k in range(0, 17) if P.is_power_of_two_qlen(k)] == [0, 1, 3, 7, 15]


# ------------------------------------------------------------------------------------------------
# roofline per layer and the attention term
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("heads,batch,context,qlen", [(16, 1, 1, 1), (16, 3, 97_000, 8), (128, 64, 4096, 1), (1, 1, 2, 2)])
def test_roofline_point_agrees_with_the_byte_and_flop_formulas(heads, batch, context, qlen):
    hw = P.HARDWARE["MI355X"]
    p = P.mla_decode_roofline(hw, heads, batch, context, qlen, "bf16")
    assert p.bytes == P.mla_decode_bytes(heads, batch, context, qlen, 2.0)
    assert p.flops == P.mla_decode_flops(heads, batch, context, qlen)
    assert p.time_s == P.roofline_time_s(hw, p.flops, p.bytes)
    half = P.mla_decode_roofline("MI355X", heads, batch, context, qlen, "bf16", efficiency=0.5)
    assert half.time_s == pytest.approx(2 * p.time_s)
    fp8 = P.mla_decode_roofline(hw, heads, batch, context, qlen, "fp8")
    assert fp8.bytes - p.bytes == pytest.approx(-batch * context * 576)  # one byte less per cached value


def test_roofline_bounds_and_bad_input():
    assert P.mla_decode_roofline("H200", 16, 64, 8192, 1).bound == "memory"
    assert P.mla_decode_roofline("H200", 128, 64, 8192, 4).bound == "compute"
    with pytest.raises(ValueError, match="kv_dtype='int3'"):
        P.mla_decode_roofline("H200", 16, 1, 10, 1, "int3")
    with pytest.raises(ValueError, match="efficiency must be in"):
        P.mla_decode_roofline("H200", 16, 1, 10, 1, efficiency=0)


def test_attention_term_reads_the_replicated_latent_cache_on_every_rank():
    dep = P.KIMI_K25_MI355X_TP4
    per_layer = P.mla_decode_roofline(dep.hardware, 16, 8, 1536, 1, "bf16", dep.attn_efficiency).time_s
    assert dep.attention_ms(8, 1536, 1) == pytest.approx(61 * per_layer * 1e3)
    tp8 = dataclasses.replace(dep, tp=8)  # fewer heads per GPU, same KV bytes: memory-bound time nearly unchanged
    assert tp8.attention_ms(8, 8192, 1) == pytest.approx(dep.attention_ms(8, 8192, 1), rel=0.01)
    assert dep.attention_ms(0, 1536) == 0.0
    with pytest.raises(ValueError, match="tp=3 must divide"):
        P.Deployment(P.HARDWARE["MI355X"], P.KIMI_K25, tp=3)


# ------------------------------------------------------------------------------------------------
# token laws and their fit
# ------------------------------------------------------------------------------------------------


def test_coverage_law_by_hand():
    law = P.CoverageLaw(1.0, 10.0, 0.0, 384, 8)
    assert law.coverage(0) == 0.0
    assert law.coverage(1) == pytest.approx(8 / 384)
    assert law.coverage(2) == pytest.approx(1 - (376 / 384) ** 2)
    assert law.coverage(10_000) == pytest.approx(1.0)
    assert law.ms(1) == pytest.approx(1.0 + 10.0 * 8 / 384)


def _synthetic_no_spec(law, dep, concurrency, context):
    """tok/s/GPU that a given law (plus the deployment's attention) would produce."""
    model = P.TargetStepModel(law, dep, context)
    return [c / (dep.tp * model.step_ms(c, context) * 1e-3) for c in concurrency]


@pytest.mark.parametrize("law", [P.PowerLaw(4.0, 2.5, 0.6), P.PowerLaw(7.0, 0.5, 1.0), P.PowerLaw(3.0, 1.0, 0.25)])
def test_power_law_fit_recovers_known_parameters(law):
    dep, conc, ctx = P.KIMI_K25_MI355X_TP4, (1, 3, 8, 17, 64, 100), 1536
    fit = P.fit_target_step(conc, _synthetic_no_spec(law, dep, conc, ctx), deployment=dep, context=ctx)
    assert fit.law.gamma == pytest.approx(law.gamma, abs=1e-9)
    assert fit.law.fixed_ms == pytest.approx(law.fixed_ms, rel=1e-6)
    assert fit.law.token_ms == pytest.approx(law.token_ms, rel=1e-6)
    assert max(abs(r) for r in fit.fit_residuals) < 1e-9


def test_coverage_law_fit_recovers_known_parameters():
    dep, conc, ctx = P.KIMI_K25_MI355X_TP4, (2, 4, 8, 16, 32, 64), 1536
    law = P.CoverageLaw(9.0, 25.0, 0.01, 384, 8)
    fit = P.fit_target_step(conc, _synthetic_no_spec(law, dep, conc, ctx), deployment=dep, context=ctx, law="coverage")
    assert fit.law.params() == pytest.approx(law.params(), rel=1e-6)


def test_fit_refuses_bad_input():
    with pytest.raises(ValueError, match="same length"):
        P.fit_target_step((4, 8, 16), (1.0, 2.0), context=1536)
    with pytest.raises(ValueError, match="at least 3 points"):
        P.fit_target_step((4, 8), (1.0, 2.0), context=1536)
    with pytest.raises(ValueError, match="law='linear'"):
        P.fit_target_step((4, 8, 16), (80.0, 140.0, 220.0), context=1536, law="linear")
    with pytest.raises(ValueError, match="tok_s_per_gpu must be positive"):
        P.fit_target_step((4, 8, 16), (80.0, 0.0, 220.0), context=1536)


# ------------------------------------------------------------------------------------------------
# calibration uses the no-speculation column and nothing else
# ------------------------------------------------------------------------------------------------


def test_fit_function_has_no_way_to_see_speculative_numbers():
    params = set(inspect.signature(P.fit_target_step).parameters)
    assert params == {"concurrency", "no_spec_tok_s_per_gpu", "deployment", "context", "law"}


@pytest.mark.parametrize("law", ["power", "coverage"])
def test_calibration_receives_exactly_the_no_spec_column(monkeypatch, law):
    seen = []
    real = P.fit_target_step

    def spy(concurrency, no_spec_tok_s_per_gpu, **kw):
        seen.append((tuple(concurrency), tuple(no_spec_tok_s_per_gpu)))
        return real(concurrency, no_spec_tok_s_per_gpu, **kw)

    # patch the name where predict_published looks it up (its own submodule), not the package's re-export
    monkeypatch.setattr(sys.modules[P.predict_published.__module__], "fit_target_step", spy)
    P.predict_published(law=law)
    table = P.BLOG_MI355X_KIMI
    assert seen == [(table.concurrency, table.no_spec)]


@pytest.mark.parametrize("law", ["power", "coverage"])
@pytest.mark.parametrize("factor", [0.5, 1.7])
def test_perturbing_eagle3_columns_leaves_the_fit_and_predictions_unchanged(law, factor):
    base = P.predict_published(law=law)
    table = P.BLOG_MI355X_KIMI
    # scale one column, scramble the other: neither may move a fitted parameter
    bent = table.replace_eagle3({"BF16 draft": [v * factor for v in table.eagle3["BF16 draft"]],
                                 "FP8 draft": list(reversed(table.eagle3["FP8 draft"]))})
    other = P.predict_published(bent, law=law)
    assert other.target.law == base.target.law
    assert [r.predicted for r in other.rows] == [r.predicted for r in base.rows]
    assert [r.error for r in other.predicted_rows] != [r.error for r in base.predicted_rows]
    # while a change to the no-speculation column does move the fit
    moved = dataclasses.replace(table, no_spec=tuple(v * 1.1 for v in table.no_spec))
    assert P.predict_published(moved, law=law).target.law != base.target.law


def test_prediction_table_has_ten_predicted_figures():
    pr = P.predict_published()
    table = P.BLOG_MI355X_KIMI
    assert len(pr.predicted_rows) == 10
    assert [(r.column, r.concurrency) for r in pr.predicted_rows] == \
        [(name, c) for name in table.eagle3 for c in table.concurrency]
    for r in pr.predicted_rows:
        assert r.published == table.eagle3[r.column][table.concurrency.index(r.concurrency)]
        assert r.error == pytest.approx(r.predicted / r.published - 1)
        step = pr.steps[(r.column, r.concurrency)]
        assert step.k == 7 and step.tokens_per_step == pytest.approx(4.628)
    assert pr.max_abs_error == max(abs(r.error) for r in pr.predicted_rows)
    # the fit itself must represent the no-speculation column (5 points, 3 parameters)
    assert all(abs(r.error) < 0.05 for r in pr.rows if r.fitted)
    text = pr.format()
    assert text.count("fitted") == 5 and len(text.splitlines()) == 16
    json.dumps(pr.records())  # plain data


def test_drafts_are_not_fitted_to_eagle3_columns():
    pr = P.predict_published()
    fixed = P.draft_fixed_ms_from_target(pr.target)
    assert fixed == pytest.approx(pr.target.law.fixed_ms / 61)
    assert pr.drafts["BF16 draft"] == P.eagle3_draft("bf16", fixed_ms=fixed)
    assert pr.drafts["FP8 draft"] == P.eagle3_draft("fp8", fixed_ms=fixed)


def test_prediction_refuses_a_mismatched_deployment_or_unknown_column():
    with pytest.raises(ValueError, match="does not match the table"):
        P.predict_published(deployment=P.Deployment(P.HARDWARE["MI300X"], P.KIMI_K25, tp=4))
    odd = P.BLOG_MI355X_KIMI.replace_eagle3({"INT4 draft": (1.0,) * 5})
    with pytest.raises(ValueError, match="no default draft for column 'INT4 draft'"):
        P.predict_published(odd)
    with pytest.raises(ValueError, match="has 2 values for 5"):
        P.BLOG_MI355X_KIMI.replace_eagle3({"x": (1.0, 2.0)})
    assert P.BLOG_MI355X_KIMI.mean_context == 1536


# ------------------------------------------------------------------------------------------------
# the draft, one speculative step, the choice of k
# ------------------------------------------------------------------------------------------------


def test_eagle3_draft_bytes():
    bf16, fp8 = P.eagle3_draft("bf16", 0.1), P.eagle3_draft("fp8", 0.1)
    layer = 117.4e6 + 29.4e6 + 58.7e6 + 396.4e6
    assert bf16.weight_bytes - fp8.weight_bytes == pytest.approx(layer)  # one byte per layer parameter saved
    assert bf16.weight_bytes == pytest.approx(2 * (layer + 154.1e6 + 1174.4e6))
    with pytest.raises(ValueError, match="dtype='int4'"):
        P.eagle3_draft("int4")


def test_draft_time_follows_vllms_proposer_shape():
    dep, d = P.KIMI_K25_MI355X_TP4, P.eagle3_draft("bf16", 0.25)
    for k in (1, 3, 7):
        expect = d.forward_ms(dep, 16 * (k + 1), 16, 1536) + (k - 1) * d.forward_ms(dep, 16, 16, 1536)
        assert d.draft_ms(dep, k, 16, 1536) == pytest.approx(expect)
    assert d.draft_ms(dep, 0, 16, 1536) == 0.0
    # weight-bound at these sizes: fixed + bytes / bandwidth
    assert d.forward_ms(dep, 4, 4, 1) == pytest.approx(0.25 + (d.weight_bytes + 4 * d.kv_bytes_per_token) / 4 / 8e12 * 1e3)


def test_spec_step_and_throughput_by_hand():
    dep = _instant_deployment()
    target = P.TargetStepModel(P.PowerLaw(10.0, 1.0, 1.0), dep, 1536)
    draft = P.DraftModel("d", 0.0, 0.0, 0.0, fixed_ms=0.5)
    s = P.spec_step(target, draft, 8, 1536, 3, rates=RATES, overhead_ms=0.2)
    assert s.verify_ms == pytest.approx(10.0 + 8 * 4, rel=1e-6)
    assert s.draft_ms == pytest.approx(3 * 0.5)
    assert s.step_ms == pytest.approx(10 + 32 + 1.5 + 0.2, rel=1e-6)
    assert s.tok_s_per_gpu == pytest.approx(8 * (1 + 0.730 + 0.609 + 0.537) / (s.step_ms / 1e3) / 4)
    plain = P.spec_step(target, None, 8, 1536, 0)
    assert plain.step_ms == pytest.approx(18.0, rel=1e-6) and plain.tokens_per_step == 1.0
    with pytest.raises(ValueError, match="needs a draft model"):
        P.spec_step(target, None, 8, 1536, 3, rates=RATES)
    with pytest.raises(ValueError, match="exactly one of rates"):
        P.spec_step(target, draft, 8, 1536, 3)
    with pytest.raises(ValueError, match="concurrency must be positive"):
        P.throughput_per_gpu(0, 1.0, 1.0, 4)


def test_best_k_and_the_cost_of_the_power_of_two_restriction_by_hand():
    # verify cost independent of k, free draft: throughput is proportional to expected tokens per step
    dep = _instant_deployment()
    flat = P.TargetStepModel(P.PowerLaw(20.0, 0.0, 1.0), dep, 1536)
    free_draft = P.DraftModel("free", 0.0, 0.0, 0.0, 0.0)
    r = P.power_of_two_cost(flat, free_draft, 16, 1536, alpha=0.8, k_max=10)
    assert r.free.k == 10 and r.restricted.k == 7
    assert [s.k for s in r.restricted.scan] == [1, 3, 7]
    assert r.cost == pytest.approx(1 - P.expected_tokens_iid(0.8, 7) / P.expected_tokens_iid(0.8, 10), rel=1e-6)
    assert r.free.speedup == pytest.approx(P.expected_tokens_iid(0.8, 10), rel=1e-6)
    # with per-position rates k_max defaults to len(rates); k = 7 is allowed, so the restriction is free
    r = P.power_of_two_cost(flat, free_draft, 16, 1536, rates=RATES)
    assert r.free.k == 7 and r.restricted.k == 7 and r.cost == 0.0
    # a verify cost growing linearly with tokens and a costly draft make k = 1 best
    steep = P.TargetStepModel(P.PowerLaw(1.0, 5.0, 1.0), dep, 1536)
    assert P.best_k(steep, P.DraftModel("slow", 0, 0, 0, 5.0), 16, 1536, rates=RATES).k == 1
    with pytest.raises(ValueError, match="k_max=0"):
        P.best_k(flat, free_draft, 16, 1536, alpha=0.5, k_max=0)


# ------------------------------------------------------------------------------------------------
# long context, and the expansion beside decode
# ------------------------------------------------------------------------------------------------


def test_verify_trend_is_driven_by_the_kv_read():
    target = P.predict_published().target
    long = P.verify_cost_trend(target, input_len=8192)
    short = P.verify_cost_trend(target, input_len=1024)
    att = [r["attention_ms"] for r in long]
    # memory-bound attention: linear in concurrency (16 heads x qlen 8 sits under the MI355X ridge)
    assert att[-1] / att[0] == pytest.approx(64 / 4, rel=1e-3)
    per_token = [r["verify_ms_per_accepted_token"] for r in long]
    assert per_token == sorted(per_token) and per_token[-1] > per_token[0]
    for lo, hi in zip(short, long):
        assert hi["attention_share"] > lo["attention_share"]
        ratio = P.mla_decode_bytes(16, 1, 8704, 8) / P.mla_decode_bytes(16, 1, 1536, 8)  # KV + q/out bytes
        assert hi["attention_ms"] / lo["attention_ms"] == pytest.approx(ratio, rel=1e-6)


def test_missing_measurement_is_reported_not_invented(tmp_path):
    m = P.load_measurement("expand", data_dir=tmp_path)
    assert not m.available and m.payload is None
    assert "bench_expand_h200.json is not committed" in m.reason and "workbench bench expand" in m.reason
    (tmp_path / "bench_decode_h200.json").write_text(json.dumps({"benchmark": "mla_decode"}))
    with pytest.raises(ValueError, match=r"no key\(s\) \['results'\]"):
        P.load_measurement("decode", data_dir=tmp_path)
    (tmp_path / "bench_decode_h200.json").write_text(json.dumps({"results": [], "provenance": {"device": "X"}}))
    assert P.load_measurement("decode", data_dir=tmp_path).available
    with pytest.raises(ValueError, match="name='copy'"):
        P.load_measurement("copy")


def test_expansion_cost_per_step_by_hand():
    expand = {"cases": [{"num_reqs": 1, "seq_len": 97_000, "kernel_us": 2.0, "serial_us": 25.0},
                        {"num_reqs": 256, "seq_len": 4096, "kernel_us": 3.0, "serial_us": 3.5,
                         "kernel_after_fill_us": 3.25}]}
    decode = {"results": [
        {"heads": 16, "qlen": 1, "batch": 1, "context": 32768, "kv_gb_s": 1000.0},
        {"heads": 16, "qlen": 1, "batch": 128, "context": 4096, "kv_gb_s": 3000.0},
        {"heads": 16, "qlen": 8, "batch": 1, "context": 32768, "kv_gb_s": 9999.0},  # qlen 8: not used
        {"heads": 128, "qlen": 1, "batch": 1, "context": 97000, "kv_gb_s": 9999.0},  # 128 heads: not used
    ]}
    rows = P.expansion_cost_per_step(expand, decode, layers=61, calls_per_step=7)
    one, many = rows
    assert one["serial_us_per_step"] == 7 * 25.0 and one["kernel_us_per_step"] == 7 * 2.0
    assert one["decode_ref"]["batch"] == 1 and many["decode_ref"]["batch"] == 128
    # in a step the expansion follows a kernel that does not trigger PDL early: its after-fill_ time is used
    assert many["kernel_us_per_call"] == 3.25 and many["kernel_us_per_step"] == 7 * 3.25
    decode_us = 61 * 97_000 * 576 * 2 / 1000e9 * 1e6
    assert one["decode_us_per_step"] == pytest.approx(decode_us)
    assert one["serial_vs_decode"] == pytest.approx(7 * 25.0 / decode_us)
    with pytest.raises(ValueError, match="'cases'"):
        P.expansion_cost_per_step({}, decode)


def test_published_serial_expansion_beside_modelled_attention():
    out = P.serial_expansion_published()
    assert out["expand_ms_per_step"] == pytest.approx(61.6 * 7 / 1000)
    dep = P.KIMI_K25_MI355X_TP4
    attn = 61 * P.mla_decode_roofline("MI355X", 16, 1, 97_000, 1, "bf16", 0.8).time_s * 1e3
    assert out["attention_ms_per_step"] == pytest.approx(attn)
    assert out["expand_vs_attention"] == pytest.approx(out["expand_ms_per_step"] / attn)
    full = P.serial_expansion_published(P.predict_published().target)
    assert 0 < full["expand_vs_verify"] < full["expand_vs_attention"]
    assert dep.hardware.name == "MI355X"


def test_gap_diagnostics_reconcile_each_published_figure():
    pr = P.predict_published()
    gaps = pr.gaps()
    assert len(gaps) == 10
    for g, r in zip(gaps, pr.predicted_rows):
        s = pr.steps[(r.column, r.concurrency)]
        # the published figure, recomputed two ways: the implied step at the model's tokens per step,
        # and the model's step at the implied tokens per step
        assert P.throughput_per_gpu(r.concurrency, s.tokens_per_step, g["published_step_ms"], 4) == pytest.approx(r.published)
        assert P.throughput_per_gpu(r.concurrency, g["implied_tokens_per_step"], s.step_ms, 4) == pytest.approx(r.published)
        assert g["missing_ms"] == pytest.approx(g["published_step_ms"] - s.step_ms)
        assert g["missing_ms_per_draft"] == pytest.approx(g["missing_ms"] / 7)


# ------------------------------------------------------------------------------------------------
# chapter 6 figures (workbench.viz.throughput)
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prediction():
    return P.predict_published()


def test_comparison_figure_shows_every_figure_and_its_error(prediction):
    from workbench import viz

    fig = viz.comparison_figure(prediction)
    bars = [t for t in fig.data if t.type == "bar"]
    assert [t.name for t in bars] == ["no spec", "BF16 draft", "FP8 draft"]
    for bar in bars:
        rows = [r for r in prediction.rows if r.column == bar.name]
        assert list(bar.y) == pytest.approx([100 * r.error for r in rows])
    published = {t.name: list(t.y) for t in fig.data if t.type == "scatter" and t.mode == "markers"}
    assert published["BF16 draft: published"] == list(P.BLOG_MI355X_KIMI.eagle3["BF16 draft"])
    assert fig.layout.shapes[0].y0 == -10 and fig.layout.shapes[0].y1 == 10  # the +/-10 % band
    bundle = fig._repr_mimebundle_()
    assert "Plotly.newPlot" in bundle["text/html"] and "<script src" not in bundle["text/html"]


def test_step_breakdown_adds_up(prediction):
    from workbench import viz

    fig = viz.step_breakdown_figure(prediction)
    right = [t for t in fig.data if t.type == "bar" and t.xaxis == "x2"]
    totals = [sum(vals) for vals in zip(*(t.y for t in right))]
    expect = [prediction.steps[("BF16 draft", c)].step_ms for c in P.BLOG_MI355X_KIMI.concurrency]
    assert totals == pytest.approx(expect)
    with pytest.raises(ValueError, match="column='INT4'"):
        viz.step_breakdown_figure(prediction, "INT4")


@pytest.mark.parametrize("vary", ["acceptance", "draft_cost", "concurrency", "k"])
def test_spec_explorer_slider_steps_hold_the_model(prediction, vary):
    from workbench import viz
    from workbench.viz import throughput as T

    fig = viz.spec_explorer(vary, prediction)
    slider = fig.layout.sliders[0]
    n_values = {"acceptance": T.ALPHAS, "draft_cost": T.DRAFT_FIXED_MS, "concurrency": T.CONCURRENCIES,
                "k": T.K_RANGE}[vary]
    assert len(slider.steps) == len(n_values)
    # the displayed traces are the active step's arrays
    active = slider.steps[slider.active].args[0]["y"]
    assert [list(t.y) for t in fig.data] == [list(y) for y in active]
    # spot-check the last step's first line against the model directly
    target, ctx = prediction.target, 1536
    fixed = P.draft_fixed_ms_from_target(target)
    v, y0 = n_values[-1], slider.steps[-1].args[0]["y"][0]
    base = lambda c: P.spec_step(target, None, c, ctx, 0).tok_s_per_gpu  # noqa: E731
    if vary == "acceptance":
        expect = P.spec_step(target, P.eagle3_draft("bf16", fixed), 4, ctx, 2, alpha=v).tok_s_per_gpu / base(4)
        assert y0[1] == pytest.approx(expect)
    elif vary == "draft_cost":
        a = P.fit_iid_alpha(RATES)
        expect = P.spec_step(target, P.eagle3_draft("bf16", v), 4, ctx, 2, alpha=a).tok_s_per_gpu / base(4)
        assert y0[1] == pytest.approx(expect)
    elif vary == "concurrency":
        expect = P.spec_step(target, P.eagle3_draft("bf16", fixed), v, ctx, 2, alpha=0.6).tok_s_per_gpu / base(v)
        assert y0[1] == pytest.approx(expect)
    else:
        expect = P.spec_step(target, P.eagle3_draft("bf16", fixed), 2, ctx, v, alpha=0.6).tok_s_per_gpu / base(2)
        assert y0[1] == pytest.approx(expect)


def test_spec_explorer_refuses_unknown_slider(prediction):
    from workbench import viz

    with pytest.raises(ValueError, match="vary='alpha'"):
        viz.spec_explorer("alpha", prediction)


def test_power_of_two_cost_heatmap_cells(prediction):
    from workbench import viz

    fig = viz.power_of_two_cost_figure(prediction, 16, alphas=(0.6, 0.8), draft_fixed_ms=(0.0, 1.0))
    hm = fig.data[0]
    r = P.power_of_two_cost(prediction.target, P.eagle3_draft("bf16", 1.0), 16, 1536, alpha=0.6, k_max=15)
    assert hm.z[1][0] == pytest.approx(100 * r.cost)
    assert hm.text[1][0] == f"{r.free.k}/{r.restricted.k}"
    assert all(0 <= z < 100 for row in hm.z for z in row)


def test_k_choice_and_trend_and_expansion_figures(prediction):
    from workbench import viz

    fig = viz.k_choice_figure(prediction.target, prediction.drafts["BF16 draft"], (4, 64))
    lines = [t for t in fig.data if t.type == "scatter" and t.mode == "lines+markers"]
    assert [list(t.x) for t in lines] == [list(range(1, 8))] * 2
    assert list(lines[0].marker.symbol) == ["circle", "circle-open", "circle", "circle-open", "circle-open",
                                            "circle-open", "circle"]
    trend = viz.verify_trend_figure(prediction.target)
    growth = [t for t in trend.data if t.name == "8K: attention part (model)"][0]
    assert growth.y[0] == 1.0 and growth.y[-1] == pytest.approx(16, rel=1e-3)
    blog = [t for t in trend.data if t.name.startswith("blog")][0]
    assert list(blog.y) == pytest.approx([1.0, 2.56 / 0.30])
    published = P.serial_expansion_published(prediction.target)
    one = viz.expansion_per_step_figure(None, published)
    assert len(one.data) == 1 and list(one.data[0].y)[0] == pytest.approx(431.2)
    rows = [dict(num_reqs=1, seq_len=97_000, serial_us_per_step=175.0, kernel_us_per_step=14.0,
                 decode_us_per_step=6000.0)]
    two = viz.expansion_per_step_figure(rows, published)
    assert len(two.data) == 4 and two.data[1].y[0] == 175.0
    rows += [dict(rows[0], num_reqs=16_384, seq_len=32), dict(rows[0], num_reqs=1024, seq_len=1000)]
    assert list(viz.expansion_per_step_figure(rows, published).data[1].x) == ["1 x 97k", "16384 x 32", "1024 x 1000"]


def test_throughput_widget_reports_the_step(prediction):
    from workbench import viz
    from workbench.viz.throughput import throughput_report

    text = throughput_report(prediction.target, k=7, draft_fixed_ms=0.2, concurrency=16)
    s = P.spec_step(prediction.target, P.eagle3_draft("bf16", 0.2), 16, 1536, 7, rates=RATES)
    assert f"{s.tok_s_per_gpu:.1f} tok/s/GPU" in text and "k=7, verify qlen 8 (power of two)" in text
    assert "k capped at 7" in throughput_report(prediction.target, k=12)
    assert "NOT a power of two" in throughput_report(prediction.target, use_rates=False, alpha=0.7, k=5)
    box = viz.throughput_widget(prediction)
    assert len(box.children) == 5


# ---- issue #32: clear errors for bad input -------------------------------------------------------


@pytest.mark.parametrize("name", ["B200", "", "H100 "])
def test_unknown_hardware_names_the_argument_and_the_choices(name):
    # mla_decode_roofline raised a bare KeyError for a name HARDWARE does not hold.
    with pytest.raises(ValueError, match=rf"hw is '{name}'; choose one of \['H200', 'MI300X', 'MI355X'\] or pass "
                                         "a Hardware"):
        P.mla_decode_roofline(name, 16, 8, 4096)
    with pytest.raises(ValueError, match=rf"hardware is '{name}'; choose one of"):  # the message it always had
        P.padding_cost_rows([5], hardware=name)
    with pytest.raises(ValueError, match="hw is None"):
        P.mla_decode_roofline(None, 16, 8, 4096)


def test_hardware_names_in_any_case_and_custom_hardware():
    assert P.mla_decode_roofline("h200", 16, 8, 4096) == P.mla_decode_roofline("H200", 16, 8, 4096)
    assert P.lookup_hardware("mi355x") is P.HARDWARE["MI355X"]
    # a point on a Hardware outside HARDWARE knows its ridge (its bound raised KeyError before)
    slow = P.Hardware("slow", "", 1, 1000.0, 1.0, "a test device: fast memory, slow arithmetic")
    point = P.mla_decode_roofline(slow, 16, 8, 4096)
    assert point.hardware == "slow" and point.bound == "compute" and point.ridge_flop_per_byte == 1e-3
    assert P.mla_decode_roofline("H200", 16, 8, 4096).bound == "memory"


@pytest.mark.parametrize("k", [-1, -5, 1.0, True, "3"])
def test_is_power_of_two_qlen_names_k(k):
    # It raised "n is 0; it must be an int >= 1" (the helper's argument) for k = -1.
    with pytest.raises(ValueError, match=rf"^k is {k!r}; it must be an int >= 0$"):
        P.is_power_of_two_qlen(k)


@pytest.mark.parametrize("text, match", [
    ("{not json", r"bench_decode_h200\.json cannot be read as JSON \(JSONDecodeError: "),
    ("", r"bench_decode_h200\.json cannot be read as JSON"),
    ("[1, 2]", r"bench_decode_h200\.json holds a JSON list, not an object"),
    ('{"results": [], "provenance": "H200"}', None),  # provenance not an object: read, device unknown
])
def test_load_measurement_names_a_broken_file(tmp_path, text, match):
    path = tmp_path / "bench_decode_h200.json"
    path.write_text(text)
    if match is None:
        m = P.load_measurement("decode", data_dir=tmp_path)
        assert m.available and "measured on ?" in m.reason
        return
    with pytest.raises(ValueError, match=match) as exc:
        P.load_measurement("decode", data_dir=tmp_path)
    assert str(path) in str(exc.value) and "workbench bench decode" in str(exc.value)
    with pytest.raises(ValueError, match=match):
        P.measured_padding_overhead(path)


def test_load_measurement_names_an_unreadable_file(tmp_path):
    path = tmp_path / "bench_expand_h200.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match=r"bench_expand_h200\.json cannot be read as JSON \(UnicodeDecodeError"):
        P.load_measurement("expand", data_dir=tmp_path)
    path.unlink()
    path.mkdir()  # a folder where the file should be
    with pytest.raises(ValueError, match=r"bench_expand_h200\.json cannot be read as JSON \((IsADirectoryError|"
                                         r"PermissionError)"):
        P.load_measurement("expand", data_dir=tmp_path)
