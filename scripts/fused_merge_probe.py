"""The last-split ("fused") merge against the second-kernel merge at the small-batch points, with the library's
small-batch Triton tile, timed through mla.mla_decode_triton under the benchmark's CUDA-graph timer (three
interleaved rounds); every variant first checked against the golden on a ragged case. Run on an H200:
PYTHONPATH=src python3 scripts/fused_merge_probe.py OUT.json"""
import dataclasses
import json
import sys

import torch

from workbench import mla
from workbench.bench import common, decode as d

sys.path.insert(0, "tests")
from test_mla import check_against_golden, make_case  # noqa: E402

dev = common.require_gpu()
base = mla.triton_config(16, torch.bfloat16, 65536, gluon=False)  # the Triton tile (the fused merge is its mode)
variants = {"second-kernel merge": base, "fused merge": dataclasses.replace(base, fused_merge=True)}
for name, cfg in variants.items():  # correctness first
    case = make_case([1] * 5, [4099, 1, 100, 2000, 37], 16, dtype=torch.bfloat16, device="cuda", seed=5)
    for s in (3, 8):
        o, l = mla.mla_decode_triton(case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                     case["kv_indices"], 1, 0.07, config=cfg, num_splits=s)
        check_against_golden(case, o, l, torch.bfloat16, 0.07, f"{name} s{s}")
print("correctness ok", flush=True)
pool = d.CachePool(64 * 8192 + 64, torch.bfloat16, dev)
rows = []
points = [(16, 1, 16, 4096), (16, 1, 16, 1024), (16, 1, 16, 8192), (16, 1, 1, 32768), (16, 1, 32, 4096),
          (16, 2, 16, 4096)]
for rnd in range(3):
    for h, q, b, l in points:
        x = d.make_inputs(pool, h, q, b, l, seed=7)
        out = torch.empty(b * q, h, 512, dtype=torch.bfloat16, device=dev)
        a = (x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], q, mla.default_sm_scale())
        cfg0 = d.pre_swap_config(q * h, b * l, b, mla._sm_count(dev))  # the defaults when this probe ran
        splits = mla.default_splits(cfg0, b, 1, b * l, mla._sm_count(dev))
        row = dict(round=rnd, heads=h, qlen=q, batch=b, context=l, splits=splits, config=cfg0.label)
        for name, cfg in (("second-kernel merge", cfg0), ("fused merge", dataclasses.replace(cfg0, fused_merge=True))):
            row[name] = d._graph_timer(lambda: mla.mla_decode_triton(*a, config=cfg, num_splits=splits, out=out))
        rows.append(row)
        print(row, flush=True)
json.dump(dict(provenance=common.provenance("PYTHONPATH=src python3 scripts/fused_merge_probe.py OUT.json"),
               rows=rows), open(sys.argv[1], "w"), indent=1)
