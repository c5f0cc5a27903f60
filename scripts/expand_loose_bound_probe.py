"""What a loose ``max_seq_len`` bound costs the index expansion (not yet measured: for the next session).

``expand_page_indices(..., max_seq_len=bound, validate=False)`` sizes its grid's chunk dimension by the bound,
so capturing the call in one CUDA graph with the model's maximum length as the bound launches a program for
every chunk up to it; every such program sums its request's ``seq_lens`` prefix before it finds that it has
nothing to store (and above 64 MB of bounded output ``expand_config`` also turns to streaming stores without
PDL). This times, under the benchmark's CUDA-graph replay, each batch with the tight bound, with loose bounds
(32k and 128k tokens), and with the loose bound plus a cap on the programs per request
(``ExpandConfig.max_chunk_programs``: programs then stride over their request's chunks); outputs are checked
against the dense torch expansion.

Run on an H200: PYTHONPATH=src python3 scripts/expand_loose_bound_probe.py [OUT.json]
"""
import dataclasses
import sys

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

CASES = ((1, 97000), (32, 32768), (256, 4096), (1024, 1000), (16384, 32))
BOUNDS = (32768, 131072)
CAPS = (4, 16, 64)


def main():
    common.require_gpu()
    rows = []
    for rnd in range(3):
        for R, L in CASES:
            variants = [("tight", L, None)]
            for bound in BOUNDS:
                if bound <= L:
                    continue
                variants.append((f"bound {bound}", bound, None))
                for cap in CAPS:
                    variants.append((f"bound {bound} cap {cap}", bound,
                                     dataclasses.replace(E.expand_config(R, bound), max_chunk_programs=cap)))
            # a block table as wide as the largest bound, as a graph-captured step would allocate it
            rows += BE.time_expand_variants(R, L, max(BOUNDS), variants, rnd)
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_loose_bound_probe.py",
                               (sys.argv[1:] or [None])[0])


if __name__ == "__main__":
    main()
