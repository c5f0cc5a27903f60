"""AMD's published MI355X Eagle3 table, the model's prediction of it, and the published serial-expansion cost.

The target is fitted on the table's no-speculation column only (:func:`fit_target_step`); the two Eagle3
columns are then predicted (:func:`predict_published`), with nothing fitted to an Eagle3 number.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from workbench.perfmodel.acceptance import AITER_2720_RATES, expected_tokens_per_step
from workbench.perfmodel.spec import DraftModel, SpecStep, draft_fixed_ms_from_target, eagle3_draft, spec_step
from workbench.perfmodel.target import KIMI_K25_MI355X_TP4, Deployment, TargetStepModel, fit_target_step

# ================================================================================================
# The published table, and prediction of its Eagle3 columns
# ================================================================================================


@dataclasses.dataclass(frozen=True)
class PublishedTable:
    """A throughput table: tok/s/GPU without speculation and with one or more Eagle3 drafts."""

    source: str
    hardware: str
    model: str
    tp: int
    input_len: int
    output_len: int
    concurrency: tuple[int, ...]
    no_spec: tuple[float, ...]
    eagle3: Mapping[str, tuple[float, ...]]  # column name -> tok/s/GPU, aligned with concurrency

    def __post_init__(self):
        n = len(self.concurrency)
        for name, col in [("no_spec", self.no_spec), *self.eagle3.items()]:
            if len(col) != n:
                raise ValueError(f"column {name!r} has {len(col)} values for {n} concurrencies")

    @property
    def mean_context(self) -> float:
        """Mean cached tokens per request over the decode: ``input_len + output_len / 2``."""
        return self.input_len + self.output_len / 2

    def replace_eagle3(self, columns: Mapping[str, Sequence[float]]) -> PublishedTable:
        """A copy with different Eagle3 columns (the no-speculation column untouched)."""
        return dataclasses.replace(self, eagle3={k: tuple(v) for k, v in columns.items()})


BLOG_MI355X_KIMI = PublishedTable(
    source="AMD ROCm blog, 3 July 2026: 'Accelerating Large-Scale LLM Inference on AMD Instinct MI350X/MI355X "
           "with Eagle3 and AMD Quark' (credits vLLM PR #39616)",
    hardware="MI355X", model="Kimi-K2.5-MXFP4", tp=4, input_len=1024, output_len=1024,
    concurrency=(4, 8, 16, 32, 64),
    no_spec=(82.7, 142.2, 220.5, 342.2, 533.3),
    eagle3={"BF16 draft": (157.0, 269.1, 399.6, 627.6, 901.6),
            "FP8 draft": (165.2, 270.1, 412.7, 633.8, 936.6)},
)

_DRAFT_DTYPE = {"BF16 draft": "bf16", "FP8 draft": "fp8"}


@dataclasses.dataclass(frozen=True)
class PredictionRow:
    column: str
    concurrency: int
    published: float
    predicted: float
    fitted: bool  # True for the no-speculation column (the fit), False for a prediction

    @property
    def error(self) -> float:
        """(predicted - published) / published."""
        return self.predicted / self.published - 1.0


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The published table beside the model: fitted no-speculation rows and predicted Eagle3 rows."""

    table: PublishedTable
    target: TargetStepModel
    drafts: Mapping[str, DraftModel]
    k: int
    tokens_per_step: float
    overhead_ms: float
    rows: tuple[PredictionRow, ...]
    steps: Mapping[tuple[str, int], SpecStep]

    @property
    def predicted_rows(self) -> tuple[PredictionRow, ...]:
        return tuple(r for r in self.rows if not r.fitted)

    @property
    def max_abs_error(self) -> float:
        """Largest |error| over the predicted (Eagle3) rows."""
        return max(abs(r.error) for r in self.predicted_rows)

    def within(self, tolerance: float = 0.10) -> bool:
        return self.max_abs_error <= tolerance

    def records(self) -> list[dict[str, Any]]:
        return [dict(column=r.column, concurrency=r.concurrency, published=r.published, predicted=r.predicted,
                     error=r.error, fitted=r.fitted) for r in self.rows]

    def gaps(self) -> list[dict[str, float]]:
        """Diagnostics of each predicted row (nothing here feeds back into the model).

        ``published_step_ms``: the step time the published throughput implies *if* a step yields the
        model's tokens per step (``c * tokens / (tp * thr)``); ``missing_ms``: that minus the modelled
        step; ``missing_ms_per_draft``: the same spread over the ``k`` draft forwards;
        ``implied_tokens_per_step``: the tokens per step that would reconcile the published throughput
        with the modelled step time (``thr * tp * step / c``).
        """
        out = []
        for r in self.predicted_rows:
            s = self.steps[(r.column, r.concurrency)]
            pub_step = r.concurrency * s.tokens_per_step / (s.tp * r.published) * 1e3
            out.append(dict(column=r.column, concurrency=r.concurrency, model_step_ms=s.step_ms,
                            published_step_ms=pub_step, missing_ms=pub_step - s.step_ms,
                            missing_ms_per_draft=(pub_step - s.step_ms) / s.k,
                            implied_tokens_per_step=r.published * s.tp * s.step_ms * 1e-3 / r.concurrency))
        return out

    def format(self, tolerance: float = 0.10) -> str:
        """A text table: column, concurrency, published, predicted, error, and the verdict per row."""
        lines = [f"{'column':12} {'conc':>5} {'published':>10} {'predicted':>10} {'error':>8}  note",]
        for r in self.rows:
            note = "fitted" if r.fitted else ("within" if abs(r.error) <= tolerance else "MISS") + \
                f" +/-{tolerance:.0%}"
            lines.append(f"{r.column:12} {r.concurrency:5d} {r.published:10.1f} {r.predicted:10.1f} "
                         f"{r.error:+8.1%}  {note}")
        return "\n".join(lines)


def predict_published(table: PublishedTable = BLOG_MI355X_KIMI, *, law: str = "power",
                      deployment: Deployment = KIMI_K25_MI355X_TP4, rates: Sequence[float] = AITER_2720_RATES,
                      k: int | None = None, overhead_ms: float = 0.0,
                      drafts: Mapping[str, DraftModel] | None = None) -> Prediction:
    """Fit the target on ``table.no_spec`` (only), then predict every Eagle3 column.

    Acceptance: ``rates`` (default: aiter #2720, k = 7) give ``1 + sum(rates[:k])`` tokens per step.
    Drafts: by default :func:`eagle3_draft` in the column's dtype with its per-forward overhead from
    :func:`draft_fixed_ms_from_target`, so no parameter is fitted to an Eagle3 number.
    """
    if deployment.hardware.name != table.hardware or deployment.tp != table.tp:
        raise ValueError(f"deployment ({deployment.hardware.name}, tp={deployment.tp}) does not match the table "
                         f"({table.hardware}, tp={table.tp})")
    k = len(rates) if k is None else k
    target = fit_target_step(table.concurrency, table.no_spec, deployment=deployment, context=table.mean_context,
                             law=law)
    if drafts is None:
        fixed = draft_fixed_ms_from_target(target)
        drafts = {}
        for name in table.eagle3:
            if name not in _DRAFT_DTYPE:
                raise ValueError(f"no default draft for column {name!r}: pass drafts={{{name!r}: DraftModel(...)}}")
            drafts[name] = eagle3_draft(_DRAFT_DTYPE[name], fixed_ms=fixed)
    rows: list[PredictionRow] = []
    steps: dict[tuple[str, int], SpecStep] = {}
    ctx = table.mean_context
    for c, pub in zip(table.concurrency, table.no_spec):
        s = spec_step(target, None, c, ctx, 0)
        steps[("no speculation", c)] = s
        rows.append(PredictionRow("no spec", c, pub, s.tok_s_per_gpu, True))
    for name, col in table.eagle3.items():
        if name not in drafts:
            raise ValueError(f"drafts has no model for column {name!r} (has {sorted(drafts)})")
        for c, pub in zip(table.concurrency, col):
            s = spec_step(target, drafts[name], c, ctx, k, rates=rates, overhead_ms=overhead_ms)
            steps[(name, c)] = s
            rows.append(PredictionRow(name, c, pub, s.tok_s_per_gpu, False))
    return Prediction(table, target, dict(drafts), k, expected_tokens_per_step(rates, k), overhead_ms,
                      tuple(rows), steps)


# ================================================================================================
# The index expansion: the published serial-loop cost beside the modelled decode
# ================================================================================================

# vLLM #57978 / #58661: v0.20's one-program-per-request expansion on MI355X at ~97k context,
# concurrency 1: 61.6 us per call, 7 calls per engine step.
SERIAL_EXPAND_MI355X = {"us_per_call": 61.6, "calls_per_step": 7, "context": 97_000, "concurrency": 1,
                        "source": "vLLM PRs #57978 and #58661 (MI355X, ~97k context, concurrency 1)"}


def serial_expansion_published(target: TargetStepModel | None = None, *, k: int = 7) -> dict[str, float]:
    """The published serial-loop cost on MI355X (61.6 us x 7 calls per step, ~97k context, concurrency 1)
    beside the modelled MLA decode attention of one step there, and (given a calibrated ``target``) beside
    the whole verify step at ``qlen = k + 1``."""
    d = SERIAL_EXPAND_MI355X
    dep = target.deployment if target is not None else KIMI_K25_MI355X_TP4
    expand_ms = d["us_per_call"] * d["calls_per_step"] / 1e3
    attn = dep.attention_ms(d["concurrency"], d["context"], 1)
    out = dict(expand_ms_per_step=expand_ms, attention_ms_per_step=attn, expand_vs_attention=expand_ms / attn)
    if target is not None:
        verify = target.step_ms(d["concurrency"], d["context"], k + 1)
        out.update(verify_ms=verify, expand_vs_verify=expand_ms / verify)
    return out
