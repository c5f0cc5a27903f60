"""The second-kernel merge alone, with fp32 and with bf16 partials (``narrow_partials``), at the shapes of the
multi-split bar points: how much of a call the merge is, and what halving its input saves.

Random partials, re-read on every replay (so from L2 once warm: the lower bound of the merge inside a call,
whose partials were just written), the library's merge tile for each shape, three interleaved rounds under
CUDA-graph replay.

Run on an H200: PYTHONPATH=src python3 scripts/decode_merge_cost_probe.py [OUT.json]
"""
import json
import sys

import torch

from workbench import mla
from workbench.bench import common
from workbench.bench import decode as d

# (label, splits, folded rows): 16 heads at B=16 L=4k (qlen 1, 2, 4, 8), 128 heads B=16, B=128 L=8k qlen 1
SHAPES = (("qlen1 B16", 8, 256), ("qlen2 B16", 8, 512), ("qlen4 B16", 8, 1024), ("qlen8 B16", 4, 2048),
          ("H128 B16", 4, 2048), ("qlen1 B128", 2, 2048))


def main():
    common.require_gpu()
    d.matmul_tflops()
    cfg = mla.TritonConfig(16, 64, 8, 3)
    rows = []
    for rnd in range(3):
        for label, splits, total in SHAPES:
            br, bd = cfg.merge_tile(total, splits)
            row = dict(round=rnd, shape=label, splits=splits, rows=total, tile=[br, bd])
            for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
                row[name + "_us"] = d.time_merge_only(splits, total, br, bd, part_dtype=dt)
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = (sys.argv[1:] or [None])[0]
    if out:
        common.write_json(out, dict(benchmark="mla_decode_merge_cost_probe", rows=rows, provenance=common.provenance(
            "PYTHONPATH=src python3 scripts/decode_merge_cost_probe.py OUT.json")))


if __name__ == "__main__":
    main()
