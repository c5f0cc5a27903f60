"""workbench.blocksize: the selection rule, errors, catalog, groups, hybrid split, reports, figures, CLI.

The conformance of :func:`select_common_block_size` with the *real* vLLM lives in
``test_blocksize_vllm_conformance.py``; here it is compared with a short spec written from vLLM's
documented rule, and the named scenarios of the PR are checked.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench import blocksize as bs
from workbench import viz
from workbench.blocksize import MultipleOf
from workbench.cli import main

REPO = pathlib.Path(__file__).resolve().parents[1]


# ---- the spec: vLLM's rule, stated as plainly as possible --------------------------------------

def accepts_ref(decl, size):
    return any(size == e if isinstance(e, int) else size % e.base == 0 for e in decl)


def select_ref(n, decls):
    """n if every backend accepts it, else the largest declared exact size dividing n that all accept."""
    if all(accepts_ref(d, n) for d in decls):
        return n
    cands = [e for d in decls for e in d if isinstance(e, int) and n % e == 0 and all(accepts_ref(x, e) for x in decls)]
    return max(cands) if cands else None


entries = st.one_of(st.sampled_from([1, 2, 3, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256]),
                    st.builds(MultipleOf, st.sampled_from([1, 2, 3, 8, 16, 32, 48, 64, 128])))
declarations = st.lists(st.lists(entries, min_size=1, max_size=4), min_size=1, max_size=4)
manager_sizes = st.one_of(st.sampled_from([1, 2, 3, 16, 32, 48, 64, 96, 128, 256, 1024]), st.integers(1, 1100))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(n=manager_sizes, decls=declarations)
def test_select_matches_spec(n, decls):
    want = select_ref(n, decls)
    if want is None:
        with pytest.raises(bs.BlockSizeError) as info:
            bs.select_common_block_size(n, decls)
        assert str(info.value).startswith(f"No common block size for {n}. ")
    else:
        assert bs.select_common_block_size(n, decls) == want
        assert n % want == 0  # the kernel block always divides the manager block


# ---- MultipleOf and the docs notation ----------------------------------------------------------

def test_multiple_of_value_semantics():
    assert MultipleOf(16) == MultipleOf(16) and MultipleOf(16) != MultipleOf(32) and MultipleOf(16) != 16
    assert len({MultipleOf(16), MultipleOf(16), MultipleOf(1)}) == 2
    assert repr(MultipleOf(16)) == "MultipleOf(16)"
    assert MultipleOf(np.int64(8)).base == 8
    with pytest.raises(AttributeError):
        MultipleOf(16).base = 8


@pytest.mark.parametrize("base", [0, -16, True, 1.5, "16", None])
def test_multiple_of_rejects_bad_base(base):
    with pytest.raises(ValueError, match="base must be a positive integer"):
        MultipleOf(base)


@pytest.mark.parametrize("text, sizes", [
    ("%16", [MultipleOf(16)]), ("16, 32, 64", [16, 32, 64]), ("Any", [MultipleOf(1)]), ("%1", [MultipleOf(1)]),
    ("1, %16", [1, MultipleOf(16)]), (" % 16 ,128", [MultipleOf(16), 128]),
])
def test_parse_sizes(text, sizes):
    assert bs.parse_sizes(text) == sizes
    assert bs.parse_sizes(bs.format_sizes(sizes)) == sizes


def test_format_sizes():
    assert bs.format_sizes([MultipleOf(16), 32]) == "%16, 32"
    assert bs.format_sizes([MultipleOf(1)]) == "%1"


@pytest.mark.parametrize("text", ["", "16,", "x16", "%", "16.0", "%0", "0", "-16", "%-1"])
def test_parse_sizes_rejects(text):
    with pytest.raises(ValueError, match="text="):
        bs.parse_sizes(text)


def test_parse_and_format_reject_wrong_types():
    with pytest.raises(TypeError, match="expected a string"):
        bs.parse_sizes([16])
    with pytest.raises(ValueError, match="cannot format"):
        bs.format_sizes(["x"])
    with pytest.raises(TypeError, match="expected a list"):
        bs.format_sizes("%16")


@pytest.mark.parametrize("sizes, block, want", [
    ([MultipleOf(16)], 16, True), ([MultipleOf(16)], 48, True), ([MultipleOf(16)], 8, False),
    ([1], 1, True), ([1], 16, False), ([MultipleOf(1)], 7, True), ([16, 32, 64], 48, False), ([16, 32, 64], 64, True),
])
def test_supports_block_size(sizes, block, want):
    assert bs.supports_block_size(sizes, block) is want


@pytest.mark.parametrize("block", [0, -1, True, 2.0, "16"])
def test_supports_block_size_rejects_bad_size(block):
    with pytest.raises(ValueError, match="block_size=.*positive integer"):
        bs.supports_block_size([MultipleOf(1)], block)


# ---- select_common_block_size: scenarios, inputs, errors ---------------------------------------

def test_pr_39616_scenario():
    before = [bs.get_backend("ROCM_AITER_MLA", "0.19"), bs.get_backend("ROCM_ATTN", "0.19")]
    after = [bs.get_backend("ROCM_AITER_MLA", "0.20"), bs.get_backend("ROCM_ATTN", "0.20")]
    with pytest.raises(bs.BlockSizeError, match=r"^No common block size for 16\. "):
        bs.select_common_block_size(16, before)
    assert bs.select_common_block_size(16, after) == 16
    # Alone, the pre-PR backend ran with kernel block 1: every block of 16 split into 16.
    assert bs.select_common_block_size(16, before[:1]) == 1
    # After the PR, --block-size 1 with an Eagle3 draft still fails.
    with pytest.raises(bs.BlockSizeError, match=r"^No common block size for 1\. "):
        bs.select_common_block_size(1, after)


@pytest.mark.parametrize("n, decls, want", [
    (128, [[64], [MultipleOf(16)]], 64),            # FLASHMLA + a %16 draft: split into 2 kernel blocks
    (64, [[32, 64], [16, 32]], 32),                 # FLASHINFER_MLA + ROCM_AITER_FA: largest common divisor
    (48, [[MultipleOf(16)], [MultipleOf(48)]], 48),
    (96, [[16, 32], [MultipleOf(16)]], 32),
    (1024, [[MultipleOf(1)]], 1024),
    (7, [[MultipleOf(1)], [7]], 7),
])
def test_named_selections(n, decls, want):
    assert bs.select_common_block_size(n, decls) == want


def test_accepts_classes_descriptors_and_foreign_multiple_of():
    class MultipleOf_:  # stands for vLLM's own MultipleOf class (same name, a ``base`` field)
        def __init__(self, base):
            self.base = base
    MultipleOf_.__name__ = "MultipleOf"

    class FakeBackend:
        @staticmethod
        def get_supported_kernel_block_sizes(kv_cache_spec=None):
            return [MultipleOf_(16)]

        @staticmethod
        def get_name():
            return "FAKE"

    class Abstract:  # get_name() fails: the class name is used
        @staticmethod
        def get_supported_kernel_block_sizes():
            return [1]

        @staticmethod
        def get_name():
            raise NotImplementedError

    assert bs.select_common_block_size(32, [FakeBackend, bs.get_backend("ROCM_AITER_MLA")]) == 32
    with pytest.raises(bs.BlockSizeError) as info:
        bs.select_common_block_size(16, [FakeBackend, Abstract])
    assert info.value.backends == (("FAKE", (MultipleOf(16),)), ("Abstract", (1,)))


def test_block_size_error_carries_reasons_and_suggestions():
    with pytest.raises(ValueError) as info:  # a BlockSizeError is a ValueError
        bs.select_common_block_size(16, [[64], [MultipleOf(16)]])
    err = info.value
    assert isinstance(err, bs.BlockSizeError)
    assert err.kv_manager_block_size == 16
    assert err.backends == (("backends[0]", (64,)), ("backends[1]", (MultipleOf(16),)))
    assert any("backends[0] declares [64] and does not accept 16" in r for r in err.reasons)
    # Suggestions are exactly the manager sizes <= 1024 for which selection succeeds.
    want = [m for m in range(1, bs.MAX_SUGGESTED_BLOCK_SIZE + 1) if select_ref(m, [[64], [MultipleOf(16)]])]
    assert list(err.suggestions) == want and want[:3] == [64, 128, 192]
    assert "64, 128, 192" in str(err)
    assert "(backends[0]: [64]; backends[1]: [MultipleOf(16)])" in str(err)


def test_block_size_error_when_nothing_ever_works():
    with pytest.raises(bs.BlockSizeError) as info:
        bs.select_common_block_size(16, [[1], [MultipleOf(16)]])
    assert info.value.suggestions == ()
    assert "cannot share one KV-cache group" in str(info.value)
    assert any("Splitting into kernel blocks of 1 fails: backends[1] does not accept 1." == r
               for r in info.value.reasons)


def test_unknown_size_type_raises_like_vllm():
    with pytest.raises(ValueError, match=r"^Unknown supported size: 16\.0 "):
        bs.select_common_block_size(16, [[16.0]])
    with pytest.raises(ValueError, match=r"^Unknown supported size: x "):
        bs.select_common_block_size(16, [[MultipleOf(16), "x"]])  # the whole list is scanned, as in vLLM
    # vLLM stops at the first backend that rejects: an unknown entry behind it is never looked at.
    with pytest.raises(bs.BlockSizeError, match=r"^No common block size for 16\. "):
        bs.select_common_block_size(16, [[32], ["x"]])


@pytest.mark.parametrize("n", [0, -16, True, 16.0, "16", None])
def test_rejects_bad_manager_block_size(n):
    with pytest.raises(ValueError, match=r"kv_manager_block_size=.*positive integer"):
        bs.select_common_block_size(n, [[16]])


@pytest.mark.parametrize("backends, exc, match", [
    ([], ValueError, "backends is empty"),
    ("ROCM_ATTN", TypeError, "expected a sequence"),
    (["ROCM_ATTN"], TypeError, r"get_backend\('ROCM_ATTN'"),
    ([42], TypeError, r"backends\[0\]=42"),
    ([[0]], ValueError, "positive int"),
    ([[-16]], ValueError, "positive int"),
    ([[True]], ValueError, "not a bool"),
])
def test_rejects_bad_backends(backends, exc, match):
    with pytest.raises(exc, match=match):
        bs.select_common_block_size(16, backends)


# ---- catalog and the installed reader ----------------------------------------------------------

def test_catalog_versions_differ_exactly_by_the_pr():
    before, after = bs.catalog("0.19"), bs.catalog("0.20")
    assert set(after) - set(before) == {"TURBOQUANT"} and set(before) <= set(after)
    changed = {n for n in before if before[n].sizes != after[n].sizes}
    assert changed == {"ROCM_AITER_MLA", "ROCM_AITER_TRITON_MLA"}
    assert before["ROCM_AITER_MLA"].sizes == (1,) and after["ROCM_AITER_MLA"].sizes == (MultipleOf(1),)
    assert after["ROCM_AITER_FA"].reported_name == "FLASH_ATTN"
    for b in after.values():
        assert b.kind in ("mla", "full") and b.get_name() == b.name
        assert bs.parse_sizes(b.sizes_text) == list(b.sizes)


@pytest.mark.parametrize("version, key", [("0.19", "0.19"), ("0.19.1", "0.19"), ("v0.20.0", "0.20"), ("0.20", "0.20")])
def test_catalog_version_keys(version, key):
    assert bs.catalog(version) == bs.catalog(key)


@pytest.mark.parametrize("version", ["0.18", "latest", "", "0.32"])
def test_catalog_rejects_unknown_versions(version):
    with pytest.raises(ValueError, match="is not in the catalog; choose '0.19'"):
        bs.catalog(version)


def test_get_backend_suggests_close_names():
    assert bs.get_backend("rocm_aiter_mla").name == "ROCM_AITER_MLA"
    with pytest.raises(ValueError, match="did you mean ROCM_AITER_MLA"):
        bs.get_backend("ROCM_AITER_ML")
    with pytest.raises(ValueError, match="known backends: "):
        bs.get_backend("NOPE_NOTHING_LIKE_IT")
    with pytest.raises(TypeError, match="registry name"):
        bs.get_backend(16)
    with pytest.raises(ValueError, match="does not exist in vLLM 0.19; it is in the catalog of vLLM 0.20"):
        bs.get_backend("TURBOQUANT", "0.19")


def test_catalog_table_is_generated_from_the_catalog():
    for version in bs.VLLM_VERSIONS:
        cat = bs.catalog(version)
        md = bs.catalog_table(version, markdown=True).splitlines()
        assert len(md) == len(cat) + 2 and md[1].startswith("|---")
        for b in cat.values():
            assert any(line.startswith(f"| `{b.name}` | {b.sizes_text} |") for line in md)
        assert len(bs.catalog_table(version).splitlines()) == len(cat) + 2
    assert "was 1 (PR #39616)" in bs.catalog_table("0.20") and "new in 0.20" in bs.catalog_table("0.20")


def test_declaration_tables_are_well_formed():
    from workbench.blocksize import declarations as decl

    assert bs.VLLM_VERSIONS == tuple(decl.DECLARED) and set(decl.PREFERRED) <= set(decl.DECLARED)
    assert set(decl.CHANGED_BY) <= set(bs.VLLM_VERSIONS[1:])  # a change is against the release before
    for version, rows in decl.DECLARED.items():
        names = [row[0] for row in rows]
        assert len(names) == len(set(names)), version
        for name, sizes, kind, path, platform, reported, note in rows:
            assert name == name.upper() and bs.parse_sizes(sizes), (version, name)
            assert kind in ("mla", "full") and platform in ("cuda", "rocm", "cpu", "any"), (version, name)
            assert path.count(".") >= 1 and reported != name, (version, name)
        assert set(decl.PREFERRED.get(version, {})) <= set(names), version


def test_installed_reader_never_fails(monkeypatch):
    from workbench import device

    if device.vllm_status().available:  # this environment has vLLM: read it
        reading = bs.read_installed_backends()
        assert reading.available and reading.backends
        assert "ROCM_AITER_MLA" in reading.backends or "ROCM_AITER_MLA" in reading.failures
        return
    # No vLLM here and none reachable: every field says so, and the "installed" catalog refuses with the reason.
    # (With the conformance environment, tests/test_blocksize_vllm_conformance.py reads it from here.)
    monkeypatch.setenv("WB_VLLM_PYTHON", "/nonexistent/python")
    bs.read_installed_backends.cache_clear()
    try:
        reading = bs.read_installed_backends()
        assert not reading.available and reading.backends == {} and "not importable" in reading.reason
        assert "/nonexistent/python" in reading.reason
        with pytest.raises(ValueError, match="vllm_version='installed'"):
            bs.catalog("installed")
    finally:
        bs.read_installed_backends.cache_clear()


# ---- KV-cache groups and hybrid blocks ---------------------------------------------------------

def test_mla_target_and_llama_draft_share_one_group():
    mla, attn = bs.get_backend("ROCM_AITER_MLA"), bs.get_backend("ROCM_ATTN")
    layers = [bs.Layer("t0", "mla", 16, mla), bs.Layer("t1", "mla", 16, mla), bs.Layer("d0", "full", 16, attn)]
    (group,) = bs.group_layers(layers)
    assert group.kind == "full_attention" and group.block_size == 16
    assert group.backends == [mla, attn]  # one entry per backend
    (sel,) = bs.select_kernel_block_sizes(layers)
    assert sel.ok and sel.kernel_block_size == 16 and sel.ratio == 1


def test_grouping_by_type_and_block_size():
    a, b = [MultipleOf(16)], [64]
    layers = [
        bs.Layer("full16", "full", 16, a), bs.Layer("sw4k", "sliding_window", 16, a, window=4096),
        bs.Layer("sw1k", "sliding_window", 16, a, window=1024), bs.Layer("full64", "mla", 64, b),
        bs.Layer("sw4k_b", "sliding_window", 16, b, window=4096), bs.Layer("local", "chunked_local", 16, a, window=8192),
    ]
    groups = bs.group_layers(layers)
    assert [[x.name for x in g.layers] for g in groups] == [["full16"], ["sw4k", "sw4k_b"], ["sw1k"], ["full64"], ["local"]]
    sels = bs.select_kernel_block_sizes(layers)
    assert [s.kernel_block_size for s in sels] == [16, None, 16, 64, 16]
    assert sels[1].error.kv_manager_block_size == 16 and sels[1].ratio is None


@pytest.mark.parametrize("make, exc, match", [
    (lambda: bs.Layer("x", "mlaa", 16, [1]), ValueError, "did you mean 'mla'"),
    (lambda: bs.Layer("x", "full", 0, [1]), ValueError, "block_size=0"),
    (lambda: bs.Layer("x", "sliding_window", 16, [1]), ValueError, "window"),
    (lambda: bs.group_layers([]), ValueError, "layers is empty"),
    (lambda: bs.group_layers([bs.Layer("x", "full", 16, [1])] * 2), ValueError, "duplicate layer names"),
    (lambda: bs.group_layers(["x"]), TypeError, "expected a blocksize.Layer"),
])
def test_layer_and_group_errors(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def map_ref(ids, ratio):
    out = []
    for i in np.asarray(ids).reshape(-1).tolist():
        for j in range(ratio):
            out.append(i * ratio + j)
    return out


@pytest.mark.parametrize("ids", [[], [0], [5], [3, 0, 7], list(range(13)), [[1, 2], [9, 4]]])
@pytest.mark.parametrize("ratio", [1, 2, 3, 16])
def test_map_to_kernel_blocks_matches_loop(ids, ratio):
    got = bs.map_to_kernel_blocks(ids, ratio)
    assert got.dtype == np.int64 and got.tolist() == map_ref(ids, ratio)
    t = torch.tensor(ids, dtype=torch.int32).reshape(-1) if ids else torch.zeros(0, dtype=torch.int32)
    gt = bs.map_to_kernel_blocks(t, ratio)
    assert gt.dtype == torch.int32 and gt.tolist() == map_ref(ids, ratio)


@pytest.mark.parametrize("ids, ratio, exc, match", [
    ([1], 0, ValueError, "ratio=0"), ([1], True, ValueError, "ratio=True"), ([-1], 2, ValueError, "negative"),
    ([1.5], 2, TypeError, "must be integers"), (torch.tensor([1.0]), 2, TypeError, "must be integers"),
    (torch.tensor([-3]), 2, ValueError, "negative"),
])
def test_map_to_kernel_blocks_errors(ids, ratio, exc, match):
    with pytest.raises(exc, match=match):
        bs.map_to_kernel_blocks(ids, ratio)


@pytest.mark.parametrize("dtype, top", [(torch.int32, 2**31 // 16), (torch.int32, 2**29), (torch.int16, 2**11),
                                        (torch.int64, 2**63 // 16)])
def test_map_to_kernel_blocks_refuses_ids_that_would_wrap(dtype, top):
    # issue #32: an int32 id times the ratio beyond 2**31 wrapped silently (2**30 * 4 came back as 0..3). The
    # largest kernel id, top * ratio + ratio - 1, must fit the output dtype, else an error naming block_ids and
    # the fix; the id just below the limit still splits exactly.
    ratio = 16
    ids = torch.tensor([3, top], dtype=dtype)
    with pytest.raises(ValueError, match=rf"block_ids holds {top}: split by ratio=16 it becomes kernel block id "
                                         rf"{top * ratio + ratio - 1}, beyond {dtype}"):
        bs.map_to_kernel_blocks(ids, ratio)
    ok = (torch.iinfo(dtype).max - ratio + 1) // ratio  # the largest id that fits
    got = bs.map_to_kernel_blocks(torch.tensor([ok], dtype=dtype), ratio)
    assert got.dtype == dtype and got.tolist() == [ok * ratio + j for j in range(ratio)]
    if dtype != torch.int64:  # the fix the message gives: int64 ids
        assert bs.map_to_kernel_blocks(ids.long(), ratio).tolist() == map_ref([3, top], ratio)
    with pytest.raises(ValueError, match="beyond torch.int32"):
        bs.map_to_kernel_blocks(torch.tensor([2**30], dtype=torch.int32), 4)  # the case of the report


def test_map_to_kernel_blocks_numpy_ids_beyond_int64_are_refused():
    with pytest.raises(ValueError, match="beyond int64"):
        bs.map_to_kernel_blocks(np.array([2**63], dtype=np.uint64), 2)
    assert bs.map_to_kernel_blocks(np.array([2**31 - 1], dtype=np.int32), 4).tolist() == map_ref([2**31 - 1], 4)


@pytest.mark.parametrize("layout", ["strided", "transposed", "offset"])
def test_map_to_kernel_blocks_reads_any_layout(layout):
    t = torch.tensor([[4, 1, 7], [2, 9, 0]], dtype=torch.int32)
    if layout == "strided":
        wide = torch.zeros((2, 6), dtype=torch.int32)
        wide[:, ::2] = t
        view = wide[:, ::2]
    elif layout == "transposed":
        view = t.t().contiguous().t()
    else:
        view = torch.cat([torch.zeros(5, dtype=torch.int32), t.reshape(-1)])[5:].reshape(2, 3)
    assert torch.equal(view, t)
    assert bs.map_to_kernel_blocks(view, 3).tolist() == map_ref(t.tolist(), 3)


def test_kernel_block_ratio_and_vllm_divisibility_error():
    assert bs.kernel_block_ratio(16, 1) == 16 and bs.kernel_block_ratio(128, 64) == 2 and bs.kernel_block_ratio(48, 48) == 1
    with pytest.raises(ValueError, match=r"^kernel_block_size 32 must divide kv_manager_block_size size 48 evenly$"):
        bs.kernel_block_ratio(48, 32)
    with pytest.raises(ValueError, match="kernel_block_size=0"):
        bs.kernel_block_ratio(16, 0)


# ---- check_spec_decode and the matrix ----------------------------------------------------------

def test_check_spec_decode_before_and_after():
    before = bs.check_spec_decode("ROCM_AITER_MLA", "ROCM_ATTN", 16, "0.19")
    after = bs.check_spec_decode("ROCM_AITER_MLA", "ROCM_ATTN", vllm_version="0.20")
    assert not before.compatible and before.kernel_block_size is None
    assert str(before.error).startswith("No common block size for 16. ")
    assert before.verdict.startswith("incompatible:") and "no --block-size works" in before.verdict
    assert after.compatible and after.kv_manager_block_size == 16 and after.kernel_block_size == 16 and after.ratio == 1
    assert after.verdict.startswith("compatible:")
    assert len(after.selections) == 1 and len(after.selections[0].group.layers) == 3
    d = json.loads(json.dumps(after.to_dict()))
    assert d["compatible"] is True and d["kernel_block_size"] == 16 and d["groups"][0]["backends"] == ["ROCM_AITER_MLA", "ROCM_ATTN"]
    assert "group 0 (full_attention, block size 16)" in str(after)


@pytest.mark.parametrize("name, want", [
    ("ROCM_AITER_MLA", 16), ("TRITON_MLA", 16), ("FLASHMLA", 64), ("CUTLASS_MLA", 128), ("FLASHINFER_MLA", 32),
    ("ROCM_AITER_MLA_SPARSE", 16), ("ROCM_AITER_UNIFIED_ATTN", 64), ("ROCM_AITER_FA", 16),
])
def test_preferred_block_size(name, want):
    assert bs.preferred_block_size(bs.get_backend(name)) == want


def test_preferred_block_size_rule_on_plain_lists():
    assert bs.preferred_block_size([MultipleOf(48)]) == 48 and bs.preferred_block_size([8]) == 16
    assert bs.preferred_block_size([96, 48]) == 48 and bs.preferred_block_size([]) == 16
    assert bs.preferred_block_size([MultipleOf(16)], default=32) == 32
    with pytest.raises(ValueError, match="Unknown supported size"):
        bs.preferred_block_size([16.0])
    with pytest.raises(ValueError, match="default=0"):
        bs.preferred_block_size([16], default=0)


def test_check_spec_decode_without_block_size_lets_the_target_choose():
    r = bs.check_spec_decode("FLASHMLA", "TRITON_ATTN")
    assert not r.block_size_given and r.kv_manager_block_size == 64 and r.kernel_block_size == 64
    assert "no --block-size: FLASHMLA picks 64" in r.verdict
    forced = bs.check_spec_decode("FLASHMLA", "TRITON_ATTN", 16)
    assert forced.block_size_given and not forced.compatible and forced.error.suggestions[0] == 64


def test_check_spec_decode_block_size_one_still_fails_and_splits():
    r = bs.check_spec_decode("ROCM_AITER_MLA", "ROCM_ATTN", 1)
    assert not r.compatible and r.error.suggestions[:2] == (16, 32) and "try --block-size 16" in r.verdict
    split = bs.check_spec_decode("FLASHMLA", "TRITON_ATTN", 128)
    assert split.kernel_block_size == 64 and split.ratio == 2 and "splits into 2 kernel blocks" in split.verdict


@pytest.mark.parametrize("kwargs, match", [
    (dict(target="ROCM_AITER_MLA", draft="TRITON_MLA"), "is an MLA backend"),
    (dict(target="ROCM_AITER_MAL", draft="ROCM_ATTN"), "did you mean ROCM_AITER_MLA"),
    (dict(target="ROCM_AITER_MLA", draft="ROCM_ATTN", block_size=0), "block_size=0"),
    (dict(target="ROCM_AITER_MLA", draft="ROCM_ATTN", vllm_version="0.1"), "not in the catalog"),
])
def test_check_spec_decode_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bs.check_spec_decode(**kwargs)


def test_matrix_agrees_with_check_spec_decode():
    sizes = (None, 1, 16, 48, 64, 128)
    for version in bs.VLLM_VERSIONS:
        m = bs.compatibility_matrix(block_sizes=sizes, vllm_version=version)
        assert m.kernel_block_size.shape == m.manager_block_size.shape == (len(m.targets), len(m.drafts), len(sizes))
        assert "ROCM_AITER_MLA" in m.targets and "ROCM_ATTN" in m.drafts and "ROCM_ATTN" not in m.targets
        for i, t in enumerate(m.targets):
            for j, d in enumerate(m.drafts):
                for k, n in enumerate(sizes):
                    r = bs.check_spec_decode(t, d, n, version)
                    assert m.kernel_block_size[i, j, k] == (r.kernel_block_size or 0), (t, d, n, version)
                    assert m.manager_block_size[i, j, k] == r.kv_manager_block_size
    assert bs.compatibility_matrix(["ROCM_AITER_MLA"], ["ROCM_ATTN"], (16,), "0.19").lookup("ROCM_AITER_MLA", "ROCM_ATTN", 16) == 0
    with pytest.raises(ValueError, match="targets is empty"):
        bs.compatibility_matrix(targets=[])


# ---- figures -----------------------------------------------------------------------------------

def test_heatmap_cells_come_from_the_matrix():
    fig = viz.blocksize_heatmap(16)
    assert len(fig.data) == 2
    cat = bs.catalog("0.20")
    assert set(fig.data[0].y) == {n for n, b in cat.items() if b.kind == "mla"}
    assert set(fig.data[0].x) == {n for n, b in cat.items() if b.kind == "full"} - {"TURBOQUANT"}  # in both versions
    for trace, version in zip(fig.data, bs.VLLM_VERSIONS):
        assert list(trace.x) == list(fig.data[0].x) and list(trace.y) == list(fig.data[0].y)
        m = bs.compatibility_matrix(list(trace.y), list(trace.x), (16,), version)
        k = m.kernel_block_size[:, :, 0]
        assert np.array_equal(np.asarray(trace.z), np.where(k == 0, 0, np.where(k == 16, 2, 1)))
        assert np.array_equal(np.asarray(trace.text), np.where(k == 0, "✗", k.astype(str)))
    i, j = list(fig.data[0].y).index("ROCM_AITER_MLA"), list(fig.data[0].x).index("ROCM_ATTN")
    assert fig.data[0].text[i][j] == "✗" and fig.data[1].text[i][j] == "16"


def test_explorer_has_one_precomputed_view_per_block_size():
    sizes = (None, 1, 16, 64)
    fig = viz.blocksize_explorer(sizes)
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["no --block-size", "--block-size 1", "--block-size 16", "--block-size 64"]
    assert fig.layout.updatemenus[0].active == 2
    m = bs.compatibility_matrix(list(fig.data[1].y), list(fig.data[1].x), sizes, "0.20")
    for k, b in enumerate(buttons):
        text = np.asarray(b.args[0]["text"][1])
        kk = m.kernel_block_size[:, :, k]
        assert np.array_equal(text, np.where(kk == 0, "✗", kk.astype(str)))
    with pytest.raises(ValueError, match="initial=32"):
        viz.blocksize_explorer(sizes, initial=32)


def test_widget_builds_and_updates():
    box = viz.blocksize_widget()
    (w_target, w_draft), (w_block, w_version) = box.children[0].children, box.children[1].children
    w_version.value = "0.19"
    w_block.value = 32
    assert w_target.value == "ROCM_AITER_MLA" and w_draft.value == "ROCM_ATTN"


# ---- CLI ---------------------------------------------------------------------------------------

def test_cli_check_exit_codes(capsys):
    assert main(["check", "--target", "ROCM_AITER_MLA", "--draft", "ROCM_ATTN", "--block-size", "16"]) == 0
    assert capsys.readouterr().out.startswith("compatible: ROCM_AITER_MLA + ROCM_ATTN (vLLM 0.20")
    assert main(["check", "--target", "ROCM_AITER_MLA", "--draft", "ROCM_ATTN", "--vllm", "0.19", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["compatible"] is False and d["groups"][0]["error"].startswith("No common block size for 16. ")
    assert main(["check", "--target", "ROCM_AITER_ML", "--draft", "ROCM_ATTN"]) == 2
    assert "did you mean ROCM_AITER_MLA" in capsys.readouterr().err
    assert main(["check", "--target", "ROCM_AITER_MLA", "--draft", "ROCM_ATTN", "--block-size", "-4"]) == 2
    assert main(["check", "--target", "ROCM_AITER_MLA", "--draft", "ROCM_ATTN", "--vllm", "0.7"]) == 2
    with pytest.raises(SystemExit) as info:  # argparse: a missing required option
        main(["check", "--target", "ROCM_AITER_MLA"])
    assert info.value.code == 2


def test_cli_catalog(capsys):
    assert main(["catalog", "--markdown"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| backend |") and len(out) == len(bs.catalog("0.20")) + 2
    assert main(["catalog", "--vllm", "0.19"]) == 0
    assert "becomes %1 (PR #39616)" in capsys.readouterr().out
    assert main(["catalog", "--vllm", "nope"]) == 2


def test_python_dash_m_blocksize_is_the_oracle_entry_point():
    """ask_real_vllm runs ``python -m workbench.blocksize --oracle``; without --oracle it prints its usage."""
    proc = subprocess.run([sys.executable, "-m", "workbench.blocksize"], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=120)
    assert proc.returncode == 2 and proc.stdout.startswith("usage: python -m workbench.blocksize --oracle")


def test_vllm_python_looks_in_this_repository(monkeypatch):
    monkeypatch.delenv("WB_VLLM_PYTHON", raising=False)
    python, reason = bs.vllm_python()
    if python is None:
        assert str(REPO / ".venv-vllm") in reason
    else:
        assert python in (sys.executable, str(REPO / ".venv-vllm" / "bin" / "python")), (python, reason)


@pytest.mark.parametrize("args, code, expect", [
    (["--target", "ROCM_AITER_MLA", "--draft", "ROCM_ATTN", "--block-size", "16"], 0, "compatible:"),
    (["--target", "ROCM_AITER_MLA", "--draft", "ROCM_ATTN", "--vllm", "0.19"], 1, "incompatible:"),
    (["--target", "NOPE", "--draft", "ROCM_ATTN"], 2, ""),
])
def test_python_dash_m_workbench_check(args, code, expect):
    proc = subprocess.run([sys.executable, "-m", "workbench", "check", *args], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout.startswith(expect)
    if code == 2:
        assert "unknown attention backend 'NOPE'" in proc.stderr
