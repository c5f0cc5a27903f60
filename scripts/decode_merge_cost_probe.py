"""The second-kernel merge alone, with fp32 and with bf16 partials (``narrow_partials``), at the shapes of the
multi-split bar points: how much of a call the merge is, and what halving its input saves.

Random partials, re-read on every replay (so from L2 once warm: the lower bound of the merge inside a call,
whose partials were just written), round 25's merge tile for each shape on 4 warps (the library's when this ran),
three interleaved rounds under CUDA-graph replay.

Run on an H200: PYTHONPATH=src python3 scripts/decode_merge_cost_probe.py [OUT.json]
"""
import sys

import torch

from workbench.bench import common
from workbench.bench import decode as d

# (label, splits, folded rows): 16 heads at B=16 L=4k (qlen 1, 2, 4, 8), 128 heads B=16, B=128 L=8k qlen 1
SHAPES = (("qlen1 B16", 8, 256), ("qlen2 B16", 8, 512), ("qlen4 B16", 8, 1024), ("qlen8 B16", 4, 2048),
          ("H128 B16", 4, 2048), ("qlen1 B128", 2, 2048))


def round25_tile(total: int, splits: int) -> tuple[int, int]:
    """Round 25's merge tile (16x16 from 8 splits, 32x32 from 4 to 7, 16x32 below, above 256 rows; 8x16 at most
    64 rows), which this probe timed before round 30 replaced it."""
    if total <= 64:
        return (8, 16)
    if total <= 256 or splits >= 8:
        return (16, 16)
    return (32, 32) if splits >= 4 else (16, 32)


def cells(label: str, splits: int, total: int) -> list[dict]:
    br, bd = round25_tile(total, splits)
    return [dict(tile=[br, bd], **{name + "_us": d.time_merge_only(splits, total, br, bd, part_dtype=dt)
                                   for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16))})]


if __name__ == "__main__":
    rows = d.merge_only_rounds(SHAPES, cells, rounds=3)
    out = (sys.argv[1:] or [None])[0]
    if out:
        common.write_json(out, dict(benchmark="mla_decode_merge_cost_probe", rows=rows, provenance=common.provenance(
            "PYTHONPATH=src python3 scripts/decode_merge_cost_probe.py OUT.json")))
