"""The early-softmax schedule of the warp-specialised gluon kernel (round 37, ``TritonConfig.ws_early``) against
its first schedule and the library's defaults at the compute-bound 16-head qlen-4/6/8 points and at 128 heads.

In the first schedule (round 22) a warpgroup issues ``S_t``, then the other warpgroup's ``P_{t-1} V_{t-1}``, and
waits for both before its softmax of tile ``t``. The softmaxes alternate between the warpgroups (each needs the
running max after the tile before), so every step of that chain also waited for a ``P V`` product. The early
schedule waits for ``S_t`` alone (``wgmma.wait_group 1``) and for the product only before its own ``P_t V_t``;
a third pair of mbarriers tells a warpgroup when the other one's product has finished reading its ``P`` slot.

Three interleaved rounds under CUDA-graph replay, bf16, each variant with the cost model's split count for its own
config. ``identical``: the two ws schedules' outputs are equal bit for bit (they add the same products in the same
order). Run on an H200: PYTHONPATH=src python3 scripts/decode_ws_early_probe.py [OUT.json] [rounds]
"""
import dataclasses
import sys

import torch

from workbench import mla
from workbench.bench import common
from workbench.bench import decode as d

POINTS = ((16, 4, 16, 4096), (16, 4, 64, 4096), (16, 4, 64, 32768), (16, 4, 128, 8192), (16, 6, 16, 4096),
          (16, 8, 16, 4096), (16, 8, 64, 4096), (16, 8, 128, 8192), (128, 1, 16, 4096), (128, 1, 64, 4096))

WS_EARLY_CONFIG = dataclasses.replace(mla.GLUON_WS_CONFIG, ws_early=True)


def library_config(rows: int, tokens: int, batch: int, sm: int) -> mla.TritonConfig:
    return mla.triton_config(rows, torch.bfloat16, tokens, num_reqs=batch, sm_count=sm)


if __name__ == "__main__":
    out = (sys.argv[1:] or [None])[0]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    rows = d.variant_probe(POINTS, lambda cfg: [("default", cfg), ("ws", mla.GLUON_WS_CONFIG), ("early", WS_EARLY_CONFIG)],
                           "mla_decode_ws_early_probe",
                           " ".join(["PYTHONPATH=src python3 scripts/decode_ws_early_probe.py OUT.json", *sys.argv[2:]]),
                           out, rounds=rounds, same=("ws", "early"), own_splits=True, base_config=library_config)
