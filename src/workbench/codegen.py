"""What Triton makes of the decode and expansion kernels for a GPU, without the GPU.

Triton compiles for a named target on any machine: ``triton.compile`` with ``GPUTarget("cuda", 90, 32)`` runs the
whole pipeline (TTIR, TTGIR, LLVM, PTX) and its bundled ``ptxas`` assembles the PTX and reports registers and
spills. The IR answers most questions about a kernel's speed before it runs: whether the row gather is
double-buffered (the Triton split kernel's main speed-up came from loading the indices one tile ahead, which gave
the gather a second buffer), whether anything is read before the PDL wait, how many registers a tile takes.
:func:`split_kernel_report` compiles the split kernel of a :class:`workbench.mla.TritonConfig` and returns its
registers, spills, the shapes of its shared-memory buffers and the waits of its pipelined loop; the ``gluon_*``
reports do the same for the Hopper kernels. The AMD backend works the same way: :func:`amd_kernel_report`
compiles for ``gfx942`` (MI300X) or ``gfx950`` (MI355X) and reports the LDS, VGPRs and scratch, and CI checks that
the ROCm defaults fit the 64 KB of LDS a workgroup has there. :func:`shared_memory_fit` shows the steps a GPU
with less shared memory than an H200 takes.

It needs compiled Triton: run it in a process with ``TRITON_INTERPRET=0`` (under the interpreter the kernels
are Python functions and there is nothing to compile; it raises a clear error there).
"""

from __future__ import annotations

import collections
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
                 "OUT": "*{out}", "LSE": "*fp32", "stride_kv": "i32", "total_rows": "i32", "qk_scale": "fp32",
                 "num_splits": "i32"}
_DIVISIBLE_BY_16 = {"Q", "KV", "KV_INDICES", "QO_INDPTR", "KV_INDPTR", "OUT", "LSE", "stride_kv"}


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
_GLOBAL_WRITE = re.compile(r"\b(?:st\.global|red\.global|atom\.global)")


def _wgmma_shapes(ptx: str) -> list[str]:
    """The distinct ``wgmma.mma_async`` instruction shapes of a PTX (``m64n32k16`` ...)."""
    return sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))


def _wgmma_waits(ptx: str) -> list[int]:
    """The ``wgmma.wait_group`` counts of a PTX in program order (the groups each wait leaves in flight)."""
    return [int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)]


def _async_waits(ptx: str) -> list[int]:
    """The distinct ``cp.async.wait_group`` counts of a PTX (the copy groups each wait leaves in flight)."""
    return sorted({int(n) for n in re.findall(r"cp\.async\.wait_group\s+(\d+)", ptx)})


def _global_stores(ptx: str) -> dict[str, int]:
    """How many ``st.global`` instructions of each kind a PTX has (``st.global.v4.b32``: 16-byte vectors)."""
    return dict(sorted(collections.Counter(re.findall(r"st\.global[\w.]*", ptx)).items()))


def pdl_report(ptx: str) -> dict[str, Any]:
    """PDL facts of a kernel's PTX: ``has_wait`` (``griddepcontrol.wait``), ``global_reads_before_wait`` (global
    loads, asynchronous copies and prefetches before the first wait in the PTX text; all of them when there is no
    wait: a PDL-launched kernel that reads before its wait may see what the kernel before it has not finished
    writing), ``global_writes_before_wait`` (stores and atomics before it: the kernel before may still read what they
    overwrite), ``has_launch_dependents`` and ``launch_dependents_after_wait`` (the first trigger comes after the
    first wait: a kernel that starts early behind this one then knows that every kernel before this one is done)."""
    wait = ptx.find("griddepcontrol.wait")
    trigger = ptx.find("griddepcontrol.launch_dependents")
    before = ptx[:wait] if wait >= 0 else ptx
    return {"has_wait": wait >= 0,
            "global_reads_before_wait": len(_GLOBAL_READ.findall(before)),
            "global_writes_before_wait": len(_GLOBAL_WRITE.findall(before)),
            "has_launch_dependents": trigger >= 0,
            "launch_dependents_after_wait": trigger >= 0 and wait >= 0 and trigger > wait}


def _check_dtype(dtype: str, allowed: tuple[str, ...] = ("bf16", "fp16", "fp32")) -> None:
    if dtype not in allowed:
        raise ValueError(f"dtype must be one of {allowed}, got {dtype!r}")


def _compile_split(cfg: Any, heads: int, dtype: str, target: tuple, pdl: bool | None = None) -> Any:
    """The compiled Triton split kernel for ``target`` (a GPUTarget tuple), specialised as the library launches it
    with more than one split (partials); PDL as ``cfg`` says (unless ``pdl`` overrides it) on targets that have it."""
    if cfg.kernel != "triton":
        raise ValueError(f"split_kernel_report compiles the Triton split kernel; {cfg.label!r} is a Gluon config "
                         "(use gluon_kernel_report, gluon_ws_kernel_report or gluon_swap_kernel_report)")
    _check_dtype(dtype)
    _require_compiled()
    from workbench.mla import triton_kernels

    pdl = (cfg.pdl if pdl is None else pdl) and _pdl_target(target)
    consts = dict(NUM_HEADS=heads, DIRECT=False, IDX_AHEAD=cfg.idx_ahead, LAUNCH_DEPENDENTS=pdl,
                  DOT_PRECISION="ieee" if dtype == "fp32" else None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                  D_LATENT=512, D_ROPE=64, GDC_WAIT=pdl)
    runtime = {k: v.format(dt=dtype, out=dtype if cfg.narrow_partials else "fp32") for k, v in _RUNTIME_ARGS.items()}
    return _compile(triton_kernels.mla_decode_split_kernel, runtime, consts, _DIVISIBLE_BY_16, target,
                    dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))


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
        shared = _compile_split(rung, heads, dtype, target).metadata.shared
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

    kernel = _compile_split(cfg, heads, dtype, AMD_TARGETS[arch])
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


def _compile_merge(arch: str, dtype: str, consts: dict[str, Any], num_warps: int) -> Any:
    target = _target(arch)
    _check_dtype(dtype)
    _require_compiled()
    from workbench.mla import triton_kernels

    runtime = {"MID_O": "*fp32", "MID_LSE": "*fp32", "OUT": f"*{dtype}", "LSE": "*fp32", "total_rows": "i32",
               "num_splits": "i32"}
    return _compile(triton_kernels.mla_decode_merge_kernel, runtime, dict(consts, D_LATENT=512),
                    {"MID_O", "MID_LSE", "OUT", "LSE"}, target, dict(num_warps=num_warps))


def merge_kernel_report(pdl: bool = True, dtype: str = "bf16", *, arch: str = "sm_90") -> dict[str, Any]:
    """Compile the decode's merge as the library launches it (with PDL: waiting for the split kernel, then letting
    the next call's split kernel launch) and report :func:`pdl_report`. ``arch``: ``"sm_90"`` or one of
    :data:`OTHER_NVIDIA` (``pdl`` from sm_90 on) or of :data:`AMD_TARGETS` (there only that it compiles:
    ``vgprs`` and ``scratch_bytes``)."""
    if pdl and not _pdl_target(_target(arch)):
        raise ValueError(f"pdl=True is NVIDIA-only (griddepcontrol, sm_90+); the library launches the merge on {arch} "
                         "without it: pass pdl=False")
    kernel = _compile_merge(arch, dtype, dict(BLOCK_R=16, BLOCK_D=16, SPLIT_CHUNK=8, GDC_WAIT=pdl,
                                              LAUNCH_DEPENDENTS=pdl), 4)
    if arch.startswith("gfx"):
        return dict(_amd_usage(kernel.asm["amdgcn"]), pdl=pdl, arch=arch)
    return dict(pdl_report(kernel.asm["ptx"]), pdl=pdl, arch=arch)


def merge_tile_report(block_r: int, block_d: int, split_chunk: int, arch: str = "sm_90",
                      dtype: str = "bf16", num_warps: int = 4) -> dict[str, Any]:
    """Compile the merge with one tile (``block_r`` rows x ``block_d`` columns, ``split_chunk`` partials loaded at
    once, ``num_warps`` warps; :meth:`workbench.mla.TritonConfig.merge_tile` and
    :meth:`~workbench.mla.TritonConfig.merge_num_warps` pick them) for ``arch`` (``"sm_90"`` or one of
    :data:`AMD_TARGETS`) and report its registers and spills: ``regs`` and ``spill_bytes`` (``ptxas -v``) on
    NVIDIA, ``vgprs`` and ``scratch_bytes`` on AMD."""
    kernel = _compile_merge(arch, dtype, dict(BLOCK_R=block_r, BLOCK_D=block_d, SPLIT_CHUNK=split_chunk), num_warps)
    report: dict[str, Any] = {"tile": (block_r, block_d), "split_chunk": split_chunk, "warps": num_warps,
                              "arch": arch}
    if arch == "sm_90":
        report["regs"], report["spill_bytes"], _ = _ptxas_usage(kernel.asm["ptx"], "mla_decode_merge_kernel")
    else:
        report.update(_amd_usage(kernel.asm["amdgcn"]))
    return report


GLUON_SMEM_LIMIT = 232448  # bytes of shared memory one program may use on an H100/H200 (227 KB)


def _compile_gluon(fn: Any, dtype: str, direct: bool, consts: dict[str, Any], options: dict[str, Any],
                   name: str) -> tuple[Any, str, dict[str, Any]]:
    """Compile one of the Gluon split kernels for Hopper with the library's argument types (``OUT`` in ``dtype``:
    the final output, or the 16-bit partials) and return it, its PTX and the facts every report shares: ``regs``
    and ``spill_bytes`` (``ptxas -v``), ``wgmma_serialized`` (:func:`_ptxas_usage`), ``shared`` (bytes), ``wgmma``
    (``wgmma.mma_async`` instructions), ``global_stores`` (``st.global`` kinds: ``st.global.v4.b32`` are 16-byte
    vectors) and, with PDL, :func:`pdl_report`."""
    _check_dtype(dtype, ("bf16", "fp16"))
    _require_compiled()
    import triton
    from triton.experimental.gluon._runtime import GluonASTSource

    runtime = {k: v.format(dt=dtype, out=dtype) for k, v in _RUNTIME_ARGS.items()}
    kernel = _compile(fn, runtime, dict(consts, DIRECT=direct, D_LATENT=512, D_ROPE=64), _DIVISIBLE_BY_16, HOPPER,
                      options, source=GluonASTSource)
    ptx = kernel.asm["ptx"]
    regs, spills, serialized = _ptxas_usage(ptx, name)
    return kernel, ptx, {"regs": regs, "spill_bytes": spills, "wgmma_serialized": serialized,
                         "shared": kernel.metadata.shared,
                         "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)), "global_stores": _global_stores(ptx),
                         "cp_async_wait": _async_waits(ptx), "pdl": pdl_report(ptx) if consts.get("PDL") else None,
                         "triton": triton.__version__}


def gluon_kernel_report(direct: bool = False, heads: int = 128, dtype: str = "bf16", pdl: bool = True) -> dict[str, Any]:
    """Compile :mod:`workbench.mla.gluon`'s split kernel for Hopper (on any machine) and report what
    :func:`_compile_gluon` reports: ``shared`` (the limit is :data:`GLUON_SMEM_LIMIT`), ``wgmma`` (36 for q k^T over
    576 values in k-steps of 16, 4 for P V), ``cp_async_wait`` (1 in the loop: the next tile's copies in flight while
    this one is used)."""
    from workbench.mla import gluon

    _, _, report = _compile_gluon(gluon.mla_decode_gluon_split_kernel, dtype, direct, dict(NUM_HEADS=heads, PDL=pdl),
                                  dict(num_warps=gluon.NUM_WARPS), "gluon")
    return report


def gluon_swap_kernel_report(direct: bool = False, heads: int = 16, dtype: str = "bf16", block_m: int = 16,
                             pdl: bool = True) -> dict[str, Any]:
    """Compile :mod:`workbench.mla.gluon_swap`'s split kernel (``block_m`` 16 or 32 folded rows as wgmma's N) for
    Hopper and report what :func:`_compile_gluon` reports (``wgmma``: 36 for ``S^T = K q^T`` over 576 values in
    k-steps of 16, 32 for ``O^T = V^T P^T``: 8 blocks of 64 output columns x 4 k-steps of 16 tokens), plus
    ``wgmma_shapes`` (``m64n<block_m>k16``) and ``ldmatrix`` (shared memory read into registers by ``ldmatrix``:
    none, every product reads its operands from shared memory itself)."""
    from workbench.mla import gluon_swap

    if block_m not in gluon_swap.ROW_BLOCKS:
        raise ValueError(f"block_m must be one of {gluon_swap.ROW_BLOCKS}, got {block_m}")
    _, ptx, report = _compile_gluon(gluon_swap.mla_decode_gluon_swap_kernel, dtype, direct,
                                    dict(NUM_HEADS=heads, PDL=pdl, BR=block_m), dict(num_warps=gluon_swap.NUM_WARPS),
                                    "gluon_swap")
    return dict(report, wgmma_shapes=_wgmma_shapes(ptx),
                ldmatrix=len(re.findall(r"\bldmatrix\.", ptx)))


def gluon_ws_kernel_report(direct: bool = False, heads: int = 16, dtype: str = "bf16") -> dict[str, Any]:
    """Compile :mod:`workbench.mla.gluon_ws`'s warp-specialised split kernel for Hopper and report what
    :func:`_compile_gluon` reports (``wgmma`` per warpgroup function: 36 for S over 512 + 64 values in k-steps
    of 16, 4 for each of its P V sites over a 64-token tile; ``regs`` at the launch's ``maxnreg``: the partitions raise or lower it with
    setmaxnreg), plus ``partition_barriers`` (the named barriers of 128 threads the partitions synchronise on),
    ``handover_barriers`` (the ids of the 256-thread named barriers between the consumer warpgroups, by
    ``arrive`` and ``sync``), ``wgmma_waits`` (``wgmma.wait_group`` instructions by their count of groups left in
    flight), ``mbarrier_waits`` (``try_wait``s) and ``pv_wgmma`` (the ``m64n256k16`` products: ``total``, and
    ``a_registers``, those that take ``P`` from registers rather than shared memory)."""
    from workbench.mla import gluon_ws

    _, ptx, report = _compile_gluon(gluon_ws.mla_decode_gluon_ws_kernel, dtype, direct,
                                    dict(NUM_HEADS=heads, PDL=True),
                                    dict(num_warps=gluon_ws.NUM_WARPS, maxnreg=gluon_ws.MAX_REGS), "gluon_ws")
    waits: dict[int, int] = {}
    for n in _wgmma_waits(ptx):
        waits[n] = waits.get(n, 0) + 1
    # what follows a P V product's accumulator braces: "{" for A in registers, a descriptor for A in shared memory
    pv = [m.split("}", 1)[1] for m in re.findall(r"wgmma\.mma_async\S*m64n256k16[^;]*;", ptx)]
    handover = {op: sorted({int(i) for i in re.findall(rf"bar\.{op}\s+(\d+),\s*256;", ptx)})
                for op in ("arrive", "sync")}
    return dict(report, partition_barriers=sorted(set(re.findall(r"bar\.sync\s+\d+,\s*128", ptx))),
                handover_barriers=handover,
                wgmma_waits=waits, mbarrier_waits=len(re.findall(r"mbarrier\.try_wait", ptx)),
                pv_wgmma=dict(total=len(pv), a_registers=sum(re.match(r"\s*,\s*\{", x) is not None for x in pv)))


def tile_rate_kernel_report(product: str, width: int, dtype: str = "bf16") -> dict[str, Any]:
    """Compile :mod:`workbench.mla.tile_rates`'s kernel for ``product`` (``qk`` or ``pv``) at ``width`` tokens for
    Hopper and report ``regs``, ``spill_bytes``, ``wgmma_serialized``, ``shared``, ``wgmma`` (instructions),
    ``wgmma_shapes`` and ``wgmma_waits`` (the ``wgmma.wait_group`` counts, in program order: the loop's, then the
    last one's)."""
    _check_dtype(dtype, ("bf16", "fp16"))
    _require_compiled()
    from triton.experimental.gluon._runtime import GluonASTSource

    from workbench.mla import tile_rates

    tile_rates.check_product_args(product, width, 1, 1)
    fn, ops = (tile_rates._qk_kernel, ("Q", "K")) if product == "qk" else (tile_rates._pv_kernel, ("P", "V"))
    runtime = {ops[0]: f"*{dtype}", ops[1]: f"*{dtype}", "OUT": "*fp32", "iters": "i32"}
    kernel = _compile(fn, runtime, dict(BN=width), {*ops, "OUT"}, HOPPER, dict(num_warps=tile_rates.NUM_WARPS),
                      source=GluonASTSource)
    ptx = kernel.asm["ptx"]
    regs, spills, serialized = _ptxas_usage(ptx, f"tile_rate_{product}{width}")
    return {"regs": regs, "spill_bytes": spills, "wgmma_serialized": serialized, "shared": kernel.metadata.shared,
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
            "wgmma_shapes": _wgmma_shapes(ptx), "wgmma_waits": _wgmma_waits(ptx)}


# ptxas's note (C7514, C7515, ...) that it made every wgmma of a function wait for the one before: it does so when
# an instruction other than a wgmma reads or writes an accumulator while its product may still be in flight (as
# happens when a loop carries one across its back edge), and the kernel then runs its products one at a time
_WGMMA_SERIALIZED = re.compile(r"wgmma\.mma_async instructions are serialized[^\n]*")


def _ptxas_usage(ptx: str, name: str, arch: str = "sm_90a") -> tuple[int | None, int, str | None]:
    """(registers, spilled bytes, ptxas's note that it serialised the wgmma or None) of ``ptx`` from the bundled
    ``ptxas -v``. A serialised kernel computes the right answer, slowly: only this note shows it before a GPU
    does."""
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
    serialized = _WGMMA_SERIALIZED.search(res.stderr)
    return (int(regs[-1]) if regs else None), (int(spills[-1]) if spills else 0), (serialized and serialized[0])


def split_kernel_report(cfg: Any, heads: int = 16, dtype: str = "bf16", *, pdl: bool | None = None,
                        arch: str = "sm_90a") -> dict[str, Any]:
    """Compile the Triton split kernel for ``cfg`` (a :class:`workbench.mla.TritonConfig`) for Hopper and report
    ``regs``, ``spill_bytes`` and ``wgmma_serialized`` (``ptxas -v``), ``shared_buffers`` (the shapes of the
    TTGIR's shared-memory allocations: a leading dimension of 2 or more is a multi-buffered pipeline),
    ``async_wait_num`` (the ``num`` of each async wait: the copy groups left in flight), ``loop_order``
    (:func:`loop_order`), ``ptx_lines`` and :func:`pdl_report`. Specialised as the library launches it with more
    than one split."""
    import triton

    kernel = _compile_split(cfg, heads, dtype, HOPPER, pdl)
    ptx, ttgir = kernel.asm["ptx"], kernel.asm["ttgir"]
    regs, spills, serialized = _ptxas_usage(ptx, cfg.label.replace(" ", "_"), arch)
    return {
        "label": cfg.label,
        "regs": regs,
        "spill_bytes": spills,
        "wgmma_serialized": serialized,
        "shared_buffers": sorted(set(re.findall(r"local_alloc[^\n]*?memdesc<([0-9x]+)x(?:bf16|f16|f32|i32)", ttgir))),
        "async_wait_num": sorted({int(n) for n in re.findall(r"async_wait[^\n]*?num = (\d+)", ttgir)}),
        "ptx_lines": ptx.count("\n"),
        "loop_order": loop_order(ttgir),
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


def main() -> None:  # pragma: no cover - a command-line view of the same reports
    """``TRITON_INTERPRET=0 python -m workbench.codegen``: the report of every config of the tuned tables (Triton
    configs for sm_90, Gluon configs by their kernel's report, ROCm configs for gfx942 and gfx950)."""
    import json

    from workbench.mla import policy

    for family in ("nvidia", "rocm"):
        seen = set()
        for rule in policy.tuned_table(family)["rules"]:
            cfg = rule["_config"]
            if cfg.key in seen:
                continue
            seen.add(cfg.key)
            if family == "rocm":
                for arch in ("gfx942", "gfx950"):
                    print(json.dumps(dict(amd_kernel_report(cfg, arch=arch), rule=rule["name"])))
            elif cfg.kernel == "triton":
                print(json.dumps(dict(split_kernel_report(cfg), rule=rule["name"])))
            elif cfg.kernel == "gluon":
                print(json.dumps(dict(gluon_kernel_report(), rule=rule["name"])))
            elif cfg.kernel == "gluon_ws":
                print(json.dumps(dict(gluon_ws_kernel_report(), rule=rule["name"])))
            else:
                print(json.dumps(dict(gluon_swap_kernel_report(block_m=cfg.block_m), rule=rule["name"])))


if __name__ == "__main__":  # pragma: no cover
    main()
