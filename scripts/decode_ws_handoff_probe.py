"""The hand-over schedule of the warp-specialised gluon kernel (round 38, ``TritonConfig.ws_handoff``) against its
first schedule and the library's defaults at the compute-bound 16-head qlen-4/6/8 points and at 128 heads (its first
run, ``explore["round38_ws_handoff"]``, was before the hand-over schedule became part of ``GLUON_WS_CONFIG``: there
``default`` was the first schedule where the library chose the warp-specialised kernel).

An Nsight Compute profile of the first schedule (128 heads, B=64 L=4k; ``explore["round38_ncu"]``) showed the
consumer warpgroups stalled about a fifth of their time at the wait for the other warpgroup's ``P``: each tile's
softmax needs the running max and sum after the tile before, so the softmaxes form one chain through both
warpgroups, and each link of it held a whole softmax (row max, exponentials, row sum, ``P`` store). In the
hand-over schedule only the running max passes in tile order, published as soon as a warpgroup has its tile's
row maxima; each warpgroup keeps its own share of the sum (both rescale by every tile's factor) and the shares are
added once at the end. (Round 37's first step, waiting for ``S`` alone so that the other warpgroup's product stays
in flight during a softmax, was bit-identical and no faster: ``explore["round37_ws_early"]``, commit a50e578.)

Three interleaved rounds under CUDA-graph replay, bf16, each variant with the cost model's split count for its own
config; ``max_diff``: the two ws schedules' largest output difference (one bf16 rounding at most: the sum's shares).
Run on an H200: PYTHONPATH=src python3 scripts/decode_ws_handoff_probe.py [OUT.json] [rounds]
"""
import dataclasses
import sys

from workbench import mla
from workbench.bench import decode as d

POINTS = ((16, 4, 16, 4096), (16, 4, 64, 4096), (16, 4, 64, 32768), (16, 4, 128, 8192), (16, 6, 16, 4096),
          (16, 8, 16, 4096), (16, 8, 64, 4096), (16, 8, 128, 8192), (128, 1, 16, 4096), (128, 1, 64, 4096))

FIRST_SCHEDULE = dataclasses.replace(mla.GLUON_WS_CONFIG, ws_handoff=False)  # GLUON_WS_CONFIG before round 38
WS_HANDOFF_CONFIG = dataclasses.replace(mla.GLUON_WS_CONFIG, ws_handoff=True)


if __name__ == "__main__":
    out = (sys.argv[1:] or [None])[0]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    d.variant_probe(POINTS, lambda cfg: [("default", cfg), ("ws", FIRST_SCHEDULE), ("handoff", WS_HANDOFF_CONFIG)],
                    "mla_decode_ws_handoff_probe",
                    " ".join(["PYTHONPATH=src python3 scripts/decode_ws_handoff_probe.py OUT.json", *sys.argv[2:]]),
                    out, rounds=rounds, same=("ws", "handoff"), own_splits=True, base_config=d.library_config)
