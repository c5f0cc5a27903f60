"""One load per block id (``ExpandConfig.broadcast_blocks``, twelfth session). The library kernel loads the block
id of every token: 32 scalar loads per lane for a 1024-token chunk on one warp, where 16 neighbouring tokens share
an id at K = 16. With the switch a chunk loads its ``block_t // K`` ids once and broadcasts them over a
``(block_t // K, K)`` tile. Timed against the library's launch at several batches, with other warp counts at
256 x 4k, and beside store-only kernels of several shapes (the floor any kernel writing that many int32 pays:
is the one-shape floor of the earlier probes, 1024 entries on 4 warps per program, the lowest?). Every
expansion's output is checked against the dense torch expansion.

Run on an H200: PYTHONPATH=src python3 scripts/expand_broadcast_probe.py [OUT.json] [ROUNDS] [batches]
(``batches``: ``first`` (default) the cases above; ``rule`` batches of many requests with one chunk each, where
the first run found the switch faster (1024 x 1000), beside batches with several chunks per request, at K = 16 and
64, for a rule; no store-only rows; ``ragged`` batches whose lengths are drawn from 1..L, at K = 1, 16 and 64.)
"""
import dataclasses
import sys

import torch
import triton

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

CASES = ((256, 4096), (1, 97000), (32, 32768), (1024, 1000), (64, 8192), (2048, 200))
RULE_CASES = ((1024, 1000, 16), (512, 1000, 16), (1024, 512, 16), (1536, 700, 16), (1024, 1024, 16), (768, 900, 16),
              (256, 1000, 16), (128, 1000, 16), (512, 2000, 16), (256, 4096, 16), (128, 8192, 16), (1024, 1000, 64),
              (256, 4096, 64), (1024, 1000, 1))
RAGGED_CASES = tuple((R, L, K) for K in (16, 1, 64) for R, L in ((1024, 2000), (512, 2000), (1024, 1000), (256, 8192),
                                                                 (128, 32768), (2048, 1000)))
STORE_SHAPES = ((1024, 4), (1024, 1), (1024, 2), (2048, 4), (4096, 4), (4096, 8), (512, 1), (256, 1))


def store_only_rows(n: int, R: int, L: int, rnd: int) -> list[dict]:
    out = torch.empty(n, dtype=torch.int32, device="cuda")
    rows = []
    for block, warps in STORE_SHAPES:
        us = common.time_cuda_graph(lambda: BE._store_only_kernel[(triton.cdiv(n, block),)](
            out, n, BLOCK=block, num_warps=warps, PDL=True, launch_pdl=True))
        rows.append(dict(round=rnd, R=R, L=L, label=f"store only {block}/{warps}", us=us))
    return rows


def main():
    common.require_gpu()
    rounds = int((sys.argv[2:] or [3])[0])
    rows = []
    batches = (sys.argv[3:] or ["first"])[0]
    if batches in ("rule", "ragged"):
        for rnd in range(rounds):
            for R, L, K in RULE_CASES if batches == "rule" else RAGGED_CASES:
                lib = E.expand_config(R, L)
                got = BE.time_expand_variants(R, L, L, [(f"K{K} library", L, lib), (f"K{K} bcast", L, dataclasses.replace(
                    lib, broadcast_blocks=True))], rnd, K=K, ragged=batches == "ragged")
                rows += got
                print(*(f"{r['R']}x{r['L']} {r['label']}: {r['us']:.3f} us agree={r.get('agree')}" for r in got),
                      sep="\n", flush=True)
        common.report_probe_rounds(rows, f"PYTHONPATH=src python3 scripts/expand_broadcast_probe.py OUT.json ROUNDS {batches}",
                                   (sys.argv[1:] or [None])[0])
        return
    for rnd in range(rounds):
        for R, L in CASES:
            lib = E.expand_config(R, L)
            variants = [("library", L, lib), ("bcast", L, dataclasses.replace(lib, broadcast_blocks=True))]
            if (R, L) == (256, 4096):
                for bt, w in ((1024, 2), (1024, 4), (2048, 2), (2048, 4), (512, 1)):
                    variants.append((f"bcast {bt}/{w}", L, dataclasses.replace(lib, broadcast_blocks=True, block_t=bt,
                                                                                num_warps=w)))
            got = BE.time_expand_variants(R, L, L, variants, rnd)
            if (R, L) in ((256, 4096), (1, 97000)):
                got += store_only_rows(R * L, R, L, rnd)
            rows += got
            print(*(f"{r['R']}x{r['L']} {r['label']}: {r['us']:.3f} us agree={r.get('agree')}" for r in got),
                  sep="\n", flush=True)
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_broadcast_probe.py OUT.json [ROUNDS]",
                               (sys.argv[1:] or [None])[0])


if __name__ == "__main__":
    main()
