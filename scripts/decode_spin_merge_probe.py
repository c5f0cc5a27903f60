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
import sys

from workbench import mla
from workbench.bench import decode as d

POINTS = ((16, 1, 16, 4096), (16, 2, 16, 4096), (16, 1, 1, 32768), (16, 1, 16, 8192), (16, 1, 64, 4096),
          (16, 1, 128, 8192), (16, 1, 64, 32768))


def variants(base: mla.TritonConfig) -> list[tuple[str, mla.TritonConfig]]:
    return [("default", base), ("spin", dataclasses.replace(base, spin_merge=True))]


if __name__ == "__main__":
    d.variant_probe(POINTS, variants, "mla_decode_spin_merge_probe",
                    "PYTHONPATH=src python3 scripts/decode_spin_merge_probe.py OUT.json", (sys.argv[1:] or [None])[0],
                    triton_up_to_32_rows=True)
