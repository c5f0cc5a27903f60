"""expand_config's rule for many one-request programs (BROADCAST_REQS or more requests, one warp, tight bound;
'rule': what expand_config gives) against the rule before it ('before': ExpandConfig.prefix_u32, prefix_first and
broadcast_blocks off), all three on, and uint32 alone, with prefix_first, or with broadcast_blocks, over batches of
one-warp programs, uniform and ragged, K = 1, 16, 64. Timed under the benchmark's CUDA-graph replay
(bench.expand.time_expand_variants), interleaved rounds, every output checked against the dense torch expansion.
Run on an H200: PYTHONPATH=src python3 scripts/expand_rule_probe.py [OUT.json] [ROUNDS] [--short]
"""
import dataclasses
import sys

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

CASES = (  # (requests, tokens, K, ragged)
    (512, 1024, 16, False), (512, 2000, 16, False), (768, 900, 16, False), (1024, 1000, 16, False),
    (1536, 700, 16, False), (1024, 4096, 16, False), (512, 8192, 16, False), (2047, 1500, 16, False),
    (1024, 1000, 1, False), (1024, 1000, 64, False), (512, 2000, 16, True), (1024, 1000, 16, True),
    (1024, 1000, 1, True), (1024, 4096, 16, True), (1536, 3000, 16, True), (4096, 2048, 16, True),
    (2048, 4096, 16, False), (1024, 2048, 16, True), (256, 4096, 16, False),
)

SHORT = (  # --short: batches of short requests, whose chunks are narrower than 1024 tokens
    (1000, 300, 16, False), (600, 100, 16, False), (1024, 64, 16, False), (2047, 200, 16, False),
    (512, 16, 16, False), (1000, 300, 16, True), (2047, 500, 16, True), (1000, 300, 1, False),
    (1000, 300, 64, False), (800, 1500, 16, True),
)


def main():
    common.require_gpu()
    short = "--short" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--short"]
    out_path = (args or [None])[0]
    rounds = int(args[1]) if len(args) > 1 else 3
    rows = []
    for rnd in range(rounds):
        for R, L, K, ragged in SHORT if short else CASES:
            cfg = E.expand_config(R, L)
            assert cfg.group == 1 and cfg.num_warps == 1, (R, L, cfg)
            variants = [("rule", L, cfg)]
            for label, u32, first, bcast in (("before", 0, 0, 0), ("all three", 1, 1, 1), ("u32", 1, 0, 0),
                                             ("u32 first", 1, 1, 0), ("u32 bcast", 1, 0, 1)):
                variants.append((label, L, dataclasses.replace(cfg, prefix_u32=bool(u32), prefix_first=bool(first),
                                                               broadcast_blocks=bool(bcast))))
            for row in BE.time_expand_variants(R, L, L, variants, rnd, K, ragged):
                row["label"] = f"{row['label']} K={K}{' ragged' if ragged else ''}"
                rows.append(row)
    common.report_probe_rounds(rows, "PYTHONPATH=src python3 scripts/expand_rule_probe.py OUT.json [ROUNDS] [--short]",
                               out_path)


if __name__ == "__main__":
    main()
