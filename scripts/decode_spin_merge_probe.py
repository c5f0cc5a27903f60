"""The spin merge (``TritonConfig.spin_merge``) against the default second-kernel merge, at the points where the
Triton split kernel runs with more than one split (16 heads, qlen 1 and 2).

The small-batch trace (``explore["trace"]``, ``explore["tile_bump_probe"]``) has the merge ending 2.5-3.0 us
after the last split program exits: a wait for the whole split grid, then the merge's own loads. With the spin
merge each split program counts the partial rows it stored (release) and lets the merge launch right after its
own PDL wait; each merge program polls its rows' counts (acquire) and merges as soon as they are complete.
Three interleaved rounds under CUDA-graph replay, each output compared bit for bit with the default's.

Run on an H200: PYTHONPATH=src python3 scripts/decode_spin_merge_probe.py [OUT.json]
"""
import dataclasses
import json
import sys

import torch

from workbench import mla
from workbench.bench import common
from workbench.bench import decode as d

POINTS = ((16, 1, 16, 4096), (16, 2, 16, 4096), (16, 1, 1, 32768), (16, 1, 16, 8192), (16, 1, 64, 4096),
          (16, 1, 128, 8192), (16, 1, 64, 32768))


def main():
    dev = common.require_gpu()
    d.matmul_tflops()  # clocks out of idle
    copy = common.copy_bandwidth()
    pool = d.CachePool(max(b * l for _, _, b, l in POINTS), torch.bfloat16, dev)
    sm = mla._sm_count(dev)
    rows = []
    for rnd in range(3):
        for h, q, b, l in POINTS:
            x = d.make_inputs(pool, h, q, b, l, seed=h * 1000 + q * 100 + b)
            base = mla.triton_config(q * h, torch.bfloat16, b * l, num_reqs=b, sm_count=sm)
            splits = mla.default_splits(base, b, -(-q * h // base.block_m), b * l, sm)
            outs = {}
            row = dict(round=rnd, heads=h, qlen=q, batch=b, context=l, splits=splits, config=base.label)
            for name, cfg in (("default", base), ("spin", dataclasses.replace(base, spin_merge=True))):
                out = torch.empty(b * q, h, mla.KV_LORA_RANK, dtype=torch.bfloat16, device=dev)
                call = lambda: mla.mla_decode_triton(x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"],  # noqa: E731
                                                     x["kv_indices"], q, None, num_splits=splits, config=cfg, out=out)
                row[name + "_us"] = d._graph_timer(call)
                call()
                torch.cuda.synchronize()
                outs[name] = out.clone()
            row["identical"] = bool(torch.equal(outs["default"], outs["spin"]))
            row["kv_tb_s_spin"] = b * l * 1152 / (row["spin_us"] * 1e-6) / 1e12
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = (sys.argv[1:] or [None])[0]
    if out:
        common.write_json(out, dict(benchmark="mla_decode_spin_merge_probe", ceilings={"copy": copy}, rows=rows,
                                    provenance=common.provenance(
                                        "PYTHONPATH=src python3 scripts/decode_spin_merge_probe.py OUT.json")))


if __name__ == "__main__":
    main()
