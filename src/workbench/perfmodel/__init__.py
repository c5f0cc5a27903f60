"""Hardware figures, rooflines, and the speculative-decoding throughput model.

Napkin math first: the MLA decode of one layer reads each request's latent KV cache once and does two
matrix products per head, so its arithmetic intensity is about ``1.89 * H * qlen`` FLOP per byte for
bf16 KV; compare it with each GPU's ridge point (peak FLOP/s over bandwidth). One job per submodule:

* :mod:`~workbench.perfmodel.roofline`: datasheet figures (:data:`HARDWARE`), the bytes and FLOPs of one
  MLA decode layer, its roofline (:func:`mla_decode_roofline`), the cost of padding ``qlen`` to a power
  of two (:func:`padding_cost_rows`);
* :mod:`~workbench.perfmodel.acceptance`: tokens per verify step, ``1 + r_1 + ... + r_k`` from
  per-position rates or ``(1 - a^(k+1)) / (1 - a)`` from an i.i.d. rate;
* :mod:`~workbench.perfmodel.target`: the target's forward pass, a token law (:class:`PowerLaw`,
  :class:`CoverageLaw`) plus the MLA attention roofline (:class:`TargetStepModel`), calibrated on a
  no-speculation column only (:func:`fit_target_step`);
* :mod:`~workbench.perfmodel.spec`: Eagle3's one-layer draft costed from its weight bytes and a stated
  per-forward overhead (:func:`eagle3_draft`); one speculative step = draft for ``k`` tokens + verify at
  ``qlen = k + 1`` + a fixed overhead (:func:`spec_step`); the best ``k`` with or without the
  power-of-two restriction of aiter #2720 (:func:`best_k`, :func:`power_of_two_cost`);
* :mod:`~workbench.perfmodel.published`: AMD's MI355X table (:data:`BLOG_MI355X_KIMI`) and the
  prediction of its two Eagle3 columns (:func:`predict_published`); the published serial-expansion cost;
* :mod:`~workbench.perfmodel.measured`: readers of the committed benchmark JSON (:func:`load_measurement`),
  the expansion beside the decode it feeds (:func:`expansion_cost_per_step`), and the measured padding
  overhead beside the model (:func:`measured_padding_overhead`), the least time a schedule on tiles of a given
  width can take, from the measured rates of its two products (:func:`tile_schedule_floor_us`).

Times are in milliseconds unless a name says otherwise (``_s``, ``_us``); throughput is output tokens
per second per GPU, as in the published table. Pure Python and numpy: nothing here imports Triton or a
kernel module.
"""

from __future__ import annotations

from workbench.perfmodel.acceptance import (
    AITER_2720_RATES, expected_tokens_iid, expected_tokens_per_step, fit_iid_alpha, iid_rates, is_power_of_two_qlen,
)
from workbench.perfmodel.measured import (
    DATA_DIR, MeasurementFile, expansion_cost_per_step, load_measurement, measured_padding_overhead,
    tile_schedule_floor_us,
)
from workbench.perfmodel.published import (
    BLOG_MI355X_KIMI, SERIAL_EXPAND_MI355X, Prediction, PredictionRow, PublishedTable, predict_published,
    serial_expansion_published,
)
from workbench.perfmodel.roofline import (
    HARDWARE, KV_DTYPE_BYTES, KV_LORA_RANK, QK_HEAD_DIM, QK_ROPE_HEAD_DIM, Hardware, RooflinePoint,
    lookup_hardware, mla_decode_bytes, mla_decode_flops, mla_decode_intensity, mla_decode_roofline, padding_cost_rows,
    roofline_time_s,
)
from workbench.perfmodel.spec import (
    DraftModel, KChoice, PowerOfTwoCost, SpecStep, best_k, draft_fixed_ms_from_target, eagle3_draft,
    power_of_two_cost, spec_step, throughput_per_gpu, verify_cost_trend,
)
from workbench.perfmodel.target import (
    KIMI_K25, KIMI_K25_MI355X_TP4, CoverageLaw, Deployment, ModelArch, PowerLaw, TargetStepModel, TokenLaw,
    fit_target_step, no_spec_step_ms,
)

__all__ = [
    "AITER_2720_RATES", "BLOG_MI355X_KIMI", "CoverageLaw", "DATA_DIR", "Deployment", "DraftModel", "HARDWARE",
    "Hardware", "KChoice", "KIMI_K25", "KIMI_K25_MI355X_TP4", "KV_DTYPE_BYTES", "KV_LORA_RANK", "MeasurementFile",
    "ModelArch", "PowerLaw", "PowerOfTwoCost", "Prediction", "PredictionRow", "PublishedTable", "QK_HEAD_DIM",
    "QK_ROPE_HEAD_DIM", "RooflinePoint", "SERIAL_EXPAND_MI355X", "SpecStep", "TargetStepModel", "TokenLaw",
    "best_k", "draft_fixed_ms_from_target", "eagle3_draft", "expansion_cost_per_step", "expected_tokens_iid",
    "expected_tokens_per_step", "fit_iid_alpha", "fit_target_step", "iid_rates", "is_power_of_two_qlen",
    "load_measurement", "lookup_hardware", "measured_padding_overhead", "mla_decode_bytes", "mla_decode_flops",
    "mla_decode_intensity", "mla_decode_roofline", "no_spec_step_ms", "padding_cost_rows", "power_of_two_cost",
    "predict_published", "roofline_time_s", "serial_expansion_published", "spec_step", "throughput_per_gpu",
    "tile_schedule_floor_us", "verify_cost_trend",
]
