"""The aiter adapter against a recording fake ``aiter`` (nothing here needs ROCm).

The fake checks what the real functions would need (shapes, dtypes, the page_size-1 4-D view,
keyword-only arguments from ``sm_scale`` on) and computes the answer with the golden, so a wrong
index or a wrong argument order shows up as a wrong output or a failed check.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

import workbench  # noqa: F401
from workbench import device, mla
from workbench.expand import DecodeMetadata, build_flat_decode_metadata

D = mla.QK_HEAD_DIM


class FakeAiter(types.ModuleType):
    """Records every call; ``mla.mla_decode_fwd`` mimics aiter v0.1.11+ (page_size, nhead_kv before sm_scale)."""

    def __init__(self, with_return_lse: bool = True):
        super().__init__("aiter")
        self.calls: list[tuple[str, tuple, dict]] = []
        self.mla = types.ModuleType("aiter.mla")
        fake = self

        def get_mla_metadata_info_v1(batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse,
                                     fast_mode=True, num_kv_splits=32, intra_batch_mode=False):
            fake.calls.append(("get_mla_metadata_info_v1", (batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype),
                               dict(is_sparse=is_sparse, fast_mode=fast_mode)))
            assert max_seqlen_qo == 1, "vLLM sizes the persistent buffers for qlen 1 only"
            cu = 8
            return [((2,), torch.uint64), (cu + 1, torch.int32), ((64, 8), torch.int32), (batch_size + 1, torch.int32),
                    ((batch_size, 2), torch.int32), (64, torch.int32)]

        def get_mla_metadata_v1(qo_indptr, kv_indptr, kv_last_page_lens, num_heads_per_head_k, num_heads_k, is_causal,
                                work_metadata, work_info_set, work_indptr, reduce_indptr, reduce_final_map,
                                reduce_partial_map, page_size=1, kv_granularity=16, max_seqlen_qo=-1, uni_seqlen_qo=-1,
                                fast_mode=True, topk=-1, max_split_per_batch=-1, intra_batch_mode=False):
            fake.calls.append(("get_mla_metadata_v1", (qo_indptr, kv_indptr, kv_last_page_lens, num_heads_per_head_k,
                                                       num_heads_k, is_causal),
                               dict(work_info_set=work_info_set, work_indptr=work_indptr, page_size=page_size,
                                    kv_granularity=kv_granularity, max_seqlen_qo=max_seqlen_qo,
                                    uni_seqlen_qo=uni_seqlen_qo)))
            assert work_info_set.shape == (64, 8) and work_indptr.shape == (9,), "info_set and indptr swapped?"
            assert kv_last_page_lens.dtype == torch.int32 and bool((kv_last_page_lens == 1).all())

        def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                           page_size=1, nhead_kv=1, *, sm_scale=None, logit_cap=0.0, num_kv_splits=None,
                           work_meta_data=None, work_indptr=None, work_info_set=None, reduce_indptr=None,
                           reduce_final_map=None, reduce_partial_map=None, **rest):
            fake.calls.append(("mla_decode_fwd", (q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices,
                                                  kv_last_page_lens, max_seqlen_q),
                               dict(sm_scale=sm_scale, work_meta_data=work_meta_data, **rest)))
            assert q.is_contiguous() and q.dim() == 3 and q.shape[-1] == D
            assert kv_buffer.dim() == 4 and kv_buffer.shape[1:] == (1, 1, D), "aiter wants [pages, 1, 1, 576]"
            assert o.shape == (q.shape[0], q.shape[1], 512) and o.dtype == q.dtype
            for t in (qo_indptr, kv_indptr, kv_indices, kv_last_page_lens):
                assert t.dtype == torch.int32
            assert sm_scale is not None
            persistent = work_meta_data is not None
            assert persistent == (max_seqlen_q == 1)
            out, lse = mla.mla_decode_ref(q, kv_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale)
            o.copy_(out.to(o.dtype))
            return (None, lse) if rest.get("return_lse") else (None, None)

        if not with_return_lse:
            def mla_decode_fwd_old(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                                   page_size=1, nhead_kv=1, *, sm_scale=None, **kw):
                return mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                                      max_seqlen_q, page_size, nhead_kv, sm_scale=sm_scale, **kw)
            self.mla.mla_decode_fwd = mla_decode_fwd_old
        else:
            def mla_decode_fwd_new(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                                   page_size=1, nhead_kv=1, *, sm_scale=None, return_lse=False, **kw):
                return mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                                      max_seqlen_q, page_size, nhead_kv, sm_scale=sm_scale, return_lse=return_lse,
                                      **kw)
            self.mla.mla_decode_fwd = mla_decode_fwd_new
        self.get_mla_metadata_info_v1 = get_mla_metadata_info_v1
        self.get_mla_metadata_v1 = get_mla_metadata_v1

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def make(qlens, seq_lens, heads=16, dtype=torch.float16, K=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // K) for n in seq_lens]
    num_blocks = 1 + sum(pages)
    cache = torch.randn(num_blocks * K, D, generator=g).to(dtype)
    perm = (1 + torch.randperm(num_blocks - 1, generator=g)).tolist()
    bt = torch.zeros(len(seq_lens), max(pages), dtype=torch.int32)
    for r, p in enumerate(pages):
        bt[r, :p] = torch.tensor(perm[:p], dtype=torch.int32)
        perm = perm[p:]
    md = build_flat_decode_metadata(bt, torch.tensor(seq_lens, dtype=torch.int32), list(qlens), K)
    q = torch.randn(sum(qlens), heads, D, generator=g).to(dtype)
    return q, cache, md


@pytest.mark.parametrize("heads", [16, 128])
def test_decode_steps_use_persistent_metadata(heads):
    fake = FakeAiter()
    q, cache, md = make([1, 1, 1], [40, 7, 100], heads=heads)
    out, lse, persistent = mla.mla_decode_aiter(q, cache, md, 0.11, aiter_module=fake)
    assert persistent
    assert fake.names() == ["get_mla_metadata_info_v1", "get_mla_metadata_v1", "mla_decode_fwd"]
    info = fake.calls[0]
    assert info[1] == (3, 1, heads, q.dtype, q.dtype) and info[2] == dict(is_sparse=False, fast_mode=True)
    meta = fake.calls[1]
    assert meta[1][3:] == (heads, 1, True)
    assert meta[2]["page_size"] == 1 and meta[2]["max_seqlen_qo"] == 1 and meta[2]["uni_seqlen_qo"] == 1
    call = fake.calls[2]
    assert call[1][7] == 1 and call[2]["sm_scale"] == 0.11 and call[2]["work_meta_data"] is not None
    assert call[2]["return_lse"] is True
    gold, gold_lse = mla.mla_decode_ref(q, cache, md.qo_indptr, md.kv_indptr, md.kv_indices, 0.11)
    torch.testing.assert_close(out.float(), gold, atol=2e-3, rtol=0)
    torch.testing.assert_close(lse, gold_lse)


@pytest.mark.parametrize("qlen", [2, 4, 8])
def test_verify_steps_skip_persistent_metadata(qlen):
    fake = FakeAiter()
    q, cache, md = make([qlen, qlen], [30, 50])
    out, _, persistent = mla.mla_decode_aiter(q, cache, md, None, aiter_module=fake)
    assert not persistent
    assert fake.names() == ["mla_decode_fwd"]
    assert fake.calls[0][1][7] == qlen
    assert fake.calls[0][2]["sm_scale"] == pytest.approx(1 / 576**0.5)  # default passed by keyword
    gold, _ = mla.mla_decode_ref(q, cache, md.qo_indptr, md.kv_indptr, md.kv_indices)
    torch.testing.assert_close(out.float(), gold, atol=2e-3, rtol=0)


def test_non_power_of_two_qlen_warns_about_2720():
    fake = FakeAiter()
    q, cache, md = make([3, 3], [30, 50])
    with pytest.warns(RuntimeWarning, match="#2720"):
        mla.mla_decode_aiter(q, cache, md, 0.1, aiter_module=fake)


def test_older_aiter_without_return_lse_gives_no_lse():
    fake = FakeAiter(with_return_lse=False)
    q, cache, md = make([1], [20])
    out, lse, _ = mla.mla_decode_aiter(q, cache, md, 0.1, aiter_module=fake)
    assert lse is None and "return_lse" not in fake.calls[-1][2]


@pytest.mark.parametrize("case,match", [
    (dict(qlens=[1, 2], seq_lens=[10, 10]), "not uniform"),
    (dict(qlens=[1], seq_lens=[10], heads=3), "16 or 128"),
    (dict(qlens=[1], seq_lens=[10], dtype=torch.float32), "bfloat16 or float16"),
])
def test_adapter_refuses_what_aiter_cannot_take(case, match):
    fake = FakeAiter()
    q, cache, md = make(**case)
    with pytest.raises(ValueError, match=match):
        mla.mla_decode_aiter(q, cache, md, 0.1, aiter_module=fake)
    assert fake.calls == []


def test_mla_decode_routes_to_the_fake_when_aiter_is_available(monkeypatch):
    """backend='auto' on a (pretend) ROCm machine with aiter: picks aiter and says which path it took."""
    fake = FakeAiter()
    monkeypatch.setitem(sys.modules, "aiter", fake)
    monkeypatch.setitem(sys.modules, "aiter.mla", fake.mla)
    monkeypatch.setattr(device, "aiter_status",
                        lambda: device.Availability("aiter", True, "fake", "recording fake"))
    rocm = device.Platform("rocm", "AMD Instinct MI300X (pretend)", True, torch.__version__, None, "gfx942")
    monkeypatch.setattr(device, "platform", lambda: rocm)
    q, cache, md = make([1, 1], [33, 5])
    res = mla.mla_decode(q, cache, md, sm_scale=0.2)
    assert res.backend == "aiter" and "persistent" in res.reason
    assert fake.names()[-1] == "mla_decode_fwd"
    q, cache, md = make([1, 1], [33, 5], heads=3)  # aiter cannot take 3 heads: auto says why and falls back
    name, reason = mla.choose_backend(q, cache, md)
    assert name != "aiter" and "16 or 128" in reason


def test_metadata_type_is_checked():
    q, cache, md = make([1], [10])
    with pytest.raises(TypeError, match="DecodeMetadata"):
        mla.mla_decode(q, cache, vars(md), backend="torch")
    assert isinstance(md, DecodeMetadata)
