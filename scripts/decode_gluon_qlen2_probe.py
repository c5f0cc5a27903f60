"""Verification steps of two tokens at 16 heads (32 folded rows) on the gluon kernels instead of the Triton 32-row
tile that the default gives them.

``decode_gluon_32x4_probe`` timed the plain gluon kernel (64-row programs, half of each empty here) at B=16 L=4k
qlen 2: 35.6-36.3 us against 41.6-42.5 for the Triton default. This probe times qlen 2 over batch sizes and
contexts: the default, the gluon kernel and the warp-specialised one, each with the cost model's split count
for its own config. Three interleaved rounds under CUDA-graph replay.

Run on an H200: PYTHONPATH=src python3 scripts/decode_gluon_qlen2_probe.py [OUT.json]
"""
import sys

from workbench import mla
from workbench.bench import decode as d

POINTS = tuple((16, 2, b, l) for b, l in ((1, 4096), (1, 32768), (4, 8192), (16, 1024), (16, 4096), (16, 32768),
                                          (64, 1024), (64, 4096), (64, 32768), (128, 8192)))


def variants(base: mla.TritonConfig) -> list[tuple[str, mla.TritonConfig]]:
    return [("default", base), ("gluon", mla.GLUON_CONFIG), ("gluon_ws", mla.GLUON_WS_CONFIG)]


if __name__ == "__main__":
    d.variant_probe(POINTS, variants, "mla_decode_gluon_qlen2_probe",
                    "PYTHONPATH=src python3 scripts/decode_gluon_qlen2_probe.py OUT.json", (sys.argv[1:] or [None])[0],
                    own_splits=True)
