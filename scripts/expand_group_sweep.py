"""Launch shapes of the index expansion over batches of few long and many short requests, with request groups.

``ExpandConfig.group`` > 1 packs that many requests into one program (a ``(group, block_t)`` tile): the grid
then sums ``group`` times fewer ``seq_lens`` in its prefix sums and launches ``group`` times fewer programs.
This sweep times, per case, ``block_t = min(1024, next_pow2(seq_len))`` with groups 1-64 (tiles up to 4096
entries) and 1, 2 or 4 warps, plus the library's current default and a precomputed ``kv_indptr`` (no prefix in
the kernel) for reference, under the benchmark's CUDA-graph replay; every output is checked against the dense
torch expansion. ``expand_config``'s rule is chosen from it.

Run on an H200: PYTHONPATH=src python3 scripts/expand_group_sweep.py [OUT.json] [--quick]
"""
import sys

import torch
import triton

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

# (num_reqs, seq_len, ragged): ragged draws lengths uniformly from 1 .. 2 * seq_len - 1 (mean seq_len)
CASES = ((1, 97000, False), (32, 32768, False), (256, 4096, False), (512, 131072, False), (100, 3000, True),
         (512, 1024, False), (1000, 300, False), (1024, 1000, True), (2048, 200, False), (4096, 100, False),
         (4096, 500, True), (8192, 64, False), (16384, 32, False))


def variants(R, L):
    T0 = min(1024, triton.next_power_of_2(L))
    yield "default", E.expand_config(R, L), False
    for g in (1, 2, 4, 8, 16, 32, 64):
        if T0 * g > 4096 or g > triton.next_power_of_2(R):
            continue
        for w in (1, 2, 4):
            base = E.expand_config(R, L)
            yield f"{T0}x{g}/{w}", E.ExpandConfig(block_t=T0, num_warps=w, group=g,
                                                   streaming_stores=base.streaming_stores, pdl=base.pdl), False
    yield f"given {T0}x1/1", E.ExpandConfig(block_t=T0, num_warps=1), True
    yield "given default", E.expand_config(R, L), True


def main():
    dev = common.require_gpu()
    quick = "--quick" in sys.argv
    out_path = next((a for a in sys.argv[1:] if not a.startswith("--")), None)
    rows = []
    for rnd in range(2 if quick else 3):
        for R, L, ragged in CASES:
            bt, sl, _ = BE._make_inputs(R, (2 * L - 1) if ragged else L, 16, dev)
            if ragged:
                g = torch.Generator(device=dev).manual_seed(R)
                sl = torch.randint(1, 2 * L, (R,), generator=g, device=dev, dtype=torch.int32)
            max_len = int(sl.max())
            ref_out, ref_indptr = E.expand_page_indices_dense(bt, sl, 16)
            out = torch.empty(ref_out.numel(), dtype=torch.int32, device=dev)
            indptr = torch.empty(R + 1, dtype=torch.int32, device=dev)
            for label, cfg, given in variants(R, max_len):
                ptr = ref_indptr.clone() if given else indptr
                fn = lambda: E.expand_page_indices(bt, sl, 16, out=out, kv_indptr=ptr, max_seq_len=max_len,
                                                   validate=False, config=cfg, precomputed_kv_indptr=given)
                out.fill_(-1)
                indptr.fill_(-7)
                us = common.time_cuda_graph(fn)
                torch.cuda.synchronize()
                ok = bool(torch.equal(out, ref_out)) and bool(torch.equal(ptr, ref_indptr))
                rows.append(dict(round=rnd, R=R, L=L, ragged=ragged, label=label, us=us, agree=ok,
                                 config=dict(block_t=cfg.block_t, num_warps=cfg.num_warps, group=cfg.group)))
            del ref_out, out
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_group_sweep.py", out_path)


if __name__ == "__main__":
    main()
