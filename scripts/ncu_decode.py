"""Run the library's Triton decode eagerly a few times at one shape, for a profiler (ncu) to attach to.

Usage (on a GPU machine): ncu -k regex:_mla_decode_split_kernel -s 2 -c 1 --section SpeedOfLight \
    python3 scripts/ncu_decode.py HEADS QLEN BATCH CONTEXT [RUN]
"""

import sys

import torch

from workbench import mla
from workbench.bench import decode

heads, qlen, batch, context = (int(a) for a in sys.argv[1:5])
run = int(sys.argv[5]) if len(sys.argv) > 5 else 1
pool = decode.CachePool(batch * context + 64, torch.bfloat16, torch.device("cuda"), run=run)
x = decode.make_inputs(pool, heads, qlen, batch, context)
for _ in range(4):
    mla.mla_decode_triton(x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], qlen, None)
torch.cuda.synchronize()
