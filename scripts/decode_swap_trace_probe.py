"""Where a call of the swapped gluon kernel (round 36, the default for at most 32 rows on Hopper) spends its time
(thirteenth session): ``bench.decode.trace_point`` (eight back-to-back calls in one CUDA graph, every program
writing %globaltimer stamps) at the small-batch bar point and two more, with the library's default config, and
the Triton small-batch tile it replaced at the bar point in the same run (round 34's trace, ``trace_round34``,
was on another machine). The per-program stamps are kept for the bar point's default only.

Run on an H200: PYTHONPATH=src python3 scripts/decode_swap_trace_probe.py OUT.json
"""
import json
import sys

import torch

from workbench import mla
from workbench.bench import common
from workbench.bench import decode as d

POINTS = ((16, 1, 16, 4096), (16, 2, 16, 4096), (16, 1, 64, 32768))

if __name__ == "__main__":
    dev = common.require_gpu()
    d.matmul_tflops()  # clocks out of idle
    copy = common.copy_bandwidth()
    pool = d.CachePool(max(b * l for _, _, b, l in POINTS), torch.bfloat16, dev)
    rows = []
    for rnd in range(2):
        for h, q, b, l in POINTS:
            configs = [None]
            if (h, q, b, l) == POINTS[0]:
                configs.append(mla.triton_config(16, torch.bfloat16, b * l, gluon=False))
            for cfg in configs:
                r = d.trace_point(pool, h, q, b, l, config=cfg)
                if rnd or cfg is not None or (h, q, b, l) != POINTS[0]:
                    r.pop("timeline")
                r["round"] = rnd
                rows.append(r)
                m = r["summary"]["median"]
                print(json.dumps({k: r[k] for k in ("round", "heads", "qlen", "batch", "context", "label",
                                                    "num_splits", "untraced_us", "traced_us")} | {"median": m}))
    common.write_json(sys.argv[1], dict(benchmark="mla_decode_swap_trace", ceilings={"copy": copy}, rows=rows,
                                        provenance=common.provenance(
                                            "PYTHONPATH=src python3 scripts/decode_swap_trace_probe.py OUT.json")))
