"""The dependency chain of a one-launch expansion at 256 x 4k, link by link: kernels that each add one link of
the library's chain (wait for the kernel before -> load seq_lens -> sum them -> store at addresses that depend
on the sum), with made-up values instead of block ids unless marked 'gather'. Timed under the benchmark's
CUDA-graph replay, interleaved rounds, every output checked. Run on an H200:
PYTHONPATH=src python3 scripts/expand_chain_probe.py [OUT.json] [ROUNDS]

  store only             out[i] = i, no loads
  prefix, fixed address  the library's prefix sum of seq_lens[:r] (r = the program's request), stored as values at
                         addresses known from the program id
  prefix -> address      the same sum used as the store address (start + chunk + lane), as every expansion must
  ... u32                the sum in uint32 (ExpandConfig.prefix_u32)
  ... + kv_indptr        with the library's kv_indptr stores (chunk program 0 of each request)
  ... + gather           with the block-id gather: the library's program (block ids loaded first, as the library)
  lean                   a correct one-launch expansion without the chunk programs' kv_indptr stores: each
                         program sums seq_lens[:r] and seq_lens[:r + 1] from one load (uint32), and one extra
                         program (grid row R) writes the whole kv_indptr from a cumulative sum, in one store
  library                the library's call
"""
import sys

import torch
import triton
import triton.language as tl

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

R, L, K = 256, 4096, 16
N = R * L
BLOCK_T = 1024


@triton.jit
def _chain(block_table_ptr, stride, max_blocks, seq_lens_ptr, kv_indptr_ptr, out_ptr, K: tl.constexpr,
           BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, PREFIX: tl.constexpr, ADDR: tl.constexpr,
           U32: tl.constexpr, INDPTR: tl.constexpr, GATHER: tl.constexpr):
    c = tl.program_id(0)
    r = tl.program_id(1)
    E.pdl_wait_then_release()
    tok0 = c * BLOCK_T
    lane = tl.arange(0, BLOCK_T)
    if GATHER:
        vals = E._chunk_indices(block_table_ptr + r.to(tl.int64) * stride, max_blocks, tok0, K, BLOCK_T)
    fixed = r.to(tl.int64) * BLOCK_T * tl.num_programs(0) + tok0  # where this chunk lands in a uniform batch
    if PREFIX:
        start = E._prefix_sum(seq_lens_ptr, r, BLOCK_R, False, U32)
        if not GATHER:
            vals = (start + tok0 + lane).to(tl.int32)
    else:
        vals = (fixed + lane).to(tl.int32)
    if INDPTR:
        seq_len = tl.load(seq_lens_ptr + r).to(tl.int32)
        if c == 0:
            tl.store(kv_indptr_ptr + r + 1, (start + seq_len).to(tl.int32))
            if r == 0:
                tl.store(kv_indptr_ptr, start.to(tl.int32))
    if ADDR:
        base = start + tok0
        if base % 4 == 0:
            tl.store(out_ptr + (base // 4) * 4 + lane, vals)
        else:
            tl.store(out_ptr + base + lane, vals)
    else:
        tl.store(out_ptr + fixed + lane, vals)


@triton.jit
def _lean(block_table_ptr, stride, max_blocks, seq_lens_ptr, kv_indptr_ptr, out_ptr, num_reqs, K: tl.constexpr,
          BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr):
    c = tl.program_id(0)
    r = tl.program_id(1)
    E.pdl_wait_then_release()
    o = tl.arange(0, BLOCK_R)
    if r == num_reqs:  # the kv_indptr program
        if c == 0:
            x = tl.load(seq_lens_ptr + o, mask=o < num_reqs, other=0).to(tl.uint32)
            tl.store(kv_indptr_ptr + 1 + o, tl.cumsum(x, 0).to(tl.int32), mask=o < num_reqs)
            tl.store(kv_indptr_ptr, 0)
    else:
        tok0 = c * BLOCK_T
        vals = E._chunk_indices(block_table_ptr + r.to(tl.int64) * stride, max_blocks, tok0, K, BLOCK_T)
        x = tl.load(seq_lens_ptr + o, mask=o <= r, other=0).to(tl.uint32)
        start = tl.sum(tl.where(o < r, x, 0)).to(tl.int64)
        seq_len = tl.sum(tl.where(o == r, x, 0)).to(tl.int32)
        E._store_chunk(out_ptr, vals, start, seq_len, tok0, BLOCK_T, "", K, False)


def main():
    common.require_gpu()
    out_path = (sys.argv[1:] or [None])[0]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    bt, sl, ref_out, ref_indptr, out, indptr = BE.probe_batch(R, L, K)
    ar = torch.arange(N, dtype=torch.int32)
    cfg = E.expand_config(R, L)
    assert (cfg.block_t, cfg.group) == (BLOCK_T, 1), cfg
    grid = (L // BLOCK_T, R)

    def chain(prefix, addr, u32, ip, gather):
        return lambda: _chain[grid](bt, bt.stride(0), bt.shape[1], sl, indptr, out, K=K, BLOCK_T=BLOCK_T, BLOCK_R=R,
                                    PREFIX=prefix, ADDR=addr, U32=u32, INDPTR=ip, GATHER=gather,
                                    num_warps=cfg.num_warps, launch_pdl=True)

    variants = [
        ("store only", chain(False, False, False, False, False), ar, None),
        ("prefix, fixed address", chain(True, False, False, False, False), ar, None),
        ("prefix -> address", chain(True, True, False, False, False), ar, None),
        ("prefix -> address u32", chain(True, True, True, False, False), ar, None),
        ("... + kv_indptr", chain(True, True, False, True, False), ar, ref_indptr),
        ("... + kv_indptr u32", chain(True, True, True, True, False), ar, ref_indptr),
        ("... + gather", chain(True, True, False, True, True), ref_out, ref_indptr),
        ("... + gather u32", chain(True, True, True, True, True), ref_out, ref_indptr),
        ("lean", lambda: _lean[(L // BLOCK_T, R + 1)](bt, bt.stride(0), bt.shape[1], sl, indptr, out, R, K=K,
                                                       BLOCK_T=BLOCK_T, BLOCK_R=R, num_warps=cfg.num_warps,
                                                       launch_pdl=True), ref_out, ref_indptr),
        ("library", lambda: E.expand_page_indices(bt, sl, K, out=out, kv_indptr=indptr, max_seq_len=L,
                                                  validate=False), ref_out, ref_indptr),
    ]
    rows = []
    for rnd in range(rounds):
        rows += BE.time_probe_variants(variants, out, indptr, round=rnd, R=R, L=L, num_warps=cfg.num_warps)
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_chain_probe.py OUT.json [ROUNDS]",
                               out_path)


if __name__ == "__main__":
    main()
