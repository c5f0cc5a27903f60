"""The power-of-two query-length limitation (aiter #2720): probe, fault emulation, speculative decoding, padding.

aiter issue #2720 (open, filed 2026-04-13 on MI355X with amd-aiter 0.1.10.post2): the non-persistent
MLA decode (``mla_decode_fwd`` called without persistent metadata, the path vLLM takes whenever a
step's query length is above 1) gives every query position of a request *the same* output when
``max_seqlen_q`` is not a power of two. The report's words: all positions "receive identical
results, as if position 0's computation is broadcast to all positions". It was seen under CUDA
graphs; ``--enforce-eager`` builds the batch differently and hides it. Speculative verification runs
with ``max_seqlen_q = k + 1`` for ``k`` draft tokens, so ``k = 5`` (qlen 6) verified drafts against a
corrupted target and logged ~99 % acceptance at every position, while ``k = 7`` (qlen 8) was fine.

This package makes that concrete on any machine:

1. power-of-two arithmetic (:func:`is_pow2`, :func:`next_pow2`, :func:`safe_num_spec_tokens`, from
   :mod:`workbench.pow2`);
2. a labelled *emulation* of the reported symptom, backend ``"aiter-pow2-fault"``
   (:func:`mla_decode_pow2_fault`), and :func:`decode`, the one decode entry point of this package
   (:mod:`~workbench.qlen.fault`);
3. the mitigation :func:`pad_queries_to_pow2` and the per-``k`` :func:`guidance`
   (:mod:`~workbench.qlen.padding`);
4. :func:`probe_qlen`: every query length against the fp32 golden, classified ``ok``,
   ``broadcast-fault`` or ``wrong`` (:mod:`~workbench.qlen.probe`; on ROCm with aiter it probes the
   real kernel);
5. speculative decoding made concrete: :class:`TinyMLA` (:mod:`~workbench.qlen.model`), a seeded
   two-layer language model whose attention is absorbed MLA decode through a selectable backend; a
   cheap draft, greedy chain verification with one ``qlen = k + 1`` decode call per step, vLLM's
   per-position acceptance rates, and the losslessness check against plain greedy decoding
   (:func:`check_lossless`, :func:`sweep_k`; :mod:`~workbench.qlen.speculative`).
"""

from workbench.pow2 import is_pow2, next_pow2, safe_num_spec_tokens
from workbench.qlen.fault import BACKENDS, FAULT_BACKEND, BackendUnavailable, decode, mla_decode_pow2_fault
from workbench.qlen.model import ForwardOutput, KVState, TinyMLA, TinyMLAConfig
from workbench.qlen.padding import (
    FP8_MAX_QLEN,
    GuidanceRow,
    PaddedQueries,
    format_guidance,
    guidance,
    pad_queries_to_pow2,
)
from workbench.qlen.probe import VERDICTS, ProbeReport, ProbeRow, classify_output, parse_qlens, probe_qlen
from workbench.qlen.speculative import (
    DRAFTS,
    Divergence,
    LosslessReport,
    LossyDecoding,
    SpecRun,
    check_lossless,
    default_prompts,
    format_sweep,
    greedy_decode,
    speculative_decode,
    sweep_k,
)

__all__ = [
    "BACKENDS",
    "DRAFTS",
    "FAULT_BACKEND",
    "VERDICTS",
    "BackendUnavailable",
    "Divergence",
    "FP8_MAX_QLEN",
    "ForwardOutput",
    "GuidanceRow",
    "KVState",
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
