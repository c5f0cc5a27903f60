"""Summarise Nsight Compute's per-instruction warp stall samples (the SASS source page) of one kernel.

Make the CSV on a GPU machine (chapter 3, round 38):

    ncu -k regex:mla_decode_gluon_ws_kernel -s 2 -c 1 --section WarpStateStats --section SourceCounters \
        -o /tmp/ws python3 scripts/ncu_decode.py 128 1 64 4096
    ncu -i /tmp/ws.ncu-rep --page source --csv --print-source sass > ws_sass.csv

then: python3 scripts/ncu_sass_top.py ws_sass.csv [OFFSET=NAME ...]

It prints the instructions with the most samples (and their top stall reasons), and the samples grouped by what the
warps were doing: an mbarrier wait (the ``try_wait`` and the branch that retries it, named by the barrier's
shared-memory offset when given as ``0x38580=EMPTY``; find the offsets in the kernel's ``SYNCS.EXCH`` init lines),
``wgmma`` issue and waits, partition barriers, the softmax's max and ``exp2``, fp32 multiplies, ``cp.async``
issue, fences, shuffles, and everything else. Shares are of all warps' samples.
"""
import collections
import csv
import re
import sys

GROUPS = {"HGMMA": "wgmma issue", "WARPGROUP": "wgmma wait/arrive", "FMNMX": "softmax max", "MUFU": "softmax exp2",
          "FMUL": "fp32 multiply (rescale)", "BAR": "partition barrier", "LDGSTS": "cp.async gather issue",
          "SHFL": "shuffle", "FENCE": "fence (async proxy)"}


def read(path: str) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if "Source" in [c.strip() for c in r])
    return rows[head], [r for r in rows[head + 1:] if len(r) > 2]


def _num(x: str) -> float:
    return float(x.replace(",", "")) if x.strip() else 0.0


def _opcode(src: str) -> str:
    parts = src.split()
    return (parts[1] if src.startswith("@") and len(parts) > 1 else parts[0] if parts else "?").split(".")[0]


def grouped(data: list[list[str]], samples: int, barriers: dict[str, str]) -> dict[str, float]:
    """Percent of all samples per activity (see the module docstring)."""
    total = sum(_num(r[samples]) for r in data)
    out: collections.Counter = collections.Counter()
    waiting = None  # the barrier of the last try_wait: its retry branch counts as the same wait
    for r in data:
        src = r[1].strip()
        if "TRYWAIT" in src:
            off = re.search(r"\+(0x[0-9a-f]+)\]", src)
            waiting = barriers.get(off.group(1) if off else "", "other")
            out["mbarrier wait: " + waiting] += _num(r[samples])
        elif waiting is not None and src.startswith("@") and "BRA" in src:
            out["mbarrier wait: " + waiting] += _num(r[samples])
            waiting = None
        else:
            waiting = None
            out[GROUPS.get(_opcode(src), "other")] += _num(r[samples])
    return {k: round(v / total * 100, 1) for k, v in out.most_common()}


if __name__ == "__main__":
    header, data = read(sys.argv[1])
    barriers = dict(a.split("=", 1) for a in sys.argv[2:])
    samples = next(i for i, c in enumerate(header) if c.startswith("Warp Stall Sampling (All"))
    reasons = [i for i, c in enumerate(header) if c.startswith("stall_") and "Not Issued" not in c]
    total = sum(_num(r[samples]) for r in data)
    print(f"{int(total)} samples; the instructions with the most:")
    for r in sorted(data, key=lambda r: -_num(r[samples]))[:25]:
        top = sorted(((_num(r[i]), header[i]) for i in reasons if _num(r[i]) > 0), reverse=True)[:2]
        print(f"{_num(r[samples]) / total * 100:5.1f}% {r[1].strip()[:70]:70s} " + ", ".join(f"{n} {int(v)}" for v, n in top))
    print("by activity:", grouped(data, samples, barriers))
