"""workbench.expand: the kernel against the loop spec, the pre-PR path, the builder, every input check.

Scenarios follow vLLM's attention tests: block 0 is reserved (never handed out), physical blocks are
a random permutation, rows carry padding past the blocks a request uses, and output buffers are
pre-filled with a sentinel so that a write outside ``[0, sum(seq_lens))`` shows up.
On CPU the kernels run under the Triton interpreter, so sizes stay small.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch

try:  # the GPU machine may lack hypothesis; only the property test needs it
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - depends on the environment
    given = None

import workbench  # noqa: F401  (sets TRITON_INTERPRET on CPU before kernels import)
from workbench import device
from workbench import expand as E
from workbench.expand import kernel as EK
from workbench.expand import policy as P  # the thresholds live (and are patched) here

DEV = device.default_device() if device.on_gpu() else torch.device("cpu")
SENTINEL = -7_777_777
KS = [1, 2, 16, 64, 256]


def edge_lens(K: int, seed: int = 0) -> list[int]:
    """seq lens 0, 1, K-1, K, K+1 (deduplicated, K-1 dropped when it is 0) and two random non-powers of two."""
    rng = random.Random(seed * 1000 + K)
    lens = [0, 1, K - 1, K, K + 1]
    while len(lens) < 7:
        x = rng.randint(2, 3 * K + 7)
        if x & (x - 1):  # not a power of two
            lens.append(x)
    return lens


def make_batch(seq_lens, K, *, seed=0, pad_blocks=2, dtype=torch.int32, pad_value=0, device=DEV):
    """A block table with permuted physical blocks, block 0 reserved, ``pad_blocks`` unused columns per row."""
    g = torch.Generator().manual_seed(seed)
    used = [(n + K - 1) // K for n in seq_lens]
    width = max(used, default=0) + pad_blocks
    num_blocks = 1 + sum(used) + 3  # block 0 reserved, a few spare
    ids = 1 + torch.randperm(num_blocks - 1, generator=g)
    block_table = torch.full((len(seq_lens), width), pad_value, dtype=torch.int64)
    at = 0
    for r, n in enumerate(used):
        block_table[r, :n] = ids[at:at + n]
        at += n
    return (block_table.to(dtype).to(device),
            torch.tensor(seq_lens, dtype=dtype).to(device), num_blocks)


def check_against_spec(block_table, seq_lens, K, num_blocks=None, config=None):
    """Run the kernel into sentinel-filled buffers; compare with the spec and check the tail is untouched."""
    ref_indices, ref_indptr = E.expand_page_indices_ref(block_table.cpu(), seq_lens.cpu(), K)
    total = ref_indices.numel()
    out = torch.full((total + 37,), SENTINEL, dtype=torch.int32, device=block_table.device)
    indptr = torch.full((block_table.shape[0] + 1,), SENTINEL, dtype=torch.int32, device=block_table.device)
    kv_indices, kv_indptr = E.expand_page_indices(block_table, seq_lens, K, out=out, kv_indptr=indptr,
                                                  num_blocks=num_blocks, config=config)
    assert kv_indices.numel() == total and (total == 0 or kv_indices.data_ptr() == out.data_ptr())
    assert torch.equal(kv_indices.cpu(), ref_indices)
    assert torch.equal(kv_indptr.cpu(), ref_indptr)
    assert (out[total:] == SENTINEL).all(), "the kernel wrote past sum(seq_lens)"
    return ref_indices, ref_indptr


# Small chunks exercise the aligned interior path, the masked edges and the chunk striding under the interpreter.
CONFIGS = {
    "default": None,
    "chunk16": E.ExpandConfig(block_t=16),
    "chunk32-stride2": E.ExpandConfig(block_t=32, max_chunk_programs=2),
    "chunk64-8warps-streaming": E.ExpandConfig(block_t=64, num_warps=8, streaming_stores=True),
    "chunk16-prefix-u32": E.ExpandConfig(block_t=16, prefix_u32=True),
    # several requests per program, a (group, block_t) tile: rows of different lengths in one tile, groups that
    # run past the last request, and chunks the tile strides over when a request is longer than block_t
    "group4-chunk16": E.ExpandConfig(block_t=16, group=4),
    "group8-chunk32-stride2-u32": E.ExpandConfig(block_t=32, group=8, max_chunk_programs=2, prefix_u32=True),
    "group2-chunk16": E.ExpandConfig(block_t=16, group=2),
    # one load per block id, broadcast over a (block_t // K, K) tile: K below, at and above the chunk width
    "chunk16-bcast": E.ExpandConfig(block_t=16, broadcast_blocks=True),
    "chunk32-stride2-1warp-bcast": E.ExpandConfig(block_t=32, max_chunk_programs=2, num_warps=1, broadcast_blocks=True),
    # the prefix sum's loads issued before the block ids' (alone, and as expand_config's one-warp rule combines it)
    "chunk16-prefix-first": E.ExpandConfig(block_t=16, prefix_first=True),
    "chunk32-stride2-1warp-bcast-first-u32": E.ExpandConfig(block_t=32, max_chunk_programs=2, num_warps=1,
                                                            broadcast_blocks=True, prefix_first=True, prefix_u32=True),
}


# ----------------------------------------------------------------------------------------------
# the spec itself, on a case worked by hand
# ----------------------------------------------------------------------------------------------


def test_spec_by_hand():
    # K = 4; request 0 holds 5 tokens in blocks 7, 3; request 1 holds 9 tokens in blocks 2, 5, 9.
    block_table = torch.tensor([[7, 3, 0], [2, 5, 9]])
    kv_indices, kv_indptr = E.expand_page_indices_ref(block_table, [5, 9], 4)
    assert kv_indptr.tolist() == [0, 5, 14]
    assert kv_indices.tolist() == [28, 29, 30, 31, 12, 8, 9, 10, 11, 20, 21, 22, 23, 36]
    assert kv_indices.dtype == kv_indptr.dtype == torch.int32


# ----------------------------------------------------------------------------------------------
# the kernel against the spec: grids over K, edge lengths, configs, dtypes
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("K", KS)
def test_kernel_matches_spec_edge_lengths(K, config):
    block_table, seq_lens, num_blocks = make_batch(edge_lens(K), K, seed=K)
    check_against_spec(block_table, seq_lens, K, num_blocks=num_blocks, config=CONFIGS[config])


@pytest.mark.parametrize("prefix", [0, 5, 16])
def test_chunk_boundaries_never_write_past_the_end(prefix):
    # Every length of the last request from 0 to 3*BLOCK_T + 1 after a prefix request: the last chunk
    # ends exactly at, one before and one after a chunk boundary, so an off-by-one in the
    # interior/edge decision would write the sentinel tail.
    config = E.ExpandConfig(block_t=16)
    for n in range(0, 3 * 16 + 2):
        block_table, seq_lens, num_blocks = make_batch([prefix, n], 4, seed=n)
        check_against_spec(block_table, seq_lens, 4, num_blocks=num_blocks, config=config)


@pytest.mark.parametrize("K", [4, 16])
def test_full_rows_are_never_read_past_their_end(K):
    # No padding columns and chunks wider than a row. The kernel loads block ids before it knows the
    # request's length, bounded by the row's width instead; the result must not depend on what lies past
    # a row. (That nothing past the last row is READ is not observable here; compute-sanitizer would see it.)
    lens = [3 * K, 2 * K, 3 * K - 1, 0, 3 * K]
    block_table, seq_lens, num_blocks = make_batch(lens, K, seed=7, pad_blocks=0)
    assert block_table.shape[1] * K == max(lens)
    check_against_spec(block_table, seq_lens, K, num_blocks=num_blocks, config=E.ExpandConfig(block_t=64))


@pytest.mark.parametrize("config", ["chunk16", "chunk16-prefix-u32", "group4-chunk16", "group8-chunk32-stride2-u32",
                                    "chunk32-stride2-1warp-bcast-first-u32"])
def test_prefix_sum_over_several_steps(monkeypatch, config):
    # More requests than seq_lens summed per step (PREFIX_BLOCK; 32, the least, here): the prefix sum loops,
    # three steps for the last requests.
    monkeypatch.setattr(P, "PREFIX_BLOCK", 32)
    rng = random.Random(11)
    lens = [rng.randint(0, 40) for _ in range(77)]
    block_table, seq_lens, num_blocks = make_batch(lens, 16, seed=11)
    check_against_spec(block_table, seq_lens, 16, num_blocks=num_blocks, config=CONFIGS[config])


@pytest.mark.parametrize("config", ["chunk16", "group2-chunk16", "group4-chunk16"])
def test_more_requests_than_grid_axis_1_allows(monkeypatch, config):
    # Chunks-first puts requests (or groups of them) on grid axis 1 (65535 at most on a GPU; 2 here): beyond
    # that the launch falls back to requests first, with the same result (group 4: 2 groups, no fallback).
    monkeypatch.setattr(EK, "GRID_AXIS1_MAX", 2)
    block_table, seq_lens, num_blocks = make_batch([17, 0, 40, 5, 33], 4, seed=12)
    check_against_spec(block_table, seq_lens, 4, num_blocks=num_blocks, config=CONFIGS[config])


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("config", ["default", "chunk16", "group4-chunk16"])
def test_precomputed_kv_indptr_path(config, validate):
    # expand_page_indices(precomputed_kv_indptr=True), the kernel's INDPTR_IN: start and length come from the
    # caller's kv_indptr (as vLLM's builder computes it), which is left unchanged.
    block_table, seq_lens, _ = make_batch([5, 0, 33, 17, 64], 16, seed=4)
    ref_indices, ref_indptr = E.expand_page_indices_ref(block_table.cpu(), seq_lens.cpu(), 16)
    out = torch.full((ref_indices.numel() + 9,), SENTINEL, dtype=torch.int32, device=DEV)
    indptr = ref_indptr.to(DEV)
    got, got_indptr = E.expand_page_indices(block_table, seq_lens, 16, out=out, kv_indptr=indptr, max_seq_len=64,
                                            validate=validate, config=CONFIGS[config], precomputed_kv_indptr=True)
    assert got_indptr is indptr and torch.equal(indptr.cpu(), ref_indptr), "kv_indptr must be left unchanged"
    assert torch.equal(out[:ref_indices.numel()].cpu(), ref_indices)
    assert (out[ref_indices.numel():] == SENTINEL).all()


def test_precomputed_kv_indptr_is_checked():
    block_table, seq_lens, _ = make_batch([5, 0, 33], 16, seed=5)
    with pytest.raises(ValueError, match="precomputed_kv_indptr=True reads the request offsets from kv_indptr"):
        E.expand_page_indices(block_table, seq_lens, 16, precomputed_kv_indptr=True)
    bad = torch.tensor([0, 5, 5, 39], dtype=torch.int32, device=DEV)  # 38 = 5 + 0 + 33 expected last
    with pytest.raises(ValueError, match=r"kv_indptr\[3\] = 39 but \[0, cumsum\(seq_lens\)\] has 38"):
        E.expand_page_indices(block_table, seq_lens, 16, kv_indptr=bad, precomputed_kv_indptr=True)
    with pytest.raises(ValueError, match="kv_indptr must have num_reqs"):
        E.expand_page_indices(block_table, seq_lens, 16, kv_indptr=bad[:3], precomputed_kv_indptr=True)
    # an empty batch: a given kv_indptr of [0] stays as it is
    empty = torch.zeros(1, dtype=torch.int32, device=DEV)
    got, ptr = E.expand_page_indices(block_table[:0], seq_lens[:0], 16, kv_indptr=empty, precomputed_kv_indptr=True)
    assert got.numel() == 0 and ptr is empty and int(empty[0]) == 0


@pytest.mark.parametrize("config", ["chunk16", "group4-chunk16"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("K", [1, 16])
def test_kernel_dtypes(K, dtype, config):
    block_table, seq_lens, num_blocks = make_batch([3, 0, 2 * K + 1, 97], K, seed=3, dtype=dtype)
    check_against_spec(block_table, seq_lens, K, num_blocks=num_blocks, config=CONFIGS[config])


@pytest.mark.parametrize("config", ["chunk16", "group4-chunk16"])
@pytest.mark.parametrize("K", [2, 16])
def test_strided_block_table_and_garbage_padding(K, config):
    # A view into a wider table (row stride > width) whose padding is -1: neither may be read.
    block_table, seq_lens, num_blocks = make_batch([K + 1, 5, 3 * K], K, seed=1, pad_blocks=3, pad_value=-1)
    view = block_table[:, : block_table.shape[1] - 1]
    assert view.stride(0) != view.shape[1]
    check_against_spec(view, seq_lens, K, num_blocks=num_blocks, config=CONFIGS[config])


def test_empty_batch_and_all_zero_lengths():
    block_table = torch.zeros((0, 4), dtype=torch.int32, device=DEV)
    kv_indices, kv_indptr = E.expand_page_indices(block_table, torch.zeros(0, dtype=torch.int32, device=DEV), 16)
    assert kv_indices.numel() == 0 and kv_indptr.tolist() == [0]
    block_table, seq_lens, _ = make_batch([0, 0, 0], 16)
    check_against_spec(block_table, seq_lens, 16)


def test_each_token_maps_to_its_own_row():
    # With a permuted table every cache row appears at most once: the expansion is injective.
    block_table, seq_lens, _ = make_batch([100, 37, 64, 1], 16, seed=5)
    kv_indices, _ = E.expand_page_indices(block_table, seq_lens, 16)
    assert kv_indices.unique().numel() == kv_indices.numel()
    assert int(kv_indices.min()) >= 16, "block 0 is reserved, so no index may fall in rows 0..15"


def test_no_validate_path_with_preallocated_buffers():
    # The CUDA-graph path: buffers and bound given, validate=False; returns all of `out`.
    block_table, seq_lens, _ = make_batch([33, 0, 70], 16, seed=2)
    ref_indices, ref_indptr = E.expand_page_indices_ref(block_table.cpu(), seq_lens.cpu(), 16)
    out = torch.full((ref_indices.numel() + 5,), SENTINEL, dtype=torch.int32, device=DEV)
    indptr = torch.empty(4, dtype=torch.int32, device=DEV)
    kv_indices, kv_indptr = E.expand_page_indices(block_table, seq_lens, 16, out=out, kv_indptr=indptr,
                                                  max_seq_len=80, validate=False, config=CONFIGS["chunk16"])
    assert kv_indices is out and kv_indptr is indptr
    assert torch.equal(out[:103].cpu(), ref_indices) and (out[103:] == SENTINEL).all()
    assert torch.equal(indptr.cpu(), ref_indptr)


@pytest.mark.parametrize("config", ["default", "chunk16", "group4-chunk16", "group8-chunk32-stride2-u32"])
@pytest.mark.parametrize("bound", [0, 1, 10, 100])
def test_a_bound_below_the_longest_request_is_slower_not_wrong(config, bound):
    # With validate=False nothing checks max_seq_len; it only sizes the grid's chunk dimension (and, by default,
    # picks the launch parameters), and programs stride over the chunks past it, so every token is still written.
    rng = random.Random(bound)
    lens = [rng.randint(0, 300) for _ in range(23)] + [299]
    block_table, seq_lens, _ = make_batch(lens, 16, seed=bound)
    ref_indices, ref_indptr = E.expand_page_indices_ref(block_table.cpu(), seq_lens.cpu(), 16)
    out = torch.full((ref_indices.numel() + 5,), SENTINEL, dtype=torch.int32, device=DEV)
    indptr = torch.empty(len(lens) + 1, dtype=torch.int32, device=DEV)
    E.expand_page_indices(block_table, seq_lens, 16, out=out, kv_indptr=indptr, max_seq_len=bound, validate=False,
                          config=CONFIGS[config])
    assert torch.equal(out[: ref_indices.numel()].cpu(), ref_indices) and torch.equal(indptr.cpu(), ref_indptr)
    assert (out[ref_indices.numel():] == SENTINEL).all()


def _property(K, seq_lens, seed, block_t, stride_cap, group, broadcast):
    block_table, lens, num_blocks = make_batch(seq_lens, K, seed=seed, pad_blocks=seed % 3)
    check_against_spec(block_table, lens, K, num_blocks=num_blocks,
                       config=E.ExpandConfig(block_t=block_t, max_chunk_programs=stride_cap, group=group,
                                             broadcast_blocks=broadcast and group == 1))


if given is not None:
    test_kernel_property_matches_spec = settings(max_examples=25, deadline=None, derandomize=True)(given(
        K=st.sampled_from(KS + [3, 5, 48]),
        seq_lens=st.lists(st.integers(0, 300), min_size=0, max_size=5),
        seed=st.integers(0, 2**16),
        block_t=st.sampled_from([16, 64, 1024]),
        stride_cap=st.sampled_from([1, 3, 65535]),
        group=st.sampled_from([1, 2, 4, 8]),
        broadcast=st.booleans(),
    )(_property))
else:  # pragma: no cover
    @pytest.mark.skip(reason="hypothesis is not installed here (pip install hypothesis)")
    def test_kernel_property_matches_spec():
        pass


# ----------------------------------------------------------------------------------------------
# the pre-PR path and the baselines give exactly the same indices
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("K", KS)
def test_pre_pr_path_equals_post_pr(K):
    for seed in range(3):
        rng = random.Random(seed)
        lens = [rng.randint(0, 3 * K + 9) for _ in range(rng.randint(1, 6))]
        block_table, seq_lens, num_blocks = make_batch(lens, K, seed=seed)
        post = E.expand_page_indices(block_table, seq_lens, K, num_blocks=num_blocks)
        pre = E.expand_page_indices_pre_pr(block_table, seq_lens, K, num_blocks=num_blocks)
        assert torch.equal(pre[0], post[0]) and torch.equal(pre[1], post[1])


@pytest.mark.parametrize("K", [1, 16, 64])
def test_serial_and_dense_baselines_match_spec(K):
    block_table, seq_lens, _ = make_batch(edge_lens(K, seed=1), K, seed=7)
    ref = E.expand_page_indices_ref(block_table.cpu(), seq_lens.cpu(), K)
    for fn in (E.expand_page_indices_serial, E.expand_page_indices_dense):
        got = fn(block_table, seq_lens, K)
        assert torch.equal(got[0].cpu(), ref[0]) and torch.equal(got[1].cpu(), ref[1]), fn.__name__


# ----------------------------------------------------------------------------------------------
# the metadata builder
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("as_type", [list, tuple, torch.tensor])
def test_build_flat_decode_metadata(as_type):
    block_table, seq_lens, num_blocks = make_batch([17, 1, 40], 16, seed=4)
    query_lens = [1, 1, 4]
    md = E.build_flat_decode_metadata(block_table, seq_lens, as_type(query_lens), 16, num_blocks=num_blocks)
    ref_indices, ref_indptr = E.expand_page_indices_ref(block_table.cpu(), seq_lens.cpu(), 16)
    assert md.qo_indptr.tolist() == [0, 1, 2, 6] and md.qo_indptr.dtype == torch.int32
    assert torch.equal(md.kv_indptr.cpu(), ref_indptr) and torch.equal(md.kv_indices.cpu(), ref_indices)
    assert md.kv_last_page_lens.tolist() == [1, 1, 1] and md.kv_last_page_lens.dtype == torch.int32
    assert md.max_qo_len == 4 and md.num_reqs == 3 and md.has_persistent_metadata is False
    assert md.qo_indptr.device == md.kv_indices.device == block_table.device


def test_build_flat_decode_metadata_empty():
    md = E.build_flat_decode_metadata(torch.zeros((0, 2), dtype=torch.int32, device=DEV),
                                      torch.zeros(0, dtype=torch.int32, device=DEV), [], 16)
    assert md.num_reqs == 0 and md.max_qo_len == 0 and md.kv_indices.numel() == 0 and md.kv_indptr.tolist() == [0]


@pytest.mark.parametrize("query_lens, exc, match", [
    (torch.ones(2, dtype=torch.int32, device="meta"), ValueError, "must be host-side"),
    ([1], ValueError, "query_lens has 1 entries but block_table has 2 rows"),
    ([1, -2], ValueError, r"query_lens\[1\] = -2 is negative"),
    ([1.0, 2.0], TypeError, "query_lens must hold Python ints"),
    (torch.ones(2), TypeError, "1-D integer tensor"),
    ("11", TypeError, "list, tuple or CPU tensor"),
])
def test_build_flat_decode_metadata_rejects_bad_query_lens(query_lens, exc, match):
    block_table, seq_lens, _ = make_batch([3, 4], 16)
    with pytest.raises(exc, match=match):
        E.build_flat_decode_metadata(block_table, seq_lens, query_lens, 16)


# ----------------------------------------------------------------------------------------------
# every validation error (and padding that must NOT be an error)
# ----------------------------------------------------------------------------------------------


def _bt(*rows, dtype=torch.int32):
    return torch.tensor(rows, dtype=dtype)


BAD_INPUTS = {
    # name: (block_table, seq_lens, K, kwargs, exception, message pattern)
    "K zero": (_bt([1, 2]), _bt(3), 0, {}, ValueError, "kernel_block_size must be a positive"),
    "K negative": (_bt([1, 2]), _bt(3), -16, {}, ValueError, "got -16"),
    "K float": (_bt([1, 2]), _bt(3), 16.0, {}, TypeError, "kernel_block_size must be a Python int"),
    "K bool": (_bt([1, 2]), _bt(3), True, {}, TypeError, "kernel_block_size must be a Python int"),
    "block_table float": (torch.ones(1, 2), _bt(3), 16, {}, TypeError, "block_table must have dtype"),
    "block_table list": ([[1, 2]], _bt(3), 16, {}, TypeError, "block_table must be a torch.Tensor"),
    "block_table 1-D": (torch.tensor([1, 2], dtype=torch.int32), _bt(3), 16, {}, ValueError, "block_table must be 2-D"),
    "seq_lens float": (_bt([1, 2]), torch.tensor([3.0]), 16, {}, TypeError, "seq_lens must have dtype"),
    "seq_lens count": (_bt([1, 2]), _bt(3, 4), 16, {}, ValueError, "seq_lens has 2 entries but block_table has 1 rows"),
    "seq_lens device": (_bt([1, 2]), torch.ones(1, dtype=torch.int32, device="meta"), 16, {}, ValueError,
                        "seq_lens is on meta but block_table is on"),
    "seq_len negative": (_bt([1, 2], [3, 4]), _bt(5, -1), 16, {}, ValueError, r"seq_lens\[1\] = -1 is negative"),
    "seq_len beyond row": (_bt([1, 2], [3, 4]), _bt(5, 33), 16, {}, ValueError,
                           r"seq_lens\[1\] = 33 exceeds what its block_table row holds: 2 blocks x kernel_block_size 16"),
    "seq_len beyond max_seq_len": (_bt([1, 2]), _bt(20), 16, {"max_seq_len": 19}, ValueError,
                                   "exceeds max_seq_len = 19"),
    "max_seq_len negative": (_bt([1, 2]), _bt(20), 16, {"max_seq_len": -1}, ValueError, "max_seq_len must be"),
    "block id negative": (_bt([1, 2], [-3, 4]), _bt(5, 17), 16, {}, ValueError,
                          r"block_table\[1, 0\] = -3 is a negative block id"),
    "block id out of cache": (_bt([1, 2], [3, 9]), _bt(5, 17), 16, {"num_blocks": 9}, ValueError,
                              r"block_table\[1, 1\] = 9 is outside the KV cache of num_blocks = 9"),
    "num_blocks beyond int32": (_bt([1, 2]), _bt(5), 16, {"num_blocks": 2**27 + 1}, ValueError,
                                "token rows exceed int32"),
    "flat index beyond int32": (_bt([2**27, 2]), _bt(5), 16, {}, ValueError, "beyond int32"),
    "sum(seq_lens) beyond int32": (torch.zeros((2, 1024), dtype=torch.int32), _bt(2**30, 2**30), 2**20, {},
                                   ValueError, r"sum\(seq_lens\) = 2147483648 exceeds int32"),
    "out too small": (_bt([1, 2]), _bt(20), 16, {"out": torch.empty(19, dtype=torch.int32)}, ValueError,
                      "out has 19 entries but sum"),
    "out int64": (_bt([1, 2]), _bt(20), 16, {"out": torch.empty(20, dtype=torch.int64)}, TypeError,
                  "out must have dtype torch.int32"),
    "out device": (_bt([1, 2]), _bt(20), 16, {"out": torch.empty(20, dtype=torch.int32, device="meta")}, ValueError,
                   "out is on meta"),
    "out strided": (_bt([1, 2]), _bt(20), 16, {"out": torch.empty(40, dtype=torch.int32)[::2]}, ValueError,
                    "out must be contiguous"),
    "kv_indptr length": (_bt([1, 2]), _bt(20), 16, {"kv_indptr": torch.empty(3, dtype=torch.int32)}, ValueError,
                         "kv_indptr must have num_reqs \\+ 1 = 2 entries, got 3"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_validation_errors(case):
    block_table, seq_lens, K, kwargs, exc, match = BAD_INPUTS[case]
    with pytest.raises(exc, match=match):
        E.validate_expand_inputs(block_table, seq_lens, K, **kwargs)
    if isinstance(block_table, torch.Tensor):  # the public entry points check the same things
        with pytest.raises(exc, match=match):
            E.expand_page_indices(_dev(block_table), _dev(seq_lens), K,
                                  **{k: _dev(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})


def _dev(t: torch.Tensor) -> torch.Tensor:
    """Move a CPU tensor to the test device keeping its strides (a strided view stays strided); others as they are."""
    if t.device.type != "cpu":
        return t
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=DEV).copy_(t)


def test_padding_past_used_blocks_is_not_checked():
    # vLLM rows carry padding after the blocks a request uses; it may hold anything (here -1 and a huge id).
    block_table = _bt([5, -1, 2**30], [6, 7, -1])
    E.validate_expand_inputs(block_table, _bt(16, 17), 16, num_blocks=8)
    check_against_spec(block_table.to(DEV), _bt(16, 17).to(DEV), 16, num_blocks=8)


def test_opt_out_skips_value_checks_but_not_structure():
    # validate=False: a negative seq_len is not read on the host (the caller promised), yet dtypes are checked.
    E.validate_expand_inputs(_bt([1, 2]), _bt(-1), 16, check_values=False)
    with pytest.raises(TypeError, match="seq_lens must have dtype"):
        E.expand_page_indices(_bt([1, 2]), torch.tensor([1.0]), 16, validate=False)


@pytest.mark.interpreter
def test_interpreter_refuses_non_cpu_tensors():
    bt = torch.ones((1, 2), dtype=torch.int32, device="meta")
    sl = torch.ones(1, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="needs CPU tensors"):
        E.expand_page_indices(bt, sl, 16, out=torch.empty(4, dtype=torch.int32, device="meta"),
                              kv_indptr=torch.empty(2, dtype=torch.int32, device="meta"), max_seq_len=4, validate=False)


# ----------------------------------------------------------------------------------------------
# the tuned table and every launch expand_config can choose
# ----------------------------------------------------------------------------------------------


def test_tuned_table_is_well_formed():
    table = json.loads(P.TUNED_TABLE.read_text())
    assert "benchmarks/expand.py --tune" in table["generated_by"] and table["device"] == "NVIDIA H200"
    assert P.load_tuned() == table["thresholds"] and set(table["thresholds"]) == set(P.TUNED_THRESHOLDS)
    for name, value in table["thresholds"].items():  # the policy's constants are the table's values
        assert getattr(P, name.upper()) == getattr(E, name.upper()) == value, name


@pytest.mark.parametrize("change, match", [
    ({"prefix_block": 1000}, r"thresholds\['prefix_block'\] = 1000; it must be a power of two >= 32"),
    ({"group_tile": 3000}, r"thresholds\['group_tile'\] = 3000; it must be a power of two"),
    ({"few_reqs": True}, r"thresholds\['few_reqs'\] = True; it must be an int >= 1"),
    ({"broadcast_min_len": 4000}, "broadcast_min_len 4000 exceeds broadcast_max_len"),
    ({"few_reqs": None}, "'thresholds' must hold exactly"),
    ({"generated_by": ""}, "'generated_by' must be a non-empty string"),
])
def test_tuned_table_refuses_bad_entries(tmp_path, change, match):
    table = json.loads(P.TUNED_TABLE.read_text())
    for key, value in change.items():
        where = table if key in ("generated_by", "device") else table["thresholds"]
        if value is None:
            del where[key]
        else:
            where[key] = value
    path = tmp_path / "expand_nvidia.json"
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match=match):
        P.load_tuned(path)
    path.write_text("{")
    with pytest.raises(ValueError, match="cannot be read"):
        P.load_tuned(path)


# Batches around every threshold of the rule, tight and loose: expand_config's every branch.
POLICY_GRID = list(itertools.product(
    (1, 3, 63, 64, 100, 511, 512, 1000, 2047, 2048, 4096, 8192, 16_384, 65_536, 100_000),
    (0, 1, 16, 17, 100, 256, 257, 300, 512, 1000, 1024, 1025, 2048, 2049, 4096, 32_768, 97_000, 131_072),
    (False, True)))


def test_expand_config_follows_its_rules():
    """The rules expand_config's docstring states, over the grid (thresholds from the tuned table)."""
    for R, L, loose in POLICY_GRID:
        cfg = E.expand_config(R, L, loose_bound=loose)
        assert 16 <= cfg.block_t <= P.MAX_BLOCK_T and cfg.group * cfg.block_t <= max(P.GROUP_TILE, cfg.block_t)
        assert cfg.prefix_u32 == (cfg.group > 1 or cfg.broadcast_blocks), (R, L, loose, cfg)
        assert cfg.group == 1 or R >= P.MIN_PER_GROUP * P.GROUP_PROGRAMS, (R, L, loose, cfg)
        if loose:
            groups = -(-R // cfg.group)
            assert cfg.pdl and not cfg.streaming_stores and not cfg.broadcast_blocks, (R, L, cfg)
            assert cfg.max_chunk_programs == max(1, P.LOOSE_PROGRAM_BUDGET // groups) and cfg.group <= P.LOOSE_MAX_GROUP
            continue
        streaming = 4 * R * L > P.STREAMING_STORE_BYTES
        assert (cfg.streaming_stores, cfg.pdl) == (streaming, not streaming), (R, L, cfg)
        assert cfg.num_warps == (4 if R < P.FEW_REQS or streaming else 1), (R, L, cfg)
        assert cfg.group == 1 or L <= P.MAX_BLOCK_T, (R, L, cfg)
        assert cfg.broadcast_blocks == cfg.prefix_first == (
            cfg.group == 1 and cfg.num_warps == 1 and R >= P.BROADCAST_REQS
            and P.BROADCAST_MIN_LEN <= L <= P.BROADCAST_MAX_LEN), (R, L, cfg)


def _interpreter_distinct(cfg: E.ExpandConfig, chunks: int = 3) -> tuple:
    """What changes a launch of ``cfg`` on a batch of at most ``chunks`` chunks per request: warps, PDL and the
    cache modifier do not change the result (the interpreter ignores them), a chunk cap above ``chunks`` neither."""
    return (cfg.block_t, cfg.group, cfg.prefix_u32, cfg.broadcast_blocks, cfg.prefix_first,
            min(cfg.max_chunk_programs, chunks))


EVERY_CONFIG = sorted({_interpreter_distinct(c): c for c in (E.expand_config(R, L, loose_bound=loose)
                                                           for R, L, loose in POLICY_GRID)}.items())


@pytest.mark.parametrize("i", range(len(EVERY_CONFIG)), ids=[
    f"{c.block_t}x{c.group}{'-u32' if c.prefix_u32 else ''}{'-bcast' if c.broadcast_blocks else ''}-cap"
    f"{min(c.max_chunk_programs, 3)}" for _, c in EVERY_CONFIG])
def test_every_config_expand_config_picks_matches_the_spec(i):
    # Each launch the rule can choose, on a small ragged batch that spans more than one request group and up to
    # three chunks per request (zeros included), at K = 1, 16 or 64 in turn; under a bound 3x the longest
    # request where the rule was the loose one (its chunk cap is what makes the programs stride).
    _, cfg = EVERY_CONFIG[i]
    K = (1, 16, 64)[i % 3]
    rng = random.Random(i)
    lens = [rng.randint(0, 2 * cfg.block_t + 3) for _ in range(cfg.group + 3)] + [0, 2 * cfg.block_t + 3]
    block_table, seq_lens, num_blocks = make_batch(lens, K, seed=i)
    ref_indices, ref_indptr = E.expand_page_indices_ref(block_table.cpu(), seq_lens.cpu(), K)
    out = torch.full((ref_indices.numel() + 5,), SENTINEL, dtype=torch.int32, device=DEV)
    indptr = torch.full((len(lens) + 1,), SENTINEL, dtype=torch.int32, device=DEV)
    bound = max(lens) * (3 if cfg.max_chunk_programs < 65535 else 1)
    E.expand_page_indices(block_table, seq_lens, K, out=out, kv_indptr=indptr, max_seq_len=bound, validate=False,
                          config=cfg)
    assert torch.equal(out[: ref_indices.numel()].cpu(), ref_indices) and torch.equal(indptr.cpu(), ref_indptr)
    assert (out[ref_indices.numel():] == SENTINEL).all(), "the kernel wrote past sum(seq_lens)"


@pytest.mark.parametrize("bound_factor", [1, 3, 40])
def test_loose_bound_expands_exactly(monkeypatch, bound_factor):
    # A bound far above the real lengths (ragged, zeros included), with the loose-bound launch: few programs that
    # stride over the chunks. The budget is shrunk so that the interpreter exercises the capped grid and the
    # group path with a small batch; every token is written once and nothing past sum(seq_lens).
    monkeypatch.setattr(P, "LOOSE_PROGRAM_BUDGET", 8)
    monkeypatch.setattr(P, "GROUP_PROGRAMS", 2)
    rng = random.Random(bound_factor)
    for lens in ([rng.randint(0, 90) for _ in range(5)] + [0, 90], [rng.randint(0, 20) for _ in range(9)] + [0]):
        block_table, seq_lens, num_blocks = make_batch(lens, 16, seed=bound_factor)
        bound = max(lens) * bound_factor
        cfg = E.expand_config(len(lens), bound, loose_bound=True)
        assert cfg.max_chunk_programs * -(-len(lens) // cfg.group) <= max(8, -(-len(lens) // cfg.group))
        assert (cfg.group > 1) == (len(lens) >= 4 * 2)  # the second batch runs the group path
        ref_indices, ref_indptr = E.expand_page_indices_ref(block_table.cpu(), seq_lens.cpu(), 16)
        out = torch.full((ref_indices.numel() + 5,), SENTINEL, dtype=torch.int32, device=DEV)
        indptr = torch.full((len(lens) + 1,), SENTINEL, dtype=torch.int32, device=DEV)
        E.expand_page_indices(block_table, seq_lens, 16, out=out, kv_indptr=indptr, max_seq_len=bound,
                              validate=False, config=cfg)
        assert torch.equal(out[: ref_indices.numel()].cpu(), ref_indices)
        assert torch.equal(indptr.cpu(), ref_indptr) and (out[ref_indices.numel():] == SENTINEL).all()
        meta = E.build_flat_decode_metadata(block_table, seq_lens, [1] * len(lens), 16, num_blocks=num_blocks,
                                            max_seq_len=bound, loose_bound=True)
        assert torch.equal(meta.kv_indices.cpu(), ref_indices) and torch.equal(meta.kv_indptr.cpu(), ref_indptr)


@pytest.mark.parametrize("field, value", [("block_t", 1000), ("block_t", 0), ("num_warps", 3), ("group", 6),
                                          ("group", True), ("max_chunk_programs", 0)])
def test_expand_config_rejects_bad_shapes(field, value):
    with pytest.raises(ValueError, match=f"ExpandConfig.{field} must be"):
        E.ExpandConfig(**{field: value})


def test_broadcast_blocks_needs_one_request_per_program():
    with pytest.raises(ValueError, match=r"broadcast_blocks applies to one-request programs: it needs group == 1"):
        E.ExpandConfig(group=4, broadcast_blocks=True)


def test_default_config_packs_many_short_requests(monkeypatch):
    # The default rule with groups, on a batch small enough for the interpreter (groups from 4 * 4 requests):
    # ragged short requests, zeros included, 37 requests in groups of 4 (the last group runs past the batch).
    monkeypatch.setattr(P, "GROUP_PROGRAMS", 4)
    rng = random.Random(21)
    lens = [rng.randint(0, 60) for _ in range(35)] + [0, 64]
    assert E.expand_config(len(lens), max(lens)).group == 8
    block_table, seq_lens, num_blocks = make_batch(lens, 16, seed=21)
    check_against_spec(block_table, seq_lens, 16, num_blocks=num_blocks)


# ----------------------------------------------------------------------------------------------
# GPU only: larger sizes and CUDA-graph capture
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("K", KS)
def test_gpu_large_against_pre_pr(K, dtype):
    rng = random.Random(K)
    lens = [rng.randint(0, 40_000) for _ in range(37)] + [0, 1, K - 1, K, K + 1, 97_003]
    block_table, seq_lens, num_blocks = make_batch(lens, K, seed=K, dtype=dtype)
    post = E.expand_page_indices(block_table, seq_lens, K, num_blocks=num_blocks)
    pre = E.expand_page_indices_pre_pr(block_table, seq_lens, K)
    assert torch.equal(pre[0], post[0]) and torch.equal(pre[1], post[1])
    serial = E.expand_page_indices_serial(block_table, seq_lens, K)
    assert torch.equal(serial[0], post[0])


@pytest.mark.gpu
@pytest.mark.parametrize("R, max_len", [(1000, 600), (5000, 200), (20_000, 40)])
def test_gpu_many_requests_default_config(R, max_len):
    """Large decode batches under expand_config's rule (one warp; request groups from 2048 short requests on),
    both the in-kernel prefix sum and the caller's kv_indptr, against the pre-PR path."""
    K = 16
    rng = random.Random(R)
    lens = [rng.randint(0, max_len) for _ in range(R - 2)] + [0, max_len]
    block_table, seq_lens, num_blocks = make_batch(lens, K, seed=R)
    pre = E.expand_page_indices_pre_pr(block_table, seq_lens, K)
    post = E.expand_page_indices(block_table, seq_lens, K, num_blocks=num_blocks)
    assert torch.equal(pre[0], post[0]) and torch.equal(pre[1], post[1])
    given = E.expand_page_indices(block_table, seq_lens, K, kv_indptr=pre[1].clone(), precomputed_kv_indptr=True)
    assert torch.equal(pre[0], given[0])


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_and_replay():
    K = 16
    block_table, seq_lens, num_blocks = make_batch([5000, 1, 0, 777], K, seed=9)
    cap = block_table.shape[1] * K
    E.validate_expand_inputs(block_table, seq_lens, K, num_blocks=num_blocks, max_seq_len=cap)
    out = torch.full((4 * cap + 11,), SENTINEL, dtype=torch.int32, device=DEV)
    indptr = torch.empty(5, dtype=torch.int32, device=DEV)
    graph = torch.cuda.CUDAGraph()
    E.expand_page_indices(block_table, seq_lens, K, out=out, kv_indptr=indptr, max_seq_len=cap, validate=False)
    with torch.cuda.graph(graph):
        E.expand_page_indices(block_table, seq_lens, K, out=out, kv_indptr=indptr, max_seq_len=cap, validate=False)
        with pytest.raises(RuntimeError, match="not allowed during CUDA-graph capture"):
            E.expand_page_indices(block_table, seq_lens, K, out=out, kv_indptr=indptr, max_seq_len=cap)
    # New inputs in the same buffers, then replay: the graph reads them.
    out.fill_(SENTINEL)
    seq_lens.copy_(torch.tensor([3, cap, 17, 0], dtype=seq_lens.dtype))
    block_table.copy_(block_table.flip(0))
    graph.replay()
    torch.cuda.synchronize()
    ref_indices, ref_indptr = E.expand_page_indices_ref(block_table.cpu(), seq_lens.cpu(), K)
    total = ref_indices.numel()
    assert torch.equal(out[:total].cpu(), ref_indices) and torch.equal(indptr.cpu(), ref_indptr)
    assert (out[total:] == SENTINEL).all()


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [E.ExpandConfig(block_t=256), E.ExpandConfig(block_t=256, num_warps=1, group=4)],
                         ids=["one-request-programs", "request-groups"])
def test_gpu_pdl_launch_waits_for_the_kernel_before(cfg):
    """With PDL (the default on sm_90+) an expansion may start while the kernel ahead of it runs. Each step
    below reads what the step before it has just written: torch copies write block_table and seq_lens, the
    expansion computes kv_indptr, and a second expansion reads that kv_indptr (the precomputed-kv_indptr path,
    also PDL-launched) right after the first one triggered its dependents. 40 steps in one CUDA graph, each with
    new inputs; every output must equal the spec's."""
    K, R, cap_blocks = 16, 24, 80
    g = torch.Generator().manual_seed(5)
    steps = []
    for i in range(40):
        lens = torch.randint(0, cap_blocks * K + 1, (R,), generator=g, dtype=torch.int32)
        table = torch.randperm(R * cap_blocks, generator=g, dtype=torch.int64)[: R * cap_blocks].reshape(R, -1)
        steps.append((table.to(torch.int32), lens))
    block_table = torch.zeros(R, cap_blocks, dtype=torch.int32, device=DEV)
    seq_lens = torch.zeros(R, dtype=torch.int32, device=DEV)
    src = [(t.to(DEV), n.to(DEV)) for t, n in steps]
    n_out = R * cap_blocks * K
    outs = torch.full((len(steps), 2, n_out), SENTINEL, dtype=torch.int32, device=DEV)
    indptrs = torch.zeros(len(steps), R + 1, dtype=torch.int32, device=DEV)
    max_len = cap_blocks * K

    def run_steps():
        for i, (t, n) in enumerate(src):
            block_table.copy_(t)
            seq_lens.copy_(n)
            EK._launch_expand(block_table, seq_lens, K, outs[i, 0], indptrs[i], max_len, cfg)
            EK._launch_expand(block_table, seq_lens, K, outs[i, 1], indptrs[i], max_len, cfg, indptr_in=True)

    run_steps()  # compile outside the graph
    outs.fill_(SENTINEL)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_steps()
    for _ in range(3):
        outs.fill_(SENTINEL)
        indptrs.zero_()
        graph.replay()
        torch.cuda.synchronize()
        for i, (t, n) in enumerate(steps):
            ref, ref_indptr = E.expand_page_indices_ref(t, n, K)
            total = ref.numel()
            assert torch.equal(indptrs[i].cpu(), ref_indptr), i
            for j in (0, 1):
                assert torch.equal(outs[i, j, :total].cpu(), ref), (i, j)
                assert (outs[i, j, total:] == SENTINEL).all(), (i, j)


def test_rows_before_offset_wrap():
    # 2**32 bytes / (576 values * 2 bytes) rows for bf16; twice as many for fp8 (aiter #2768).
    assert E.rows_before_offset_wrap(2) == 2**32 // 1152 == 3_728_270
    assert E.rows_before_offset_wrap(1) == 7_456_540
    assert E.rows_before_offset_wrap(2) * 1152 <= 2**32 < (E.rows_before_offset_wrap(2) + 1) * 1152


def test_committed_h200_results_and_figures(viz):
    from workbench.viz import expand as V

    results = V.load_expand_results()
    assert results["provenance"]["device"] == "NVIDIA H200"
    fig = viz.expand_bench_figure(results)
    assert len(fig.data) == 8 and len(fig.layout.updatemenus[0].buttons) == 2
    labels = list(fig.data[0].x)
    assert len(set(labels)) == len(results["cases"]), labels  # one distinct label per case
    assert {"1 x 97k", "256 x 4k", "512 x 128k", "1024 x 1000", "16384 x 32"} <= set(labels), labels
    loose = viz.loose_bound_figure(results)  # tight, loose_bound=True, default launch under the loose bound
    timed = [c for c in results["cases"] if "kernel_loose_bound_us" in c]
    assert len(loose.data) == 3 and list(loose.data[1].x) == [V.case_label(c) for c in timed]
    assert list(loose.data[1].y) == [c["kernel_loose_bound_us"] for c in timed]
    assert all(c["agree_loose_bound"] for c in timed) and all(c["seq_len"] < c["loose_bound"] for c in timed)
    with pytest.raises(ValueError, match="no loose-bound timings"):
        viz.loose_bound_figure(dict(results, cases=[{k: v for k, v in c.items() if "loose" not in k}
                                                    for c in results["cases"]]))
    heat = viz.expansion_figure(torch.tensor([[7, 3, 0], [2, 5, 9]]), [5, 9], 4)
    ref, _ = E.expand_page_indices_ref(torch.tensor([[7, 3, 0], [2, 5, 9]]), [5, 9], 4)
    labels = [x for row in heat.data[0].text for x in row if x]
    assert labels == [str(v) for v in ref.tolist()]


@pytest.mark.parametrize("K", [1, 16, 64])
def test_builder_takes_cpu_tensors_where_triton_compiles_for_a_gpu(monkeypatch, K):
    """On a GPU machine the kernel refuses CPU tensors; the builder (used by chapter 4's CPU-side models)
    then expands them with plain torch after the same validation, and must agree with the spec exactly."""
    monkeypatch.setattr(device, "interpreter_active", lambda: False)  # as on a GPU machine
    lens = edge_lens(K, seed=3)
    block_table, seq_lens, num_blocks = make_batch(lens, K, seed=3, device="cpu")
    meta = E.build_flat_decode_metadata(block_table, seq_lens, [1] * len(lens), K, num_blocks=num_blocks)
    ref_indices, ref_indptr = E.expand_page_indices_ref(block_table, seq_lens, K)
    assert torch.equal(meta.kv_indices, ref_indices) and torch.equal(meta.kv_indptr, ref_indptr)
    with pytest.raises(ValueError, match="block_table"):  # validation still runs on this path
        bad = block_table.clone()
        bad[next(r for r, n in enumerate(lens) if n > 0), 0] = -3  # a used entry of a non-empty request
        E.build_flat_decode_metadata(bad, seq_lens, [1] * len(lens), K)



# ----------------------------------------------------------------------------------------------
# issue #32: layouts the kernels do not assume, empty batches, argument types (tests/test_fuzz_expand.py draws
# all of these at random; these are the named cases)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", ["default", "chunk16", "group4-chunk16"])
def test_strided_seq_lens_are_copied_not_misread(config):
    # A stride-2 view of seq_lens was read as if contiguous: a wrong kv_indptr, then writes past the output.
    # It is accepted now, with a contiguous copy of its num_reqs entries before the launch.
    block_table, seq_lens, num_blocks = make_batch([5, 17, 0, 33], 16, seed=6)
    wide = torch.full((2 * 4,), -1, dtype=seq_lens.dtype, device=DEV)
    wide[::2] = seq_lens
    strided = wide[::2]
    assert not strided.is_contiguous() and torch.equal(strided, seq_lens)
    check_against_spec(block_table, strided, 16, num_blocks=num_blocks, config=CONFIGS[config])
    assert wide[1::2].eq(-1).all(), "the entries between the view's were changed"
    offset = torch.cat([torch.full((3,), -1, dtype=seq_lens.dtype, device=DEV), seq_lens])[3:]  # storage offset
    check_against_spec(block_table, offset, 16, num_blocks=num_blocks, config=CONFIGS[config])
    md = E.build_flat_decode_metadata(block_table, strided, [1] * 4, 16, num_blocks=num_blocks)
    ref_indices, ref_indptr = E.expand_page_indices_ref(block_table.cpu(), seq_lens.cpu(), 16)
    assert torch.equal(md.kv_indices.cpu(), ref_indices) and torch.equal(md.kv_indptr.cpu(), ref_indptr)
    for fn in (E.expand_page_indices_serial, E.expand_page_indices_pre_pr, E.expand_page_indices_dense):
        got = fn(block_table, strided, 16)
        assert torch.equal(got[0].cpu(), ref_indices) and torch.equal(got[1].cpu(), ref_indptr), fn.__name__


def _transposed(t: torch.Tensor) -> torch.Tensor:
    """The same values stored column-major: strides (1, num_reqs)."""
    return t.t().contiguous().t()


@pytest.mark.parametrize("layout", ["transposed", "every_other_column"])
@pytest.mark.parametrize("entry", ["expand_page_indices", "expand_page_indices_serial", "expand_page_indices_pre_pr",
                                   "expand_page_indices_dense", "validate_expand_inputs", "builder"])
def test_block_table_column_stride_other_than_1_is_refused(entry, layout):
    # The kernels (the serial one too) read a row's block ids as adjacent elements: a transposed table gave silently
    # wrong indices. Every expansion refuses it now, with the fix; any row stride stays accepted.
    block_table, seq_lens, _ = make_batch([5, 9, 30], 4, seed=2)
    if layout == "transposed":
        bad = _transposed(block_table)
    else:
        wide = torch.zeros((3, 2 * block_table.shape[1]), dtype=block_table.dtype, device=DEV)
        wide[:, ::2] = block_table
        bad = wide[:, ::2]
    assert torch.equal(bad, block_table) and bad.stride(1) != 1
    call = {"builder": lambda: E.build_flat_decode_metadata(bad, seq_lens, [1, 1, 1], 4),
            "validate_expand_inputs": lambda: E.validate_expand_inputs(bad, seq_lens, 4)}.get(
        entry, lambda: getattr(E, entry)(bad, seq_lens, 4))
    with pytest.raises(ValueError, match=r"block_table has strides \(1, 3\)|block_table has strides \(\d+, 2\)") as exc:
        call()
    assert "column stride 1" in str(exc.value) and "pass block_table.contiguous()" in str(exc.value)
    check_against_spec(bad.contiguous(), seq_lens, 4)  # the fix the message gives


def test_layouts_whose_column_stride_does_not_matter_are_accepted():
    # One column (or one request of a transposed table) has column stride 1 or never steps along it; a row broadcast
    # over every request (row stride 0) is read correctly as it is.
    block_table, seq_lens, _ = make_batch([3, 4, 2], 4, seed=3, pad_blocks=0)
    check_against_spec(_transposed(block_table), seq_lens, 4)  # width 1
    one, lens1, _ = make_batch([9], 4, seed=4)
    check_against_spec(_transposed(one), lens1, 4)
    row = torch.tensor([[5, 2, 7]], dtype=torch.int32, device=DEV).expand(3, -1)
    assert row.stride() == (0, 1)
    check_against_spec(row, torch.tensor([12, 0, 7], dtype=torch.int32, device=DEV), 4)


@pytest.mark.parametrize("config", ["default", "group4-chunk16"])
def test_out_sharing_memory_with_kv_indptr_or_the_inputs_is_refused(config):
    block_table, seq_lens, _ = make_batch([5, 9], 4, seed=1)
    shared = torch.full((3 + 14,), SENTINEL, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="out shares memory with kv_indptr"):
        E.expand_page_indices(block_table, seq_lens, 4, out=shared[2:], kv_indptr=shared[:3], config=CONFIGS[config])
    assert (shared == SENTINEL).all(), "nothing may be written before the refusal"
    lens32 = seq_lens.to(torch.int32)
    with pytest.raises(ValueError, match="out shares memory with seq_lens"):
        E.expand_page_indices(block_table, lens32, 4, out=lens32, validate=False, max_seq_len=9)
    with pytest.raises(ValueError, match="kv_indptr shares memory with block_table"):
        E.expand_page_indices(block_table, seq_lens, 4, kv_indptr=block_table.view(-1)[:3].to(torch.int32)
                              if block_table.dtype != torch.int32 else block_table.view(-1)[:3])
    # side by side in one buffer, not overlapping: accepted
    check = torch.full((3 + 14 + 2,), SENTINEL, dtype=torch.int32, device=DEV)
    kv_indices, kv_indptr = E.expand_page_indices(block_table, seq_lens, 4, out=check[3:], kv_indptr=check[:3],
                                                  config=CONFIGS[config])
    ref_indices, ref_indptr = E.expand_page_indices_ref(block_table.cpu(), seq_lens.cpu(), 4)
    assert torch.equal(kv_indices.cpu(), ref_indices) and torch.equal(kv_indptr.cpu(), ref_indptr)
    assert (check[3 + 14:] == SENTINEL).all()


@pytest.mark.parametrize("width", [0, 3])
def test_empty_batch_on_every_path(width):
    # expand_page_indices_pre_pr failed on an empty batch with an unrelated reshape error; every path gives the
    # empty result now: no indices and kv_indptr [0].
    block_table = torch.zeros((0, width), dtype=torch.int32, device=DEV)
    seq_lens = torch.zeros(0, dtype=torch.int32, device=DEV)
    for fn in (E.expand_page_indices, E.expand_page_indices_pre_pr, E.expand_page_indices_serial,
               E.expand_page_indices_dense):
        kv_indices, kv_indptr = fn(block_table, seq_lens, 16)
        assert kv_indices.numel() == 0 and kv_indptr.tolist() == [0] and kv_indptr.dtype == torch.int32, fn.__name__
    zero_len = torch.zeros((2, width), dtype=torch.int32, device=DEV)  # two requests of zero tokens
    for fn in (E.expand_page_indices, E.expand_page_indices_pre_pr, E.expand_page_indices_serial,
               E.expand_page_indices_dense):
        kv_indices, kv_indptr = fn(zero_len, torch.zeros(2, dtype=torch.int64, device=DEV), 16)
        assert kv_indices.numel() == 0 and kv_indptr.tolist() == [0, 0, 0], fn.__name__


def test_pre_pr_splits_padding_ids_in_int64():
    # The K = 1 split covers the whole table, padding included; a padding id times K beyond int32 must not make
    # the split refuse (or wrap): only the used ids are bound by int32.
    block_table = torch.tensor([[3, 2**30], [5, 0]], dtype=torch.int32, device=DEV)
    seq_lens = torch.tensor([16, 20], dtype=torch.int32, device=DEV)
    pre = E.expand_page_indices_pre_pr(block_table, seq_lens, 16)
    ref = E.expand_page_indices_ref(block_table.cpu(), seq_lens.cpu(), 16)
    assert torch.equal(pre[0].cpu(), ref[0]) and torch.equal(pre[1].cpu(), ref[1])


@pytest.mark.parametrize("entry", ["expand_page_indices", "expand_page_indices_serial", "expand_page_indices_pre_pr",
                                   "expand_page_indices_dense", "builder"])
def test_a_list_block_table_is_a_type_error_naming_it(entry):
    # It raised AttributeError ('list' object has no attribute 'is_cuda') from expand_page_indices.
    args = ([[1, 2]], torch.tensor([3], dtype=torch.int32), 16)
    with pytest.raises(TypeError,
                       match="block_table must be a torch.Tensor, got list; convert it with torch.as_tensor"):
        if entry == "builder":
            E.build_flat_decode_metadata(args[0], args[1], [1], 16)
        else:
            getattr(E, entry)(*args)
    for validate in (True, False):
        with pytest.raises(TypeError, match="block_table must be a torch.Tensor"):
            E.expand_page_indices([[1, 2]], torch.tensor([3]), 16, validate=validate)


@pytest.mark.parametrize("config", ["chunk16", {"block_t": 16}, 16, (16, 4)], ids=["str", "dict", "int", "tuple"])
def test_a_config_of_the_wrong_type_is_a_type_error_naming_it(config):
    # It raised AttributeError ('str' object has no attribute 'group').
    block_table, seq_lens, _ = make_batch([5, 9], 4)
    with pytest.raises(TypeError,
                       match=r"config must be an ExpandConfig or None .* pass workbench.expand.ExpandConfig"):
        E.expand_page_indices(block_table, seq_lens, 4, config=config)


def test_dense_baseline_now_validates():
    # The plain-torch baseline clamped a length past its row to the row's last block (a silently wrong answer);
    # it takes the same checks as the kernel now (validate=False skips the value checks, for timing).
    block_table, seq_lens = _bt([1, 2]), _bt(33)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 33 exceeds what its block_table row holds"):
        E.expand_page_indices_dense(block_table, seq_lens, 16)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = -1 is negative"):
        E.expand_page_indices_dense(block_table, _bt(-1), 16)
    with pytest.raises(TypeError, match="seq_lens must have dtype"):
        E.expand_page_indices_dense(block_table, torch.tensor([3.0]), 16, validate=False)


def test_builder_refuses_query_lens_beyond_int32():
    block_table, seq_lens, _ = make_batch([3, 4], 16)
    with pytest.raises(ValueError, match=r"sum\(query_lens\) = 2147483648 exceeds int32"):
        E.build_flat_decode_metadata(block_table, seq_lens, [2**30, 2**30], 16)
