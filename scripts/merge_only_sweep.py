"""The second-kernel merge alone over tiles and warp counts, at the shapes of the multi-split bar points.

``decode_merge_cost_probe`` found the merge of B=16 L=4k qlen 4 (1024 rows x 8 fp32 partials, 16 MB, from L2)
taking 7.2 us with the library's 16x16 tile on 4 warps: about 2.2 TB/s. Round 25 chose the tile over full
calls with 4 warps only; this sweeps rows per program (8-64), columns per program (16-128) and warps (1-8)
on the merge alone, random fp32 partials re-read every replay, two interleaved rounds under CUDA-graph replay;
then full calls at the shapes' bar points with the best tile (lowest mean of the rounds) against the
library's, three interleaved rounds (``TritonConfig.merge_block_r``, ``merge_block_d``, ``merge_warps``).

Run on an H200: PYTHONPATH=src python3 scripts/merge_only_sweep.py [OUT.json]
"""
import dataclasses
import json
import statistics
import sys

from decode_merge_cost_probe import round25_tile

from workbench.bench import common
from workbench.bench import decode as d

# (label, splits, folded rows) and the bar point of each: (heads, qlen, batch, context)
SHAPES = (("qlen4 B16", 8, 1024), ("qlen1 B16", 8, 256), ("qlen2 B16", 8, 512), ("qlen1 B128", 2, 2048))
POINTS = {"qlen4 B16": (16, 4, 16, 4096), "qlen1 B16": (16, 1, 16, 4096), "qlen2 B16": (16, 2, 16, 4096),
          "qlen1 B128": (16, 1, 128, 8192)}
TILES = [(r, c, w) for r in (8, 16, 32, 64) for c in (16, 32, 64, 128) for w in (1, 2, 4, 8)
         if 2 <= r * c // (32 * w) <= 64]  # 2 to 64 values of a split per thread


def cells(label: str, splits: int, total: int) -> list[dict]:
    lib = round25_tile(total, splits)  # the library's tile when this ran (round 25's, on 4 warps)
    return [dict(tile=[r, c], warps=w, us=d.time_merge_only(splits, total, r, c, num_warps=w),
                 library=(r, c) == lib and w == 4)
            for r, c, w in TILES
            if splits * r * c * 4 <= 64 * 1024]  # the cross-warp reduction of (splits, r, c) fp32 in shared memory


def main():
    rows = d.merge_only_rounds(SHAPES, cells, rounds=2)
    means: dict[tuple, list[float]] = {}
    for row in rows:
        means.setdefault((row["shape"], *row["tile"], row["warps"]), []).append(row["us"])
    best = {}
    for (shape, r, c, w), us in means.items():
        if shape not in best or statistics.mean(us) < best[shape][1]:
            best[shape] = ((r, c, w), statistics.mean(us))
    print("BEST", json.dumps(best))
    calls = []
    for shape, ((r, c, w), _) in best.items():
        def variants(base, r=r, c=c, w=w):
            return [("default", base),
                    ("best_tile", dataclasses.replace(base, merge_block_r=r, merge_block_d=c, merge_warps=w))]
        for row in d.variant_probe((POINTS[shape],), variants, "", "", rounds=3):
            calls.append(dict(row, shape=shape, best_tile=[r, c], best_warps=w))
    out = (sys.argv[1:] or [None])[0]
    if out:
        common.write_json(out, dict(benchmark="mla_merge_only_sweep", rows=rows, best=best, calls=calls,
                                    provenance=common.provenance(
                                        "PYTHONPATH=src python3 scripts/merge_only_sweep.py OUT.json")))


if __name__ == "__main__":
    main()
