"""Is the in-kernel prefix sum's cost at 256 x 4k an L2 hot spot? Every program of the expansion reads the same
1 KiB of seq_lens (256 requests), so about 1024 programs ask the same few L2 lines at once. This probe times
kernels that write the same 1,048,576 int32 as the expansion and differ only in what they read first, under the
benchmark's CUDA-graph replay, interleaved rounds. Run on an H200:
PYTHONPATH=src python3 scripts/expand_hotspot_probe.py [OUT.json] [ROUNDS]

  store only            no loads (the floor)
  one load hot|spread   one int32 per program: from 256 shared entries (hot) or from a line of its own (spread)
  prefix hot|spread W   program p (request r = p // 4, as the library's four chunk programs per request) sums
                        r int32 in 32-lane masked loads as the library does, from the one shared 1 KiB (hot) or
                        from 1 KiB of its own (spread); W warps; '.cg' / '.ca' / 'evict_last': the hot loads'
                        cache hints
  library ...           the library's call with expand_config's parameters, or with one changed
"""
import dataclasses
import sys

import torch
import triton.language as tl
import triton

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

R, L, K = 256, 4096, 16
N = R * L
BLOCK = 1024


@triton.jit
def _store_only(out_ptr, BLOCK: tl.constexpr):
    E.pdl_wait_then_release()
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, offs.to(tl.int32))


@triton.jit
def _one_load(src_ptr, out_ptr, BLOCK: tl.constexpr, SPREAD: tl.constexpr):
    E.pdl_wait_then_release()
    pid = tl.program_id(0)
    if SPREAD:
        v = tl.load(src_ptr + pid * 32)
    else:
        v = tl.load(src_ptr + (pid & 255))
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, v + offs.to(tl.int32))


@triton.jit
def _prefix(src_ptr, out_ptr, BLOCK: tl.constexpr, SPREAD: tl.constexpr, CACHE: tl.constexpr, EVICT: tl.constexpr):
    E.pdl_wait_then_release()
    pid = tl.program_id(0)
    r = pid // 4
    base = src_ptr + (pid.to(tl.int64) * 256 if SPREAD else 0)
    lanes = tl.arange(0, 32)
    part = tl.zeros([32], dtype=tl.int64)
    for i in tl.static_range(0, 256, 32):
        o = i + lanes
        part += tl.load(base + o, mask=o < r, other=0, cache_modifier=CACHE, eviction_policy=EVICT).to(tl.int64)
    start = tl.sum(part)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, (start + offs).to(tl.int32))


def main():
    dev = common.require_gpu()
    out_path = (sys.argv[1:] or [None])[0]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    bt, sl, ref_out, _, out, indptr = BE.probe_batch(R, L, K)
    g = torch.Generator().manual_seed(1)
    big = torch.randint(0, 4096, (N // BLOCK * 256,), generator=g, dtype=torch.int32)
    hot = big[:256].clone()
    big_d, hot_d = big.to(dev), hot.to(dev)
    ar = torch.arange(N, dtype=torch.int64)
    pid = ar // BLOCK
    pdl = dict(launch_pdl=True)

    def prefix_expect(spread):
        r = pid // 4
        if spread:
            rows = big.view(-1, 256).to(torch.int64)
            csum = torch.cat([torch.zeros(rows.shape[0], 1, dtype=torch.int64), rows.cumsum(1)], 1)
            start = csum[pid, r]
        else:
            csum = torch.cat([torch.zeros(1, dtype=torch.int64), hot.to(torch.int64).cumsum(0)])
            start = csum[r]
        return (start + ar).to(torch.int32)

    variants = [
        ("store only", lambda: _store_only[(N // BLOCK,)](out, BLOCK=BLOCK, num_warps=4, **pdl), ar.to(torch.int32)),
        ("one load hot", lambda: _one_load[(N // BLOCK,)](hot_d, out, BLOCK=BLOCK, SPREAD=False, num_warps=4, **pdl),
         (hot[(pid & 255)].to(torch.int64) + ar).to(torch.int32)),
        ("one load spread", lambda: _one_load[(N // BLOCK,)](big_d, out, BLOCK=BLOCK, SPREAD=True, num_warps=4, **pdl),
         (big[pid * 32].to(torch.int64) + ar).to(torch.int32)),
    ]
    for w in (1, 4):
        for spread in (False, True):
            variants.append((f"prefix {'spread' if spread else 'hot'} {w}", (lambda w=w, spread=spread: _prefix[(
                N // BLOCK,)](big_d if spread else hot_d, out, BLOCK=BLOCK, SPREAD=spread, CACHE="", EVICT="",
                              num_warps=w, **pdl)), prefix_expect(spread)))
    for cache, evict in ((".cg", ""), (".ca", ""), ("", "evict_last")):
        variants.append((f"prefix hot 1 {cache or evict}", (lambda cache=cache, evict=evict: _prefix[(N // BLOCK,)](
            hot_d, out, BLOCK=BLOCK, SPREAD=False, CACHE=cache, EVICT=evict, num_warps=1, **pdl)),
            prefix_expect(False)))
    base = E.expand_config(R, L)
    for label, cfg in (("library", base), ("library 4 warps", dataclasses.replace(base, num_warps=4)),
                       ("library u32", dataclasses.replace(base, prefix_u32=True)),
                       ("library 2048/4", dataclasses.replace(base, block_t=2048, num_warps=4)),
                       ("library 4096/4", dataclasses.replace(base, block_t=4096, num_warps=4))):
        variants.append((label, (lambda cfg=cfg: E.expand_page_indices(
            bt, sl, K, out=out, kv_indptr=indptr, max_seq_len=L, validate=False, config=cfg)), ref_out))
    rows = []
    for rnd in range(rounds):  # the output is checked, kv_indptr is not
        rows += BE.time_probe_variants([(*v, None) for v in variants], out, indptr, round=rnd, R=R, L=L)
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_hotspot_probe.py OUT.json [ROUNDS]",
                               out_path)


if __name__ == "__main__":
    main()
