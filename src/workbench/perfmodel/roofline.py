"""Hardware figures, the bytes and FLOPs of one MLA decode layer, its roofline, and the cost of padding.

Napkin math first: the MLA decode of one layer reads each request's latent KV cache once
(``L`` tokens x 576 values, shared by every head) and does two matrix products per head
(scores over 576 dims, values over 512 dims). Its arithmetic intensity is therefore about
``2 * H * qlen * (576 + 512) / (576 * kv_bytes)`` FLOP per byte: ~1.89 * H * qlen for bf16 KV.
Compare it with each GPU's ridge point (peak FLOP/s over bandwidth).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from workbench.pow2 import next_pow2

KV_LORA_RANK = 512  # latent (compressed KV) width: V is these first 512 dims of a cache row
QK_ROPE_HEAD_DIM = 64  # decoupled rotary part appended to the latent
QK_HEAD_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576: one cache row, and K's width

KV_DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}  # bytes per cached value


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Datasheet figures of one accelerator (leads, not measurements)."""

    name: str
    vendor: str
    memory_gb: float  # device memory, GB
    bandwidth_tb_s: float  # peak HBM bandwidth, TB/s
    bf16_tflops: float  # dense bf16 matrix rate, TFLOP/s
    source: str

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound on this device."""
        return self.bf16_tflops * 1e12 / (self.bandwidth_tb_s * 1e12)


HARDWARE: dict[str, Hardware] = {
    "H200": Hardware("H200", "NVIDIA", 141, 4.8, 990,
                     "NVIDIA H200 Tensor Core GPU datasheet (SXM: 141 GB HBM3e, 4.8 TB/s, ~990 TFLOP/s dense "
                     "BF16, i.e. half the 1979 'with sparsity' figure)"),
    "MI300X": Hardware("MI300X", "AMD", 192, 5.3, 1307,
                       "AMD Instinct MI300X datasheet (192 GB HBM3, 5.3 TB/s, 1307.4 TFLOP/s dense BF16)"),
    "MI355X": Hardware("MI355X", "AMD", 288, 8.0, 2500,
                       "AMD Instinct MI355X datasheet (288 GB HBM3E, 8 TB/s, ~2.5 PFLOP/s dense BF16)"),
}


def lookup_hardware(hw: Hardware | str, name: str = "hardware") -> Hardware:
    """``hw`` itself, or the :data:`HARDWARE` entry of that name (case-insensitive); else an error naming ``name``,
    the value and the names there are."""
    if isinstance(hw, Hardware):
        return hw
    found = {k.lower(): v for k, v in HARDWARE.items()}.get(hw.strip().lower()) if isinstance(hw, str) else None
    if found is None:
        raise ValueError(f"{name} is {hw!r}; choose one of {sorted(HARDWARE)} or pass a Hardware")
    return found


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")


def _check_nonnegative(**values: float) -> None:
    for name, value in values.items():
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")


def mla_decode_bytes(heads: int, batch: int, context: int, qlen: int = 1, kv_bytes: float = 2.0,
                     act_bytes: float = 2.0) -> float:
    """Fewest bytes one MLA decode layer must move: KV read once, q read once, output written once.

    Per request: ``context * 576 * kv_bytes`` (cache) + ``qlen * heads * 576 * act_bytes`` (q)
    + ``qlen * heads * 512 * act_bytes`` (output).
    """
    _check_positive(heads=heads, batch=batch, context=context, qlen=qlen, kv_bytes=kv_bytes, act_bytes=act_bytes)
    per_request = context * QK_HEAD_DIM * kv_bytes + qlen * heads * (QK_HEAD_DIM + KV_LORA_RANK) * act_bytes
    return batch * per_request


def mla_decode_flops(heads: int, batch: int, context: int, qlen: int = 1) -> float:
    """FLOPs of one MLA decode layer: ``2 * H * qlen * L * (576 + 512)`` per request (QK^T and PV).

    The causal mask of a multi-token query removes under ``qlen / L`` of it; ignored here.
    """
    _check_positive(heads=heads, batch=batch, context=context, qlen=qlen)
    return batch * 2.0 * heads * qlen * context * (QK_HEAD_DIM + KV_LORA_RANK)


def mla_decode_intensity(heads: int, qlen: int = 1, context: int = 8192, kv_bytes: float = 2.0) -> float:
    """FLOP per byte of MLA decode (about 1.89 * heads * qlen for bf16 KV at long context)."""
    return mla_decode_flops(heads, 1, context, qlen) / mla_decode_bytes(heads, 1, context, qlen, kv_bytes)


def roofline_time_s(hw: Hardware, flops: float, nbytes: float) -> float:
    """Lower bound on a kernel's time: the larger of compute time and memory time."""
    return max(flops / (hw.bf16_tflops * 1e12), nbytes / (hw.bandwidth_tb_s * 1e12))


# ------------------------------------------------------------------------------------------------
# MLA decode roofline per layer, with the KV dtype by name
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RooflinePoint:
    """One MLA decode layer on one device: bytes, FLOPs, and the roofline's time bound."""

    hardware: str
    heads: int
    batch: int
    context: int
    qlen: int
    kv_dtype: str
    bytes: float
    flops: float
    time_s: float  # max(compute, memory) at the datasheet peaks divided by ``efficiency``
    efficiency: float
    ridge_flop_per_byte: float | None = None  # the device's ridge point (None: look ``hardware`` up in HARDWARE)

    @property
    def intensity(self) -> float:
        """FLOP per byte."""
        return self.flops / self.bytes

    @property
    def bound(self) -> str:
        """``"memory"`` or ``"compute"``: which roof limits this point."""
        ridge = self.ridge_flop_per_byte
        if ridge is None:
            ridge = lookup_hardware(self.hardware, "RooflinePoint.hardware").ridge_flop_per_byte
        return "compute" if self.intensity > ridge else "memory"


def _kv_bytes(kv_dtype: str | float) -> float:
    if isinstance(kv_dtype, str):
        try:
            return KV_DTYPE_BYTES[kv_dtype.lower()]
        except KeyError:
            raise ValueError(f"kv_dtype={kv_dtype!r} is not one of {sorted(KV_DTYPE_BYTES)}; "
                             "pass one of those names or a number of bytes per value") from None
    _check_positive(kv_dtype=kv_dtype)
    return float(kv_dtype)


def mla_decode_roofline(hw: Hardware | str, heads: int, batch: int, context: int, qlen: int = 1,
                        kv_dtype: str | float = "bf16", efficiency: float = 1.0) -> RooflinePoint:
    """Bytes, FLOPs and roofline time of one MLA decode layer.

    ``hw`` is a :class:`Hardware` or a name of :data:`HARDWARE` (``"H200"``, ``"MI300X"``, ``"MI355X"``; any case);
    another name raises ValueError listing them.

    ``heads`` are the heads on this GPU (a model's heads divided by tensor parallelism). ``efficiency``
    is the fraction of the datasheet bandwidth and FLOP rate the kernel is assumed to reach (1.0 = the
    bound itself); it divides the time.
    """
    hw = lookup_hardware(hw, "hw")
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency!r}")
    kvb = _kv_bytes(kv_dtype)
    nbytes = mla_decode_bytes(heads, batch, context, qlen, kvb)
    flops = mla_decode_flops(heads, batch, context, qlen)
    name = kv_dtype if isinstance(kv_dtype, str) else f"{kvb:g} B"
    return RooflinePoint(hw.name, heads, batch, context, qlen, name, nbytes, flops,
                         roofline_time_s(hw, flops, nbytes) / efficiency, efficiency, hw.ridge_flop_per_byte)


# ------------------------------------------------------------------------------------------------
# Padding verification to a power of two (the mitigation of aiter #2720, chapter 5)
# ------------------------------------------------------------------------------------------------


def padding_cost_rows(ks: Sequence[int] = range(1, 16), *, heads: int = 16, batch: int = 64, context: int = 4096,
                      hardware: str | Hardware = "H200") -> list[dict[str, Any]]:
    """The cost model of padding verification from ``qlen = k + 1`` to ``P = next_pow2(k + 1)``, per layer.

    For each ``k``: extra query rows ``batch * (P - qlen)``; bytes and FLOPs from
    :func:`mla_decode_bytes` / :func:`mla_decode_flops` at ``qlen``
    and at ``P``; roofline times (:func:`roofline_time_s`) on ``hardware``'s datasheet
    figures (or a :class:`Hardware` with measured ceilings). While both calls are
    memory-bound the time grows only with the extra q and output bytes.
    """
    hw = lookup_hardware(hardware, "hardware")
    rows = []
    for k in ks:
        q = k + 1
        P = next_pow2(q)
        b0, b1 = (mla_decode_bytes(heads, batch, context, n) for n in (q, P))
        f0, f1 = (mla_decode_flops(heads, batch, context, n) for n in (q, P))
        mem0, mem1 = (b / (hw.bandwidth_tb_s * 1e12) for b in (b0, b1))
        cmp0, cmp1 = (f / (hw.bf16_tflops * 1e12) for f in (f0, f1))
        t0, t1 = roofline_time_s(hw, f0, b0), roofline_time_s(hw, f1, b1)
        rows.append(dict(k=k, qlen=q, padded_qlen=P, extra_rows=batch * (P - q), heads=heads, batch=batch,
                         context=context, hardware=hw.name, bytes_pct=100 * (b1 / b0 - 1),
                         flops_pct=100 * (f1 / f0 - 1),
                         time_us=t0 * 1e6, padded_time_us=t1 * 1e6, time_pct=100 * (t1 / t0 - 1),
                         bound="memory" if mem0 >= cmp0 else "compute",
                         padded_bound="memory" if mem1 >= cmp1 else "compute"))
    return rows
