"""Why a capped grid is slower at 512 x 128k, and whether wider chunks fix it.

``scripts/expand_budget_probe.py`` (JSON ``budget_probe``): capping the chunk programs per request (programs
then stride over their request's chunks) took loose bounds down to about the tight time, but 512 x 128k from
70.6 us to 77-83 us. Here 512 x 128k is timed with wider chunks (``block_t`` 2048 and 4096: each loop step
then stores 8 or 16 KB per program), 4 or 8 warps, and several caps; and the loose-bound cases with the same
chunk widths under budgets of 1024 and 2048 programs. Outputs are checked against the dense torch expansion.

Run on an H200: PYTHONPATH=src python3 scripts/expand_stride_probe.py [OUT.json]
"""
import dataclasses
import sys

import torch

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE


def variants(R, L, bound):
    base = E.expand_config(R, bound)
    out = []
    if bound == L:  # 512 x 128k
        for bt in (1024, 2048, 4096):
            for w in (4, 8):
                for cap in (None, 32, 16, 8, 4):
                    if cap is not None and cap >= -(-L // bt):
                        continue
                    out.append((f"bt {bt} w{w} cap {cap or '-'}", dataclasses.replace(
                        base, block_t=bt, num_warps=w, max_chunk_programs=cap or base.max_chunk_programs)))
    else:
        for bt in (1024, 4096):
            for budget in (1024, 2048):
                for w in (1, 4):
                    cap = max(1, budget // R)
                    out.append((f"bound {bound} bt {bt} w{w} budget {budget}", dataclasses.replace(
                        base, block_t=bt, num_warps=w, max_chunk_programs=cap)))
    return out


def main():
    dev = common.require_gpu()
    rows = []
    cases = ((512, 131072, 131072), (256, 4096, 131072), (1024, 1000, 131072), (32, 32768, 131072))
    for rnd in range(3):
        for R, L, bound in cases:
            block_table, seq_lens, _ = BE._make_inputs(R, L, 16, dev)
            wide = torch.zeros(R, -(-bound // 16), dtype=torch.int32, device=dev)
            wide[:, : block_table.shape[1]] = block_table
            ref_out, ref_indptr = E.expand_page_indices_dense(block_table, seq_lens, 16)
            out = torch.empty(ref_out.numel(), dtype=torch.int32, device=dev)
            indptr = torch.empty(R + 1, dtype=torch.int32, device=dev)
            for tag, cfg in variants(R, L, bound):
                fn = lambda: E.expand_page_indices(wide, seq_lens, 16, out=out, kv_indptr=indptr, max_seq_len=bound,  # noqa: E731
                                                   validate=False, config=cfg)
                out.fill_(-1)
                us = common.time_cuda_graph(fn)
                torch.cuda.synchronize()
                ok = bool(torch.equal(out, ref_out)) and bool(torch.equal(indptr, ref_indptr))
                rows.append(dict(round=rnd, R=R, L=L, bound=bound, label=tag, us=us, agree=ok,
                                 config=dataclasses.asdict(cfg)))
            del wide, block_table, out
            torch.cuda.empty_cache()
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_stride_probe.py OUT.json",
                               (sys.argv[1:] or [None])[0])


if __name__ == "__main__":
    main()
