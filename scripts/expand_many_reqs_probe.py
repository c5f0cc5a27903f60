"""How the index expansion scales with the number of requests (decode batches of hundreds to thousands).

Every program of the library kernel sums ``seq_lens[:r]`` itself, and with ``num_warps`` warps each warp loads
those entries: the prefix work grows as ``num_reqs**2 * num_warps`` over the grid. The eighth session's
``expand_indptr_probe.py`` found 1000 x 300 at 3.5-3.8 us with 4 warps against 1.9-2.0 with one. This probe
times the library's launch over batches of 256 to 16384 requests with several (block_t, num_warps), against a
precomputed ``kv_indptr`` (no prefix in the kernel), and against that plus the ``torch.cumsum`` launch that
computes it (the two-launch design). Outputs are checked against the spec for every timed variant.

Run on an H200: PYTHONPATH=src python3 scripts/expand_many_reqs_probe.py [OUT.json]
"""
import sys

import torch

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

CASES = ((256, 4096), (512, 1024), (1000, 300), (2048, 200), (4096, 100), (8192, 64), (16384, 32))
SHAPES = ((1024, 4), (1024, 2), (1024, 1), (512, 1), (256, 1), (128, 1))


def main():
    dev = common.require_gpu()
    rows = []
    for rnd in range(3):
        for R, L in CASES:
            bt, sl, _ = BE._make_inputs(R, L, 16, dev)
            ref_out, ref_indptr = E.expand_page_indices_ref(bt.cpu(), sl.cpu(), 16)
            n = int(ref_indptr[-1])
            out = torch.empty(n, dtype=torch.int32, device=dev)
            given = ref_indptr.to(dev)
            indptr = torch.empty(R + 1, dtype=torch.int32, device=dev)

            def record(label, fn, check_indptr):
                out.fill_(-1)
                indptr.fill_(-7)
                us = common.time_cuda_graph(fn)
                torch.cuda.synchronize()
                ok = bool(torch.equal(out.cpu(), ref_out))
                if check_indptr is not None:
                    ok = ok and bool(torch.equal(check_indptr.cpu(), ref_indptr))
                rows.append(dict(round=rnd, R=R, L=L, label=label, us=us, agree=ok))

            record("library", lambda: E.expand_page_indices(bt, sl, 16, out=out, kv_indptr=indptr, max_seq_len=L,
                                                             validate=False), indptr)
            for block_t, warps in SHAPES:
                cfg = E.ExpandConfig(block_t=block_t, num_warps=warps)
                record(f"prefix {block_t}/{warps}",
                       lambda: E.expand_page_indices(bt, sl, 16, out=out, kv_indptr=indptr, max_seq_len=L,
                                                     validate=False, config=cfg), indptr)
                if (block_t, warps) in ((1024, 4), (1024, 1)):
                    record(f"given {block_t}/{warps}",
                           lambda: E.expand_page_indices(bt, sl, 16, out=out, kv_indptr=given, max_seq_len=L,
                                                         validate=False, config=cfg, precomputed_kv_indptr=True),
                           None)

                    def two_launch():
                        indptr[0:1].zero_()  # both are ordinary launches in the graph, as a builder would do
                        torch.cumsum(sl, 0, dtype=torch.int32, out=indptr[1:])
                        E.expand_page_indices(bt, sl, 16, out=out, kv_indptr=indptr, max_seq_len=L, validate=False,
                                              config=cfg, precomputed_kv_indptr=True)
                    record(f"cumsum+given {block_t}/{warps}", two_launch, indptr)
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_many_reqs_probe.py",
                               (sys.argv[1:] or [None])[0])


if __name__ == "__main__":
    main()
