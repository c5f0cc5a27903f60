"""The emulated aiter #2720 fault, and the one decode entry point of :mod:`workbench.qlen`.

:func:`decode` takes every backend of :func:`workbench.mla.mla_decode` plus ``"aiter-pow2-fault"``
(:func:`mla_decode_pow2_fault`): the correct decode, then position 0's output copied over every other
position of each request when ``max_seqlen_q`` is not a power of two. The emulation is not aiter's code
and says nothing about aiter's internals; it reproduces what the issue reports.
"""

from __future__ import annotations

import torch

from workbench import device, mla
from workbench.decode_metadata import DecodeMetadata
from workbench.pow2 import is_pow2
from workbench.qlen.padding import pad_queries_to_pow2

__all__ = ["BACKENDS", "FAULT_BACKEND", "BackendUnavailable", "decode", "mla_decode_pow2_fault"]

FAULT_BACKEND = "aiter-pow2-fault"
BACKENDS = tuple(mla.BACKENDS) + (FAULT_BACKEND,)  # ("auto", "triton", "torch", "aiter", "aiter-pow2-fault")


class BackendUnavailable(RuntimeError):
    """A backend that cannot run here (aiter without ROCm), with the reason."""


def _uniform_query_len(metadata: DecodeMetadata, who: str) -> int:
    lens = (metadata.qo_indptr[1:] - metadata.qo_indptr[:-1]).tolist()
    if any(n != metadata.max_qo_len for n in lens):
        raise ValueError(
            f"{who} needs every request to have the same query length (aiter's max_seqlen_q); got query "
            f"lengths {lens[:8]}{'...' if len(lens) > 8 else ''}. Pad them to one length "
            "(pad_queries_to_pow2 does) or split the batch by query length"
        )
    return metadata.max_qo_len


def mla_decode_pow2_fault(q: torch.Tensor, kv_cache: torch.Tensor, metadata: DecodeMetadata, *,
                          sm_scale: float | None = None, inner: str = "torch",
                          validate: bool = True) -> mla.DecodeOutput:
    """EMULATION of the aiter #2720 symptom (backend ``"aiter-pow2-fault"``), not aiter's kernel.

    Computes the correct MLA decode with ``inner`` (``"torch"``: the fp32 golden, or ``"triton"``),
    then, **only when** ``max_seqlen_q`` (``metadata.max_qo_len``) is not a power of two, overwrites
    every query row of each request with that request's position-0 row (output and LSE). Position 0
    is the request's first query token, the one that sees the fewest keys (``0 .. s_k - s_q``).

    Which row is broadcast: aiter #2720 states that all query positions of a request receive
    identical results "as if position 0's computation is broadcast to all positions". This emulation
    takes the issue's word: position 0. Like aiter, it requires one query length for all requests.

    Args:
        q: ``(total_q, H, 576)``; ``kv_cache``: ``[num_rows, 576]`` or ``[num_rows, 1, 1, 576]``.
        metadata: :class:`DecodeMetadata` with uniform query lengths.
        inner: the correct backend underneath: ``"torch"`` or ``"triton"``.

    Returns:
        :class:`workbench.mla.DecodeOutput` with ``backend == "aiter-pow2-fault"`` and a reason that
        says whether the fault fired.
    """
    if inner not in ("torch", "triton"):
        raise ValueError(f"inner is {inner!r}; the emulation wraps a correct backend: 'torch' or 'triton'")
    qlen = _uniform_query_len(metadata, f"backend={FAULT_BACKEND!r} (like aiter)")
    res = mla.mla_decode(q, kv_cache, metadata, sm_scale=sm_scale, backend=inner, validate=validate)
    if qlen <= 1 or is_pow2(qlen):
        return mla.DecodeOutput(res.out, res.lse, FAULT_BACKEND,
                                f"emulated aiter #2720 over {inner}: max_seqlen_q {qlen} is a power of two, exact")
    num_reqs, heads = metadata.num_reqs, q.shape[1]
    out = res.out.view(num_reqs, qlen, heads, -1)[:, :1].expand(-1, qlen, -1, -1).reshape(res.out.shape)
    lse = None if res.lse is None else \
        res.lse.view(num_reqs, qlen, heads)[:, :1].expand(-1, qlen, -1).reshape(res.lse.shape)
    return mla.DecodeOutput(out, lse, FAULT_BACKEND,
                            f"emulated aiter #2720 over {inner}: max_seqlen_q {qlen} is not a power of two, "
                            "position 0's output broadcast to every position")


def decode(q: torch.Tensor, kv_cache: torch.Tensor, metadata: DecodeMetadata, *, sm_scale: float | None = None,
           backend: str = "auto", pad_to_pow2: bool = False, validate: bool = True) -> mla.DecodeOutput:
    """MLA decode through any backend of :data:`BACKENDS`, optionally with queries padded to a power of two.

    Args:
        q, kv_cache, metadata, sm_scale, validate: as :func:`workbench.mla.mla_decode`.
        backend: ``"auto"``, ``"triton"``, ``"torch"``, ``"aiter"`` (ROCm only) or ``"aiter-pow2-fault"``
            (the emulation, over the fp32 golden).
        pad_to_pow2: run the call with every request's queries padded to ``next_pow2(max_qo_len)``
            (:func:`pad_queries_to_pow2`) and return only the real rows.

    Returns:
        :class:`workbench.mla.DecodeOutput`; ``out`` ``(total_q, H, 512)``, ``lse`` ``(total_q, H)``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend is {backend!r}; choose one of {BACKENDS}")
    if pad_to_pow2:
        padded = pad_queries_to_pow2(q, metadata)
        res = decode(padded.q, kv_cache, padded.metadata, sm_scale=sm_scale, backend=backend, validate=validate)
        lse = None if res.lse is None else padded.unpad(res.lse)
        return mla.DecodeOutput(padded.unpad(res.out), lse, res.backend,
                                f"{res.reason}; queries padded {padded.query_len} -> {padded.pad_len}")
    if backend == FAULT_BACKEND:
        return mla_decode_pow2_fault(q, kv_cache, metadata, sm_scale=sm_scale, validate=validate)
    if backend == "aiter" and not device.aiter_status().available:
        raise BackendUnavailable(f"backend 'aiter' runs only on ROCm with aiter installed; here: "
                                 f"{device.aiter_status().reason}. Use 'triton', 'torch' or '{FAULT_BACKEND}'")
    return mla.mla_decode(q, kv_cache, metadata, sm_scale=sm_scale, backend=backend, validate=validate)
