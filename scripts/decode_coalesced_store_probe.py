"""Round 32: the gluon split kernels' output and partial stores, coalesced (TritonConfig.coalesced_store: staged in
the idle tile buffers, stored row-major in 16-byte vectors) against the wgmma accumulator layout's 8-byte (fp32)
or 4-byte (bf16) stores, with fp32 and with 16-bit partials (narrow_partials, first measured in round 29, before
round 30's one-warp merge). Points: where the gluon kernel is the default (B=16 L=4k qlen 4, the small-batch
bar point; 128 heads B=8 L=4k; B=32 L=1k qlen 4), where the warp-specialised one is (qlen 4 at B=64 L=4k and
L=32k and B=128 L=8k, qlen 8 at B=16 L=4k and B=64 L=32k, 128 heads at B=16 L=4k), 128 heads B=64 L=4k (one
split: the output itself is stored), and the Triton small-batch qlen-1 kernel with 16-bit partials (the other
half of the qlen-4 ratio). Three interleaved rounds under CUDA-graph replay, the cost model's split count;
outputs of default and coalesced compared bit for bit.

Run on an H200: PYTHONPATH=src python3 scripts/decode_coalesced_store_probe.py [OUT.json] [ROUNDS] [--after]
"""
import dataclasses
import sys

from workbench import mla
from workbench.bench import decode as d

POINTS = ((16, 4, 16, 4096), (16, 1, 16, 4096), (128, 1, 8, 4096), (16, 4, 32, 1024), (16, 4, 64, 4096),
          (16, 4, 64, 32768), (16, 4, 128, 8192), (16, 8, 16, 4096), (16, 8, 64, 32768), (128, 1, 16, 4096),
          (128, 1, 64, 4096))


# --after: the defaults after round 32 against the gluon config as round 31 left it, at the bar points and qlen 2
AFTER_POINTS = ((16, 2, 16, 4096), (16, 2, 64, 32768), (16, 4, 16, 4096), (16, 8, 16, 4096), (16, 4, 64, 4096),
                (16, 8, 64, 4096), (128, 1, 64, 4096), (16, 1, 16, 4096))


def after_variants(base: mla.TritonConfig) -> list[tuple[str, mla.TritonConfig]]:
    if base.gluon:
        return [("default", base), ("round31", dataclasses.replace(base, narrow_partials=False, coalesced_store=False))]
    return [("default", base)]


def variants(base: mla.TritonConfig) -> list[tuple[str, mla.TritonConfig]]:
    base = dataclasses.replace(base, narrow_partials=False, coalesced_store=False)  # as round 32 ran (before it)
    if base.gluon:
        return [("default", base), ("coalesced", dataclasses.replace(base, coalesced_store=True)),
                ("narrow", dataclasses.replace(base, narrow_partials=True)),
                ("narrow_coalesced", dataclasses.replace(base, narrow_partials=True, coalesced_store=True))]
    return [("default", base), ("narrow", dataclasses.replace(base, narrow_partials=True))]


if __name__ == "__main__":
    after = "--after" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--after"]
    d.variant_probe(AFTER_POINTS if after else POINTS, after_variants if after else variants,
                    "mla_decode_coalesced_store_probe",
                    "PYTHONPATH=src python3 scripts/decode_coalesced_store_probe.py OUT.json [ROUNDS] [--after]",
                    (args or [None])[0], rounds=int((args[1:] or [3])[0]))
