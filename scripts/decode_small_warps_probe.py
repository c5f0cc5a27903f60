"""Sixteen warps for the qlen-1 small-batch tile (twelfth session). Round 34 found the small calls spending about
9 us above their row stream, part of it a tile's math (about 0.4 us per 64-token tile above the stream's rate).
The small-batch tile (16x64, 3 stages, indices one tile ahead) runs on 8 warps; 4 spill on Triton 3.7.1 (255
registers), 16 compile to 98 registers without spills, so each warp has half the math of a tile. Timed against the
default, each also with 16-bit partials (``narrow_partials``), at the 16-head qlen-1 points that take the small
tile; three interleaved rounds under CUDA-graph replay, the cost model's split count; the outputs of the default
and the 16-warp variant compared bit for bit.

Run on an H200: PYTHONPATH=src python3 scripts/decode_small_warps_probe.py [OUT.json] [w4]

``w4``: the default (8 warps, since the committed run of this session with 16-bit partials) against 4 warps, which
spill 20 bytes on Triton 3.7.1 (255 registers) but load the query's fragments on half as many warps: each warp of
the tile reloads the whole query from shared memory for every tile (round 34's third run).
"""
import dataclasses
import sys

from workbench import mla
from workbench.bench import decode as d

POINTS = ((16, 1, 16, 4096), (16, 1, 32, 1024), (16, 1, 16, 8192), (16, 1, 8, 4096), (16, 1, 1, 32768),
          (16, 1, 64, 1024))


def variants_w4(base: mla.TritonConfig) -> list[tuple[str, mla.TritonConfig]]:
    return [("default", base), ("w4", dataclasses.replace(base, num_warps=4))]


def variants(base: mla.TritonConfig) -> list[tuple[str, mla.TritonConfig]]:
    base = dataclasses.replace(base, narrow_partials=False)  # as the first run measured it (before the change)
    return [("default", base), ("w16", dataclasses.replace(base, num_warps=16)),
            ("narrow", dataclasses.replace(base, narrow_partials=True)),
            ("w16_narrow", dataclasses.replace(base, num_warps=16, narrow_partials=True))]


if __name__ == "__main__":
    w4 = sys.argv[2:] == ["w4"]
    d.variant_probe(POINTS, variants_w4 if w4 else variants, "mla_decode_small_warps_probe",
                    "PYTHONPATH=src python3 scripts/decode_small_warps_probe.py OUT.json" + (" w4" if w4 else ""),
                    (sys.argv[1:] or [None])[0], same=("default", "w4" if w4 else "w16"))
