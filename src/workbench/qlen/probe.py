"""The probe: one decode per query length against the fp32 golden, classified ``ok``, ``broadcast-fault`` or ``wrong``.

On ROCm with aiter installed, ``probe_qlen("aiter")`` probes the real kernel; anywhere, the Triton kernel,
the torch paths and the emulated fault. ``workbench probe-qlen`` runs it from the shell.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from workbench import device, jsonio, mla
from workbench.pow2 import check_count as _check_count, is_pow2
from workbench.qlen._shared import one_cpu_thread, paged_batch
from workbench.qlen.fault import BACKENDS, FAULT_BACKEND, BackendUnavailable, decode

__all__ = ["VERDICTS", "ProbeReport", "ProbeRow", "classify_output", "parse_qlens", "probe_qlen"]

VERDICTS = ("ok", "broadcast-fault", "wrong")


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
        """The report as plain Python values (a ``max_err`` may be NaN: the output held NaN)."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """Strict JSON (no ``NaN``/``Infinity``, which JSON does not have): a non-finite number is written ``null``."""
        return jsonio.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        head = (f"probe-qlen: backend {self.backend_ran} ({self.reason}); {self.heads} heads, kv_lens {self.kv_lens}, "
                f"{self.dtype}, {self.device}")
        lines = [head, f"{'qlen':>4} {'pow2':>5} {'max err':>9} {'vs bcast':>9} {'tol':>8} {'verdict':>16} {'ms':>8}"]
        for r in self.rows:
            lines.append(f"{r.qlen:4d} {'yes' if r.pow2 else 'no':>5} {r.max_err:9.2e} {r.max_err_broadcast:9.2e} "
                         f"{r.tol:8.1e} {r.verdict:>16} {r.time_ms:8.1f}")
        lines.append("all ok" if self.all_ok else f"NOT ok at qlen {self.faulty_qlens}")
        return "\n".join(lines)


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
    with one_cpu_thread(dev):
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
        q, cache, md = paged_batch(qlen, heads, kv_lens, dtype, dev, seed * 1009 + qlen)
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
        tol = mla.tolerance(gold, same, dtype)
        verdict, err, err_b = classify_output(res.out, gold, tol, num_reqs)
        rows.append(ProbeRow(qlen, is_pow2(qlen), err, err_b, tol, verdict, ms))
    return rows, ran, reason



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
