"""Eager calls of the decode at one point, for a profiler: the workbench's default, or FlashMLA on the same cache.

    ncu --clock-control none -k regex:gluon_ws -c 1 --section ... python benchmarks/profile_decode.py 16x8:64:4k
    ncu --clock-control none -k regex:splitkv -c 1 --section ... python benchmarks/profile_decode.py 16x8:64:4k \
        --peer-path .peer/flashmla

Inputs as benchmarks/decode.py builds them (one input set: a page-64 cache, a random block table, the flat indices
the expansion makes of it). Two calls; the reports in benchmarks/results/ profiled the first launch of each kernel
(``-c 1``), ``--launch-skip 1`` takes the second. The same point as a bar of decode.py, so a report sits beside a
committed timing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode as bench_decode  # noqa: E402  (benchmarks/decode.py)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("point", help="HEADSxQLEN:BATCH:CONTEXT, e.g. 16x8:64:4k")
    ap.add_argument("--peer-path", default=None, help="run FlashMLA from this folder instead of the workbench")
    args = ap.parse_args()
    p = bench_decode.parse_point(args.point)
    fm = bench_decode.find_flashmla(args.peer_path) if args.peer_path else None  # raises if the folder holds none
    cache = bench_decode.make_cache([p], torch.device("cuda"))
    x = bench_decode.Inputs(cache, p, 1, seed=1)
    if fm is not None:
        fn, label = bench_decode.peer_call(fm, x), "FlashMLA"
    else:
        fn, label = bench_decode.workbench_call(x, "flat")
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    print(f"{p.key}: {label}, 2 calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
