"""The MLA decode benchmark: the workbench's decode against its ceilings and against FlashMLA, on the same cache.

    python benchmarks/decode.py [--peer-path DIR] [--repeats 7] [--points 16x1:64:32k,...] [--out F.json]
    python benchmarks/decode.py --tune [--table src/workbench/data/tuned/decode_nvidia.json] [--rules NAME ...]
    workbench bench decode ...        (the same, from the CLI)

Formulas, stated before measuring (bf16, per call, B requests of L cached tokens, qlen queries, H heads):

* bytes that must move: the KV rows, ``B * L * 576 * 2`` (q and the output are under 1 % at L >= 1k); effective
  KV-read bandwidth = that / time, against the device copy bandwidth measured in the same run (bytes read + written);
* FLOPs: ``2 * H * qlen * L * (576 + 512)`` per request (QK^T over 576 dims, PV over 512; the causal mask's saving,
  under qlen / L, is ignored); TFLOP/s against a bf16 matrix product measured in the same run.

The layout: one bf16 cache of 64-token pages (FlashMLA's page size) with a random block table per input set. The
workbench reads the flat per-token indices that PR #39616's expansion makes of that table
(:func:`workbench.expand.expand_page_indices`, K = 64); FlashMLA reads the block table. The workbench is also timed
on a token-scattered layout (every token a random row: page size 1, what aiter is handed), which FlashMLA cannot
run. Each timing is a CUDA-graph replay cycling over enough input sets (>= 256 MiB of KV) that L2 cannot hold
them; every repeat times each call twice in mirrored order (:func:`mirrored_repeats`: A B C C B A, the next repeat
C B A A B C); a point's value is the median over the repeats, a ratio the median of the per-repeat ratios. The
workbench's two layouts write into the same output buffers; FlashMLA allocates its own. Outputs of both kernels
are compared on every point.

The peer is found through ``--peer-path`` or the environment variable ``WORKBENCH_FLASHMLA`` (a folder holding
``flash_mla_dense.py``); it is never part of this repository.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from workbench import mla
from workbench.bench import common
from workbench.expand import expand_page_indices
from workbench.mla import policy

ROOT = Path(__file__).resolve().parents[1]
PAGE = 64  # FlashMLA's page size, and the kernel block size of the expansion here
KV_ROW_BYTES = mla.QK_HEAD_DIM * 2
FLOPS_PER_TOKEN_ROW = 2 * (mla.QK_HEAD_DIM + mla.KV_LORA_RANK)
L2_SPAN_BYTES = 256 << 20  # input sets per timing until their KV holds at least this much (an H200's L2: 50-60 MB)


@dataclasses.dataclass(frozen=True)
class Point:
    heads: int
    qlen: int
    batch: int
    context: int

    @property
    def rows(self) -> int:
        return self.heads * self.qlen

    @property
    def key(self) -> str:
        ctx = f"{self.context // 1024}k" if self.context % 1024 == 0 else str(self.context)
        return f"{self.heads}x{self.qlen}:{self.batch}:{ctx}"

    @property
    def kv_bytes(self) -> int:
        return self.batch * self.context * KV_ROW_BYTES

    @property
    def flops(self) -> int:
        return self.batch * self.heads * self.qlen * self.context * FLOPS_PER_TOKEN_ROW

    @property
    def peer_bar(self) -> float:
        """The bar against FlashMLA: at most 1.00x its time up to 32 rows (16 heads qlen 1-2, memory-bound), 1.10x
        from 16 heads qlen 3 and at 128 heads (compute-bound on an H200)."""
        return 1.00 if self.rows <= 32 else 1.10


def parse_point(text: str) -> Point:
    """``HxQ:B:L`` (``L`` may end in k): ``16x1:64:32k`` is 16 heads, qlen 1, 64 requests of 32768 tokens."""
    try:
        hq, b, ctx = text.split(":")
        h, q = hq.split("x")
        ctx_n = int(ctx[:-1]) * 1024 if ctx.endswith("k") else int(ctx)
        return Point(int(h), int(q), int(b), ctx_n)
    except ValueError as exc:
        raise ValueError(f"point {text!r} is not HEADSxQLEN:BATCH:CONTEXT, e.g. 16x1:64:32k") from exc


# The grid of the bars: FlashMLA's own benchmark points and the verification lengths of speculative decoding.
POINTS = [parse_point(p) for p in (
    "16x1:64:32k", "16x1:128:8k", "16x1:16:4k", "16x1:64:4k", "16x2:64:4k",
    "16x3:64:4k", "16x4:16:4k", "16x4:64:4k", "16x4:64:32k", "16x4:128:8k", "16x5:64:4k", "16x6:64:4k", "16x7:64:4k",
    "16x8:16:4k", "16x8:64:4k", "16x8:64:32k", "16x8:128:8k",
    "128x1:64:4k", "128x1:16:4k", "128x1:64:8k")]
# Bars against the ceilings measured in the same run (the workbench alone, paged layout).
CEILING_BARS = [("16x1:64:32k", "kv_fraction_of_copy", 0.90), ("16x1:128:8k", "kv_fraction_of_copy", 0.90),
                ("16x1:16:4k", "kv_gb_s", 2500.0), ("128x1:64:4k", "tflops", 300.0)]
SCATTERED_BAR = 1.05  # the token-scattered layout: at most 1.05x the workbench's own paged-64 time


def find_flashmla(path: str | None) -> Any:
    """The FlashMLA dense-decode module from ``path`` or ``$WORKBENCH_FLASHMLA`` (imported: the first import builds
    it, about 90 s on an H200 host), or None with no path. A path without ``flash_mla_dense.py`` is an error."""
    path = path or os.environ.get("WORKBENCH_FLASHMLA")
    if not path:
        return None
    folder = Path(path)
    if not (folder / "flash_mla_dense.py").exists():
        raise FileNotFoundError(f"--peer-path {folder}: no flash_mla_dense.py there (the folder of FlashMLA's dense "
                                "decode peer, e.g. .peer/flashmla)")
    sys.path.insert(0, str(folder))
    return importlib.import_module("flash_mla_dense")


class Inputs:
    """Input sets for one point on one shared cache of 64-token pages: per set a random block table (distinct pages),
    the flat per-token indices the expansion makes of it, a token-scattered index list, q and the outputs."""

    def __init__(self, cache: torch.Tensor, point: Point, sets: int, seed: int):
        dev, dtype = cache.device, cache.dtype
        self.point, self.cache = point, cache
        g = torch.Generator(device=dev).manual_seed(seed)
        B, L, H, Q = point.batch, point.context, point.heads, point.qlen
        pages = -(-L // PAGE)
        self.seq_lens = torch.full((B,), L, dtype=torch.int32, device=dev)
        self.qo_indptr = torch.arange(0, B * Q + 1, Q, dtype=torch.int32, device=dev)
        self.kv_indptr = torch.arange(0, B * L + 1, L, dtype=torch.int32, device=dev)
        num_blocks = cache.shape[0]
        self.sets = []
        for _ in range(sets):
            blocks = torch.randperm(num_blocks - 1, generator=g, device=dev)[:B * pages] + 1  # block 0 never used
            table = blocks.view(B, pages).to(torch.int32)
            flat, _ = expand_page_indices(table, self.seq_lens, PAGE)
            scattered = (torch.randperm((num_blocks - 1) * PAGE, generator=g, device=dev)[:B * L] + PAGE).to(torch.int32)
            q = torch.randn(B * Q, H, mla.QK_HEAD_DIM, generator=g, device=dev, dtype=torch.float32).to(dtype)
            self.sets.append(dict(table=table, flat=flat, scattered=scattered, q=q,
                                  out=torch.empty(B * Q, H, mla.KV_LORA_RANK, dtype=dtype, device=dev),
                                  peer_out=None, meta=None))


def n_sets(point: Point) -> int:
    return max(1, min(8, math.ceil(L2_SPAN_BYTES / point.kv_bytes)))


def workbench_call(x: Inputs, layout: str, config: mla.TritonConfig | None = None) -> tuple[Callable[[], None], str]:
    """One call per input set of the workbench's decode (the library's own choice unless ``config``), and the label
    of the config it runs."""
    p = x.point
    flat_cache = x.cache.view(-1, mla.QK_HEAD_DIM)
    s0 = x.sets[0]
    # one call with the library's choice first: on a GPU with less shared memory it steps down, and the plan
    # below is then the config that fitted
    mla.mla_decode_triton(s0["q"], flat_cache, x.qo_indptr, x.kv_indptr, s0[layout], p.qlen, config=config,
                          out=s0["out"])
    cfg, splits = mla.triton_launch_plan(s0["q"], x.qo_indptr, s0[layout], p.qlen, config=config)

    def run():
        for s in x.sets:
            mla.mla_decode_triton(s["q"], flat_cache, x.qo_indptr, x.kv_indptr, s[layout], p.qlen, num_splits=splits,
                                  config=cfg, out=s["out"])

    return run, f"{cfg.label}, {splits} split{'s' if splits > 1 else ''}"


def peer_call(fm: Any, x: Inputs) -> Callable[[], None]:
    """One call per input set of FlashMLA (its scheduler metadata computed beforehand, as vLLM does)."""
    p = x.point
    causal = p.qlen > 1
    for s in x.sets:
        s["meta"] = fm.precompute_mla_metadata(x.seq_lens, p.qlen, p.heads, 1, causal=causal)
    outs: list[torch.Tensor] = []

    def run():
        outs.clear()
        for s in x.sets:
            o, _ = fm.flash_mla_with_kvcache(s["q"].view(p.batch, p.qlen, p.heads, mla.QK_HEAD_DIM), x.cache,
                                              s["table"], x.seq_lens, mla.KV_LORA_RANK, s["meta"],
                                              softmax_scale=mla.default_sm_scale(), causal=causal)
            outs.append(o)

    run.outputs = outs  # type: ignore[attr-defined]
    return run


def timed(fn: Callable[[], None], calls: int) -> float:
    """Median microseconds per decode call of ``fn`` (``calls`` decode calls) under CUDA-graph replay, the graph
    sized to a few milliseconds."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    est_us = max(start.elapsed_time(end) * 1e3, 1.0)
    reps = int(min(20, max(1, 3000 // est_us)))
    return common.time_cuda_graph(fn, graph_reps=reps, repeats=10 if est_us < 1000 else 5, warmup=1) / calls


def mirrored_repeats(calls: dict[str, Callable[[], None]], repeats: int, per: int,
                     timer: Callable[[Callable[[], None], int], float] | None = None) -> list[dict[str, float]]:
    """``repeats`` repeats, each timing every call twice in mirrored order (A B C C B A; the next repeat starts from
    the other end, C B A A B C) and keeping the mean of each call's two times, so that a drift within a repeat
    (clocks, L2 state) weighs on all alike. ``per``: decode calls per timed call. The one timing loop of the
    benchmarks (this file and compare.py)."""
    timer = timer or timed
    out = []
    for r in range(repeats):
        names = list(calls) if r % 2 == 0 else list(calls)[::-1]
        times: dict[str, list[float]] = {n: [] for n in names}
        for n in names + names[::-1]:
            times[n].append(timer(calls[n], per))
        out.append({n: statistics.fmean(t) for n, t in times.items()})
    return out


def _max_ulp(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference of ``a`` and ``b`` in units of ``b``'s bf16 spacing (at least one ulp of 1e-3)."""
    eps = torch.finfo(b.dtype).eps
    return float(((a.float() - b.float()).abs() / (eps * b.float().abs().clamp_min(1e-3))).max())


def golden_error(x: Inputs, out: torch.Tensor, reqs: int = 2) -> float:
    """Max abs error of ``out`` against the fp32 golden on the first ``reqs`` requests of input set 0."""
    p, s = x.point, x.sets[0]
    n_q, n_k = reqs * p.qlen, reqs * p.context
    gold, _ = mla.mla_decode_ref(s["q"][:n_q], x.cache.view(-1, mla.QK_HEAD_DIM), x.qo_indptr[:reqs + 1],
                                 x.kv_indptr[:reqs + 1], s["flat"][:n_k])
    return float((out[:n_q].float() - gold).abs().max())


def measure(point: Point, cache: torch.Tensor, fm: Any, repeats: int, log=print, sets: int | None = None,
            timer: Callable[[Callable[[], None], int], float] | None = None) -> dict[str, Any]:
    """Every timing of one point: the workbench on the paged layout and on the scattered one, FlashMLA on the paged
    one, in ``repeats`` mirrored repeats; the outputs compared. (``sets`` and ``timer``: for tests on CPU.)"""
    timer = timer or timed
    x = Inputs(cache, point, sets or n_sets(point), seed=point.heads * 7919 + point.qlen * 101 + point.batch)
    sets = len(x.sets)
    wb, label = workbench_call(x, "flat")
    wb_scat, label_scat = workbench_call(x, "scattered")
    calls: dict[str, Callable[[], None]] = {"workbench": wb, "scattered": wb_scat}
    if fm is not None:
        calls["flashmla"] = peer_call(fm, x)
    row: dict[str, Any] = dict(heads=point.heads, qlen=point.qlen, batch=point.batch, context=point.context,
                               key=point.key, input_sets=sets, config=label, config_scattered=label_scat)
    # correctness: the workbench (both layouts) against the golden, FlashMLA against the workbench
    wb()
    row["golden_max_abs_err"] = golden_error(x, x.sets[0]["out"])
    flat_out = x.sets[0]["out"].clone()
    wb_scat()  # the scattered layout reads other rows: check it against its own golden
    s0 = x.sets[0]
    n_q, n_k = 2 * point.qlen, 2 * point.context
    gold_s, _ = mla.mla_decode_ref(s0["q"][:n_q], cache.view(-1, mla.QK_HEAD_DIM), x.qo_indptr[:3], x.kv_indptr[:3],
                                   s0["scattered"][:n_k])
    row["scattered_golden_max_abs_err"] = float((s0["out"][:n_q].float() - gold_s).abs().max())
    if fm is not None:
        calls["flashmla"]()
        if cache.is_cuda:
            torch.cuda.synchronize()
        peer_out = calls["flashmla"].outputs[0].reshape(flat_out.shape)  # type: ignore[attr-defined]
        row["flashmla_golden_max_abs_err"] = golden_error(x, peer_out)
        row["vs_flashmla_max_ulp"] = _max_ulp(flat_out, peer_out)
    per_repeat = mirrored_repeats(calls, repeats, sets, timer)
    for name in calls:
        row[f"{name}_us"] = statistics.median(t[name] for t in per_repeat)
    row["repeats"] = per_repeat
    row["scattered_ratio"] = statistics.median(t["scattered"] / t["workbench"] for t in per_repeat)
    if fm is not None:
        row["ratio"] = statistics.median(t["workbench"] / t["flashmla"] for t in per_repeat)
        row["ratio_range"] = [min(t["workbench"] / t["flashmla"] for t in per_repeat),
                              max(t["workbench"] / t["flashmla"] for t in per_repeat)]
    us = row["workbench_us"]
    row.update(kv_gb_s=point.kv_bytes / (us * 1e-6) / 1e9, tflops=point.flops / (us * 1e-6) / 1e12,
               intensity_flop_per_byte=point.flops / point.kv_bytes)
    if fm is not None:
        row.update(flashmla_kv_gb_s=point.kv_bytes / (row["flashmla_us"] * 1e-6) / 1e9,
                   flashmla_tflops=point.flops / (row["flashmla_us"] * 1e-6) / 1e12)
    log(f"{point.key:>12} {us:9.1f} us {row['kv_gb_s']:7.0f} GB/s {row['tflops']:6.0f} TF/s | scattered "
        f"{row['scattered_ratio']:.3f}x" + (f" | FlashMLA {row['flashmla_us']:9.1f} us ratio {row['ratio']:.3f} "
                                             f"({row['vs_flashmla_max_ulp']:.1f} ulp)" if fm is not None else "")
        + f"  [{label}]")
    del x
    return row


def evaluate_bars(rows: list[dict[str, Any]], ceilings: dict[str, Any]) -> list[dict[str, Any]]:
    """Every bar with its measured value, target and verdict: one per point against FlashMLA, one per point for the
    scattered layout, and the ceiling bars. A bar whose measurement is missing is MISS with the reason."""
    by_key = {r["key"]: r for r in rows}
    bars = []
    for p in POINTS:
        r = by_key.get(p.key)
        name = f"{p.key}: time <= {p.peer_bar:.2f}x FlashMLA's (same cache, same run)"
        value = r.get("ratio") if r else None
        bars.append(dict(name=name, kind="flashmla_ratio", point=p.key, value=value, target=p.peer_bar,
                         verdict="PASS" if value is not None and value <= p.peer_bar else "MISS",
                         note="" if value is not None else ("point not measured" if r is None else "FlashMLA not run")))
    for p in POINTS:
        r = by_key.get(p.key)
        value = r.get("scattered_ratio") if r else None
        bars.append(dict(name=f"{p.key}: token-scattered layout <= {SCATTERED_BAR:.2f}x the paged-64 time",
                         kind="scattered_ratio", point=p.key, value=value, target=SCATTERED_BAR,
                         verdict="PASS" if value is not None and value <= SCATTERED_BAR else "MISS",
                         note="" if value is not None else "point not measured"))
    copy = ceilings.get("copy", {}).get("gb_s")
    for key, kind, target in CEILING_BARS:
        r = by_key.get(key)
        value = None
        if r is not None:
            value = {"kv_fraction_of_copy": r["kv_gb_s"] / copy if copy else None, "kv_gb_s": r["kv_gb_s"],
                     "tflops": r["tflops"]}[kind]
        text = {"kv_fraction_of_copy": f"KV bandwidth >= {target:.0%} of copy", "kv_gb_s": f"KV bandwidth >= "
                f"{target / 1000:.1f} TB/s", "tflops": f">= {target:.0f} TFLOP/s"}[kind]
        bars.append(dict(name=f"{key}: {text}", kind=kind, point=key, value=value, target=target,
                         verdict="PASS" if value is not None and value >= target else "MISS",
                         note="" if value is not None else "point not measured"))
    return bars


def ceilings() -> dict[str, Any]:
    """The copy bandwidth and the bf16 matrix-product rate, measured here (the matmul first: it takes the clocks
    out of idle, which an idle-first copy would report as the ceiling)."""
    return {"matmul_bf16": common.matmul_rate(), "copy": common.copy_bandwidth()}


def make_cache(points: list[Point], dev: torch.device, seed: int = 0, dtype: torch.dtype = torch.bfloat16,
               sets: Callable[[Point], int] | None = None) -> torch.Tensor:
    """One random cache of 64-token pages, ``(num_blocks, 64, 1, 576)``, large enough for every point's sets."""
    sets = sets or n_sets
    tokens = max(sets(p) * p.batch * -(-p.context // PAGE) * PAGE for p in points)
    num_blocks = tokens // PAGE + 64
    g = torch.Generator(device=dev).manual_seed(seed)
    return torch.randn(num_blocks, PAGE, 1, mla.QK_HEAD_DIM, generator=g, device=dev, dtype=torch.float32).to(dtype)


def run(points: list[Point], *, peer_path: str | None, repeats: int, log=print) -> dict[str, Any]:
    dev = common.require_gpu()
    fm = find_flashmla(peer_path)
    t0 = time.time()
    ceil = ceilings()
    log(f"copy {ceil['copy']['gb_s']:.0f} GB/s, bf16 matmul {ceil['matmul_bf16']['tflops']:.0f} TFLOP/s; "
        f"FlashMLA {'loaded' if fm is not None else 'not given (--peer-path or WORKBENCH_FLASHMLA)'}")
    cache = make_cache(points, dev)
    rows = [measure(p, cache, fm, repeats, log) for p in points]
    end_copy = common.copy_bandwidth()
    if end_copy["gb_s"] > ceil["copy"]["gb_s"]:
        ceil["copy"] = end_copy  # the ceiling is the best seen, at the start or the end
    return dict(benchmark="mla_decode", provenance=common.provenance(), repeats=repeats, seconds=time.time() - t0,
                peer="FlashMLA dense decode (deepseek-ai/FlashMLA), built from the folder given" if fm else None,
                formulas={"kv_bytes": "batch * context * 576 * 2",
                          "flops": "batch * 2 * heads * qlen * context * (576 + 512)",
                          "ratio": "median over the repeats of workbench_us / flashmla_us (each repeat times both)"},
                layout=f"one bf16 cache of {PAGE}-token pages; random block tables; the workbench reads the "
                       f"expansion's flat indices (K = {PAGE}), or a token-scattered index list",
                ceilings=ceil, results=rows, bars=evaluate_bars(rows, ceil))


# ----------------------------------------------------------------------------------------------
# tune: re-measure the candidates of each rule of a tuned table at the rule's points
# ----------------------------------------------------------------------------------------------


def candidates(rule: dict[str, Any]) -> list[mla.TritonConfig]:
    """The configs the tune command tries for a rule: for a Triton rule its row block with every tile, warp count,
    pipeline depth, residency and index/partial switch of the grid below; for a Gluon rule the kernels of its row
    class (the swapped kernel's row block is fixed by the rule; both 64-row kernels)."""
    cfg: mla.TritonConfig = rule["_config"]
    fp32 = rule["when"].get("fp32", False)
    if cfg.kernel == "gluon_swap":
        return [cfg]
    if cfg.kernel in ("gluon", "gluon_ws"):
        base = dict(block_m=64, programs_per_sm=1, pdl=True)
        return [mla.TritonConfig(kernel="gluon", block_n=64, num_warps=8, num_stages=2, **base),
                mla.TritonConfig(kernel="gluon_ws", block_n=64, num_warps=12, num_stages=2, **base)]
    out = []
    for block_n in (32, 64):
        for warps in (4, 8):
            for stages in (2, 3):
                for pps in (1, 2):
                    for ahead in (False, True):
                        for narrow in ((False,) if fp32 else (False, True)):
                            out.append(mla.TritonConfig(block_m=cfg.block_m, block_n=block_n, num_warps=warps,
                                                        num_stages=stages, programs_per_sm=pps, idx_ahead=ahead,
                                                        pdl=cfg.pdl, narrow_partials=narrow))
    return out


def tune(table_path: str, rule_names: list[str] | None, repeats: int, log=print) -> dict[str, Any]:
    """Time every candidate of each chosen rule (all rules with points by default) at the rule's points and write
    the fastest by geometric mean into the table (only after it matches the golden)."""
    dev = common.require_gpu()
    family = Path(table_path).stem.removeprefix("decode_")
    table = json.loads(Path(table_path).read_text())
    parsed = policy.tuned_table(family)["rules"]
    names = rule_names or [r["name"] for r in table["rules"] if r["points"]]
    unknown = set(names) - {r["name"] for r in table["rules"]}
    if unknown:
        raise ValueError(f"--rules {sorted(unknown)}: no such rule in {table_path}")
    points = {n: [Point(*p) for p in next(r["points"] for r in table["rules"] if r["name"] == n)] for n in names}
    report = []
    for rule, parsed_rule in zip(table["rules"], parsed):
        if rule["name"] not in names:
            continue
        dtype = torch.float32 if rule["when"].get("fp32", False) else torch.bfloat16
        cache = make_cache(points[rule["name"]], dev, dtype=dtype)
        scores = []
        for cfg in candidates(parsed_rule):
            times = []
            try:
                for p in points[rule["name"]]:
                    x = Inputs(cache, p, n_sets(p), seed=p.batch)
                    fn, _ = workbench_call(x, "flat", cfg)
                    times.append(statistics.median(timed(fn, len(x.sets)) for _ in range(repeats)))
                    if golden_error(x, x.sets[0]["out"]) > 0.05:
                        raise RuntimeError("does not match the golden")
            except Exception as exc:  # noqa: BLE001 - a candidate that does not fit or fails is skipped, with why
                log(f"  {rule['name']}: {cfg.label} skipped ({type(exc).__name__}: {str(exc)[:80]})")
                continue
            gmean = math.exp(sum(math.log(t) for t in times) / len(times))
            scores.append((gmean, cfg, times))
            log(f"  {rule['name']}: {cfg.label} pps{cfg.programs_per_sm} {gmean:.1f} us")
        if not scores:
            raise RuntimeError(f"no candidate of rule {rule['name']!r} ran")
        best = min(scores, key=lambda s: s[0])[1]
        rule["config"] = {k: v for k, v in dataclasses.asdict(best).items()
                          if v != getattr(mla.TritonConfig(), k) or k == "kernel"}
        report.append(dict(rule=rule["name"], chosen=best.label, tried=len(scores)))
        del cache
    prov = common.provenance()
    table["measured_on"] = f"{prov.get('device')} ({prov.get('sm_count')} SMs), torch {prov['torch']}, " \
                           f"Triton {prov['triton']}, bf16"
    Path(table_path).write_text(json.dumps(table, indent=1) + "\n")
    return dict(table=table_path, report=report, provenance=prov)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="bench_decode.json", help="where the JSON goes (default bench_decode.json)")
    parser.add_argument("--peer-path", default=None,
                        help="folder of FlashMLA's dense decode peer (default: $WORKBENCH_FLASHMLA; none: no peer)")
    parser.add_argument("--repeats", type=int, default=7,
                        help="mirrored repeats per point (median; default 7)")
    parser.add_argument("--points", default=None,
                        help="comma-separated HEADSxQLEN:BATCH:CONTEXT, e.g. 16x1:64:32k (default: the bars' grid)")
    parser.add_argument("--tune", action="store_true",
                        help="instead: re-measure the candidates of a tuned table's rules at their points, rewrite it")
    parser.add_argument("--table", default=str(ROOT / "src/workbench/data/tuned/decode_nvidia.json"),
                        help="--tune: the table (default: the NVIDIA one)")
    parser.add_argument("--rules", nargs="*", default=None, help="--tune: rule names (default: every rule with points)")


def main(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise ValueError(f"--repeats is {args.repeats}; it must be at least 1")
    if args.tune:
        report = tune(args.table, args.rules, min(args.repeats, 3))
        print(json.dumps(report["report"], indent=1))
        print(f"rewrote {args.table}")
        return 0
    points = [parse_point(p) for p in args.points.split(",")] if args.points else POINTS
    payload = run(points, peer_path=args.peer_path, repeats=args.repeats)
    path = common.write_json(args.out, payload)
    for b in payload["bars"]:
        v = "not measured" if b["value"] is None else f"{b['value']:.3g}"
        print(f"[{b['verdict']}] {b['name']}: {v}" + (f" ({b['note']})" if b["note"] else ""))
    print(f"wrote {path}")
    return 0 if all(b["verdict"] == "PASS" for b in payload["bars"]) else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))
