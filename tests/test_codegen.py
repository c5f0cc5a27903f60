"""The decode and expansion kernels as Triton compiles them for Hopper and for AMD GPUs, checked on any machine.

What the IR says about speed, as tests: every Triton default that loads the indices one tile ahead double-buffers
its row gather (a tile without it gets a single buffer: the loads of the next tile wait for this tile's math); the
small-batch tiles keep their registers; nothing a PDL-launched kernel reads comes before its wait; the Gluon kernels
keep their schedule (products, waits, 16-byte stores) within an H200 program's shared memory; ptxas serialises no
Hopper kernel's wgmma; the ROCm defaults fit the 64 KB of LDS of an MI300X and an MI355X. The compile runs in a
subprocess with ``TRITON_INTERPRET=0``: in this process the kernels are the interpreter's Python functions.
"""

from __future__ import annotations

import os

import pytest
import torch

from workbench import codegen, device, mla
from workbench.mla import policy

ROCM_LDS_BYTES = 65_536  # shared memory (LDS) per workgroup on CDNA3 (MI300X, gfx942) and CDNA2 (gfx90a)

SCRIPT = """
import json, torch
from workbench import codegen, mla
from workbench.mla import policy
out = {"triton": {}, "amd": []}
for rule in policy.tuned_table("nvidia")["rules"]:
    cfg = rule["_config"]
    if cfg.kernel == "triton":
        dt = "fp32" if rule["when"].get("fp32") else "bf16"
        out["triton"][rule["name"]] = dict(codegen.split_kernel_report(cfg, dtype=dt), block_n=cfg.block_n,
                                           idx_ahead=cfg.idx_ahead)
# a 16-row tile whose indices are loaded with their tile (no idx_ahead): the single-buffered gather
out["old"] = codegen.split_kernel_report(mla.TritonConfig(block_m=16, block_n=64, num_warps=4, num_stages=2))
for rule in policy.tuned_table("rocm")["rules"]:
    cfg = rule["_config"]
    for dt in (("fp32",) if rule["when"].get("fp32") else ("bf16", "fp16")):
        for arch in ("gfx942", "gfx950"):  # MI300X, and MI355X (the GPU of aiter #2720)
            out["amd"].append(dict(codegen.amd_kernel_report(cfg, heads=16, dtype=dt, arch=arch), rule=rule["name"]))
nv_small = next(r["_config"] for r in policy.tuned_table("nvidia")["rules"] if r["name"] == "up to 16 rows, small batch")
out["amd_nvidia_tile"] = codegen.amd_kernel_report(nv_small, heads=16)
out["expand"] = [codegen.expand_kernel_report(a) for a in ("gfx942", "gfx90a", "sm_90")]
out["expand_pdl"] = codegen.expand_kernel_report("sm_90", pdl=True)
out["expand_group"] = [codegen.expand_kernel_report(a, block_t=128, num_warps=1, group=8, pdl=a == "sm_90")
                       for a in ("gfx942", "sm_90")]
out["expand_bcast"] = {f"{K}/{b}": codegen.expand_kernel_report("sm_90", num_warps=1, pdl=True, K=K, broadcast=b)
                       for K in (16, 2048) for b in (False, True)}
out["expand_many"] = codegen.expand_kernel_report("sm_90", num_warps=1, pdl=True, broadcast=True, prefix_first=True,
                                                  prefix_u32=True)
out["expand_many_amd"] = [codegen.expand_kernel_report(a, num_warps=1, broadcast=True, prefix_first=True,
                                                       prefix_u32=True) for a in ("gfx942", "gfx90a")]
out["merge"] = [codegen.merge_kernel_report(pdl=p) for p in (True, False)]
# every (tile, splits loaded at once, warps) the merge launches with for 2..32 splits of 65 to 4096 rows
merge_cfg = mla.TritonConfig(block_m=16, block_n=64, num_warps=8, num_stages=3)
launches = sorted({(*merge_cfg.merge_tile(n, s), min(1 << (s - 1).bit_length(), merge_cfg.merge_split_chunk),
                    merge_cfg.merge_num_warps(n)) for n in (65, 256, 1024, 4096) for s in range(2, 33)})
out["merge_tiles"] = [codegen.merge_tile_report(br, bd, c, arch, num_warps=w) for br, bd, c, w in launches
                      for arch in ("sm_90", "gfx942")]
out["gluon"] = [codegen.gluon_kernel_report(direct=d) for d in (False, True)]
out["gluon_ws"] = [dict(codegen.gluon_ws_kernel_report(direct=d), direct=d) for d in (False, True)]
out["gluon_swap"] = [dict(codegen.gluon_swap_kernel_report(block_m=bm, direct=d), block_m=bm, direct=d)
                     for bm in (16, 32) for d in (False, True)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def reports(run_compiled):
    try:
        import triton  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError as exc:  # pragma: no cover
        pytest.skip(f"triton cannot compile here: {exc}")
    return run_compiled(SCRIPT)


def test_every_idx_ahead_default_double_buffers_the_row_gather(reports):
    ahead = {k: v for k, v in reports["triton"].items() if v["idx_ahead"]}
    assert len(ahead) == 6  # fp32 (two row classes), 16 and 32 rows (small and large batches)
    for name, r in ahead.items():
        assert f"2x{r['block_n']}x512" in r["shared_buffers"], (name, r["shared_buffers"])
        assert max(r["async_wait_num"]) >= 2, (name, r["async_wait_num"])  # the next tile stays in flight


def test_a_tile_without_idx_ahead_has_one_gather_buffer(reports):
    r = reports["old"]
    assert "1x64x512" in r["shared_buffers"] and r["async_wait_num"] == [0], r


def test_small_batch_tiles_keep_their_registers(reports):
    small16 = reports["triton"]["up to 16 rows, small batch"]
    assert small16["spill_bytes"] == 0 and small16["regs"] <= 180, small16  # 176 with Triton 3.7.1 (bf16 partials)
    large16 = reports["triton"]["up to 16 rows"]
    assert large16["spill_bytes"] == 0 and large16["regs"] <= 200, large16


@pytest.mark.interpreter
def test_report_refuses_to_run_under_the_interpreter():
    cfg = mla.TritonConfig()
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=0"):
        codegen.split_kernel_report(cfg)
    with pytest.raises(ValueError, match="dtype must be"):
        codegen.split_kernel_report(cfg, dtype="int8")
    gluon = policy.tuned_table("nvidia")["rules"][-2]["_config"]
    with pytest.raises(ValueError, match="is a Gluon config"):
        codegen.split_kernel_report(gluon)


def test_loop_order_shows_which_tiles_overlap_loads_and_math(reports):
    """The 16-row defaults wait with the next tile's copies still in flight (``wait:2`` first), so a tile's gather
    overlaps the previous tile's math. The 64-row Triton tile (more than 32 rows off Hopper) waits for everything
    (``wait:0``) and issues the next tile's gather only after this tile's products and softmax: its copies overlap
    only the asynchronous ``P @ V``. A third 64x64 buffer, which would let it run a tile ahead as the 16-row tiles
    do, does not fit beside the 64x576 query tile in shared memory; the Gluon kernel (Hopper) writes that order."""
    for name in ("up to 16 rows, small batch", "up to 16 rows"):
        order = reports["triton"][name]["loop_order"]
        assert order[0] == "wait:2" and order.index("copy:kv") > max(i for i, e in enumerate(order) if e == "dot")
    wide = reports["triton"]["more than 32 rows"]
    assert wide["loop_order"][0] == "wait:0", wide["loop_order"]
    order = wide["loop_order"]
    assert min(i for i, e in enumerate(order) if e == "copy:kv") > max(i for i, e in enumerate(order) if e == "dot")
    assert wide["shared_buffers"].count("2x64x512") == 1


def test_loop_order_reads_a_small_ttgir():
    ttgir = """
    %0 = scf.for %i = %a to %b step %c iter_args() {
      %w = ttg.async_wait %t {num = 2 : i32}
      %d = tt.dot %x, %y, %z
      %e = math.exp2 %d
      %c1 = ttg.async_copy_global_to_local %p, %q : tensor<64x512x!tt.ptr<bf16>>
      %c2 = ttg.async_copy_global_to_local %p, %q : tensor<64x!tt.ptr<i32>>
      scf.yield
    }
    %late = tt.load %never_seen
    """
    assert codegen.loop_order(ttgir) == ["wait:2", "dot", "exp2", "copy:kv", "copy:idx"]
    with pytest.raises(ValueError, match="no scf.for"):
        codegen.loop_order("tt.func @k() {}")


def test_rocm_defaults_fit_the_lds_of_an_mi300x(reports):
    """Triton's AMD backend cannot launch a kernel that asks for more LDS than a workgroup has (64 KB on gfx942).
    Every config of the ROCm table (16-bit and fp32) fits without scratch, compiled for the MI300X and for the
    MI355X (gfx950); the NVIDIA small-batch tile would not (it asks for 144 KB)."""
    rules = policy.tuned_table("rocm")["rules"]
    assert len(reports["amd"]) == sum(2 * (1 if r["when"].get("fp32") else 2) for r in rules)
    for r in reports["amd"]:
        assert r["shared"] <= ROCM_LDS_BYTES and r["scratch_bytes"] == 0, r
    assert reports["amd_nvidia_tile"]["shared"] > ROCM_LDS_BYTES, reports["amd_nvidia_tile"]


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="arch must be one of"):
        codegen.amd_kernel_report(mla.TritonConfig(), arch="gfx1100")
    with pytest.raises(ValueError, match="pdl=True is NVIDIA-only"):
        codegen.merge_kernel_report(pdl=True, arch="gfx942")
    with pytest.raises(ValueError, match="arch must be one of"):
        codegen.merge_kernel_report(pdl=False, arch="gfx1100")
    with pytest.raises(ValueError, match="dtype must be one of"):
        codegen.gluon_kernel_report(dtype="fp32")  # the Gluon kernels are 16-bit only
    with pytest.raises(ValueError, match="block_m must be one of"):
        codegen.gluon_swap_kernel_report(block_m=64)


def test_expansion_kernel_compiles_for_rocm_and_hopper(reports):
    """The index expansion (chapter 2) runs wherever the decode does; it compiles for MI300X, MI250X and
    Hopper with a few KB of shared memory."""
    assert [r["arch"] for r in reports["expand"]] == ["gfx942", "gfx90a", "sm_90"]
    assert all(0 < r["shared"] <= 16384 for r in reports["expand"]), reports["expand"]
    with pytest.raises(ValueError, match="arch must be one of"):
        codegen.expand_kernel_report("sm_75")


def test_pdl_expansion_reads_nothing_before_its_wait(reports):
    """Launched with PDL, the expansion may start while the kernel before it still runs (which may be writing
    block_table or seq_lens): its PTX must not load from global memory before griddepcontrol.wait, and it lets
    the next kernel launch (griddepcontrol.launch_dependents). Without PDL there is no wait at all."""
    r = reports["expand_pdl"]
    assert r["has_wait"] and r["global_reads_before_wait"] == 0 and r["launch_dependents_after_wait"], r
    assert r["global_writes_before_wait"] == 0, r
    plain = reports["expand"][2]
    assert plain["arch"] == "sm_90" and not plain["has_wait"] and not plain["has_launch_dependents"], plain
    assert plain["global_reads_before_wait"] > 0  # the count sees the kernel's loads when there is no wait
    # the prefix sum of 256 seq_lens is reduced inside each warp (shuffles), with no CTA barrier before the first
    # store; the earlier version reduced a 256-wide vector across warps and cost 256 x 4k about 0.2-0.4 us
    assert r["barriers_before_first_store"] == 0 and plain["barriers_before_first_store"] == 0, (r, plain)
    with pytest.raises(ValueError, match="pdl needs an NVIDIA target"):
        codegen.expand_kernel_report("gfx942", pdl=True)


def test_request_group_path_compiles_and_reads_nothing_before_its_wait(reports):
    """The path that packs 8 requests into one program (expand_config's choice for thousands of short requests)
    compiles for MI300X and Hopper, and launched with PDL it too reads nothing before griddepcontrol.wait."""
    amd, hopper = reports["expand_group"]
    assert (amd["arch"], amd["group"], hopper["group"]) == ("gfx942", 8, 8)
    assert all(0 <= r["shared"] <= 16384 for r in (amd, hopper)), (amd, hopper)
    assert hopper["has_wait"] and hopper["global_reads_before_wait"] == 0 and hopper["global_writes_before_wait"] == 0
    assert hopper["launch_dependents_after_wait"], hopper
    # one warp: the group's cumsum and the prefix sum's reduction stay in the warp, no CTA barrier before a store
    assert hopper["barriers_before_first_store"] == 0, hopper


def test_broadcast_blocks_loads_each_block_id_once(reports):
    """``ExpandConfig.broadcast_blocks`` (part of expand_config's choice for many short requests): a one-warp
    program of 1024 tokens loads the block id of every token without it (32 loads per lane per chunk, in each of
    the kernel's two chunk paths), and each of the chunk's ids once with it (2 per lane at K = 16, 1 when the
    chunk lies inside one block, K = 2048); launched with PDL it still reads nothing before its wait. The same
    holds with the prefix sum's loads issued first and summed in uint32, as expand_config launches it."""
    r = reports["expand_bcast"]
    for K in (16, 2048):
        per_token, once = r[f"{K}/False"], r[f"{K}/True"]
        assert once["global_loads"] * 4 <= per_token["global_loads"], (K, once, per_token)
        assert once["has_wait"] and once["global_reads_before_wait"] == 0 and once["global_writes_before_wait"] == 0
    many = reports["expand_many"]
    assert many["has_wait"] and many["global_reads_before_wait"] == 0 and many["global_writes_before_wait"] == 0
    assert many["launch_dependents_after_wait"] and many["global_loads"] == r["16/True"]["global_loads"], many
    # and it compiles for MI300X and MI250X, where vLLM's AITER MLA runs, in a few KB of LDS
    assert [a["arch"] for a in reports["expand_many_amd"]] == ["gfx942", "gfx90a"]
    assert all(0 < a["shared"] <= 16384 for a in reports["expand_many_amd"]), reports["expand_many_amd"]


def test_pdl_decode_kernels_read_nothing_before_their_wait(reports):
    """The NVIDIA defaults launch both decode kernels with PDL. The split kernel may start while the kernel before
    it (the previous layer's projection, the index expansion, the last call's merge) still runs, and the merge while
    the split kernel runs: neither may read or write global memory before griddepcontrol.wait. Each lets its
    dependents launch only after its own wait, so a kernel that starts early behind it knows every earlier kernel
    has finished. Without PDL the merge has no wait, and the check sees its reads."""
    for name, r in reports["triton"].items():
        assert r["has_wait"] and r["global_reads_before_wait"] == 0 and r["global_writes_before_wait"] == 0, (name, r)
        assert r["launch_dependents_after_wait"], (name, r)
    merge_pdl, merge_plain = reports["merge"]
    assert merge_pdl["has_wait"] and merge_pdl["global_reads_before_wait"] == 0, merge_pdl
    assert merge_pdl["launch_dependents_after_wait"], merge_pdl
    assert not merge_plain["has_wait"] and merge_plain["global_reads_before_wait"] > 0, merge_plain
    for r in reports["gluon"] + reports["gluon_ws"] + reports["gluon_swap"]:
        assert r["pdl"] == {"has_wait": True, "global_reads_before_wait": 0, "global_writes_before_wait": 0,
                            "has_launch_dependents": True, "launch_dependents_after_wait": True}, r


def test_merge_tiles_compile_without_spills(reports):
    """The one-warp merge tiles above 64 rows (8 rows x 128, 64 or 32 columns, at most 128 partial values per
    thread), each with the split chunks it is launched with for 2..32 splits, compile for Hopper and for MI300X
    (gfx942) without spills or scratch."""
    tiles = {(tuple(r["tile"]), r["warps"]) for r in reports["merge_tiles"]}
    assert tiles == {((8, 32), 1), ((8, 64), 1), ((8, 128), 1)}, tiles
    for r in reports["merge_tiles"]:
        if r["arch"] == "sm_90":
            assert r["spill_bytes"] == 0 and r["regs"] is not None, r
        else:
            assert r["scratch_bytes"] == 0 and r["vgprs"] is not None, r


CONTROL_SCRIPT = f"""
import json, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from triton.experimental.gluon._runtime import GluonASTSource
from workbench import codegen
import wgmma_pipeline_kernels as w
out = {{}}
for phi in (False, True):
    k = codegen._compile(w.carried_product_kernel, {{"A": "*fp16", "OUT": "*fp32", "iters": "i32"}}, dict(PHI=phi),
                         {{"A", "OUT"}}, codegen.HOPPER, dict(num_warps=4), source=GluonASTSource)
    out[str(phi)] = codegen._ptxas_usage(k.asm["ptx"], "carried")[2]
print(json.dumps(out))
"""


def test_no_hopper_kernel_has_its_wgmma_serialised(reports, run_compiled):
    """ptxas runs every wgmma of a function one at a time, with only a note (C7514, C7515) to say so, when a
    non-wgmma instruction may touch an accumulator whose product is in flight: the kernel stays correct and loses
    the overlap of its products (a warpgroup 0 that carried its next S in flight across the loop's back edge did
    this). The control kernel shows that the note is found: the same product loop serialised only where an
    in-flight accumulator meets ordinary instructions in the loop's phi."""
    control = run_compiled(CONTROL_SCRIPT)
    assert control["False"] is None and "serialized" in (control["True"] or ""), control
    hopper = [("triton " + k, r) for k, r in reports["triton"].items()] + [("triton 16x64", reports["old"])]
    hopper += [(f"{name} {i}", r) for name in ("gluon", "gluon_ws", "gluon_swap") for i, r in enumerate(reports[name])]
    assert len(hopper) >= 14
    for label, r in hopper:
        assert r["wgmma_serialized"] is None, (label, r["wgmma_serialized"])


def test_gluon_split_kernel_fits_and_keeps_its_schedule(reports):
    """workbench.mla.gluon's split kernel: no spills, shared memory within an H200 program's 227 KB (the query tile
    and two 64-row buffers, 216 KB, plus the softmax's exchange), 40 wgmma (36 for q k^T over 576 values, 4 for
    P V), a cp.async wait that leaves one group in flight (the next tile's copies run during this tile's math: the
    point of the kernel), and the output or 16-bit partial stored row-major in 16-byte vectors (16 per thread: 64
    rows x 512 values x 2 bytes over 256 threads)."""
    for r in reports["gluon"]:
        assert r["spill_bytes"] == 0 and r["regs"] <= 255, r
        assert 216 * 1024 <= r["shared"] <= codegen.GLUON_SMEM_LIMIT, r
        assert r["wgmma"] == 40 and 1 in r["cp_async_wait"], r
        assert r["global_stores"].get("st.global.v4.b32") == 16, r["global_stores"]


def test_gluon_ws_kernel_keeps_the_seesaw_schedule(reports):
    """The warp-specialised kernel: within an H200 program's shared memory (query, two 64-token tiles, the row
    statistics, the mbarriers); 92 wgmma over its two warpgroup functions (each 36 for S over 512 + 64 values in
    k-steps of 16, and 4 per P V site over a 64-token tile: two in warpgroup 0, three in warpgroup 1, one of them
    for an odd last tile); every wgmma wait leaves nothing in flight but one, where warpgroup 1 hands back its own
    column group after its own product while the other's is still running; its partitions synchronise on named
    128-thread barriers (a CTA-wide barrier inside a partition would deadlock) and mbarriers (each buffer's two
    column groups, the query, the end); the consumer warpgroups hand over on four 256-thread named barriers (8-11:
    max and P, for each warpgroup), each both arrived on and waited for, on ids the compiler's own partition
    barriers do not use; a warpgroup's own P V takes P from registers, the other's P is read from shared memory by
    the product itself (8 of the 20 from registers); each warpgroup's half of the output or partial leaves in
    16-byte vectors; no spills at the 168-register cap (the query tiles indexed by an opaque zero keep the wgmma
    descriptors out of registers): a compiler change that spills shows here before it shows as a slower default."""
    assert len(reports["gluon_ws"]) == 2
    for r in reports["gluon_ws"]:
        assert r["shared"] <= codegen.GLUON_SMEM_LIMIT and r["wgmma"] == 92, r
        assert {int(k): v for k, v in r["wgmma_waits"].items()} == {0: 7, 1: 1} and r["mbarrier_waits"] >= 8, r
        assert len(r["partition_barriers"]) >= 2 and r["cp_async_wait"] == [0], r
        assert r["handover_barriers"] == {"arrive": list(range(8, 12)), "sync": list(range(8, 12))}, r
        own = {int(b.split()[1].rstrip(",")) for b in r["partition_barriers"]}
        assert own and max(own) < 8, r["partition_barriers"]
        assert r["global_stores"].get("st.global.v4.b32", 0) >= 32 and "st.global.v2.b32" not in r["global_stores"]
        assert r["spill_bytes"] == 0, r
        assert r["pv_wgmma"] == {"total": 20, "a_registers": 8}, r["pv_wgmma"]


def test_gluon_swap_kernel_reads_operands_once_and_keeps_a_tile_in_flight(reports):
    """The swapped kernel (at most 32 rows on Hopper): no spills, shared memory within an H200's 227 KB and over
    half of it (one program per SM); 68 wgmma (36 for ``S^T = K q^T``, 32 for ``O^T = V^T P^T``) of shape
    m64n<its rows>k16, no ``ldmatrix`` (every product reads its operands from shared memory itself, once per tile),
    the next tile's copies in flight during a tile's math, the output or partial stored row-major in 16-byte
    vectors."""
    assert len(reports["gluon_swap"]) == 4
    for r in reports["gluon_swap"]:
        label = f"gluon_swap {r['block_m']} rows direct={r['direct']}"
        assert r["spill_bytes"] == 0 and r["regs"] <= 255 and 4 * r["regs"] * 32 <= 65536, (label, r)
        assert codegen.GLUON_SMEM_LIMIT // 2 < r["shared"] <= codegen.GLUON_SMEM_LIMIT, (label, r["shared"])
        assert r["wgmma"] == 68 and r["wgmma_shapes"] == [f"m64n{r['block_m']}k16"], (label, r)
        assert r["global_stores"].get("st.global.v4.b32", 0) >= 8 and r["ldmatrix"] == 0, (label, r)
        assert r["cp_async_wait"] == [0, 1], (label, r["cp_async_wait"])
