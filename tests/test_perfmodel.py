"""workbench.perfmodel: byte and FLOP formulas of MLA decode, checked against hand counts."""

from __future__ import annotations

import pytest

from workbench import perfmodel


def test_bytes_and_flops_by_hand():
    # one request, 16 heads, 1 query token, 4 cached tokens, bf16
    assert perfmodel.mla_decode_bytes(16, 1, 4, 1) == 4 * 576 * 2 + 16 * (576 + 512) * 2
    assert perfmodel.mla_decode_flops(16, 1, 4, 1) == 2 * 16 * 4 * (576 + 512)
    assert perfmodel.mla_decode_flops(16, 3, 4, 2) == 3 * 2 * perfmodel.mla_decode_flops(16, 1, 4, 1)


@pytest.mark.parametrize("heads,qlen", [(16, 1), (16, 8), (128, 1), (128, 4)])
def test_intensity_is_about_1_89_h_qlen_at_long_context(heads, qlen):
    # CONTEXT.md section 4: ~1.89 * H * qlen FLOP/byte for bf16 KV (the q/out bytes vanish at long context)
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
