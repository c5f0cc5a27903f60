"""Hardware figures, rooflines, and (later) the speculative-decoding throughput model.

Napkin math first: the MLA decode of one layer reads each request's latent KV cache once
(``L`` tokens x 576 values, shared by every head) and does two matrix products per head
(scores over 576 dims, values over 512 dims). Its arithmetic intensity is therefore about
``2 * H * qlen * (576 + 512) / (576 * kv_bytes)`` FLOP per byte: ~1.89 * H * qlen for bf16 KV
(shared/CONTEXT.md section 4). Compare it with each GPU's ridge point (peak FLOP/s over bandwidth).
"""

from __future__ import annotations

import dataclasses

__all__ = [
    "HARDWARE",
    "Hardware",
    "KV_LORA_RANK",
    "QK_ROPE_HEAD_DIM",
    "QK_HEAD_DIM",
    "mla_decode_bytes",
    "mla_decode_flops",
    "mla_decode_intensity",
    "roofline_time_s",
]

KV_LORA_RANK = 512  # latent (compressed KV) width: V is these first 512 dims of a cache row
QK_ROPE_HEAD_DIM = 64  # decoupled rotary part appended to the latent
QK_HEAD_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576: one cache row, and K's width


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
    "H200": Hardware("H200", "NVIDIA", 141, 4.8, 990, "NVIDIA H200 datasheet (SXM); shared/CONTEXT.md section 4"),
    "MI300X": Hardware("MI300X", "AMD", 192, 5.3, 1307, "AMD Instinct MI300X datasheet; shared/CONTEXT.md section 4"),
    "MI355X": Hardware("MI355X", "AMD", 288, 8.0, 2500, "AMD Instinct MI355X datasheet; shared/CONTEXT.md section 4"),
}


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")


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
