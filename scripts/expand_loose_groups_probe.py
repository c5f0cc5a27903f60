"""Request groups under a loose bound, for batches of thousands of short requests.

``expand_config(R, bound, loose_bound=True)`` takes its chunk width from the bound (1024 tokens under a 128k
bound), so its request groups are at most 4 wide (tiles of 4096 entries), and each program sums the prefix of
its group's first request: 16,384 x 32 took 20.3 us under a 128k bound in the ninth session's committed run,
against 4.4 us with the tight bound (groups of 32 requests by 32 tokens). Here the loose launch with groups sized
as for short requests (``prev_pow2(R // GROUP_PROGRAMS)``, at most 32) and chunks narrowed to keep the tile at
4096 entries (programs loop over longer requests' chunks) is timed against the library's, under a 128k bound,
three rounds, every output checked against the dense torch expansion.

Run on an H200: PYTHONPATH=src python3 scripts/expand_loose_groups_probe.py [OUT.json]
"""
import dataclasses
import sys

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

BOUND = 131_072
CASES = ((2048, 200), (4096, 100), (8192, 64), (16384, 32))


def candidate(R):
    lib = E.expand_config(R, BOUND, loose_bound=True)
    g = min(32, 1 << ((R // E.GROUP_PROGRAMS).bit_length() - 1))
    bt = max(16, min(lib.block_t, 4096 // g))
    return dataclasses.replace(lib, group=g, block_t=bt, max_chunk_programs=max(1, E.LOOSE_PROGRAM_BUDGET // -(-R // g)))


def main():
    common.require_gpu()
    rows = []
    for rnd in range(3):
        for R, L in CASES:
            lib, cand = E.expand_config(R, BOUND, loose_bound=True), candidate(R)
            variants = [("library", BOUND, lib)] + ([(f"group {cand.group} chunk {cand.block_t}", BOUND, cand)]
                                                     if cand != lib else [])
            rows += BE.time_expand_variants(R, L, L, variants, rnd)
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_loose_groups_probe.py OUT.json",
                               (sys.argv[1:] or [None])[0])


if __name__ == "__main__":
    main()
