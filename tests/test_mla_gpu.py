"""workbench.mla on a GPU: every default and every config of the tuned tables against the golden, with ragged and
causal batches, NaN in unused cache rows and in the output buffer, and CUDA-graph replays equal to the eager call.
Skipped off-GPU by tests/conftest.py (markers ``gpu`` and ``hopper``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import workbench  # noqa: F401
from mla_cases import (D, DV, assert_graph_replays_equal, check_against_golden, make_case, metadata_of, offsets,
                       ragged_gpu_case)
from workbench import mla
from workbench.mla import policy

GPU_KV_LENS = [1, 17, 100, 1000, 4099]
# (heads, query lengths) of the ragged cases: 128 heads, partly empty row blocks, ragged and causal qlen up to 16
RAGGED_CASES = [(128, [1, 1, 1]), (16, [4, 4, 4]), (16, [3, 1, 4]), (16, [1, 2, 1]), (16, [16, 7, 1]), (8, [2, 2, 2])]


def _nvidia_configs(kernels):
    seen = {}
    for rule in policy.tuned_table("nvidia")["rules"]:
        cfg = rule["_config"]
        if cfg.kernel in kernels:
            seen.setdefault(cfg.label, cfg)
    return seen


TRITON_CONFIGS = _nvidia_configs({"triton"})
GLUON_CONFIGS = _nvidia_configs({"gluon", "gluon_ws", "gluon_swap"})


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads", [16, 128, 3])
@pytest.mark.parametrize("qlen", range(1, 17))
def test_default_matches_golden(qlen, heads, dtype):
    """The library's choice for every qlen 1..16 and 16, 128 and an odd head count, lengths 1..4099."""
    kv = [max(n, qlen) for n in GPU_KV_LENS]
    case = make_case([qlen] * len(kv), kv, heads, dtype=dtype, device="cuda", seed=qlen * 7 + heads)
    res = mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case), sm_scale=0.07, backend="triton")
    check_against_golden(case, res.out, res.lse, dtype, 0.07, f"qlen {qlen} H {heads} {dtype}: {res.reason}")


def _check_case(case, args, cfg, num_splits, dtype, label):
    """``mla_decode_triton(*args)`` with ``cfg`` and ``num_splits`` into a NaN-filled output against the golden of
    ``case``, and its graph replays equal to the eager call."""
    out = torch.full_like(case["q"][..., :DV], float("nan"))
    out, lse = mla.mla_decode_triton(*args, config=cfg, num_splits=num_splits, out=out)
    check_against_golden(case, out, lse, dtype, 0.07, label)
    assert_graph_replays_equal(lambda o: mla.mla_decode_triton(*args, config=cfg, num_splits=num_splits, out=o), out)


def _check_config(cfg, heads, qo_lens, num_splits, dtype, seed):
    case, args = ragged_gpu_case(qo_lens, heads, dtype, seed=seed)
    _check_case(case, args, cfg, num_splits, dtype, f"{cfg.label} H{heads} q{qo_lens} s{num_splits} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,qo_lens", RAGGED_CASES)
@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("label", list(TRITON_CONFIGS))
def test_every_triton_config_of_the_table(label, num_splits, heads, qo_lens, dtype):
    """Every Triton-kernel config the NVIDIA table can choose (on any NVIDIA or ROCm GPU: PDL is ignored where it is
    not available), splits that are empty or end inside a tile, graph replays bit-exact."""
    _check_config(TRITON_CONFIGS[label], heads, qo_lens, num_splits, dtype, seed=heads + num_splits)


@pytest.mark.hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,qo_lens", RAGGED_CASES)
@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("label", list(GLUON_CONFIGS))
def test_every_gluon_config_of_the_table(label, num_splits, heads, qo_lens, dtype):
    """Every Gluon config the NVIDIA table can choose: 16/32-row (swap) and 64-row programs, several row blocks per
    request and partly empty ones, splits that are empty or end inside a tile, graph replays bit-exact."""
    _check_config(GLUON_CONFIGS[label], heads, qo_lens, num_splits, dtype, seed=heads + num_splits + 100)


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [True, False])
@pytest.mark.parametrize("label", list(TRITON_CONFIGS))
def test_triton_configs_with_and_without_pdl_in_a_graph(label, pdl):
    """Ragged query lengths, 8 splits, the launches with and without PDL, eagerly and under CUDA-graph replay."""
    cfg = dataclasses.replace(TRITON_CONFIGS[label], pdl=pdl)
    dtype = torch.bfloat16
    case = make_case([1, 4, 7, 2], [300, 5000, 7, 64], 16, dtype=dtype, device="cuda", seed=11)
    md = metadata_of(case)
    args = (case["q"], case["kv_cache"], md.qo_indptr, md.kv_indptr, md.kv_indices, md.max_qo_len, 0.07)
    eager_out, eager_lse = mla.mla_decode_triton(*args, config=cfg, num_splits=8)
    check_against_golden(case, eager_out, eager_lse, dtype, 0.07, f"{cfg.label} {dtype}")
    assert_graph_replays_equal(lambda out: mla.mla_decode_triton(*args, config=cfg, num_splits=8, out=out), eager_out)


@pytest.mark.hopper
@pytest.mark.parametrize("heads,qlen,kernel,kv_base", [(128, 1, "gluon_ws", 8000), (16, 6, "gluon_ws", 8000),
                                                       (128, 1, "gluon_ws", 2500), (16, 4, "gluon_ws", 2500),
                                                       (16, 2, "gluon_swap", 2500), (16, 1, "gluon_swap", 2500)])
def test_default_choice_names_its_kernel_and_matches_golden(heads, qlen, kernel, kv_base):
    """40 ragged requests of ``kv_base`` + 37 i tokens: more than 32 rows (one or two row blocks, long or shorter
    programs) take the warp-specialised kernel, at most 32 rows the swapped kernel; ``mla_decode`` names it and
    matches the golden."""
    kv_lens = [kv_base + 37 * i for i in range(40)]
    case = make_case([qlen] * 40, kv_lens, heads, dtype=torch.bfloat16, device="cuda", seed=heads + qlen)
    res = mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case), sm_scale=0.07, backend="triton")
    cfg, _ = mla.triton_launch_plan(case["q"], case["qo_indptr"], case["kv_indices"], qlen)
    assert cfg.kernel == kernel and not cfg.idx_ahead, res.reason
    assert f"split kernel {cfg.label}" in res.reason
    check_against_golden(case, res.out, res.lse, torch.bfloat16, 0.07, f"default {kernel} H{heads} qlen {qlen}")


def _paged_case(qo_lens, kv_lens, heads, row_stride, seed):
    """A cache of 64-token pages handed out in a random order (NaN in the rows no request uses), indexed by the
    expansion's spec, and two more requests as long as the last: one on a run of rows that starts 13 rows into a
    page (after the pages), one on the last request's rows with two rows of every page swapped (no run); rows
    ``row_stride`` values apart. Returns the case and ``mla_decode_triton``'s positional arguments (scale 0.07)."""
    from workbench.expand import expand_page_indices_ref

    g = torch.Generator().manual_seed(seed)
    page, n = 64, kv_lens[-1]
    pages = [-(-k // page) for k in kv_lens]
    num_pages = 1 + sum(pages)  # page 0 is never handed out
    run_start = num_pages * page + 13
    store = torch.full((run_start + n + 7, row_stride), float("nan"))
    table = torch.zeros(len(kv_lens), max(pages), dtype=torch.int32)
    order = (1 + torch.randperm(num_pages - 1, generator=g)).split(pages)
    for r, blocks in enumerate(order):
        table[r, :len(blocks)] = blocks
    paged, _ = expand_page_indices_ref(table, kv_lens, page)
    last = paged[-n:]
    swapped = last.clone()
    swapped[1::page], swapped[2::page] = last[2::page], last[1::page]
    rows = torch.cat([paged, torch.arange(run_start, run_start + n, dtype=torch.int32), swapped])
    kv_lens, qo_lens = [*kv_lens, n, n], [*qo_lens, qo_lens[-1], qo_lens[-1]]
    store[rows, :D] = torch.randn(rows.numel(), D, generator=g)
    q = torch.randn(sum(qo_lens), heads, D, generator=g)
    case = dict(q=q.to(torch.bfloat16).cuda(), kv_cache=store.to(torch.bfloat16).cuda()[:, :D],
                qo_indptr=offsets(qo_lens).cuda(), kv_indptr=offsets(kv_lens).cuda(), kv_indices=rows.cuda())
    return case, (case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"],
                  max(qo_lens), 0.07)


@pytest.mark.hopper
@pytest.mark.parametrize("row_stride", [D, D + 64])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("heads,qo_lens", [(16, [4, 4, 4]), (128, [1, 1, 1]), (16, [8, 3, 6])])
def test_gluon_ws_on_paged_caches(heads, qo_lens, num_splits, row_stride):
    """The warp-specialised kernel on a paged cache, as a serving engine hands it over: whole 64-token pages in a
    random order, a page's last and partly used tile, a run of rows cut by a split's end, a run that starts inside a
    page and pages with two rows swapped; contiguous and wider rows; the golden must hold eagerly and in graph
    replays."""
    case, args = _paged_case(qo_lens, [4099, 640, 1000], heads, row_stride, seed=heads + num_splits + row_stride)
    cfg = next(c for c in GLUON_CONFIGS.values() if c.kernel == "gluon_ws")
    _check_case(case, args, cfg, num_splits, torch.bfloat16, f"paged H{heads} q{qo_lens} s{num_splits}")


@pytest.mark.gpu
@pytest.mark.parametrize("qlen", [1, 2, 3, 8])
def test_fp32_every_row_class(qlen):
    """fp32 rows are twice as wide in shared memory: the defaults must still fit for every row count."""
    case = make_case([qlen] * 3, [max(n, qlen) for n in (33, 700, 4099)], 16, dtype=torch.float32, device="cuda",
                     seed=qlen)
    res = mla.mla_decode(case["q"], case["kv_cache"], metadata_of(case), sm_scale=0.07, backend="triton")
    check_against_golden(case, res.out, res.lse, torch.float32, 0.07, f"fp32 qlen {qlen}")


@pytest.mark.gpu
def test_expand_then_decode_in_one_graph():
    """A serving step's chain, six steps in one CUDA graph: torch copies write the step's block table, seq_lens and
    q; the index expansion (PDL-launched on sm_90+, it lets its dependents launch early) writes kv_indptr and
    kv_indices; the decode's split kernel (PDL-launched, it waits before its first read) reads them at once. Every
    step has other tables and lengths, so a decode that read the previous step's indices, or a half-written index
    buffer, would be wrong: each step's output must match the golden on that step's own inputs."""
    from workbench import expand as E

    K, R, H, max_blocks, steps, scale = 16, 6, 16, 40, 6, 0.07
    g = torch.Generator().manual_seed(21)
    num_blocks = 1 + R * max_blocks
    cache = torch.randn(num_blocks, K, D, generator=g).to(torch.bfloat16)
    cache[0] = float("nan")  # block 0 is never handed out
    cache = cache.cuda()
    tables, lens, qs = [], [], []
    for _ in range(steps):
        tables.append((1 + torch.randperm(num_blocks - 1, generator=g)).to(torch.int32).reshape(R, max_blocks))
        lens.append(torch.randint(1, max_blocks * K + 1, (R,), generator=g, dtype=torch.int32))
        qs.append(torch.randn(R, H, D, generator=g).to(torch.bfloat16))
    src = [(t.cuda(), n.cuda(), q.cuda()) for t, n, q in zip(tables, lens, qs)]
    block_table = torch.zeros(R, max_blocks, dtype=torch.int32, device="cuda")
    seq_lens = torch.zeros(R, dtype=torch.int32, device="cuda")
    q = torch.zeros(R, H, D, dtype=torch.bfloat16, device="cuda")
    qo_indptr = torch.arange(R + 1, dtype=torch.int32, device="cuda")
    kv_indices = torch.zeros(R * max_blocks * K, dtype=torch.int32, device="cuda")
    kv_indptr = torch.zeros(R + 1, dtype=torch.int32, device="cuda")
    outs = torch.zeros(steps, R, H, DV, dtype=torch.bfloat16, device="cuda")
    lses = []

    def run_steps():
        lses.clear()
        for i, (t, n, qi) in enumerate(src):
            block_table.copy_(t)
            seq_lens.copy_(n)
            q.copy_(qi)
            E.expand_page_indices(block_table, seq_lens, K, out=kv_indices, kv_indptr=kv_indptr,
                                  max_seq_len=max_blocks * K, validate=False)
            lses.append(mla.mla_decode_triton(q, cache.view(-1, 1, 1, D), qo_indptr, kv_indptr, kv_indices, 1, scale,
                                              out=outs[i])[1])

    run_steps()  # compiles outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_steps()
    for _ in range(2):
        outs.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for i, (t, n, qi) in enumerate(zip(tables, lens, qs)):
            ref_indices, ref_indptr = E.expand_page_indices_ref(t, n, K)
            case = dict(q=qi.cuda(), kv_cache=cache.view(-1, D), qo_indptr=qo_indptr, kv_indptr=ref_indptr.cuda(),
                        kv_indices=ref_indices.cuda())
            check_against_golden(case, outs[i], lses[i], torch.bfloat16, scale, f"step {i}")
