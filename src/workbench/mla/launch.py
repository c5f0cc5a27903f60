"""The host side of the decode kernels: :func:`mla_decode_triton` checks its inputs, takes the launch plan of
:mod:`workbench.mla.policy`, launches the split kernel the plan names and, with more than one split, the merge.

Nothing here synchronises with the device, so a call can be captured in a CUDA graph. With PDL (compiled NVIDIA
sm_90+) the split kernel waits for the kernel before it before its first read and lets the merge launch early; the
merge waits for the whole split grid, then lets the next kernel launch.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import triton

from workbench import device
from workbench.mla.inputs import KV_LORA_RANK, QK_ROPE_HEAD_DIM, check_kernel_args, check_values, flat_cache
from workbench.mla.policy import (TritonConfig, _sm_count, default_splits, partial_dtype, record_resources,
                                  shared_memory_ladder, triton_config)
from workbench.mla.ref import default_sm_scale
from workbench.mla.triton_kernels import LOG2E, mla_decode_merge_kernel, mla_decode_split_kernel

__all__ = ["LAST_COMPILED", "SHARED_MEMORY_FALLBACKS", "compiled_kernel_report", "merge_programs",
           "mla_decode_triton", "triton_launch_plan"]

LAST_COMPILED: dict[str, Any] = {}  # the last compiled split kernel (registers, spills, shared memory, PTX)
SHARED_MEMORY_FALLBACKS: dict[tuple[int, tuple], TritonConfig] = {}  # (CUDA device, chosen config's key) -> the rung
#                                                                       that fitted there (the chosen one did not)


def compiled_kernel_report() -> dict[str, Any]:
    """Resource use of the last compiled split kernel (GPU only): registers, spills, shared memory, and
    which matrix instructions its PTX uses (``wgmma`` is Hopper's; ``mma.sync`` the older path)."""
    k = LAST_COMPILED.get("split")
    if k is None or not hasattr(k, "asm"):
        return {}
    ptx = k.asm.get("ptx", "")
    return {"n_regs": getattr(k, "n_regs", None), "n_spills": getattr(k, "n_spills", None),
            "shared_bytes": getattr(k.metadata, "shared", None), "wgmma": "wgmma" in ptx,
            "mma_sync": "mma.sync" in ptx, "cp_async": "cp.async" in ptx}


def _note_compiled(config: TritonConfig, compiled: Any) -> None:
    LAST_COMPILED["split"] = compiled
    if compiled is not None:
        record_resources(config, compiled)


def _dot_precision(dtype: torch.dtype) -> str | None:
    """fp32 inputs are multiplied in full fp32 ("ieee"); Triton's default would round them to TF32 on
    NVIDIA (10-bit mantissa), which an fp32 caller would not expect. 16-bit inputs: the backend's default."""
    return "ieee" if dtype == torch.float32 else None


def triton_launch_plan(q: torch.Tensor, qo_indptr: torch.Tensor, kv_indices: torch.Tensor, max_qo_len: int, *,
                       config: TritonConfig | None = None, num_splits: int | None = None) -> tuple[TritonConfig, int]:
    """The config and split count :func:`mla_decode_triton` launches with for these inputs (host-side
    arithmetic only: no device sync): ``config`` or :func:`triton_config`'s choice for this call's rows,
    dtype, KV tokens (``kv_indices.numel()``, an upper bound), request count and SM count (or the smaller config
    :data:`SHARED_MEMORY_FALLBACKS` recorded for that choice on this GPU); ``num_splits`` or
    :func:`default_splits`'s."""
    heads = q.shape[1]
    num_reqs = qo_indptr.numel() - 1
    sms = _sm_count(q.device)
    cfg = config
    if cfg is None:
        cfg = triton_config(max_qo_len * heads, q.dtype, kv_indices.numel(), num_reqs=num_reqs, sm_count=sms)
        if q.device.type == "cuda":  # a config this GPU ran out of shared memory for: the rung that fitted
            cfg = SHARED_MEMORY_FALLBACKS.get((q.device.index or 0, cfg.key), cfg)
    if num_splits is None:
        row_blocks = triton.cdiv(max_qo_len * heads, cfg.block_m)
        num_splits = default_splits(cfg, num_reqs, row_blocks, kv_indices.numel(), sms)
    return cfg, num_splits


def mla_decode_triton(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                      kv_indices: torch.Tensor, max_qo_len: int, sm_scale: float | None = None, *,
                      num_splits: int | None = None, config: TritonConfig | None = None,
                      out: torch.Tensor | None = None, validate: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The MLA decode over flat token indices (CUDA-graph capturable).

    Inputs as :func:`workbench.mla.mla_decode_ref` (``q`` ``(total_q, H, 576)`` fp16/bf16/fp32, same dtype as the
    cache; ``kv_cache`` ``[num_rows, 576]`` with any row stride, or ``[num_rows, 1, 1, 576]``); ``max_qo_len`` is at
    least the longest query (host int, <= 16); requests may differ in query length; ``sm_scale`` is finite and
    positive. ``out``: ``(total_q, H, 512)`` contiguous in q's dtype. ``config`` and ``num_splits`` override the
    launch plan (:func:`triton_launch_plan`).

    What the kernels assume of the tensors (shapes, dtypes, devices, contiguity of q, the offsets and the indices)
    is checked on every call. The values (offsets from 0 and non-decreasing, ``qo_indptr[-1] == total_q``,
    ``kv_len >= qo_len``, indices inside the cache, ``max_qo_len`` covering every query) need a host sync:
    ``validate`` None checks them unless a CUDA graph is being captured (its warm-up call checked them), True always,
    False never (the caller vouches for them: a wrong value then reads or writes out of bounds).

    Returns:
        ``out`` ``(total_q, H, 512)`` in ``q.dtype`` and ``lse`` ``(total_q, H) float32``.
    """
    cache = flat_cache(kv_cache)
    check_kernel_args(q, cache, qo_indptr, kv_indptr, kv_indices, max_qo_len, out)
    scale = default_sm_scale() if sm_scale is None else float(sm_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"sm_scale is {sm_scale}; it must be finite and positive (the kernels take the row max of "
                         "the unscaled scores and scale it)")
    total_q, heads, _ = q.shape
    num_reqs = qo_indptr.numel() - 1
    capturing = q.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if validate or (validate is None and not capturing):
        _, qo, _ = check_values(q, cache, qo_indptr, kv_indptr, kv_indices, KV_LORA_RANK)
        longest = max((b - a for a, b in zip(qo, qo[1:])), default=0)
        if longest > max_qo_len:
            raise ValueError(f"max_qo_len is {max_qo_len} but a request in qo_indptr has {longest} query tokens; it "
                             "must be at least the longest query")
    if out is None:
        out = torch.empty(total_q, heads, KV_LORA_RANK, dtype=q.dtype, device=q.device)
    lse = torch.empty(total_q, heads, dtype=torch.float32, device=q.device)
    if total_q == 0 or num_reqs == 0:
        return out, lse
    cfg, splits = triton_launch_plan(q, qo_indptr, kv_indices, max_qo_len, config=config, num_splits=num_splits)
    chosen = cfg
    while True:
        try:
            _launch(q, cache, qo_indptr, kv_indptr, kv_indices, out, lse, max_qo_len, scale, cfg, splits)
            return out, lse
        except Exception as err:  # noqa: BLE001 - only Triton's shared-memory OutOfResources is handled
            if not (type(err).__name__ == "OutOfResources" and getattr(err, "name", "") == "shared memory"):
                raise
            # raised when the kernel is loaded, before it runs: nothing was written, the call starts again
            cfg, splits = triton_launch_plan(q, qo_indptr, kv_indices, max_qo_len, num_splits=num_splits,
                                             config=_fall_back(err, cfg, chosen, config is not None, q.device))


def _fall_back(err: Exception, cfg: TritonConfig, chosen: TritonConfig, explicit: bool,
               dev: torch.device) -> TritonConfig:
    """The next config after ``cfg`` ran out of shared memory (``err``: Triton's ``OutOfResources``), or a
    ValueError for a config the caller gave."""
    required, limit = getattr(err, "required", "?"), getattr(err, "limit", "?")
    if explicit:
        raise ValueError(f"config {cfg.label!r}: its split kernel needs {required} bytes of shared memory and this GPU "
                         f"gives a program {limit}; pass a config with fewer num_stages or a smaller block_n or "
                         f"block_m, or config=None (the library then steps down until one fits)") from err
    ladder = shared_memory_ladder(chosen)  # walked in its order, from the rung after cfg
    rest = ladder[ladder.index(cfg) + 1:] if cfg in ladder else ladder
    if not rest:
        raise RuntimeError(f"the decode config {cfg.label!r} needs {required} bytes of shared memory, this GPU gives "
                           f"a program {limit}, and no smaller config is left to try") from err
    nxt = rest[0]
    SHARED_MEMORY_FALLBACKS[(dev.index or 0, chosen.key)] = nxt
    warnings.warn(f"MLA decode: the config {cfg.label!r} (tuned on an H200) needs {required} bytes of shared memory "
                  f"and this GPU gives a program {limit}; trying {nxt.label!r} (not tuned for this GPU)",
                  RuntimeWarning, stacklevel=3)
    return nxt


def _launch(q, cache, qo_indptr, kv_indptr, kv_indices, out, lse, max_qo_len, scale, cfg, num_splits) -> None:
    """:func:`mla_decode_triton`'s launches for one config and split count (the outputs already allocated)."""
    total_q, heads, _ = q.shape
    num_reqs = qo_indptr.numel() - 1
    total_rows = total_q * heads
    row_blocks = triton.cdiv(max_qo_len * heads, cfg.block_m)
    pdl = cfg.pdl and device.pdl_available(q.device)
    if num_splits == 1:
        o_dst, lse_dst = out, lse
    else:
        o_dst = torch.empty(num_splits, total_rows, KV_LORA_RANK, dtype=partial_dtype(cfg, q.dtype), device=q.device)
        lse_dst = torch.empty(num_splits, total_rows, dtype=torch.float32, device=q.device)
    grid = (row_blocks, num_splits, num_reqs)
    args = (q, cache, kv_indices, qo_indptr, kv_indptr, o_dst, lse_dst, cache.stride(0), total_rows, scale * LOG2E,
            num_splits)
    common: dict[str, Any] = dict(NUM_HEADS=heads, DIRECT=num_splits == 1, D_LATENT=KV_LORA_RANK,
                                  D_ROPE=QK_ROPE_HEAD_DIM)
    if cfg.kernel == "triton":
        if pdl:  # waits before its first read, and lets the next kernel (merge or next call) launch early
            common.update(GDC_WAIT=True, launch_pdl=True)
        compiled = mla_decode_split_kernel[grid](
            *args, IDX_AHEAD=cfg.idx_ahead, LAUNCH_DEPENDENTS=pdl, DOT_PRECISION=_dot_precision(q.dtype),
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **common)
    else:
        _check_gluon_call(q, cfg.kernel)
        if pdl:
            common.update(PDL=True, launch_pdl=True)
        if cfg.kernel == "gluon":
            from workbench.mla import gluon

            compiled = gluon.mla_decode_gluon_split_kernel[grid](*args, num_warps=gluon.NUM_WARPS, **common)
        elif cfg.kernel == "gluon_ws":
            from workbench.mla import gluon_ws

            compiled = gluon_ws.mla_decode_gluon_ws_kernel[grid](*args, num_warps=gluon_ws.NUM_WARPS,
                                                                 maxnreg=gluon_ws.MAX_REGS, **common)
        else:
            from workbench.mla import gluon_swap

            compiled = gluon_swap.mla_decode_gluon_swap_kernel[grid](*args, BR=cfg.block_m,
                                                                     num_warps=gluon_swap.NUM_WARPS, **common)
    _note_compiled(cfg, compiled)
    if num_splits > 1:
        merge_opts: dict[str, Any] = dict(GDC_WAIT=True, LAUNCH_DEPENDENTS=True, launch_pdl=True) if pdl else {}
        _launch_merge(o_dst, lse_dst, out, lse, total_rows, num_splits, cfg, **merge_opts)


def _check_gluon_call(q: torch.Tensor, kernel: str) -> None:
    if not device.hopper(q.device):
        cap = (f"compute capability {'.'.join(map(str, torch.cuda.get_device_capability(q.device)))}"
               if device.compiled_nvidia(q.device) else f"the interpreter {'on' if device.interpreter_active() else 'off'}")
        raise ValueError(f"TritonConfig(kernel={kernel!r}) needs compiled Triton on an NVIDIA Hopper GPU (compute "
                         f"capability 9.x): it is written with Hopper's wgmma, which Blackwell (10.x, 12.x) does not "
                         f"have; this call runs on {q.device} with {cap}. Use config=None (the Triton kernels there)")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"TritonConfig(kernel={kernel!r}) takes float16 or bfloat16 q, got {q.dtype}")


def _launch_merge(mid_o, mid_lse, out, lse, total_rows: int, num_splits: int, cfg: TritonConfig, **opts) -> None:
    """The merge of ``num_splits`` partials of ``total_rows`` rows into ``out`` and ``lse`` (``opts``: PDL)."""
    br, bd = cfg.merge_tile(total_rows, num_splits)
    mla_decode_merge_kernel[(triton.cdiv(total_rows, br), KV_LORA_RANK // bd)](
        mid_o, mid_lse, out, lse, total_rows, num_splits, BLOCK_R=br, BLOCK_D=bd,
        SPLIT_CHUNK=min(triton.next_power_of_2(num_splits), cfg.merge_split_chunk), D_LATENT=KV_LORA_RANK,
        num_warps=cfg.merge_num_warps(total_rows) if not device.interpreter_active() else 1, **opts)


def merge_programs(total_rows: int, cfg: TritonConfig, num_splits: int = 1) -> int:
    """Programs of the merge of ``num_splits`` partials of ``total_rows`` folded rows."""
    br, bd = cfg.merge_tile(total_rows, num_splits)
    return triton.cdiv(total_rows, br) * (KV_LORA_RANK // bd)
