"""The benchmark of the per-token index expansion: ``python benchmarks/expand.py`` (``workbench bench expand``).

Byte formula, stated before measuring (:func:`workbench.expand.expand_bytes`). For a batch with ``seq_lens = L_r``
and kernel block size ``K`` the expansion must at least read the block-table entries it uses and write one
int32 index per token: ``bytes = 4 * sum_r (ceil(L_r / K) + L_r)``, about 4.25 bytes per token at K = 16. The
``seq_lens`` read and the ``kv_indptr`` write are left out. Achieved bandwidth is ``bytes / time``, compared with
the device-to-device copy bandwidth measured in the same run (:func:`workbench.bench.common.copy_bandwidth`).

Per case (:data:`CASES`), in one run and under CUDA-graph replay unless said otherwise, every output checked:

* ``kernel_us``: :func:`workbench.expand.expand_page_indices` as the library launches it (one launch, computes
  ``kv_indptr`` too); ``kernel_no_pdl_us`` without PDL; ``kernel_after_fill_us`` right after a one-int torch
  ``fill_`` (a kernel that does not trigger its dependents early: what a serving step sees);
  ``kernel_indptr_given_us`` with the caller's ``kv_indptr`` (``precomputed_kv_indptr=True``);
* ``serial_us``: the one-program-per-request design of vLLM v0.20 (given a precomputed ``kv_indptr``, which
  favours it), the peer of the speed-up bar;
* ``dense_us``: plain torch ``[R, max_len]`` indices and a boolean mask, timed eagerly (the compaction syncs);
* the ceilings: ``fill_same_bytes_us`` (a torch ``fill_`` of the output bytes, no indexing at all) and
  ``store_only_us`` (a Triton kernel that stores as many int32 and loads nothing, the lower of its launches
  with and without PDL: the floor of any expansion kernel of this shape);
* below 128k tokens, the same case under a loose ``max_seq_len`` of 131072, with ``loose_bound=True`` and with
  the default launch (``kernel_loose_bound_us``, ``kernel_loose_bound_default_us``);
* last (an attached profiler slows later launches): the kernels' own execution times (``*_device_us``).

Bars (H200, K = 16; :data:`BARS`): at 512 x 128k at least 90 % of the copy bandwidth; at most 2 us at 1 x 97k
and at 256 x 4k; at least 10x faster than ``serial`` at 1 x 97k.

``--tune`` re-measures the thresholds of :mod:`workbench.expand.policy` instead: each :data:`TUNE` knob at its
candidate values over its cases (the others at their current values), keeping the current value unless another
is faster by more than ``--margin`` (geometric mean over the cases), and writes the tuned table; the library reads
it from ``src/workbench/data/tuned/expand_nvidia.json``. On a cold H200 the whole tune takes about 10 minutes,
nearly all of it compiling the candidates' launches; ``--knob NAME`` (repeatable) tunes a part.

This module imports on any machine (no plotly; the GPU work starts in :func:`main`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import triton
import triton.language as tl

from workbench import device as _device
from workbench import expand as E
from workbench.bench.common import (copy_bandwidth, kernel_device_us, provenance, require_gpu, time_cuda_graph,
                                    time_eager, write_json)
from workbench.expand import baselines as _baselines
from workbench.expand import kernel as _kernel
from workbench.expand import policy as _policy

__all__ = ["BARS", "CASES", "CASE_KEYS", "TUNE", "Bar", "Knob", "add_arguments", "check_bars", "expand_bytes",
           "format_table", "main", "parse_case", "run", "tune"]

K_DEFAULT = 16
expand_bytes = E.expand_bytes  # the byte formula above, defined beside the kernel

# (num_reqs, seq_len per request); tokens are K-aligned except 97_000 (a real ~97k context).
CASES: tuple[tuple[int, int], ...] = (
    (1, 97_000),
    (4, 65_536),
    (32, 32_768),
    (256, 4_096),
    (512, 131_072),
    (1_024, 1_000),  # a large decode batch: the prefix sum's cost grows with the number of requests
    (16_384, 32),  # many tiny requests: requests packed into groups (ExpandConfig.group)
)

# The keys every case row of the result has (others: dense_*, loose-bound and store-only keys, where timed).
CASE_KEYS = ("num_reqs", "seq_len", "K", "tokens", "bytes", "config", "kernel_us", "kernel_gb_s", "kernel_frac_copy",
             "kernel_no_pdl_us", "kernel_after_fill_us", "kernel_indptr_given_us", "serial_us", "serial_gb_s",
             "serial_frac_copy", "speedup_vs_serial", "fill_same_bytes_us", "agree_serial", "agree_indptr_given",
             "kernel_device_us", "fill_same_bytes_device_us")


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
    # many requests: the launch, the prefix sum and the dependent store already cost about what a torch fill_ of
    # the same output bytes costs (the results table prints that fill_ beside a miss)
    Bar("latency at 256 x 4k", (256, 4_096), "kernel_us", "<=", 2.0, "us"),
    Bar("speed-up over serial at 1 x 97k", (1, 97_000), "speedup_vs_serial", ">=", 10.0, "x"),
)


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


def parse_case(text: str) -> tuple[int, int]:
    """``--case 256x4096``: (requests, tokens each), both positive."""
    try:
        r, n = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--case must look like 256x4096 (requests x tokens each), got {text!r}") \
            from None
    if r < 1 or n < 1:
        raise argparse.ArgumentTypeError(f"--case {text!r}: requests and tokens must both be >= 1")
    return r, n


# --------------------------------------------------------------------------------------------
# The measurement
# --------------------------------------------------------------------------------------------


def _make_inputs(num_reqs: int, seq_len: int, K: int, device: torch.device, seed: int = 0):
    """Random permuted block ids (block 0 reserved), int32, exactly as many blocks as the tokens need."""
    g = torch.Generator(device=device).manual_seed(seed)
    blocks = -(-seq_len // K)
    ids = 1 + torch.randperm(num_reqs * blocks, generator=g, device=device, dtype=torch.int64)
    block_table = ids.to(torch.int32).reshape(num_reqs, blocks)
    seq_lens = torch.full((num_reqs,), seq_len, dtype=torch.int32, device=device)
    return block_table, seq_lens, num_reqs * blocks + 1


@triton.jit
def _one_store(x_ptr):  # the smallest kernel: one program, one store
    tl.store(x_ptr, 1)


@triton.jit
def _store_only_kernel(out_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Writes ``out[i] = i`` for ``i < n``: the same bytes as an expansion of ``n`` tokens, with no loads.
    ``PDL``: launched with PDL, it waits for the kernel before (which may still write ``out``) first."""
    if PDL:
        _kernel.pdl_wait_then_release()
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, offs.to(tl.int32), mask=offs < n)


def _store_only_us(out: torch.Tensor) -> float:
    """The store-only floor of writing ``out``: 1024 entries on 4 warps per program (the fastest shape at the
    small cases), the lower of the launches with and without PDL (PDL pays back to back at small sizes and
    costs at many waves)."""
    n = out.numel()
    grid = (triton.cdiv(n, 1024),)
    times = [time_cuda_graph(lambda: _store_only_kernel[grid](out, n, BLOCK=1024, num_warps=4))]
    if _device.pdl_available(out.device):
        times.append(time_cuda_graph(lambda: _store_only_kernel[grid](
            out, n, BLOCK=1024, num_warps=4, **_kernel.pdl_launch_options(True))))
    return min(times)


def _expansion(block_table, seq_lens, K, out, indptr, max_seq_len, config, **kw):
    """A zero-argument, capturable call of the library's expansion."""
    return lambda: E.expand_page_indices(block_table, seq_lens, K, out=out, kv_indptr=indptr, max_seq_len=max_seq_len,
                                         validate=False, config=config, **kw)


LOOSE_BOUND = 131_072  # a model's maximum length: the bound a graph that serves every step would be sized by
LOOSE_DEFAULT_MAX_PROGRAMS = 1 << 20  # the default launch under the loose bound is timed up to this many programs


def _time_loose_bound(block_table, seq_lens, K, out, indptr, num_reqs) -> dict[str, Any]:
    """The same expansion with ``max_seq_len=LOOSE_BOUND``: with ``loose_bound=True`` (``kernel_loose_bound_us``)
    and with the default launch (``kernel_loose_bound_default_us``; skipped above ``LOOSE_DEFAULT_MAX_PROGRAMS``
    programs: 16,384 x 32 took 27 ms). Both outputs are checked against the tight call's."""
    res: dict[str, Any] = {"loose_bound": LOOSE_BOUND}
    want_out, want_indptr = out.clone(), indptr.clone()
    loose_out, loose_indptr = torch.empty_like(out), torch.empty_like(indptr)
    default = E.expand_config(num_reqs, LOOSE_BOUND)
    runs = [("kernel_loose_bound_us", E.expand_config(num_reqs, LOOSE_BOUND, loose_bound=True))]
    if -(-num_reqs // default.group) * -(-LOOSE_BOUND // default.block_t) <= LOOSE_DEFAULT_MAX_PROGRAMS:
        runs.append(("kernel_loose_bound_default_us", default))
    for key, cfg in runs:
        loose_out.fill_(-1)
        res[key] = time_cuda_graph(_expansion(block_table, seq_lens, K, loose_out, loose_indptr, LOOSE_BOUND, cfg))
        torch.cuda.synchronize()
        res[key.replace("kernel_", "agree_").replace("_us", "")] = bool(torch.equal(loose_out, want_out)) and bool(
            torch.equal(loose_indptr, want_indptr))
    res["loose_bound_config"] = dataclasses.asdict(runs[0][1])
    return res


def _time_after_fill(fn) -> float:
    """Time of ``fn()`` right after a one-int ``fill_`` (a kernel that does not trigger dependents early), under
    graph replay: the period of (fill_, fn) pairs less the period of fill_ alone."""
    x = torch.empty(1, dtype=torch.int32, device=require_gpu())

    def pair() -> None:
        x.fill_(1)
        fn()

    return time_cuda_graph(pair) - time_cuda_graph(lambda: x.fill_(1))


def _device_us(fn) -> float | None:
    """Kernel execution time per call from the profiler (None where the profiler sees no kernels)."""
    try:
        return kernel_device_us(fn)["us"]
    except RuntimeError:
        return None


def device_times(num_reqs: int, seq_len: int, K: int = K_DEFAULT) -> dict[str, float | None]:
    """Kernel execution time (profiler) of the expansion and of ``fill_`` on the same bytes, one batch shape."""
    device = require_gpu()
    block_table, seq_lens, _ = _make_inputs(num_reqs, seq_len, K, device)
    out = torch.empty(num_reqs * seq_len, dtype=torch.int32, device=device)
    indptr = torch.empty(num_reqs + 1, dtype=torch.int32, device=device)
    config = E.expand_config(num_reqs, seq_len)
    res = {"kernel_device_us": _device_us(_expansion(block_table, seq_lens, K, out, indptr, seq_len, config)),
           "fill_same_bytes_device_us": _device_us(lambda: out.fill_(7))}
    del block_table, seq_lens, out
    torch.cuda.empty_cache()
    return res


def launch_floor_us() -> float:
    """Time of a Triton kernel that stores one int (one program) under the same graph replay: the floor."""
    x = torch.empty(1, dtype=torch.int32, device=require_gpu())
    return time_cuda_graph(lambda: _one_store[(1,)](x))


def fill_bandwidth(nbytes: int = 256 << 20) -> dict[str, float]:
    """Write-only bandwidth (``torch.fill_`` on an int32 buffer), bytes written over time."""
    buf = torch.empty(nbytes // 4, dtype=torch.int32, device=require_gpu())
    us = time_cuda_graph(lambda: buf.fill_(7), graph_reps=10)
    del buf
    return {"bytes": nbytes, "time_us": us, "gb_s": nbytes / (us * 1e-6) / 1e9}


def run_case(num_reqs: int, seq_len: int, K: int = K_DEFAULT, *, copy_gb_s: float,
             dense: bool = True) -> dict[str, Any]:
    """Time the contenders and ceilings on one batch shape; check the outputs agree; return a JSON-able dict."""
    device = require_gpu()
    block_table, seq_lens, num_blocks = _make_inputs(num_reqs, seq_len, K, device)
    nbytes = expand_bytes([seq_len] * num_reqs, K)
    E.validate_expand_inputs(block_table, seq_lens, K, num_blocks=num_blocks, max_seq_len=seq_len)
    out = torch.empty(num_reqs * seq_len, dtype=torch.int32, device=device)
    indptr = torch.empty(num_reqs + 1, dtype=torch.int32, device=device)
    config = E.expand_config(num_reqs, seq_len)
    call = _expansion(block_table, seq_lens, K, out, indptr, seq_len, config)

    res: dict[str, Any] = {"num_reqs": num_reqs, "seq_len": seq_len, "K": K, "tokens": out.numel(), "bytes": nbytes,
                           "config": dataclasses.asdict(config)}
    res["kernel_us"] = time_cuda_graph(call)
    # [0, cumsum(seq_lens)], prepared outside the timed regions: the serial kernel's input, the input of the
    # library's call with the caller's kv_indptr (neither writes it), and the reference for the in-kernel one.
    given_indptr = torch.zeros(num_reqs + 1, dtype=torch.int32, device=device)
    given_indptr[1:] = torch.cumsum(seq_lens, 0)
    given_out = torch.empty_like(out)
    res["kernel_indptr_given_us"] = time_cuda_graph(_expansion(block_table, seq_lens, K, given_out, given_indptr,
                                                               seq_len, config, precomputed_kv_indptr=True))
    res["kernel_no_pdl_us"] = time_cuda_graph(_expansion(block_table, seq_lens, K, out, indptr, seq_len,
                                                         dataclasses.replace(config, pdl=False)))
    res["kernel_after_fill_us"] = _time_after_fill(call)
    # The ceilings, on a buffer of the same size (not `out`, which the checks below compare).
    ceiling_buf = torch.empty_like(out)
    res["fill_same_bytes_us"] = time_cuda_graph(lambda: ceiling_buf.fill_(7))
    res["store_only_us"] = _store_only_us(ceiling_buf)
    del ceiling_buf
    if seq_len < LOOSE_BOUND:
        res.update(_time_loose_bound(block_table, seq_lens, K, out, indptr, num_reqs))

    serial_out = torch.empty_like(out)
    res["serial_us"] = time_cuda_graph(lambda: _baselines._launch_serial(block_table, given_indptr, K, serial_out))
    torch.cuda.synchronize()
    res["agree_serial"] = bool(torch.equal(out, serial_out)) and bool(torch.equal(indptr, given_indptr))
    res["agree_indptr_given"] = bool(torch.equal(given_out, serial_out))
    del given_out
    if dense:
        heavy = num_reqs * seq_len > 8_000_000
        res["dense_us"] = time_eager(lambda: E.expand_page_indices_dense(block_table, seq_lens, K, max_seq_len=seq_len,
                                                                         validate=False),
                                     reps=3 if heavy else 10, repeats=5 if heavy else 10, warmup=1)
        res["agree_dense"] = bool(torch.equal(E.expand_page_indices_dense(block_table, seq_lens, K)[0], out))
    _add_rates(res, copy_gb_s)
    res["speedup_vs_serial"] = res["serial_us"] / res["kernel_us"]
    del block_table, seq_lens, out, serial_out
    torch.cuda.empty_cache()
    return res


def _add_rates(res: dict[str, Any], copy_gb_s: float) -> None:
    """``<name>_gb_s`` and ``<name>_frac_copy`` of every contender timed in ``res``."""
    for name in ("kernel", "serial", "dense"):
        if f"{name}_us" in res:
            res[f"{name}_gb_s"] = res["bytes"] / (res[f"{name}_us"] * 1e-6) / 1e9
            res[f"{name}_frac_copy"] = res[f"{name}_gb_s"] / copy_gb_s


def run(cases: tuple[tuple[int, int], ...] = CASES, K: int = K_DEFAULT, *, dense: bool = True,
        command: str | None = None, out: str | None = None) -> dict[str, Any]:
    """Run the whole benchmark; write JSON to ``out`` when given; return the result dict."""
    require_gpu()
    # The GPU idles at low clocks: warm it up with copies first, and measure the ceilings again at the end;
    # the largest copy bandwidth of all is the ceiling (the conservative choice for the bar).
    copies = [copy_bandwidth()["runs"], copy_bandwidth()["runs"]]
    floor_us = launch_floor_us()
    fill = fill_bandwidth()
    results = [run_case(r, n, K, copy_gb_s=max(max(c.values()) for c in copies), dense=dense) for r, n in cases]
    copies.append(copy_bandwidth()["runs"])
    # Last: kernel execution times from the profiler. Once CUPTI is attached it slows every later launch
    # (graph replays measured after it took ~0.7 us more per call), so nothing is timed after this.
    for res, (r, n) in zip(results, cases):
        res.update(device_times(r, n, K))
    one = torch.empty(1, dtype=torch.int32, device=require_gpu())
    floor_device_us = _device_us(lambda: _one_store[(1,)](one))
    best = max(((k, v) for c in copies for k, v in c.items()), key=lambda kv: kv[1])
    copy = {"gb_s": best[1], "method": best[0], "bytes_per_buffer": 2 << 30}
    for res in results:  # fractions against the final ceiling
        _add_rates(res, copy["gb_s"])
    payload = {
        "benchmark": "expand",
        "provenance": provenance(command),
        "byte_formula": "bytes = 4 * sum_r(ceil(L_r / K) + L_r): int32 block-table entries read + one int32 index "
                        "written per token (seq_lens read and kv_indptr write left out)",
        "timing": "median of CUDA-graph replays (20 calls per graph); dense: eager (boolean indexing syncs); "
                  "*_device_us: the kernels' own execution time from the profiler (CUPTI), under the same replay "
                  "(measured last: the profiler slows later launches)",
        "copy": copy,
        "copy_runs": copies,
        "fill": fill,
        "launch_floor_us": floor_us,
        "launch_floor_device_us": floor_device_us,
        "cases": results,
        "bars": check_bars(results),
    }
    if out:
        write_json(out, payload)
    return payload


def _cell(case: dict[str, Any], key: str, width: int) -> str:
    """``case[key]`` in us, or '-' where it was not timed."""
    return f"{case[key]:{width}.2f}" if case.get(key) is not None else f"{'-':>{width}}"


def format_table(payload: dict[str, Any]) -> str:
    """The result as a text table, then the bars with PASS/MISS."""
    copy = payload["copy"]["gb_s"]
    lines = [
        f"device: {payload['provenance'].get('device', '?')}   copy ceiling (read+write): {copy:.0f} GB/s "
        f"({payload['copy']['method']}; all runs: "
        + "; ".join(", ".join(f"{k} {v:.0f}" for k, v in run.items()) for run in payload["copy_runs"]) + ")",
        f"write-only fill: {payload['fill']['gb_s']:.0f} GB/s   one-store Triton kernel under graph replay: "
        f"{payload['launch_floor_us']:.2f} us",
        "bytes = 4 * sum(ceil(L/K) + L)   (block-table entries read + 4 B written per token)",
        "",
        f"{'case':>14} {'tokens':>11} {'kernel us':>10} {'GB/s':>7} {'%copy':>6} {'serial us':>10} "
        f"{'speedup':>8} {'dense us':>9} {'fill us':>8} {'store only':>11} {'no PDL us':>10} {'after fill_':>12} "
        f"{'indptr given':>13} {'128k bound':>11} {'(default)':>10}",
    ]
    for c in payload["cases"]:
        lines.append(
            f"{c['num_reqs']:>5} x {c['seq_len']:<6} {c['tokens']:>11,} {c['kernel_us']:10.2f} {c['kernel_gb_s']:7.0f} "
            f"{100 * c['kernel_frac_copy']:5.1f}% {c['serial_us']:10.2f} {c['speedup_vs_serial']:7.1f}x "
            f"{_cell(c, 'dense_us', 9)} {_cell(c, 'fill_same_bytes_us', 8)} {_cell(c, 'store_only_us', 11)} "
            f"{_cell(c, 'kernel_no_pdl_us', 10)} {_cell(c, 'kernel_after_fill_us', 12)} "
            f"{_cell(c, 'kernel_indptr_given_us', 13)} {_cell(c, 'kernel_loose_bound_us', 11)} "
            f"{_cell(c, 'kernel_loose_bound_default_us', 10)}")
    lines += ["", f"{'bar':36} {'target':>16} {'measured':>10}  verdict"]
    for b in payload["bars"]:
        lines.append(f"{b['name']:36} {b['op'] + ' ' + format(b['target'], 'g') + ' ' + b['unit']:>16} "
                     f"{b['value']:10.3g}  {b['verdict']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# --tune: the thresholds of expand_config, re-measured
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Knob:
    """One threshold of :mod:`workbench.expand.policy` (``name``: its key in the tuned table), the values tried
    and the batches ``(num_reqs, seq_len)`` that tell them apart; ``loose``: timed under ``LOOSE_BOUND`` with
    ``loose_bound=True`` (the loose-bound rule's thresholds)."""

    name: str
    candidates: tuple[int, ...]
    cases: tuple[tuple[int, int], ...]
    loose: bool = False


MIB = 1 << 20
TUNE: tuple[Knob, ...] = (
    Knob("few_reqs", (16, 32, 64, 128, 256), ((1, 97_000), (32, 32_768), (64, 16_384), (128, 8_192), (256, 4_096))),
    Knob("max_block_t", (512, 1024, 2048), ((1, 97_000), (32, 32_768), (256, 4_096), (1_024, 1_000))),
    Knob("group_programs", (256, 512, 1024), ((2_048, 200), (4_096, 100), (8_192, 64), (16_384, 32))),
    Knob("min_per_group", (2, 4, 8), ((1_024, 200), (2_048, 200), (4_096, 100))),
    Knob("group_tile", (2048, 4096, 8192), ((2_048, 200), (8_192, 64), (16_384, 32))),
    Knob("prefix_block", (1024, 2048, 4096, 8192), ((4_096, 100), (8_192, 64), (16_384, 32))),
    Knob("broadcast_reqs", (256, 512, 1024), ((384, 1_000), (768, 900), (1_024, 1_000))),
    Knob("broadcast_min_len", (129, 257, 513), ((600, 200), (1_000, 300), (1_024, 500))),
    Knob("broadcast_max_len", (1024, 2048, 4096), ((1_536, 1_500), (1_024, 2_048), (1_536, 3_000), (1_024, 4_096))),
    Knob("streaming_store_bytes", (16 * MIB, 32 * MIB, 64 * MIB, 128 * MIB),
         ((32, 131_072), (96, 131_072), (192, 131_072), (512, 131_072))),
    Knob("loose_program_budget", (512, 1024, 2048, 4096), ((1, 97_000), (32, 32_768), (256, 4_096), (1_024, 1_000)),
         loose=True),
    Knob("loose_max_group", (8, 16, 32, 64), ((2_048, 200), (8_192, 64), (16_384, 32)), loose=True),
)


@contextlib.contextmanager
def thresholds(values: dict[str, int]) -> Iterator[None]:
    """Set the policy's module constants (``few_reqs`` -> ``FEW_REQS``, ...) to ``values`` for the block."""
    saved = {k: getattr(_policy, k.upper()) for k in values}
    try:
        for k, v in values.items():
            setattr(_policy, k.upper(), v)
        yield
    finally:
        for k, v in saved.items():
            setattr(_policy, k.upper(), v)


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def tune(knobs: tuple[Knob, ...] = TUNE, *, margin: float = 0.03, K: int = K_DEFAULT,
         command: str | None = None) -> dict[str, Any]:
    """Re-measure each knob at its candidates (one knob at a time, in order, the others at the values chosen so
    far) and return the tuned table: ``generated_by``, ``device``, ``thresholds`` (what the library reads; the
    knobs not in ``knobs`` keep their current values), and per knob the candidates' geometric-mean time relative
    to the best candidate at each case (``tune``). Most of its time is compiling each candidate's launches."""
    device = require_gpu()
    chosen = _policy.load_tuned()
    inputs: dict[tuple[int, int], tuple] = {}
    report: dict[str, Any] = {}
    for knob in knobs:
        t0 = time.perf_counter()
        candidates = tuple(sorted(set(knob.candidates) | {chosen[knob.name]}))
        us: dict[int, list[float]] = {}
        for v in candidates:
            with thresholds({**chosen, knob.name: v}):
                us[v] = []
                for R, L in knob.cases:
                    if (R, L) not in inputs:
                        bt, sl, _ = _make_inputs(R, L, K, device)
                        inputs[(R, L)] = (bt, sl, *E.expand_page_indices_dense(bt, sl, K))
                    bt, sl, want, want_indptr = inputs[(R, L)]
                    bound = LOOSE_BOUND if knob.loose else L
                    cfg = E.expand_config(R, bound, loose_bound=knob.loose)
                    out, indptr = torch.full_like(want, -1), torch.empty_like(want_indptr)
                    us[v].append(time_cuda_graph(_expansion(bt, sl, K, out, indptr, bound, cfg)))
                    if not (torch.equal(out, want) and torch.equal(indptr, want_indptr)):
                        raise RuntimeError(f"{knob.name}={v}: the expansion of {R} x {L} disagreed with the dense one")
        best = [min(us[v][i] for v in candidates) for i in range(len(knob.cases))]
        score = {v: _geomean([t / b for t, b in zip(us[v], best)]) for v in candidates}
        winner = min(score, key=score.get)
        if score[winner] < score[chosen[knob.name]] * (1 - margin):
            chosen[knob.name] = winner
        report[knob.name] = {"cases": [list(c) for c in knob.cases], "loose": knob.loose, "chosen": chosen[knob.name],
                             "relative_time": {str(v): score[v] for v in candidates},
                             "us": {str(v): us[v] for v in candidates}}
        print(f"{knob.name}: {chosen[knob.name]} ({time.perf_counter() - t0:.0f} s)", flush=True)
    p = provenance(command)
    return {"generated_by": p["command"], "device": p.get("device", "?"), "date_utc": p["date_utc"],
            "torch": p["torch"], "triton": p["triton"], "thresholds": chosen, "tune": report}


def format_tune(table: dict[str, Any]) -> str:
    """One line per knob: each candidate's relative time, the chosen value marked with '*'."""
    lines = [f"tuned on {table['device']} ({table['date_utc']}); relative time = geometric mean over the knob's cases "
             "of time / best candidate's time"]
    for name, r in table["tune"].items():
        cells = "  ".join(f"{v}{'*' if int(v) == r['chosen'] else ''} {t:.3f}" for v, t in r["relative_time"].items())
        lines.append(f"{name:22s} {cells}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The command line (``workbench bench expand`` calls add_arguments and main)
# --------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None,
                        help="JSON path (default: bench_expand.json; with --tune: expand_nvidia.json)")
    parser.add_argument("--case", action="append", type=parse_case, metavar="RxL",
                        help="batch shape, e.g. 256x4096 (repeatable; default: CASES, the bars' cases among them)")
    parser.add_argument("--no-dense", action="store_true", help="skip the slow dense torch baseline")
    parser.add_argument("--tune", action="store_true",
                        help="re-measure expand_config's thresholds (TUNE) and write the tuned table instead")
    parser.add_argument("--margin", type=float, default=0.03,
                        help="--tune keeps a threshold unless another value is this much faster (default 0.03)")
    parser.add_argument("--knob", action="append", choices=[k.name for k in TUNE],
                        help="--tune only this threshold (repeatable; default: all of TUNE; the others keep their "
                             "values)")


def main(args: argparse.Namespace) -> int:
    """Run the benchmark (or ``--tune``) and print the result; exit 0, 1 if a bar is missed, 2 without a GPU."""
    out = args.out or ("expand_nvidia.json" if args.tune else "bench_expand.json")
    try:
        if args.tune:
            knobs = tuple(k for k in TUNE if not args.knob or k.name in args.knob)
            table = tune(knobs, margin=args.margin)
            write_json(out, table)
            print(format_tune(table))
            print(f"\nwrote {out}; the library reads {_policy.TUNED_TABLE}")
            return 0
        payload = run(tuple(args.case) if args.case else CASES, dense=not args.no_dense, out=out)
    except RuntimeError as exc:  # no GPU, the interpreter forced on, or a tuned launch that disagreed
        print(f"bench expand: error: {exc}", file=sys.stderr)
        return 2
    print(format_table(payload))
    print(f"\nwrote {out}")
    return 0 if all(b["verdict"] == "PASS" for b in payload["bars"]) else 1


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
