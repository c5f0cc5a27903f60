"""Compile the decode split kernel for a few configs on a GPU and save its TTGIR and PTX (GPU only).

Usage: PYTHONPATH=src python3 scripts/dump_kernel_ir.py OUTDIR
For each config: registers, spills, shared memory, and counts of the instructions that show how the KV
gather was pipelined (cp.async into shared memory or plain global loads into registers)."""
import json
import os
import re
import sys

import torch

from workbench import mla
from workbench.bench import decode

CONFIGS = {
    "16x64 w4 s2": mla.TritonConfig(16, 64, 4, 2, programs_per_sm=2),
    "16x64 w4 s2 ia": mla.TritonConfig(16, 64, 4, 2, programs_per_sm=2, idx_ahead=True),
    "16x32 w4 s3 ia": mla.TritonConfig(16, 32, 4, 3, programs_per_sm=2, idx_ahead=True),
    "64x64 w8 s3": mla.TritonConfig(64, 64, 8, 3, programs_per_sm=1),
    "16x64 w8 s3 ia": mla.TritonConfig(16, 64, 8, 3, programs_per_sm=1, idx_ahead=True),
    "16x32 w8 s4 ia2": mla.TritonConfig(16, 32, 8, 4, programs_per_sm=1, idx_ahead=True, idx_dist=2),
    "16x32 w8 s5 ia3": mla.TritonConfig(16, 32, 8, 5, programs_per_sm=1, idx_ahead=True, idx_dist=3),
    "16x32 w8 s5 ia": mla.TritonConfig(16, 32, 8, 5, programs_per_sm=1, idx_ahead=True),
}
PATTERNS = {"cp.async": r"cp\.async\.c[ag]", "cp.async.wait": r"cp\.async\.wait", "ld.global": r"ld\.global",
            "ldmatrix": r"ldmatrix", "mma.sync": r"mma\.sync", "wgmma": r"wgmma\.mma_async",
            "st.shared": r"st\.shared", "bar.sync": r"bar\.sync"}


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    dev = torch.device("cuda")
    pool = decode.CachePool(4 * 4096, torch.bfloat16, dev)
    report = {}
    for label, cfg in CONFIGS.items():
        heads = 16 if cfg.block_m <= 32 else 128
        x = decode.make_inputs(pool, heads, 1, 4, 4096)
        mla.mla_decode_triton(x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], 1, None,
                              num_splits=2, config=cfg)
        k = mla.LAST_COMPILED["split"]
        name = label.replace(" ", "_")
        for kind in ("ttgir", "ptx"):
            with open(os.path.join(out_dir, f"{name}.{kind}"), "w") as f:
                f.write(k.asm[kind])
        ptx = k.asm["ptx"]
        ttgir = k.asm["ttgir"]
        rep = dict(mla.compiled_kernel_report())
        rep.update({p: len(re.findall(rx, ptx)) for p, rx in PATTERNS.items()})
        rep["ttgir_async_copy"] = ttgir.count("async_copy_global_to_local")
        rep["ttgir_local_alloc"] = ttgir.count("local_alloc")
        # the shared-memory buffers (a leading dimension > 1 is a multi-buffered pipeline) and the loop waits
        rep["local_alloc_shapes"] = sorted(set(re.findall(r"local_alloc[^\n]*?memdesc<([0-9x]+)x(?:bf16|f16|f32|i32)",
                                                          ttgir)))
        rep["async_wait_num"] = sorted(set(int(n) for n in re.findall(r"async_wait[^\n]*?num = (\d+)", ttgir)))
        report[label] = rep
        print(label, rep, flush=True)
    with open(os.path.join(out_dir, "ir_report.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
