"""Readers of the committed benchmark results, and the model set beside them.

``data/bench_<name>_<device>.json`` is written by ``workbench bench <name>``. The readers use only the
results the book shows: decode ``results`` rows (``heads``, ``qlen``, ``batch``, ``context``,
``kv_gb_s``, ``workbench_us``) and ``ceilings``; expand ``cases`` rows (``num_reqs``, ``seq_len``,
``kernel_us``, ``kernel_after_fill_us``, ``serial_us``); ``provenance`` of both. A missing file is
reported, never replaced by made-up numbers.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from workbench.perfmodel.published import SERIAL_EXPAND_MI355X
from workbench.perfmodel.roofline import KV_LORA_RANK, QK_HEAD_DIM, Hardware, padding_cost_rows
from workbench.pow2 import next_pow2

DATA_DIR = Path(__file__).resolve().parents[1] / "data"  # src/workbench/data


@dataclasses.dataclass(frozen=True)
class MeasurementFile:
    """A committed benchmark result, or the explicit reason there is none."""

    name: str
    path: Path
    payload: dict[str, Any] | None
    reason: str

    @property
    def available(self) -> bool:
        return self.payload is not None


_REQUIRED_KEYS = {"expand": ("cases",), "decode": ("results",), "tile_rates": ("rates",)}


def _read_result(path: Path, name: str) -> dict[str, Any]:
    """The JSON object in ``path``, or a ValueError naming the file, what is wrong with it and how to regenerate it."""
    try:
        payload = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} cannot be read as JSON ({type(exc).__name__}: {exc}); regenerate it with "
                         f"`workbench bench {name}` (or restore it with git)") from exc
    if not isinstance(payload, dict):
        raise ValueError(f"{path} holds a JSON {type(payload).__name__}, not an object: is it the output of "
                         f"`workbench bench {name}`?")
    return payload


def load_measurement(name: str, device: str = "h200", data_dir: Path | str | None = None) -> MeasurementFile:
    """Read ``data/bench_<name>_<device>.json`` (written by ``workbench bench <name>``).

    A missing file is not an error: the result says so (``available`` False, ``reason`` why) and no
    number is made up. A file that exists but cannot be read, is not a JSON object, or lacks the benchmark's keys
    raises ValueError naming the file and what is wrong.
    """
    if name not in _REQUIRED_KEYS:
        raise ValueError(f"name={name!r} must be one of {sorted(_REQUIRED_KEYS)}")
    path = Path(data_dir or DATA_DIR) / f"bench_{name}_{device}.json"
    if not path.exists():
        return MeasurementFile(name, path, None,
                               f"{path.name} is not committed (run `workbench bench {name}` on the GPU and commit "
                               f"its JSON under src/workbench/data/); the figures that need it are left out")
    payload = _read_result(path, name)
    missing = [k for k in _REQUIRED_KEYS[name] if k not in payload]
    if missing:
        raise ValueError(f"{path} has no key(s) {missing}: is it the output of `workbench bench {name}`?")
    prov = payload.get("provenance")
    prov = prov if isinstance(prov, dict) else {}
    return MeasurementFile(name, path, payload, f"{path.name}: measured on {prov.get('device', '?')}, "
                                                f"{prov.get('date_utc', 'date unknown')}")


def _nearest_decode(results: list[dict[str, Any]], batch: int, context: int, heads: int) -> dict[str, Any] | None:
    pts = [r for r in results if r.get("heads") == heads and r.get("qlen") == 1 and r.get("kv_gb_s")]
    if not pts:
        return None
    return min(pts, key=lambda r: (math.log(r["batch"] / batch)) ** 2 + (math.log(r["context"] / context)) ** 2)


def expansion_cost_per_step(expand: dict[str, Any], decode: dict[str, Any], *, layers: int = 61, heads: int = 16,
                            calls_per_step: int = SERIAL_EXPAND_MI355X["calls_per_step"]) -> list[dict[str, Any]]:
    """Per engine step, the index expansion beside the MLA decode it feeds, from H200 measurements.

    For each case of ``workbench bench expand`` (``num_reqs`` x ``seq_len``): expansion per step =
    ``calls_per_step`` x the measured time of the 2-D-grid kernel and of the serial (v0.20) kernel. The
    kernel's time is the one measured right after a torch kernel (``kernel_after_fill_us``) where the results
    have it: in a step the expansion follows kernels that do not trigger a PDL launch early, so the launch
    overlap that back-to-back replay (``kernel_us``) credits it with is not there;
    decode per step = ``layers`` x one decode layer at that batch and context, estimated from the
    measured ``heads``-head qlen-1 decode point nearest in (log batch, log context), scaled by its KV
    bytes (decode is memory-bound there: its effective KV bandwidth is reused). Where the case's context
    exceeds the measured one at the same batch (1 x 97k from 1 x 32k), the kernel's bandwidth would still
    be rising, so the decode estimate is an upper bound and the expansion's share a lower bound.
    Returns one dict per case.
    """
    cases = expand.get("cases")
    results = decode.get("results")
    if not cases or not results:
        raise ValueError("expand must have 'cases' and decode 'results' (outputs of `workbench bench expand|decode`)")
    out = []
    for case in cases:
        b, L = int(case["num_reqs"]), int(case["seq_len"])
        ref = _nearest_decode(results, b, L, heads)
        if ref is None:
            raise ValueError(f"decode results have no {heads}-head qlen-1 point to scale from")
        kv_bytes = b * L * QK_HEAD_DIM * 2
        decode_layer_us = kv_bytes / (ref["kv_gb_s"] * 1e9) * 1e6
        decode_step_us = layers * decode_layer_us
        kernel_us = case.get("kernel_after_fill_us", case["kernel_us"])
        row = dict(num_reqs=b, seq_len=L, calls_per_step=calls_per_step,
                   kernel_us_per_call=kernel_us, serial_us_per_call=case["serial_us"],
                   kernel_us_per_step=calls_per_step * kernel_us,
                   serial_us_per_step=calls_per_step * case["serial_us"],
                   decode_us_per_step=decode_step_us,
                   decode_ref=dict(batch=ref["batch"], context=ref["context"], kv_gb_s=ref["kv_gb_s"]))
        row["kernel_vs_decode"] = row["kernel_us_per_step"] / decode_step_us
        row["serial_vs_decode"] = row["serial_us_per_step"] / decode_step_us
        out.append(row)
    return out


def measured_padding_overhead(path: str | Path | None = None) -> tuple[list[dict[str, Any]], str]:
    """Padding overhead measured by ``workbench bench decode`` (Triton kernel, CUDA-graph replay).

    For every (heads, batch, context) measured at a non-power-of-two ``qlen`` and at ``next_pow2(qlen)``,
    one row with both times, the measured overhead, and two model predictions for the same shapes
    (:func:`padding_cost_rows`): on the datasheet H200 (``model_pct``) and on a roofline built from the
    ceilings measured in the same run (``model_measured_pct``: read-only bandwidth, else copy bandwidth,
    and the bf16 matmul rate). Returns ``(rows, note)``; ``rows`` is empty and ``note`` says why when the
    file is missing or holds no such pair. Nothing is invented: only measured pairs.
    """
    p = Path(path) if path is not None else DATA_DIR / "bench_decode_h200.json"
    if not p.exists():
        return [], f"{p.name} is not in the repository yet: no measured padding overhead to show"
    payload = _read_result(p, "decode")
    results = payload.get("results", [])
    # the decode benchmark's time of the workbench's kernel ("triton_us" in results written before the FlashMLA runs)
    key = lambda r: r.get("workbench_us", r.get("triton_us"))  # noqa: E731
    times = {(r["heads"], r["batch"], r["context"], r["qlen"]): key(r) for r in results if key(r) is not None}
    ceilings = payload.get("ceilings", {})
    bw = (ceilings.get("read_only") or ceilings.get("copy") or {}).get("gb_s")
    tf = (ceilings.get("matmul_bf16") or {}).get("tflops")
    measured_hw = Hardware("measured", "", 0, bw / 1e3, tf, f"ceilings in {p.name}") if bw and tf else None
    rows = []
    for (h, b, ctx, q), us in sorted(times.items()):
        P = next_pow2(q)
        if q == P or (h, b, ctx, P) not in times:
            continue
        up = times[(h, b, ctx, P)]
        row = dict(heads=h, batch=b, context=ctx, qlen=q, padded_qlen=P, us=us, padded_us=up,
                   overhead_pct=100 * (up / us - 1),
                   model_pct=padding_cost_rows([q - 1], heads=h, batch=b, context=ctx, hardware="H200")[0]["time_pct"])
        if measured_hw is not None:
            row["model_measured_pct"] = padding_cost_rows([q - 1], heads=h, batch=b, context=ctx,
                                                          hardware=measured_hw)[0]["time_pct"]
        rows.append(row)
    prov = payload.get("provenance", {})
    where = ", ".join(str(prov[k]) for k in ("device", "date_utc") if k in prov) or "no provenance recorded"
    note = f"{p.name} ({where}): {len(rows)} measured (qlen, next power of two) pairs"
    return rows, note


_ROW_BLOCK = 64  # folded rows per wgmma warpgroup: a decode program's row block


def tile_schedule_floor_us(rates: list[dict[str, Any]], *, heads: int, qlen: int, batch: int, context: int,
                           width: int) -> dict[str, float]:
    """The least time an MLA decode on tiles of ``width`` tokens can take at a point, from measured product
    rates (``rates``: the ``rates`` rows of ``bench_tile_rates_<device>.json``, written by
    ``benchmarks/tile_rates.py``).

    Every program computes whole blocks of 64 folded rows, so the FLOPs are counted on ``heads x qlen`` rounded up
    to 64 rows: ``S`` (576 deep) and ``P V`` (512 output columns) over ``batch x context`` keys. Each product runs
    at the rate its tile shape reached with the tensor cores kept busy on every SM; the floor is the sum of the
    two times, as if nothing else (loads, softmax, waits) took any. Returns ``{"qk_us", "pv_us", "floor_us"}``.
    """
    for name, value in (("heads", heads), ("qlen", qlen), ("batch", batch), ("context", context)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    by = {(r.get("product"), r.get("width")): r.get("tflops") for r in rates}
    rows = -(-heads * qlen // _ROW_BLOCK) * _ROW_BLOCK
    out = {}
    for product, depth in (("qk", QK_HEAD_DIM), ("pv", KV_LORA_RANK)):
        tflops = by.get((product, width))
        if not tflops or tflops <= 0:
            widths = sorted(w for p_, w in by if p_ == product)
            raise ValueError(f"width={width!r}: no measured {product} rate (widths with one: {widths})")
        out[f"{product}_us"] = 2.0 * batch * rows * context * depth / (tflops * 1e12) * 1e6
    out["floor_us"] = out["qk_us"] + out["pv_us"]
    return out
