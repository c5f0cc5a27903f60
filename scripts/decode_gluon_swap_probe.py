"""The swapped gluon split kernel (thirteenth session, ``workbench.mla_gluon_swap``, ``TritonConfig.gluon_swap``)
against the library's defaults at the 16-head qlen-1 points of the benchmark grid, small and large batches, and at
qlen 2 (32 rows, where the default is the warp-specialised gluon kernel with half-empty 64-row programs).

Round 34 found that the qlen-1 small-batch Triton tile reads about 300 KB of shared memory per 64-token tile (its
8 warps each reload the 16-row query), and that 256 KB of shared-memory reads per tile cost a row stream 1.4 us at
B=16 L=4k. The swapped kernel puts the tokens in wgmma's M: one warpgroup reads the tile and the query once each,
about 170 KB per tile. Three interleaved rounds under CUDA-graph replay, each variant with the cost model's split
count for its own config (``default``: the library's config before this probe); first every output is checked
against the fp32 golden (``<variant>_golden_max_err``: the default's error is the scale of what the library
already accepts).

Other modes (third argument), each against the library's config of the time:

* ``qlen4``: qlen 4 (64 rows) with the swapped kernel on two 32-row blocks per request (each reads every tile:
  twice the KV bytes, the second time mostly from L2), against the 64-row gluon kernels;
* ``rows64``: the swapped kernel on 64-row blocks, two warpgroups side by side along the rows (8 warps: each
  reads the whole tile and its 32 rows of q and P), at qlen 3-8 and 128 heads, against the 64-row gluon kernels;
* ``warps8``: the qlen-1 and qlen-2 defaults (one warpgroup) against the same kernel on two warpgroups.

Run on an H200: PYTHONPATH=src python3 scripts/decode_gluon_swap_probe.py [OUT.json] [rounds] [qlen4|rows64|warps8]
"""
import dataclasses
import json
import sys

import torch

from workbench import mla
from workbench.bench import common
from workbench.bench import decode as d

POINTS = tuple((16, 1, b, l) for b, l in ((1, 1024), (1, 4096), (1, 8192), (1, 32768), (16, 1024), (16, 4096),
                                          (16, 8192), (64, 1024), (64, 4096), (32, 1024), (8, 4096), (64, 32768),
                                          (128, 8192))) + ((16, 2, 16, 4096), (16, 2, 64, 4096), (16, 2, 1, 4096))


def golden_errors(points, make=mla.gluon_swap_config, base=d.pre_swap_config, log=print) -> list[dict]:
    """Largest |out - golden| of each variant at each point (one call each)."""
    dev = common.require_gpu()
    pool = d.CachePool(max(b * l for _, _, b, l in points), torch.bfloat16, dev)
    sm = mla._sm_count(dev)
    rows = []
    for h, q, b, l in points:
        x = d.make_inputs(pool, h, q, b, l, seed=h * 1000 + q * 100 + b)
        args = (x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"])
        ref, _ = mla.mla_decode_ref(*args, None)
        row = dict(heads=h, qlen=q, batch=b, context=l)
        for name, cfg in (("default", base(q * h, b * l, b, sm)), ("gswap", make(q * h))):
            n_s = mla.default_splits(cfg, b, -(-q * h // cfg.block_m), b * l, sm)
            o, _ = mla.mla_decode_triton(*args, q, None, num_splits=n_s, config=cfg)
            row[name + "_golden_max_err"] = float((o.float() - ref.float()).abs().max())
        rows.append(row)
        log(json.dumps(row))
    return rows


QLEN4_POINTS = ((16, 4, 16, 4096), (16, 4, 64, 4096), (16, 4, 64, 32768), (16, 4, 128, 8192))
ROWS64_POINTS = QLEN4_POINTS + ((16, 3, 16, 4096), (16, 6, 16, 4096), (16, 8, 16, 4096), (16, 8, 64, 4096),
                                (16, 8, 64, 32768), (128, 1, 16, 4096), (128, 1, 64, 4096))
WARPS8_POINTS = ((16, 1, 1, 4096), (16, 1, 16, 4096), (16, 1, 64, 4096), (16, 1, 64, 32768), (16, 1, 128, 8192),
                 (16, 2, 16, 4096), (16, 2, 64, 4096))


MODES = {  # mode: (points, the variant's config for a row count, the baseline)
    "qlen4": (QLEN4_POINTS, lambda rows: dataclasses.replace(mla.GLUON_SWAP_CONFIG, block_m=32), d.pre_swap_config),
    "rows64": (ROWS64_POINTS, lambda rows: dataclasses.replace(mla.GLUON_SWAP_CONFIG, block_m=64, num_warps=8),
               d.library_config),
    "warps8": (WARPS8_POINTS, lambda rows: dataclasses.replace(mla.gluon_swap_config(rows), num_warps=8),
               d.library_config),
}

if __name__ == "__main__":
    out = (sys.argv[1:] or [None])[0]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    # the variant: the library's default since this probe (the first run's config was the same)
    points, make, base = POINTS, mla.gluon_swap_config, d.pre_swap_config
    if sys.argv[3:]:
        points, make, base = MODES[sys.argv[3]]
    errs = golden_errors(points, make, base)
    # the variant's rows from the baseline's tile: 16 or 32 where it is made per row count (the default mode's
    # baseline has 16 rows at qlen 1 and 64 at qlen 2; warps8's has the row count's own); the other modes ignore it
    rows = d.variant_probe(points, lambda cfg: [("default", cfg), ("gswap", make(min(cfg.block_m, 32)))],
                           "mla_decode_gluon_swap_probe", "", None, rounds=rounds, own_splits=True,
                           base_config=base)
    if out:
        common.write_json(out, dict(benchmark="mla_decode_gluon_swap_probe", rows=rows, golden=errs,
                                    provenance=common.provenance(" ".join(
                                        ["PYTHONPATH=src python3 scripts/decode_gluon_swap_probe.py OUT.json",
                                         *sys.argv[2:]]))))
