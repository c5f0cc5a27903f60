"""Round 33: the Triton split kernel asks L2 for the rows of its first tiles before its PDL wait
(TritonConfig.prefetch_before_wait: the metadata read L2-only before the wait, possibly stale, used only for prefetch
addresses), so that those DRAM reads overlap the kernel before it (in the benchmark, the previous call's merge).
1, 2 and 3 tiles against the default at the 16-head qlen-1 points of the bars (B=16 L=4k, B=64 L=32k, B=128 L=8k)
and B=1 L=32k, five interleaved rounds under CUDA-graph replay, the cost model's split count; outputs compared bit
for bit (a prefetch changes no value).

Run on an H200: PYTHONPATH=src python3 scripts/decode_prefetch_before_wait_probe.py [OUT.json] [ROUNDS]
"""
import dataclasses
import sys

from workbench import mla
from workbench.bench import decode as d

POINTS = ((16, 1, 16, 4096), (16, 1, 64, 32768), (16, 1, 128, 8192), (16, 1, 1, 32768), (16, 1, 16, 8192))


def variants(base: mla.TritonConfig) -> list[tuple[str, mla.TritonConfig]]:
    return [("default", base)] + [(f"pbw{n}", dataclasses.replace(base, prefetch_before_wait=n)) for n in (1, 2, 3)]


if __name__ == "__main__":
    args = sys.argv[1:]
    d.variant_probe(POINTS, variants, "mla_decode_prefetch_before_wait_probe",
                    "PYTHONPATH=src python3 scripts/decode_prefetch_before_wait_probe.py OUT.json [ROUNDS]",
                    (args or [None])[0], rounds=int((args[1:] or [5])[0]))
