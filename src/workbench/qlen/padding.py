"""The mitigation of aiter #2720: pad every request's queries to the next power of two, and per-``k`` guidance.

:func:`pad_queries_to_pow2` pads without moving the causal window of any real row; decode the padded call
and keep the real rows. :func:`guidance` says, for each ``num_speculative_tokens = k``, whether
verification is safe as is, what padding costs in rows, and which smaller ``k`` is safe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from workbench import mla
from workbench.decode_metadata import DecodeMetadata
from workbench.pow2 import check_count as _check_count, is_pow2, next_pow2, safe_num_spec_tokens

__all__ = ["FP8_MAX_QLEN", "GuidanceRow", "PaddedQueries", "format_guidance", "guidance", "pad_queries_to_pow2"]

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
        q: ``(kept * pad_len, H, D)`` padded queries (pad rows copy a real row: finite values), ``kept`` the
            requests with at least one query.
        metadata: :class:`DecodeMetadata` of those ``kept`` requests, each at ``pad_len`` queries.
        real_rows: ``(total_q,) int64``: row of the padded call that holds each original row, in order.
        query_len: the original ``max_qo_len`` (0 for a batch without queries); ``pad_len``:
            ``next_pow2(max(query_len, 1))``.
        placements: per request, ``"front"`` or ``"back"`` (the placement used for it), ``"none"`` for a request
            without queries (left out of the padded call).
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
        """The real rows of a padded result ``(q.shape[0], ...)`` (the padded call's rows) -> ``(total_q, ...)``."""
        if t.shape[0] != self.q.shape[0]:
            raise ValueError(f"t has {t.shape[0]} rows but the padded call has {self.q.shape[0]}; pass its output")
        return t.index_select(0, self.real_rows.to(t.device))


def pad_queries_to_pow2(q: torch.Tensor, metadata: DecodeMetadata, *, placement: str = "auto") -> PaddedQueries:
    """Pad every request's queries to ``P = next_pow2(max_qo_len)`` rows, keeping the real rows' causal windows.

    Args:
        q: ``(total_q, H, D)`` queries of the step.
        metadata: :class:`DecodeMetadata`; a request with queries needs ``kv_len >= qo_len`` (as every decode
            backend does). A request without queries is left out of the padded call (it has no output rows), and
            an empty batch (or one with no queries at all) gives an empty padded call with ``pad_len`` 1.
        placement: ``"front"`` (pad rows before the real ones; no extra keys; needs ``kv_len >= P``),
            ``"back"`` (pad rows after them, plus ``P - qo_len`` extra key indices that no real row
            sees; any ``kv_len``), or ``"auto"`` (per request: front where ``kv_len >= P``, else back).

    Returns:
        :class:`PaddedQueries`. Decode ``.q`` with ``.metadata`` and keep ``.unpad(out)``. ``placements`` holds
        ``"none"`` for a request without queries.
    """
    if placement not in ("auto", "front", "back"):
        raise ValueError(f"placement is {placement!r}; choose 'front' (no extra keys), 'back' (any kv_len) or 'auto'")
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor (total_q, num_heads, head_dim), got {type(q).__name__}")
    if not isinstance(metadata, DecodeMetadata):
        raise TypeError(f"metadata must be a DecodeMetadata (workbench.expand.build_flat_decode_metadata builds "
                        f"one), got {type(metadata).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q has shape {tuple(q.shape)}; expected (total_q, num_heads, head_dim)")
    qo = mla.check_indptr("metadata.qo_indptr", metadata.qo_indptr)
    kv = mla.check_indptr("metadata.kv_indptr", metadata.kv_indptr)
    if qo[-1] != q.shape[0]:
        raise ValueError(f"metadata.qo_indptr[-1] is {qo[-1]} but q has {q.shape[0]} rows; they must agree")
    if len(qo) != len(kv):
        raise ValueError(f"metadata.qo_indptr has {len(qo)} entries and metadata.kv_indptr {len(kv)}; both must be "
                         "num_reqs + 1")
    if kv[-1] > metadata.kv_indices.numel():
        raise ValueError(f"metadata.kv_indptr[-1] is {kv[-1]} but metadata.kv_indices has only "
                         f"{metadata.kv_indices.numel()} entries; it must hold at least kv_indptr[-1] token rows")
    q_lens = [b - a for a, b in zip(qo, qo[1:])]
    k_lens = [b - a for a, b in zip(kv, kv[1:])]
    for b, (s_q, s_k) in enumerate(zip(q_lens, k_lens)):
        if s_q > s_k:
            raise ValueError(f"request {b} has qo_len {s_q} but kv_len {s_k}; a request with query tokens needs "
                             "kv_len >= qo_len (its query tokens are the last qo_len tokens of its cache): drop the "
                             "request or write its KV first")
    query_len = max(q_lens, default=0)
    P = next_pow2(max(query_len, 1))
    if placement == "front":
        short = [b for b, (n, s_q) in enumerate(zip(k_lens, q_lens)) if s_q and n < P]
        if short:
            b = short[0]
            raise ValueError(f"request {b} has kv_len {k_lens[b]} < {P} = next_pow2(max_qo_len {query_len}); "
                             "front padding needs kv_len >= the padded length (every pad row must see a key). "
                             "Use placement='back'")
    dev = q.device
    src_rows, real_rows, placements, kept = [], [], [], []
    kv_idx_parts, kv_cum = [], [0]
    for b, (s_q, s_k) in enumerate(zip(q_lens, k_lens)):
        if s_q == 0:  # no output rows: not part of the padded call
            placements.append("none")
            continue
        p = P - s_q
        at = len(kept) * P  # first row of this request in the padded call
        kept.append(b)
        real = list(range(qo[b], qo[b + 1]))
        where = placement if placement != "auto" else ("front" if s_k >= P else "back")
        placements.append(where)
        own = metadata.kv_indices[kv[b]:kv[b + 1]]
        if where == "front":
            src_rows += [qo[b]] * p + real
            real_rows += [at + p + i for i in range(s_q)]
            kv_idx_parts.append(own)
            kv_cum.append(kv_cum[-1] + s_k)
        else:  # s_k >= s_q >= 1: own[-1] exists
            src_rows += real + [qo[b + 1] - 1] * p
            real_rows += [at + i for i in range(s_q)]
            kv_idx_parts.append(torch.cat([own, own[-1:].expand(p)]) if p else own)
            kv_cum.append(kv_cum[-1] + s_k + p)
    idx_dtype = metadata.qo_indptr.dtype
    padded_md = DecodeMetadata(
        qo_indptr=torch.arange(0, len(kept) * P + 1, P, dtype=idx_dtype, device=metadata.qo_indptr.device),
        kv_indptr=torch.tensor(kv_cum, dtype=metadata.kv_indptr.dtype, device=metadata.kv_indptr.device),
        kv_indices=torch.cat(kv_idx_parts) if kv_idx_parts else metadata.kv_indices[:0],
        kv_last_page_lens=(metadata.kv_last_page_lens if len(kept) == len(q_lens) else  # page_size 1: all ones
                           torch.ones(len(kept), dtype=metadata.kv_last_page_lens.dtype,
                                      device=metadata.kv_last_page_lens.device)),
        max_qo_len=P,
    )
    padded_q = q.index_select(0, torch.tensor(src_rows, dtype=torch.long, device=dev)).contiguous()
    return PaddedQueries(padded_q, padded_md, torch.tensor(real_rows, dtype=torch.long), query_len, P, placements)


@dataclasses.dataclass(frozen=True)
class GuidanceRow:
    """What a ROCm user should do with ``num_speculative_tokens = k`` on ``ROCM_AITER_MLA`` (aiter #2720 open)."""

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
            "bf16 (#2720)"]
    body = [[str(r.k), str(r.qlen), "yes" if r.pow2 else "no", str(r.padded_qlen), f"{r.extra_rows_pct:.0f} %",
             "ok" if r.fp8_ok else "no kernel (#2760)", r.advice] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(b) + " |" for b in body]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head)] + [fmt(b) for b in body])
