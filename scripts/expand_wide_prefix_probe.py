"""The prefix sum of one-warp expansion programs: the 32-wide accumulator against a wide one.

With ``expand_config``'s one-warp programs (from 64 requests on) every program still sums ``seq_lens[:r]``
itself. The default accumulates into a 32-wide vector, 32 entries per step of four-byte loads, with the
steps past ``prefix_block`` in a loop whose iterations wait on each other. ``ExpandConfig.wide_prefix``
accumulates into a ``prefix_block``-wide vector instead, ``prefix_block / 32`` neighbouring entries per lane,
loaded as 16-byte vectors. This times both, with several ``prefix_block`` and accumulator types, at the rule's
other parameters, against the caller's ``kv_indptr`` (no prefix sum) under the benchmark's CUDA-graph replay;
every output is checked against the dense torch expansion.

``--warps``: the wide accumulator spread over 1, 2 or 4 warps (one cross-warp reduction at the end instead of
every warp loading every entry) at the batches of 1024 requests or more.

Run on an H200: PYTHONPATH=src python3 scripts/expand_wide_prefix_probe.py [OUT.json] [--warps]
"""
import dataclasses
import sys

import torch

from workbench import expand as E
from workbench.bench import common
from workbench.bench import expand as BE

CASES = ((256, 4096), (512, 1024), (1000, 300), (1024, 1000), (2048, 200), (4096, 100), (8192, 64), (16384, 32))
VARIANTS = (
    ("rule", {}),
    ("wide 1024 u32", dict(wide_prefix=True, prefix_u32=True)),
    ("wide 2048 u32", dict(wide_prefix=True, prefix_u32=True, prefix_block=2048)),
    ("wide 4096 u32", dict(wide_prefix=True, prefix_u32=True, prefix_block=4096)),
    ("wide 512 int64", dict(wide_prefix=True, prefix_block=512)),
    ("32-wide 4096", dict(prefix_block=4096)),
    ("32-wide u32", dict(prefix_u32=True)),
)


WARPS_CASES = ((1024, 1000), (2048, 200), (4096, 100), (8192, 64), (16384, 32))
WARPS_VARIANTS = (("rule", {}), ("32-wide u32", dict(prefix_u32=True))) + tuple(
    (f"wide {pb} u32 {w}w", dict(wide_prefix=True, prefix_u32=True, prefix_block=pb, num_warps=w))
    for pb in (1024, 4096) for w in (1, 2, 4))


def main():
    dev = common.require_gpu()
    warps = "--warps" in sys.argv
    out_path = next((a for a in sys.argv[1:] if not a.startswith("--")), None)
    cases, variants = (WARPS_CASES, WARPS_VARIANTS) if warps else (CASES, VARIANTS)
    rows = []
    for rnd in range(3):
        for R, L in cases:
            bt, sl, _ = BE._make_inputs(R, L, 16, dev)
            ref_out, ref_indptr = E.expand_page_indices_dense(bt, sl, 16)
            out = torch.empty(ref_out.numel(), dtype=torch.int32, device=dev)
            indptr = torch.empty(R + 1, dtype=torch.int32, device=dev)
            rule = E.expand_config(R, L)
            for label, change in variants + (("given", {}),):
                cfg = dataclasses.replace(rule, **change)
                given = label == "given"
                ptr = ref_indptr.clone() if given else indptr
                fn = lambda: E.expand_page_indices(bt, sl, 16, out=out, kv_indptr=ptr, max_seq_len=L, validate=False,
                                                   config=cfg, precomputed_kv_indptr=given)
                out.fill_(-1)
                indptr.fill_(-7)
                us = common.time_cuda_graph(fn)
                torch.cuda.synchronize()
                ok = bool(torch.equal(out, ref_out)) and bool(torch.equal(ptr, ref_indptr))
                rows.append(dict(round=rnd, R=R, L=L, label=label, us=us, agree=ok, config=dataclasses.asdict(cfg)))
    command = "PYTHONPATH=src python3 scripts/expand_wide_prefix_probe.py" + (" --warps" if warps else "")
    common.report_probe_rounds(rows, command, out_path)


if __name__ == "__main__":
    main()
