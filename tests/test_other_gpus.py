"""The MLA decode on NVIDIA GPUs other than the H200 it was tuned on (Ampere, Ada, Blackwell).

Two failures a user there would have hit, found by compiling for those targets without the hardware:

* the Gluon split kernels use Hopper's ``wgmma``; on compute capability 10.x or 12.x compiling them aborts the
  process in LLVM ("Cannot select: intrinsic %llvm.nvvm.wgmma..."), and the library chose them on any 9.0+ GPU;
* the Triton tiles tuned on the H200 ask for more shared memory than other GPUs give one program (64x64 tiles
  345 KB on sm_100, the small-batch 16x64 tile 164 KB against an A100's 163 KB, and most tiles above the 99 KB of
  Ada and the RTX 50 series), so Triton refused to load them.

The library chooses the Gluon kernels on Hopper only, and steps down :func:`workbench.mla.shared_memory_ladder`
when a kernel does not fit. Checked here: the choice (with a faked GPU), the ladder, the fallback under the
interpreter, the steps on each target as Triton compiles them (no GPU needed), the expansion and merge kernels
compiled for those targets, and, on a GPU, the fallback's results against the golden with the GPU's shared memory
faked down to 99 KB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import workbench  # noqa: F401  (sets TRITON_INTERPRET on CPU before kernels import)
from workbench import codegen, device, mla
from workbench.mla import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fake_nvidia(monkeypatch, capability):
    """Make the library believe it runs compiled on an NVIDIA GPU of ``capability``."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: capability)
    monkeypatch.setattr(device, "interpreter_active", lambda: False)
    monkeypatch.setattr(torch.version, "hip", None)


@pytest.mark.parametrize("capability, hopper", [((9, 0), True), ((10, 0), False), ((10, 3), False),
                                                ((12, 0), False), ((8, 0), False), ((8, 9), False)])
def test_gluon_kernels_are_chosen_on_hopper_only(monkeypatch, capability, hopper):
    fake_nvidia(monkeypatch, capability)
    cuda = torch.device("cuda")
    assert device.hopper(cuda) is hopper
    assert device.pdl_available(cuda) is (capability[0] >= 9)  # PDL (griddepcontrol) is sm_90+, Blackwell too
    assert device.gluon_available() is hopper
    assert (mla.triton_config(64, torch.bfloat16, backend="cuda", sm_count=132).kernel == "gluon") is hopper
    assert (mla.triton_config(16, torch.bfloat16, backend="cuda", sm_count=132).kernel == "gluon_swap") is hopper


def test_a_gluon_config_off_hopper_is_refused_with_the_reason(monkeypatch):
    """Asked for explicitly on a Blackwell GPU, a gluon config gets an error naming the rule, not an LLVM abort."""
    fake_nvidia(monkeypatch, (10, 0))
    q = torch.zeros(1, 16, mla.QK_HEAD_DIM, dtype=torch.bfloat16)
    monkeypatch.setattr(device, "compiled_nvidia", lambda dev: True)  # q stands in for a cuda tensor
    for what in ("gluon", "gluon_ws", "gluon_swap"):
        with pytest.raises(ValueError, match=r"Hopper GPU \(compute capability 9\.x\).*Blackwell.*capability 10\.0"):
            launch._check_gluon_call(q, what)


def test_ladder_steps_down_stages_then_tokens_then_rows():
    cfg = mla.TritonConfig(block_m=64, block_n=64, num_warps=8, num_stages=3, programs_per_sm=1, pdl=True)
    ladder = mla.shared_memory_ladder(cfg)
    shapes = [(c.block_m, c.block_n, c.num_warps, c.num_stages) for c in ladder]
    # the order an H200 with its shared memory limited to 99 KB measured at the 64-row points: stages, tokens,
    # rows, then the library's 16-row tile and smaller
    assert shapes == [(64, 64, 8, 2), (64, 32, 8, 2), (32, 64, 8, 2), (16, 32, 4, 3), (16, 32, 4, 2), (16, 16, 4, 2),
                      (16, 16, 4, 1)]
    for c in ladder:  # the other fields stay; residency is estimated again; indices one tile ahead from 2 stages
        assert (c.pdl, c.programs_per_sm, c.idx_ahead) == (True, None, c.num_stages > 1), c
    small = mla.TritonConfig(block_m=16, block_n=64, num_warps=8, num_stages=3, idx_ahead=True, narrow_partials=True)
    assert all(c.idx_ahead and c.narrow_partials for c in mla.shared_memory_ladder(small))
    for rule in mla.tuned_table("nvidia")["rules"]:  # the Gluon kernels run on Hopper only: no ladder
        if rule["_config"].kernel != "triton":
            assert mla.shared_memory_ladder(rule["_config"]) == []
    assert mla.shared_memory_ladder(mla.TritonConfig(block_m=16, block_n=16, num_warps=1, num_stages=1)) == []


def _fake_limit(monkeypatch, fits):
    """Make every launch of a config for which ``fits(cfg)`` is false raise Triton's shared-memory error (as
    Triton does when it loads a kernel that needs more than the GPU has), and count the launches."""
    from triton.runtime.errors import OutOfResources

    real = launch._launch
    seen = []

    def fake_launch(*args):
        cfg = args[9]
        seen.append(cfg.label)
        if not fits(cfg):
            raise OutOfResources(300_000, 101_376, "shared memory")
        return real(*args)

    monkeypatch.setattr(launch, "_launch", fake_launch)
    monkeypatch.setattr(launch, "SHARED_MEMORY_FALLBACKS", {})
    return seen


@pytest.mark.interpreter
def test_fallback_steps_down_until_it_fits_and_is_exact(monkeypatch):
    from mla_cases import assert_triton_exact, make_case  # noqa: PLC0415 (tests/ is on sys.path under pytest)

    big = mla.TritonConfig(block_m=16, block_n=32, num_warps=1, num_stages=3, max_splits=4, merge_block_r=16,
                           merge_block_d=mla.KV_LORA_RANK)
    monkeypatch.setattr(launch, "triton_config", lambda *a, **k: big)
    seen = _fake_limit(monkeypatch, lambda c: c.block_n <= 16)
    case = make_case([1, 1, 1], [1, 17, 100], 3)
    with pytest.warns(RuntimeWarning) as caught:
        assert_triton_exact(case, 1, None, None)
    assert [str(w.message).split("trying ")[1].split("'")[1] for w in caught] == seen[1:]
    assert "needs 300000 bytes of shared memory and this GPU gives a program 101376" in str(caught[0].message)
    assert seen == ["triton 16x32 w1 s3", "triton 16x32 w1 s2 ia", "triton 16x32 w4 s2 ia", "triton 16x16 w4 s2 ia"]
    # later calls start from the rung that fitted (on a GPU: triton_launch_plan looks it up)
    assert [c.label for c in launch.SHARED_MEMORY_FALLBACKS.values()] == ["triton 16x16 w4 s2 ia"]
    # a config the caller chose is not changed behind their back: a clear error instead
    with pytest.raises(ValueError, match=r"config 'triton 16x32 w1 s3': its split kernel needs 300000 bytes of"):
        assert_triton_exact(case, 1, 2, big)
    # nothing left to try
    monkeypatch.setattr(launch, "SHARED_MEMORY_FALLBACKS", {})
    _fake_limit(monkeypatch, lambda c: False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(RuntimeError, match="no smaller config is left to try"):
            assert_triton_exact(case, 1, None, None)


FIT_CASES = (  # (rows, dtype, total tokens): the Triton defaults a GPU other than Hopper gets
    (16, "bf16", None), (16, "bf16", 65536), (32, "bf16", None), (64, "bf16", None), (16, "fp32", None),
    (64, "fp32", None))

FIT_SCRIPT = """
import json, torch
from workbench import codegen, mla
dt = {"bf16": torch.bfloat16, "fp32": torch.float32}
out = []
for arch in ("sm_80", "sm_89", "sm_100"):
    for rows, dtype, tokens in %r:
        cfg = mla.triton_config(rows, dt[dtype], tokens, backend="cuda", gluon=False)
        out.append(dict(codegen.shared_memory_fit(cfg, arch, dtype=dtype), rows=rows, dtype=dtype, tokens=tokens,
                        chosen=cfg.label))
# the rest of the pipeline as the library launches it there: the expansion (one-warp and 4-warp launches, and the
# one-warp launch for many short requests) and the second-kernel merge, with PDL from sm_90 on
rest = []
for arch in ("sm_80", "sm_89", "sm_100", "sm_120"):
    pdl = arch != "sm_80" and arch != "sm_89"
    for warps in (1, 4):
        rest.append(dict(codegen.expand_kernel_report(arch, num_warps=warps, pdl=pdl), kernel="expand", warps=warps))
    rest.append(dict(codegen.expand_kernel_report(arch, num_warps=1, pdl=pdl, broadcast=True, prefix_first=True,
                                                  prefix_u32=True), kernel="expand many", warps=1))
    rest.append(dict(codegen.merge_kernel_report(pdl=pdl, arch=arch), kernel="merge"))
print(json.dumps(dict(fits=out, rest=rest)))
""" % (FIT_CASES,)


@pytest.fixture(scope="module")
def compiled(run_compiled):
    return run_compiled(FIT_SCRIPT, timeout=900)


@pytest.fixture(scope="module")
def fits(compiled):
    return compiled["fits"]


def test_expansion_and_merge_compile_for_other_nvidia_gpus(compiled):
    """The kernels before and after the split kernel compile for A100, Ada, B200 and the RTX 50 series as the
    library launches them there (PDL from sm_90 on: Ada and Ampere have no griddepcontrol), with little shared
    memory, and with PDL read nothing before the wait (the kernel before may write what they read)."""
    rest = compiled["rest"]
    assert {(r["arch"], r["kernel"]) for r in rest} == {(a, k) for a in ("sm_80", "sm_89", "sm_100", "sm_120")
                                                        for k in ("expand", "expand many", "merge")}
    for r in rest:
        if r["kernel"] == "expand":
            assert r["shared"] <= 16 * 1024 and r["barriers_before_first_store"] == 0, r
        if r["kernel"] == "expand many":  # its broadcast block ids reach the store layout through shared memory
            assert r["shared"] <= 16 * 1024, r
        pdl_launched = r["arch"] in ("sm_100", "sm_120")
        assert r["has_wait"] is pdl_launched, r
        if pdl_launched:
            assert r["global_reads_before_wait"] == 0 and r["has_launch_dependents"], r


def test_every_default_fits_each_target_within_its_ladder(fits):
    """Compiled for A100 (sm_80), Ada (sm_89, the 99 KB class of the RTX 50 series too) and B200 (sm_100), each
    Triton default reaches a config that fits within its ladder, and the steps are the ones measured when this was
    written (Triton 3.7): the 64x64 tile needs 345 KB on sm_100 and steps to 64x32 with 2 stages; on 99 KB GPUs
    the 64-row tile ends at the library's 16-row tile (16x32, 4 warps, 3 stages); the A100 keeps every 16-bit
    default but the small-batch tile (164 KB)."""
    by = {(f["arch"], f["rows"], f["dtype"], f["tokens"]): f for f in fits}
    for f in fits:
        assert f["fits"] is not None, f
        assert f["tried"][-1][1] <= f["limit"] < min(s for _, s in f["tried"][:-1] or [[None, 1 << 30]]), f
    assert by[("sm_100", 64, "bf16", None)]["fits"] == "triton 64x32 w8 s2 ia pdl"
    assert by[("sm_100", 64, "bf16", None)]["tried"][0][1] > 300_000
    assert by[("sm_89", 64, "bf16", None)]["fits"] == "triton 16x32 w4 s3 ia pdl"
    assert by[("sm_80", 16, "bf16", 65536)]["fits"] == "triton 16x64 w8 s2 ia pdl np"
    for rows, tokens in ((16, None), (32, None), (64, None)):  # A100 keeps these 16-bit tiles as they are
        f = by[("sm_80", rows, "bf16", tokens)]
        assert len(f["tried"]) == 1 and f["fits"] == f["chosen"], f


@pytest.mark.gpu
def test_fallback_on_a_gpu_with_its_shared_memory_faked_to_99_kb():
    """On the GPU here, with Triton told the GPU gives a program 99 KB (an RTX 4090's or 5090's) and the gluon
    kernels off (as on a GPU that is not Hopper): every Triton default steps down to a tile that fits, runs, and
    agrees with the golden. In a subprocess, so that no kernel compiled earlier skips Triton's check."""
    if torch.version.hip is not None:
        pytest.skip("the check fakes the shared memory of an NVIDIA GPU (ROCm tiles have their own table)")
    script = """
import json, torch
from triton.runtime import driver
import workbench
from workbench import mla
from mla_cases import check_against_golden, make_case
utils = driver.active.utils
real = utils.get_device_properties
utils.get_device_properties = lambda dev: dict(real(dev), max_shared_mem=101_376)
workbench.device.gluon_available = lambda: False
out = []
for qlen, heads, dtype, kv in ((1, 16, torch.bfloat16, [700, 33, 1200]), (2, 16, torch.bfloat16, [64, 900]),
                               (4, 16, torch.bfloat16, [300, 5, 1000]), (1, 128, torch.float16, [257, 40]),
                               (1, 16, torch.float32, [100, 20]), (4, 16, torch.float32, [64, 130])):
    case = make_case([qlen] * len(kv), kv, heads, dtype=dtype, device="cuda", seed=qlen)
    o, lse = mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                   case["kv_indices"], qlen, 0.07)
    check_against_golden(case, o, lse, dtype, 0.07, f"qlen {qlen} heads {heads} {dtype}")
    chosen = mla.triton_config(qlen * heads, dtype, case["kv_indices"].numel(), num_reqs=len(kv),
                               sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
    used = mla.triton_launch_plan(case["q"], case["qo_indptr"], case["kv_indices"], qlen)[0]
    out.append(dict(qlen=qlen, heads=heads, dtype=str(dtype), chosen=chosen.label, used=used.label,
                    ladder=[c.label for c in mla.shared_memory_ladder(chosen)]))
print(json.dumps(dict(cases=out, fallbacks=sorted(c.label for c in mla.SHARED_MEMORY_FALLBACKS.values()))))
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")]))
    res = subprocess.run([sys.executable, "-W", "ignore::RuntimeWarning", "-c", script], capture_output=True,
                         text=True, env=env, timeout=600, check=False, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-4000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    cases = report["cases"]
    assert len(cases) == 6
    for c in cases:  # the config used is the chosen one, or a rung of its ladder (the one that fitted)
        assert c["used"] == c["chosen"] or c["used"] in c["ladder"], c
    # the steps depend on how Triton lays out shared memory for this GPU; the 64-row tiles (qlen 4, 128 heads)
    # and the fp32 tiles cannot stay as they are under 99 KB (on an H200 the 64-row tile ends at 32x16)
    for c in cases:
        if c["qlen"] * c["heads"] >= 64 or c["dtype"] == "torch.float32":
            assert c["used"] != c["chosen"], c
    assert {c["used"] for c in cases if c["used"] != c["chosen"]} == set(report["fallbacks"]), report
