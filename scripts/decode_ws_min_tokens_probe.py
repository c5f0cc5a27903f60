"""Where the warp-specialised gluon kernel with the hand-over schedule (round 38) beats the plain 64-row gluon kernel
when each program takes few KV tokens: the library's rule (``mla.prefer_gluon_ws``) gave the warp-specialised
kernel only programs of at least ``GLUON_WS_MIN_TOKENS`` (1024) tokens, from round 23's grid, measured before
rounds 32 and 38 changed it.

Both kernels at the split count ``GLUON_CONFIG`` gets (the rule's, which both share), over 16-head qlen-3/4/8 and
128-head points whose programs take 32 to 2048 tokens, two interleaved rounds under CUDA-graph replay, bf16;
``tokens_per_program``: the mean. Run on an H200:
PYTHONPATH=src python3 scripts/decode_ws_min_tokens_probe.py [OUT.json] [rounds]
"""
import json
import sys

import torch

from workbench import mla
from workbench.bench import common
from workbench.bench import decode as d

HANDOFF = mla.GLUON_WS_CONFIG  # with the hand-over schedule since round 38
POINTS = tuple((16, q, b, l) for q in (3, 4, 8) for b in (1, 4, 16, 32, 64, 128) for l in (1024, 4096)) + tuple(
    (128, 1, b, l) for b in (1, 4, 16, 32) for l in (1024, 4096))

if __name__ == "__main__":
    out = (sys.argv[1:] or [None])[0]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    dev = common.require_gpu()
    d.matmul_tflops()  # clocks out of idle
    pool = d.CachePool(max(b * l for _, _, b, l in POINTS), torch.bfloat16, dev)
    sm = mla._sm_count(dev)
    rows = []
    for rnd in range(rounds):
        for h, q, b, l in POINTS:
            x = d.make_inputs(pool, h, q, b, l, seed=h * 1000 + q * 100 + b)
            rb = -(-q * h // 64)
            splits = mla.default_splits(mla.GLUON_CONFIG, b, rb, b * l, sm)
            row = dict(round=rnd, heads=h, qlen=q, batch=b, context=l, splits=splits,
                       tokens_per_program=l / splits)
            o = torch.empty(b * q, h, mla.KV_LORA_RANK, dtype=torch.bfloat16, device=dev)
            for name, cfg in (("gluon", mla.GLUON_CONFIG), ("handoff", HANDOFF)):
                row[name + "_us"] = d._graph_timer(lambda: mla.mla_decode_triton(  # noqa: B023
                    x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], q, None,
                    num_splits=splits, config=cfg, out=o))
            row["handoff_over_gluon"] = row["handoff_us"] / row["gluon_us"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    if out:
        common.write_json(out, dict(benchmark="mla_decode_ws_min_tokens_probe", rows=rows, provenance=common.provenance(
            " ".join(["PYTHONPATH=src python3 scripts/decode_ws_min_tokens_probe.py OUT.json", *sys.argv[2:]]))))
