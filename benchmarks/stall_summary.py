"""Where a kernel's warps wait, by warp-specialised partition, from Nsight Compute's source page.

    python benchmarks/stall_summary.py ws_sass.csv [fm_sass.csv ...]

Each CSV is ``ncu -i REPORT --page source --csv --print-source sass`` of a report that collected the
SourceCounters section (:mod:`workbench.bench.ncu_source` says how, and how the partitions are told apart).
"""

from __future__ import annotations

import argparse

from workbench.bench import ncu_source


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=6, help="instructions listed per partition")
    args = ap.parse_args()
    for path in args.csv:
        print(f"== {path}")
        print(ncu_source.format_summary(ncu_source.summarize(ncu_source.read_source_csv(path), top=args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
