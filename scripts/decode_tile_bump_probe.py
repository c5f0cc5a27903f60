"""Where the small-batch split kernel loses its time: per-tile %globaltimer stamps of the 16-head qlen-1 call.

The committed trace (``explore.trace``, B=16 L=4k) shows every program's fourth tile taking about 1.2 us longer
than the others (2.6 -> 3.7-3.8 us) with the default launch, and not with ``meta_before_wait``. This traces
variants that separate the candidate causes: the tile index (other contexts: 2k, 8k), the bytes of fp32
partials the previous call left dirty in L2 (4 splits instead of 8), the index pipeline (``idx_ahead`` off) and
the wait's position (``meta_before_wait``). Two interleaved rounds.

Run on an H200: PYTHONPATH=src python3 scripts/decode_tile_bump_probe.py [OUT.json]
"""
import dataclasses
import json
import statistics
import sys

import torch

from workbench import mla
from workbench.bench import common
from workbench.bench import decode as d


def tile_profile(r):
    """Median over programs of: wait, each tile's end, exit (us from the call's first entry), and tile diffs."""
    rows = [row for row in r["timeline"]["split_ns"] if row[1] is not None]
    n = max(len(row) for row in rows)
    cols = [[row[i] for row in rows if i < len(row) and row[i] is not None] for i in range(n)]
    med = [statistics.median(c) / 1e3 for c in cols if c]  # (slots past the last tile were never written)
    tiles = med[3:]
    diffs = [round(b - a, 2) for a, b in zip(tiles, tiles[1:])]
    exits = sorted(row[2] / 1e3 for row in rows)
    merges = [row[2] / 1e3 for row in r["timeline"]["merge_ns"] if row[2] is not None]
    return dict(wait=round(med[1], 2), first_tile=round(tiles[0] - med[1], 2), tile_diffs=diffs,
                exit_median=round(exits[len(exits) // 2], 2), exit_last=round(exits[-1], 2),
                merge_exit_last=round(max(merges), 2) if merges else None)


def main():
    dev = common.require_gpu()
    d.matmul_tflops()  # clocks out of idle
    pool = d.CachePool(16 * 8192, torch.bfloat16, dev)
    sm = mla._sm_count(dev)
    base = mla.triton_config(16, torch.bfloat16, 16 * 4096, gluon=False)  # the traced Triton tile
    variants = [
        ("default L4k", base, 4096, None),
        ("mbw L4k", dataclasses.replace(base, meta_before_wait=True), 4096, None),
        ("default L8k", base, 8192, None),
        ("default L2k", base, 2048, None),
        ("default L4k 4 splits", base, 4096, 4),
        ("no idx_ahead L4k", dataclasses.replace(base, idx_ahead=False), 4096, None),
    ]
    rows = []
    for rnd in range(2):
        for label, cfg, ctx, splits in variants:
            r = d.trace_point(pool, 16, 1, 16, ctx, config=cfg, num_splits=splits)
            prof = tile_profile(r)
            row = dict(round=rnd, label=label, context=ctx, config=r["label"], num_splits=r["num_splits"],
                       untraced_us=r["untraced_us"], traced_us=r["traced_us"], **prof)
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = (sys.argv[1:] or [None])[0]
    if out:
        common.write_json(out, dict(benchmark="mla_decode_tile_bump_probe", rows=rows, provenance=common.provenance(
            "PYTHONPATH=src python3 scripts/decode_tile_bump_probe.py OUT.json")))


if __name__ == "__main__":
    main()
