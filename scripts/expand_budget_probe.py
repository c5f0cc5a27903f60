"""A program budget for the index expansion's grid: tight and loose ``max_seq_len`` bounds.

``scripts/expand_loose_bound_probe.py`` (the committed JSON's ``loose_bound_probe``) measured that a loose bound
(the graph-capture case) launches a program per chunk up to the bound, each summing its request's prefix:
256 x 4k took 29.6 us under a 128k bound (2.3 tight), 1024 x 1000 223 us, 16,384 x 32 27 ms. This times,
under the benchmark's CUDA-graph replay, the chunk dimension capped at ``max(1, budget // groups)`` (programs
then stride over their request's chunks) for several budgets, at the benchmark's tight cases (512 x 128k
included: the cap makes its programs stride) and at loose bounds, with the library's warp rule and with one
warp for every batch of 64 requests or more (the library gives streaming outputs 4 warps, and a loose bound
makes the output look streaming). Outputs are checked against the dense torch expansion.

Run on an H200: PYTHONPATH=src python3 scripts/expand_budget_probe.py [OUT.json]
"""
import dataclasses
import sys

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

TIGHT = ((1, 97000), (32, 32768), (256, 4096), (1024, 1000), (16384, 32), (512, 131072))
LOOSE = ((256, 4096, 32768), (256, 4096, 131072), (32, 32768, 131072), (1024, 1000, 131072), (16384, 32, 131072))
BUDGETS = (1024, 2048, 4096, 8192, None)  # None: no cap (the library today)


def variants_of(R, bound):
    base = E.expand_config(R, bound)
    groups = -(-R // base.group)
    out = []
    for budget in BUDGETS:
        cap = base.max_chunk_programs if budget is None else max(1, budget // groups)
        cfg = dataclasses.replace(base, max_chunk_programs=cap)
        tag = "no cap" if budget is None else f"budget {budget}"
        out.append((tag, cfg))
        if R >= E.FEW_REQS and cfg.num_warps != 1:
            out.append((tag + " 1 warp", dataclasses.replace(cfg, num_warps=1)))
    if R >= 4 * E.GROUP_PROGRAMS and base.group == 1:  # a loose bound turns request groups off
        g = min(4, 1 << ((R // E.GROUP_PROGRAMS).bit_length() - 1))
        for budget in (1024, 4096):
            out.append((f"group {g} budget {budget} 1 warp", dataclasses.replace(
                base, group=g, prefix_u32=True, num_warps=1, max_chunk_programs=max(1, budget // -(-R // g)))))
    seen = set()  # budgets that give the same cap are timed once
    return [(tag, cfg) for tag, cfg in out if not (cfg in seen or seen.add(cfg))]


def main():
    common.require_gpu()
    rows = []
    cases = [(R, L, L) for R, L in TIGHT] + list(LOOSE)
    for rnd in range(3):
        for R, L, bound in cases:
            variants = [(("tight " if bound == L else f"bound {bound} ") + tag, bound, cfg)
                        for tag, cfg in variants_of(R, bound)
                        if not (bound > L and tag == "no cap" and R >= 1024)]  # the loose-bound probe has those
            rows += BE.time_expand_variants(R, L, bound, variants, rnd)
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_budget_probe.py OUT.json",
                               (sys.argv[1:] or [None])[0])


if __name__ == "__main__":
    main()
