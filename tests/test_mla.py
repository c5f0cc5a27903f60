"""workbench.mla: the golden against a plain loop, the Triton kernel against the golden, input checks.

Scenarios follow vLLM's attention tests: named batches with awkward sizes, permuted cache rows,
unused rows filled with NaN (a stray read turns the output into NaN), row 0 reserved.
"""

from __future__ import annotations

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
