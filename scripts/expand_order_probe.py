"""Two changes to the library's one-request program, timed at 256 x 4k and three other batches under the
benchmark's CUDA-graph replay (interleaved rounds), every output checked against the spec. Run on an H200:
PYTHONPATH=src python3 scripts/expand_order_probe.py [OUT.json] [ROUNDS]

  PFIRST  the prefix-sum loads (and their reduction) are issued before the block-id gather, not after it:
          the reduction then overlaps the gather's memory latency
  BC2D    the chunk is a (BLOCK_T // K, K) tile whose block ids are loaded as a (BLOCK_T // K, 1) column and
          broadcast along its rows (one load per block id and lane-row, in the tile's own layout: no shared
          memory), instead of one load per token
  U32     the prefix sum in uint32 (ExpandConfig.prefix_u32)
Each row also records the PTX's global loads, vector stores and shared-memory traffic of its kernel.
"""
import re
import sys

import torch
import triton
import triton.language as tl

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

K = 16


@triton.jit
def _kernel(block_table_ptr, stride, max_blocks, seq_lens_ptr, kv_indptr_ptr, kv_indices_ptr,
            K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, PFIRST: tl.constexpr,
            BC2D: tl.constexpr, U32: tl.constexpr, PDL: tl.constexpr = True, LOOP: tl.constexpr = False,
            IDLE: tl.constexpr = False):
    # LOOP, IDLE (scripts/expand_lean_probe.py): the library's chunk-striding loop after the first chunk, and its
    # prefix sum under the SKIP_IDLE condition (start = 0, then summed under an if that is always true)
    r = tl.program_id(1)
    c = tl.program_id(0)
    if PDL:
        E.pdl_wait_then_release()
    row = block_table_ptr + r.to(tl.int64) * stride
    tok0 = c * BLOCK_T
    if PFIRST:
        if IDLE:
            seq_len = tl.load(seq_lens_ptr + r).to(tl.int32)
            start = tl.zeros([], dtype=tl.int64)
            if (c == 0) | (tok0 < seq_len) | True:
                start = E._prefix_sum(seq_lens_ptr, r, BLOCK_R, False, U32)
        else:
            start = E._prefix_sum(seq_lens_ptr, r, BLOCK_R, False, U32)
            seq_len = tl.load(seq_lens_ptr + r).to(tl.int32)
    if BC2D:
        NB: tl.constexpr = BLOCK_T // K
        rows_ = tl.arange(0, NB)[:, None]
        b = tok0 // K + rows_
        blk = tl.load(row + b, mask=b < max_blocks, other=0)  # (NB, 1)
        lane = rows_ * K + tl.arange(0, K)[None, :]
        vals = (blk * K + lane % K).to(tl.int32)
    else:
        lane = tl.arange(0, BLOCK_T)
        vals = E._chunk_indices(row, max_blocks, tok0, K, BLOCK_T)
    if not PFIRST:
        seq_len = tl.load(seq_lens_ptr + r).to(tl.int32)
        start = E._prefix_sum(seq_lens_ptr, r, BLOCK_R, False, U32)
    if c == 0:
        tl.store(kv_indptr_ptr + r + 1, (start + seq_len).to(tl.int32))
        if r == 0:
            tl.store(kv_indptr_ptr, start.to(tl.int32))
    base = start + tok0
    if tok0 <= seq_len - BLOCK_T:
        if base % 4 == 0:
            tl.store(kv_indices_ptr + (base // 4) * 4 + lane, vals)
        else:
            tl.store(kv_indices_ptr + base + lane, vals)
    else:
        tl.store(kv_indices_ptr + base + lane, vals, mask=lane < seq_len - tok0)
    if LOOP:
        n_c = tl.num_programs(0)
        for chunk in range(c + n_c, tl.cdiv(seq_len, BLOCK_T), n_c):
            tok = chunk * BLOCK_T
            E._store_chunk(kv_indices_ptr, E._indices_of_chunk(row, max_blocks, tok, K, BLOCK_T, BC2D), start,
                           seq_len, tok, BLOCK_T, "", K, BC2D)


PTX = {"ld.global": r"ld\.global", "st.global.v4": r"st\.global(\.\w+)*\.v4", "st.global": r"st\.global",
       "shared": r"(ld|st)\.shared", "bar.sync": r"bar\.sync"}


def main():
    common.require_gpu()
    out_path = (sys.argv[1:] or [None])[0]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    rows = []
    cases = ((256, 4096, False), (100, 3000, True), (32, 32768, False), (1024, 1000, True))
    for rnd in range(rounds):
        for R, L, ragged in cases:
            bt, sl, ref_out, ref_indptr, out, indptr = BE.probe_batch(R, L, K, ragged=ragged, seed=rnd)
            cfg = E.expand_config(R, L)
            block_r = max(32, triton.next_power_of_2(R))
            variants = [("library", lambda: E.expand_page_indices(bt, sl, K, out=out, kv_indptr=indptr, max_seq_len=L,
                                                                  validate=False), ref_out, ref_indptr)]
            kernels = {}  # the probe kernel's launches, whose PTX is counted
            for pfirst, bc2d, u32 in ((0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0), (1, 0, 1), (1, 1, 1)):
                label = "probe" + "".join(f" {n}" for n, on in (("PFIRST", pfirst), ("BC2D", bc2d), ("U32", u32)) if on)
                grid = (triton.cdiv(L, cfg.block_t), R)
                kernels[label] = (lambda pfirst=pfirst, bc2d=bc2d, u32=u32, grid=grid: _kernel[grid](
                    bt, bt.stride(0), bt.shape[1], sl, indptr, out, K=K, BLOCK_T=cfg.block_t, BLOCK_R=block_r,
                    PFIRST=bool(pfirst), BC2D=bool(bc2d), U32=bool(u32), num_warps=cfg.num_warps, launch_pdl=True))
                variants.append((label, kernels[label], ref_out, ref_indptr))
            timed = BE.time_probe_variants(variants, out, indptr, round=rnd, R=R, L=L, block_t=cfg.block_t,
                                           num_warps=cfg.num_warps)
            for row in timed if rnd == 0 else ():
                if row["label"] in kernels:
                    ptx = kernels[row["label"]]().asm["ptx"]  # a launch returns the compiled kernel
                    torch.cuda.synchronize()
                    row["ptx"] = {n: len(re.findall(p, ptx)) for n, p in PTX.items()}
            rows += timed
    for row in rows:
        if "ptx" in row:
            print(row["R"], row["L"], row["label"], row["ptx"])
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_order_probe.py OUT.json [ROUNDS]",
                               out_path)


if __name__ == "__main__":
    main()
