"""Partial outputs in q's dtype (``TritonConfig.narrow_partials``, as FlashInfer's split-KV decode keeps them)
against fp32 partials, at the bar points and the other multi-split points.

A split call writes one partial output row of 512 values per split and folded row, and the merge reads them
all back: at B=16 L=4k that is 4 MB each way at qlen 1 and 16 MB at qlen 4 (the gluon kernel's programs
store 128 KB each). In bf16 both halve. Three interleaved rounds under CUDA-graph replay; ``max_diff`` is the
largest difference from the fp32-partial output (one more rounding of a partial). Where the default is the
warp-specialised gluon kernel the plain one is timed both ways too.

Run on an H200: PYTHONPATH=src python3 scripts/decode_narrow_partials_probe.py [OUT.json]
"""
import dataclasses
import sys

from workbench import mla
from workbench.bench import decode as d

# (heads, qlen, batch, context)
POINTS = ((16, 1, 16, 4096), (16, 4, 16, 4096), (16, 2, 16, 4096), (16, 8, 16, 4096), (16, 1, 64, 4096),
          (16, 4, 64, 4096), (16, 1, 128, 8192), (16, 1, 64, 32768), (16, 4, 64, 32768), (16, 1, 1, 32768),
          (128, 1, 16, 4096))


def variants(base: mla.TritonConfig) -> list[tuple[str, mla.TritonConfig]]:
    out = [("default", base), ("narrow", dataclasses.replace(base, narrow_partials=True))]
    if base.gluon_ws:
        plain = dataclasses.replace(base, gluon_ws=False)
        out += [("gluon", plain), ("gluon_narrow", dataclasses.replace(plain, narrow_partials=True))]
    return out


if __name__ == "__main__":
    d.variant_probe(POINTS, variants, "mla_decode_narrow_partials_probe",
                    "PYTHONPATH=src python3 scripts/decode_narrow_partials_probe.py OUT.json",
                    (sys.argv[1:] or [None])[0], same=("default", "narrow"), triton_up_to_32_rows=True)
