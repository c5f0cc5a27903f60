"""Why is the library's kernel with ExpandConfig.prefix_first slower than scripts/expand_order_probe.py's lean
kernel with the same order? The lean kernel (PFIRST U32, and with the column broadcast BC2D) with the library's
chunk-striding loop added (LOOP) and with its prefix sum under the library's SKIP_IDLE condition (IDLE), against
the library (expand_config's launch, and prefix_first + prefix_u32 +- broadcast_blocks), at batches where the two
differed. Since the nineteenth session's rule, 'library' takes all three at 1024 x 1000 and 1536 x 700; the
committed run predates it.
Timed under the benchmark's CUDA-graph replay, interleaved rounds, every output checked against the spec.
Run on an H200: PYTHONPATH=src python3 scripts/expand_lean_probe.py [OUT.json] [ROUNDS]
"""
import dataclasses
import sys

import triton

from expand_order_probe import _kernel
from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

CASES = ((1, 97000, 16, False), (64, 8192, 16, False), (128, 8192, 16, False), (256, 4096, 16, False),
         (1024, 1000, 16, False), (1536, 700, 16, False), (100, 3000, 16, True), (1024, 1000, 1, True))


def main():
    common.require_gpu()
    out_path = (sys.argv[1:] or [None])[0]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    rows = []
    for rnd in range(rounds):
        for R, L, K, ragged in CASES:
            bt, sl, ref_out, ref_indptr, out, indptr = BE.probe_batch(R, L, K, ragged=ragged, seed=rnd)
            cfg = E.expand_config(R, L)
            block_r = max(32, triton.next_power_of_2(R))
            grid = (triton.cdiv(L, cfg.block_t), R)
            variants = []
            for label, c2 in (("library", cfg),
                              ("lib first u32", dataclasses.replace(cfg, prefix_first=True, prefix_u32=True,
                                                                    broadcast_blocks=False)),
                              ("lib first u32 bcast", dataclasses.replace(cfg, prefix_first=True, prefix_u32=True,
                                                                          broadcast_blocks=True))):
                variants.append((label, (lambda c2=c2, K=K: E.expand_page_indices(
                    bt, sl, K, out=out, kv_indptr=indptr, max_seq_len=L, validate=False, config=c2))))
            for bc2d in (False, True):
                for loop, idle in ((False, False), (True, False), (False, True), (True, True)):
                    label = "lean" + " BC2D" * bc2d + " LOOP" * loop + " IDLE" * idle
                    variants.append((label, (lambda bc2d=bc2d, loop=loop, idle=idle, K=K, grid=grid, block_r=block_r,
                                             cfg=cfg: _kernel[grid](
                        bt, bt.stride(0), bt.shape[1], sl, indptr, out, K=K, BLOCK_T=cfg.block_t, BLOCK_R=block_r,
                        PFIRST=True, BC2D=bc2d, U32=True, LOOP=loop, IDLE=idle, num_warps=cfg.num_warps,
                        launch_pdl=True))))
            tag = f" K={K}{' ragged' if ragged else ''}"
            rows += BE.time_probe_variants([(label + tag, fn, ref_out, ref_indptr) for label, fn in variants], out,
                                           indptr, round=rnd, R=R, L=L, K=K, ragged=ragged, num_warps=cfg.num_warps,
                                           block_t=cfg.block_t)
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_lean_probe.py OUT.json [ROUNDS]", out_path)


if __name__ == "__main__":
    main()
