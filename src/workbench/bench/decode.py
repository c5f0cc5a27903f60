"""``workbench bench decode``: the Triton MLA decode against the torch path and the copy ceiling.

Formulas, stated before measuring (bf16, per call, B requests of L cached tokens, qlen queries, H heads):

* bytes that must move: the KV rows, ``B * L * 576 * 2`` (q and the output are under 1 % at L >= 1k);
  effective KV-read bandwidth = that / time, compared with the device-to-device copy bandwidth
  measured in the same run (bytes read + written; the largest of three methods, :func:`workbench.bench.common.copy_bandwidth`);
* FLOPs: ``2 * H * qlen * L * (576 + 512)`` per request (QK^T over 576 dims, PV over 512; the causal
  mask's saving, under qlen/L, is ignored); TFLOP/s compared with a bf16 matrix product measured in
  the same run.

Timing: CUDA-graph replay (:func:`workbench.bench.common.time_cuda_graph`), median, graph length
chosen so one replay takes about 2 ms. Inputs are random; cache rows are handed out in a random
permutation of a large cache, as a serving cache would be. Nothing here imports plotly.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from workbench import mla
from workbench.bench import common

__all__ = ["BARS", "RATIO_ROUNDS", "compare_layouts", "evaluate_bars", "explore_best", "main", "make_inputs",
           "measure_point", "point_call", "ratio_rounds", "run", "variant_probe"]

KV_ROW_BYTES = mla.QK_HEAD_DIM * 2  # one bf16 cache row
FLOPS_PER_TOKEN_HEAD = 2 * (mla.QK_HEAD_DIM + mla.KV_LORA_RANK)  # per query row and key

# The sweep: (heads, qlen, batch, context).
MAIN_GRID = [(h, 1, b, l) for h in (16, 128) for b in (1, 16, 64, 128) for l in (1024, 4096, 8192, 32768)]
QLEN_PAIRS = [(16, 4096), (64, 4096), (64, 32768), (128, 8192)]
QLEN_GRID = [(16, q, b, l) for q in (2, 4, 6, 8) for b, l in QLEN_PAIRS] + [(128, q, 64, 4096) for q in (2, 4, 6, 8)]
# the gluon config as rounds 20-31 ran it: fp32 partials stored from the wgmma accumulator layout (round 32 changed it)
GLUON_BEFORE_ROUND32 = dataclasses.replace(mla.GLUON_CONFIG, narrow_partials=False, coalesced_store=False)


@dataclasses.dataclass(frozen=True)
class Bar:
    name: str
    kind: str  # "kv_fraction_of_copy" | "kv_gb_s" | "tflops" | "qlen_time_ratio"
    heads: int
    batch: int
    context: int
    target: float
    qlen: int = 1


BARS = [
    Bar("16 heads qlen 1 B=64 L=32k: KV bandwidth >= 90% of copy", "kv_fraction_of_copy", 16, 64, 32768, 0.90),
    Bar("16 heads qlen 1 B=128 L=8k: KV bandwidth >= 90% of copy", "kv_fraction_of_copy", 16, 128, 8192, 0.90),
    Bar("16 heads qlen 1 B=16 L=4k: KV bandwidth >= 2.5 TB/s", "kv_gb_s", 16, 16, 4096, 2500.0),
    Bar("128 heads qlen 1 B=64 L=4k: >= 300 TFLOP/s", "tflops", 128, 64, 4096, 300.0),
] + [
    Bar(f"16 heads qlen {q} B={b} L={l // 1024}k: time <= 1.25x qlen 1", "qlen_time_ratio", 16, b, l, 1.25, q)
    for q in (4, 8) for b, l in QLEN_PAIRS
]
# --quick: the points the bars need (each bar's point, and the qlen-1 point a ratio bar divides by)
QUICK_GRID = list(dict.fromkeys(p for bar in BARS for p in ((bar.heads, 1, bar.batch, bar.context),
                                                             (bar.heads, bar.qlen, bar.batch, bar.context))))


# ----------------------------------------------------------------------------------------------
# inputs and one measurement
# ----------------------------------------------------------------------------------------------


class CachePool:
    """One large random cache shared by every point. Rows are handed out in a random permutation, in runs of
    ``run`` consecutive rows: ``run=1`` scatters every token (the worst case for DRAM locality, a cache whose
    pages hold one token), ``run=16`` keeps each 16-token block contiguous, as vLLM lays out a cache of
    16-token blocks that aiter then addresses token by token (the layout after PR #39616)."""

    def __init__(self, max_rows: int, dtype: torch.dtype, device: torch.device, seed: int = 0, run: int = 1):
        self.run = run
        g = torch.Generator(device=device).manual_seed(seed)
        self.cache = torch.randn(max_rows + 1, mla.QK_HEAD_DIM, generator=g, device=device, dtype=torch.float32
                                 ).to(dtype) if device.type == "cpu" else \
            torch.randn(max_rows + 1, mla.QK_HEAD_DIM, generator=g, device=device, dtype=dtype)
        self.gen = g
        self.device = device

    def indices(self, n: int) -> torch.Tensor:
        rows = self.cache.shape[0] - 1
        if self.run == 1:
            perm = torch.randperm(rows, generator=self.gen, device=self.device)[:n]
        else:
            blocks = torch.randperm(rows // self.run, generator=self.gen, device=self.device)[:-(-n // self.run)]
            perm = (blocks[:, None] * self.run + torch.arange(self.run, device=self.device)).flatten()[:n]
        return (perm + 1).to(torch.int32)  # row 0 never used


def make_inputs(pool: CachePool, heads: int, qlen: int, batch: int, context: int, seed: int = 0) -> dict[str, Any]:
    """q ``(batch*qlen, heads, 576)``, the cache, and uniform aiter-style offsets over permuted rows."""
    dev, dtype = pool.device, pool.cache.dtype
    g = torch.Generator(device=dev).manual_seed(seed)
    q = torch.randn(batch * qlen, heads, mla.QK_HEAD_DIM, generator=g, device=dev, dtype=torch.float32).to(dtype)
    return dict(
        q=q, kv_cache=pool.cache,
        qo_indptr=torch.arange(0, batch * qlen + 1, qlen, dtype=torch.int32, device=dev),
        kv_indptr=torch.arange(0, batch * context + 1, context, dtype=torch.int32, device=dev),
        kv_indices=pool.indices(batch * context),
    )


def _graph_timer(fn: Callable[[], Any]) -> float:
    """Median microseconds per call under CUDA-graph replay, graph length sized to ~2 ms per replay."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    est_us = max(start.elapsed_time(end) * 1e3, 1.0)
    reps = int(min(50, max(1, 2000 // est_us)))
    repeats = 30 if est_us < 500 else 10
    return common.time_cuda_graph(fn, graph_reps=reps, repeats=repeats, warmup=2)


def _eager_timer(fn: Callable[[], Any]) -> float:
    return common.time_eager(fn, reps=3, repeats=5, warmup=1)


def point_call(pool: CachePool, heads: int, qlen: int, batch: int, context: int, *,
               config: mla.TritonConfig | None = None) -> tuple[Callable[[], Any], mla.TritonConfig, int, dict[str, Any]]:
    """The Triton decode at one point as a no-argument call (inputs and output allocated once), with the config
    and split count it runs (the library's choice unless ``config`` is given) and its inputs."""
    x = make_inputs(pool, heads, qlen, batch, context, seed=heads * 1000 + qlen * 100 + batch)
    out = torch.empty(batch * qlen, heads, mla.KV_LORA_RANK, dtype=x["q"].dtype, device=pool.device)
    if config is None:
        # one call with the library's own choice first: on a GPU with less shared memory than an H200 it steps
        # down to a config that fits (mla.shared_memory_ladder), and the plan below is then that one
        mla.mla_decode_triton(x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], qlen, out=out)
    cfg, splits = mla.triton_launch_plan(x["q"], x["qo_indptr"], x["kv_indices"], qlen, config=config)

    def run_triton():
        return mla.mla_decode_triton(x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], qlen,
                                     None, num_splits=splits, config=cfg, out=out)

    return run_triton, cfg, splits, x


def measure_point(pool: CachePool, heads: int, qlen: int, batch: int, context: int, *,
                  config: mla.TritonConfig | None = None, timer: Callable[[Callable[[], Any]], float] = _graph_timer,
                  torch_timer: Callable[[Callable[[], Any]], float] | None = None,
                  torch_mem_limit: float = 6e9) -> dict[str, Any]:
    """Time the Triton decode (and, if ``torch_timer`` is given and it fits, the torch path) at one point."""
    run_triton, cfg, splits, x = point_call(pool, heads, qlen, batch, context, config=config)
    us = timer(run_triton)
    kv_bytes = batch * context * KV_ROW_BYTES
    flops = batch * heads * qlen * context * FLOPS_PER_TOKEN_HEAD
    row = dict(heads=heads, qlen=qlen, batch=batch, context=context, num_splits=splits,
               config=dataclasses.asdict(cfg), triton_us=us, kv_gb_s=kv_bytes / (us * 1e-6) / 1e9,
               tflops=flops / (us * 1e-6) / 1e12, intensity_flop_per_byte=flops / kv_bytes)
    torch_bytes = batch * context * KV_ROW_BYTES + batch * qlen * heads * context * 4 * 3
    if torch_timer is not None and torch_bytes <= torch_mem_limit:
        def run_torch():
            return mla.mla_decode_torch(x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"],
                                        None, qlen, context)
        t_us = torch_timer(run_torch)
        row.update(torch_us=t_us, torch_kv_gb_s=kv_bytes / (t_us * 1e-6) / 1e9, speedup_vs_torch=t_us / us)
    return row


# The qlen-ratio bars divide two timings. The sweep takes each once, apart (the qlen-1 grid first, the qlen grid
# later), and one timing can stray: in the sixteenth session's run the sweep timed the B=16 L=4k qlen-4 call at
# 37.8 us against 34.8-35.3 in the paired rounds after it on the same machine (not a clock effect: the clock
# probe, explore.clock_probe, read 1980 MHz throughout). Each ratio bar is therefore also measured in
# RATIO_ROUNDS paired rounds: in each, both calls are timed back to back (the order alternating from round to
# round), and the bar's value is the median of the per-round ratios; every round is kept in the JSON beside the
# sweep's own ratio.
RATIO_ROUNDS = 7


def ratio_rounds(pool: CachePool, bar: Bar, *, config_for: Callable[[int], mla.TritonConfig | None],
                 timer: Callable[[Callable[[], Any]], float] = _graph_timer,
                 rounds: int = RATIO_ROUNDS) -> list[dict[str, Any]]:
    """``rounds`` paired timings of a ``qlen_time_ratio`` bar: per round the qlen-1 call and the qlen-``q`` call at
    the bar's batch and context, back to back, qlen 1 first in even rounds and second in odd ones."""
    if bar.kind != "qlen_time_ratio":
        raise ValueError(f"bar.kind is {bar.kind!r}; paired rounds are for 'qlen_time_ratio' bars")
    if rounds < 1:
        raise ValueError(f"rounds is {rounds}; it must be at least 1")
    base, *_ = point_call(pool, bar.heads, 1, bar.batch, bar.context, config=config_for(bar.heads))
    call, *_ = point_call(pool, bar.heads, bar.qlen, bar.batch, bar.context, config=config_for(bar.heads * bar.qlen))
    out = []
    for rnd in range(rounds):
        if rnd % 2 == 0:
            base_us = timer(base)
            us = timer(call)
        else:
            us = timer(call)
            base_us = timer(base)
        out.append(dict(round=rnd, qlen1_us=base_us, us=us, ratio=us / base_us))
    return out


# ----------------------------------------------------------------------------------------------
# tuning: a few launch configurations per regime, scored at the bar points
# ----------------------------------------------------------------------------------------------

# (block_m, block_n, warps, stages, programs per SM or None = from the compiled kernel)
MEM_CANDIDATES = [(16, 64, 4, 2, None), (16, 32, 4, 2, None), (16, 32, 4, 3, None), (16, 64, 8, 5, None)]
MEM_POINTS = [(16, 1, 16, 4096), (16, 1, 64, 32768), (16, 1, 128, 8192), (16, 1, 64, 4096)]
COMPUTE_CANDIDATES = [(64, 64, 8, 3, None), (64, 32, 8, 5, None), (32, 64, 4, 2, None), (64, 64, 8, 2, None)]
COMPUTE_POINTS = [(128, 1, 64, 4096), (16, 4, 64, 4096), (16, 8, 64, 4096), (16, 8, 64, 32768)]
MID_CANDIDATES = [(32, 64, 4, 2, None), (32, 32, 4, 2, None), (64, 64, 8, 3, None)]
MID_POINTS = [(16, 2, 64, 4096), (16, 2, 64, 32768), (16, 2, 16, 4096)]


def _score(configs: list[mla.TritonConfig], points, pool, timer, log) -> tuple[mla.TritonConfig, list[dict]]:
    """Time every config at every point; pick the one with the smallest geometric mean of time / best."""
    table: list[dict] = []
    times: dict[int, list[float]] = {}
    for ci, cfg in enumerate(configs):
        ts = []
        for (h, q, b, l) in points:
            try:
                r = measure_point(pool, h, q, b, l, config=cfg, timer=timer)
                ts.append(r["triton_us"])
                table.append(dict(config=dataclasses.asdict(cfg), heads=h, qlen=q, batch=b, context=l,
                                  us=r["triton_us"], kv_gb_s=r["kv_gb_s"], tflops=r["tflops"],
                                  num_splits=r["num_splits"], kernel=mla.compiled_kernel_report()))
            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: record and skip the config
                table.append(dict(config=dataclasses.asdict(cfg), error=f"{type(exc).__name__}: {str(exc)[:200]}"))
                ts = []
                break
        if ts:
            times[ci] = ts
            k = mla.compiled_kernel_report()
            log(f"  tune {cfg.block_m:3d}x{cfg.block_n:3d} w{cfg.num_warps} s{cfg.num_stages} "
                f"fused {int(cfg.fused_merge)} res {cfg.resident_per_sm()}: " + " ".join(f"{t:8.1f}" for t in ts)
                + f" us  [regs {k.get('n_regs')} spills {k.get('n_spills')} smem {k.get('shared_bytes')} "
                f"wgmma {k.get('wgmma')} mma.sync {k.get('mma_sync')} cp.async {k.get('cp_async')}]")
    if not times:
        raise RuntimeError("no tuning candidate ran")
    best_per_point = [min(ts[i] for ts in times.values()) for i in range(len(points))]

    def geo(ci):
        return math.exp(sum(math.log(t / bp) for t, bp in zip(times[ci], best_per_point)) / len(points))

    return configs[min(times, key=geo)], table


def tune(pool: CachePool, timer, log) -> tuple[dict[str, mla.TritonConfig], list[dict]]:
    """Pick one launch configuration per regime (rows per request <= 16, <= 32, > 32)."""
    mem = [mla.TritonConfig(bm, bn, w, st, programs_per_sm=r, fused_merge=f, merge_overhead_tokens=0 if f else 128,
                            merge_tokens_per_split=2 * bm if f else 4)
           for bm, bn, w, st, r in MEM_CANDIDATES for f in (False, True)]
    compute = [mla.TritonConfig(bm, bn, w, st, programs_per_sm=r) for bm, bn, w, st, r in COMPUTE_CANDIDATES]
    mid = [mla.TritonConfig(bm, bn, w, st, programs_per_sm=r) for bm, bn, w, st, r in MID_CANDIDATES]
    chosen, table = {}, []
    for name, cands, pts in (("mem", mem, MEM_POINTS), ("mid", mid, MID_POINTS), ("compute", compute, COMPUTE_POINTS)):
        log(f"tuning '{name}' over {len(cands)} configurations at {len(pts)} points")
        best, t = _score(cands, pts, pool, timer, log)
        chosen[name] = best
        table += [dict(regime=name, **row) for row in t]
        log(f"  -> {name}: {best}")
    return chosen, table


def _config_for(chosen: dict[str, mla.TritonConfig] | None, rows: int) -> mla.TritonConfig | None:
    if not chosen:
        return None
    return chosen["mem"] if rows <= 16 else chosen["mid"] if rows <= 32 else chosen["compute"]


# ----------------------------------------------------------------------------------------------
# parallel compilation, and a focused sweep with forced split counts
# ----------------------------------------------------------------------------------------------


def _compile_one(job: tuple[mla.TritonConfig, int, int, int, int]) -> str:
    """Worker: run one (config, heads, qlen, batch, num_splits) launch on a tiny context, so that Triton
    compiles exactly the specialisations the timed run will use (they depend on the config, the head count
    and the divisibility of ``batch * qlen * heads`` and ``num_splits``, not on the context length)."""
    cfg, heads, qlen, batch, splits = job
    dev = common.require_gpu()
    context = max(qlen, splits * cfg.block_n)
    pool = CachePool(batch * context, torch.bfloat16, dev, seed=1)
    x = make_inputs(pool, heads, qlen, batch, context)
    mla.mla_decode_triton(x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], qlen, None,
                          num_splits=splits, config=cfg)
    torch.cuda.synchronize()
    return f"{cfg.block_m}x{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} H{heads} q{qlen} B{batch} S{splits}"


def precompile(jobs: list[tuple[mla.TritonConfig, int, int, int, int]], workers: int = 8, log=print) -> float:
    """Compile the kernels of ``jobs`` in ``workers`` spawned processes (Triton's on-disk cache is shared),
    so that the timed process loads them instead of compiling one after another. Returns the seconds taken."""
    import concurrent.futures
    import multiprocessing

    t0 = time.time()
    unique = list(dict.fromkeys(jobs))
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as ex:
        for fut in concurrent.futures.as_completed([ex.submit(_compile_one, j) for j in unique]):
            try:
                fut.result()
            except Exception as exc:  # noqa: BLE001 - a config that does not compile (shared memory): the sweep records it
                log(f"  precompile failed: {type(exc).__name__}: {str(exc)[:160]}")
    return time.time() - t0


def precompile_grid(grid: list[tuple[int, int, int, int]] | None = None, workers: int = 10, log=print) -> float:
    """Compile, in parallel, every launch the benchmark grid will time with the library's default configs
    (:func:`workbench.mla.triton_config`), so that ``workbench bench decode`` then loads them from Triton's
    cache. Returns the seconds taken."""
    grid = grid or MAIN_GRID + QLEN_GRID
    sm = mla._sm_count(common.require_gpu())
    jobs = []
    for h, q, b, l in grid:
        cfg = mla.triton_config(q * h, torch.bfloat16, b * l, num_reqs=b, sm_count=sm)
        jobs.append((cfg, h, q, b, mla.default_splits(cfg, b, -(-q * h // cfg.block_m), b * l, sm)))
    return precompile(jobs, workers=workers, log=log)


def sweep(cases: list[tuple[str, mla.TritonConfig, tuple[int, int, int, int], list[int | None]]],
          pool: CachePool, timer=None, log=print) -> list[dict[str, Any]]:
    """Time each (label, config, (heads, qlen, batch, context), split counts) case; ``None`` in the split
    list means the cost model's choice. Returns one row per timing with the compiled kernel's resources."""
    timer = timer or _graph_timer
    rows = []
    for label, cfg, (h, q, b, l), split_list in cases:
        x = make_inputs(pool, h, q, b, l, seed=h * 1000 + q * 100 + b)
        out = torch.empty(b * q, h, mla.KV_LORA_RANK, dtype=x["q"].dtype, device=pool.device)
        row_blocks = -(-q * h // cfg.block_m)
        for forced in split_list:
            # for a balanced config the "split" count is the number of programs per row block
            splits = forced or mla.default_splits(cfg, b, row_blocks, b * l, mla._sm_count(pool.device))
            try:
                us = timer(lambda: mla.mla_decode_triton(x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"],
                                                         x["kv_indices"], q, None, num_splits=splits, config=cfg,
                                                         out=out))
            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: record it
                rows.append(dict(label=label, config=dataclasses.asdict(cfg), heads=h, qlen=q, batch=b, context=l,
                                 num_splits=splits, error=f"{type(exc).__name__}: {str(exc)[:200]}"))
                log(f"{label:28s} H{h:3d} q{q} B{b:3d} L{l:6d} S{splits:3d}: {type(exc).__name__}")
                break
            kv_bytes = b * l * KV_ROW_BYTES
            flops = b * h * q * l * FLOPS_PER_TOKEN_HEAD
            rows.append(dict(label=label, config=dataclasses.asdict(cfg), heads=h, qlen=q, batch=b, context=l,
                             num_splits=splits, model_choice=forced is None, us=us,
                             kv_gb_s=kv_bytes / (us * 1e-6) / 1e9, tflops=flops / (us * 1e-6) / 1e12,
                             kernel=mla.compiled_kernel_report()))
            k = rows[-1]["kernel"]
            log(f"{label:28s} H{h:3d} q{q} B{b:3d} L{l:6d} S{splits:3d}{'*' if forced is None else ' '}: "
                f"{us:8.1f} us {rows[-1]['kv_gb_s']:6.0f} GB/s {rows[-1]['tflops']:6.1f} TFLOP/s "
                f"[regs {k.get('n_regs')} spills {k.get('n_spills')} smem {k.get('shared_bytes')}]")
    return rows


def _fp32_partials(cfg: mla.TritonConfig) -> mla.TritonConfig:
    """A Triton default as the rounds before the twelfth session measured it: with fp32 partials (the small-batch
    16-row tile has kept 16-bit ones since then)."""
    return dataclasses.replace(cfg, narrow_partials=False)


def _before_pdls(cfg: mla.TritonConfig) -> mla.TritonConfig:
    """A default config as rounds 15-18 measured it: before ``pdl_split`` and the size-dependent merge
    tile (``TritonConfig.merge_tile``, round 19) became defaults."""
    return dataclasses.replace(cfg, pdl_split=False, merge_block_r=16, merge_block_d=32)


def _explore_cases(round_: int = 2) -> list[tuple[str, mla.TritonConfig, tuple[int, int, int, int], list[int | None]]]:
    """The focused sweeps behind the launch configs of :func:`workbench.mla.triton_config` (their tables are
    committed under ``explore`` in the results JSON). Round 1: the old configs beside deeply pipelined ones
    (``num_stages`` 5), fused and second-kernel merges, forced split counts. Round 2: ``num_stages`` 3 (the
    next tile's indices prefetched; with 2 the index load stalls every tile) and 8 warps."""
    tc = mla.TritonConfig
    fused = dict(fused_merge=True, merge_overhead_tokens=0, merge_tokens_per_split=32)
    old = ("old 16x64 w4 s2 fused", tc(16, 64, 4, 2, **fused))
    if round_ == 1:
        mem = [old, ("16x32 w4 s5", tc(16, 32, 4, 5)), ("16x32 w4 s5 fused", tc(16, 32, 4, 5, **fused)),
               ("16x64 w4 s5", tc(16, 64, 4, 5)), ("16x64 w4 s5 fused", tc(16, 64, 4, 5, **fused)),
               ("16x32 w8 s5", tc(16, 32, 8, 5)), ("16x16 w4 s5", tc(16, 16, 4, 5)), ("16x64 w8 s5", tc(16, 64, 8, 5))]
        mem_points = [((16, 1, 16, 4096), [None, 4, 8, 12, 16, 24, 32]), ((16, 1, 64, 4096), [None, 2, 4, 8]),
                      ((16, 1, 64, 32768), [None, 2, 4, 8]), ((16, 1, 128, 8192), [None, 1, 2, 4])]
        big = [("old 32x64 w4 s2", tc(32, 64, 4, 2)), ("64x32 w8 s5", tc(64, 32, 8, 5)),
               ("32x32 w4 s5", tc(32, 32, 4, 5))]
        big_points = [((128, 1, 64, 4096), [None, 1, 2]), ((16, 4, 64, 4096), [None, 1, 2]),
                      ((16, 8, 64, 4096), [None, 1, 2]), ((16, 4, 64, 32768), [None]), ((16, 8, 64, 32768), [None])]
    elif round_ == 21:
        # Round 20: at B=16 L=4k qlen 4 the merge (1024 rows x 8 fp32 partials, a second kernel) took 10.6 of the
        # 47 us. Here (1) the gluon split kernel PDL-launched (pdl_split: it waits before its first read and lets
        # the merge launch early), (2) on top, the splits of a row block run as one thread-block cluster and merge
        # after a cluster barrier (cluster_merge; only where every cluster fits on the GPU at once).
        bf = torch.bfloat16
        plain = dataclasses.replace(GLUON_BEFORE_ROUND32, pdl_split=False)  # the default of round 20
        pdls = dataclasses.replace(plain, pdl_split=True)
        big = [("gluon", plain), ("gluon pdls", pdls),
               ("gluon pdls cm", dataclasses.replace(pdls, cluster_merge=True))]
        big_points = [((128, 1, 64, 4096), [None]), ((16, 6, 16, 4096), [None])]
        big_points += [((16, q, b, l), [None]) for q in (4, 8) for b, l in QLEN_PAIRS]
        mem = [(f"16 default B{b} L{l}", _fp32_partials(_tile16(b * l))) for b, l in QLEN_PAIRS]
        cases = [(lab, cfg, (16, 1, b, l), [None]) for (lab, cfg), (b, l) in zip(mem, QLEN_PAIRS)]
        cases += [(lab, cfg, pt, sp) for lab, cfg in big for pt, sp in big_points]
        cases.append(big[0] + ((16, 4, 16, 4096), [None]))  # again at the end: run-to-run drift
        return cases
    elif round_ == 20:
        # workbench.mla_gluon: the 64-row split kernel written in Gluon, so that the copies of tile i+1 are issued
        # before the math of tile i (Triton's pipeliner issues them after it), against the 64-row default at the
        # compute-bound bar points, and the 16-head qlen-1 defaults there for the qlen ratios.
        bf = torch.bfloat16
        big = [("64 rows default", mla.triton_config(64, bf, gluon=False)),
               ("gluon 64x64 w8", dataclasses.replace(GLUON_BEFORE_ROUND32, pdl_split=False))]  # as round 20 ran it
        big_points = [((128, 1, 64, 4096), [None])] + [((16, q, b, l), [None]) for q in (4, 8)
                                                         for b, l in QLEN_PAIRS]
        mem = [(f"16 default B{b} L{l}", _fp32_partials(_tile16(b * l))) for b, l in QLEN_PAIRS]
        cases = [(lab, cfg, (16, 1, b, l), [None]) for (lab, cfg), (b, l) in zip(mem, QLEN_PAIRS)]
        cases += [(lab, cfg, pt, sp) for lab, cfg in big for pt, sp in big_points]
        cases.append(big[0] + big_points[0])  # the default again at the end: run-to-run drift
        return cases
    elif round_ == 19:
        # The trace: the merge adds 3.0 us after the last split program exits at B=16 L=4k, 2.5 us of it
        # after its PDL wait, for 4 MB of partials. Other merge tiles (rows x columns per program).
        bf = torch.bfloat16
        small = dataclasses.replace(_fp32_partials(_tile16(65536)), merge_block_r=16, merge_block_d=32)
        mem = [("16 small", small)]
        for br, bd in ((16, 16), (8, 32), (8, 64), (32, 16), (16, 64), (8, 16)):
            mem.append((f"16 small merge {br}x{bd}", dataclasses.replace(small, merge_block_r=br, merge_block_d=bd)))
        mem.append(("16 small mbw", dataclasses.replace(small, meta_before_wait=True)))
        mem_points = [((16, 1, 16, 4096), [None]), ((16, 1, 64, 4096), [None]), ((16, 1, 1, 32768), [None])]
        big, big_points = [], []
        old = mem[0]
    elif round_ == 18:
        # The traces: after the PDL wait a program needs three dependent loads (indptrs, the first indices, the
        # first rows) before any KV byte moves. meta_before_wait issues the first two before the wait, while the
        # previous kernel still runs.
        bf = torch.bfloat16
        mem = []
        for cfg in (_before_pdls(_fp32_partials(_tile16(65536))), _before_pdls(_tile16())):
            p = dataclasses.replace(cfg, pdl_split=True)
            mem += [(c.label, c) for c in (cfg, p, dataclasses.replace(p, meta_before_wait=True))]
        mem_points = [((16, 1, 16, 4096), [None]), ((16, 1, 64, 32768), [None]), ((16, 1, 128, 8192), [None]),
                      ((16, 1, 64, 4096), [None]), ((16, 1, 1, 32768), [None]), ((16, 1, 128, 1024), [None])]
        big = []
        for cfg in (_before_pdls(mla.triton_config(32, bf, 65536, gluon=False)),
                    _before_pdls(mla.triton_config(64, bf, gluon=False))):
            p = dataclasses.replace(cfg, pdl_split=True)
            big += [(c.label, c) for c in (cfg, p, dataclasses.replace(p, meta_before_wait=True))]
        big_points = [((16, 2, 16, 4096), [None]), ((128, 1, 64, 4096), [None]), ((16, 4, 16, 4096), [None])]
        old = mem[0]
    elif round_ == 17:
        # Round 16: a 32-token tile costs 2.0 us per program against 2.55 for a 64-token tile, so most of a
        # tile's time does not scale with its bytes. The suspect: the next tile's 64-index load, issued in the
        # same iteration as the gather that needs it, from DRAM. Here the split's indices are prefetched into
        # L1 or L2 before the loop, so those loads hit a cache.
        bf = torch.bfloat16
        small = dataclasses.replace(_before_pdls(_fp32_partials(_tile16(65536))), pdl_split=True)
        large = _before_pdls(_tile16())
        mem = [("16 small pdls", small)]
        mem += [(c.label, c) for c in (dataclasses.replace(small, idx_prefetch=1), dataclasses.replace(small, idx_prefetch=2),
                                       dataclasses.replace(small, block_n=32, num_stages=5, idx_prefetch=1),
                                       dataclasses.replace(small, block_n=32, num_stages=5, idx_prefetch=2))]
        mem += [("16 large", large)] + [(c.label, c) for c in (dataclasses.replace(large, idx_prefetch=1),
                                                              dataclasses.replace(large, idx_prefetch=2))]
        mem_points = [((16, 1, 16, 4096), [None]), ((16, 1, 64, 32768), [None]), ((16, 1, 128, 8192), [None]),
                      ((16, 1, 64, 4096), [None])]
        big32 = _before_pdls(mla.triton_config(32, bf, 65536, gluon=False))
        big = [("32 small", big32), ("32 small ip1", dataclasses.replace(big32, idx_prefetch=1)),
               ("32 small ip2", dataclasses.replace(big32, idx_prefetch=2))]
        big_points = [((16, 2, 16, 4096), [None]), ((16, 2, 64, 4096), [None])]
        old = mem[0]
    elif round_ == 16:
        # Round 15's IR dump: with indices one tile ahead and 5 stages, 32-token tiles get 4 gather buffers
        # (async_wait num = 6: three tiles in flight during a tile's math, 110 KB, against one 64-token tile,
        # 74 KB, in the small-batch default); indices 2-3 tiles ahead had broken the pipeline. Deeper
        # 32-token pipelines, all with pdls (round 15: -1 us at B=16 L=4k, neutral elsewhere).
        bf = torch.bfloat16
        small = dataclasses.replace(_before_pdls(_fp32_partials(_tile16(65536))), pdl_split=True)
        mem = [("16 small pdls", small)]
        for w, st in ((8, 4), (8, 5), (8, 6), (4, 5), (4, 6)):
            cfg = dataclasses.replace(small, block_n=32, num_warps=w, num_stages=st)
            mem.append((cfg.label, cfg))
        mem_points = [((16, 1, 16, 4096), [None, 16]), ((16, 1, 64, 32768), [None]), ((16, 1, 128, 8192), [None]),
                      ((16, 1, 64, 4096), [None])]
        big, big_points = [], []
        old = mem[0]
    elif round_ == 15:
        # The trace (``--trace``) of B=16 L=4k: a steady 2.6 us per 64-token tile per SM (3.6 TB/s over 128 SMs,
        # against 4.2 for copy) with one tile in flight while the other is computed. More in flight: indices
        # 2-3 tiles ahead so that a deeper pipeline can issue the row gather further ahead; and PDL launches of
        # the split kernel too (pdls).
        bf = torch.bfloat16
        small = _before_pdls(_fp32_partials(_tile16(65536)))
        large = _before_pdls(_tile16())
        ps = dict(pdl_split=True)
        mem = [("16 small", small), ("16 small pdls", dataclasses.replace(small, **ps))]
        for w, st, dist in ((8, 4, 2), (8, 5, 3), (4, 4, 2), (4, 5, 3), (8, 3, 1)):
            cfg = dataclasses.replace(small, block_n=32, num_warps=w, num_stages=st, idx_dist=dist)
            mem.append((cfg.label, cfg))
        mem += [("16 large", large), ("16 large pdls", dataclasses.replace(large, **ps))]
        for st, dist in ((4, 2), (5, 3)):
            cfg = dataclasses.replace(large, num_stages=st, idx_dist=dist, programs_per_sm=1)
            mem.append((cfg.label, cfg))
        mem_points = [((16, 1, 16, 4096), [None]), ((16, 1, 64, 32768), [None]), ((16, 1, 128, 8192), [None]),
                      ((16, 1, 64, 4096), [None])]
        big64 = _before_pdls(mla.triton_config(64, bf, gluon=False))
        big = [("64 rows", big64), ("64 rows pdls", dataclasses.replace(big64, **ps))]
        big_points = [((128, 1, 64, 4096), [None]), ((16, 4, 64, 4096), [None])]
        old = mem[0]
    elif round_ == 14:
        bf = torch.bfloat16
        fz = dict(fused_merge=True, merge_overhead_tokens=0, merge_tokens_per_split=32)
        small, large = _fp32_partials(_tile16(65536)), _tile16()
        mem = [("16 small", small), ("16 small fused", dataclasses.replace(small, **fz)),
               ("16 large", large), ("16 large fused", dataclasses.replace(large, **fz))]
        mem_points = [((16, 1, 16, 4096), [None, 8]), ((16, 1, 64, 4096), [None]), ((16, 1, 64, 32768), [None]),
                      ((16, 1, 128, 8192), [None]), ((16, 1, 1, 32768), [None, 32, 64]), ((16, 1, 128, 1024), [None])]
        big64 = mla.triton_config(64, bf, gluon=False)
        big = [("64 rows", big64), ("64 rows fused", dataclasses.replace(big64, **fz))]
        big_points = [((16, 4, 16, 4096), [None]), ((16, 8, 16, 4096), [None]), ((128, 1, 64, 4096), [None])]
        old = mem[0]
    elif round_ == 13:
        bf = torch.bfloat16
        small, large = _fp32_partials(_tile16(65536)), _tile16()
        mem = [("16 small", small), ("16 large", large)]
        mem_points = [((16, 1, 16, 4096), [None]), ((16, 1, 64, 32768), [None]), ((16, 1, 128, 8192), [None]),
                      ((16, 1, 64, 4096), [None]), ((16, 1, 1, 32768), [None]), ((16, 1, 128, 1024), [None])]
        big = [("32 small", mla.triton_config(32, bf, 65536, gluon=False)),
               ("32 large", mla.triton_config(32, bf, gluon=False))]
        big_points = [((16, 2, 16, 4096), [None]), ((16, 2, 64, 4096), [None])]
        old = mem[0]
    elif round_ == 12:
        bf = torch.bfloat16
        small, large = _fp32_partials(_tile16(65536)), _tile16()
        mem = [("16 small", small)] + [(f"16 small l2+{d}", dataclasses.replace(small, l2_ahead=d)) for d in (2, 3, 5)]
        mem += [("16 large", large)] + [(f"16 large l2+{d}", dataclasses.replace(large, l2_ahead=d)) for d in (2, 4, 6)]
        mem_points = [((16, 1, 16, 4096), [None]), ((16, 1, 64, 32768), [None]), ((16, 1, 128, 8192), [None]),
                      ((16, 1, 64, 4096), [None]), ((16, 1, 1, 32768), [None])]
        ia64 = tc(64, 64, 8, 2, programs_per_sm=1, idx_ahead=True, pdl=True)
        big = [("64 rows", mla.triton_config(64, bf, gluon=False)), ("64x64 w8 s2 ia", ia64),
               ("64x64 w8 s2 ia l2+2", dataclasses.replace(ia64, l2_ahead=2))]
        big_points = [((128, 1, 64, 4096), [None]), ((16, 4, 64, 4096), [None])]
        old = mem[0]
    elif round_ == 11:
        bf = torch.bfloat16
        nopdl = dict(pdl=False)
        small, large = _fp32_partials(_tile16(65536)), _tile16()
        mem = [("16 small", small), ("16 small no pdl", dataclasses.replace(small, **nopdl)),
               ("16 large", large), ("16 large no pdl", dataclasses.replace(large, **nopdl))]
        mem_points = [((16, 1, 16, 4096), [None]), ((16, 1, 64, 32768), [None]), ((16, 1, 128, 8192), [None]),
                      ((16, 1, 64, 4096), [None]), ((16, 1, 128, 1024), [None]), ((16, 1, 128, 2048), [None]),
                      ((16, 1, 1, 32768), [None]), ((16, 1, 32, 8192), [None])]
        big64 = mla.triton_config(64, bf, gluon=False)
        small32, large32 = mla.triton_config(32, bf, 65536, gluon=False), mla.triton_config(32, bf, gluon=False)
        big = [("64 rows", big64), ("64 rows no pdl", dataclasses.replace(big64, **nopdl)),
               ("32 small", small32), ("32 large", large32)]
        big_points = [((128, 1, 64, 4096), [None]), ((16, 4, 64, 4096), [None]), ((16, 8, 64, 4096), [None]),
                      ((16, 2, 64, 4096), [None]), ((16, 2, 16, 4096), [None])]
        old = mem[0]
    elif round_ == 10:
        ia = dict(idx_ahead=True)
        mem = [("16x64 w8 s3 ia", tc(16, 64, 8, 3, programs_per_sm=1, **ia)),
               ("16x32 w4 s3 ia", tc(16, 32, 4, 3, programs_per_sm=2, **ia)),
               ("16x32 w8 s3 ia", tc(16, 32, 8, 3, programs_per_sm=2, **ia)),
               ("16x32 w8 s4 ia", tc(16, 32, 8, 4, programs_per_sm=1, **ia)),
               ("16x32 w8 s5 ia", tc(16, 32, 8, 5, programs_per_sm=1, **ia)),
               ("16x32 w8 s6 ia", tc(16, 32, 8, 6, programs_per_sm=1, **ia)),
               ("16x32 w4 s5 ia", tc(16, 32, 4, 5, programs_per_sm=1, **ia))]
        mem_points = [((16, 1, 16, 4096), [None, 6, 8, 10, 16]), ((16, 1, 64, 32768), [None]),
                      ((16, 1, 128, 8192), [None]), ((16, 1, 64, 4096), [None]), ((16, 1, 128, 1024), [None]),
                      ((16, 1, 1, 32768), [None])]
        big = [("32x32 w4 s3 ia", tc(32, 32, 4, 3, programs_per_sm=2, **ia)),
               ("32x64 w8 s3 ia", tc(32, 64, 8, 3, programs_per_sm=1, **ia)),
               ("32x32 w8 s4 ia", tc(32, 32, 8, 4, programs_per_sm=1, **ia))]
        big_points = [((16, 2, 64, 4096), [None]), ((16, 2, 16, 4096), [None]), ((16, 2, 64, 32768), [None])]
        old = mem[0]
    elif round_ == 9:
        ia = dict(idx_ahead=True)
        mem = [("16x32 w4 s3 ia", tc(16, 32, 4, 3, programs_per_sm=2, **ia)),
               ("16x32 w4 s3 ia fused", tc(16, 32, 4, 3, programs_per_sm=2, **ia, **fused)),
               ("16x16 w4 s4 ia", tc(16, 16, 4, 4, programs_per_sm=2, **ia)),
               ("16x16 w4 s6 ia", tc(16, 16, 4, 6, programs_per_sm=2, **ia)),
               ("16x32 w2 s3 ia", tc(16, 32, 2, 3, programs_per_sm=2, **ia)),
               ("16x64 w8 s3 ia", tc(16, 64, 8, 3, programs_per_sm=1, **ia))]
        mem_points = [((16, 1, 16, 4096), [None, 8, 12, 16, 24, 32]), ((16, 1, 64, 32768), [None]),
                      ((16, 1, 128, 8192), [None]), ((16, 1, 64, 4096), [None]), ((16, 1, 128, 1024), [None]),
                      ((16, 1, 1, 32768), [None])]
        big = [("32x64 w4 s2", tc(32, 64, 4, 2, programs_per_sm=2)),
               ("32x32 w4 s3 ia", tc(32, 32, 4, 3, programs_per_sm=2, **ia)),
               ("32x32 w8 s3 ia", tc(32, 32, 8, 3, programs_per_sm=2, **ia)),
               ("64x64 w8 s3", tc(64, 64, 8, 3, programs_per_sm=1)),
               ("64x32 w8 s3 ia", tc(64, 32, 8, 3, programs_per_sm=1, **ia)),
               ("64x32 w8 s4 ia", tc(64, 32, 8, 4, programs_per_sm=1, **ia)),
               ("64x64 w8 s2 ia", tc(64, 64, 8, 2, programs_per_sm=1, **ia))]
        big_points = [((16, 2, 64, 4096), [None]), ((16, 2, 16, 4096), [None]), ((128, 1, 64, 4096), [None]),
                      ((16, 4, 64, 4096), [None]), ((16, 8, 64, 4096), [None])]
        old = mem[0]
    elif round_ == 8:
        ia = dict(idx_ahead=True)
        mem = [("16x64 w4 s2", tc(16, 64, 4, 2, programs_per_sm=2)),
               ("16x64 w4 s2 ia", tc(16, 64, 4, 2, programs_per_sm=2, **ia)),
               ("16x64 w4 s3 ia", tc(16, 64, 4, 3, programs_per_sm=2, **ia)),
               ("16x64 w8 s2 ia", tc(16, 64, 8, 2, programs_per_sm=2, **ia)),
               ("16x32 w4 s2 ia", tc(16, 32, 4, 2, programs_per_sm=2, **ia)),
               ("16x32 w4 s3 ia", tc(16, 32, 4, 3, programs_per_sm=2, **ia)),
               ("16x32 w4 s4 ia", tc(16, 32, 4, 4, programs_per_sm=2, **ia))]
        mem_points = [((16, 1, 16, 4096), [None, 8]), ((16, 1, 64, 32768), [None]), ((16, 1, 128, 8192), [None])]
        big = [("64x64 w8 s3", tc(64, 64, 8, 3, programs_per_sm=1)),
               ("64x64 w8 s3 ia", tc(64, 64, 8, 3, programs_per_sm=1, **ia)),
               ("64x64 w8 s2 ia", tc(64, 64, 8, 2, programs_per_sm=1, **ia)),
               ("32x64 w4 s2 ia", tc(32, 64, 4, 2, programs_per_sm=2, **ia))]
        big_points = [((128, 1, 64, 4096), [None]), ((16, 4, 64, 4096), [None]), ((16, 8, 64, 4096), [None])]
        old = mem[0]
    elif round_ == 7:
        ws = dict(warp_specialize=True)
        mem = [("16x64 w4 s2", tc(16, 64, 4, 2, programs_per_sm=2)),
               ("16x64 w4 s2 ws", tc(16, 64, 4, 2, programs_per_sm=2, **ws))]
        mem_points = [((16, 1, 16, 4096), [None]), ((16, 1, 64, 32768), [None]), ((16, 1, 128, 8192), [None])]
        big = [("64x64 w8 s3", tc(64, 64, 8, 3, programs_per_sm=1)),
               ("64x64 w8 s3 ws", tc(64, 64, 8, 3, programs_per_sm=1, **ws)),
               ("64x64 w8 s2 ws", tc(64, 64, 8, 2, programs_per_sm=1, **ws)),
               ("64x32 w8 s4", tc(64, 32, 8, 4, programs_per_sm=1)),
               ("64x32 w8 s4 ws", tc(64, 32, 8, 4, programs_per_sm=1, **ws)),
               ("64x128 w8 s1", tc(64, 128, 8, 1, programs_per_sm=1)),
               ("64x64 w4 s2", tc(64, 64, 4, 2, programs_per_sm=1))]
        big_points = [((128, 1, 64, 4096), [None]), ((16, 4, 64, 4096), [None]), ((16, 8, 64, 4096), [None])]
        old = mem[0]
    elif round_ == 6:
        mem = [("16x64 w4 s2", tc(16, 64, 4, 2, programs_per_sm=2)),
               ("16x64 w8 s2 r128", tc(16, 64, 8, 2, programs_per_sm=2, max_regs=128)),
               ("16x32 w4 s2 r128", tc(16, 32, 4, 2, programs_per_sm=4, max_regs=128)),
               ("16x32 w4 s2 r168", tc(16, 32, 4, 2, programs_per_sm=3, max_regs=168)),
               ("16x32 w8 s2 r128", tc(16, 32, 8, 2, programs_per_sm=2, max_regs=128)),
               ("16x32 w4 s3 r128", tc(16, 32, 4, 3, programs_per_sm=4, max_regs=128)),
               ("16x64 w4 s2 r128", tc(16, 64, 4, 2, programs_per_sm=2, max_regs=128))]
        mem_points = [((16, 1, 16, 4096), [None, 16, 32]), ((16, 1, 64, 32768), [None, 4, 8]),
                      ((16, 1, 128, 8192), [None, 2, 4]), ((16, 1, 64, 4096), [None])]
        big = [("64x64 w8 s3", tc(64, 64, 8, 3, programs_per_sm=1)),
               ("64x64 w8 s2 r255", tc(64, 64, 8, 2, programs_per_sm=1, max_regs=255))]
        big_points = [((128, 1, 64, 4096), [None])]
        old = mem[0]
    elif round_ == 5:
        bal = dict(balanced=True)
        mem = [("16x64 w4 s2", tc(16, 64, 4, 2, programs_per_sm=2)),
               ("bal 16x64 w4 s2", tc(16, 64, 4, 2, programs_per_sm=2, **bal))]
        mem_points = [((16, 1, 16, 4096), [None, 132, 200, 396]), ((16, 1, 64, 32768), [None, 256]),
                      ((16, 1, 128, 8192), [None, 256]), ((16, 1, 64, 4096), [None]), ((16, 1, 128, 1024), [None]),
                      ((16, 1, 64, 8192), [None]), ((16, 1, 1, 32768), [None])]
        big = [("64x64 w8 s3", tc(64, 64, 8, 3, programs_per_sm=1)),
               ("bal 64x64 w8 s3", tc(64, 64, 8, 3, programs_per_sm=1, **bal)),
               ("32x64 w4 s2", tc(32, 64, 4, 2, programs_per_sm=2)),
               ("bal 32x64 w4 s2", tc(32, 64, 4, 2, programs_per_sm=2, **bal))]
        big_points = [((128, 1, 64, 4096), [None]), ((16, 4, 64, 4096), [None]), ((16, 8, 64, 4096), [None]),
                      ((16, 2, 64, 4096), [None]), ((16, 2, 16, 4096), [None])]
        old = mem[0]
    elif round_ == 4:
        pf = dict(prefetch=True)
        mem = [("16x64 w4 s2", tc(16, 64, 4, 2)), ("pf 16x64 w4 s1", tc(16, 64, 4, 1, **pf)),
               ("pf 16x32 w4 s1", tc(16, 32, 4, 1, **pf)), ("pf 16x64 w8 s1", tc(16, 64, 8, 1, **pf)),
               ("pf 16x32 w8 s1", tc(16, 32, 8, 1, **pf)), ("pf 16x64 w4 s2", tc(16, 64, 4, 2, **pf)),
               ("pf 16x32 w4 s2", tc(16, 32, 4, 2, **pf)), ("pf 16x64 w4 s1 fused", tc(16, 64, 4, 1, **pf, **fused))]
        mem_points = [((16, 1, 16, 4096), [None, 8, 16, 24, 32]), ((16, 1, 64, 32768), [None, 2, 4, 6]),
                      ((16, 1, 128, 8192), [None, 1, 2, 3]), ((16, 1, 64, 4096), [None, 4])]
        big = [("32x64 w4 s2", tc(32, 64, 4, 2)), ("pf 32x32 w4 s1", tc(32, 32, 4, 1, **pf)),
               ("pf 32x64 w8 s1", tc(32, 64, 8, 1, **pf)), ("pf 64x32 w8 s1", tc(64, 32, 8, 1, **pf))]
        big_points = [((16, 2, 64, 4096), [None]), ((16, 2, 16, 4096), [None]), ((16, 4, 64, 4096), [None]),
                      ((128, 1, 64, 4096), [None])]
        old = mem[0]
    elif round_ == 3:
        sw = dict(swap_ab=True)
        mem = [("16x64 w4 s2", tc(16, 64, 4, 2)), ("swap 16x64 w4 s2", tc(16, 64, 4, 2, **sw)),
               ("swap 16x64 w4 s3", tc(16, 64, 4, 3, **sw)), ("swap 16x64 w4 s4", tc(16, 64, 4, 4, **sw)),
               ("swap 16x64 w8 s3", tc(16, 64, 8, 3, **sw)),
               ("swap 16x64 w4 s3 fused", tc(16, 64, 4, 3, **sw, **fused)),
               ("swap 16x128 w4 s2", tc(16, 128, 4, 2, **sw))]
        mem_points = [((16, 1, 16, 4096), [None, 8, 12, 16]), ((16, 1, 64, 32768), [None, 2, 4]),
                      ((16, 1, 128, 8192), [None, 1, 2]), ((16, 1, 64, 4096), [None])]
        big = [("64x64 w8 s3", tc(64, 64, 8, 3)), ("64x64 w8 s2", tc(64, 64, 8, 2)),
               ("swap 64x64 w8 s3", tc(64, 64, 8, 3, **sw)), ("swap 64x64 w8 s2", tc(64, 64, 8, 2, **sw)),
               ("swap 32x64 w4 s3", tc(32, 64, 4, 3, **sw)), ("swap 32x64 w8 s3", tc(32, 64, 8, 3, **sw))]
        big_points = [((128, 1, 64, 4096), [None]), ((16, 4, 64, 4096), [None]), ((16, 8, 64, 4096), [None]),
                      ((16, 2, 64, 4096), [None])]
        old = mem[0]
    else:
        mem = [old, ("16x64 w4 s3 fused", tc(16, 64, 4, 3, **fused)), ("16x64 w4 s3", tc(16, 64, 4, 3)),
               ("16x64 w4 s2", tc(16, 64, 4, 2)), ("16x64 w8 s3 fused", tc(16, 64, 8, 3, **fused)),
               ("16x64 w8 s3", tc(16, 64, 8, 3)), ("16x32 w4 s3", tc(16, 32, 4, 3)), ("16x64 w8 s5", tc(16, 64, 8, 5))]
        mem_points = [((16, 1, 16, 4096), [None, 8, 12, 16, 24]), ((16, 1, 64, 32768), [None, 3, 4, 6]),
                      ((16, 1, 128, 8192), [None, 2, 3]), ((16, 1, 64, 4096), [None, 4])]
        big = [("64x32 w8 s5", tc(64, 32, 8, 5)), ("64x32 w8 s3", tc(64, 32, 8, 3)), ("64x64 w8 s3", tc(64, 64, 8, 3))]
        big_points = [((128, 1, 64, 4096), [None, 1, 2]), ((16, 4, 64, 4096), [None]), ((16, 8, 64, 4096), [None]),
                      ((16, 4, 64, 32768), [None]), ((16, 8, 64, 32768), [None])]
    cases = [(lab, cfg, pt, sp) for lab, cfg in mem for pt, sp in mem_points]
    cases += [(lab, cfg, pt, sp) for lab, cfg in big for pt, sp in big_points]
    cases.append(old + mem_points[-1])  # the old default again at the end: run-to-run drift
    return cases


LAYOUT_POINTS = [(16, 1, 64, 32768), (16, 1, 128, 8192), (16, 1, 16, 4096), (16, 1, 64, 4096), (128, 1, 64, 4096)]


def compare_layouts(out: str, runs: tuple[int, ...] = (1, 16), log=print) -> None:
    """The library's configs at the bar points with the cache rows scattered one by one (``run=1``) and in
    16-row blocks (``run=16``): how much DRAM locality the gather gets. JSON with provenance to ``out``."""
    dev = common.require_gpu()
    matmul_tflops()
    copy = common.copy_bandwidth()
    rows = []
    for run in runs:
        pool = CachePool(max(b * l for _, _, b, l in LAYOUT_POINTS) + 64, torch.bfloat16, dev, run=run)
        for h, q, b, l in LAYOUT_POINTS:
            r = measure_point(pool, h, q, b, l)
            r.update(run=run, frac_copy=r["kv_gb_s"] / copy["gb_s"])
            rows.append(r)
            log(f"run {run:2d} H{h:3d} q{q} B{b:3d} L{l:6d}: {r['triton_us']:8.1f} us {r['kv_gb_s']:6.0f} GB/s "
                f"({100 * r['frac_copy']:.1f} % of copy) {r['tflops']:6.1f} TFLOP/s")
        del pool
        torch.cuda.empty_cache()
    common.write_json(out, dict(benchmark="mla_decode_layouts", provenance=common.provenance(),
                                ceilings={"copy": copy}, rows=rows))


EXPLORE_POINTS = ((16, 1, 16, 4096), (16, 1, 64, 32768), (16, 1, 128, 8192), (128, 1, 64, 4096))


def explore_best(explore: dict[str, Any], rounds: tuple[str, ...] = ("round3", "round4", "round5", "round6", "round7"),
                 points: tuple[tuple[int, int, int, int], ...] = EXPLORE_POINTS) -> list[dict[str, Any]]:
    """Per sweep round and configuration: the best time over the split counts tried at each (heads, qlen,
    batch, context) point (None where that configuration was not timed there), with the round's copy ceiling."""
    out = []
    for rnd in rounds:
        sweep = explore[rnd]
        for label in dict.fromkeys(r["label"] for r in sweep["rows"]):
            best = {}
            for pt in points:
                ts = [r["us"] for r in sweep["rows"] if r["label"] == label and "us" in r
                      and (r["heads"], r["qlen"], r["batch"], r["context"]) == pt]
                best[pt] = min(ts) if ts else None
            out.append(dict(round=rnd, label=label, copy_gb_s=sweep["ceilings"]["copy"]["gb_s"], best_us=best))
    return out


def time_merge_only(num_splits: int, total_rows: int, block_r: int, block_d: int, timer=None,
                    part_dtype: torch.dtype = torch.float32, num_warps: int = 4) -> float:
    """Microseconds of the second-kernel merge alone on random partials (a diagnostic for the split choice;
    ``part_dtype``: the partial outputs' dtype, fp32 or, as with ``narrow_partials``, bf16)."""
    timer = timer or _graph_timer
    dev = common.require_gpu()
    mid_o = torch.randn(num_splits, total_rows, mla.KV_LORA_RANK, device=dev).to(part_dtype)
    mid_lse = torch.randn(num_splits, total_rows, device=dev)
    out = torch.empty(total_rows, mla.KV_LORA_RANK, device=dev, dtype=torch.bfloat16)
    lse = torch.empty(total_rows, device=dev)
    grid = (-(-total_rows // block_r), mla.KV_LORA_RANK // block_d)
    chunk = min(1 << (num_splits - 1).bit_length(), 16)
    return timer(lambda: mla._mla_decode_merge_kernel[grid](mid_o, mid_lse, out, lse, total_rows, num_splits,
                                                            BLOCK_R=block_r, BLOCK_D=block_d, SPLIT_CHUNK=chunk,
                                                            D_LATENT=mla.KV_LORA_RANK, num_warps=num_warps))


def merge_only_rounds(shapes: tuple[tuple[str, int, int], ...],
                      cells: Callable[[str, int, int], list[dict[str, Any]]], rounds: int, log=print) -> list[dict]:
    """The rows of a merge-only probe: for ``rounds`` interleaved rounds and each ``(label, splits, folded rows)``
    of ``shapes``, the dicts ``cells(label, splits, rows)`` returns (timings from :func:`time_merge_only`), each
    marked with its round, shape, splits and rows and logged as JSON."""
    common.require_gpu()
    matmul_tflops()  # clocks out of idle
    rows = []
    for rnd in range(rounds):
        for label, splits, total in shapes:
            for cell in cells(label, splits, total):
                rows.append(dict(round=rnd, shape=label, splits=splits, rows=total, **cell))
                log(json.dumps(rows[-1]))
    return rows


def time_split_only(pool: CachePool, heads: int, qlen: int, batch: int, context: int, cfg: mla.TritonConfig,
                    num_splits: int, timer=None) -> float:
    """Microseconds of the split kernel alone (partials written, no merge): with :func:`time_merge_only`
    and the full call, where a call's time goes."""
    timer = timer or _graph_timer
    x = make_inputs(pool, heads, qlen, batch, context, seed=7)
    total_rows = batch * qlen * heads
    mid_o = torch.empty(num_splits, total_rows, mla.KV_LORA_RANK, device=pool.device)
    mid_lse = torch.empty(num_splits, total_rows, device=pool.device)
    grid = (-(-qlen * heads // cfg.block_m), num_splits, batch)
    scale = mla.default_sm_scale() * mla._LOG2E
    return timer(lambda: mla._mla_decode_split_kernel[grid](
        x["q"], x["kv_cache"], x["kv_indices"], x["qo_indptr"], x["kv_indptr"], mid_o, mid_lse, mid_o, mid_lse,
        x["kv_indptr"], x["kv_cache"].stride(0), total_rows, scale, num_splits, DIRECT=False, FUSED_MERGE=False,
        **mla.split_kernel_options(cfg, heads, x["q"].dtype, pool.device)))


def _tile16(tokens: int | None = None) -> mla.TritonConfig:
    """The library's 16-row Triton tile for a call of ``tokens`` KV tokens (bf16; what the explore rounds ran,
    before the swapped gluon kernel became the default on Hopper)."""
    return mla.triton_config(16, torch.bfloat16, tokens, gluon=False)


def pre_swap_config(rows: int, tokens: int, batch: int, sm_count: int, *,
                    triton_up_to_32_rows: bool = False) -> mla.TritonConfig:
    """The library's bf16 config before the thirteenth session made the swapped gluon kernel the default for at
    most 32 rows: the Triton tiles up to 16 rows (and up to 32 with ``triton_up_to_32_rows``: before round 31),
    the warp-specialised gluon kernel for 17-32 rows on Hopper (round 31, with its first schedule: the hand-over
    schedule of round 38 came later), and above 32 rows :func:`mla.triton_config` as it is now. The baseline of the
    probes written before that change, which therefore still measure what they measured up to 32 rows."""
    if rows <= (32 if triton_up_to_32_rows else 16):
        return mla.triton_config(rows, torch.bfloat16, tokens, gluon=False)
    if rows <= 32 and mla.gluon_available():
        return dataclasses.replace(mla.GLUON_WS_CONFIG, ws_handoff=False)
    return mla.triton_config(rows, torch.bfloat16, tokens, num_reqs=batch, sm_count=sm_count)


def library_config(rows: int, tokens: int, batch: int, sm_count: int) -> mla.TritonConfig:
    """The library's bf16 config now for a call of ``batch`` requests of ``rows`` folded rows each and ``tokens`` KV
    tokens (:func:`mla.triton_config` with the request count): the ``base_config`` of the probes that compare
    against today's defaults."""
    return mla.triton_config(rows, torch.bfloat16, tokens, num_reqs=batch, sm_count=sm_count)


def variant_probe(points: tuple[tuple[int, int, int, int], ...],
                  variants: Callable[[mla.TritonConfig], list[tuple[str, mla.TritonConfig]]], benchmark: str,
                  command: str, out: str | None = None, rounds: int = 3, same: tuple[str, str] | None = None,
                  own_splits: bool = False, triton_up_to_32_rows: bool = False,
                  base_config: Callable[[int, int, int, int], mla.TritonConfig] | None = None,
                  log=print) -> list[dict]:
    """Time a baseline config at each ``(heads, qlen, batch, context)`` point against ``variants(config)``
    (``(name, config)`` pairs, the first the baseline) under CUDA-graph replay, bf16, the cost model's split
    count, ``rounds`` interleaved rounds. Each row holds ``<name>_us`` per variant and ``identical`` (the
    outputs of the two variants named in ``same``, else of the first two, equal bit for bit) or ``max_diff``
    (their largest difference) where they differ. ``own_splits``: each variant runs with the cost model's split
    count for its own config (``splits_<name>``), not the baseline's. ``triton_up_to_32_rows``: the baseline of
    points of at most 32 rows is the Triton tile, as the library chose before round 31 (the probes written
    before it). ``base_config(rows, tokens, batch, sm_count)``: the baseline (default: :func:`pre_swap_config`, the
    library's config when the probes before the thirteenth session were written). Writes JSON with provenance to
    ``out``."""
    dev = common.require_gpu()
    matmul_tflops()  # clocks out of idle
    copy = common.copy_bandwidth()
    pool = CachePool(max(b * l for _, _, b, l in points), torch.bfloat16, dev)
    sm = mla._sm_count(dev)
    rows = []
    for rnd in range(rounds):
        for h, q, b, l in points:
            x = make_inputs(pool, h, q, b, l, seed=h * 1000 + q * 100 + b)
            base = (base_config(q * h, b * l, b, sm) if base_config is not None
                    else pre_swap_config(q * h, b * l, b, sm, triton_up_to_32_rows=triton_up_to_32_rows))
            splits = mla.default_splits(base, b, -(-q * h // base.block_m), b * l, sm)
            row: dict[str, Any] = dict(round=rnd, heads=h, qlen=q, batch=b, context=l, splits=splits,
                                       config=base.label)
            outs = {}
            for name, cfg in variants(base):
                o = torch.empty(b * q, h, mla.KV_LORA_RANK, dtype=torch.bfloat16, device=dev)
                n_s = splits
                if own_splits:
                    n_s = row["splits_" + name] = mla.default_splits(cfg, b, -(-q * h // cfg.block_m), b * l, sm)
                call = lambda: mla.mla_decode_triton(x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"],  # noqa: E731
                                                     x["kv_indices"], q, None, num_splits=n_s, config=cfg, out=o)
                row[name + "_us"] = _graph_timer(call)
                call()
                torch.cuda.synchronize()
                outs[name] = o.clone()
            a, c = same or (tuple(outs) * 2)[:2]  # one variant: compared with itself (no check)
            if a in outs and c in outs and a != c:
                row["identical"] = bool(torch.equal(outs[a], outs[c]))
                if not row["identical"]:
                    row["max_diff"] = float((outs[a].float() - outs[c].float()).abs().max())
            best = min(v for k, v in row.items() if k.endswith("_us"))
            row["kv_tb_s_best"] = b * l * 1152 / (best * 1e-6) / 1e12
            rows.append(row)
            log(json.dumps(row))
    if out:
        common.write_json(out, dict(benchmark=benchmark, ceilings={"copy": copy}, rows=rows,
                                    provenance=common.provenance(command)))
    return rows


def trace_point(pool: CachePool, heads: int, qlen: int, batch: int, context: int, *,
                config: mla.TritonConfig | None = None, num_splits: int | None = None, calls: int = 8,
                keep_call: int | None = None) -> dict[str, Any]:
    """Where one call's time goes: ``calls`` back-to-back calls captured in one CUDA graph (as the benchmark
    times them), each writing %globaltimer stamps into its own buffers (``mla_decode_triton(trace=)``).
    Returns the point, the config, the per-call time with and without the stamps (graph replay), the
    :func:`summarize_trace` of the calls, and the raw stamps of call ``keep_call`` (default: the middle one)
    relative to that call's first split-kernel entry, for a timeline figure. Default config: the library's, where
    it is instrumented (the Triton split kernel, the swapped gluon kernel and the merge); else the Triton kernel's
    (``gluon=False``: the 64-row gluon kernels are not instrumented)."""
    x = make_inputs(pool, heads, qlen, batch, context, seed=heads * 1000 + qlen * 100 + batch)
    cfg = config
    if cfg is None:
        cfg = mla.triton_config(qlen * heads, x["q"].dtype, x["kv_indices"].numel(), num_reqs=batch,
                                sm_count=mla._sm_count(pool.device))
        if cfg.gluon:  # (a gluon config passed in is not replaced: mla_decode_triton refuses to trace it)
            cfg = mla.triton_config(qlen * heads, x["q"].dtype, x["kv_indices"].numel(), gluon=False)
    row_blocks = -(-qlen * heads // cfg.block_m)
    splits = num_splits or mla.default_splits(cfg, batch, row_blocks, batch * context, mla._sm_count(pool.device))
    out = torch.empty(batch * qlen, heads, mla.KV_LORA_RANK, dtype=x["q"].dtype, device=pool.device)
    bufs = [mla.trace_buffers(x["q"], qlen, batch, splits, cfg) for _ in range(calls)]
    state = {"i": 0}

    def call(trace=None):
        return mla.mla_decode_triton(x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], qlen,
                                     None, num_splits=splits, config=cfg, out=out, trace=trace)

    def traced():
        state["i"] += 1
        return call(bufs[(state["i"] - 1) % calls])

    graph = common._capture(traced, calls, warmup=calls)  # warm-up of `calls` calls: capture starts at buffer 0
    for sb, mb in bufs:
        sb.zero_()
        mb.zero_()
    graph.replay()
    torch.cuda.synchronize()
    raw = [(sb.cpu().numpy(), mb.cpu().numpy()) for sb, mb in bufs]
    traced_us = common.time_cuda_graph(traced, graph_reps=calls, repeats=20, warmup=calls)
    plain_us = _graph_timer(call)
    keep = calls // 2 if keep_call is None else keep_call
    s_raw, m_raw = raw[keep]
    t0 = int(s_raw[:, 1].min())
    rel = lambda a: [[int(v) - t0 if v else None for v in row] for row in a[:, 1:].tolist()]  # noqa: E731
    return dict(heads=heads, qlen=qlen, batch=batch, context=context, label=cfg.label, config=dataclasses.asdict(cfg),
                num_splits=splits, calls=calls, traced_us=traced_us, untraced_us=plain_us,
                summary=summarize_trace([(a.tolist(), b.tolist()) for a, b in raw]),
                timeline=dict(call=keep, split_sm=s_raw[:, 0].tolist(), split_ns=rel(s_raw),
                              merge_sm=m_raw[:, 0].tolist(), merge_ns=rel(m_raw) if len(m_raw) else []))


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize_trace(calls: list[tuple[list[list[int]], list[list[int]]]]) -> dict[str, Any]:
    """Summarise the %globaltimer stamps of consecutive calls (each a pair of split rows and merge rows, as
    :func:`workbench.mla.trace_buffers` lays them out: SM, entry, after the PDL wait, exit, then one stamp per
    tile; 0 = not written). Times in microseconds. Per call, relative to its first split-program entry:

    * ``split_entry_spread``: last minus first split-program entry (how long the grid takes to start);
    * ``split_wait``: median time a split program spent in the PDL wait;
    * ``first_tile``: median time from after the wait to the end of a program's first tile (latency of the
      first loads plus one tile of math);
    * ``per_tile``: median over programs of the mean time per later tile (the streaming rate);
    * ``split_exit_median`` / ``split_exit_last``: when the median and the last split program exits;
    * ``merge_first_entry``, ``merge_wait_done`` (first merge program past its wait), ``merge_exit_last``;
    * ``merge_after_split``: the last merge exit minus the last split exit (what the merge adds);
    * ``gap_from_previous``: this call's first split entry minus the previous call's last merge (or split)
      exit (negative: this call's programs started before the previous call ended, as PDL allows);
    * ``period``: first split entry to the next call's first split entry.

    The result holds the median of each over the calls (the first call's ``gap`` and the last call's
    ``period`` are undefined), the per-call values, and ``timer_step_ns``, the smallest nonzero difference
    between two stamps (the timer's resolution, if stamps are dense enough to show it).
    """
    per_call = []
    stamps: list[int] = []
    for split, merge in calls:
        s_rows = [r for r in split if r[1]]
        m_rows = [r for r in merge if r[1]]
        if not s_rows:
            raise ValueError("a call has no split-program stamps: was it run with trace buffers?")
        t0 = min(r[1] for r in s_rows)
        us = lambda t: (t - t0) / 1e3  # noqa: E731
        firsts, tiles = [], []
        for r in s_rows:
            ts = [t for t in r[4:] if t]
            stamps.extend(t for t in r[1:] if t)
            if ts:
                firsts.append((ts[0] - r[2]) / 1e3)
            if len(ts) > 1:
                tiles.append((ts[-1] - ts[0]) / (len(ts) - 1) / 1e3)
        exits = sorted(us(r[3]) for r in s_rows)
        c = dict(t0=t0, split_entry_spread=us(max(r[1] for r in s_rows)),
                 split_wait=_median([(r[2] - r[1]) / 1e3 for r in s_rows]), first_tile=_median(firsts),
                 per_tile=_median(tiles), split_exit_median=_median(exits), split_exit_last=exits[-1],
                 end=max(r[3] for r in s_rows + m_rows))
        if m_rows:
            stamps.extend(t for r in m_rows for t in r[1:] if t)
            c.update(merge_first_entry=us(min(r[1] for r in m_rows)), merge_wait_done=us(min(r[2] for r in m_rows)),
                     merge_exit_last=us(max(r[3] for r in m_rows)))
            c["merge_after_split"] = c["merge_exit_last"] - c["split_exit_last"]
        per_call.append(c)
    for prev, cur in zip(per_call, per_call[1:]):
        cur["gap_from_previous"] = (cur["t0"] - prev["end"]) / 1e3
        prev["period"] = (cur["t0"] - prev["t0"]) / 1e3
    keys = [k for k in per_call[0] if k not in ("t0", "end")] + ["gap_from_previous", "period"]
    med = {k: _median([c[k] for c in per_call if c.get(k) is not None]) for k in dict.fromkeys(keys)}
    diffs = sorted({b - a for a, b in zip(sorted(stamps), sorted(stamps)[1:]) if b > a})
    return dict(median=med, per_call=[{k: v for k, v in c.items() if k not in ("t0", "end")} for c in per_call],
                timer_step_ns=diffs[0] if diffs else None)


TRACE_POINTS = ((16, 1, 16, 4096), (16, 1, 64, 32768), (128, 1, 64, 4096))


def trace_run(out: str, log=print) -> None:
    """``workbench bench decode --trace``: :func:`trace_point` at the small-batch bar point, at a long context
    and at 128 heads, each with the library's default config without PDL launches of the split kernel, with
    them (``pdl_split``), and with ``meta_before_wait`` too. JSON with provenance to ``out`` (the per-program
    stamps of the small-batch point only)."""
    dev = common.require_gpu()
    matmul_tflops()  # clocks out of idle
    copy = common.copy_bandwidth()
    pool = CachePool(max(b * l for _, _, b, l in TRACE_POINTS), torch.bfloat16, dev)
    rows = []
    for h, q, b, l in TRACE_POINTS:
        base = mla.triton_config(q * h, torch.bfloat16, b * l, gluon=False)  # only the Triton kernel is traced
        cfgs = [dataclasses.replace(base, pdl_split=False, meta_before_wait=False),
                dataclasses.replace(base, pdl_split=True, meta_before_wait=False),
                dataclasses.replace(base, pdl_split=True, meta_before_wait=True)]
        for cfg in cfgs:
            r = trace_point(pool, h, q, b, l, config=cfg)
            if (h, q, b, l) != TRACE_POINTS[0]:  # the per-program stamps only where the chapter draws them
                r.pop("timeline")
            rows.append(r)
            m = r["summary"]["median"]
            log(f"H{h:3d} q{q} B{b:3d} L{l:6d} {r['label']:24s} S{r['num_splits']:3d}: {r['untraced_us']:7.1f} us "
                f"(traced {r['traced_us']:7.1f}) | " + " ".join(f"{k} {v:.2f}" for k, v in m.items() if v is not None))
    common.write_json(out, dict(benchmark="mla_decode_trace", provenance=common.provenance(),
                                ceilings={"copy": copy}, rows=rows))


def explain_fixed_cost(out: str, log=print) -> None:
    """Round 3 of the sweep: where the fixed part of a 16-head qlen-1 call goes. Full calls over a context
    sweep at B=128 (time = fixed + bytes / rate), the split kernel alone, the merge alone, one split
    (no merge) and a one-tile call (the latency floor). Writes JSON with provenance to ``out``."""
    dev = common.require_gpu()
    matmul_tflops()  # clocks out of idle
    copy = common.copy_bandwidth()
    cfg = mla.triton_config(16, torch.bfloat16, gluon=False)  # round 3: the Triton kernel
    pool = CachePool(128 * 16384, torch.bfloat16, dev)
    rows: list[dict[str, Any]] = []

    def add(kind, b, l, s, us):
        rows.append(dict(kind=kind, batch=b, context=l, num_splits=s, us=us,
                         kv_gb_s=b * l * KV_ROW_BYTES / (us * 1e-6) / 1e9))
        log(f"{kind:12s} B{b:4d} L{l:6d} S{s:3d}: {us:8.1f} us {rows[-1]['kv_gb_s']:6.0f} GB/s")

    for b, l in [(128, 1024), (128, 2048), (128, 4096), (128, 8192), (128, 16384), (16, 4096), (64, 16384),
                 (1, 64), (16, 64)]:
        s = sweep([("full", cfg, (16, 1, b, l), [None])], pool, log=lambda *_: None)[0]
        add("full", b, l, s["num_splits"], s["us"])
        if s["num_splits"] > 1:
            add("split only", b, l, s["num_splits"], time_split_only(pool, 16, 1, b, l, cfg, s["num_splits"]))
            add("merge only", b, l, s["num_splits"], time_merge_only(s["num_splits"], b * 16,
                                                                    *cfg.merge_tile(b * 16, s["num_splits"])))
    add("one split", 128, 8192, 1, sweep([("d", cfg, (16, 1, 128, 8192), [1])], pool, log=lambda *_: None)[0]["us"])
    common.write_json(out, dict(benchmark="mla_decode_fixed_cost", provenance=common.provenance(),
                                ceilings={"copy": copy}, config=dataclasses.asdict(cfg), rows=rows))


SPLIT_ONLY_POINT = (16, 1, 16, 4096)
MERGE_ONLY = [(16, 256), (8, 256), (4, 1024), (2, 2048)]  # (splits, rows): B=16, B=64 and B=128 at 16 heads
MERGE_TILES = [(16, 32), (16, 64), (16, 128), (32, 64)]


def explore(out: str, phase: str = "time", round_: int = 2, log=print) -> None:
    """``phase="compile"``: compile every case of the focused sweep in parallel (fills Triton's cache);
    ``phase="time"``: measure the ceilings and time every case, writing JSON with provenance to ``out``.
    From the command line: ``workbench bench decode --explore N --out F.json`` runs both phases."""
    cases = _explore_cases(round_)
    dev = common.require_gpu()
    sm = mla._sm_count(dev)
    if phase == "compile":
        jobs = []
        for _, cfg, (h, q, b, l), split_list in cases:
            rb = -(-q * h // cfg.block_m)
            for forced in split_list:
                jobs.append((cfg, h, q, b, forced or mla.default_splits(cfg, b, rb, b * l, sm)))
        log(f"precompiled {len(set(jobs))} launches in {precompile(jobs, workers=10, log=log):.0f} s")
        return
    matmul = matmul_tflops()
    ceilings = {"copy": common.copy_bandwidth(), "matmul_bf16": matmul}
    log(f"copy {ceilings['copy']['gb_s']:.0f} GB/s {ceilings['copy']['runs']}; matmul {matmul['tflops']:.0f} TFLOP/s")
    pool = CachePool(max(b * l for _, _, (_, _, b, l), _ in cases), torch.bfloat16, dev)
    checks = {}
    for label, cfg, (h, q, _, _), _ in cases:  # each config against the golden before it is timed
        if label not in checks:
            checks[label] = self_check(cfg, q * h, dev)
            log(f"self-check {label}: {checks[label]}")
    cases = [c for c in cases if checks[c[0]]["ok"]]
    t0 = time.time()
    rows = sweep(cases, pool, log=log)
    log(f"sweep took {time.time() - t0:.0f} s")
    merge_rows = []
    for splits, total_rows in MERGE_ONLY if round_ == 2 else []:
        for br, bd in MERGE_TILES:
            us = time_merge_only(splits, total_rows, br, bd)
            merge_rows.append(dict(num_splits=splits, total_rows=total_rows, block_r=br, block_d=bd, us=us))
            log(f"merge only: {splits:2d} splits x {total_rows:4d} rows, tile {br}x{bd}: {us:6.1f} us")
    split_rows = []
    for label, cfg, (h, q, b, l), split_list in cases if round_ >= 10 else []:
        if (h, q, b, l) == SPLIT_ONLY_POINT:  # where the time of the smallest bar point goes
            for splits in split_list[1:]:
                us = time_split_only(pool, h, q, b, l, cfg, splits)
                merge_us = time_merge_only(splits, b * q * h, *cfg.merge_tile(b * q * h, splits))
                split_rows.append(dict(label=label, heads=h, qlen=q, batch=b, context=l, num_splits=splits,
                                       split_only_us=us, merge_only_us=merge_us))
                log(f"{label:28s} S{splits:3d}: split only {us:6.1f} us, merge only {merge_us:5.1f} us")
    ceilings["copy_end"] = common.copy_bandwidth()
    log(f"copy at the end {ceilings['copy_end']['gb_s']:.0f} GB/s")
    common.write_json(out, dict(benchmark="mla_decode_explore", provenance=common.provenance(), ceilings=ceilings,
                                round=round_, rows=rows, merge_only=merge_rows, split_only=split_rows,
                                self_checks=checks))


# ----------------------------------------------------------------------------------------------
# bars, the run, the CLI entry
# ----------------------------------------------------------------------------------------------


def find_point(results: list[dict], heads: int, qlen: int, batch: int, context: int) -> dict | None:
    """The result row of one (heads, qlen, batch, context) point of a decode run, or None if it was not measured."""
    key = (heads, qlen, batch, context)
    return next((r for r in results if (r["heads"], r["qlen"], r["batch"], r["context"]) == key), None)


def evaluate_bars(results: list[dict], copy_gb_s: float,
                  paired: dict[str, list[dict[str, Any]]] | None = None) -> list[dict]:
    """Each bar with its measured value, target and PASS/MISS (MISS when the point was not measured).

    A ratio bar with rounds in ``paired`` (bar name -> :func:`ratio_rounds`) takes the median of the per-round
    ratios as its value and keeps the rounds, their range and the sweep's own ratio (``sweep_value``)."""
    out = []
    for bar in BARS:
        r = find_point(results, bar.heads, bar.qlen, bar.batch, bar.context)
        value, extra = None, {}
        if r is not None:
            if bar.kind == "kv_fraction_of_copy":
                value = r["kv_gb_s"] / copy_gb_s
            elif bar.kind == "kv_gb_s":
                value = r["kv_gb_s"]
            elif bar.kind == "tflops":
                value = r["tflops"]
            elif bar.kind == "qlen_time_ratio":
                base = find_point(results, bar.heads, 1, bar.batch, bar.context)
                value = r["triton_us"] / base["triton_us"] if base else None
        if bar.kind == "qlen_time_ratio" and paired and paired.get(bar.name):
            ratios = [x["ratio"] for x in paired[bar.name]]
            extra = dict(method=f"median of {len(ratios)} paired rounds", sweep_value=value, rounds=paired[bar.name],
                         ratio_min=min(ratios), ratio_max=max(ratios))
            value = statistics.median(ratios)
        ok = value is not None and (value <= bar.target if bar.kind == "qlen_time_ratio" else value >= bar.target)
        out.append(dict(name=bar.name, kind=bar.kind, value=value, target=bar.target,
                        verdict="PASS" if ok else "MISS", **extra))
    return out


def read_bandwidth(nbytes: int = 4 << 30) -> dict[str, float]:
    """Read-only bandwidth: a bf16 ``amax`` over ``nbytes`` (what a decode kernel mostly does: read)."""
    dev = common.require_gpu()
    x = torch.randn(nbytes // 2, device=dev, dtype=torch.bfloat16)
    out = torch.empty((), device=dev, dtype=torch.bfloat16)
    us = common.time_cuda_graph(lambda: torch.amax(x, dim=0, out=out), graph_reps=5, repeats=20)
    del x
    torch.cuda.empty_cache()
    return {"bytes": nbytes, "time_us": us, "gb_s": nbytes / (us * 1e-6) / 1e9, "op": "torch.amax bf16"}


def self_check(config: mla.TritonConfig, rows: int, device: torch.device,
               dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """The chosen config on a ragged bf16 case against the fp32 golden, with the tolerance rule of the
    tests (kernel error <= 2 x the same-precision torch error + floor)."""
    heads, qlen = (16, max(1, rows // 16)) if rows <= 64 else (128, 1)
    g = torch.Generator().manual_seed(rows)
    kv_lens = [max(qlen, n) for n in ((1, 17, 100, 1000, 4099) if device.type == "cuda" else (1, 17, 40))]
    total = sum(kv_lens)
    cache = torch.randn(total + 1, mla.QK_HEAD_DIM, generator=g).to(dtype).to(device)
    idx = (1 + torch.randperm(total, generator=g)).to(torch.int32).to(device)
    q = torch.randn(qlen * len(kv_lens), heads, mla.QK_HEAD_DIM, generator=g).to(dtype).to(device)
    qo = torch.arange(0, qlen * len(kv_lens) + 1, qlen, dtype=torch.int32, device=device)
    kv = torch.tensor([0] + list(torch.tensor(kv_lens).cumsum(0).tolist()), dtype=torch.int32, device=device)
    try:
        out, _ = mla.mla_decode_triton(q, cache, qo, kv, idx, qlen, 0.07, config=config)
    except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: the config is unusable, say why
        return {"heads": heads, "qlen": qlen, "ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    gold, _ = mla.mla_decode_ref(q, cache, qo, kv, idx, 0.07)
    pt, _ = mla.mla_decode_torch(q, cache, qo, kv, idx, 0.07, qlen, max(kv_lens))
    err = (out.float() - gold).abs().max().item()
    err_pt = (pt.float() - gold).abs().max().item()
    floor = 2 * torch.finfo(dtype).eps * max(1.0, gold.abs().max().item()) + 1e-5
    return {"heads": heads, "qlen": qlen, "max_err": err, "torch_max_err": err_pt, "ok": err <= 2 * err_pt + floor}


def matmul_tflops(n: int = 8192) -> dict[str, float]:
    """bf16 matrix-product rate on random data (the compute ceiling of the roofline), measured here."""
    dev = common.require_gpu()
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    us = common.time_cuda_graph(lambda: torch.matmul(a, b, out=c), graph_reps=5, repeats=10)
    del a, b, c
    torch.cuda.empty_cache()
    return {"n": n, "time_us": us, "tflops": 2 * n**3 / (us * 1e-6) / 1e12}


def run(*, grid: list[tuple[int, int, int, int]], do_tune: bool, with_torch: bool = True,
        device: torch.device | None = None, dtype: torch.dtype = torch.bfloat16, timer=None, torch_timer=None,
        log=print, ceilings: dict[str, Any] | None = None, ratio_rounds_n: int = RATIO_ROUNDS) -> dict[str, Any]:
    """Measure the ceilings, optionally tune, sweep ``grid``, time the ratio bars in paired rounds
    (:func:`ratio_rounds`; ``ratio_rounds_n`` 0: the sweep's ratios only), evaluate the bars. Returns the JSON
    payload."""
    dev = device or common.require_gpu()
    timer = timer or _graph_timer
    if torch_timer is None and with_torch:
        torch_timer = _eager_timer
    if ceilings is None:
        # The matmul first: it takes the clocks out of idle, which an idle-first copy measurement
        # would otherwise report as the ceiling (seen: 2.7 TB/s cold vs ~4.2 warm).
        matmul = matmul_tflops()
        ceilings = {"copy": common.copy_bandwidth(), "matmul_bf16": matmul, "read_only": read_bandwidth()}
    log(f"copy bandwidth {ceilings['copy']['gb_s']:.0f} GB/s (read + write; all: "
        f"{ceilings['copy'].get('runs', {})}); read-only {ceilings.get('read_only', {}).get('gb_s', float('nan')):.0f} "
        "GB/s; "
        f"bf16 matmul {ceilings['matmul_bf16']['tflops']:.0f} TFLOP/s")
    max_rows = max(b * l for (_, _, b, l) in grid + (MEM_POINTS + COMPUTE_POINTS + MID_POINTS if do_tune else []))
    pool = CachePool(max_rows, dtype, dev)
    chosen, tuning = (None, [])
    if do_tune:
        t0 = time.time()
        chosen, tuning = tune(pool, timer, log)
        log(f"tuning took {time.time() - t0:.0f} s")
        checks = {name: self_check(cfg, rows, dev) for name, cfg, rows in
                  (("mem", chosen["mem"], 16), ("mid", chosen["mid"], 64), ("compute", chosen["compute"], 128))}
        log(f"self-check of the chosen configs: {checks}")
        if not all(c["ok"] for c in checks.values()):
            raise RuntimeError(f"a chosen config fails the correctness check: {checks}")
    results = []
    log(f"{'H':>4} {'qlen':>4} {'B':>4} {'L':>6} {'splits':>6} {'us':>9} {'GB/s':>7} {'TFLOP/s':>8} {'torch us':>9}")
    for (h, q, b, l) in grid:
        r = measure_point(pool, h, q, b, l, config=_config_for(chosen, q * h), timer=timer, torch_timer=torch_timer)
        results.append(r)
        t_us = f"{r['torch_us']:9.1f}" if "torch_us" in r else f"{'-':>9}"
        log(f"{h:4d} {q:4d} {b:4d} {l:6d} {r['num_splits']:6d} {r['triton_us']:9.1f} {r['kv_gb_s']:7.0f} "
            f"{r['tflops']:8.1f} {t_us}")
    if dev.type == "cuda" and "copy_end" not in ceilings:
        ceilings["copy_end"] = common.copy_bandwidth()  # again at the end: the ceiling is the best seen
        log(f"copy bandwidth at the end {ceilings['copy_end']['gb_s']:.0f} GB/s")
        if ceilings["copy_end"]["gb_s"] > ceilings["copy"]["gb_s"]:
            ceilings["copy"] = ceilings["copy_end"]
    paired = {}
    measured = {(r["heads"], r["qlen"], r["batch"], r["context"]) for r in results}
    for bar in BARS:
        points = {(bar.heads, 1, bar.batch, bar.context), (bar.heads, bar.qlen, bar.batch, bar.context)}
        if bar.kind == "qlen_time_ratio" and ratio_rounds_n > 0 and points <= measured:
            paired[bar.name] = ratio_rounds(pool, bar, config_for=lambda rows: _config_for(chosen, rows), timer=timer,
                                            rounds=ratio_rounds_n)
            rs = [x["ratio"] for x in paired[bar.name]]
            log(f"{bar.name}: per-round ratios {' '.join(f'{v:.3f}' for v in rs)} (median {statistics.median(rs):.3f})")
    bars = evaluate_bars(results, ceilings["copy"]["gb_s"], paired)
    return dict(
        benchmark="mla_decode", provenance=common.provenance() if dev.type == "cuda" else {},
        formulas={"kv_bytes": "batch * context * 576 * 2", "flops": "batch * 2 * heads * qlen * context * (576 + 512)",
                  "kv_gb_s": "kv_bytes / time", "tflops": "flops / time"},
        ceilings=ceilings, chosen_configs={k: dataclasses.asdict(v) for k, v in (chosen or {}).items()},
        kernel_resources={mla.RESOURCE_LABELS[k]: {"regs": v[0], "shared_bytes": v[1]}
                          for k, v in mla._RESOURCES.items()},
        tuning=tuning, results=results, bars=bars,
    )


def print_bars(bars: list[dict], log=print) -> None:
    for b in bars:
        v = "not measured" if b["value"] is None else f"{b['value']:.3g}"
        if "rounds" in b:
            v += f" ({b['method']}: {b['ratio_min']:.3g}-{b['ratio_max']:.3g}; the sweep's ratio {b['sweep_value']:.3g})"
        log(f"[{b['verdict']}] {b['name']}: {v} (target {b['target']:g})")


def main(args: argparse.Namespace) -> int:
    if getattr(args, "explore", None):
        explore(args.out, "compile", args.explore)
        explore(args.out, "time", args.explore)
        print(f"wrote {args.out}")
        return 0
    if getattr(args, "trace", False):
        trace_run(args.out)
        print(f"wrote {args.out}")
        return 0
    if getattr(args, "layouts", False):
        compare_layouts(args.out)
        print(f"wrote {args.out}")
        return 0
    grid = QUICK_GRID if args.quick else MAIN_GRID + QLEN_GRID
    n = getattr(args, "ratio_rounds", None)
    n = RATIO_ROUNDS if n is None else n
    payload = run(grid=grid, do_tune=args.tune, with_torch=not args.no_torch, ratio_rounds_n=n)
    path = common.write_json(args.out, payload)
    print_bars(payload["bars"])
    print(f"wrote {path}")
    return 0 if all(b["verdict"] == "PASS" for b in payload["bars"]) else 1
