"""Chunk programs with nothing to store skip their prefix sum (``ExpandConfig.skip_idle_prefix``, eleventh
session). Under a loose ``max_seq_len`` bound (128k, as one CUDA graph for every step would use), request groups of
short requests get two chunk programs each (``LOOSE_PROGRAM_BUDGET``) of which one stores nothing, yet summed its
group's prefix; a request shorter than the bound leaves chunk programs idle the same way. The library's launch
with and without the skip, loose and tight bounds, three rounds, every output checked against the dense torch
expansion.

Run on an H200: PYTHONPATH=src python3 scripts/expand_idle_prefix_probe.py [OUT.json] [ROUNDS] [FIRST_N_CASES]
"""
import dataclasses
import sys

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

BOUND = 131_072
CASES = ((2048, 200), (16384, 32), (256, 4096), (4096, 100), (8192, 64), (1024, 1000), (32, 32768))


def main():
    common.require_gpu()
    rounds = int((sys.argv[2:] or [3])[0])
    cases = CASES[: int(sys.argv[3])] if sys.argv[3:] else CASES
    rows = []
    for rnd in range(rounds):
        for R, L in cases:
            variants = []
            for bound in (BOUND, L):
                lib = E.expand_config(R, bound, loose_bound=bound != L)
                tag = "loose" if bound != L else "tight"
                variants += [(f"{tag} skip", bound, lib),
                             (f"{tag} no skip", bound, dataclasses.replace(lib, skip_idle_prefix=False))]
            rows += BE.time_expand_variants(R, L, L, variants, rnd)
            print(*(f"{r['R']}x{r['L']} {r['label']}: {r['us']:.2f} us agree={r['agree']}" for r in rows[-4:]),
                  sep="\n", flush=True)
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_idle_prefix_probe.py OUT.json [ROUNDS] [FIRST_N_CASES]",
                               (sys.argv[1:] or [None])[0])


if __name__ == "__main__":
    main()
