"""What Triton makes of the decode split kernel for Hopper, without a GPU.

Triton compiles for a named target on any machine: ``triton.compile`` with ``GPUTarget("cuda", 90, 32)``
runs the whole pipeline (TTIR, TTGIR, LLVM, PTX) and its bundled ``ptxas`` assembles the PTX and reports
registers and spills. Chapter 3 found its main speed-up in that IR (the row gather of the old 16-row tile had
one shared-memory buffer), and this session found a 3 % slowdown in it (an equivalent rewrite of one index load
raised the small-batch tile from 142 to 171 registers on Triton 3.6). This module turns both into checks that
run in CI: :func:`split_kernel_report` compiles the split kernel of a :class:`workbench.mla.TritonConfig` and
returns its registers, spills, the shapes of its shared-memory buffers and the waits of its pipelined loop.

The same works for AMD targets: :func:`amd_kernel_report` compiles the kernel for ``gfx942`` (MI300X) with
Triton's AMD backend and reports the LDS it asks for, its VGPRs and its scratch; CI checks that the ROCm
defaults fit the 64 KB of LDS a workgroup has there.

It needs compiled Triton: run it in a process with ``TRITON_INTERPRET=0`` (under the interpreter the kernels
are Python functions and there is nothing to compile; it raises a clear error there).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import os
import re
import subprocess
import tempfile
from typing import Any

from workbench import device

HOPPER = ("cuda", 90, 32)  # backend, compute capability, warp size

# Kernel arguments that are pointers or runtime integers, with their Triton types; every other argument is a
# compile-time constant (a tl.constexpr). The pointers and the cache row stride (576 elements) are passed as
# multiples of 16, as Triton specialises them at a real launch, so that 16-byte copies can be used.
_RUNTIME_ARGS = {"Q": "*{dt}", "KV": "*{dt}", "KV_INDICES": "*i32", "QO_INDPTR": "*i32", "KV_INDPTR": "*i32",
                 "OUT": "*fp32", "LSE": "*fp32", "FINAL_O": "*{dt}", "FINAL_LSE": "*fp32", "COUNTERS": "*i32",
                 "stride_kv": "i32", "total_rows": "i32", "qk_scale": "fp32", "num_splits": "i32"}
_DIVISIBLE_BY_16 = {"Q", "KV", "KV_INDICES", "QO_INDPTR", "KV_INDPTR", "OUT", "LSE", "FINAL_O", "FINAL_LSE",
                    "COUNTERS", "stride_kv"}


# (rows per request, KV tokens of the call) that select each default 16-bit config of mla.triton_config
DEFAULT_CASES = ((16, 65536), (16, None), (32, 65536), (32, None), (64, None))


def _ptxas() -> str:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(path):
        raise RuntimeError(f"Triton's bundled ptxas is missing ({path}): this Triton wheel cannot assemble for NVIDIA")
    return path


def _require_compiled() -> None:
    if device.interpreter_active():
        raise RuntimeError("workbench.codegen compiles the kernel: run it with TRITON_INTERPRET=0 (under the "
                           "interpreter the kernels are Python functions)")


def _compile(fn: Any, runtime: dict[str, str], consts: dict[str, Any], divisible: set[str], target: tuple,
             options: dict[str, Any], source: Any = None) -> Any:
    """Compile the @triton.jit ``fn`` for ``target`` (a GPUTarget tuple): ``runtime`` gives the Triton type of
    each runtime argument, ``consts`` the value of compile-time ones (else their default), and the arguments in
    ``divisible`` are specialised as multiples of 16, as a real launch with aligned tensors does."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    signature, constexprs = {}, {}
    for i, name in enumerate(names):
        if name in runtime:
            signature[name] = runtime[name]
            continue
        signature[name] = "constexpr"
        value = consts.get(name, fn.params[i].default)
        if value is inspect.Parameter.empty:
            raise ValueError(f"no value for the compile-time argument {name!r} of {fn.__name__}")
        constexprs[(i,)] = value
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in divisible}
    src = (source or ASTSource)(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget(*target), options=options)


# PTX instructions that read global memory: loads, asynchronous copies into shared memory, prefetches
_GLOBAL_READ = re.compile(r"\b(?:ld\.global|cp\.async\.(?:ca|cg)|cp\.async\.bulk|prefetch\.global|prefetch\.L2)")
_TMA_STORE = re.compile(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared")  # a TMA store (shared to global)
_GLOBAL_WRITE = re.compile(r"\b(?:st\.global|red\.global|atom\.global)")


def _async_waits(ptx: str) -> list[int]:
    """The distinct ``cp.async.wait_group`` counts of a PTX (the copy groups each wait leaves in flight)."""
    return sorted({int(n) for n in re.findall(r"cp\.async\.wait_group\s+(\d+)", ptx)})


def _global_stores(ptx: str) -> dict[str, int]:
    """How many ``st.global`` instructions of each kind a PTX has (``st.global.v4.b32``: 16-byte vectors)."""
    return dict(sorted(collections.Counter(re.findall(r"st\.global[\w.]*", ptx)).items()))


def pdl_report(ptx: str) -> dict[str, Any]:
    """PDL facts of a kernel's PTX: ``has_wait`` (``griddepcontrol.wait``), ``global_reads_before_wait`` (global
    loads, asynchronous copies and prefetches that come before the first wait in the PTX text; all of them when
    there is no wait; a PDL-launched kernel that reads before its wait may see what the kernel before it has not
    finished writing), ``has_launch_dependents`` and ``launch_dependents_after_wait`` (the first trigger comes
    after the first wait: then a kernel that starts early behind this one knows that every kernel before this one
    has finished, which is what makes ``meta_before_wait`` safe when only the kernel right before it is known not
    to write the metadata). ``global_writes_before_wait``: stores and atomics before the first wait (the kernel
    before may still read what they overwrite: always 0 here). ``l2_only_reads_before_wait``: those
    of the reads before the wait that leave nothing in L1 (``ld.global.cg`` and ``prefetch.global.L2``; the
    opt-in ``prefetch_before_wait`` reads only these, for prefetch addresses)"""
    wait = ptx.find("griddepcontrol.wait")
    trigger = ptx.find("griddepcontrol.launch_dependents")
    before = ptx[:wait] if wait >= 0 else ptx
    return {"has_wait": wait >= 0,
            "global_reads_before_wait": len(_GLOBAL_READ.findall(before)),
            "l2_only_reads_before_wait": len(re.findall(r"\bld\.global\.cg\b|\bprefetch\.global\.L2\b", before)),
            "global_writes_before_wait": len(_GLOBAL_WRITE.findall(before)),
            "has_launch_dependents": trigger >= 0,
            "launch_dependents_after_wait": trigger >= 0 and wait >= 0 and trigger > wait}


def _compile_split(cfg: Any, heads: int, dtype: str, pdl_split: bool | None, target: tuple) -> Any:
    """The compiled split kernel for ``target`` (a GPUTarget tuple), specialised as the library launches it
    with more than one split."""
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype must be 'bf16', 'fp16' or 'fp32', got {dtype!r}")
    _require_compiled()
    import torch

    from workbench import mla

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    nvidia = target[0] == "cuda"
    # the device only tells split_kernel_options whether the PTX-only features apply
    opts = mla.split_kernel_options(cfg, heads, torch_dtype, torch.device("cuda" if nvidia else "cpu"),
                                    launch_dependents=cfg.pdl and nvidia,
                                    pdl_split=(cfg.pdl_split if pdl_split is None else pdl_split) and nvidia)
    launch = {k: opts.pop(k) for k in ("num_warps", "num_stages", "launch_pdl", "maxnreg") if k in opts}
    options = {k: v for k, v in launch.items() if k in ("num_warps", "num_stages") or (k == "maxnreg" and nvidia)}
    runtime = {k: v.format(dt=dtype) for k, v in _RUNTIME_ARGS.items()}
    if cfg.tma_store:
        runtime["PART_DESC"] = f"tensordesc<fp32[{cfg.block_m}, 512]>"
    return _compile(mla._mla_decode_split_kernel, runtime,
                    dict(opts, DIRECT=False, FUSED_MERGE=cfg.fused_merge, TRACE_BUF=None, TRACE=False,
                         SIGNAL=cfg.spin_merge, TMA_STORE=cfg.tma_store),
                    _DIVISIBLE_BY_16, target, options)


AMD_TARGETS = {"gfx942": ("hip", "gfx942", 64), "gfx90a": ("hip", "gfx90a", 64),  # MI300X/MI325X, MI250X
               "gfx950": ("hip", "gfx950", 64)}  # MI355X/MI350X (160 KB of LDS; the ROCm tiles keep to 64 KB)

# NVIDIA GPUs other than Hopper: (GPUTarget tuple, shared memory one program may use, in bytes, with the opt-in)
OTHER_NVIDIA = {
    "sm_80": (("cuda", 80, 32), 166_912),  # A100: 163 KB
    "sm_89": (("cuda", 89, 32), 101_376),  # L40S, RTX 4090 (Ada; sm_86 has the same 99 KB)
    "sm_100": (("cuda", 100, 32), 232_448),  # B200, GB200: 227 KB
    "sm_120": (("cuda", 120, 32), 101_376),  # RTX 5090, RTX PRO 6000 (consumer Blackwell): 99 KB
}


def shared_memory_fit(cfg: Any, arch: str, heads: int = 16, dtype: str = "bf16") -> dict[str, Any]:
    """The steps :func:`workbench.mla.mla_decode_triton` takes on ``arch`` (a key of :data:`OTHER_NVIDIA`) when
    the library's config ``cfg`` runs out of shared memory there: compile ``cfg``'s split kernel for ``arch``, then
    each rung of :func:`workbench.mla.shared_memory_ladder` until one asks for no more shared memory than the GPU
    gives a program. Below sm_90 the configs compile without PDL, as they launch there (no ``griddepcontrol``).

    Returns ``{"arch", "limit", "tried": [[label, shared bytes], ...], "fits": the label that fits, or None}``.
    """
    from workbench import mla

    if arch not in OTHER_NVIDIA:
        raise ValueError(f"arch must be one of {sorted(OTHER_NVIDIA)}, got {arch!r}")
    target, limit = OTHER_NVIDIA[arch]
    tried: list[list[Any]] = []
    for rung in [cfg, *mla.shared_memory_ladder(cfg)]:
        launched = rung if _pdl_target(target) else dataclasses.replace(rung, pdl=False, pdl_split=False)
        shared = _compile_split(launched, heads, dtype, None, target).metadata.shared
        tried.append([rung.label, shared])
        if shared <= limit:
            return {"arch": arch, "limit": limit, "tried": tried, "fits": rung.label}
    return {"arch": arch, "limit": limit, "tried": tried, "fits": None}


def amd_kernel_report(cfg: Any, heads: int = 16, dtype: str = "bf16", arch: str = "gfx942") -> dict[str, Any]:
    """Compile the split kernel for an AMD GPU (Triton's AMD backend, on any machine) and report ``shared``
    (the LDS bytes Triton asks for at launch: a launch fails above the GPU's limit, 64 KB on ``gfx942``),
    ``vgprs`` and ``scratch_bytes`` (from the AMDGCN assembly's kernel notes; scratch is spilled registers)."""
    if arch not in AMD_TARGETS:
        raise ValueError(f"arch must be one of {sorted(AMD_TARGETS)}, got {arch!r}")
    import triton

    kernel = _compile_split(cfg, heads, dtype, False, AMD_TARGETS[arch])
    return {"label": cfg.label, "arch": arch, "shared": kernel.metadata.shared, **_amd_usage(kernel.asm["amdgcn"]),
            "triton": triton.__version__}


def _amd_usage(amdgcn: str) -> dict[str, int | None]:
    """``vgprs`` and ``scratch_bytes`` (spilled registers) from the kernel notes of AMDGCN assembly."""
    vgprs = re.findall(r"NumVgprs:\s+(\d+)", amdgcn)
    scratch = re.findall(r"ScratchSize:\s+(\d+)", amdgcn)
    return {"vgprs": int(vgprs[0]) if vgprs else None, "scratch_bytes": int(scratch[0]) if scratch else None}


def _target(arch: str) -> tuple:
    """The GPUTarget tuple of ``arch``: ``"sm_90"`` (Hopper), one of :data:`OTHER_NVIDIA` or of :data:`AMD_TARGETS`."""
    targets = dict(AMD_TARGETS, sm_90=HOPPER, **{k: v[0] for k, v in OTHER_NVIDIA.items()})
    if arch not in targets:
        raise ValueError(f"arch must be one of {sorted(targets)}, got {arch!r}")
    return targets[arch]


def _pdl_target(target: tuple) -> bool:
    """PDL (``griddepcontrol``) compiles for ``target``: NVIDIA, compute capability 9.0 or newer."""
    return target[0] == "cuda" and target[1] >= 90


def expand_kernel_report(arch: str = "gfx942", block_t: int = 1024, num_warps: int = 4, *,
                         pdl: bool = False, group: int = 1, broadcast: bool = False, K: int = 16,
                         prefix_first: bool = False, prefix_u32: bool = False) -> dict[str, Any]:
    """Compile the index-expansion kernel (``workbench.expand``, chunks first, streaming stores; kernel block size
    ``K``) for ``arch`` (``"sm_90"``, one of :data:`OTHER_NVIDIA` or of :data:`AMD_TARGETS`) and report the shared
    memory (LDS) it asks for.
    ``group`` > 1: the path that packs that many requests into one program (``ExpandConfig.group``).
    ``broadcast``: one load per block id (``ExpandConfig.broadcast_blocks``); ``prefix_first``, ``prefix_u32``: as
    ``ExpandConfig``'s (with ``broadcast``, what :func:`workbench.expand.expand_config` picks for many short
    requests). On NVIDIA targets also
    ``global_loads``: the ``ld.global`` instructions in the PTX (every path of the kernel, per thread).

    ``pdl`` (NVIDIA sm_90 or newer only): compile it as launched with programmatic dependent launch, and report
    ``global_loads_before_wait`` (``ld.global`` instructions in the PTX before its first ``griddepcontrol.wait``:
    must be 0, since the kernel before may write block_table and seq_lens) and ``has_launch_dependents``; on
    NVIDIA targets also ``barriers_before_first_store`` (CTA barriers before the first global store: 0, as the prefix
    sum of seq_lens is reduced inside each warp)."""
    target = _target(arch)
    if pdl and not _pdl_target(target):
        raise ValueError(f"pdl needs an NVIDIA target of sm_90 or newer: PDL is griddepcontrol PTX; got arch {arch!r}")
    _require_compiled()
    import triton
    from workbench import expand
    runtime = {"block_table_ptr": "*i32", "block_table_stride": "i32", "max_blocks": "i32", "seq_lens_ptr": "*i32",
               "kv_indptr_ptr": "*i32", "kv_indices_ptr": "*i32", "num_reqs": "i32"}
    consts = dict(K=K, BLOCK_T=block_t, BLOCK_R=256, PREFIX_LOOP=False, INDPTR_IN=False, STORE_CACHE=".cs",
                  CHUNKS_FIRST=True, PDL=pdl, GROUP=group, BCAST=expand.broadcast_applies(broadcast, K),
                  PREFIX_FIRST=prefix_first, PREFIX_U32=prefix_u32)
    kernel = _compile(expand._expand_page_indices_kernel, runtime, consts, {n for n in runtime if n.endswith("_ptr")},
                      target, dict(num_warps=num_warps))
    report: dict[str, Any] = {"arch": arch, "group": group, "shared": kernel.metadata.shared,
                              "triton": triton.__version__}
    if target[0] == "cuda":
        ptx = kernel.asm["ptx"]
        report.update(pdl_report(ptx))
        report["global_loads"] = len(re.findall(r"\bld\.global\b", ptx))
        # the prefix sum of seq_lens stays inside each warp: no CTA barrier before the first store
        first_store = _GLOBAL_WRITE.search(ptx)
        report["barriers_before_first_store"] = len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b",
                                                               ptx[:first_store.start()] if first_store else ptx))
    return report


def merge_kernel_report(pdl: bool = True, dtype: str = "bf16", *, spin: bool = False,
                        arch: str = "sm_90") -> dict[str, Any]:
    """Compile the decode's second-kernel merge as the library launches it with PDL (waiting for the split
    kernel, then letting the next call's split kernel launch) and report :func:`pdl_report`. ``spin``: the spin
    merge (``TritonConfig.spin_merge``: no PDL wait, the rows' counts polled instead); its report also holds
    ``acquire_polls`` (acquire atomics at GPU scope in the PTX). ``arch``: ``"sm_90"`` or one of
    :data:`AMD_TARGETS` (there only that it compiles: ``vgprs`` and ``scratch_bytes``) or of :data:`OTHER_NVIDIA`
    (``pdl`` from sm_90 on)."""
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype must be 'bf16', 'fp16' or 'fp32', got {dtype!r}")
    target = _target(arch)
    if pdl and not _pdl_target(target):
        raise ValueError(f"pdl=True is NVIDIA-only (griddepcontrol, sm_90+); the library launches the merge on {arch} "
                         "without it: pass pdl=False")
    _require_compiled()
    from workbench import mla
    runtime = {"MID_O": "*fp32", "MID_LSE": "*fp32", "OUT": f"*{dtype}", "LSE": "*fp32", "total_rows": "i32",
               "num_splits": "i32"}
    consts = dict(BLOCK_R=16, BLOCK_D=16, SPLIT_CHUNK=8, D_LATENT=mla.KV_LORA_RANK, GDC_WAIT=pdl and not spin,
                  LAUNCH_DEPENDENTS=pdl, TRACE_BUF=None, TRACE=False, SPIN=spin)
    if spin:
        runtime.update(COUNTERS="*i32", DONE="*i32")
    else:
        consts.update(COUNTERS=None, DONE=None)
    kernel = _compile(mla._mla_decode_merge_kernel, runtime, consts, {"MID_O", "MID_LSE", "OUT", "LSE"},
                      target, dict(num_warps=4))
    if target[0] != "cuda":
        return dict(_amd_usage(kernel.asm["amdgcn"]), pdl=pdl, spin=spin, arch=arch)
    ptx = kernel.asm["ptx"]
    return dict(pdl_report(ptx), pdl=pdl, spin=spin, arch=arch,
                acquire_polls=sum("atom." in ln and ".acquire" in ln and ".gpu" in ln for ln in ptx.splitlines()))


def merge_tile_report(block_r: int, block_d: int, split_chunk: int, arch: str = "sm_90",
                      dtype: str = "bf16", num_warps: int = 4) -> dict[str, Any]:
    """Compile the second-kernel merge with one tile (``block_r`` rows x ``block_d`` columns, ``split_chunk``
    partials loaded at once, ``num_warps`` warps; :meth:`workbench.mla.TritonConfig.merge_tile` and
    :meth:`~workbench.mla.TritonConfig.merge_num_warps` pick them) for ``arch``
    (``"sm_90"`` or one of :data:`AMD_TARGETS`) and report its registers and spills: ``regs`` and
    ``spill_bytes`` (``ptxas -v``) on NVIDIA, ``vgprs`` and ``scratch_bytes`` on AMD."""
    target = _target(arch)
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype must be 'bf16', 'fp16' or 'fp32', got {dtype!r}")
    _require_compiled()
    from workbench import mla
    runtime = {"MID_O": "*fp32", "MID_LSE": "*fp32", "OUT": f"*{dtype}", "LSE": "*fp32", "total_rows": "i32",
               "num_splits": "i32"}
    consts = dict(BLOCK_R=block_r, BLOCK_D=block_d, SPLIT_CHUNK=split_chunk, D_LATENT=mla.KV_LORA_RANK,
                  GDC_WAIT=False, LAUNCH_DEPENDENTS=False, TRACE_BUF=None, TRACE=False)
    kernel = _compile(mla._mla_decode_merge_kernel, runtime, consts, {"MID_O", "MID_LSE", "OUT", "LSE"},
                      target, dict(num_warps=num_warps))
    report: dict[str, Any] = {"tile": (block_r, block_d), "split_chunk": split_chunk, "warps": num_warps,
                              "arch": arch}
    if arch == "sm_90":
        report["regs"], report["spill_bytes"] = _ptxas_usage(kernel.asm["ptx"], "_mla_decode_merge_kernel")
    else:
        report.update(_amd_usage(kernel.asm["amdgcn"]))
    return report


GLUON_SMEM_LIMIT = 232448  # bytes of shared memory one program may use on an H100/H200 (227 KB)


def _compile_gluon(fn: Any, dtype: str, direct: bool, consts: dict[str, Any], options: dict[str, Any],
                   name: str, extra_runtime: dict[str, str] | None = None) -> tuple[Any, str, dict[str, Any]]:
    """Compile one of the gluon split kernels for Hopper with the library's argument types (``OUT`` in ``dtype``
    when ``direct``, else fp32 partials) and return it, its PTX and the facts both reports share: ``regs`` and
    ``spill_bytes`` (``ptxas -v``), ``shared`` (bytes) and ``wgmma`` (``wgmma.mma_async`` instructions)."""
    if dtype not in ("bf16", "fp16"):
        raise ValueError(f"dtype must be 'bf16' or 'fp16' (the gluon kernels are 16-bit only), got {dtype!r}")
    _require_compiled()
    from triton.experimental.gluon._runtime import GluonASTSource

    runtime = {k: v.format(dt=dtype) for k, v in _RUNTIME_ARGS.items()}
    if direct:
        runtime["OUT"] = f"*{dtype}"
    runtime.update(extra_runtime or {})
    kernel = _compile(fn, runtime, dict(consts, DIRECT=direct, D_LATENT=512, D_ROPE=64), _DIVISIBLE_BY_16, HOPPER,
                      options, source=GluonASTSource)
    ptx = kernel.asm["ptx"]
    regs, spills = _ptxas_usage(ptx, name)
    return kernel, ptx, {"regs": regs, "spill_bytes": spills, "shared": kernel.metadata.shared,
                         "wgmma": len(re.findall(r"wgmma\.mma_async", ptx))}


def gluon_kernel_report(direct: bool = False, heads: int = 128, dtype: str = "bf16", cluster: int = 0,
                        pdl: bool = False, tma_store: bool = False, block_n: int = 64,
                        num_buffers: int = 2, coalesced_store: bool = False, narrow: bool = False) -> dict[str, Any]:
    """Compile :mod:`workbench.mla_gluon`'s split kernel for Hopper (Triton's Gluon frontend, on any machine) and
    report ``regs`` and ``spill_bytes`` (``ptxas -v``), ``shared`` (bytes; the limit is :data:`GLUON_SMEM_LIMIT`),
    ``wgmma`` (``wgmma.mma_async`` instructions: 36 for q k^T over 576 values in k-steps of 16, 4 for P V) and
    ``cp_async_wait`` (the ``cp.async.wait_group`` counts: 1 in the loop, the next tile's copies in flight while
    this one is used). ``cluster`` (2, 4 or 8): the variant that merges its splits inside a thread-block cluster;
    ``cluster_barriers`` counts its ``barrier.cluster.arrive`` instructions (one, after the partial stores).
    ``pdl``: the PDL-launched variant; ``pdl`` in the result is then :func:`pdl_report` of its PTX.
    ``tma_store``: the variant whose whole row blocks write their partial by TMA; ``tma_stores`` counts its
    ``cp.async.bulk.tensor`` stores (one per 64 x 32 fp32 box: 16) and ``bulk_waits`` its waits for them.
    ``coalesced_store``: the variant that stages its partial in shared memory and stores it row-major;
    ``global_stores`` counts the PTX's ``st.global`` instructions by kind (``st.global.v4.b32``: 16-byte vectors).
    ``narrow``: partials in ``dtype`` instead of fp32 (``TritonConfig.narrow_partials``).
    ``block_n`` and ``num_buffers``: the tile (64 or 32 tokens) and its buffers (2 or 4; ``cp_async_wait`` then
    shows ``num_buffers - 1`` tiles left in flight)."""
    if cluster and direct:
        raise ValueError("cluster merges partials: it needs direct=False")
    if tma_store and (direct or cluster):
        raise ValueError("tma_store writes partials outside a cluster: it needs direct=False and cluster=0")
    import triton
    from workbench import mla_gluon

    consts: dict[str, Any] = dict(NUM_HEADS=heads, PDL=pdl, BN=block_n, NBUF=num_buffers)
    extra: dict[str, str] = {}
    if cluster:
        consts.update(CLUSTER=cluster, MERGE_L=mla_gluon.cluster_merge_layout(cluster))
    if narrow:
        if direct:
            raise ValueError("narrow is a mode of the partials: it needs direct=False")
        extra["OUT"] = f"*{dtype}"
    if coalesced_store:
        if cluster or tma_store:
            raise ValueError("coalesced_store stores from registers outside a cluster: it needs cluster=0 and "
                             "tma_store=False")
        consts["COALESCED_STORE"] = True
    if tma_store:
        consts["TMA_STORE"] = True
        extra["PART_DESC"] = f"tensordesc<fp32[{mla_gluon.BLOCK_M}, 512],{mla_gluon.PARTIAL_LAYOUT!r}>"
    _, ptx, report = _compile_gluon(mla_gluon.mla_decode_gluon_split_kernel, dtype, direct, consts,
                                    dict(num_warps=mla_gluon.NUM_WARPS), "gluon", extra)
    return dict(report, cp_async_wait=_async_waits(ptx),
                cluster_barriers=len(re.findall(r"barrier\.cluster\.arrive", ptx)),
                tma_stores=len(_TMA_STORE.findall(ptx)),
                global_stores=_global_stores(ptx),
                bulk_waits=len(re.findall(r"cp\.async\.bulk\.wait_group", ptx)),
                pdl=pdl_report(ptx) if pdl else None, triton=triton.__version__)


def gluon_swap_kernel_report(direct: bool = False, heads: int = 16, dtype: str = "bf16", block_m: int = 16,
                             pdl: bool = True, narrow: bool = True, num_warps: int | None = None,
                             trace: bool = False) -> dict[str, Any]:
    """Compile :mod:`workbench.mla_gluon_swap`'s split kernel (``block_m`` 16 or 32 folded rows as wgmma's N) for
    Hopper on any machine and report ``regs``, ``spill_bytes``, ``shared`` (bytes), ``wgmma`` (36 for
    ``S^T = K q^T`` over 576 values in k-steps of 16, 32 for ``O^T = V^T P^T``: 8 blocks of 64 output columns x 4
    k-steps of 16 tokens), ``wgmma_shapes`` (the instruction names: ``m64n<block_m / warpgroups>k16``),
    ``ldmatrix`` (shared memory read into registers by ``ldmatrix``: none, every product reads its operands from
    shared memory itself), ``cp_async_wait`` (1 in the loop: the next tile in flight while this one is used)
    and, with ``pdl``, :func:`pdl_report` of its PTX. ``narrow``: partials in ``dtype`` (as
    :data:`workbench.mla.GLUON_SWAP_CONFIG`).
    ``num_warps``: 4 (one warpgroup) or 8 (two, each with half the rows); default
    :func:`workbench.mla_gluon_swap.num_warps_for`. ``global_stores`` counts the PTX's ``st.global`` kinds (the
    output leaves row-major in 16-byte vectors: ``st.global.v4.b32``). ``trace``: the instrumented variant
    (``mla_decode_triton(..., trace=)``); ``globaltimer`` counts its timer reads (entry, after the wait, one in
    the loop, exit: 4; none untraced)."""
    import triton
    from workbench import mla_gluon_swap

    warps = mla_gluon_swap.num_warps_for(block_m) if num_warps is None else num_warps
    if warps not in mla_gluon_swap.WARPS:
        raise ValueError(f"num_warps must be one of {mla_gluon_swap.WARPS}, got {warps}")
    extra = {"OUT": f"*{dtype}"} if narrow and not direct else {}
    consts: dict[str, Any] = dict(NUM_HEADS=heads, PDL=pdl, BR=block_m)
    if trace:
        extra["TRACE_BUF"] = "*i64"
        consts["TRACE"] = True
    _, ptx, report = _compile_gluon(mla_gluon_swap.mla_decode_gluon_swap_kernel, dtype, direct, consts,
                                    dict(num_warps=warps), "gluon_swap", extra)
    return dict(report, wgmma_shapes=sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))),
                ldmatrix=len(re.findall(r"\bldmatrix\.", ptx)), num_warps=warps,
                globaltimer=len(re.findall(r"%globaltimer", ptx)),
                global_stores=_global_stores(ptx),
                cp_async_wait=_async_waits(ptx),
                pdl=pdl_report(ptx) if pdl else None, triton=triton.__version__)


def gluon_ws_kernel_report(direct: bool = False, heads: int = 16, dtype: str = "bf16", coalesced_store: bool = False,
                           narrow: bool = False, handoff: bool = False, idx_ahead: bool = False,
                           early_q: bool = False, split_merge: bool = False) -> dict[str, Any]:
    """Compile :mod:`workbench.mla_gluon_ws`'s warp-specialised split kernel (experimental) for Hopper and report
    ``shared`` (bytes), ``wgmma`` (per warpgroup function: 36 for S over 256 + 256 + 64 values in k-steps of 16,
    2 for each of its three P V sites; two such functions), ``regs`` and ``spill_bytes`` (``ptxas -v`` at the
    launch's ``maxnreg``; the partitions raise or lower it with setmaxnreg) and ``partition_barriers`` (the
    named barriers of 128 threads that the partitions synchronise on). ``coalesced_store`` and ``narrow`` as for
    :func:`gluon_kernel_report`, with ``global_stores`` likewise. ``handoff``: the hand-over schedule
    (``TritonConfig.ws_handoff``, with ``coalesced_store``); ``wgmma_waits`` counts the PTX's ``wgmma.wait_group``
    instructions by their count of groups left in flight; ``mbarrier_waits`` the mbarrier waits (``try_wait``).
    ``idx_ahead`` and ``early_q`` (with ``handoff``): ``TritonConfig.ws_idx_ahead`` and ``ws_early_q``;
    ``cp_async_wait`` counts the PTX's ``cp.async.wait_group`` instructions (the query tile's wait before the
    partitions start; none with ``early_q``), ``cp_async_mbarrier_arrive`` its ``cp.async.mbarrier.arrive``
    instructions (one per loader site, one more for the query tile with ``early_q``). ``split_merge`` (with
    ``idx_ahead``, partials): ``TritonConfig.ws_split_merge``; ``count_ops`` counts the PTX's ``red.release.gpu``
    (arrivals), ``ld.acquire.gpu`` (polls) and ``atom.acq_rel.gpu`` (leaves) instructions."""
    from workbench import mla_gluon_ws

    if narrow and direct:
        raise ValueError("narrow is a mode of the partials: it needs direct=False")
    if handoff and not coalesced_store:
        raise ValueError("handoff is written for the coalesced store: it needs coalesced_store=True")
    if (idx_ahead or early_q) and not handoff:
        raise ValueError("idx_ahead and early_q are modes of the hand-over schedule: they need handoff=True")
    if split_merge and (direct or not idx_ahead):
        raise ValueError("split_merge merges partials with the idx-ahead loader: it needs direct=False and "
                         "idx_ahead=True")
    _, ptx, report = _compile_gluon(mla_gluon_ws.mla_decode_gluon_ws_kernel, dtype, direct,
                                    dict(NUM_HEADS=heads, PDL=True, COALESCED_STORE=coalesced_store, HANDOFF=handoff,
                                         IDX_AHEAD=idx_ahead, EARLY_Q=early_q, SPLIT_MERGE=split_merge),
                                    dict(num_warps=mla_gluon_ws.NUM_WARPS, maxnreg=mla_gluon_ws.MAX_REGS), "gluon_ws",
                                    {"OUT": f"*{dtype}"} if narrow else None)
    waits: dict[int, int] = {}
    for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx):
        waits[int(n)] = waits.get(int(n), 0) + 1
    return dict(report, partition_barriers=sorted(set(re.findall(r"bar\.sync\s+\d+,\s*128", ptx))),
                global_stores=_global_stores(ptx), wgmma_waits=waits,
                mbarrier_waits=len(re.findall(r"mbarrier\.try_wait", ptx)),
                cp_async_wait=len(re.findall(r"cp\.async\.wait_group", ptx)),
                cp_async_mbarrier_arrive=len(re.findall(r"cp\.async\.mbarrier\.arrive", ptx)),
                count_ops={op: len(re.findall(re.escape(op), ptx))
                           for op in ("red.release.gpu", "ld.acquire.gpu", "atom.acq_rel.gpu")},
                pdl=pdl_report(ptx))


def _ptxas_usage(ptx: str, name: str, arch: str = "sm_90a") -> tuple[int | None, int]:
    """(registers, spilled bytes) of ``ptx`` from the bundled ``ptxas -v``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        res = subprocess.run([_ptxas(), "-v", f"-arch={arch}", path, "-o", os.path.join(tmp, f"{name}.cubin")],
                             capture_output=True, text=True, check=False)
    if res.returncode:
        raise RuntimeError(f"ptxas failed for {name}: {res.stderr[-2000:]}")
    regs = re.findall(r"Used (\d+) registers", res.stderr)
    spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
    return (int(regs[-1]) if regs else None), (int(spills[-1]) if spills else 0)


def split_kernel_report(cfg: Any, heads: int = 16, dtype: str = "bf16", *, pdl_split: bool | None = None,
                        arch: str = "sm_90a") -> dict[str, Any]:
    """Compile ``_mla_decode_split_kernel`` for ``cfg`` (a :class:`workbench.mla.TritonConfig`) for Hopper and
    report ``regs`` and ``spill_bytes`` (from ``ptxas -v``), ``shared_buffers`` (the shapes of the TTGIR's
    shared-memory allocations: a leading dimension of 2 or more is a multi-buffered pipeline),
    ``async_wait_num`` (the ``num`` of each async wait: the copy groups left in flight), ``ptx_lines`` and
    ``tma_stores`` (TMA store instructions in the PTX: non-zero with ``cfg.tma_store``).
    The split kernel is specialised as the library launches it with more than one split (partials, second-kernel
    merge, PDL as ``cfg`` says unless ``pdl_split`` overrides it)."""
    import triton

    kernel = _compile_split(cfg, heads, dtype, pdl_split, HOPPER)
    ptx, ttgir = kernel.asm["ptx"], kernel.asm["ttgir"]
    order = loop_order(ttgir)
    regs, spills = _ptxas_usage(ptx, cfg.label.replace(" ", "_"), arch)
    return {
        "label": cfg.label,
        "regs": regs,
        "spill_bytes": spills,
        "shared_buffers": sorted(set(re.findall(r"local_alloc[^\n]*?memdesc<([0-9x]+)x(?:bf16|f16|f32|i32)", ttgir))),
        "async_wait_num": sorted({int(n) for n in re.findall(r"async_wait[^\n]*?num = (\d+)", ttgir)}),
        "ptx_lines": ptx.count("\n"),
        "tma_stores": len(_TMA_STORE.findall(ptx)),
        "loop_order": order,
        **pdl_report(ptx),
        "triton": triton.__version__,
    }


# TTGIR ops of the KV loop, in the order they appear, and their short names in loop_order()
_LOOP_EVENTS = (("ttg.async_wait", "wait"), ("ttng.warp_group_dot_wait", "dot_wait"), ("ttng.warp_group_dot ", "dot"),
                ("tt.dot ", "dot"), ("ttg.async_copy_global_to_local", "copy"), ("tt.load ", "load"),
                ("math.exp2", "exp2"))


def loop_order(ttgir: str) -> list[str]:
    """The main KV loop of a compiled split kernel (its first ``scf.for``), as the sequence of the events that
    decide whether loads overlap math: ``wait:N`` (an asynchronous-copy wait that leaves N copy groups in
    flight), ``dot`` / ``dot_wait`` (matrix products and the waits for Hopper's asynchronous ones), ``exp2``
    (the softmax), ``copy:kv`` / ``copy:idx`` (asynchronous copies of cache rows or of indices into shared
    memory), ``load`` (loads into registers)."""
    lines = ttgir.splitlines()
    start = next((i for i, line in enumerate(lines) if "scf.for" in line), None)
    if start is None:
        raise ValueError("the TTGIR has no scf.for loop")
    out: list[str] = []
    for line in lines[start + 1:]:
        if "scf.yield" in line:
            break
        for pattern, name in _LOOP_EVENTS:
            if pattern in line:
                if name == "wait":
                    name += ":" + re.search(r"num = (\d+)", line).group(1)
                elif name == "copy":
                    name += ":idx" if re.search(r"tensor<\d+x!tt\.ptr<i32>", line) else ":kv"
                out.append(name)
                break
    return out


def main() -> None:  # pragma: no cover - a command-line view of the same report
    """``TRITON_INTERPRET=0 python -m workbench.codegen``: the report for each default decode config."""
    import json

    import torch

    from workbench import mla

    for rows, tokens in DEFAULT_CASES:
        print(json.dumps(split_kernel_report(mla.triton_config(rows, torch.bfloat16, tokens, backend="cuda",
                                                               gluon=False), heads=16)))
    print(json.dumps(gluon_kernel_report()))
    for rows in (16, 32, 64):
        print(json.dumps(amd_kernel_report(mla.triton_config(rows, torch.bfloat16, backend="hip"), heads=16)))


if __name__ == "__main__":  # pragma: no cover
    main()
