"""Property tests of the expansion's entry points: random ragged batches (empty ones, zero-length requests) in random
layouts (block tables that are views into wider tables, slices with a storage offset, transposed or column-strided
tables, one row broadcast over every request; strided or offset ``seq_lens``), int32 and int64 inputs, row padding
of 0, -1 or a huge id, and ``out=`` / ``kv_indptr=`` buffers of every kind (fresh, too small, int64, strided, 2-D,
sharing memory with each other), against the spec :func:`workbench.expand.expand_page_indices_ref`. Every case
either equals the spec exactly (index work: no tolerance) or is refused with an error naming the argument before
any kernel runs; nothing crashes, nothing is silently wrong, and no byte outside the outputs changes (the inputs and
the buffers around every view are compared before and after).

``WB_FUZZ_EXAMPLES`` sets the cases per entry point (default 300). Each test counts its cases and outcomes and
prints them, so a run's log says how many ran.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import workbench
from fuzz_support import FUZZ, Tally
from workbench import blocksize, device
from workbench import expand as E

ON_GPU = workbench.device.on_gpu()
DEV = torch.device("cuda" if ON_GPU else "cpu")
SENTINEL = -7_777_777
KS = [1, 2, 3, 16, 64]
BIG_ID = 2**30  # a padding id far outside any cache (row padding is never read for the result)
TABLE_LAYOUTS = ["contiguous", "row_padded", "offset", "contiguous", "row_padded", "offset", "broadcast_row",
                 "transposed", "col_strided"]
LENS_LAYOUTS = ["contiguous", "strided", "offset"]
# a layout fault drawn at most once per case (most cases have none), so that the first check that fires is known
FAULTS = ["none"] * 10 + ["out_small", "out_int64", "out_strided", "out_2d", "out_alias", "indptr_long",
                          "indptr_int64", "indptr_strided"]
CONFIGS = [None, None, None, E.ExpandConfig(block_t=32), E.ExpandConfig(block_t=32, group=4),
           E.ExpandConfig(block_t=32, num_warps=1, broadcast_blocks=True, prefix_first=True),
           E.ExpandConfig(block_t=64, max_chunk_programs=2, prefix_u32=True)]


# ----------------------------------------------------------------------------------------------
# cases
# ----------------------------------------------------------------------------------------------


@st.composite
def batches(draw):
    """A ragged batch: K, 0-5 requests of lengths around the block size (0 allowed), row padding, dtypes, layouts."""
    K = draw(st.sampled_from(KS))
    n = draw(st.integers(0, 5))
    edge = st.sampled_from(sorted({0, 1, max(K - 1, 0), K, K + 1}))
    lens = [draw(st.one_of(edge, st.integers(0, 3 * K + 5))) for _ in range(n)]
    return dict(K=K, lens=lens, pad_blocks=draw(st.integers(0, 2)), pad_value=draw(st.sampled_from([0, -1, BIG_ID])),
                table_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
                lens_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
                table_layout=draw(st.sampled_from(TABLE_LAYOUTS)), lens_layout=draw(st.sampled_from(LENS_LAYOUTS)),
                seed=draw(st.integers(0, 2**16)))


def _table_values(case) -> tuple[torch.Tensor, int]:
    """``(num_reqs, width)`` int64 block ids: block 0 reserved, physical blocks permuted, padding past the used
    ones; for ``broadcast_row`` one full row of distinct ids that every request shares. And ``num_blocks``."""
    K, lens = case["K"], case["lens"]
    g = torch.Generator().manual_seed(case["seed"])
    used = [-(-n // K) for n in lens]
    width = max(used, default=0) + case["pad_blocks"]
    if case["table_layout"] == "broadcast_row":
        num_blocks = 1 + width + 2
        row = 1 + torch.randperm(num_blocks - 1, generator=g)[:width]
        return row[None, :].expand(len(lens), width), num_blocks
    num_blocks = 1 + sum(used) + 3
    ids = 1 + torch.randperm(num_blocks - 1, generator=g)
    values = torch.full((len(lens), width), case["pad_value"], dtype=torch.int64)
    at = 0
    for r, u in enumerate(used):
        values[r, :u] = ids[at:at + u]
        at += u
    return values, num_blocks


def _place_table(values: torch.Tensor, dtype: torch.dtype, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(view, base)``: a tensor equal to ``values`` in ``layout``, and the buffer it lives in (to check that nothing
    around the view changes)."""
    n, w = values.shape
    if layout == "row_padded":  # a view into a wider table: row stride w + 3
        base = torch.full((n, w + 3), -5, dtype=dtype, device=DEV)
        base[:, :w] = values
        return base[:, :w], base
    if layout == "offset":  # rows 2.. of a larger table: storage offset
        base = torch.full((n + 2, w), -5, dtype=dtype, device=DEV)
        base[2:] = values
        return base[2:], base
    if layout == "transposed":  # stored column-major: strides (1, n)
        base = values.t().contiguous().to(dtype).to(DEV)
        return base.t(), base
    if layout == "col_strided":  # every other column of a wider table: column stride 2
        base = torch.full((n, 2 * w), -5, dtype=dtype, device=DEV)
        base[:, ::2] = values
        return base[:, ::2], base
    if layout == "broadcast_row":  # one row, row stride 0
        base = values[:1].to(dtype).to(DEV).contiguous() if n else torch.zeros((1, w), dtype=dtype, device=DEV)
        return base.expand(n, w), base
    base = values.to(dtype).to(DEV)
    return base, base


def _place_lens(lens: list[int], dtype: torch.dtype, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.tensor(lens, dtype=dtype, device=DEV)
    if layout == "strided":  # every other entry of a larger tensor
        base = torch.full((2 * len(lens) + 1,), -9, dtype=dtype, device=DEV)
        base[::2][:len(lens)] = t
        return base[::2][:len(lens)], base
    if layout == "offset":
        base = torch.full((len(lens) + 3,), -9, dtype=dtype, device=DEV)
        base[3:] = t
        return base[3:], base
    return t, t


def _inputs(case):
    values, num_blocks = _table_values(case)
    table, table_base = _place_table(values, case["table_dtype"], case["table_layout"])
    lens, lens_base = _place_lens(case["lens"], case["lens_dtype"], case["lens_layout"])
    assert table.tolist() == values.tolist() and lens.tolist() == case["lens"]
    ref_indices, ref_indptr = E.expand_page_indices_ref(values, case["lens"], case["K"])
    return table, lens, num_blocks, ref_indices.to(DEV), ref_indptr.to(DEV), (table_base, lens_base)


@st.composite
def buffers(draw):
    return dict(fault=draw(st.sampled_from(FAULTS)), out=draw(st.sampled_from(["none", "fresh"])),
                indptr=draw(st.sampled_from(["none", "fresh", "fresh", "precomputed"])),
                validate=draw(st.booleans()), bound=draw(st.sampled_from(["none", "exact", "loose", "below"])),
                num_blocks=draw(st.booleans()), config=draw(st.sampled_from(range(len(CONFIGS)))),
                loose_bound=draw(st.booleans()), extra=draw(st.integers(0, 5)))


def _buffers(buf, n: int, total: int, ref_indptr: torch.Tensor):
    """``(out, kv_indptr, precomputed, validate)`` in the drawn kind; a fault replaces one of them."""
    fault = buf["fault"]
    validate = buf["validate"] or fault == "out_small"  # a too-small out is refused only where the total is read
    out = None if buf["out"] == "none" else torch.full((total + buf["extra"],), SENTINEL, dtype=torch.int32,
                                                      device=DEV)
    precomputed = buf["indptr"] == "precomputed"
    indptr = {"none": None, "fresh": torch.full((n + 1,), SENTINEL, dtype=torch.int32, device=DEV),
              "precomputed": ref_indptr.clone()}[buf["indptr"]]
    if fault == "out_small" and total > 0:
        out = torch.full((total - 1,), SENTINEL, dtype=torch.int32, device=DEV)
    elif fault == "out_int64":
        out = torch.full((total,), SENTINEL, dtype=torch.int64, device=DEV)
    elif fault == "out_strided":
        out = torch.full((2 * total + 4,), SENTINEL, dtype=torch.int32, device=DEV)[::2]
    elif fault == "out_2d":
        out = torch.full((1, total), SENTINEL, dtype=torch.int32, device=DEV)
    elif fault == "out_alias":  # out's first entry is kv_indptr's last
        shared = torch.full((n + 1 + total + 2,), SENTINEL, dtype=torch.int32, device=DEV)
        indptr, out, precomputed = shared[:n + 1], shared[n:], False
    elif fault == "indptr_long":
        indptr = torch.full((n + 2,), SENTINEL, dtype=torch.int32, device=DEV)
    elif fault == "indptr_int64":
        indptr = torch.full((n + 1,), SENTINEL, dtype=torch.int64, device=DEV)
    elif fault == "indptr_strided":
        indptr = torch.full((2 * n + 2,), SENTINEL, dtype=torch.int32, device=DEV)[::2]
    if fault.startswith("indptr"):
        precomputed = False
    return out, indptr, precomputed, validate


def _refused_because(table: torch.Tensor, out, indptr, n: int, total: int, validate: bool) -> str | None:
    """The message a correct implementation must refuse this call with (None: it must compute), from the rules."""
    if table.shape[0] > 0 and table.shape[1] > 1 and table.stride(1) != 1:
        return "block_table has strides"
    if out is not None:
        if out.dtype != torch.int32:
            return "out must have dtype torch.int32"
        if out.dim() != 1:
            return "out must be 1-D"
        if not out.is_contiguous():
            return "out must be contiguous"
    if indptr is not None:
        if indptr.dtype != torch.int32:
            return "kv_indptr must have dtype torch.int32"
        if not indptr.is_contiguous():
            return "kv_indptr must be contiguous"
        if indptr.numel() != n + 1:
            return r"kv_indptr must have num_reqs \+ 1"
    if out is not None and indptr is not None and out.numel() and indptr.numel() and \
            out.untyped_storage().data_ptr() == indptr.untyped_storage().data_ptr():
        return "out shares memory with kv_indptr"
    if validate and out is not None and out.numel() < total:
        return "out has"
    return None


def _max_seq_len(kind: str, lens: list[int], validate: bool) -> int | None:
    top = max(lens, default=0)
    if kind == "exact":
        return top
    if kind == "loose":
        return 3 * top + 1
    if kind == "below" and not validate:  # only the kernel's grid: slower, not wrong (validate would refuse it)
        return top // 2
    return None


TALLY = Tally()


def _count(test: str, outcome: str) -> None:
    TALLY.count(test, outcome.replace("\\", ""))  # (message patterns are regular expressions)


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    TALLY.report()


def _snapshot(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.clone() for t in tensors]


def _unchanged(before: list[torch.Tensor], *tensors: torch.Tensor) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, tensors))


def _check_outputs(kv_indices, kv_indptr, ref_indices, ref_indptr, out, indptr, precomputed, validate):
    total = ref_indices.numel()
    assert kv_indptr.dtype == torch.int32 and torch.equal(kv_indptr, ref_indptr)
    if out is None or validate:
        assert kv_indices.dtype == torch.int32 and torch.equal(kv_indices, ref_indices)
    else:  # validate=False: all of out comes back (the total is not read)
        assert kv_indices is out and torch.equal(out[:total], ref_indices)
    if out is not None:
        assert total == 0 or kv_indices.data_ptr() == out.data_ptr()
        assert (out[total:] == SENTINEL).all(), "written past sum(seq_lens)"
    if indptr is not None:
        assert kv_indptr is indptr


# ----------------------------------------------------------------------------------------------
# the entry points
# ----------------------------------------------------------------------------------------------


@FUZZ
@given(case=batches(), buf=buffers())
def test_expand_page_indices_matches_spec_or_refuses(case, buf):
    table, lens, num_blocks, ref_indices, ref_indptr, bases = _inputs(case)
    n, total = len(case["lens"]), ref_indices.numel()
    out, indptr, precomputed, validate = _buffers(buf, n, total, ref_indptr)
    kwargs = dict(out=out, kv_indptr=indptr, validate=validate, precomputed_kv_indptr=precomputed,
                  max_seq_len=_max_seq_len(buf["bound"], case["lens"], validate), config=CONFIGS[buf["config"]],
                  num_blocks=num_blocks if buf["num_blocks"] else None, loose_bound=buf["loose_bound"])
    before = _snapshot(*bases)
    refused = _refused_because(table, out, indptr, n, total, validate)
    if refused is not None:
        snap = _snapshot(*(t for t in (out, indptr) if t is not None))
        with pytest.raises((ValueError, TypeError), match=refused):
            E.expand_page_indices(table, lens, case["K"], **kwargs)
        assert _unchanged(snap, *(t for t in (out, indptr) if t is not None)), "a refused call wrote its buffers"
        _count("expand_page_indices", f"refused ({refused})")
    else:
        kv_indices, kv_indptr = E.expand_page_indices(table, lens, case["K"], **kwargs)
        _check_outputs(kv_indices, kv_indptr, ref_indices, ref_indptr, out, indptr, precomputed, validate)
        _count("expand_page_indices", "computed")
    assert _unchanged(before, *bases), "the inputs (or the memory around their views) changed"


@FUZZ
@given(case=batches(), validate=st.booleans())
def test_expand_page_indices_serial_matches_spec_or_refuses(case, validate):
    table, lens, _, ref_indices, ref_indptr, bases = _inputs(case)
    before = _snapshot(*bases)
    refused = _refused_because(table, None, None, len(case["lens"]), ref_indices.numel(), validate)
    if refused is not None:
        with pytest.raises(ValueError, match=refused):
            E.expand_page_indices_serial(table, lens, case["K"], validate=validate)
        _count("expand_page_indices_serial", f"refused ({refused})")
    else:
        kv_indices, kv_indptr = E.expand_page_indices_serial(table, lens, case["K"], validate=validate)
        assert torch.equal(kv_indices, ref_indices) and torch.equal(kv_indptr, ref_indptr)
        _count("expand_page_indices_serial", "computed")
    assert _unchanged(before, *bases)


@FUZZ
@given(case=batches(), validate=st.booleans(), num_blocks=st.booleans())
def test_expand_page_indices_pre_pr_matches_spec_or_refuses(case, validate, num_blocks):
    table, lens, nb, ref_indices, ref_indptr, bases = _inputs(case)
    before = _snapshot(*bases)
    refused = _refused_because(table, None, None, len(case["lens"]), ref_indices.numel(), validate)
    if refused is None and table.numel() and int(table.min()) < 0:  # the K = 1 split refuses any negative id
        refused = "block_ids contains negative ids"
    if refused is not None:
        with pytest.raises(ValueError, match=refused):
            E.expand_page_indices_pre_pr(table, lens, case["K"], validate=validate,
                                         num_blocks=nb if num_blocks else None)
        _count("expand_page_indices_pre_pr", f"refused ({refused})")
    else:
        kv_indices, kv_indptr = E.expand_page_indices_pre_pr(table, lens, case["K"], validate=validate,
                                                             num_blocks=nb if num_blocks else None)
        assert kv_indices.dtype == kv_indptr.dtype == torch.int32
        assert torch.equal(kv_indices, ref_indices) and torch.equal(kv_indptr, ref_indptr)
        _count("expand_page_indices_pre_pr", "computed")
    assert _unchanged(before, *bases)


@FUZZ
@given(case=batches(), validate=st.booleans(), bound=st.sampled_from(["none", "exact", "loose"]))
def test_expand_page_indices_dense_matches_spec_or_refuses(case, validate, bound):
    table, lens, _, ref_indices, ref_indptr, bases = _inputs(case)
    before = _snapshot(*bases)
    max_seq_len = _max_seq_len(bound, case["lens"], validate)
    refused = _refused_because(table, None, None, len(case["lens"]), ref_indices.numel(), validate)
    if refused is not None:
        with pytest.raises(ValueError, match=refused):
            E.expand_page_indices_dense(table, lens, case["K"], max_seq_len=max_seq_len, validate=validate)
        _count("expand_page_indices_dense", f"refused ({refused})")
    else:
        kv_indices, kv_indptr = E.expand_page_indices_dense(table, lens, case["K"], max_seq_len=max_seq_len,
                                                            validate=validate)
        assert kv_indices.dtype == kv_indptr.dtype == torch.int32
        assert torch.equal(kv_indices, ref_indices) and torch.equal(kv_indptr, ref_indptr)
        _count("expand_page_indices_dense", "computed")
    assert _unchanged(before, *bases)


@FUZZ
@given(case=batches(), buf=buffers(), qlens=st.lists(st.integers(0, 3), min_size=5, max_size=5),
       qform=st.sampled_from([list, tuple, "tensor"]), torch_path=st.booleans())
def test_build_flat_decode_metadata_matches_spec_or_refuses(case, buf, qlens, qform, torch_path):
    """The builder, on the kernel path and (``torch_path``) on the plain-torch path it takes for CPU tensors where
    Triton compiles for a GPU: the same answers and the same refusals."""
    table, lens, num_blocks, ref_indices, ref_indptr, bases = _inputs(case)
    n, total = len(case["lens"]), ref_indices.numel()
    if buf["fault"] == "none" and buf["indptr"] == "precomputed":
        buf = dict(buf, indptr="fresh")  # the builder computes kv_indptr: no precomputed input
    out, indptr, _, validate = _buffers(buf, n, total, ref_indptr)
    query_lens = qlens[:n]
    query_lens = torch.tensor(query_lens, dtype=torch.int64) if qform == "tensor" else qform(query_lens)
    kwargs = dict(out=out, kv_indptr=indptr, validate=validate, loose_bound=buf["loose_bound"],
                  max_seq_len=_max_seq_len(buf["bound"], case["lens"], validate),
                  num_blocks=num_blocks if buf["num_blocks"] else None)
    before = _snapshot(*bases)
    refused = _refused_because(table, out, indptr, n, total, validate)
    patch = mock.patch.object(device, "interpreter_active", lambda: False) if torch_path and not ON_GPU \
        else mock.patch.object(device, "interpreter_active", device.interpreter_active)
    with patch:
        if refused is not None:
            with pytest.raises((ValueError, TypeError), match=refused):
                E.build_flat_decode_metadata(table, lens, query_lens, case["K"], **kwargs)
            _count("build_flat_decode_metadata", f"refused ({refused})")
        else:
            md = E.build_flat_decode_metadata(table, lens, query_lens, case["K"], **kwargs)
            assert torch.equal(md.kv_indices[:total], ref_indices) and torch.equal(md.kv_indptr, ref_indptr)
            assert md.qo_indptr.tolist() == np.concatenate([[0], np.cumsum(qlens[:n], dtype=np.int64)]).tolist()
            assert md.qo_indptr.dtype == md.kv_last_page_lens.dtype == torch.int32
            assert md.kv_last_page_lens.tolist() == [1] * n and md.max_qo_len == max(qlens[:n], default=0)
            if out is not None:
                assert (out[total:] == SENTINEL).all()
            _count("build_flat_decode_metadata", "computed" + ("-torch-path" if torch_path and not ON_GPU else ""))
    assert _unchanged(before, *bases)


# ----------------------------------------------------------------------------------------------
# map_to_kernel_blocks: the hybrid-block split, in every container and dtype, near the int32 limit
# ----------------------------------------------------------------------------------------------

ID_DTYPES = {"torch.int32": torch.int32, "torch.int64": torch.int64, "torch.int16": torch.int16,
             "torch.uint8": torch.uint8, "np.int32": np.int32, "np.int64": np.int64, "np.uint64": np.uint64,
             "list": None}


@st.composite
def block_id_cases(draw):
    ratio = draw(st.sampled_from(KS))
    kind = draw(st.sampled_from(list(ID_DTYPES)))
    if kind.startswith("torch"):
        dmax = torch.iinfo(ID_DTYPES[kind]).max
    elif kind == "np.uint64":
        dmax = 2**64 - 1
    else:
        dmax = 2**63 - 1 if kind in ("np.int64", "list") else 2**31 - 1
    near = [dmax // ratio - 1, dmax // ratio, (dmax - ratio + 1) // ratio, (dmax - ratio + 1) // ratio + 1]
    value = st.one_of(st.integers(0, 40), st.integers(0, 40), st.sampled_from([v for v in near if 0 <= v <= dmax]))
    shape = draw(st.sampled_from([(0,), (1,), (5,), (2, 3), (3, 1), (0, 4)]))
    count = int(np.prod(shape))
    values = [draw(value) for _ in range(count)]
    if count and kind not in ("np.uint64", "torch.uint8") and draw(st.integers(0, 7)) == 0:
        values[draw(st.integers(0, count - 1))] = -1  # a negative id somewhere
    return ratio, kind, shape, values, draw(st.sampled_from(["contiguous", "strided", "transposed", "offset"]))


def _ids(kind: str, shape, values: list[int], layout: str):
    if kind == "list":
        return np.array(values, dtype=object).reshape(shape).tolist() if values else []
    if kind.startswith("np."):
        return np.array(values, dtype=ID_DTYPES[kind]).reshape(shape)
    dtype = ID_DTYPES[kind]
    t = torch.tensor(values, dtype=torch.int64).reshape(shape).to(dtype)
    if layout == "strided" and t.dim() == 1:  # every other entry of a larger tensor
        base = torch.zeros((2 * t.numel() + 1,), dtype=dtype)
        base[::2][:t.numel()] = t
        return base[::2][:t.numel()]
    if layout == "strided":  # every other column of a wider tensor
        base = torch.zeros((shape[0], 2 * shape[1]), dtype=dtype)
        base[:, ::2] = t
        return base[:, ::2]
    if layout == "transposed" and t.dim() == 2:
        return t.t().contiguous().t()
    if layout == "offset":
        base = torch.zeros((t.numel() + 2,), dtype=dtype)
        base[2:] = t.reshape(-1)
        return base[2:].reshape(shape)
    return t


@FUZZ
@given(case=block_id_cases())
def test_map_to_kernel_blocks_matches_loop_or_refuses(case):
    ratio, kind, shape, values, layout = case
    ids = _ids(kind, shape, values, layout)
    want = [i * ratio + j for i in values for j in range(ratio)]  # the spec: Python ints, row-major order
    out_max = torch.iinfo(ID_DTYPES[kind]).max if kind.startswith("torch") else 2**63 - 1
    if values and min(values) < 0:
        refused = "negative ids"
    elif want and max(want) > out_max:
        refused = "beyond"
    else:
        refused = None
    if refused is not None:
        with pytest.raises(ValueError, match=refused):
            blocksize.map_to_kernel_blocks(ids, ratio)
        _count("map_to_kernel_blocks", f"refused ({refused})")
        return
    got = blocksize.map_to_kernel_blocks(ids, ratio)
    if kind.startswith("torch"):
        assert isinstance(got, torch.Tensor) and got.dtype == ID_DTYPES[kind] and got.dim() == 1
    else:
        assert isinstance(got, np.ndarray) and got.dtype == np.int64
    assert [int(x) for x in got.tolist()] == want
    _count("map_to_kernel_blocks", "computed")
