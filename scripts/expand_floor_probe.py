"""The floor under the 256 x 4k expansion bar: how fast can ANY kernel be that must read something before it
writes the 4 MiB of indices? Timed under the benchmark's CUDA-graph replay, interleaved rounds, at 256 x 4k
(K = 16). Run on an H200: PYTHONPATH=src python3 scripts/expand_floor_probe.py [OUT.json] [ROUNDS]

Every kernel below writes the same 1,048,576 int32 as the expansion. Rows:
  one store / one store PDL    one program, one store: the launch floor (without / with PDL)
  store only B/W               writes out[i] = i, no loads (B entries per program, W warps); 'persist P': P programs
                               looping over 1024-entry tiles
  one load B/W                 each program loads ONE int32 (L2-resident, never written) and stores v + i: the least
                               a kernel whose output depends on its input can do (a lower bound for any expansion)
  one load early B/W           the same load issued before the PDL wait (legal here only: the input is never written)
  gather B/W (+ early)         the library's per-token block-id gather with start = r * L (correct for a uniform
                               batch, so checked): the expansion without any prefix sum
  library / library indptr     the library's call, and with a precomputed kv_indptr (precomputed_kv_indptr=True)
  torch fill_                  out.fill_(7)
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


@triton.jit
def _one_store(x_ptr, PDL: tl.constexpr):
    if PDL:
        E.pdl_wait_then_release()
    tl.store(x_ptr, 1)


@triton.jit
def _store_only(out_ptr, n, BLOCK: tl.constexpr, PERSIST: tl.constexpr):
    E.pdl_wait_then_release()
    if PERSIST:
        for t in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
            offs = t.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, offs.to(tl.int32), mask=offs < n)
    else:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, offs.to(tl.int32), mask=offs < n)


@triton.jit
def _one_load(src_ptr, out_ptr, n, BLOCK: tl.constexpr, EARLY: tl.constexpr):
    pid = tl.program_id(0)
    if EARLY:
        v = tl.load(src_ptr + (pid & 255))
        E.pdl_wait_then_release()
    else:
        E.pdl_wait_then_release()
        v = tl.load(src_ptr + (pid & 255))
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, v + offs.to(tl.int32), mask=offs < n)


@triton.jit
def _gather(block_table_ptr, stride, max_blocks, out_ptr, L, K: tl.constexpr, BLOCK_T: tl.constexpr,
            EARLY: tl.constexpr):
    c = tl.program_id(0)
    r = tl.program_id(1)
    row = block_table_ptr + r.to(tl.int64) * stride
    if EARLY:
        vals = E._chunk_indices(row, max_blocks, c * BLOCK_T, K, BLOCK_T)
        E.pdl_wait_then_release()
    else:
        E.pdl_wait_then_release()
        vals = E._chunk_indices(row, max_blocks, c * BLOCK_T, K, BLOCK_T)
    E._store_chunk(out_ptr, vals, r.to(tl.int64) * L, L, c * BLOCK_T, BLOCK_T, "", K, False)


def main():
    dev = common.require_gpu()
    out_path = (sys.argv[1:] or [None])[0]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    bt, sl, ref_out, ref_indptr, out, indptr = BE.probe_batch(R, L, K)
    indptr_in = ref_indptr.to(dev)
    src = torch.arange(1000, 1256, dtype=torch.int32, device=dev)
    one = torch.empty(1, dtype=torch.int32, device=dev)
    pdl = dict(launch_pdl=True)
    ar = torch.arange(N, dtype=torch.int64)

    def expect_one_load(block):
        return (src.cpu()[(ar // block) & 255].to(torch.int64) + ar).to(torch.int32)

    variants = [("one store", lambda: _one_store[(1,)](one, PDL=False), None),
                ("one store PDL", lambda: _one_store[(1,)](one, PDL=True, **pdl), None)]
    for b, w in ((1024, 1), (1024, 4), (2048, 4), (4096, 4), (4096, 8), (8192, 8), (16384, 16)):
        variants.append((f"store only {b}/{w}", (lambda b=b, w=w: _store_only[(N // b,)](
            out, N, BLOCK=b, PERSIST=False, num_warps=w, **pdl)), ar.to(torch.int32)))
    for p in (132, 264, 528):
        variants.append((f"store only persist {p}", (lambda p=p: _store_only[(p,)](
            out, N, BLOCK=1024, PERSIST=True, num_warps=4, **pdl)), ar.to(torch.int32)))
    for b, w in ((1024, 1), (1024, 4), (2048, 4), (4096, 8)):
        for early in (False, True):
            variants.append((f"one load{' early' if early else ''} {b}/{w}", (lambda b=b, w=w, early=early: _one_load[(
                N // b,)](src, out, N, BLOCK=b, EARLY=early, num_warps=w, **pdl)), expect_one_load(b)))
    for b, w in ((1024, 1), (1024, 4), (2048, 4)):
        for early in (False, True):
            variants.append((f"gather{' early' if early else ''} {b}/{w}", (lambda b=b, w=w, early=early: _gather[(
                L // b, R)](bt, bt.stride(0), bt.shape[1], out, L, K=K, BLOCK_T=b, EARLY=early, num_warps=w, **pdl)),
                ref_out))
    variants += [
        ("library", lambda: E.expand_page_indices(bt, sl, K, out=out, kv_indptr=indptr, max_seq_len=L,
                                                  validate=False), ref_out),
        ("library indptr", lambda: E.expand_page_indices(bt, sl, K, out=out, kv_indptr=indptr_in, max_seq_len=L,
                                                         validate=False, precomputed_kv_indptr=True), ref_out),
        ("torch fill_", lambda: out.fill_(7), None),
    ]
    rows = []
    for rnd in range(rounds):  # the output is checked (where an expectation is given), kv_indptr is not
        rows += BE.time_probe_variants([(*v, None) for v in variants], out, indptr, round=rnd, R=R, L=L)
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_floor_probe.py OUT.json [ROUNDS]",
                               out_path)


if __name__ == "__main__":
    main()
