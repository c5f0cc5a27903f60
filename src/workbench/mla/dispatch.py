"""One entry point over the decode backends: ``"auto" | "triton" | "torch" | "aiter"``, and the choice ``auto`` makes."""

from __future__ import annotations

from typing import NamedTuple

import torch

from workbench import device
from workbench.decode_metadata import DecodeMetadata
from workbench.mla.aiter import aiter_unsupported_reasons, mla_decode_aiter
from workbench.mla.inputs import KV_LORA_RANK, check_max_qo_len, check_values
from workbench.mla.launch import mla_decode_triton, triton_launch_plan
from workbench.mla.ref import mla_decode_ref

__all__ = ["BACKENDS", "INTERPRETER_MAX_WORK", "DecodeOutput", "choose_backend", "mla_decode"]

BACKENDS = ("auto", "triton", "torch", "aiter")
INTERPRETER_MAX_WORK = 1 << 22  # rows x keys the interpreter handles in a few seconds


class DecodeOutput(NamedTuple):
    """What :func:`mla_decode` returns: the output, its LSE, and which backend ran and why."""

    out: torch.Tensor  # (total_q, H, 512): q.dtype (triton, aiter) or float32 (torch golden)
    lse: torch.Tensor | None  # (total_q, H) float32 natural-log LSE; None if the aiter version gives none
    backend: str  # "triton" | "torch" | "aiter"
    reason: str  # why this backend (for "auto"), and which path (aiter: persistent or not; triton: the kernel,
    #              its config label and split count)


def choose_backend(q: torch.Tensor, kv_cache: torch.Tensor, metadata: DecodeMetadata) -> tuple[str, str]:
    """The backend ``"auto"`` picks here, and why: aiter on ROCm when importable and the call fits it,
    else Triton on a GPU, else Triton in the interpreter for small fp16/fp32 problems, else the golden."""
    plat = device.platform()
    prefix = ""
    if plat.kind == "rocm":
        status = device.aiter_status()
        if status.available:
            reasons = aiter_unsupported_reasons(q, kv_cache, metadata)
            if not reasons:
                return "aiter", "ROCm with aiter importable"
            prefix = "aiter cannot take this call (" + "; ".join(reasons) + "); "
        else:
            prefix = f"aiter unavailable ({status.reason}); "
        if device.on_gpu():
            return "triton", f"{prefix}Triton on the GPU (Triton's AMD backend)"
    elif device.on_gpu():
        return "triton", f"{plat.kind} GPU ({plat.device_name}): compiled Triton kernel (aiter needs ROCm)"
    if device.interpreter_active():
        work = q.shape[0] * q.shape[1] * metadata.kv_indices.numel() // max(metadata.num_reqs, 1)
        if q.dtype == torch.bfloat16:
            return "torch", f"{prefix}Triton interpreter computes bfloat16 wrongly (triton #11584); fp32 golden instead"
        if work <= INTERPRETER_MAX_WORK:
            return "triton", f"{prefix}no GPU: Triton interpreter (small problem, {work} row-keys)"
        return "torch", f"{prefix}no GPU and a large problem ({work} row-keys > {INTERPRETER_MAX_WORK}): fp32 golden"
    return "torch", f"{prefix}no GPU and no Triton interpreter: fp32 golden"


def mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, metadata: DecodeMetadata, *, sm_scale: float | None = None,
               backend: str = "auto", validate: bool = True) -> DecodeOutput:
    """MLA decode over flat per-token indices (``metadata`` from ``workbench.expand.build_flat_decode_metadata``).

    Args:
        q: ``(total_q, H, 576)`` contiguous; bf16/fp16 on a GPU, fp16/fp32 under the interpreter.
        kv_cache: ``[num_rows, 576]`` or the page_size-1 view ``[num_rows, 1, 1, 576]``, q's dtype.
        metadata: :class:`workbench.expand.DecodeMetadata` (``qo_indptr``, ``kv_indptr``, ``kv_indices``,
            ``kv_last_page_lens``, ``max_qo_len``).
        sm_scale: softmax scale, finite and positive; ``None`` = ``1/sqrt(576)`` (aiter's default; DeepSeek's
            models use another).
        backend: ``"triton"`` (this project's kernel: any query lengths 1..16, any head count),
            ``"torch"`` (fp32 golden, :func:`mla_decode_ref`), ``"aiter"`` (ROCm only: uniform query
            lengths, 16 or 128 heads), or ``"auto"`` (:func:`choose_backend`).
        validate: check offsets, index ranges, ``kv_len >= qo_len`` and that ``max_qo_len`` covers the longest
            query on the host
            (a device sync; pass False inside CUDA-graph capture after validating once).

    Returns:
        :class:`DecodeOutput` ``(out, lse, backend, reason)``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend is {backend!r}; choose one of {BACKENDS}")
    if not isinstance(metadata, DecodeMetadata):
        raise TypeError(f"metadata is a {type(metadata).__name__}; build a DecodeMetadata with "
                        "workbench.expand.build_flat_decode_metadata(block_table, seq_lens, query_lens, K)")
    check_max_qo_len(metadata.max_qo_len)
    if validate:
        _, qo, _ = check_values(q, kv_cache, metadata.qo_indptr, metadata.kv_indptr, metadata.kv_indices, KV_LORA_RANK)
        actual = max((b - a for a, b in zip(qo, qo[1:])), default=0)
        if actual > metadata.max_qo_len:
            raise ValueError(f"metadata.max_qo_len is {metadata.max_qo_len} but the longest query in qo_indptr has "
                             f"{actual} tokens; it must be at least that (rebuild the metadata)")
    reason = "requested"
    if backend == "auto":
        backend, reason = choose_backend(q, kv_cache, metadata)
    if backend == "torch":
        out, lse = mla_decode_ref(q, kv_cache, metadata.qo_indptr, metadata.kv_indptr, metadata.kv_indices, sm_scale)
        return DecodeOutput(out, lse, "torch", reason)
    if backend == "triton":
        out, lse = mla_decode_triton(q, kv_cache, metadata.qo_indptr, metadata.kv_indptr, metadata.kv_indices,
                                     metadata.max_qo_len, sm_scale, validate=False)  # validated above (or not asked)
        # what that call launched (the same host-side choice, made again after its input checks)
        cfg, splits = triton_launch_plan(q, metadata.qo_indptr, metadata.kv_indices, metadata.max_qo_len)
        return DecodeOutput(out, lse, "triton",
                            f"{reason}; split kernel {cfg.label}, {splits} split{'s' if splits > 1 else ''}")
    out, lse, persistent = mla_decode_aiter(q, kv_cache, metadata, sm_scale)
    path = "persistent (get_mla_metadata_v1)" if persistent else "non-persistent (qlen > 1)"
    return DecodeOutput(out, lse, "aiter", f"{reason}; {path}")
