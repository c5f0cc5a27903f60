"""The gluon split kernel with 32-token tiles in four buffers (``TritonConfig(64, 32, 8, 4, gluon=True)``: three
tiles' copies in flight during a tile's math) against the default 64-token, two-buffer one, at the points where
the gluon kernels run.

With two 64-token buffers only the next tile is in flight while a tile is computed; at B=16 L=4k qlen 4 each
program streams 8 tiles, and the qlen-4 bar there is within 1-2 us of passing. Four 32-token buffers take the
same shared memory. Where the default is the warp-specialised kernel (which has four 32-token buffers and a
loader warpgroup), the plain 64-token kernel is timed too. Three interleaved rounds under CUDA-graph replay,
the cost model's split count.

Run on an H200: PYTHONPATH=src python3 scripts/decode_gluon_32x4_probe.py [OUT.json]
"""
import dataclasses
import sys

from workbench import mla
from workbench.bench import decode as d

POINTS = ((16, 4, 16, 4096), (16, 6, 16, 4096), (16, 8, 16, 4096), (16, 4, 64, 4096), (16, 4, 64, 32768),
          (16, 4, 128, 8192), (128, 1, 16, 4096), (128, 1, 64, 4096), (16, 2, 16, 4096))


def variants(base: mla.TritonConfig) -> list[tuple[str, mla.TritonConfig]]:
    plain = dataclasses.replace(base, gluon=True, gluon_ws=False, block_m=64, block_n=64, num_warps=8, num_stages=2,
                                idx_ahead=False) if not base.gluon else dataclasses.replace(base, gluon_ws=False)
    out = [("default", base)]
    if plain != base:
        out.append(("gluon", plain))
    return out + [("gluon_32x4", dataclasses.replace(plain, block_n=32, num_stages=4))]


if __name__ == "__main__":
    d.variant_probe(POINTS, variants, "mla_decode_gluon_32x4_probe",
                    "PYTHONPATH=src python3 scripts/decode_gluon_32x4_probe.py OUT.json", (sys.argv[1:] or [None])[0])
