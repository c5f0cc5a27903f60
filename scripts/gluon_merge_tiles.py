"""The gluon call with other merge tiles (rows x columns per merge program) at qlen 4, 6 and 8: the full call,
under CUDA-graph replay. Run on a GPU: PYTHONPATH=src python3 scripts/gluon_merge_tiles.py (results:
explore.round20_small_batch)."""
import dataclasses, torch
from workbench import mla
from workbench.bench import decode as d, common
G = dataclasses.replace(mla.GLUON_CONFIG, pdl_split=False)  # as round 20 ran it (before round 21 made it PDL-launched)
dev = common.require_gpu(); d.matmul_tflops()
pool = d.CachePool(64 * 32768 + 64, torch.bfloat16, dev)
for h, q, b, l in ((16, 4, 16, 4096), (16, 8, 16, 4096), (16, 4, 64, 4096), (16, 4, 64, 32768), (16, 6, 16, 4096)):
    x = d.make_inputs(pool, h, q, b, l, seed=3)
    out = torch.empty(b * q, h, 512, dtype=torch.bfloat16, device=dev)
    res = []
    for tile in (None, (16, 16), (32, 16), (32, 32), (64, 16)):
        cfg = G if tile is None else dataclasses.replace(G, merge_block_r=tile[0], merge_block_d=tile[1])
        us = d._graph_timer(lambda: mla.mla_decode_triton(x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], q, config=cfg, out=out))
        res.append(f"{'auto ' + 'x'.join(map(str, cfg.merge_tile(b * q * h))) if tile is None else 'x'.join(map(str, tile))} {us:.1f}")
    print(f"H{h} q{q} B{b} L{l}:", " | ".join(res))
