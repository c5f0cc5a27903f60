"""Where the warp-specialised gluon kernel with the hand-over schedule (round 38) beats the plain 64-row gluon kernel
when each program takes few KV tokens: the library's rule (``mla.prefer_gluon_ws``) gave the warp-specialised
kernel only programs of at least ``GLUON_WS_MIN_TOKENS`` (1024) tokens, from round 23's grid, measured before
rounds 32 and 38 changed it.

Both kernels at the split count ``GLUON_CONFIG`` gets (the rule's, which both share), over 16-head qlen-3/4/8 and
128-head points whose programs take 64 to 4096 tokens, two interleaved rounds under CUDA-graph replay, bf16
(:func:`workbench.bench.decode.variant_probe`; a program's tokens are ``context / splits`` on average). Run on an H200:
PYTHONPATH=src python3 scripts/decode_ws_min_tokens_probe.py [OUT.json] [rounds]
"""

import sys

from workbench import mla
from workbench.bench import decode as d

HANDOFF = mla.GLUON_WS_CONFIG  # with the hand-over schedule since round 38
POINTS = tuple((16, q, b, l) for q in (3, 4, 8) for b in (1, 4, 16, 32, 64, 128) for l in (1024, 4096)) + tuple(
    (128, 1, b, l) for b in (1, 4, 16, 32) for l in (1024, 4096))

if __name__ == "__main__":
    out = (sys.argv[1:] or [None])[0]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    # the baseline is the plain kernel at its own split count, which the ws kernel shares (own_splits=False)
    d.variant_probe(POINTS, lambda cfg: [("gluon", cfg), ("handoff", HANDOFF)], "mla_decode_ws_min_tokens_probe",
                    " ".join(["PYTHONPATH=src python3 scripts/decode_ws_min_tokens_probe.py OUT.json", *sys.argv[2:]]),
                    out, rounds=rounds, base_config=lambda rows, tokens, batch, sm: mla.GLUON_CONFIG)
