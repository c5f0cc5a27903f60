"""Property tests of the decode's entry points: random batches (empty ones, requests without queries or keys,
ragged query lengths) in random layouts (caches with padded rows, offsets, the 4-D view; index tensors that are
slices of larger ones, strided views; ``out=`` of every shape) and dtypes, against the golden. Every case either
matches the golden within the tolerance rule or is refused with an error naming the argument, before any kernel
runs; nothing crashes and nothing is silently wrong.

``WB_FUZZ_EXAMPLES`` sets the cases per entry point (default 300; the GPU run uses 1000). Each test counts its
cases and outcomes and prints them, so a run's log says how many ran.
"""

from __future__ import annotations


import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import workbench
from fuzz_support import FUZZ, Tally
from mla_cases import D, DV, check_against_golden
from workbench import mla
from workbench.decode_metadata import DecodeMetadata

ON_GPU = workbench.device.on_gpu()
DEV = torch.device("cuda" if ON_GPU else "cpu")
DTYPES = [torch.float16, torch.bfloat16] if ON_GPU else [torch.float16, torch.float32]
HEADS = [1, 3, 16, 128] if ON_GPU else [1, 2, 3, 16]
MAX_KV = 3000 if ON_GPU else 70


@st.composite
def batches(draw):
    """A random batch: per request a query length 0-5 and a KV length >= it (0 allowed without queries)."""
    n = draw(st.integers(0, 5))
    qo = [draw(st.integers(0, 5)) for _ in range(n)]
    kv = [draw(st.integers(q, q + draw(st.sampled_from([0, 1, 15, 16, 17, MAX_KV])))) for q in qo]
    return qo, kv, draw(st.sampled_from(HEADS)), draw(st.sampled_from(DTYPES))


@st.composite
def layouts(draw):
    # valid layouts drawn more often than the ones that must be refused
    return dict(cache=draw(st.sampled_from(["2d", "padded_rows", "offset", "4d"])),
                index=draw(st.sampled_from(["contiguous", "slice", "contiguous", "slice", "strided"])),
                out=draw(st.sampled_from(["none", "fresh", "none", "fresh", "wrong_shape", "wrong_dtype", "strided"])),
                extra_qo=draw(st.integers(0, 2)), splits=draw(st.sampled_from([None, 1, 2, 5])),
                seed=draw(st.integers(0, 2**16)))


def _place(values: list[int], how: str) -> torch.Tensor:
    """An int32 tensor with ``values``: contiguous, a slice of a larger one (storage offset), or a strided view."""
    t = torch.tensor(values, dtype=torch.int32, device=DEV)
    if how == "slice":
        big = torch.full((len(values) + 3,), -7, dtype=torch.int32, device=DEV)
        big[2:2 + len(values)] = t
        return big[2:2 + len(values)]
    if how == "strided":
        big = torch.full((2 * len(values) + 1,), -7, dtype=torch.int32, device=DEV)
        big[::2][:len(values)] = t
        return big[::2][:len(values)]
    return t


def _build(qo, kv, heads, dtype, lay):
    """The case for ``mla_decode_ref`` (plain tensors) and the kernel's arguments in the drawn layout."""
    g = torch.Generator().manual_seed(lay["seed"])
    total_q, total_kv = sum(qo), sum(kv)
    rows = 1 + total_kv + 5
    base = torch.full((rows, D), float("nan"))
    perm = 1 + torch.randperm(rows - 1, generator=g)[:total_kv]
    base[perm] = torch.randn(total_kv, D, generator=g)
    q = torch.randn(total_q, heads, D, generator=g).to(dtype).to(DEV)
    cache2d = base.to(dtype).to(DEV)
    if lay["cache"] == "padded_rows":  # rows of a wider buffer: row stride 640
        wide = torch.full((rows, 640), float("nan"), dtype=dtype, device=DEV)
        wide[:, :D] = cache2d
        cache = wide[:, :D]
    elif lay["cache"] == "offset":  # a slice of a larger cache: storage offset
        big = torch.full((rows + 4, D), float("nan"), dtype=dtype, device=DEV)
        big[4:] = cache2d
        cache = big[4:]
    elif lay["cache"] == "4d":
        cache = cache2d.view(-1, 1, 1, D)
    else:
        cache = cache2d
    cum = lambda xs: [0] + torch.tensor(xs, dtype=torch.int64).cumsum(0).tolist() if xs else [0]  # noqa: E731
    ref = dict(q=q, kv_cache=cache2d, qo_indptr=torch.tensor(cum(qo), dtype=torch.int32, device=DEV),
               kv_indptr=torch.tensor(cum(kv), dtype=torch.int32, device=DEV),
               kv_indices=perm.to(torch.int32).to(DEV))
    idx = {k: _place(ref[k].tolist(), lay["index"]) for k in ("qo_indptr", "kv_indptr", "kv_indices")}
    out = None
    shape = (total_q, heads, DV)
    if lay["out"] == "fresh":
        out = torch.full(shape, float("nan"), dtype=dtype, device=DEV)
    elif lay["out"] == "wrong_shape":
        out = torch.empty(max(total_q - 1, 0) if total_q else 1, heads, DV, dtype=dtype, device=DEV)
    elif lay["out"] == "wrong_dtype":
        out = torch.empty(shape, dtype=torch.float32 if dtype != torch.float32 else torch.float16, device=DEV)
    elif lay["out"] == "strided":
        out = torch.empty(total_q, heads, 2 * DV, dtype=dtype, device=DEV)[..., :DV]
    return ref, cache, idx, out


def _refused_because(lay, qo, out) -> str | None:
    """The argument a correct implementation must refuse for this layout (None: it must compute). A strided view
    whose strides only differ on dimensions of size 0 or 1 is contiguous (torch's rule, and the kernel's addressing
    never steps along such a dimension): it must be accepted."""
    if lay["index"] == "strided" and len(qo) >= 1:  # a one-element offset tensor (no request) is contiguous
        return "contiguous 1-D tensor"
    if lay["out"] in ("wrong_shape", "wrong_dtype") or (lay["out"] == "strided" and not out.is_contiguous()):
        return "out must be"
    return None


TALLY = Tally()


def _count(test: str, outcome: str) -> None:
    TALLY.count(test, outcome)


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    TALLY.report()


@FUZZ
@given(batch=batches(), lay=layouts())
def test_mla_decode_triton_matches_golden_or_refuses(batch, lay):
    qo, kv, heads, dtype = batch
    ref, cache, idx, out = _build(qo, kv, heads, dtype, lay)
    max_qo = max(qo + [1]) + lay["extra_qo"]
    refused = _refused_because(lay, qo, out)
    if refused is not None:
        with pytest.raises((ValueError, TypeError), match=refused):
            mla.mla_decode_triton(ref["q"], cache, idx["qo_indptr"], idx["kv_indptr"], idx["kv_indices"], max_qo,
                                  0.1, num_splits=lay["splits"], out=out)
        _count("mla_decode_triton", "refused")
        return
    res, lse = mla.mla_decode_triton(ref["q"], cache, idx["qo_indptr"], idx["kv_indptr"], idx["kv_indices"], max_qo,
                                     0.1, num_splits=lay["splits"], out=out)
    assert res.shape == (sum(qo), heads, DV) and res.dtype == dtype
    if out is not None:
        assert res.data_ptr() == out.data_ptr()
    if sum(qo):
        check_against_golden(ref, res, lse, dtype, 0.1, f"{qo} {kv} H{heads} {lay}")
    _count("mla_decode_triton", "computed")


@FUZZ
@given(batch=batches(), lay=layouts())
def test_mla_decode_matches_golden_or_refuses(batch, lay):
    """The one entry point, with metadata in the drawn layout: Triton where it runs, else the golden; the same
    refusals as the kernel, and its own for metadata whose max_qo_len lies."""
    qo, kv, heads, dtype = batch
    ref, cache, idx, _ = _build(qo, kv, heads, dtype, lay)
    md = DecodeMetadata(qo_indptr=idx["qo_indptr"], kv_indptr=idx["kv_indptr"], kv_indices=idx["kv_indices"],
                        kv_last_page_lens=torch.ones(len(qo), dtype=torch.int32, device=DEV),
                        max_qo_len=max(qo + [1]) + lay["extra_qo"])
    backend = "triton" if (ON_GPU or dtype != torch.bfloat16) else "torch"
    if lay["index"] == "strided" and len(qo) >= 1 and backend == "triton":
        with pytest.raises(ValueError, match="contiguous 1-D tensor"):
            mla.mla_decode(ref["q"], cache, md, sm_scale=0.1, backend=backend)
        _count("mla_decode", "refused")
        return
    res = mla.mla_decode(ref["q"], cache, md, sm_scale=0.1, backend=backend)
    assert res.out.shape == (sum(qo), heads, DV)
    if sum(qo):
        check_against_golden(ref, res.out, res.lse, dtype if backend == "triton" else torch.float32, 0.1, str(lay))
    _count("mla_decode", "computed")
