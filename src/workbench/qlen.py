"""The power-of-two query-length limitation (aiter #2720): probe, fault emulation, speculative decoding, padding.

aiter issue #2720 (open, filed 2026-04-13 on MI355X with amd-aiter 0.1.10.post2): the non-persistent
MLA decode (``mla_decode_fwd`` called without persistent metadata, the path vLLM takes whenever a
step's query length is above 1) gives every query position of a request *the same* output when
``max_seqlen_q`` is not a power of two. The report's words: all positions "receive identical
results, as if position 0's computation is broadcast to all positions". It was seen under CUDA
graphs; ``--enforce-eager`` builds the batch differently and hides it. Speculative verification runs
with ``max_seqlen_q = k + 1`` for ``k`` draft tokens, so ``k = 5`` (qlen 6) verified drafts against a
corrupted target and logged ~99 % acceptance at every position, while ``k = 7`` (qlen 8) was fine.

This module makes that concrete on any machine:

1. power-of-two arithmetic (:func:`is_pow2`, :func:`next_pow2`, :func:`safe_num_spec_tokens`);
2. a labelled *emulation* of the reported symptom, backend ``"aiter-pow2-fault"``
   (:func:`mla_decode_pow2_fault`): the correct decode, then position 0's output copied over every
   other position of each request when ``max_seqlen_q`` is not a power of two. It is not aiter's
   code and says nothing about aiter's internals; it reproduces what the issue reports;
3. the mitigation :func:`pad_queries_to_pow2`: pad every request's queries to the next power of two
   without moving the causal window of the real rows, decode, keep the real rows;
4. :func:`probe_qlen`: every query length against the fp32 golden, classified ``ok``,
   ``broadcast-fault`` or ``wrong`` (on ROCm with aiter this probes the real kernel);
5. speculative decoding made concrete: :class:`TinyMLA`, a seeded two-layer language model whose
   attention is absorbed MLA decode through a selectable backend, a cheap draft, greedy chain
   verification with one ``qlen = k + 1`` decode call per step (as vLLM verifies), vLLM's
   per-position acceptance rates, and the losslessness check against plain greedy decoding
   (:func:`check_lossless`, :func:`sweep_k`).

Every decode call in this module goes through :func:`decode`, whose backends are those of
:func:`workbench.mla.mla_decode` plus ``"aiter-pow2-fault"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from workbench import device, mla
from workbench.pow2 import check_count as _check_count, is_pow2, next_pow2, safe_num_spec_tokens
from workbench.expand import DecodeMetadata, build_flat_decode_metadata, expand_page_indices_ref

__all__ = [
    "BACKENDS",
    "DRAFTS",
    "FAULT_BACKEND",
    "VERDICTS",
    "BackendUnavailable",
    "Divergence",
    "FP8_MAX_QLEN",
    "GuidanceRow",
    "LosslessReport",
    "LossyDecoding",
    "PaddedQueries",
    "ProbeReport",
    "ProbeRow",
    "SpecRun",
    "TinyMLA",
    "TinyMLAConfig",
    "check_lossless",
    "classify_output",
    "decode",
    "default_prompts",
    "format_guidance",
    "format_sweep",
    "greedy_decode",
    "guidance",
    "is_pow2",
    "mla_decode_pow2_fault",
    "next_pow2",
    "pad_queries_to_pow2",
    "parse_qlens",
    "probe_qlen",
    "safe_num_spec_tokens",
    "speculative_decode",
    "sweep_k",
]

FAULT_BACKEND = "aiter-pow2-fault"
BACKENDS = tuple(mla.BACKENDS) + (FAULT_BACKEND,)  # ("auto", "triton", "torch", "aiter", "aiter-pow2-fault")
VERDICTS = ("ok", "broadcast-fault", "wrong")


# ----------------------------------------------------------------------------------------------
# 2. The emulated fault and the one decode entry point of this module
# ----------------------------------------------------------------------------------------------


class BackendUnavailable(RuntimeError):
    """A backend that cannot run here (aiter without ROCm), with the reason."""


class LossyDecoding(AssertionError):
    """Speculative decoding emitted something plain greedy decoding of the same target would not."""


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
    identical results "as if position 0's computation is broadcast to all positions"
    (shared/CONTEXT.md section 3 says "the same output for every query position"). This emulation
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


# ----------------------------------------------------------------------------------------------
# 3. The mitigation: pad the queries to the next power of two
# ----------------------------------------------------------------------------------------------
#
# The decode aligns a request's s_q queries bottom-right: query i sees keys 0 .. s_k - s_q + i.
# Adding p = P - s_q rows must not move that window. Two placements keep it:
#   front: p rows *before* the real ones, keys unchanged. Real row i becomes row p + i and sees
#          keys 0 .. s_k - P + p + i = s_k - s_q + i. Needs s_k >= P (every row must see a key).
#   back:  p rows *after* the real ones, and p extra keys after the real keys (copies of the last
#          real key's row index). Real row i sees 0 .. (s_k + p) - P + i = s_k - s_q + i: the extra
#          keys are beyond every real row's window. Works for any s_k.
# The pad rows' outputs are thrown away. Extra traffic: p query rows in, p output rows out (and for
# "back" p index entries); the KV rows, which dominate, are read exactly as before.


@dataclasses.dataclass(frozen=True)
class PaddedQueries:
    """The padded call of :func:`pad_queries_to_pow2`.

    Attributes:
        q: ``(num_reqs * pad_len, H, D)`` padded queries (pad rows copy a real row: finite values).
        metadata: :class:`DecodeMetadata` with every request at ``pad_len`` queries.
        real_rows: ``(total_q,) int64``: row of the padded call that holds each original row, in order.
        query_len: the original ``max_qo_len``; ``pad_len``: ``next_pow2(query_len)``.
        placements: per request, ``"front"`` or ``"back"`` (the placement used for it).
    """

    q: torch.Tensor
    metadata: DecodeMetadata
    real_rows: torch.Tensor
    query_len: int
    pad_len: int
    placements: list[str]

    @property
    def extra_rows(self) -> int:
        """Query rows added in total (each costs one q row read and one output row written per head)."""
        return self.q.shape[0] - self.real_rows.numel()

    def unpad(self, t: torch.Tensor) -> torch.Tensor:
        """The real rows of a padded result ``(num_reqs * pad_len, ...)`` -> ``(total_q, ...)``."""
        if t.shape[0] != self.q.shape[0]:
            raise ValueError(f"t has {t.shape[0]} rows but the padded call has {self.q.shape[0]}; pass its output")
        return t.index_select(0, self.real_rows.to(t.device))


def pad_queries_to_pow2(q: torch.Tensor, metadata: DecodeMetadata, *, placement: str = "auto") -> PaddedQueries:
    """Pad every request's queries to ``P = next_pow2(max_qo_len)`` rows, keeping the real rows' causal windows.

    Args:
        q: ``(total_q, H, D)`` queries of the step.
        metadata: :class:`DecodeMetadata`; every request needs at least one query.
        placement: ``"front"`` (pad rows before the real ones; no extra keys; needs ``kv_len >= P``),
            ``"back"`` (pad rows after them, plus ``P - qo_len`` extra key indices that no real row
            sees; any ``kv_len``), or ``"auto"`` (per request: front where ``kv_len >= P``, else back).

    Returns:
        :class:`PaddedQueries`. Decode ``.q`` with ``.metadata`` and keep ``.unpad(out)``.
    """
    if placement not in ("auto", "front", "back"):
        raise ValueError(f"placement is {placement!r}; choose 'front' (no extra keys), 'back' (any kv_len) or 'auto'")
    if q.dim() != 3:
        raise ValueError(f"q has shape {tuple(q.shape)}; expected (total_q, num_heads, head_dim)")
    qo = metadata.qo_indptr.tolist()
    kv = metadata.kv_indptr.tolist()
    if qo[-1] != q.shape[0]:
        raise ValueError(f"metadata.qo_indptr[-1] is {qo[-1]} but q has {q.shape[0]} rows; they must agree")
    q_lens = [b - a for a, b in zip(qo, qo[1:])]
    k_lens = [b - a for a, b in zip(kv, kv[1:])]
    if any(n < 1 for n in q_lens):
        bad = q_lens.index(min(q_lens))
        raise ValueError(f"request {bad} has {q_lens[bad]} query tokens; padding needs at least one per request "
                         "(drop requests without queries from the step first)")
    query_len = max(q_lens)
    P = next_pow2(query_len)
    if placement == "front":
        short = [b for b, n in enumerate(k_lens) if n < P]
        if short:
            b = short[0]
            raise ValueError(f"request {b} has kv_len {k_lens[b]} < {P} = next_pow2(max_qo_len {query_len}); "
                             "front padding needs kv_len >= the padded length (every pad row must see a key). "
                             "Use placement='back'")
    dev = q.device
    src_rows, real_rows, placements = [], [], []
    kv_idx_parts, kv_cum = [], [0]
    for b, (s_q, s_k) in enumerate(zip(q_lens, k_lens)):
        p = P - s_q
        real = list(range(qo[b], qo[b + 1]))
        where = placement if placement != "auto" else ("front" if s_k >= P else "back")
        placements.append(where)
        if where == "front":
            src_rows += [qo[b]] * p + real
            real_rows += [b * P + p + i for i in range(s_q)]
            kv_idx_parts.append(metadata.kv_indices[kv[b]:kv[b + 1]])
            kv_cum.append(kv_cum[-1] + s_k)
        else:
            src_rows += real + [qo[b + 1] - 1] * p
            real_rows += [b * P + i for i in range(s_q)]
            own = metadata.kv_indices[kv[b]:kv[b + 1]]
            kv_idx_parts.append(torch.cat([own, own[-1:].expand(p)]) if p else own)
            kv_cum.append(kv_cum[-1] + s_k + p)
    num_reqs = len(q_lens)
    idx_dtype = metadata.qo_indptr.dtype
    padded_md = DecodeMetadata(
        qo_indptr=torch.arange(0, num_reqs * P + 1, P, dtype=idx_dtype, device=metadata.qo_indptr.device),
        kv_indptr=torch.tensor(kv_cum, dtype=metadata.kv_indptr.dtype, device=metadata.kv_indptr.device),
        kv_indices=torch.cat(kv_idx_parts) if kv_idx_parts else metadata.kv_indices[:0],
        kv_last_page_lens=metadata.kv_last_page_lens,
        max_qo_len=P,
    )
    padded_q = q.index_select(0, torch.tensor(src_rows, dtype=torch.long, device=dev)).contiguous()
    return PaddedQueries(padded_q, padded_md, torch.tensor(real_rows, dtype=torch.long), query_len, P, placements)


# ----------------------------------------------------------------------------------------------
# 4. The probe: every query length against the golden
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProbeRow:
    """One query length of :func:`probe_qlen`."""

    qlen: int
    pow2: bool
    max_err: float  # max |out - golden|
    max_err_broadcast: float  # max |out - golden's position-0 rows broadcast| (the #2720 signature)
    tol: float  # derived tolerance (see probe_qlen)
    verdict: str  # "ok" | "broadcast-fault" | "wrong"
    time_ms: float  # wall time of one decode call (after a warm-up call on a GPU)


@dataclasses.dataclass
class ProbeReport:
    """What :func:`probe_qlen` found, one :class:`ProbeRow` per query length."""

    backend: str  # requested
    backend_ran: str  # what ran ("auto" resolved)
    reason: str
    heads: int
    kv_lens: list[int]
    dtype: str
    device: str
    rows: list[ProbeRow]

    @property
    def faulty_qlens(self) -> list[int]:
        return [r.qlen for r in self.rows if r.verdict != "ok"]

    @property
    def all_ok(self) -> bool:
        return not self.faulty_qlens

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        head = (f"probe-qlen: backend {self.backend_ran} ({self.reason}); {self.heads} heads, kv_lens {self.kv_lens}, "
                f"{self.dtype}, {self.device}")
        lines = [head, f"{'qlen':>4} {'pow2':>5} {'max err':>9} {'vs bcast':>9} {'tol':>8} {'verdict':>16} {'ms':>8}"]
        for r in self.rows:
            lines.append(f"{r.qlen:4d} {'yes' if r.pow2 else 'no':>5} {r.max_err:9.2e} {r.max_err_broadcast:9.2e} "
                         f"{r.tol:8.1e} {r.verdict:>16} {r.time_ms:8.1f}")
        lines.append("all ok" if self.all_ok else f"NOT ok at qlen {self.faulty_qlens}")
        return "\n".join(lines)


@contextlib.contextmanager
def _one_cpu_thread(dev: torch.device):
    """Run the tiny model's CPU ops on one intra-op thread (restored afterwards). Its tensors are a few KB:
    far below the size where torch's threads pay off, and on a busy shared CPU the thread hand-offs made
    a greedy run 4x slower (measured here: 0.9 s vs 0.2 s for 4 prompts x 20 tokens)."""
    if dev.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _flat_metadata(block_table: torch.Tensor, seq_lens: Sequence[int], query_lens: Sequence[int],
                   kernel_block_size: int) -> DecodeMetadata:
    """:class:`DecodeMetadata` for one step. On a GPU: the project's builder
    (:func:`workbench.expand.build_flat_decode_metadata`). Under the interpreter the builder's Triton
    expansion costs ~0.2 s a call, so the same indices come from its spec,
    :func:`workbench.expand.expand_page_indices_ref` (tests/test_expand.py checks that they agree)."""
    if not device.interpreter_active():
        return build_flat_decode_metadata(block_table, torch.tensor(list(seq_lens), dtype=torch.int32,
                                                                    device=block_table.device), list(query_lens),
                                          kernel_block_size)
    kv_indices, kv_indptr = expand_page_indices_ref(block_table, list(seq_lens), kernel_block_size)
    cum = [0]
    for n in query_lens:
        cum.append(cum[-1] + n)
    dev = block_table.device
    return DecodeMetadata(qo_indptr=torch.tensor(cum, dtype=torch.int32, device=dev), kv_indptr=kv_indptr,
                          kv_indices=kv_indices, kv_last_page_lens=torch.ones(len(query_lens), dtype=torch.int32,
                                                                              device=dev),
                          max_qo_len=max(query_lens, default=0))


def _probe_inputs(qlen: int, heads: int, kv_lens: Sequence[int], dtype: torch.dtype, dev: torch.device,
                  seed: int, kernel_block_size: int = 16):
    """Random q, a paged cache (block 0 reserved, blocks permuted, unused slots NaN) and its flat metadata."""
    g = torch.Generator().manual_seed(seed * 1009 + qlen)
    K = kernel_block_size
    pages = [-(-n // K) for n in kv_lens]
    num_blocks = 1 + sum(pages) + 2
    cache = torch.full((num_blocks * K, mla.QK_HEAD_DIM), float("nan"))
    perm = (1 + torch.randperm(num_blocks - 1, generator=g)).tolist()
    block_table = torch.zeros(len(kv_lens), max(pages), dtype=torch.int32)
    for r, (n, p) in enumerate(zip(kv_lens, pages)):
        block_table[r, :p] = torch.tensor(perm[:p], dtype=torch.int32)
        perm = perm[p:]
        t = torch.arange(n)
        cache[block_table[r, t // K].long() * K + t % K] = torch.randn(n, mla.QK_HEAD_DIM, generator=g)
    q = torch.randn(len(kv_lens) * qlen, heads, mla.QK_HEAD_DIM, generator=g)
    md = _flat_metadata(block_table.to(dev), kv_lens, [qlen] * len(kv_lens), K)
    return q.to(dtype).to(dev), cache.to(dtype).to(dev), md


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def probe_qlen(backend: str, qlens: Iterable[int] = range(1, 17), *, heads: int = 16, num_reqs: int = 2,
               kv_len: int = 40, dtype: torch.dtype | None = None, sm_scale: float | None = None,
               seed: int = 0) -> ProbeReport:
    """Run one decode per query length and compare it with the fp32 golden (:func:`workbench.mla.mla_decode_ref`).

    Each call has ``num_reqs`` requests of ``qlen`` queries (uniform, as aiter needs) and
    ``kv_len + 23 * b`` keys for request ``b``, on a paged cache with NaN in every unused slot.

    Tolerance (flash-attention's rule, derived, not guessed): ``tol = 2 * err_same_precision + floor``
    where ``err_same_precision`` is the error of a plain torch decode in the input dtype
    (:func:`workbench.mla.mla_decode_torch`) against the golden, and ``floor = 2 * eps(dtype) *
    max(1, |golden|) + 1e-5``. Verdicts: ``ok`` if ``max_err <= tol``; ``broadcast-fault`` if not, but
    the output matches the golden's position-0 rows copied to every position within ``tol`` (the
    #2720 signature); ``wrong`` otherwise (including NaN).

    Args:
        backend: one of :data:`BACKENDS`.
        qlens: query lengths to probe, each in ``1..16``.
        heads: query heads (aiter runs 16 or 128).
        dtype: input dtype; default bf16 on a GPU, float32 on CPU (the interpreter cannot do bf16).

    Raises:
        BackendUnavailable: ``backend="aiter"`` where aiter cannot run (not ROCm, or not installed).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend is {backend!r}; choose one of {BACKENDS}")
    qlens = list(qlens)
    if not qlens:
        raise ValueError("qlens is empty; pass query lengths in 1..16, e.g. range(1, 17)")
    for n in qlens:
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= mla.MAX_QLEN:
            raise ValueError(f"qlens holds {n!r}; every query length must be an int in 1..{mla.MAX_QLEN}")
    _check_count("heads", heads, 1)
    _check_count("num_reqs", num_reqs, 1)
    _check_count("kv_len", kv_len, max(qlens))
    if backend == "aiter" and not device.aiter_status().available:
        raise BackendUnavailable(f"backend 'aiter' runs only on ROCm with aiter installed; here: "
                                 f"{device.aiter_status().reason}. Probe 'triton', 'torch' or '{FAULT_BACKEND}' "
                                 "instead")
    dev = device.default_device()
    if dtype is None:
        dtype = torch.bfloat16 if device.on_gpu() else torch.float32
    kv_lens = [kv_len + 23 * b for b in range(num_reqs)]
    with _one_cpu_thread(dev):
        rows, ran, reason = _probe_rows(backend, qlens, heads, num_reqs, kv_lens, dtype, dev, sm_scale, seed)
    if ran == FAULT_BACKEND:
        reason = "emulation of the aiter #2720 symptom over the fp32 golden"
    return ProbeReport(backend, ran, reason, heads, kv_lens, str(dtype).replace("torch.", ""), str(dev), rows)


def classify_output(out: torch.Tensor, golden: torch.Tensor, tol: float, num_reqs: int) -> tuple[str, float, float]:
    """Classify a decode output against the golden: ``(verdict, max_err, max_err_vs_broadcast)``.

    ``out`` and ``golden`` are ``(num_reqs * qlen, H, 512)`` (uniform query length). ``"ok"`` when
    ``max |out - golden| <= tol``; ``"broadcast-fault"`` when not, but ``out`` equals the golden's
    position-0 row of each request copied to every position (within ``tol``; needs ``qlen > 1``);
    ``"wrong"`` otherwise, and always when ``out`` holds NaN.
    """
    if out.shape != golden.shape or out.shape[0] % num_reqs:
        raise ValueError(f"out {tuple(out.shape)} and golden {tuple(golden.shape)} must match and split into "
                         f"{num_reqs} requests of one query length")
    qlen = out.shape[0] // num_reqs
    o, g = out.float(), golden.float()
    bcast = g.view(num_reqs, qlen, *g.shape[1:])[:, :1].expand(-1, qlen, *g.shape[1:]).reshape(g.shape)
    if torch.isnan(o).any():
        return "wrong", float("nan"), float("nan")
    err = (o - g).abs().max().item() if o.numel() else 0.0
    err_b = (o - bcast).abs().max().item() if o.numel() else 0.0
    if err <= tol:
        return "ok", err, err_b
    if qlen > 1 and err_b <= tol:
        return "broadcast-fault", err, err_b
    return "wrong", err, err_b


def _probe_rows(backend: str, qlens: list[int], heads: int, num_reqs: int, kv_lens: list[int], dtype: torch.dtype,
                dev: torch.device, sm_scale: float | None, seed: int) -> tuple[list[ProbeRow], str, str]:
    rows, ran, reason = [], backend, ""
    for qlen in qlens:
        q, cache, md = _probe_inputs(qlen, heads, kv_lens, dtype, dev, seed)
        if device.on_gpu():  # warm-up: compile outside the timed call
            decode(q, cache, md, sm_scale=sm_scale, backend=backend)
        _sync(dev)
        t0 = time.perf_counter()
        res = decode(q, cache, md, sm_scale=sm_scale, backend=backend)
        _sync(dev)
        ms = (time.perf_counter() - t0) * 1e3
        ran, reason = res.backend, res.reason
        gold, _ = mla.mla_decode_ref(q, cache, md.qo_indptr, md.kv_indptr, md.kv_indices, sm_scale)
        same, _ = mla.mla_decode_torch(q, cache, md.qo_indptr, md.kv_indptr, md.kv_indices, sm_scale, qlen,
                                       max(kv_lens))
        floor = 2 * torch.finfo(dtype).eps * max(1.0, gold.abs().max().item()) + 1e-5
        tol = 2 * (same.float() - gold).abs().max().item() + floor
        verdict, err, err_b = classify_output(res.out, gold, tol, num_reqs)
        rows.append(ProbeRow(qlen, is_pow2(qlen), err, err_b, tol, verdict, ms))
    return rows, ran, reason


@dataclasses.dataclass(frozen=True)
class GuidanceRow:
    """What a ROCm user should do with ``num_speculative_tokens = k`` on ``ROCM_AITER_MLA`` today."""

    k: int
    qlen: int  # verification max_seqlen_q = k + 1
    pow2: bool
    padded_qlen: int  # next_pow2(qlen)
    extra_rows_pct: float  # query rows added by padding, in % of qlen
    safe_k_below: int  # the largest k' <= k with k' + 1 a power of two
    fp8_ok: bool  # qlen <= 4: aiter's fp8 MLA decode kernels (aiter #2760)
    advice: str


FP8_MAX_QLEN = 4  # aiter #2760: "only support fp8 mla decoding for qo_len <= 4" (pre-compiled asm kernels)


def guidance(max_k: int = 15) -> list[GuidanceRow]:
    """One :class:`GuidanceRow` per ``k`` in ``1..max_k`` (``max_k <= 15``: the decode path takes qlen <= 16)."""
    _check_count("max_k", max_k, 1)
    if max_k + 1 > mla.MAX_QLEN:
        raise ValueError(f"max_k is {max_k}; verification needs k + 1 <= {mla.MAX_QLEN} query tokens")
    rows = []
    for k in range(1, max_k + 1):
        q, P = k + 1, next_pow2(k + 1)
        safe = max(safe_num_spec_tokens(k))
        if is_pow2(q):
            advice = "safe as is"
        else:
            advice = f"pad to {P} (+{P - q} row{'s' if P - q > 1 else ''}) or use k={safe}"
        rows.append(GuidanceRow(k, q, is_pow2(q), P, 100.0 * (P - q) / q, safe, q <= FP8_MAX_QLEN, advice))
    return rows


def format_guidance(rows: Sequence[GuidanceRow], markdown: bool = False) -> str:
    """The guidance rows as a plain or Markdown table."""
    head = ["k", "verify qlen", "power of 2?", "padded qlen", "extra rows", "fp8 kernels (qlen <= 4)",
            "bf16 today (#2720)"]
    body = [[str(r.k), str(r.qlen), "yes" if r.pow2 else "no", str(r.padded_qlen), f"{r.extra_rows_pct:.0f} %",
             "ok" if r.fp8_ok else "no kernel (#2760)", r.advice] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(b) + " |" for b in body]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head)] + [fmt(b) for b in body])


def parse_qlens(text: str) -> list[int]:
    """``"1-16"`` or ``"3,6,8"`` or ``"1-4,6"`` -> a sorted list of distinct query lengths in ``1..16``."""
    out: set[int] = set()
    for part in str(text).replace(" ", "").split(","):
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise ValueError(f"qlens {text!r}: {part!r} is not a length or a range; write e.g. 1-16 or 3,6,8") from None
    bad = sorted(n for n in out if not 1 <= n <= mla.MAX_QLEN)
    if bad:
        raise ValueError(f"qlens {text!r} holds {bad}; query lengths must be in 1..{mla.MAX_QLEN}")
    return sorted(out)


# ----------------------------------------------------------------------------------------------
# 5. A tiny MLA language model (the target)
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TinyMLAConfig:
    """Shape of :class:`TinyMLA`. The cache row is fixed at 576 = 512 latent + 64 rope: the decode entry
    point (:func:`workbench.mla.mla_decode`) fixes V's width at 512, and the Triton kernel and aiter need
    rows of exactly 576, so a narrower latent would leave the Triton path out."""

    vocab_size: int = 64
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    mlp_mult: int = 4
    kernel_block_size: int = 16
    attn_gain: float = 1.5  # scales the attention output so that the context matters to the prediction
    pos_scale: float = 1.0  # scale of the learned-style absolute position embedding added to the input
    max_positions: int = 512
    sm_scale: float = 0.08  # softmax scale of the decode (aiter's default 1/sqrt(576) is 0.042)
    rope_theta: float = 10000.0
    dtype: torch.dtype = torch.float32  # dtype of q and of the cache (fp16/fp32 under the interpreter)
    seed: int = 0


def _rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE. ``x`` ``(..., 64)``, ``pos`` broadcastable to ``x.shape[:-1]`` (token positions)."""
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    ang = pos.to(torch.float32)[..., None] * inv  # (..., 32)
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


@dataclasses.dataclass
class KVState:
    """Per-request KV cache of :class:`TinyMLA`: one ``[num_blocks * K, 576]`` tensor per layer (unused
    rows NaN), a block table ``(num_reqs, max_blocks) int32`` (block 0 reserved, blocks permuted) and
    ``seq_lens`` (host ints: tokens committed to the cache per request)."""

    caches: list[torch.Tensor]
    block_table: torch.Tensor
    seq_lens: list[int]
    kernel_block_size: int

    @property
    def capacity(self) -> int:
        return self.block_table.shape[1] * self.kernel_block_size


@dataclasses.dataclass
class ForwardOutput:
    """``logits`` ``(R, s, V)`` fp32; ``hidden`` ``(R, s, d)`` final hidden states (before the head);
    ``attn`` one ``(R, s, d)`` attention output per layer (after the absorbed output projection)."""

    logits: torch.Tensor
    hidden: torch.Tensor
    attn: list[torch.Tensor]


class TinyMLA:
    """A seeded, random-weight decoder whose attention is absorbed MLA decode through :func:`decode`.

    Per layer (pre-norm residual): ``h = rms(x)``; the cache row of a token is ``[h W_dkv (512),
    rope(h W_kr) (64)]``; each head's query is ``[h W_q (512, the absorbed no-rope part), rope(h W_qr)
    (64)]``; the decode returns each head's weighted sum of latents ``(512)``, mapped back to the model
    width by the absorbed output projection ``W_o`` (all heads concatenated); then a ReLU MLP. A final
    RMS norm and an untied head give the logits. Weights are ``N(0, 1/fan_in)`` from ``config.seed``.
    Everything runs on :func:`workbench.device.default_device`.
    """

    def __init__(self, config: TinyMLAConfig = TinyMLAConfig()):
        c = self.config = config
        _check_count("vocab_size", c.vocab_size, 2)
        _check_count("num_heads", c.num_heads, 1)
        _check_count("num_layers", c.num_layers, 1)
        if c.dtype == torch.bfloat16 and device.interpreter_active():
            device.check_kernel_dtype(c.dtype, "config.dtype")
        self.device = device.default_device()
        g = torch.Generator().manual_seed(c.seed)
        d, H, L, R = c.d_model, c.num_heads, mla.KV_LORA_RANK, mla.QK_ROPE_HEAD_DIM

        def w(*shape: int, fan_in: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) / math.sqrt(fan_in)).to(self.device)

        self.embed = torch.randn(c.vocab_size, d, generator=g).to(self.device)
        self.pos_embed = (c.pos_scale * torch.randn(c.max_positions, d, generator=g)).to(self.device)
        self.layers = [dict(
            w_dkv=w(d, L, fan_in=d), w_kr=w(d, R, fan_in=d), w_q=w(d, H, L, fan_in=d), w_qr=w(d, H, R, fan_in=d),
            w_o=w(H * L, d, fan_in=H * L), w_1=w(d, c.mlp_mult * d, fan_in=d),
            w_2=w(c.mlp_mult * d, d, fan_in=c.mlp_mult * d),
        ) for _ in range(c.num_layers)]
        self.head = w(d, c.vocab_size, fan_in=d)

    # -- cache --------------------------------------------------------------------------------
    def new_state(self, num_reqs: int, max_tokens: int, *, seed: int = 0) -> KVState:
        """An empty cache for ``num_reqs`` requests of up to ``max_tokens`` tokens each."""
        _check_count("num_reqs", num_reqs, 1)
        _check_count("max_tokens", max_tokens, 1)
        K = self.config.kernel_block_size
        per_req = -(-max_tokens // K)
        num_blocks = 1 + num_reqs * per_req
        g = torch.Generator().manual_seed(seed)
        perm = 1 + torch.randperm(num_blocks - 1, generator=g)
        block_table = perm.view(num_reqs, per_req).to(torch.int32).to(self.device)
        caches = [torch.full((num_blocks * K, mla.QK_HEAD_DIM), float("nan"), dtype=self.config.dtype,
                             device=self.device) for _ in range(self.config.num_layers)]
        return KVState(caches, block_table, [0] * num_reqs, K)

    # -- the target ---------------------------------------------------------------------------
    def forward(self, state: KVState, req_ids: Sequence[int], tokens: torch.Tensor, *, backend: str = "torch",
                pad_to_pow2: bool = False) -> ForwardOutput:
        """Run ``tokens`` ``(R, s)`` (int64) as the next ``s`` tokens of requests ``req_ids``: writes their
        cache rows at positions ``seq_lens[r] .. seq_lens[r] + s - 1`` and attends over everything up to
        each token (one MLA decode call per layer with ``max_qo_len = s``). Does not advance ``seq_lens``:
        the caller commits what it keeps (rejected drafts' rows are overwritten later)."""
        req_ids = list(req_ids)
        R, s = tokens.shape
        if R != len(req_ids):
            raise ValueError(f"tokens has {R} rows but req_ids has {len(req_ids)} entries; one row per request")
        c, K = self.config, state.kernel_block_size
        start = torch.tensor([state.seq_lens[r] for r in req_ids], device=self.device)
        if int(start.max()) + s > state.capacity:
            raise ValueError(f"a request would hold {int(start.max()) + s} tokens but the cache holds "
                             f"{state.capacity} per request; make new_state(max_tokens=...) larger")
        pos = start[:, None] + torch.arange(s, device=self.device)  # (R, s)
        bt = state.block_table[req_ids]  # (R, max_blocks)
        slots = (bt.gather(1, pos // K).long() * K + pos % K).flatten()  # (R*s,) cache rows
        md = _flat_metadata(bt, [state.seq_lens[r] + s for r in req_ids], [s] * R, K)
        if int(pos.max()) >= c.max_positions:
            raise ValueError(f"position {int(pos.max())} is beyond config.max_positions {c.max_positions}")
        x = self.embed[tokens] + self.pos_embed[pos]  # (R, s, d)
        attn = []
        for layer, cache in zip(self.layers, state.caches):
            h = _rms_norm(x)
            row = torch.cat([h @ layer["w_dkv"], _rope(h @ layer["w_kr"], pos, c.rope_theta)], dim=-1)
            cache[slots] = row.reshape(R * s, -1).to(cache.dtype)
            q_lat = torch.einsum("rsd,dhl->rshl", h, layer["w_q"])
            q_rope = _rope(torch.einsum("rsd,dhe->rshe", h, layer["w_qr"]), pos[:, :, None], c.rope_theta)
            q = torch.cat([q_lat, q_rope], dim=-1).reshape(R * s, c.num_heads, -1).to(c.dtype).contiguous()
            res = decode(q, cache, md, sm_scale=c.sm_scale, backend=backend, pad_to_pow2=pad_to_pow2)
            a = (res.out.float().reshape(R, s, -1) @ layer["w_o"]) * c.attn_gain
            attn.append(a)
            x = self._after_attention(layer, x, a)
        hidden = _rms_norm(x)
        return ForwardOutput(hidden @ self.head, hidden, attn)

    def _after_attention(self, layer: dict, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        x = x + a
        return x + torch.relu(_rms_norm(x) @ layer["w_1"]) @ layer["w_2"]

    def forward_frozen(self, tokens: torch.Tensor, positions: torch.Tensor,
                       attn: Sequence[torch.Tensor]) -> torch.Tensor:
        """The token-local part of the model with each layer's attention output given: ``tokens`` and
        ``positions`` ``(R,)``, ``attn`` one ``(R, d)`` per layer -> final hidden ``(R, d)``. No cache is
        read or written."""
        x = self.embed[tokens] + self.pos_embed[positions]
        for layer, a in zip(self.layers, attn):
            x = self._after_attention(layer, x, a)
        return _rms_norm(x)


# ----------------------------------------------------------------------------------------------
# 6. Drafts, generation, acceptance statistics
# ----------------------------------------------------------------------------------------------

DRAFTS = ("frozen-context", "ngram")


def default_prompts(num_prompts: int = 4, prompt_len: int = 12, vocab_size: int = 64, seed: int = 1) -> list[list[int]]:
    """``num_prompts`` seeded random prompts of ``prompt_len`` tokens."""
    _check_count("num_prompts", num_prompts, 1)
    _check_count("prompt_len", prompt_len, 1)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (num_prompts, prompt_len), generator=g).tolist()


def _check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int) -> list[list[int]]:
    if not prompts:
        raise ValueError("prompts is empty; pass at least one prompt (a list of token ids)")
    out = []
    for i, p in enumerate(prompts):
        p = list(p)
        if not p:
            raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token")
        if not all(isinstance(t, int) and 0 <= t < vocab_size for t in p):
            raise ValueError(f"prompts[{i}] holds {p[:8]}...; token ids must be ints in 0..{vocab_size - 1}")
        out.append(p)
    return out


def _prefill(model: TinyMLA, state: KVState, prompts: list[list[int]], backend: str) -> list[int]:
    """Feed the prompts one token per step (qlen 1, a power of two); return each request's first new token."""
    first = [0] * len(prompts)
    for t in range(max(len(p) for p in prompts)):
        ids = [r for r, p in enumerate(prompts) if t < len(p)]
        tok = torch.tensor([[prompts[r][t]] for r in ids], device=model.device)
        out = model.forward(state, ids, tok, backend=backend)
        for i, r in enumerate(ids):
            state.seq_lens[r] += 1
            if t == len(prompts[r]) - 1:
                first[r] = int(out.logits[i, 0].argmax())
    return first


def greedy_decode(model: TinyMLA, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                  backend: str = "torch") -> tuple[list[list[int]], float]:
    """Plain greedy decoding, one token per step (every decode call has ``qlen = 1``).

    Returns:
        ``(tokens, min_margin)``: the ``max_new_tokens`` new tokens of each prompt, and the smallest gap
        between the best and second-best logit over all choices (how far the run is from a tie).
    """
    prompts = _check_prompts(prompts, model.config.vocab_size)
    _check_count("max_new_tokens", max_new_tokens, 1)
    with _one_cpu_thread(model.device):
        return _greedy(model, prompts, max_new_tokens, backend)


def _greedy(model: TinyMLA, prompts: list[list[int]], max_new_tokens: int, backend: str):
    state = model.new_state(len(prompts), max(map(len, prompts)) + max_new_tokens + 1)
    out = [[t] for t in _prefill(model, state, prompts, backend)]
    margin = math.inf
    ids = list(range(len(prompts)))
    for _ in range(max_new_tokens - 1):
        res = model.forward(state, ids, torch.tensor([[o[-1]] for o in out], device=model.device), backend=backend)
        top2 = res.logits[:, 0].topk(2, dim=-1).values
        margin = min(margin, float((top2[:, 0] - top2[:, 1]).min()))
        for r in ids:
            state.seq_lens[r] += 1
            out[r].append(int(res.logits[r, 0].argmax()))
    return out, margin


def _ngram_draft(history: list[int], k: int, n_max: int = 3) -> list[int]:
    """Prompt-lookup draft: find the latest earlier occurrence of the last ``n`` tokens (``n_max`` down to 1)
    and propose the ``k`` tokens that followed it; with no match, repeat the last token."""
    for n in range(min(n_max, len(history) - 1), 0, -1):
        tail = history[-n:]
        for start in range(len(history) - n - 1, -1, -1):
            if history[start:start + n] == tail:
                follow = history[start + n:start + n + k]
                return follow + [follow[-1]] * (k - len(follow))
    return [history[-1]] * k


@dataclasses.dataclass
class SpecRun:
    """One speculative-decoding run and its statistics, counted the way vLLM counts them
    (``SpecDecodingStats.observe_draft``: one draft per request per verification step)."""

    k: int
    backend: str
    pad_to_pow2: bool
    draft: str
    tokens: list[list[int]]
    num_drafts: int
    num_accepted_tokens: int
    accepted_per_pos: list[int]  # drafts whose position i+1 was accepted (a prefix: decreasing)

    @property
    def verify_qlen(self) -> int:
        """Query tokens per request in the verification call: the last token plus k drafts."""
        return self.k + 1

    @property
    def call_qlen(self) -> int:
        """``max_seqlen_q`` the attention backend sees: ``k + 1``, or the next power of two when padded."""
        return next_pow2(self.k + 1) if self.pad_to_pow2 else self.k + 1

    @property
    def acceptance_rates(self) -> list[float]:
        """vLLM's per-position acceptance rates: accepted at position i / number of drafts."""
        return [n / self.num_drafts for n in self.accepted_per_pos] if self.num_drafts else [math.nan] * self.k

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted tokens per draft (vLLM counts the bonus token)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else math.nan

    @property
    def draft_acceptance_rate(self) -> float:
        """Accepted / drafted tokens."""
        return self.num_accepted_tokens / (self.num_drafts * self.k) if self.num_drafts else math.nan

    def vllm_log_line(self) -> str:
        """The statistics in the shape of vLLM's ``SpecDecoding metrics`` log line (without throughputs)."""
        rates = ", ".join(f"{r:.3f}" for r in self.acceptance_rates)
        return (f"SpecDecoding metrics: Mean acceptance length: {self.mean_acceptance_length:.2f}, "
                f"Accepted: {self.num_accepted_tokens} tokens, Drafted: {self.num_drafts * self.k} tokens, "
                f"Per-position acceptance rate: {rates}, "
                f"Avg Draft acceptance rate: {100 * self.draft_acceptance_rate:.1f}%")


def speculative_decode(model: TinyMLA, prompts: Sequence[Sequence[int]], max_new_tokens: int, k: int, *,
                       backend: str = "torch", pad_to_pow2: bool = False, draft: str = "frozen-context",
                       draft_noise: float = 0.1, draft_seed: int = 7) -> SpecRun:
    """Greedy chain speculative decoding: ``k`` draft tokens per step, verified in ONE decode call per
    layer with ``max_qo_len = k + 1`` (the last emitted token followed by the drafts), as vLLM verifies.

    Each step, per request: draft ``d_1..d_k``; run the target on ``[x_last, d_1..d_k]``; its greedy
    choices ``t_0..t_k``; accept the longest prefix with ``d_i == t_{i-1}`` (``a`` tokens), emit
    ``d_1..d_a`` and the bonus ``t_a``; keep ``a + 1`` new cache rows. With a correct target this emits
    exactly what :func:`greedy_decode` emits.

    Drafts (both cheap next to the target's verification):

    * ``"frozen-context"``: a stand-in for Eagle's reuse of the target's features. One target step on
      ``x_last`` alone (``qlen 1``) gives each layer's attention output for ``x_last``; the draft then
      proposes with the token-local layers only (:meth:`TinyMLA.forward_frozen`), every layer's
      attention frozen at that value, and a head perturbed by ``draft_noise`` (relative, seeded).
      Note what this means under the #2720 fault: there the target's positions 1..k *also* receive
      position 0's (``x_last``'s) attention, so the faulty target computes what this draft computes.
    * ``"ngram"``: prompt lookup (:func:`_ngram_draft`); no model at all.

    Args:
        backend: attention backend of every target step (see :data:`BACKENDS`).
        pad_to_pow2: verify with the queries padded to ``next_pow2(k + 1)`` (:func:`pad_queries_to_pow2`).
    """
    prompts = _check_prompts(prompts, model.config.vocab_size)
    _check_count("max_new_tokens", max_new_tokens, 1)
    _check_count("k", k, 1)
    if k + 1 > mla.MAX_QLEN:
        raise ValueError(f"k is {k}; verification runs k + 1 = {k + 1} query tokens but the decode path takes "
                         f"at most {mla.MAX_QLEN}: use k <= {mla.MAX_QLEN - 1}")
    if draft not in DRAFTS:
        raise ValueError(f"draft is {draft!r}; choose one of {DRAFTS}")
    if backend not in BACKENDS:
        raise ValueError(f"backend is {backend!r}; choose one of {BACKENDS}")
    with _one_cpu_thread(model.device):
        return _speculative(model, prompts, max_new_tokens, k, backend, pad_to_pow2, draft, draft_noise, draft_seed)


def _speculative(model: TinyMLA, prompts: list[list[int]], max_new_tokens: int, k: int, backend: str,
                 pad_to_pow2: bool, draft: str, draft_noise: float, draft_seed: int) -> SpecRun:
    dev = model.device
    g = torch.Generator().manual_seed(draft_seed)
    draft_head = model.head + draft_noise * model.head.std() * torch.randn(model.head.shape, generator=g).to(dev)
    n = len(prompts)
    state = model.new_state(n, max(map(len, prompts)) + max_new_tokens + 2 * k + 2)
    out = [[t] for t in _prefill(model, state, prompts, backend)]
    num_drafts = num_accepted = 0
    per_pos = [0] * k
    while True:
        ids = [r for r in range(n) if len(out[r]) < max_new_tokens]
        if not ids:
            break
        x_last = torch.tensor([out[r][-1] for r in ids], device=dev)
        if draft == "frozen-context":
            # writes x_last's cache rows; the verification below rewrites them with the same values
            ctx = model.forward(state, ids, x_last[:, None], backend=backend)
            frozen = [a[:, 0] for a in ctx.attn]
            tok = (ctx.hidden[:, 0] @ draft_head).argmax(-1)
            cols = [tok]
            p0 = torch.tensor([state.seq_lens[r] for r in ids], device=dev)  # x_last's position
            for j in range(1, k):
                tok = (model.forward_frozen(tok, p0 + j, frozen) @ draft_head).argmax(-1)
                cols.append(tok)
            drafts = torch.stack(cols, dim=1)  # (R, k)
        else:
            drafts = torch.tensor([_ngram_draft(prompts[r] + out[r], k) for r in ids], device=dev)
        verify = model.forward(state, ids, torch.cat([x_last[:, None], drafts], dim=1), backend=backend,
                               pad_to_pow2=pad_to_pow2)
        target = verify.logits.argmax(-1)  # (R, k + 1): t_0 .. t_k
        match = (drafts == target[:, :k]).int().cumprod(dim=1)  # 1 while the prefix still matches
        for i, r in enumerate(ids):
            a = int(match[i].sum())
            num_drafts += 1
            num_accepted += a
            for j in range(a):
                per_pos[j] += 1
            state.seq_lens[r] += a + 1  # x_last and the accepted drafts stay in the cache
            new = drafts[i, :a].tolist() + [int(target[i, a])]
            out[r].extend(new[:max_new_tokens - len(out[r])])
    return SpecRun(k, backend, pad_to_pow2, draft, out, num_drafts, num_accepted, per_pos)


# ----------------------------------------------------------------------------------------------
# 7. Losslessness
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Where a speculative output first differs from plain greedy decoding."""

    request: int
    index: int  # position among the new tokens (0 = the first generated token)
    expected: int  # greedy decoding's token
    got: int  # speculative decoding's token


@dataclasses.dataclass
class LosslessReport:
    """A speculative run next to plain greedy decoding of the same target on the same backend."""

    run: SpecRun
    reference: list[list[int]]
    reference_margin: float  # smallest top-1 / top-2 logit gap of the reference (distance from a tie)

    @property
    def first_divergence(self) -> Divergence | None:
        """The earliest (by token index, then request) token where the outputs differ, or None."""
        found = []
        for r, (ref, got) in enumerate(zip(self.reference, self.run.tokens)):
            for i, (a, b) in enumerate(zip(ref, got)):
                if a != b:
                    found.append(Divergence(r, i, a, b))
                    break
        return min(found, key=lambda d: (d.index, d.request)) if found else None

    @property
    def lossless(self) -> bool:
        return self.run.tokens == self.reference

    def raise_if_lossy(self) -> LosslessReport:
        """Return ``self`` if lossless, else raise :class:`LossyDecoding` naming the first divergent token."""
        div = self.first_divergence
        if div is not None:
            raise LossyDecoding(
                f"speculative decoding with k={self.run.k} on backend {self.run.backend!r} (verification max_seqlen_q "
                f"{self.run.call_qlen}) diverges from greedy decoding at request {div.request}, new token {div.index}: "
                f"greedy {div.expected}, speculative {div.got}. With aiter's non-persistent MLA decode, use k + 1 a "
                "power of two or pad_to_pow2=True (aiter #2720)")
        return self

    def summary(self) -> str:
        run = self.run
        div = self.first_divergence
        verdict = "lossless" if div is None else \
            f"DIVERGES at request {div.request} token {div.index} (greedy {div.expected}, speculative {div.got})"
        return (f"k={run.k:2d} verify qlen {run.verify_qlen:2d} -> call qlen {run.call_qlen:2d} "
                f"({'pow2' if is_pow2(run.call_qlen) else 'not pow2'}) {run.backend}"
                f"{' padded' if run.pad_to_pow2 else ''}: mean acceptance length {run.mean_acceptance_length:.2f}; "
                f"{verdict}")


_REFERENCE_CACHE: dict[tuple, tuple[list[list[int]], float]] = {}


def _reference(model: TinyMLA, prompts: list[list[int]], max_new_tokens: int, backend: str):
    key = (model.config, tuple(map(tuple, prompts)), max_new_tokens, backend)
    if key not in _REFERENCE_CACHE:
        _REFERENCE_CACHE[key] = greedy_decode(model, prompts, max_new_tokens, backend=backend)
    return _REFERENCE_CACHE[key]


def check_lossless(k: int, *, backend: str = "torch", pad_to_pow2: bool = False, draft: str = "frozen-context",
                   model: TinyMLA | None = None, prompts: Sequence[Sequence[int]] | None = None,
                   max_new_tokens: int = 40, **spec_kwargs: Any) -> LosslessReport:
    """Speculative decoding with ``k`` drafts against plain greedy decoding, both on ``backend``.

    The reference runs on the same backend: its decode calls all have ``qlen = 1``, a power of two, so
    even ``"aiter-pow2-fault"`` computes it correctly. Defaults: ``TinyMLA()`` and
    :func:`default_prompts` (4 prompts of 12 tokens), 40 new tokens each.
    """
    model = model or TinyMLA()
    prompts = _check_prompts(prompts if prompts is not None else default_prompts(vocab_size=model.config.vocab_size),
                             model.config.vocab_size)
    ref, margin = _reference(model, prompts, max_new_tokens, backend)
    run = speculative_decode(model, prompts, max_new_tokens, k, backend=backend, pad_to_pow2=pad_to_pow2,
                             draft=draft, **spec_kwargs)
    return LosslessReport(run, ref, margin)


def sweep_k(ks: Iterable[int] = range(1, 16), *, backend: str = "torch", pad_to_pow2: bool = False,
            **kwargs: Any) -> list[LosslessReport]:
    """:func:`check_lossless` for every ``k`` in ``ks`` (one shared model and reference)."""
    model = kwargs.pop("model", None) or TinyMLA()
    return [check_lossless(k, backend=backend, pad_to_pow2=pad_to_pow2, model=model, **kwargs) for k in ks]


def format_sweep(reports: Sequence[LosslessReport]) -> str:
    """A table: k, verification qlen, call qlen, power of two?, mean acceptance length, result."""
    lines = [f"{'k':>3} {'qlen':>4} {'call':>4} {'pow2':>5} {'backend':>17} {'pad':>4} {'mean len':>8}  result"]
    for rep in reports:
        run, div = rep.run, rep.first_divergence
        result = "lossless" if div is None else \
            f"diverges: req {div.request} token {div.index} ({div.expected} -> {div.got})"
        pow2 = "yes" if is_pow2(run.call_qlen) else "no"
        lines.append(f"{run.k:3d} {run.verify_qlen:4d} {run.call_qlen:4d} {pow2:>5} {run.backend:>17} "
                     f"{'yes' if run.pad_to_pow2 else 'no':>4} {run.mean_acceptance_length:8.2f}  {result}")
    return "\n".join(lines)
