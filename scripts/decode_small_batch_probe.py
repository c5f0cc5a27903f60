"""The two small-batch bars after round 30 (B=16 L=4k, 16 heads: qlen 1 at 2.5 TB/s, qlen 4 at 1.25x qlen 1):
the split kernels and merge shapes left untried with the one-warp merge.

qlen 4 (the gluon kernel): the warp-specialised kernel, which the default takes only from 1024 tokens per
program, and two other one-warp merge tiles. qlen 1 (the Triton kernel): 16-bit partials (round 29's gain
there came with round 25's merge) and two other one-warp merge tiles. Three interleaved rounds under
CUDA-graph replay, the cost model's split count.

Run on an H200: PYTHONPATH=src python3 scripts/decode_small_batch_probe.py [OUT.json]
"""
import dataclasses
import sys

from workbench import mla
from workbench.bench import decode as d

POINTS = ((16, 1, 16, 4096), (16, 4, 16, 4096))


def variants(base: mla.TritonConfig) -> list[tuple[str, mla.TritonConfig]]:
    tiles = [(f"merge_{r}x{c}", dataclasses.replace(base, merge_block_r=r, merge_block_d=c, merge_warps=1))
             for r, c in ((8, 32), (16, 32), (8, 16))]
    if base.gluon:
        return [("default", base), ("gluon_ws", dataclasses.replace(base, gluon_ws=True))] + tiles
    return [("default", base), ("narrow", dataclasses.replace(base, narrow_partials=True))] + tiles


if __name__ == "__main__":
    d.variant_probe(POINTS, variants, "mla_decode_small_batch_probe",
                    "PYTHONPATH=src python3 scripts/decode_small_batch_probe.py OUT.json", (sys.argv[1:] or [None])[0])
