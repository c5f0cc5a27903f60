"""This checkout's defaults against another revision's, alternating in one process, at every bar point of the decode
and expansion benchmarks: did a change make any default slower?

    git worktree add /tmp/base lab-2026-12          # (or git archive REV src/workbench | tar -x -C DIR)
    python benchmarks/compare.py --baseline /tmp/base/src [--repeats 11] [--tolerance 0.02] [--out F.json]
                                 [--points 16x8:64:4k,128x1:16:4k]   (those decode points only, no expansion)

The baseline's ``workbench`` package is copied to a temporary folder as ``workbench_baseline`` (its imports
rewritten) so that both load side by side. Every point builds one set of inputs, and both revisions run their own
default launch on them (the config and split count each would choose); their outputs must agree (the expansion
bit for bit; the decode to a few bf16 ulps, since two kernels may sum in another order). Each repeat times both
twice, in mirrored order (A B B A, then B A A B), so a drift within a repeat weighs on both alike, and both write
into the same output buffers: where a buffer lies moves a short kernel (the 256 x 4k expansion into six different
buffers, the same code: medians 2.18-2.39 us on an H200). A point's verdict compares the median of the per-repeat
ratios (this / baseline) with ``1 + tolerance``. The decode timings cycle over enough input sets that L2 cannot
hold them (as in decode.py). ``--baseline`` given this checkout's own src measures the harness's noise floor.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

import workbench
from workbench import expand, mla
from workbench.bench import common

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode as bench_decode  # noqa: E402  (benchmarks/decode.py)

EXPAND_POINTS = ((512, 131_072), (1, 97_000), (256, 4_096))  # the expansion's bar cases, K = 16
EXPAND_K = 16


def load_baseline(src: str) -> Any:
    """The baseline revision's ``workbench`` package (``src`` is the folder holding it), imported as
    ``workbench_baseline``."""
    pkg = Path(src) / "workbench"
    if not (pkg / "__init__.py").exists():
        raise FileNotFoundError(f"--baseline {src}: no workbench/__init__.py there (give a checkout's src folder)")
    tmp = Path(tempfile.mkdtemp(prefix="wb_baseline_"))
    dst = tmp / "workbench_baseline"
    shutil.copytree(pkg, dst, ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    word = re.compile(r"\bworkbench(?=[. ])")  # module paths only ("workbench.x", "from workbench import")
    for f in dst.rglob("*.py"):
        f.write_text(word.sub("workbench_baseline", f.read_text()))
    data = pkg / "data"
    if data.exists():  # small data only (tuned tables); the big result files are not needed to launch kernels
        for j in data.rglob("*.json"):
            if j.stat().st_size < 200_000:
                target = dst / "data" / j.relative_to(data)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(j, target)
    sys.path.insert(0, str(tmp))
    return importlib.import_module("workbench_baseline")


def _summary(kind: str, key: str, per_repeat: list[dict[str, float]], tolerance: float, **extra: Any) -> dict:
    ratios = [t["this"] / t["baseline"] for t in per_repeat]
    ratio = statistics.median(ratios)
    return dict(kind=kind, point=key, this_us=statistics.median(t["this"] for t in per_repeat),
                baseline_us=statistics.median(t["baseline"] for t in per_repeat), ratio=ratio,
                ratio_range=[min(ratios), max(ratios)], verdict="PASS" if ratio <= 1 + tolerance else "MISS",
                repeats=per_repeat, **extra)


def compare_decode(base: Any, point: bench_decode.Point, cache: torch.Tensor, repeats: int, tolerance: float) -> dict:
    x = bench_decode.Inputs(cache, point, bench_decode.n_sets(point), seed=point.batch + point.heads)
    flat_cache = cache.view(-1, mla.QK_HEAD_DIM)
    outs = {name: [torch.empty_like(s["out"]) for s in x.sets] for name in ("this", "baseline")}

    def call(lib: Any, name: str):
        def run():
            for s, o in zip(x.sets, outs[name]):
                lib.mla.mla_decode_triton(s["q"], flat_cache, x.qo_indptr, x.kv_indptr, s["flat"], point.qlen, out=o)
        return run

    calls = {"this": call(workbench, "this"), "baseline": call(base, "baseline")}
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    ulp = bench_decode._max_ulp(outs["this"][0], outs["baseline"][0])
    calls = {"this": call(workbench, "this"), "baseline": call(base, "this")}  # timed: both write the same buffers
    this_cfg = mla.triton_launch_plan(x.sets[0]["q"], x.qo_indptr, x.sets[0]["flat"], point.qlen)
    base_cfg = base.mla.triton_launch_plan(x.sets[0]["q"], x.qo_indptr, x.sets[0]["flat"], point.qlen)
    times = bench_decode.mirrored_repeats(calls, repeats, len(x.sets))
    return _summary("decode", point.key, times, tolerance, max_ulp=ulp,
                    config=f"{this_cfg[0].label}, {this_cfg[1]} splits",
                    baseline_config=f"{base_cfg[0].label}, {base_cfg[1]} splits")


def compare_expand(base: Any, num_reqs: int, seq_len: int, repeats: int, tolerance: float) -> dict:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(num_reqs)
    blocks = -(-seq_len // EXPAND_K)
    ids = 1 + torch.randperm(num_reqs * blocks, generator=g, device=dev)
    table = ids.to(torch.int32).reshape(num_reqs, blocks)
    seq_lens = torch.full((num_reqs,), seq_len, dtype=torch.int32, device=dev)
    bufs = {n: (torch.empty(num_reqs * seq_len, dtype=torch.int32, device=dev),
                torch.empty(num_reqs + 1, dtype=torch.int32, device=dev)) for n in ("this", "baseline")}

    def call(lib: Any, name: str):
        out, indptr = bufs[name]
        return lambda: lib.expand.expand_page_indices(table, seq_lens, EXPAND_K, out=out, kv_indptr=indptr,
                                                      max_seq_len=seq_len, validate=False)

    calls = {"this": call(workbench, "this"), "baseline": call(base, "baseline")}
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    same = all(torch.equal(a, b) for a, b in zip(bufs["this"], bufs["baseline"]))
    if not same:
        raise AssertionError(f"the expansion of {num_reqs} x {seq_len} differs between the revisions")
    calls = {"this": call(workbench, "this"), "baseline": call(base, "this")}  # timed: both write the same buffers
    this_cfg = expand.expand_config(num_reqs, seq_len)
    times = bench_decode.mirrored_repeats(calls, repeats, 1)
    return _summary("expand", f"{num_reqs}x{seq_len}", times, tolerance, outputs_equal=same, config=repr(this_cfg))


def run(baseline: str, repeats: int, tolerance: float, points: list | None = None, log=print) -> dict[str, Any]:
    """Both revisions at every expansion bar case and every decode point of the grid, or at ``points`` only
    (decode points, :func:`decode.parse_point`'s; the expansion is then left out)."""
    common.require_gpu()
    base = load_baseline(baseline)
    rows = []
    for num_reqs, seq_len in EXPAND_POINTS if points is None else ():
        rows.append(compare_expand(base, num_reqs, seq_len, repeats, tolerance))
        log(_line(rows[-1]))
    points = bench_decode.POINTS if points is None else points
    cache = bench_decode.make_cache(points, torch.device("cuda"))
    for p in points:
        rows.append(compare_decode(base, p, cache, repeats, tolerance))
        log(_line(rows[-1]))
    return dict(benchmark="compare_revisions", baseline=str(baseline), repeats=repeats, tolerance=tolerance,
                points=[p.key for p in points],
                provenance=common.provenance(), results=rows,
                verdict="PASS" if all(r["verdict"] == "PASS" for r in rows) else "MISS")


def _line(r: dict) -> str:
    return (f"[{r['verdict']}] {r['kind']:6s} {r['point']:>12} this {r['this_us']:9.2f} us  baseline "
            f"{r['baseline_us']:9.2f} us  ratio {r['ratio']:.3f} ({r['ratio_range'][0]:.3f}-{r['ratio_range'][1]:.3f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="the src folder of the other revision's checkout")
    ap.add_argument("--repeats", type=int, default=11,
                    help="mirrored repeats per point (median; default 11)")
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--out", default="compare_revisions.json")
    ap.add_argument("--points", default=None,
                    help="comma-separated decode points HEADSxQLEN:BATCH:CONTEXT (default: the whole grid and the "
                         "expansion's cases)")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats is {args.repeats}; it must be at least 1")
    try:
        points = [bench_decode.parse_point(p) for p in args.points.split(",")] if args.points else None
    except ValueError as exc:
        ap.error(f"--points: {exc}")
    payload = run(args.baseline, args.repeats, args.tolerance, points)
    print(f"wrote {common.write_json(args.out, payload)}: {payload['verdict']}")
    return 0 if payload["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
