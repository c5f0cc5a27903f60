"""What the ``kv_indptr`` store costs the index expansion at 256 x 4k, and cheaper ways to write it.

The library kernel has each request's first chunk-program store ``kv_indptr[r + 1]``: 256 four-byte stores
from 256 programs into the same eight 128-byte lines. The seventh session's prefix probe hinted that these
stores, not the prefix sum, hold it above 2 us: a kernel with no prefix at all that still stored ``kv_indptr``
(1.98-2.05 us) was slower than one that read a precomputed ``kv_indptr`` and stored none (1.89-1.98).

Variants (same CUDA-graph replay as ``workbench bench expand``; all compute the prefix sum of ``seq_lens`` in
the kernel unless said otherwise):
  scattered   the library's: every request's chunk-0 program stores its kv_indptr entry
  none        (timing only) no kv_indptr store at all: kv_indices are right, kv_indptr is not written
  grouped     chunk-0 programs of requests r = 0, 32, 64, ... store 32 entries each (one 128-byte line, one
              warp-wide cumsum of seq_lens[r:r+32]); the last request's program stores the final entry
  single      program (0, 0) stores all of kv_indptr (one cumsum over the whole batch)
  given       kv_indptr is read, precomputed (the library's precomputed_kv_indptr=True): no prefix, no store
  given+scat  (timing only) as "given", plus the library's scattered store into a second buffer

Run on an H200: PYTHONPATH=src python3 scripts/expand_indptr_probe.py [OUT.json]
"""
import sys

import torch
import triton
import triton.language as tl

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

STORES = {"scattered": 1, "none": 0, "grouped": 2, "single": 3, "given": 0, "given+scat": 1}


@triton.jit
def _probe_kernel(block_table_ptr, block_table_stride, max_blocks, seq_lens_ptr, num_reqs, kv_indptr_ptr,
                  indptr_out_ptr, kv_indices_ptr, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr,
                  GIVEN: tl.constexpr, STORE: tl.constexpr, PDL: tl.constexpr = True):
    r = tl.program_id(1)
    c = tl.program_id(0)
    n_c = tl.num_programs(0)
    row = block_table_ptr + r.to(tl.int64) * block_table_stride
    if PDL:
        E.pdl_wait_then_release()
    tok0 = c * BLOCK_T
    vals = E._chunk_indices(row, max_blocks, tok0, K, BLOCK_T)
    if GIVEN:
        start = tl.load(kv_indptr_ptr + r).to(tl.int64)
        seq_len = (tl.load(kv_indptr_ptr + r + 1) - tl.load(kv_indptr_ptr + r)).to(tl.int32)
    else:  # the library's prefix sum (a warp-wide 32-entry vector, reduced once)
        seq_len = tl.load(seq_lens_ptr + r).to(tl.int32)
        start = E._prefix_sum(seq_lens_ptr, r, BLOCK_R, False, False)
    if c == 0:
        if STORE == 1:
            tl.store(indptr_out_ptr + r + 1, (start + seq_len).to(tl.int32))
            if r == 0:
                tl.store(indptr_out_ptr, start.to(tl.int32))
        elif STORE == 2:
            if r % 32 == 0:
                j = tl.arange(0, 32)
                xg = tl.load(seq_lens_ptr + r + j, mask=r + j < num_reqs, other=0).to(tl.int64)
                excl = tl.cumsum(xg, 0) - xg
                tl.store(indptr_out_ptr + r + j, (start + excl).to(tl.int32), mask=r + j < num_reqs)
            if r == num_reqs - 1:
                tl.store(indptr_out_ptr + num_reqs, (start + seq_len).to(tl.int32))
        elif STORE == 3:
            if r == 0:
                oa = tl.arange(0, BLOCK_R)
                xa = tl.load(seq_lens_ptr + oa, mask=oa < num_reqs, other=0).to(tl.int64)
                tl.store(indptr_out_ptr + 1 + oa, tl.cumsum(xa, 0).to(tl.int32), mask=oa < num_reqs)
                tl.store(indptr_out_ptr, 0)
    E._store_chunk(kv_indices_ptr, vals, start, seq_len, tok0, BLOCK_T, "")
    for chunk in range(c + n_c, tl.cdiv(seq_len, BLOCK_T), n_c):
        tok = chunk * BLOCK_T
        E._store_chunk(kv_indices_ptr, E._chunk_indices(row, max_blocks, tok, K, BLOCK_T), start, seq_len, tok,
                       BLOCK_T, "")


def launcher(variant, block_table, seq_lens, out, indptr, indptr_out, L, block_t, warps):
    R = block_table.shape[0]
    block_r = max(32, triton.next_power_of_2(R))
    grid = (triton.cdiv(L, block_t), R)
    given = variant.startswith("given")
    return lambda: _probe_kernel[grid](block_table, block_table.stride(0), block_table.shape[1], seq_lens, R,
                                       indptr, indptr_out, out, K=16, BLOCK_T=block_t, BLOCK_R=block_r,
                                       GIVEN=given, STORE=STORES[variant], num_warps=warps, launch_pdl=True)


def main():
    dev = common.require_gpu()
    rows = []
    cases = ((256, 4096), (32, 32768), (1, 97000), (100, 3000), (1000, 300))
    shapes = ((1024, 4), (1024, 2), (1024, 1))
    for rnd in range(3):
        for R, L in cases:
            # ragged where R in (100, 1000): the grouped and single stores' masks and tails
            bt, sl, ref_out, ref_indptr, out, base = BE.probe_case(R, L, rnd, ragged=R in (100, 1000))
            rows += base
            for variant in STORES:
                for block_t, warps in shapes:
                    given = variant.startswith("given")
                    indptr = ref_indptr.to(dev) if given else torch.full((R + 1,), -7, dtype=torch.int32, device=dev)
                    indptr_out = torch.full((R + 1,), -7, dtype=torch.int32, device=dev) if given else indptr
                    out.fill_(-1)
                    fn = launcher(variant, bt, sl, out, indptr, indptr_out, L, block_t, warps)
                    us = common.time_cuda_graph(fn)
                    torch.cuda.synchronize()
                    ok = bool(torch.equal(out.cpu(), ref_out))
                    if STORES[variant]:
                        ok = ok and bool(torch.equal(indptr_out.cpu(), ref_indptr))
                    rows.append(dict(round=rnd, R=R, L=L, label=f"{variant} {block_t}/{warps}", us=us, agree=ok))
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_indptr_probe.py",
                               (sys.argv[1:] or [None])[0])


if __name__ == "__main__":
    main()
