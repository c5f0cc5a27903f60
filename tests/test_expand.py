"""workbench.expand: the kernel against the loop spec, the pre-PR path, the builder, every input check.

Scenarios follow vLLM's attention tests: block 0 is reserved (never handed out), physical blocks are
a random permutation, rows carry padding past the blocks a request uses, and output buffers are
pre-filled with a sentinel so that a write outside ``[0, sum(seq_lens))`` shows up.
On CPU the kernels run under the Triton interpreter, so sizes stay small.
"""

from __future__ import annotations

import dataclasses
import json
import random
from importlib import resources

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
    "chunk16-requests-first": E.ExpandConfig(block_t=16, chunks_first=False),
    "chunk16-prefix-u32": E.ExpandConfig(block_t=16, prefix_u32=True),
    # several requests per program, a (group, block_t) tile: rows of different lengths in one tile, groups that
    # run past the last request, and chunks the tile strides over when a request is longer than block_t
    "group4-chunk16": E.ExpandConfig(block_t=16, group=4),
    "group8-chunk32-stride2-u32": E.ExpandConfig(block_t=32, group=8, max_chunk_programs=2, prefix_u32=True),
    "group2-chunk16-requests-first": E.ExpandConfig(block_t=16, group=2, chunks_first=False),
    # the prefix sum in a wide accumulator, 16-byte loads and a tail of at most 3 (one-warp programs)
    "chunk16-1warp-wide": E.ExpandConfig(block_t=16, num_warps=1, wide_prefix=True),
    "group4-chunk16-wide-u32": E.ExpandConfig(block_t=16, num_warps=1, group=4, wide_prefix=True, prefix_u32=True),
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
                                    "chunk16-1warp-wide", "group4-chunk16-wide-u32"])
def test_prefix_sum_over_several_steps(config):
    # More requests than seq_lens summed per step (1024 by default; 32, the least, here): the prefix sum loops,
    # three steps for the last requests.
    rng = random.Random(11)
    lens = [rng.randint(0, 40) for _ in range(77)]
    block_table, seq_lens, num_blocks = make_batch(lens, 16, seed=11)
    check_against_spec(block_table, seq_lens, 16, num_blocks=num_blocks,
                       config=dataclasses.replace(CONFIGS[config], prefix_block=32))


@pytest.mark.parametrize("config", ["chunk16", "group2-chunk16-requests-first", "group4-chunk16"])
def test_more_requests_than_grid_axis_1_allows(monkeypatch, config):
    # Chunks-first puts requests (or groups of them) on grid axis 1 (65535 at most on a GPU; 2 here): beyond
    # that the launch falls back to requests first, with the same result (group 4: 2 groups, no fallback).
    monkeypatch.setattr(E, "GRID_AXIS1_MAX", 2)
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


@pytest.mark.skipif(device.on_gpu(), reason="checks the interpreter's device rule (CPU only)")
def test_interpreter_refuses_non_cpu_tensors():
    bt = torch.ones((1, 2), dtype=torch.int32, device="meta")
    sl = torch.ones(1, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="needs CPU tensors"):
        E.expand_page_indices(bt, sl, 16, out=torch.empty(4, dtype=torch.int32, device="meta"),
                              kv_indptr=torch.empty(2, dtype=torch.int32, device="meta"), max_seq_len=4, validate=False)


def test_expand_config_rule():
    """The launch rule of expand_config (chosen from the eighth session's H200 sweep; the numbers are in its
    docstring): 4 warps for few requests and for streaming outputs, 1 warp otherwise; chunks of
    next_pow2(max_seq_len) up to 1024; request groups only for many short requests."""
    few, mid, big = E.expand_config(1, 97_000), E.expand_config(256, 4_096), E.expand_config(512, 131_072)
    assert (few.num_warps, few.block_t, few.group, few.pdl) == (4, 1024, 1, True)
    assert (mid.num_warps, mid.block_t, mid.group, mid.prefix_u32) == (1, 1024, 1, False)
    assert (big.num_warps, big.group, big.streaming_stores, big.pdl) == (4, 1, True, False)
    assert E.expand_config(1000, 300).block_t == 512 and E.expand_config(3, 0).block_t == 16
    for R in (2 * E.GROUP_PROGRAMS, 4 * E.GROUP_PROGRAMS - 1):  # groups of 2 never pay: none below 4 per group
        assert E.expand_config(R, 100).group == 1
    assert E.expand_config(100_000, 4_096).group == 1  # long requests keep the 16-byte vector stores
    for R, L, g in ((2048, 200, 4), (4096, 100, 8), (4096, 999, 4), (8192, 64, 16), (16_384, 32, 32)):
        cfg = E.expand_config(R, L)
        assert cfg.group == g and cfg.num_warps == 1 and cfg.group * cfg.block_t <= 4096, (R, L, cfg)
        assert cfg.prefix_u32, (R, L, cfg)  # the uint32 prefix sum with groups
        assert not (cfg.prefix_first or cfg.broadcast_blocks), (R, L, cfg)  # one-request programs only
        assert cfg.block_t >= L and R // cfg.group >= E.GROUP_PROGRAMS, (R, L, cfg)
        assert R // cfg.group < 2 * E.GROUP_PROGRAMS or cfg.group * cfg.block_t == 4096, (R, L, cfg)  # tile cap


def test_expand_config_many_short_requests_rule():
    """From BROADCAST_REQS one-request programs (one warp, no groups, tight bound) whose max_seq_len lies in
    BROADCAST_MIN_LEN..BROADCAST_MAX_LEN: prefix_first, prefix_u32 and broadcast_blocks together (nineteenth
    session, numbers in the docstring); off below that many requests, outside those lengths, with 4 warps, with
    groups and with a loose bound."""
    def three(cfg):
        return (cfg.prefix_first, cfg.prefix_u32, cfg.broadcast_blocks)

    n, low, top = E.BROADCAST_REQS, E.BROADCAST_MIN_LEN, E.BROADCAST_MAX_LEN
    assert E.expand_config(n, low).block_t == 512  # the rule starts where chunks reach 512 tokens
    for R, L in ((n, 1024), (1024, 1000), (1536, 700), (1000, 300), (n, top), (4096, top), (2 * n - 1, low)):
        cfg = E.expand_config(R, L)
        assert (cfg.group, cfg.num_warps) == (1, 1) and three(cfg) == (True, True, True), (R, L, cfg)
    for R, L in ((n - 1, 1000), (256, 4096), (n, top + 1), (1536, 3000), (1024, 4096), (1, 97_000), (n, 16),
                 (600, 100), (2047, low - 1)):
        assert three(E.expand_config(R, L)) == (False, False, False), (R, L)
    assert E.expand_config(4 * E.GROUP_PROGRAMS, 1000).group > 1  # groups take over: their own rule
    assert three(E.expand_config(4 * E.GROUP_PROGRAMS, 1000))[::2] == (False, False)
    assert three(E.expand_config(1024, 1000, loose_bound=True))[::2] == (False, False)


def test_expand_config_loose_bound_rule():
    """expand_config(loose_bound=True): about LOOSE_PROGRAM_BUDGET programs in all whatever the bound (chunk
    programs capped; they stride), one warp from FEW_REQS requests, request groups for big batches even with long
    bounds, PDL on and no streaming stores (the output size is unknown). The numbers are in its docstring."""
    budget = E.LOOSE_PROGRAM_BUDGET
    for R, bound in ((1, 131_072), (32, 131_072), (256, 131_072), (256, 32_768), (1024, 131_072), (1024, 1000),
                     (16_384, 131_072), (3, 0)):
        cfg = E.expand_config(R, bound, loose_bound=True)
        groups = -(-R // cfg.group)
        assert cfg.max_chunk_programs == max(1, budget // groups), (R, bound, cfg)
        assert cfg.pdl and not cfg.streaming_stores, (R, bound, cfg)
        assert cfg.num_warps == (4 if R < E.FEW_REQS else 1), (R, bound, cfg)
        assert cfg.group * cfg.block_t <= max(4096, E.expand_config(R, bound).block_t), (R, bound, cfg)
        if cfg.group == 1:
            assert cfg.block_t == E.expand_config(R, bound).block_t, (R, bound, cfg)
    assert E.expand_config(1, 131_072, loose_bound=True).max_chunk_programs >= 97_000 // 1024  # 1 x 97k keeps 95
    for R, g in ((2048, 4), (4096, 8), (8192, 16), (16_384, 32), (100_000, 32)):  # as for short requests, <= 32
        cfg = E.expand_config(R, 131_072, loose_bound=True)
        assert (cfg.group, cfg.block_t, cfg.prefix_u32) == (g, 4096 // g, True), (R, cfg)
        assert cfg.max_chunk_programs == max(1, budget // -(-R // g)), (R, cfg)
    assert E.expand_config(4 * E.GROUP_PROGRAMS, 64, loose_bound=True).block_t == 64  # a short bound stays
    assert E.expand_config(4 * E.GROUP_PROGRAMS - 1, 131_072, loose_bound=True).group == 1


@pytest.mark.parametrize("bound_factor", [1, 3, 40])
def test_loose_bound_expands_exactly(monkeypatch, bound_factor):
    # A bound far above the real lengths (ragged, zeros included), with the loose-bound launch: few programs that
    # stride over the chunks. The budget is shrunk so that the interpreter exercises the capped grid and the
    # group path with a small batch; every token is written once and nothing past sum(seq_lens).
    monkeypatch.setattr(E, "LOOSE_PROGRAM_BUDGET", 8)
    monkeypatch.setattr(E, "GROUP_PROGRAMS", 2)
    rng = random.Random(bound_factor)
    for lens in ([rng.randint(0, 90) for _ in range(5)] + [0, 90], [rng.randint(0, 20) for _ in range(9)] + [0]):
        block_table, seq_lens, num_blocks = make_batch(lens, 16, seed=bound_factor)
        bound = max(lens) * bound_factor
        cfg = E.expand_config(len(lens), bound, loose_bound=True)
        assert cfg.max_chunk_programs * -(-len(lens) // cfg.group) <= max(8, -(-len(lens) // cfg.group))
        assert (cfg.group > 1) == (len(lens) >= 4 * 2)  # the second batch runs the group path
        ref_indices, ref_indptr = E.expand_page_indices_ref(block_table.cpu(), seq_lens.cpu(), 16)
        for skip in (True, False):  # chunk programs with nothing to store skip their prefix sum, or (as before) not
            out = torch.full((ref_indices.numel() + 5,), SENTINEL, dtype=torch.int32, device=DEV)
            indptr = torch.full((len(lens) + 1,), SENTINEL, dtype=torch.int32, device=DEV)
            E.expand_page_indices(block_table, seq_lens, 16, out=out, kv_indptr=indptr, max_seq_len=bound,
                                  validate=False, config=dataclasses.replace(cfg, skip_idle_prefix=skip))
            assert torch.equal(out[: ref_indices.numel()].cpu(), ref_indices), skip
            assert torch.equal(indptr.cpu(), ref_indptr) and (out[ref_indices.numel():] == SENTINEL).all(), skip
        meta = E.build_flat_decode_metadata(block_table, seq_lens, [1] * len(lens), 16, num_blocks=num_blocks,
                                            max_seq_len=bound, loose_bound=True)
        assert torch.equal(meta.kv_indices.cpu(), ref_indices) and torch.equal(meta.kv_indptr.cpu(), ref_indptr)


@pytest.mark.parametrize("field, value", [("block_t", 1000), ("block_t", 0), ("num_warps", 3), ("group", 6),
                                          ("group", True), ("max_chunk_programs", 0), ("prefix_block", 16)])
def test_expand_config_rejects_bad_shapes(field, value):
    with pytest.raises(ValueError, match=f"ExpandConfig.{field} must be"):
        E.ExpandConfig(**{field: value})


def test_broadcast_blocks_needs_one_request_per_program():
    with pytest.raises(ValueError, match=r"broadcast_blocks applies to one-request programs: it needs group == 1"):
        E.ExpandConfig(group=4, broadcast_blocks=True)


def test_default_config_packs_many_short_requests(monkeypatch):
    # The default rule with groups, on a batch small enough for the interpreter (groups from 4 * 4 requests):
    # ragged short requests, zeros included, 37 requests in groups of 4 (the last group runs past the batch).
    monkeypatch.setattr(E, "GROUP_PROGRAMS", 4)
    rng = random.Random(21)
    lens = [rng.randint(0, 60) for _ in range(35)] + [0, 64]
    assert E.expand_config(len(lens), max(lens)).group == 8
    block_table, seq_lens, num_blocks = make_batch(lens, 16, seed=21)
    check_against_spec(block_table, seq_lens, 16, num_blocks=num_blocks)


# ----------------------------------------------------------------------------------------------
# GPU only: larger sizes and CUDA-graph capture
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not device.on_gpu(), reason="no GPU: large sizes need compiled kernels")
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
@pytest.mark.skipif(not device.on_gpu(), reason="no GPU: large sizes need compiled kernels")
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
@pytest.mark.skipif(not device.on_gpu(), reason="no GPU: CUDA graphs need one")
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
@pytest.mark.skipif(not device.on_gpu(), reason="no GPU: PDL and CUDA graphs need one")
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
            E._launch_expand(block_table, seq_lens, K, outs[i, 0], indptrs[i], max_len, cfg)
            E._launch_expand(block_table, seq_lens, K, outs[i, 1], indptrs[i], max_len, cfg, indptr_in=True)

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


# ----------------------------------------------------------------------------------------------
# the benchmark's bookkeeping (no timing here: benchmarks are not tests)
# ----------------------------------------------------------------------------------------------


def test_bench_byte_formula_and_bars():
    from workbench.bench import expand as B

    # 4 bytes per block-table entry read (ceil) + 4 bytes per token written.
    assert B.expand_bytes([0, 1, 16, 17], 16) == 4 * (0 + 1 + 1 + 2) + 4 * (0 + 1 + 16 + 17)
    cases = [
        {"num_reqs": 512, "seq_len": 131_072, "K": 16, "kernel_frac_copy": 0.93},
        {"num_reqs": 1, "seq_len": 97_000, "K": 16, "kernel_us": 2.5, "speedup_vs_serial": 12.0},
        {"num_reqs": 256, "seq_len": 4_096, "K": 16, "kernel_us": 1.9},
    ]
    verdicts = {b["name"]: b["verdict"] for b in B.check_bars(cases)}
    assert verdicts == {
        "bandwidth at 512 x 128k": "PASS", "latency at 1 x 97k": "MISS",
        "latency at 256 x 4k": "PASS", "speed-up over serial at 1 x 97k": "PASS",
    }
    assert B.check_bars(cases[2:]) == [b for b in B.check_bars(cases) if b["case"] == (256, 4_096)]


def test_bench_sweep_variants_compute_the_expansion():
    # Every --sweep variant (run here once, untimed) must produce the spec's output; store_only writes 0..n-1.
    from workbench.bench import expand as B

    for lens in ([1500, 37, 0, 1031], [1024, 1024]):
        block_table, seq_lens, _ = make_batch(lens, 16, seed=len(lens))
        ref, ref_indptr = E.expand_page_indices_ref(block_table.cpu(), seq_lens.cpu(), 16)
        for v in B.SWEEP:
            out = torch.full((ref.numel(),), SENTINEL, dtype=torch.int32, device=DEV)
            indptr = ref_indptr.to(DEV) if v.indptr_in else torch.empty_like(ref_indptr, device=DEV)
            fn, cfg = B._variant_launcher(v, block_table, seq_lens, 16, out, indptr, max(lens))
            fn()
            if v.kernel == "store_only":
                assert torch.equal(out.cpu(), torch.arange(ref.numel(), dtype=torch.int32)), v.label
            else:
                assert torch.equal(out.cpu(), ref) and torch.equal(indptr.cpu(), ref_indptr), v.label
    # The table prints a sweep (rows x cases) without error.
    payload = json.loads(resources.files("workbench.data").joinpath("bench_expand_h200.json").read_text())
    for c in payload["cases"][:2]:
        c["sweep"] = [{"label": v.label, "us": 1.0 + i, "agree": i != 1} for i, v in enumerate(B.SWEEP)]
    table = B.format_table(payload)
    assert "v1 (output-aligned chunks)" in table and "2.00!" in table


def test_probe_ranges_spread_and_same_round_differences():
    from workbench.bench import expand as B

    def row(rnd, label, us, agree=True, R=256, L=4096):
        return dict(round=rnd, R=R, L=L, label=label, us=us, agree=agree)

    runs = [{"rows": [row(0, "floor", 1.7), row(0, "k", 2.0), row(1, "floor", 1.9), row(1, "k", 2.1, agree=None),
                      row(0, "k", 9.0, R=1, L=97000)]},
            {"rows": [row(0, "floor", 1.6), row(0, "k", 2.2, agree=False), row(0, "solo", 3.0), row(1, "solo", 3.5),
                      row(1, "once", 1.0)]}]
    got = B.probe_ranges(runs, 256, 4096, over="floor")
    assert list(got) == ["floor", "k", "solo", "once"]  # first-seen order; the 1 x 97000 row is another batch
    k = got["k"]
    assert (k["lo"], k["hi"], k["n"], k["agree"]) == (2.0, 2.2, 3, False)
    # differences taken within one run and round: 2.0 - 1.7, 2.1 - 1.9, 2.2 - 1.6
    assert k["over_lo"] == pytest.approx(0.2) and k["over_hi"] == pytest.approx(0.6)
    assert got["floor"]["over_lo"] == got["floor"]["over_hi"] == 0.0
    # run 2 has no floor in round 1: a label timed there gets no difference at all, not one from a subset
    assert "over_lo" not in got["solo"] and "over_lo" not in got["once"] and got["solo"]["n"] == 2
    assert B.probe_ranges(runs[:1], 256, 4096)["k"]["agree"] is True
    assert "over_lo" not in B.probe_ranges(runs, 256, 4096)["k"]  # no reference asked for
    with pytest.raises(ValueError, match="over='nope'"):
        B.probe_ranges(runs, 256, 4096, over="nope")


def test_committed_chain_probe_backs_chapter_2():
    # The nineteenth session's probes at 256 x 4k (chapter 2, "The chain, link by link"): every output agreed
    # with its reference, and the default library call never went under the 2 us bar in them.
    from workbench.bench import expand as B

    payload = json.loads(resources.files("workbench.data").joinpath("bench_expand_h200.json").read_text())
    runs = payload["chain_probe"]["runs"]
    assert [r["name"] for r in runs] == ["floor", "hotspot", "order", "chain", "chain2"]
    assert all(r["provenance"]["device"] == "NVIDIA H200" for r in runs)
    assert all(row.get("agree") is not False for r in runs for row in r["rows"])
    chain = B.probe_ranges(runs[3:], 256, 4096, over="store only")
    assert chain["library"]["lo"] > 2.0 and chain["library"]["n"] == 14
    everything = B.probe_ranges(runs, 256, 4096)
    assert everything["library"]["lo"] > 2.0


@pytest.mark.gpu
@pytest.mark.skipif(not device.on_gpu(), reason="no GPU: the probes' timing needs CUDA graphs")
def test_probe_helpers_check_what_each_variant_left():
    # bench.expand.probe_batch and time_probe_variants (the expansion probes' batch and timing loop): a variant is
    # judged by what it left in out and kv_indptr, each buffer reset to -1 before it, and unchecked stays None
    from workbench.bench import expand as B

    bt, sl, ref_out, ref_indptr, out, indptr = B.probe_batch(5, 300, 16, ragged=True, seed=3)
    assert 1 <= int(sl.min()) and int(sl.max()) <= 300 and out.numel() == int(sl.sum()) == int(ref_indptr[-1])

    def library():
        E.expand_page_indices(bt, sl, 16, out=out, kv_indptr=indptr, max_seq_len=300, validate=False)

    def out_only():  # leaves kv_indptr at the -1 it was reset to
        out.fill_(0)

    rows = B.time_probe_variants([("right", library, ref_out, ref_indptr), ("wrong", library, ref_out + 1, None),
                                  ("no kv_indptr", out_only, None, ref_indptr), ("unchecked", library, None, None)],
                                 out, indptr, round=2, R=5, L=300)
    assert [r["agree"] for r in rows] == [True, False, False, None]
    assert all(r["us"] > 0 and (r["round"], r["R"], r["L"]) == (2, 5, 300) for r in rows)


def test_bench_cli_without_gpu_says_why(capsys):
    from workbench import cli

    if device.on_gpu():
        pytest.skip("this checks the message on a machine without a GPU")
    assert cli.main(["bench", "expand", "--case", "1x100", "--out", "/dev/null"]) == 2
    assert "need a CUDA or ROCm GPU" in capsys.readouterr().err
    assert cli.main(["bench", "expand", "--case", "1y100"]) == 2
    assert "--case must look like 256x4096" in capsys.readouterr().err


def test_rows_before_offset_wrap():
    # 2**32 bytes / (576 values * 2 bytes) rows for bf16; twice as many for fp8 (aiter #2768).
    assert E.rows_before_offset_wrap(2) == 2**32 // 1152 == 3_728_270
    assert E.rows_before_offset_wrap(1) == 7_456_540
    assert E.rows_before_offset_wrap(2) * 1152 <= 2**32 < (E.rows_before_offset_wrap(2) + 1) * 1152


def test_committed_h200_results_and_figures():
    pytest.importorskip("plotly", reason="plotly is not installed (the GPU machine's image lacks it); figures need it")
    from workbench import viz
    from workbench.bench import expand as B
    from workbench.viz import expand as V

    results = V.load_expand_results()
    assert results["provenance"]["device"] == "NVIDIA H200"
    shapes = {(c["num_reqs"], c["seq_len"]) for c in results["cases"]}
    assert set(B.CASES) <= shapes
    for c in results["cases"]:  # the JSON's bytes follow the formula stated in the benchmark
        assert c["bytes"] == B.expand_bytes([c["seq_len"]] * c["num_reqs"], c["K"])
    assert [b["verdict"] for b in results["bars"]] == [b["verdict"] for b in B.check_bars(results["cases"])]
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
        viz.loose_bound_figure(dict(results, cases=results["run_eighth_session"]["cases"]))
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

