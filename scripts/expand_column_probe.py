"""Where do the order probe's two changes help? The library's one-request program against the same program with
its prefix loads first and a uint32 sum (PFIRST U32), and with the block ids also loaded as a column and broadcast
(PFIRST BC2D U32; scripts/expand_order_probe.py's kernel), over uniform and ragged batches and K = 1, 16, 64,
at the library's own launch parameters (only batches it runs with one request per program and a tight bound).
With --library, also the library's own kernel with ExpandConfig.prefix_first and prefix_u32 ('lib first u32')
and with broadcast_blocks too ('lib first u32 bcast': its one-dimensional broadcast of the block ids).
'library' is expand_config's launch: since the nineteenth session's rule (made from these runs) it takes those
three switches at batches of 512 or more requests of 257-2048 tokens; the committed runs predate the rule.
Timed under the benchmark's CUDA-graph replay, interleaved rounds, every output checked against the spec.
Run on an H200: PYTHONPATH=src python3 scripts/expand_column_probe.py [OUT.json] [ROUNDS] [--library]
"""
import dataclasses
import sys

import triton

from expand_order_probe import _kernel
from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

CASES = (  # (requests, tokens, K, ragged): ragged lengths are drawn from 1..tokens
    (1, 97000, 16, False), (4, 65536, 16, False), (32, 32768, 16, False), (64, 8192, 16, False),
    (128, 8192, 16, False), (256, 4096, 16, False), (256, 2048, 16, False), (512, 2000, 16, False),
    (512, 1024, 16, False), (768, 900, 16, False), (1024, 1000, 16, False), (1536, 700, 16, False),
    (100, 3000, 16, True), (256, 8192, 16, True), (512, 2000, 16, True), (1024, 1000, 16, True),
    (256, 4096, 1, False), (1024, 1000, 1, True), (256, 4096, 64, False), (1024, 1000, 64, True),
)
VARIANTS = (("PFIRST U32", False), ("PFIRST BC2D U32", True))


def main():
    common.require_gpu()
    library = "--library" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--library"]
    out_path = (args or [None])[0]
    rounds = int(args[1]) if len(args) > 1 else 3
    rows = []
    for rnd in range(rounds):
        for R, L, K, ragged in CASES:
            bt, sl, ref_out, ref_indptr, out, indptr = BE.probe_batch(R, L, K, ragged=ragged, seed=rnd)
            cfg = E.expand_config(R, L)
            assert cfg.group == 1, (R, L, cfg)
            block_r = max(32, triton.next_power_of_2(R))
            grid = (triton.cdiv(L, cfg.block_t), R)
            variants = [("library", lambda: E.expand_page_indices(bt, sl, K, out=out, kv_indptr=indptr, max_seq_len=L,
                                                                  validate=False))]
            if library:
                for label, bcast in (("lib first u32", False), ("lib first u32 bcast", True)):
                    c2 = dataclasses.replace(cfg, prefix_first=True, prefix_u32=True, broadcast_blocks=bcast)
                    variants.append((label, (lambda c2=c2, K=K: E.expand_page_indices(
                        bt, sl, K, out=out, kv_indptr=indptr, max_seq_len=L, validate=False, config=c2))))
            for label, bc2d in VARIANTS:
                variants.append((label, (lambda bc2d=bc2d, K=K, grid=grid, block_r=block_r, cfg=cfg: _kernel[grid](
                    bt, bt.stride(0), bt.shape[1], sl, indptr, out, K=K, BLOCK_T=cfg.block_t, BLOCK_R=block_r,
                    PFIRST=True, BC2D=bc2d, U32=True, num_warps=cfg.num_warps, launch_pdl=True))))
            tag = f" K={K}{' ragged' if ragged else ''}"
            rows += BE.time_probe_variants([(label + tag, fn, ref_out, ref_indptr) for label, fn in variants], out,
                                           indptr, round=rnd, R=R, L=L, K=K, ragged=ragged, num_warps=cfg.num_warps,
                                           block_t=cfg.block_t)
    common.report_probe_rounds(
        rows, "PYTHONPATH=src python3 scripts/expand_column_probe.py OUT.json [ROUNDS] [--library]", out_path)


if __name__ == "__main__":
    main()
