"""Fixtures of the decode tests (imported by test_mla.py, test_mla_gpu.py and test_other_gpus.py; pytest puts
tests/ on sys.path): a flat page_size-1 cache with permuted rows and NaN in every row nobody owns, the plainest
possible spec, and the tolerance rule."""

from __future__ import annotations

import torch

import workbench  # noqa: F401  (sets TRITON_INTERPRET on CPU before kernels import)
from workbench import mla
from workbench.decode_metadata import DecodeMetadata

D, DV = mla.QK_HEAD_DIM, mla.KV_LORA_RANK


def offsets(lens):
    """The aiter-style offsets of a list of lengths: ``[0, l0, l0 + l1, ...]`` as int32."""
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)


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
    return dict(
        q=q.to(dtype).to(device), kv_cache=cache.to(dtype).to(device),
        qo_indptr=offsets(qo_lens).to(device), kv_indptr=offsets(kv_lens).to(device),
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


def metadata_of(case, max_qo_len=None):
    qo = case["qo_indptr"]
    lens = (qo[1:] - qo[:-1]).tolist()
    return DecodeMetadata(qo_indptr=qo, kv_indptr=case["kv_indptr"], kv_indices=case["kv_indices"],
                          kv_last_page_lens=torch.ones(len(lens), dtype=torch.int32, device=qo.device),
                          max_qo_len=max(lens) if max_qo_len is None else max_qo_len)


def check_against_golden(case, out, lse, dtype, scale, label=""):
    """flash-attention's rule (:func:`workbench.mla.check_against_golden`): kernel error <= 2 x (same-precision torch
    error) + floor, both against the fp32 golden on the same (rounded) inputs; LSE by absolute and cosine
    difference; no NaN."""
    check = mla.check_against_golden(**case, out=out, lse=lse, dtype=dtype, sm_scale=scale)
    print(f"{label}: {check}")
    assert check.ok, f"{label}: {check}"


def assert_triton_exact(case, max_qo_len, num_splits, cfg):
    """``mla_decode_triton`` on an fp32 case (scale 0.1) equals the golden to fp32 rounding; returns its output."""
    out, lse = mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                     case["kv_indices"], max_qo_len, 0.1, num_splits=num_splits, config=cfg)
    gold_out, gold_lse = mla.mla_decode_ref(**case, sm_scale=0.1)
    torch.testing.assert_close(out, gold_out, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse, gold_lse, atol=2e-5, rtol=1e-5)
    return out, lse


def assert_graph_replays_equal(call, eager_out):
    """``call(out)`` captured in a CUDA graph (after one eager warm-up call, which compiles): three replays, each
    into a NaN-filled ``out``, must give ``eager_out`` bit for bit."""
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


def ragged_gpu_case(qo_lens, heads, dtype, seed):
    """The GPU tests' ragged batch: three requests of query lengths ``qo_lens`` and 4099, 1 and 100 keys (at least
    their query length), NaN in unused cache rows; returns the case and ``mla_decode_triton``'s positional
    arguments (scale 0.07)."""
    kv_lens = [max(n, q) for n, q in zip([4099, 1, 100], qo_lens)]
    case = make_case(qo_lens, kv_lens, heads, dtype=dtype, device="cuda", seed=seed)
    return case, (case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"],
                  max(qo_lens), 0.07)
