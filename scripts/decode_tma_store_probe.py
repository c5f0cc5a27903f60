"""Partials written by TMA (``TritonConfig.tma_store``) against the default register stores, at the bar points.

The small-batch trace (``explore["tile_bump_probe"]``) put about 1.1 us of the B=16 L=4k qlen-1 call in the
store of one program's 32 KB fp32 partial, the rate at which one SM streams its KV rows (about 29 GB/s per
SM); a qlen-4 program of the gluon kernel stores 128 KB. With ``tma_store`` a program whose row block is all
real stages the partial in shared memory and writes it with bulk copies. Three interleaved rounds under
CUDA-graph replay; each output compared bit for bit with the default's (the partials hold the same values).
Where the default is the warp-specialised gluon kernel (no ``tma_store`` there), the plain gluon kernel with
and without it is timed beside it; with one split there are no partials and only the default is timed.

Run on an H200: PYTHONPATH=src python3 scripts/decode_tma_store_probe.py [OUT.json]
"""
import dataclasses
import sys

from workbench import mla
from workbench.bench import decode as d

# (heads, qlen, batch, context)
POINTS = ((16, 1, 16, 4096), (16, 4, 16, 4096), (16, 2, 16, 4096), (16, 8, 16, 4096), (16, 1, 64, 4096),
          (16, 4, 64, 4096), (16, 1, 128, 8192), (16, 4, 128, 8192), (16, 1, 64, 32768), (16, 4, 64, 32768),
          (128, 1, 64, 4096))


def variants(base: mla.TritonConfig) -> list[tuple[str, mla.TritonConfig]]:
    base = dataclasses.replace(base, narrow_partials=False, coalesced_store=False)  # as round 27 ran (before round 32)
    if base.gluon_ws:
        plain = dataclasses.replace(base, gluon_ws=False)
        return [("default", base), ("gluon", plain), ("gluon_tma", dataclasses.replace(plain, tma_store=True))]
    return [("default", base), ("tma", dataclasses.replace(base, tma_store=True))]


if __name__ == "__main__":
    d.variant_probe(POINTS, variants, "mla_decode_tma_store_probe",
                    "PYTHONPATH=src python3 scripts/decode_tma_store_probe.py OUT.json", (sys.argv[1:] or [None])[0],
                    triton_up_to_32_rows=True)
