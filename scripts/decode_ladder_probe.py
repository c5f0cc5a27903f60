"""Which tile a GPU with less shared memory than an H200 should step down to (seventeenth session).

``mla_decode_triton`` steps down ``mla.shared_memory_ladder`` when Triton refuses to load a kernel for lack of
shared memory (GPUs other than Hopper: the Gluon kernels are Hopper-only, and the Triton tiles tuned on the H200 can
exceed what an A100, a B200 or a 99 KB GPU gives a program). The first ladder halved the KV tile before the rows
and kept the 64-row tile's switches; on an H200 told it had 99 KB (``scripts/decode_small_gpu_probe.py``) it ended
at a 32x16 tile without indices one tile ahead, ten times slower than the Hopper default at B=64 L=32k qlen 4.
This times the rungs of both orders, with and without ``idx_ahead``, at the 64-row points (qlen 4 and 8, 128
heads), natively on the H200: the timing of a config is the same whether a smaller GPU or this one runs it here,
but says nothing about another GPU's own speed. Two interleaved rounds, CUDA-graph replay, bf16, each variant with
the cost model's split count for its own config; the baseline is the Triton 64-row default (Gluon off).

Run on an H200: PYTHONPATH=src python3 scripts/decode_ladder_probe.py [OUT.json]
"""
import dataclasses
import sys

import torch

from workbench import mla
from workbench.bench import decode as d

POINTS = ((128, 1, 64, 4096), (16, 4, 16, 4096), (16, 4, 64, 4096), (16, 8, 16, 4096), (16, 4, 128, 8192))


def variants(base: mla.TritonConfig) -> list[tuple[str, mla.TritonConfig]]:
    r = dataclasses.replace
    return [("default", base),
            ("64x64 s2", r(base, num_stages=2)), ("64x64 s2 ia", r(base, num_stages=2, idx_ahead=True)),
            ("64x32 s2", r(base, block_n=32, num_stages=2)),
            ("64x32 s2 ia", r(base, block_n=32, num_stages=2, idx_ahead=True)),
            ("32x16 s2", r(base, block_m=32, block_n=16, num_stages=2)),
            ("32x64 s2 ia", r(base, block_m=32, num_stages=2, idx_ahead=True)),
            ("32x32 w8 s2 ia", r(base, block_m=32, block_n=32, num_stages=2, idx_ahead=True)),
            ("16x32 w4 s3 ia", r(base, block_m=16, block_n=32, num_warps=4, num_stages=3, idx_ahead=True))]


def base_config(rows: int, tokens: int, batch: int, sm_count: int) -> mla.TritonConfig:
    return mla.triton_config(rows, torch.bfloat16, tokens, gluon=False)


if __name__ == "__main__":
    d.variant_probe(POINTS, variants, "mla_decode_ladder_probe", "PYTHONPATH=src python3 scripts/decode_ladder_probe.py OUT.json",
                    (sys.argv[1:] or [None])[0], rounds=2, own_splits=True, base_config=base_config)
