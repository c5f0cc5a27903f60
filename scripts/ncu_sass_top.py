"""Summarise an ncu source-page CSV (SASS): top instructions by warp stall samples, and samples by opcode."""
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
# find header row
hi = next(i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r))
hdr = rows[hi]
data = rows[hi + 1:]
def col(name):
    for i, c in enumerate(hdr):
        if c.strip() == name:
            return i
    return None
src = col("Source"); addr = col("Address")
samp = next(i for i, c in enumerate(hdr) if c.startswith("Warp Stall Sampling (All"))
print("columns:", [c for c in hdr][:60])
def num(x):
    try: return float(x.replace(",", ""))
    except: return 0.0
tot = sum(num(r[samp]) for r in data if len(r) > samp)
print("total samples", tot)
top = sorted((r for r in data if len(r) > samp), key=lambda r: -num(r[samp]))[:45]
stall_cols = [i for i, c in enumerate(hdr) if c.startswith("stall_") or "Stall" in c and i != samp]
for r in top:
    reasons = sorted(((num(r[i]), hdr[i]) for i in stall_cols if num(r[i]) > 0), reverse=True)[:3]
    print(f"{num(r[samp]) / tot * 100:5.1f}% {r[addr] if addr is not None else ''} {r[src][:70]:70s} {reasons}")
by = collections.Counter()
for r in data:
    if len(r) > samp:
        op = r[src].strip().split(" ")[0] if r[src].strip() else "?"
        if op.startswith("@"):
            op = r[src].strip().split(" ")[1]
        by[op.split(".")[0]] += num(r[samp])
print("by opcode:", [(k, round(v / tot * 100, 1)) for k, v in by.most_common(20)])
