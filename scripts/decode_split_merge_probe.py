"""The split merge (``TritonConfig.split_merge``) against the default second-kernel merge, where the Triton split
kernel runs with more than one split.

The small-batch trace (``explore["tile_bump_probe"]``) has the merge kernel ending 2.7-3.0 us after the last
split program exits. With ``split_merge`` no second kernel runs: once a row block's partials are all stored
(a counter its programs poll), each of its split programs merges a 64-column slice of it. That needs the
whole grid resident at once (CUDA's occupancy query decides at launch; otherwise the second-kernel merge
runs). Three interleaved rounds under CUDA-graph replay; ``max_diff`` is the largest difference from the
default's output (the merges sum the same partials in another order).

Run on an H200: PYTHONPATH=src python3 scripts/decode_split_merge_probe.py [OUT.json]
"""
import dataclasses
import sys

from workbench import mla
from workbench.bench import decode as d

# (heads, qlen, batch, context): the Triton kernel's multi-split points
POINTS = ((16, 1, 16, 4096), (16, 2, 16, 4096), (16, 1, 16, 8192), (16, 1, 1, 32768), (16, 1, 4, 16384),
          (16, 1, 64, 4096), (16, 1, 128, 8192), (16, 1, 64, 32768))


def variants(base: mla.TritonConfig) -> list[tuple[str, mla.TritonConfig]]:
    return [("default", base), ("split_merge", dataclasses.replace(base, split_merge=True))]


if __name__ == "__main__":
    d.variant_probe(POINTS, variants, "mla_decode_split_merge_probe",
                    "PYTHONPATH=src python3 scripts/decode_split_merge_probe.py OUT.json", (sys.argv[1:] or [None])[0],
                    triton_up_to_32_rows=True)
