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
    common.require_gpu()
    rows = []
    cases = ((512, 131072, 131072), (256, 4096, 131072), (1024, 1000, 131072), (32, 32768, 131072))
    for rnd in range(3):
        for R, L, bound in cases:
            rows += BE.time_expand_variants(R, L, bound, [(tag, bound, cfg) for tag, cfg in variants(R, L, bound)], rnd)
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_stride_probe.py OUT.json",
                               (sys.argv[1:] or [None])[0])


if __name__ == "__main__":
    main()
