"""16-bit partials for the qlen-1 small-batch tile (twelfth session): ``narrow_partials`` (the partial outputs in
q's dtype, LSE fp32, as FlashInfer keeps them and as the Gluon defaults have since round 32) against fp32 partials,
at every 16-head qlen-1 point of the benchmark grid that takes the small-batch tile (at most
``mla.SMALL_BATCH_TOKENS`` KV tokens) and more than one split. Round 29 found the small tile faster with them
(B=16 L=4k 30.5-31.4 against 31.2-32.1 us, B=1 L=32k 27.4-28.3 against 28.3-30.5), round 30's check found no
consistent gain at B=16 L=4k, and ``scripts/decode_small_warps_probe.py`` (this session) level there and 0.2-1.8 us
faster at B=1 L=32k, B=32 L=1k and B=64 L=1k. Three interleaved rounds under CUDA-graph replay, the cost model's
split count, the largest output difference between the two printed.

Run on an H200: PYTHONPATH=src python3 scripts/decode_small_narrow_probe.py [OUT.json]
"""
import dataclasses
import sys

from workbench import mla
from workbench.bench import decode as d

POINTS = tuple((16, 1, b, l) for b, l in ((1, 1024), (1, 4096), (1, 8192), (1, 32768), (16, 1024), (16, 4096),
                                          (16, 8192), (64, 1024), (64, 4096), (32, 1024), (8, 4096)))


def variants(base: mla.TritonConfig) -> list[tuple[str, mla.TritonConfig]]:
    fp32 = dataclasses.replace(base, narrow_partials=False)
    return [("fp32", fp32), ("narrow", dataclasses.replace(base, narrow_partials=True))]


if __name__ == "__main__":
    d.variant_probe(POINTS, variants, "mla_decode_small_narrow_probe",
                    "PYTHONPATH=src python3 scripts/decode_small_narrow_probe.py OUT.json", (sys.argv[1:] or [None])[0])
