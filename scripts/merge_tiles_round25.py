"""Merge tiles (rows x columns per program of the second-kernel merge) with today's defaults: every call through
mla.mla_decode_triton with the config mla.triton_config picks for it (the PDL-launched gluon kernel, the
warp-specialised one for long programs, the Triton tiles up to 32 rows), only the merge tile changed; three
interleaved rounds under the benchmark's CUDA-graph timer ("auto": the tile the library picks; when round 25 ran,
before this round changed it, that was 16x32 above 256 rows). Run on an H200:
PYTHONPATH=src python3 scripts/merge_tiles_round25.py OUT.json"""
import dataclasses
import json
import sys

import torch

from workbench import mla
from workbench.bench import common, decode as d

dev = common.require_gpu()
sms = mla._sm_count(dev)
pool = d.CachePool(64 * 32768 + 64, torch.bfloat16, dev)
points = [(16, 4, 16, 4096), (16, 6, 16, 4096), (16, 8, 16, 4096), (16, 4, 32, 4096), (16, 4, 16, 8192),
          (16, 4, 64, 4096), (16, 4, 64, 32768), (16, 8, 64, 4096), (128, 1, 16, 4096), (16, 1, 16, 4096),
          (16, 2, 16, 4096), (16, 1, 64, 32768)]
tiles = (None, (16, 16), (32, 16), (32, 32), (16, 64), (8, 32))
rows = []
for rnd in range(3):
    for h, q, b, l in points:
        x = d.make_inputs(pool, h, q, b, l, seed=3)
        out = torch.empty(b * q, h, 512, dtype=torch.bfloat16, device=dev)
        base = d.pre_swap_config(q * h, b * l, b, sms)  # the defaults when this probe ran
        splits = mla.default_splits(base, b, -(-q * h // base.block_m), b * l, sms)
        row = dict(round=rnd, heads=h, qlen=q, batch=b, context=l, splits=splits, config=base.label,
                   auto_tile="x".join(map(str, base.merge_tile(b * q * h, splits))))
        for tile in tiles:
            cfg = base if tile is None else dataclasses.replace(base, merge_block_r=tile[0], merge_block_d=tile[1])
            key = "auto" if tile is None else "x".join(map(str, tile))
            row[key] = d._graph_timer(lambda: mla.mla_decode_triton(
                x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], q, config=cfg,
                num_splits=splits, out=out))
        rows.append(row)
        print(row, flush=True)
json.dump(dict(provenance=common.provenance("PYTHONPATH=src python3 scripts/merge_tiles_round25.py OUT.json"),
               rows=rows), open(sys.argv[1], "w"), indent=1)
