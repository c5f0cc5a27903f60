"""workbench.mla.tile_rates (the tensor-core rate of the decode tile's products) and the schedule floor built on it.

The argument checks, the FLOP count and the floor run anywhere; the compiled shapes (wgmma instruction, waits) are
read from a Hopper compile on any machine; the products themselves are checked against the reference on a Hopper
GPU."""

from __future__ import annotations

import pytest
import torch

from workbench import perfmodel
from workbench.mla import tile_rates as tr

RATES = [{"product": "qk", "width": 32, "tflops": 400.0}, {"product": "pv", "width": 32, "tflops": 650.0},
         {"product": "qk", "width": 64, "tflops": 600.0}, {"product": "pv", "width": 64, "tflops": 650.0}]


@pytest.mark.parametrize("kwargs,match", [
    (dict(product="sv", width=32, iters=1, programs=1), "product must be one of"),
    (dict(product="qk", width=48, iters=1, programs=1), "width must be one of"),
    (dict(product="pv", width=64, iters=0, programs=1), "iters must be a positive integer"),
    (dict(product="pv", width=64, iters=2, programs=True), "programs must be a positive integer"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tr.check_product_args(**kwargs)
    with pytest.raises(ValueError, match=match):
        tr.product_flops(**kwargs)


def test_product_flops_count_both_warpgroups_rows():
    assert tr.product_flops("qk", 32, 10, 132) == 2 * 128 * 32 * 576 * 10 * 132
    assert tr.product_flops("pv", 64, 3, 2) == 2 * 128 * 64 * 256 * 3 * 2


def test_run_product_rejects_bad_operands_before_any_launch():
    a, b = tr.product_inputs("qk", 32, "cpu")
    with pytest.raises(ValueError, match="must be on a CUDA device"):
        tr.run_product("qk", a, b, 1, 1)
    with pytest.raises(ValueError, match=r"a must be a contiguous \(128, 576\)"):
        tr.run_product("qk", a[:, :575], b, 1, 1)
    with pytest.raises(ValueError, match="not contiguous"):
        tr.run_product("qk", a.T.contiguous().T, b, 1, 1)
    p, v = tr.product_inputs("pv", 64, "cpu")
    with pytest.raises(ValueError, match="b must be bf16 or fp16 like a"):
        tr.run_product("pv", p, v.float(), 1, 1)
    with pytest.raises(ValueError, match="width must be one of"):
        tr.run_product("pv", p[:, :48].contiguous(), v[:48], 1, 1)


def test_reference_product_is_the_plain_matrix_product():
    a, b = tr.product_inputs("qk", 32, "cpu", dtype=torch.float32)
    assert torch.equal(tr.reference_product("qk", a, b), a @ b.T)
    p, v = tr.product_inputs("pv", 32, "cpu", dtype=torch.float32)
    assert torch.equal(tr.reference_product("pv", p, v), p @ v)
    with pytest.raises(ValueError, match="product must be one of"):
        tr.reference_product("kv", a, b)


def test_floor_counts_whole_row_blocks_at_each_products_rate():
    # 16 heads x qlen 3 = 48 rows: one block of 64 rows is computed
    f = perfmodel.tile_schedule_floor_us(RATES, heads=16, qlen=3, batch=64, context=4096, width=32)
    qk = 2 * 64 * 64 * 4096 * 576 / 400e12 * 1e6
    pv = 2 * 64 * 64 * 4096 * 512 / 650e12 * 1e6
    assert f["qk_us"] == pytest.approx(qk) and f["pv_us"] == pytest.approx(pv)
    assert f["floor_us"] == pytest.approx(qk + pv)
    f4 = perfmodel.tile_schedule_floor_us(RATES, heads=16, qlen=4, batch=64, context=4096, width=32)
    assert f4["floor_us"] == pytest.approx(f["floor_us"])
    wide = perfmodel.tile_schedule_floor_us(RATES, heads=128, qlen=1, batch=64, context=4096, width=64)
    assert wide["qk_us"] == pytest.approx(2 * qk * 400 / 600)  # two row blocks at the wider rate


def test_floor_rejects_a_width_without_a_rate_and_bad_points():
    with pytest.raises(ValueError, match=r"width=16: no measured qk rate \(widths with one: \[32, 64\]\)"):
        perfmodel.tile_schedule_floor_us(RATES, heads=16, qlen=8, batch=64, context=4096, width=16)
    with pytest.raises(ValueError, match="context must be a positive integer"):
        perfmodel.tile_schedule_floor_us(RATES, heads=16, qlen=8, batch=64, context=0, width=32)


def test_committed_rates_give_floors_when_present():
    m = perfmodel.load_measurement("tile_rates")
    if not m.available:
        pytest.skip(m.reason)
    rates = m.payload["rates"]
    assert {(r["product"], r["width"]) for r in rates} == {(p, w) for p in tr.PRODUCTS for w in tr.TILE_WIDTHS}
    assert all(r["relative_error"] < 1e-4 and r["tflops"] > 0 for r in rates)
    f32 = perfmodel.tile_schedule_floor_us(rates, heads=16, qlen=8, batch=64, context=4096, width=32)
    f64 = perfmodel.tile_schedule_floor_us(rates, heads=16, qlen=8, batch=64, context=4096, width=64)
    assert f32["pv_us"] > 0 and f64["floor_us"] > 0


SCRIPT = """
import json
from workbench import codegen
print(json.dumps({f"{p}{w}": codegen.tile_rate_kernel_report(p, w) for p in ("qk", "pv") for w in (32, 64)}))
"""


def test_compiled_kernels_keep_the_next_product_in_flight(run_compiled):
    pytest.importorskip("triton.backends.compiler")
    reports = run_compiled(SCRIPT)
    for w in (32, 64):
        qk, pv = reports[f"qk{w}"], reports[f"pv{w}"]
        assert qk["wgmma_shapes"] == [f"m64n{w}k16"]  # S's instruction shape is the tile's width
        assert qk["wgmma"] == 2 * 36  # two issue sites of 36 k-steps (576 / 16)
        assert qk["wgmma_waits"] == [3, 0]  # in the loop the next S's three groups stay in flight
        assert pv["wgmma_shapes"] == ["m64n256k16"] and pv["wgmma"] == w // 16
        assert pv["wgmma_waits"] == [1, 0]
        for r in (qk, pv):
            assert r["spill_bytes"] == 0 and r["shared"] <= 232_448
            assert r["wgmma_serialized"] is None, r  # the products overlap as issued (tests/test_codegen.py)


@pytest.mark.hopper
@pytest.mark.parametrize("product", tr.PRODUCTS)
@pytest.mark.parametrize("width", tr.TILE_WIDTHS)
@pytest.mark.parametrize("iters,programs", [(1, 1), (3, 5)])
def test_products_match_the_reference(product, width, iters, programs):
    a, b = tr.product_inputs(product, width, "cuda", seed=width + iters)
    out = tr.run_product(product, a, b, iters, programs)
    ref = tr.reference_product(product, a, b) * (iters if product == "pv" else 1)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-3 * ref.abs().max().item())
