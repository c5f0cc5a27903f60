"""Where a small-batch gluon call goes (B=16 L=4k, 16 heads, qlen 4 and 8): the gluon split kernel alone, the
second-kernel merge alone (random partials, its default tile) and the full call, under CUDA-graph replay.
Run on a GPU: PYTHONPATH=src python3 scripts/gluon_b16_breakdown.py (results: explore.round20_small_batch)."""
import dataclasses
import torch
from workbench import mla, mla_gluon
from workbench.bench import decode as d, common
G = dataclasses.replace(mla.GLUON_CONFIG, pdl_split=False)  # as round 20 ran it (before round 21 made it PDL-launched)
dev = common.require_gpu(); d.matmul_tflops()
pool = d.CachePool(16 * 4096 + 64, torch.bfloat16, dev)
for q, splits in ((4, 8), (8, 4)):
    x = d.make_inputs(pool, 16, q, 16, 4096, seed=7)
    rows = 16 * q * 16
    mid_o = torch.empty(splits, rows, 512, device=dev); mid_lse = torch.empty(splits, rows, device=dev)
    sc = mla.default_sm_scale() * mla._LOG2E
    split_us = d._graph_timer(lambda: mla_gluon.mla_decode_gluon_split_kernel[(1, splits, 16)](
        x["q"], x["kv_cache"], x["kv_indices"], x["qo_indptr"], x["kv_indptr"], mid_o, mid_lse,
        mid_o, mid_lse, x["kv_cache"].stride(0), rows, sc, splits, NUM_HEADS=16, DIRECT=False, D_LATENT=512, D_ROPE=64, num_warps=8))
    merge_us = d.time_merge_only(splits, rows, *G.merge_tile(rows))
    out = torch.empty(16 * q, 16, 512, dtype=torch.bfloat16, device=dev)
    full_us = d._graph_timer(lambda: mla.mla_decode_triton(x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"],
        x["kv_indices"], q, config=G, num_splits=splits, out=out))
    print(f"qlen {q} B=16 L=4k splits {splits}: split only {split_us:.1f} us, merge only {merge_us:.1f} us, full call {full_us:.1f} us")
