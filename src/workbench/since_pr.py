"""What changed after vLLM PR #39616, as rules beside the PR's own, and what they mean for Eagle3 verification.

Three eras of ``vllm/v1/attention/backends/mla/rocm_aiter_mla.py`` (:data:`ERAS`), each a set of small functions:

* ``"0.20"``: PR `#39616 <https://github.com/vllm-project/vllm/pull/39616>`_ (vLLM v0.20.0). Persistent metadata
  only when every decode request has one query token; buffers sized for qlen 1.
* ``"45227"``: after PR `#45227 <https://github.com/vllm-project/vllm/pull/45227>`_ (merged): the persistent
  buffers are sized for the MTP verify length and the step's real dtypes
  (`#46997 <https://github.com/vllm-project/vllm/pull/46997>`_ passes ``dtype_q``/``dtype_kv`` to
  ``get_mla_metadata_v1``). The verify length came from a list of speculative *method names*: MTP methods got
  ``num_speculative_tokens + 1``, every other drafter (Eagle3 included) qlen 1, so an Eagle3 verify still failed
  the gate and took the non-persistent path.
* ``"0.33"``: vLLM 0.33.0, the release installed in ``.venv-vllm``: the verify length is the builder's
  ``reorder_batch_threshold`` (``1 + num_speculative_tokens`` for *every* drafter; 0.33.0's own comment says the
  method-name list "sizes unlisted drafters for qlen=1, which closes the persistent gate below and makes aiter
  raise a KeyError mid-run"), the gate is decided by the decode route, CUDA-graph dummy rows get synthetic
  lengths, and the output is zero-filled when a multi-token step runs without persistent metadata.

Then aiter's side (``csrc/py_itfs_cu/asm_mla.cu``, read in the ROCm/aiter repository): which pre-compiled kernel a
16-head call reaches (:func:`aiter_kernel`), and the verdict for a verify step of ``k`` draft tokens
(:func:`verify_outcome`): correct, silently wrong (aiter `#2720 <https://github.com/ROCm/aiter/issues/2720>`_, the
power-of-two rule this workbench emulates in :mod:`workbench.qlen`), or refused loudly (no kernel).

``tests/test_upstream_fidelity.py`` runs the installed vLLM's own ``_build_decode``, ``max_decode_query_len``,
``_segmented_mla_page_size`` and ``_expand_page_indices_kernel`` (a fake ``aiter`` records the metadata call) and
compares them with the ``"0.33"`` functions here. Nothing here is vLLM's or aiter's code: the rules are
restated in this module's own words. Pure Python except :func:`pad_queries_front` and
:func:`decode_with_padding` (torch, through :mod:`workbench.qlen`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from workbench import qlen as _qlen
from workbench.decode_metadata import DecodeMetadata
from workbench.perfmodel import KChoice, best_k
from workbench.pow2 import check_count, is_pow2

__all__ = [
    "AITER_MIN_HEADS", "ASM_PADDED_MAX_PS_QLEN", "ERAS", "LINKS", "DecodeDecision", "KernelChoice", "VerifyOutcome",
    "aiter_kernel", "best_k_allowed", "compare_decision", "dcp_subpage_size", "decode_decision", "decode_request",
    "decode_with_padding",
    "expand_num_chunks", "format_outcomes", "is_mtp_method", "mtp_decode_qlen", "pad_queries_front",
    "padded_verify_qlen_main", "persistent_gate", "recommendations", "safe_num_spec_tokens_for",
    "seq_lens_for_kernel", "uniform_padded_mtp_qo_len", "verify_outcome",
]

ERAS = ("0.20", "45227", "0.33")

LINKS = {
    "#37539": "https://github.com/vllm-project/vllm/pull/37539",
    "#39616": "https://github.com/vllm-project/vllm/pull/39616",
    "#45227": "https://github.com/vllm-project/vllm/pull/45227",
    "#46997": "https://github.com/vllm-project/vllm/pull/46997",
    "#51171": "https://github.com/vllm-project/vllm/pull/51171",
    "#51705": "https://github.com/vllm-project/vllm/pull/51705",
    "#57642": "https://github.com/vllm-project/vllm/pull/57642",
    "#57978": "https://github.com/vllm-project/vllm/pull/57978",
    "#58661": "https://github.com/vllm-project/vllm/pull/58661",
    "aiter #2720": "https://github.com/ROCm/aiter/issues/2720",
    "aiter #2760": "https://github.com/ROCm/aiter/issues/2760",
    "aiter #4258": "https://github.com/ROCm/aiter/pull/4258",
    "aiter #5679": "https://github.com/ROCm/aiter/issues/5679",
    "sglang #31221": "https://github.com/sgl-project/sglang/pull/31221",
}

AITER_MIN_HEADS = 16  # aiter's asm MLA decode runs multiples of 16 query heads; fewer are padded up to 16
ASM_PADDED_MAX_PS_QLEN = 4  # the longest query a 16-head bf16 persistent kernel takes without the gfx950 fold
_KV_DTYPES = ("auto", "bf16", "fp16", "fp8")
_ARCHS = ("gfx950", "gfx942")


def _check_era(era: str) -> str:
    if era not in ERAS:
        raise ValueError(f"era is {era!r}; choose one of {ERAS} ('0.20': PR #39616, '45227': after vLLM PR #45227, "
                         "'0.33': vLLM 0.33.0)")
    return era


def _check_choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} is {value!r}; choose one of {tuple(choices)}")
    return value


# ================================================================================================
# 1. Which query length the persistent buffers are sized for
# ================================================================================================


def is_mtp_method(method: str) -> bool:
    """True for vLLM's MTP drafters: ``"mtp"`` and every ``"<model>_mtp"`` name (vLLM 0.33.0's
    ``MTPModelTypes``: ``"deepseek_mtp"``, ``"qwen3_next_mtp"``, ...); False for ``"eagle"``, ``"eagle3"``,
    ``"dflash"``, ``"ngram"`` and the rest."""
    if not isinstance(method, str) or not method:
        raise ValueError(f"method is {method!r}; pass vLLM's speculative method name, e.g. 'eagle3' or 'deepseek_mtp'")
    return method == "mtp" or method.endswith("_mtp")


def mtp_decode_qlen(era: str, method: str | None, num_speculative_tokens: int, *,
                    parallel_drafting: bool = False) -> int:
    """The query length the persistent MLA buffers are sized for (vLLM's ``_mtp_decode_qlen``).

    * ``"0.20"`` (PR `#39616 <https://github.com/vllm-project/vllm/pull/39616>`_): always 1.
    * ``"45227"`` (PR `#45227 <https://github.com/vllm-project/vllm/pull/45227>`_): ``num_speculative_tokens + 1``
      for MTP methods (:func:`is_mtp_method`), 1 for any other drafter. Stated in vLLM 0.33.0's comment on the
      line that replaced it; the exact list of names in between is not public in the sources searched.
    * ``"0.33"``: the builder's ``reorder_batch_threshold``, i.e. vLLM's ``max_decode_query_len``:
      ``1 + num_speculative_tokens`` for every drafter (plus ``num_speculative_tokens`` more with model runner
      V1's ``parallel_drafting``); 1 without speculative decoding (``method=None``).
    """
    _check_era(era)
    if method is None:
        return 1
    k = check_count("num_speculative_tokens", num_speculative_tokens, 1)
    if era == "0.20":
        return 1
    if era == "45227":
        return k + 1 if is_mtp_method(method) else 1
    return 1 + k + (k if parallel_drafting else 0)


# ================================================================================================
# 2. The persistent gate
# ================================================================================================


def persistent_gate(era: str, max_qo_len: int, *, num_heads: int = 16, mtp_qlen: int = 1,
                    kv_cache_dtype: str = "auto", causal: bool = True, gluon: bool = False) -> bool:
    """Does a decode step with longest query ``max_qo_len`` get aiter's persistent-scheduling metadata?

    * ``"0.20"``: ``max_qo_len == 1`` (PR `#39616 <https://github.com/vllm-project/vllm/pull/39616>`_).
    * ``"45227"``: ``num_heads >= 16 and 1 <= max_qo_len <= mtp_qlen``.
    * ``"0.33"``: the route decides (vLLM 0.33.0's ``_build_decode``): a step served by the Gluon kernel
      (fewer than 16 heads on a GPU with a Gluon build, ``gluon=True``) never gets it; otherwise
      ``1 <= max_qo_len <= mtp_qlen`` and at least one of: a non-causal block, ``num_heads >= 16``,
      ``max_qo_len <= 4``, an fp8 KV cache. A rank with fewer than 16 heads is padded to 16 for the asm kernel, and
      past qlen 4 only a non-persistent bf16 kernel exists for it where aiter's gfx950 fold is absent.

    ``num_heads``: query heads per rank (after tensor and decode-context parallelism gather them);
    ``mtp_qlen``: :func:`mtp_decode_qlen`; ``kv_cache_dtype``: ``"auto"``/``"bf16"``/``"fp16"``/``"fp8"``.
    """
    _check_era(era)
    check_count("max_qo_len", max_qo_len, 0)
    check_count("num_heads", num_heads, 1)
    check_count("mtp_qlen", mtp_qlen, 1)
    _check_choice("kv_cache_dtype", kv_cache_dtype, _KV_DTYPES)
    if era == "0.20":
        return max_qo_len == 1
    if era == "45227":
        return num_heads >= AITER_MIN_HEADS and 1 <= max_qo_len <= mtp_qlen
    gluon_route = gluon and num_heads < AITER_MIN_HEADS and kv_cache_dtype != "fp8" and (max_qo_len == 1 or causal)
    if gluon_route:
        return False
    kernel_exists = (not causal or num_heads >= AITER_MIN_HEADS or max_qo_len <= ASM_PADDED_MAX_PS_QLEN
                     or kv_cache_dtype == "fp8")
    return kernel_exists and 1 <= max_qo_len <= mtp_qlen


# ================================================================================================
# 3. CUDA-graph dummy rows (vLLM 0.33.0)
# ================================================================================================


def uniform_padded_mtp_qo_len(qo_lens: Sequence[int], max_qo_len: int, num_decode_tokens: int) -> int:
    """The uniform query length to give CUDA-graph dummy requests, or 0 when the step needs none (0.33.0).

    A full CUDA graph replays at a captured token count: the query buffer has ``num_decode_tokens`` rows while
    the dummy requests at the end of the batch have query length 0. When every live request has the same
    length ``q > 1``, the live ones form a prefix, and ``num_decode_tokens == num_reqs * q`` exceeds the live
    tokens, every request is treated as having ``q`` queries. Otherwise 0 (no padding).
    """
    lens = [check_count("qo_lens entry", int(n), 0) for n in qo_lens]
    n = len(lens)
    if n == 0 or num_decode_tokens <= 0 or num_decode_tokens % n:
        return 0
    q = num_decode_tokens // n
    if q <= 1 or num_decode_tokens <= sum(lens):
        return 0
    live = [x for x in lens if x > 0]
    first_dummy = next((i for i, x in enumerate(lens) if x == 0), n)
    if any(x > 0 for x in lens[first_dummy:]) or len(live) == n:
        return 0
    if live and (max_qo_len != q or any(x != q for x in live)):
        return 0
    return q


def seq_lens_for_kernel(seq_lens: Sequence[int], qo_lens: Sequence[int], padded_qo_len: int) -> list[int]:
    """The KV lengths the kernel sees (0.33.0): a dummy request (query length 0) of a padded step gets
    ``padded_qo_len`` keys, so that its synthetic queries have a causal window; live requests keep theirs."""
    if len(seq_lens) != len(qo_lens):
        raise ValueError(f"seq_lens has {len(seq_lens)} entries and qo_lens {len(qo_lens)}; one each per request")
    if padded_qo_len <= 0:
        return [int(s) for s in seq_lens]
    return [int(s) if int(q) > 0 else padded_qo_len for s, q in zip(seq_lens, qo_lens)]


@dataclasses.dataclass(frozen=True)
class DecodeDecision:
    """What the metadata builder of one era decides for one decode step.

    Attributes:
        persistent: ``has_persistent_metadata``.
        max_qo_len: the query length the kernel is called with (after CUDA-graph padding).
        padded_qo_len: the dummy-row length of :func:`uniform_padded_mtp_qo_len` (0: none).
        seq_lens: the KV lengths the kernel sees (:func:`seq_lens_for_kernel`).
        qo_indptr: ``(num_reqs + 1,)`` as host ints.
        uni_qo_len: ``uni_seqlen_qo`` handed to ``get_mla_metadata_v1`` (``max_qo_len`` when uniform, else -1);
            ``None`` without persistent metadata.
        zero_filled_output: the output buffer is zeroed before a multi-token call without persistent metadata
            (0.33.0; at the PR it was allocated uninitialised, since vLLM PR
            `#37539 <https://github.com/vllm-project/vllm/pull/37539>`_).
    """

    era: str
    persistent: bool
    max_qo_len: int
    padded_qo_len: int
    seq_lens: tuple[int, ...]
    qo_indptr: tuple[int, ...]
    uni_qo_len: int | None
    zero_filled_output: bool


def decode_decision(era: str, qo_lens: Sequence[int], seq_lens: Sequence[int], *, num_heads: int = 16,
                    method: str | None = "eagle3", num_speculative_tokens: int = 1,
                    num_decode_tokens: int | None = None, kv_cache_dtype: str = "auto", causal: bool = True,
                    full_cudagraph: bool = False, gluon: bool = False) -> DecodeDecision:
    """The builder's whole decision for one decode step of one era (:func:`persistent_gate`, the sizing of
    :func:`mtp_decode_qlen`, and in ``"0.33"`` the dummy rows of :func:`uniform_padded_mtp_qo_len`).

    ``qo_lens``/``seq_lens``: per request (dummy requests of a CUDA-graph step have query length 0);
    ``num_decode_tokens``: rows of the query buffer (default ``sum(qo_lens)``); ``full_cudagraph``: the step runs
    in a full CUDA graph. That changes one thing: an unpadded single-token step keeps its own ``query_start_loc``
    as ``qo_indptr`` (dummy requests of length 0 included) instead of ``0, 1, 2, ...``.
    """
    _check_era(era)
    lens = [int(q) for q in qo_lens]
    if not lens:
        raise ValueError("qo_lens is empty; a decode step has at least one request")
    tokens = sum(lens) if num_decode_tokens is None else check_count("num_decode_tokens", num_decode_tokens, 0)
    max_qo = max(lens)
    padded = uniform_padded_mtp_qo_len(lens, max_qo, tokens) if era == "0.33" else 0
    if padded:
        max_qo = padded
    mtp = mtp_decode_qlen(era, method, num_speculative_tokens)
    kernel_heads = -(-num_heads // AITER_MIN_HEADS) * AITER_MIN_HEADS
    if (era == "0.33" and not causal and max_qo == 2 and kv_cache_dtype == "fp8"
            and kernel_heads not in (32, 64, 96, 128)):
        raise ValueError(f"a non-causal 2-token fp8 block with {num_heads} heads (run as {kernel_heads}) has no aiter "
                         "kernel: vLLM 0.33.0 refuses it and asks to pin the draft to TRITON_MLA")
    persistent = persistent_gate(era, max_qo, num_heads=num_heads, mtp_qlen=mtp, kv_cache_dtype=kv_cache_dtype,
                                 causal=causal, gluon=gluon)
    kv = seq_lens_for_kernel(seq_lens, lens, padded)
    if padded or (max_qo == 1 and not full_cudagraph):  # a uniform indptr; else the step's own query_start_loc
        qo_indptr = tuple(range(0, (len(lens) + 1) * max_qo, max_qo))
    else:
        qo = [0]
        for q in lens:
            qo.append(qo[-1] + q)
        qo_indptr = tuple(qo)
    uniform = padded > 0 or all(q == max_qo for q in lens)
    uni = (max_qo if uniform else -1) if persistent else None
    zero = era == "0.33" and max_qo > 1 and not persistent
    return DecodeDecision(era, persistent, max_qo, padded, tuple(kv), qo_indptr, uni, zero)


def decode_request(qo_lens: Sequence[int], seq_lens: Sequence[int], *, num_heads: int = 16, mtp_qlen: int = 1,
                   num_decode_tokens: int | None = None, kv_cache_dtype: str = "auto", causal: bool = True,
                   full_cudagraph: bool = False, K: int = 16, seed: int = 0) -> dict:
    """One ``"decode"`` request for :func:`workbench.upstream.ask_vllm` (vLLM's own ``_build_decode``), with a
    block table of permuted ids (block 0 reserved, one spare block per request) covering every request."""
    import random

    check_count("K", K, 1)
    lens = [int(x) for x in seq_lens]
    if len(lens) != len(qo_lens) or not lens:
        raise ValueError(f"qo_lens ({len(qo_lens)}) and seq_lens ({len(lens)}) need one entry per request, >= 1")
    width = max(1, max(-(-x // K) for x in lens) + 1)
    ids = random.Random(seed).sample(range(1, 4 * width * len(lens) + 8), width * len(lens))
    tokens = sum(int(q) for q in qo_lens) if num_decode_tokens is None else num_decode_tokens
    return dict(op="decode", qo_lens=[int(q) for q in qo_lens], seq_lens=lens, num_decode_tokens=tokens,
                num_heads=num_heads, mtp_qlen=mtp_qlen, kv_cache_dtype=kv_cache_dtype, causal=causal,
                full_cudagraph=full_cudagraph, K=K, block_table=[ids[i * width:(i + 1) * width] for i in range(len(lens))])


def compare_decision(answer: dict, decision: DecodeDecision) -> dict[str, tuple]:
    """Field by field, the installed vLLM's answer to a :func:`decode_request` against the model's
    :class:`DecodeDecision`: ``{field: (vllm, model)}``; equal pairs mean the model reproduces vLLM."""
    call = answer.get("metadata_call") or {}
    return {
        "persistent": (answer["has_persistent_metadata"], decision.persistent),
        "max_qo_len": (answer["max_qo_len"], decision.max_qo_len),
        "seq_lens": (tuple(answer["seq_lens"]), decision.seq_lens),
        "qo_indptr": (tuple(answer["qo_indptr"]), decision.qo_indptr),
        "uni_qo_len": (call.get("uni_seqlen_qo"), decision.uni_qo_len),
        "zero_filled": (answer["output_zero_filled"], decision.zero_filled_output),
    }


def expand_num_chunks(max_blocks_per_req: int, kernel_block_size: int, block: int = 1024) -> int:
    """The second grid dimension of vLLM 0.33.0's ``_expand_page_indices_kernel`` launch: chunks of ``block``
    tokens over the block table's width (a host-side upper bound, no device sync), at least 1. PRs
    `#57978 <https://github.com/vllm-project/vllm/pull/57978>`_ and
    `#58661 <https://github.com/vllm-project/vllm/pull/58661>`_ proposed replacing v0.20's one program per
    request (a serial loop of 1024-token chunks) by this grid; 0.33.0 launches it."""
    check_count("max_blocks_per_req", max_blocks_per_req, 0)
    check_count("kernel_block_size", kernel_block_size, 1)
    check_count("block", block, 1)
    return max(1, -(-max_blocks_per_req * kernel_block_size // block))


def dcp_subpage_size(block_size: int) -> int:
    """The sub-page size of vLLM 0.33.0's segmented decode-context-parallel verify
    (PR `#51705 <https://github.com/vllm-project/vllm/pull/51705>`_): the largest power of two dividing the
    physical KV block, capped at 128 (its ``_segmented_mla_page_size``)."""
    check_count("block_size", block_size, 1)
    return min(128, block_size & -block_size)


# ================================================================================================
# 4. vLLM main's query padding (stated, not found in a public source)
# ================================================================================================


def padded_verify_qlen_main(qlen: int) -> int:
    """The query length a vLLM ``main`` newer than 0.33.0 is described as calling the persistent kernel with:
    qlen 2 and 3 padded to 4 with leading zero query rows, every other length unchanged (5, 6, 7 stay).

    Not verified: the rule is in neither vLLM 0.33.0's code nor any public source searched for this workbench.
    aiter's own dispatch does the same inside kernel selection (a 16-head bf16 persistent call of qlen 2-4
    uses the qseqlen-4 kernel: :func:`aiter_kernel`), which is verified.
    """
    check_count("qlen", qlen, 1)
    return 4 if qlen in (2, 3) else qlen


def pad_queries_front(q: torch.Tensor, metadata: DecodeMetadata, pad_len: int) -> _qlen.PaddedQueries:
    """Pad every request's queries to ``pad_len`` rows with leading zero rows (what vLLM main is described as
    doing before a persistent call). Front padding keeps the causal window of every real row: real row ``i``
    of ``s_q`` becomes row ``pad_len - s_q + i`` and still sees keys ``0 .. s_k - s_q + i``. Needs one query
    length for all requests (aiter's rule) and ``kv_len >= pad_len``.

    Returns :class:`workbench.qlen.PaddedQueries` (``.unpad(out)`` keeps the real rows).
    """
    if q.dim() != 3:
        raise ValueError(f"q has shape {tuple(q.shape)}; expected (total_q, num_heads, head_dim)")
    qo = metadata.qo_indptr.tolist()
    kv = metadata.kv_indptr.tolist()
    lens = [b - a for a, b in zip(qo, qo[1:])]
    if len(set(lens)) != 1 or lens[0] < 1:
        raise ValueError(f"query lengths {lens[:8]}: front padding needs one query length >= 1 for every request "
                         "(aiter's max_seqlen_q); pad or split the batch first")
    s_q, B = lens[0], len(lens)
    check_count("pad_len", pad_len, s_q)
    short = [b for b, (k0, k1) in enumerate(zip(kv, kv[1:])) if k1 - k0 < pad_len]
    if short:
        raise ValueError(f"request {short[0]} has kv_len {kv[short[0] + 1] - kv[short[0]]} < pad_len {pad_len}: "
                         "every padded row must see a key; pad fewer rows")
    p = pad_len - s_q
    real = q.view(B, s_q, *q.shape[1:])
    padded_q = torch.cat([real.new_zeros(B, p, *q.shape[1:]), real], dim=1).reshape(B * pad_len, *q.shape[1:])
    md = DecodeMetadata(
        qo_indptr=torch.arange(0, B * pad_len + 1, pad_len, dtype=metadata.qo_indptr.dtype,
                               device=metadata.qo_indptr.device),
        kv_indptr=metadata.kv_indptr, kv_indices=metadata.kv_indices,
        kv_last_page_lens=metadata.kv_last_page_lens, max_qo_len=pad_len)
    real_rows = torch.tensor([b * pad_len + p + i for b in range(B) for i in range(s_q)], dtype=torch.long)
    return _qlen.PaddedQueries(padded_q.contiguous(), md, real_rows, s_q, pad_len, ["front"] * B)


def decode_with_padding(q: torch.Tensor, kv_cache: torch.Tensor, metadata: DecodeMetadata, pad_len: int, *,
                        backend: str = _qlen.FAULT_BACKEND, sm_scale: float | None = None) -> torch.Tensor:
    """Decode through :func:`pad_queries_front` and ``backend`` (default: the emulated aiter #2720 fault) and
    return the real rows' output ``(total_q, H, 512)``."""
    padded = pad_queries_front(q, metadata, pad_len)
    res = _qlen.decode(padded.q, kv_cache, padded.metadata, sm_scale=sm_scale, backend=backend)
    return padded.unpad(res.out)


# ================================================================================================
# 5. aiter's kernel choice for 16 query heads, and the verdict for a verify step
# ================================================================================================


@dataclasses.dataclass(frozen=True)
class KernelChoice:
    """The pre-compiled aiter MLA decode kernel a call reaches (``asm_mla.cu``'s dispatch, 16 heads).

    ``qseqlen``/``gqa``: the kernel's query length and head ratio (after padding or folding), ``None`` when aiter
    refuses the call; ``reason``: how it got there, or why it is refused."""

    qseqlen: int | None
    gqa: int | None
    reason: str

    @property
    def exists(self) -> bool:
        return self.qseqlen is not None


def aiter_kernel(qlen: int, *, persistent: bool, kv_dtype: str = "bf16", arch: str = "gfx950") -> KernelChoice:
    """Which aiter asm MLA decode kernel a 16-head call of query length ``qlen`` reaches (``asm_mla.cu``).

    bf16: persistent calls of qlen 1-4 use the qseqlen-4 kernel ("padding it"), except that gfx950 folds
    ``16 * qlen`` query rows that fill 64 or 128 lanes onto its (gqa 64, qseqlen 1) or (gqa 32, qseqlen 4)
    kernel; a persistent qlen 5-7 finds no kernel (shipped bf16 persistent entries, per vLLM PR
    `#57642 <https://github.com/vllm-project/vllm/pull/57642>`_: gfx950 (16,4), (32,4), (64,1), (96,4); gfx942
    (8,2), (16,4)). Non-persistent calls: qlen 1 -> qseqlen 1, 2-4 -> 4, above -> 8. fp8 queries: qlen 1, 2, 4
    (3 padded to 4); above 4 refused ("only support fp8 mla decoding for qo_len <= 4", aiter
    `#2760 <https://github.com/ROCm/aiter/issues/2760>`_; aiter PR `#4258 <https://github.com/ROCm/aiter/pull/4258>`_
    later widened gfx950's persistent fp8 path, not modelled).
    """
    check_count("qlen", qlen, 1)
    _check_choice("kv_dtype", kv_dtype, ("bf16", "fp8"))
    _check_choice("arch", arch, _ARCHS)
    if kv_dtype == "fp8":
        if qlen > 4:
            return KernelChoice(None, None, "fp8: aiter refuses qo_len > 4 (aiter #2760)")
        return KernelChoice(4 if qlen == 3 else qlen, 16, "fp8 kernel" + (" (3 padded to 4)" if qlen == 3 else ""))
    if not persistent:
        q = 1 if qlen == 1 else 4 if qlen <= 4 else 8
        return KernelChoice(q, 16, f"non-persistent bf16: qlen {qlen} -> qseqlen-{q} kernel")
    if arch == "gfx950" and (16 * qlen) % 128 == 0:
        return KernelChoice(4, 32, f"persistent bf16, gfx950 fold: {16 * qlen} rows -> (gqa 32, qseqlen 4)")
    if arch == "gfx950" and (16 * qlen) % 64 == 0:
        return KernelChoice(1, 64, f"persistent bf16, gfx950 fold: {16 * qlen} rows -> (gqa 64, qseqlen 1)")
    if qlen <= 4:
        return KernelChoice(4, 16, f"persistent bf16: qlen {qlen} -> qseqlen-4 kernel")
    return KernelChoice(None, None, f"persistent bf16 qlen {qlen}: no (gqa 16, qseqlen {qlen}) kernel on {arch} "
                                    "('cannot get heuristic kernel', a loud failure)")


@dataclasses.dataclass(frozen=True)
class VerifyOutcome:
    """What a verify step of ``k`` draft tokens gets on one era and configuration."""

    k: int
    qlen: int
    persistent: bool
    kernel: KernelChoice
    verdict: str  # "ok" | "wrong (silent)" | "refused (loud)"
    reason: str

    @property
    def safe(self) -> bool:
        return self.verdict == "ok"


def verify_outcome(era: str, k: int, *, num_heads: int = 16, kv_dtype: str = "bf16", arch: str = "gfx950",
                   method: str = "eagle3", gluon: bool = False) -> VerifyOutcome:
    """The outcome of one verify step with ``k`` draft tokens (``qlen = k + 1``), uniform over the batch.

    The vLLM side (:func:`mtp_decode_qlen`, :func:`persistent_gate`) picks the path; aiter's side
    (:func:`aiter_kernel`) the kernel. Verdicts: ``"refused (loud)"`` when aiter has no kernel;
    ``"wrong (silent)"`` on the non-persistent bf16 path when ``qlen`` is not a power of two (aiter
    `#2720 <https://github.com/ROCm/aiter/issues/2720>`_, the rule :func:`workbench.qlen.mla_decode_pow2_fault`
    emulates) and, on gfx942, for its qseqlen-8 kernel too (aiter `#5679 <https://github.com/ROCm/aiter/issues/5679>`_,
    open: non-persistent bf16 nhead 16 qseqlen 8 wrong on MI325X); ``"ok"`` otherwise. ``num_heads`` below 16
    are padded to 16 (vLLM's ``get_mla_padded_q``); ``gluon=True`` routes such a rank to the Gluon kernel,
    which this model does not judge.
    """
    check_count("k", k, 1)
    _check_choice("arch", arch, _ARCHS)
    qlen = k + 1
    if gluon and num_heads < AITER_MIN_HEADS and kv_dtype == "bf16":
        raise ValueError("gluon=True with fewer than 16 heads takes the Gluon MTP kernel, which this model does not "
                         "judge; pass gluon=False (gfx942, or VLLM_ROCM_AITER_MLA_ASM_PADDING=asm)")
    kv_cache = "fp8" if kv_dtype == "fp8" else "auto"
    persistent = persistent_gate(era, qlen, num_heads=num_heads, mtp_qlen=mtp_decode_qlen(era, method, k),
                                 kv_cache_dtype=kv_cache, gluon=gluon)
    kernel = aiter_kernel(qlen, persistent=persistent, kv_dtype=kv_dtype, arch=arch)
    path = "persistent" if persistent else "non-persistent"
    if not kernel.exists:
        return VerifyOutcome(k, qlen, persistent, kernel, "refused (loud)", f"{path}: {kernel.reason}")
    if not persistent and kv_dtype == "bf16" and not is_pow2(qlen):
        return VerifyOutcome(k, qlen, persistent, kernel, "wrong (silent)",
                             f"{path}: qlen {qlen} is not a power of two (aiter #2720)")
    if not persistent and kv_dtype == "bf16" and arch == "gfx942" and kernel.qseqlen == 8:
        return VerifyOutcome(k, qlen, persistent, kernel, "wrong (silent)",
                             f"{path}: gfx942 qseqlen-8 kernel gives wrong output (aiter #5679)")
    return VerifyOutcome(k, qlen, persistent, kernel, "ok", f"{path}: {kernel.reason}")


def safe_num_spec_tokens_for(era: str, max_k: int = 7, **config) -> list[int]:
    """The ``k`` in ``1..max_k`` whose verify steps are correct (:func:`verify_outcome` with ``config``)."""
    check_count("max_k", max_k, 1)
    return [k for k in range(1, max_k + 1) if verify_outcome(era, k, **config).safe]


def format_outcomes(columns: Sequence[tuple[str, str, dict]], max_k: int = 7, markdown: bool = False) -> str:
    """A table of verdicts: one row per ``k``, one column per ``(title, era, config)``."""
    head = ["k", "qlen"] + [t for t, _, _ in columns]
    short = {"ok": "ok", "wrong (silent)": "WRONG", "refused (loud)": "refused"}
    body = []
    for k in range(1, max_k + 1):
        cells = [str(k), str(k + 1)]
        for _, era, cfg in columns:
            o = verify_outcome(era, k, **cfg)
            path = "P" if o.persistent else "NP"
            cells.append(f"{short[o.verdict]} ({path}, q{o.kernel.qseqlen})" if o.kernel.exists
                         else f"{short[o.verdict]} ({path})")
        body.append(cells)
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(b) + " |" for b in body])
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head] + body)


# ================================================================================================
# 6. The throughput model under a set of allowed k
# ================================================================================================


def best_k_allowed(target, draft, concurrency: int, context: float, allowed: Sequence[int], **kw) -> KChoice:
    """:func:`workbench.perfmodel.best_k` restricted to ``allowed`` draft lengths (the safe set of an era).

    Takes ``best_k``'s keyword arguments (``rates=``/``alpha=``, ``overhead_ms=``); ``k_max`` defaults to
    ``max(allowed)``. The scan of the returned choice holds only the allowed ``k``.
    """
    ks = sorted({check_count("allowed entry", int(k), 1) for k in allowed})
    if not ks:
        raise ValueError("allowed is empty: no draft length is safe, so speculative decoding is off (k = 0)")
    free = best_k(target, draft, concurrency, context, k_max=kw.pop("k_max", max(ks)), **kw)
    scan = tuple(s for s in free.scan if s.k in ks)
    missing = sorted(set(ks) - {s.k for s in scan})
    if missing:
        raise ValueError(f"allowed holds {missing}, beyond k_max={len(free.scan)}; raise k_max")
    best = max(scan, key=lambda s: s.tok_s_per_gpu)
    base = free.step.tok_s_per_gpu / free.speedup
    return KChoice(best.k, best, best.tok_s_per_gpu / base, scan, False)


def recommendations(target, draft, concurrency: Sequence[int], context: float, rules: dict[str, Sequence[int]],
                    **kw) -> list[dict]:
    """For each concurrency and each rule (name -> allowed ``k``), the best ``k``, its speed-up over plain
    decoding, and its throughput relative to the unrestricted best over ``1..max(all allowed)``."""
    k_max = max(max(v) for v in rules.values())
    out = []
    for c in concurrency:
        free = best_k(target, draft, c, context, k_max=k_max, **kw)
        for name, allowed in rules.items():
            ch = best_k_allowed(target, draft, c, context, allowed, k_max=k_max, **kw)
            out.append(dict(concurrency=c, rule=name, allowed=tuple(sorted(allowed)), best_k=ch.k,
                            speedup=ch.speedup, vs_free=ch.step.tok_s_per_gpu / free.step.tok_s_per_gpu,
                            free_k=free.k))
    return out
