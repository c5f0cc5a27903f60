"""Where the index expansion's time goes at 256 x 4k: variants of the library kernel that differ only in how a
program finds where its request starts (the prefix sum of seq_lens), timed under the same CUDA-graph replay
as ``workbench bench expand``. Run on an H200: PYTHONPATH=src python3 scripts/expand_prefix_probe.py [OUT.json]

PREFIX modes (timing-only modes are marked: their output is wrong for ragged batches and is not used):
  0  the library's: each warp adds seq_lens[:r] into a 32-wide vector (8 scalar loads per lane at r = 255)
  1  (timing only) no prefix at all: start = r * L, the batch being uniform
  3  (timing only) only seq_lens[:32] summed (one load per lane, as at 32 x 32k)
  4  precomputed kv_indptr (the library's INDPTR_IN)
  5  one BLOCK_R-wide vector loaded in whole 16-byte groups plus a masked tail of at most 3 (with one warp the
     vector stays in the warp: 16-byte loads and shuffles only), summed in uint32
  6  mode 0 with the kv_indptr store after the chunk's stores
"""
import sys

import torch
import triton
import triton.language as tl

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE


@triton.jit
def _probe_kernel(block_table_ptr, block_table_stride, max_blocks, seq_lens_ptr, num_reqs, uniform_len,
                  kv_indptr_ptr, kv_indices_ptr, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr,
                  PREFIX: tl.constexpr, STORE_CACHE: tl.constexpr):
    r = tl.program_id(1)
    c = tl.program_id(0)
    n_c = tl.num_programs(0)
    row = block_table_ptr + r.to(tl.int64) * block_table_stride
    E.pdl_wait_then_release()
    tok0 = c * BLOCK_T
    vals = E._chunk_indices(row, max_blocks, tok0, K, BLOCK_T)
    if PREFIX == 4:
        start = tl.load(kv_indptr_ptr + r).to(tl.int64)
        seq_len = (tl.load(kv_indptr_ptr + r + 1) - tl.load(kv_indptr_ptr + r)).to(tl.int32)
    else:
        seq_len = tl.load(seq_lens_ptr + r).to(tl.int32)
        if PREFIX == 0 or PREFIX == 6:  # the library's prefix sum (mode 6 only moves the kv_indptr store)
            start = E._prefix_sum(seq_lens_ptr, r, BLOCK_R, False, False)
        elif PREFIX == 1:
            start = r.to(tl.int64) * uniform_len
        elif PREFIX == 5:
            o = tl.arange(0, BLOCK_R)
            vmask = (o // 4) * 4 + 4 <= num_reqs  # whole 16-byte groups only: the loads can be 16-byte vectors
            x = tl.load(seq_lens_ptr + o, mask=vmask, other=0).to(tl.uint32)
            ot = (num_reqs // 4) * 4 + tl.arange(0, 4)
            tail = tl.load(seq_lens_ptr + ot, mask=ot < r, other=0).to(tl.uint32)
            start = (tl.sum(tl.where(o < r, x, 0)) + tl.sum(tail)).to(tl.int64)
        else:
            lanes = tl.arange(0, 32)
            start = tl.sum(tl.load(seq_lens_ptr + lanes, mask=lanes < r, other=0).to(tl.int64)).to(tl.int64)
        if c == 0 and PREFIX != 6:
            tl.store(kv_indptr_ptr + r + 1, (start + seq_len).to(tl.int32))
    E._store_chunk(kv_indices_ptr, vals, start, seq_len, tok0, BLOCK_T, STORE_CACHE)
    if PREFIX == 6:
        if c == 0:
            tl.store(kv_indptr_ptr + r + 1, (start + seq_len).to(tl.int32))
    for chunk in range(c + n_c, tl.cdiv(seq_len, BLOCK_T), n_c):
        tok = chunk * BLOCK_T
        E._store_chunk(kv_indices_ptr, E._chunk_indices(row, max_blocks, tok, K, BLOCK_T), start, seq_len, tok,
                       BLOCK_T, STORE_CACHE)


def launcher(mode, block_table, seq_lens, out, indptr, L, block_t, warps, cs):
    R = block_table.shape[0]
    block_r = max(32, triton.next_power_of_2(R))
    grid = (triton.cdiv(L, block_t), R)
    return lambda: _probe_kernel[grid](block_table, block_table.stride(0), block_table.shape[1], seq_lens, R, L,
                                       indptr, out, K=16, BLOCK_T=block_t, BLOCK_R=block_r, PREFIX=mode,
                                       STORE_CACHE=".cs" if cs else "", num_warps=warps, launch_pdl=True)


def main():
    dev = common.require_gpu()
    rows = []
    cases = ((256, 4096), (32, 32768), (1, 97000), (100, 3000))
    for rnd in range(3):
        for R, L in cases:
            # ragged where R == 100: correctness of mode 5's tail and masks
            bt, sl, ref_out, ref_indptr, out, base = BE.probe_case(R, L, rnd, ragged=R == 100)
            rows += base
            for mode in (0, 1, 3, 4, 5, 6):
                for block_t, warps in ((1024, 4), (1024, 2), (1024, 1), (2048, 4), (2048, 2), (2048, 1), (4096, 8)):
                    for cs in (False, True):
                        if (cs or (block_t, warps) != (1024, 4)) and mode not in (0, 4, 5):
                            continue
                        indptr = ref_indptr.to(dev) if mode == 4 else torch.empty(R + 1, dtype=torch.int32, device=dev)
                        out.fill_(-1)
                        fn = launcher(mode, bt, sl, out, indptr, L, block_t, warps, cs)
                        us = common.time_cuda_graph(fn)
                        torch.cuda.synchronize()
                        ok = None
                        if mode != 1 or R == 1:
                            ok = bool(torch.equal(out.cpu(), ref_out)) and (
                                mode == 4 or bool(torch.equal(indptr.cpu()[1:], ref_indptr[1:])))
                        rows.append(dict(round=rnd, R=R, L=L, label=f"mode {mode} {block_t}/{warps}{' cs' if cs else ''}",
                                         us=us, agree=ok))
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_prefix_probe.py",
                               (sys.argv[1:] or [None])[0])


if __name__ == "__main__":
    main()
