"""Where the experimental warp-specialised gluon kernel (TritonConfig.gluon_ws) beats the default gluon kernel:
both timed through the library (mla.mla_decode_triton, cost-model split counts) over a grid of compute-bound
points, interleaved over two rounds, under the benchmark's CUDA-graph timer. Run on an H200:
PYTHONPATH=src python3 scripts/gluon_ws_grid.py OUT.json"""
import dataclasses
import json
import sys

import torch

from workbench import mla
from workbench.bench import common, decode as d

dev = common.require_gpu()
WS = dataclasses.replace(mla.GLUON_CONFIG, gluon_ws=True)
points = [(128, 1, b, l) for b in (16, 32, 64, 128) for l in (1024, 4096, 8192)]
points += [(16, q, b, l) for q in (4, 6, 8) for b in (16, 32, 64, 128) for l in (1024, 4096, 8192, 32768)
           if b * l <= 64 * 32768]
pool = d.CachePool(64 * 32768 + 64, torch.bfloat16, dev)
rows = []
for rnd in range(2):
    for h, q, b, l in points:
        x = d.make_inputs(pool, h, q, b, l, seed=3)
        out = torch.empty(b * q, h, 512, dtype=torch.bfloat16, device=dev)
        a = (x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], q, mla.default_sm_scale())
        rb = -(-q * h // 64)
        splits = mla.default_splits(mla.GLUON_CONFIG, b, rb, b * l, mla._sm_count(dev))
        row = dict(round=rnd, heads=h, qlen=q, batch=b, context=l, tokens=b * l, splits=splits)
        for name, cfg in (("gluon_us", mla.GLUON_CONFIG), ("ws_us", WS)):
            row[name] = d._graph_timer(lambda: mla.mla_decode_triton(*a, config=cfg, out=out))
        row["ws_over_gluon"] = row["ws_us"] / row["gluon_us"]
        rows.append(row)
        print(f"r{rnd} H{h} q{q} B{b} L{l} s{splits}: gluon {row['gluon_us']:.1f} ws {row['ws_us']:.1f} "
              f"({row['ws_over_gluon']:.3f})", flush=True)
json.dump(dict(provenance=common.provenance("PYTHONPATH=src python3 scripts/gluon_ws_grid.py OUT.json"),
               rows=rows), open(sys.argv[1], "w"), indent=1)
