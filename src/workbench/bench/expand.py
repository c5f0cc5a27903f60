"""Benchmark of the per-token index expansion (``workbench bench expand``).

Byte formula, stated before measuring. For a batch with ``seq_lens = L_r`` and kernel block size ``K``
the expansion must at least

* read the block-table entries it uses: ``4 * sum_r ceil(L_r / K)`` bytes (int32 ids), and
* write one int32 index per token: ``4 * sum_r L_r`` bytes,

so ``bytes = 4 * sum_r (ceil(L_r / K) + L_r)``, about ``4 * (1 + 1/K)`` bytes per token (4.25 at K = 16).
The ``seq_lens`` read and the ``kv_indptr`` write (``8 * num_reqs + 4`` bytes) are left out: they are
negligible here. Achieved bandwidth is ``bytes / time``, compared with the device-to-device copy
bandwidth measured in the same run (:func:`workbench.bench.common.copy_bandwidth`, read + write).

Contenders, all timed under CUDA-graph replay except the dense one:

* ``kernel``: :func:`workbench.expand.expand_page_indices` (one launch, 2-D grid, computes ``kv_indptr`` too);
* ``serial``: the one-program-per-request design of vLLM v0.20 (:func:`workbench.expand._launch_serial`),
  given a precomputed ``kv_indptr`` (its ``cumsum`` is not timed: this favours it);
* ``dense``: plain torch ``[R, max_len]`` indices + boolean mask; the mask compaction synchronises with
  the host, so it cannot be captured and is timed eagerly (:func:`workbench.bench.common.time_eager`).

Bars (H200, K = 16): at 512 x 128k at least 90 % of the copy bandwidth; at most 2 us at 1 x 97k
and at 256 x 4k; at least 10x faster than ``serial`` at 1 x 97k.
Nothing here imports plotly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from workbench import expand as E
from workbench.bench.common import copy_bandwidth, provenance, require_gpu, time_cuda_graph, time_eager, write_json

__all__ = ["BARS", "CASES", "SWEEP", "Bar", "check_bars", "expand_bytes", "format_table", "run"]

K_DEFAULT = 16

# (num_reqs, seq_len per request); tokens are K-aligned except 97_000 (a real ~97k context).
CASES: tuple[tuple[int, int], ...] = (
    (1, 97_000),
    (4, 65_536),
    (32, 32_768),
    (256, 4_096),
    (512, 131_072),
)

# Launch parameters tried by ``--sweep`` (the library's expand_config() is chosen from such a sweep).
SWEEP: tuple[E.ExpandConfig, ...] = tuple(
    E.ExpandConfig(block_t=bt, num_warps=w) for bt in (512, 1024, 2048, 4096, 8192) for w in (4, 8)
)


def expand_bytes(seq_lens: list[int], K: int) -> int:
    """Minimum bytes moved: int32 block-table entries read plus one int32 index written per token."""
    return sum(4 * (-(-n // K)) + 4 * n for n in seq_lens)


@dataclasses.dataclass(frozen=True)
class Bar:
    name: str
    case: tuple[int, int]
    metric: str  # key of the case result
    op: str  # ">=" or "<="
    target: float
    unit: str


BARS: tuple[Bar, ...] = (
    Bar("bandwidth at 512 x 128k", (512, 131_072), "kernel_frac_copy", ">=", 0.90, "x copy bandwidth"),
    Bar("latency at 1 x 97k", (1, 97_000), "kernel_us", "<=", 2.0, "us"),
    Bar("latency at 256 x 4k", (256, 4_096), "kernel_us", "<=", 2.0, "us"),
    Bar("speed-up over serial at 1 x 97k", (1, 97_000), "speedup_vs_serial", ">=", 10.0, "x"),
)


def _make_inputs(num_reqs: int, seq_len: int, K: int, device: torch.device, seed: int = 0):
    """Random permuted block ids (block 0 reserved), int32, exactly as many blocks as the tokens need."""
    g = torch.Generator(device=device).manual_seed(seed)
    blocks = -(-seq_len // K)
    ids = 1 + torch.randperm(num_reqs * blocks, generator=g, device=device, dtype=torch.int64)
    block_table = ids.to(torch.int32).reshape(num_reqs, blocks)
    seq_lens = torch.full((num_reqs,), seq_len, dtype=torch.int32, device=device)
    return block_table, seq_lens, num_reqs * blocks + 1


def _time_kernel(block_table, seq_lens, K, out, indptr, max_seq_len, config) -> float:
    return time_cuda_graph(lambda: E.expand_page_indices(
        block_table, seq_lens, K, out=out, kv_indptr=indptr, max_seq_len=max_seq_len, validate=False, config=config))


def run_case(num_reqs: int, seq_len: int, K: int = K_DEFAULT, *, copy_gb_s: float, sweep: bool = False,
             dense: bool = True) -> dict[str, Any]:
    """Time the three contenders on one batch shape; check they agree; return a JSON-able dict."""
    device = require_gpu()
    block_table, seq_lens, num_blocks = _make_inputs(num_reqs, seq_len, K, device)
    total = num_reqs * seq_len
    nbytes = expand_bytes([seq_len] * num_reqs, K)
    E.validate_expand_inputs(block_table, seq_lens, K, num_blocks=num_blocks, max_seq_len=seq_len)
    out = torch.empty(total, dtype=torch.int32, device=device)
    indptr = torch.empty(num_reqs + 1, dtype=torch.int32, device=device)
    config = E.expand_config(num_reqs, seq_len)

    res: dict[str, Any] = {"num_reqs": num_reqs, "seq_len": seq_len, "K": K, "tokens": total, "bytes": nbytes,
                           "config": dataclasses.asdict(config)}
    res["kernel_us"] = _time_kernel(block_table, seq_lens, K, out, indptr, seq_len, config)

    # serial: kv_indptr prepared outside the timed region
    serial_indptr = torch.zeros(num_reqs + 1, dtype=torch.int32, device=device)
    serial_indptr[1:] = torch.cumsum(seq_lens, 0)
    serial_out = torch.empty_like(out)
    res["serial_us"] = time_cuda_graph(lambda: E._launch_serial(block_table, serial_indptr, K, serial_out))
    torch.cuda.synchronize()
    res["agree_serial"] = bool(torch.equal(out, serial_out)) and bool(torch.equal(indptr, serial_indptr))
    if dense:
        heavy = num_reqs * seq_len > 8_000_000
        res["dense_us"] = time_eager(lambda: E.expand_page_indices_dense(block_table, seq_lens, K, max_seq_len=seq_len),
                                     reps=3 if heavy else 10, repeats=5 if heavy else 10, warmup=1)
        res["agree_dense"] = bool(torch.equal(E.expand_page_indices_dense(block_table, seq_lens, K)[0], out))

    for name in ("kernel", "serial", "dense"):
        if f"{name}_us" in res:
            gb_s = nbytes / (res[f"{name}_us"] * 1e-6) / 1e9
            res[f"{name}_gb_s"] = gb_s
            res[f"{name}_frac_copy"] = gb_s / copy_gb_s
    res["speedup_vs_serial"] = res["serial_us"] / res["kernel_us"]

    if sweep:
        rows = []
        for cfg in SWEEP:
            us = _time_kernel(block_table, seq_lens, K, out, indptr, seq_len, cfg)
            rows.append({**dataclasses.asdict(cfg), "us": us, "gb_s": nbytes / (us * 1e-6) / 1e9})
        res["sweep"] = rows
    del block_table, seq_lens, out, serial_out
    torch.cuda.empty_cache()
    return res


def check_bars(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each bar with its measured value and PASS/MISS (bars whose case was not run are left out)."""
    by_shape = {(c["num_reqs"], c["seq_len"]): c for c in cases if c["K"] == K_DEFAULT}
    verdicts = []
    for bar in BARS:
        case = by_shape.get(bar.case)
        if case is None:
            continue
        value = case[bar.metric]
        ok = value >= bar.target if bar.op == ">=" else value <= bar.target
        verdicts.append({**dataclasses.asdict(bar), "value": value, "verdict": "PASS" if ok else "MISS"})
    return verdicts


def run(cases: tuple[tuple[int, int], ...] = CASES, K: int = K_DEFAULT, *, sweep: bool = False, dense: bool = True,
        command: str | None = None, out: str | None = None) -> dict[str, Any]:
    """Run the whole benchmark; write JSON to ``out`` when given; return the result dict."""
    require_gpu()
    copy = copy_bandwidth()
    results = [run_case(r, n, K, copy_gb_s=copy["gb_s"], sweep=sweep, dense=dense) for r, n in cases]
    payload = {
        "benchmark": "expand",
        "provenance": provenance(command),
        "byte_formula": "bytes = 4 * sum_r(ceil(L_r / K) + L_r): int32 block-table entries read + one int32 index "
                        "written per token (seq_lens read and kv_indptr write left out)",
        "timing": "median of CUDA-graph replays (20 calls per graph); dense: eager (boolean indexing syncs)",
        "copy": copy,
        "cases": results,
        "bars": check_bars(results),
    }
    if out:
        write_json(out, payload)
    return payload


def format_table(payload: dict[str, Any]) -> str:
    """The result as a text table, then the bars with PASS/MISS."""
    copy = payload["copy"]["gb_s"]
    lines = [
        f"device: {payload['provenance'].get('device', '?')}   copy bandwidth (read+write): {copy:.0f} GB/s",
        "bytes = 4 * sum(ceil(L/K) + L)   (block-table entries read + 4 B written per token)",
        "",
        f"{'case':>14} {'tokens':>11} {'kernel us':>10} {'GB/s':>7} {'%copy':>6} {'serial us':>10} "
        f"{'speedup':>8} {'dense us':>9}",
    ]
    for c in payload["cases"]:
        dense = f"{c['dense_us']:9.1f}" if "dense_us" in c else f"{'-':>9}"
        lines.append(
            f"{c['num_reqs']:>5} x {c['seq_len']:<6} {c['tokens']:>11,} {c['kernel_us']:10.2f} {c['kernel_gb_s']:7.0f} "
            f"{100 * c['kernel_frac_copy']:5.1f}% {c['serial_us']:10.2f} {c['speedup_vs_serial']:7.1f}x {dense}"
        )
    lines += ["", f"{'bar':36} {'target':>16} {'measured':>10}  verdict"]
    for b in payload["bars"]:
        lines.append(f"{b['name']:36} {b['op'] + ' ' + format(b['target'], 'g') + ' ' + b['unit']:>16} "
                     f"{b['value']:10.3g}  {b['verdict']}")
    if any("sweep" in c for c in payload["cases"]):
        lines += ["", "sweep (block_t, num_warps -> us):"]
        for c in payload["cases"]:
            if "sweep" in c:
                cells = "  ".join(f"{s['block_t']}/{s['num_warps']}:{s['us']:.2f}" for s in c["sweep"])
                lines.append(f"{c['num_reqs']:>5} x {c['seq_len']:<6} {cells}")
    return "\n".join(lines)
