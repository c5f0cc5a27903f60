"""Where the small-batch qlen-4 call's time goes on the warp-specialised kernel (sixteenth session).

B=16, 16 heads, 8 splits (the split count the library gives B=16 L=4k), the library's configs: qlen 4 on the
warp-specialised gluon kernel with the idx-ahead loader, qlen 1 on the swapped gluon kernel. Timed under
CUDA-graph replay, in interleaved rounds:

* the full call at L = 1k, 2k, 4k and 8k tokens per request (so 128, 256, 512 and 1024 tokens per program). The
  cache of one call fits the H200's 50 MB L2 up to L=2k (16 x 2048 x 1152 bytes = 38 MB), and graph replays re-read
  it, so only L=4k and 8k (75 and 151 MB) stream from HBM: :func:`summarize` takes the per-tile cost from those two;
* the warp-specialised split kernel alone at the same lengths (partials written, no merge), launched as the
  library launches it;
* the second-kernel merge alone at qlen 4's 1024 rows x 8 splits (random 16-bit partials; the library's tile);
* the full qlen-4 call at L=4k with the cache rows in 16-row runs (as vLLM lays out a 16-token block) instead
  of one by one.

    PYTHONPATH=src python3 scripts/decode_b16_qlen4_breakdown.py OUT.json [rounds]
"""

from __future__ import annotations

import statistics
import sys

import torch

from workbench import mla
from workbench.bench import common
from workbench.bench import decode as D

B, H, SPLITS = 16, 16, 8
LENGTHS = (1024, 2048, 4096, 8192)


def call(pool: D.CachePool, qlen: int, L: int, cfg: mla.TritonConfig):
    x = D.make_inputs(pool, H, qlen, B, L, seed=qlen * 100 + B)
    out = torch.empty(B * qlen, H, mla.KV_LORA_RANK, dtype=x["q"].dtype, device=pool.device)
    return lambda: mla.mla_decode_triton(x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], qlen,
                                         None, num_splits=SPLITS, config=cfg, out=out)


def split_only(pool: D.CachePool, qlen: int, L: int, cfg: mla.TritonConfig):
    """The warp-specialised split kernel as mla._launch_gluon launches it, without the merge after it."""
    from workbench import mla_gluon_ws

    x = D.make_inputs(pool, H, qlen, B, L, seed=qlen * 100 + B)
    q = x["q"]
    total_rows = q.shape[0] * H
    out = torch.empty(q.shape[0], H, mla.KV_LORA_RANK, dtype=q.dtype, device=pool.device)
    lse = torch.empty(q.shape[0], H, dtype=torch.float32, device=pool.device)
    o_dst, lse_dst = mla._gluon_destinations(q, out, lse, cfg, SPLITS, total_rows)
    scale = mla.default_sm_scale() * mla._LOG2E
    opts = dict(NUM_HEADS=H, D_LATENT=mla.KV_LORA_RANK, D_ROPE=mla.QK_ROPE_HEAD_DIM, COALESCED_STORE=cfg.coalesced_store,
                num_warps=mla_gluon_ws.NUM_WARPS, maxnreg=mla_gluon_ws.MAX_REGS, PDL=True, launch_pdl=True)
    grid = (-(-qlen * H // cfg.block_m), SPLITS, B)
    return lambda: mla_gluon_ws.mla_decode_gluon_ws_kernel[grid](
        q, x["kv_cache"], x["kv_indices"], x["qo_indptr"], x["kv_indptr"], o_dst, lse_dst, x["kv_cache"].stride(0),
        total_rows, scale, SPLITS, DIRECT=False, HANDOFF=cfg.ws_handoff, IDX_AHEAD=cfg.ws_idx_ahead,
        EARLY_Q=cfg.ws_early_q, **opts)


def summarize(med: dict[str, float]) -> dict[str, object]:
    """From the medians: what the merge adds at each length (full call less the split kernel alone), and per
    32-token tile of a program and the rest (the intercept) from the two HBM-bound lengths, 4k and 8k."""
    out: dict[str, object] = {"merge_adds_us": {L: med[f"qlen4 full L={L}"] - med[f"qlen4 split L={L}"]
                                                for L in LENGTHS}}
    tiles = {L: L // SPLITS // 32 for L in (4096, 8192)}
    for what in ("qlen4 full", "qlen4 split", "qlen1 full"):
        per_tile = (med[f"{what} L=8192"] - med[f"{what} L=4096"]) / (tiles[8192] - tiles[4096])
        out[what] = dict(us_per_32_token_tile=per_tile, rest_us=med[f"{what} L=4096"] - tiles[4096] * per_tile)
    return out


def main(out: str, rounds: int = 3) -> None:
    dev = common.require_gpu()
    D.matmul_tflops()  # clocks out of idle
    sm = mla._sm_count(dev)
    cfg4 = mla.triton_config(4 * H, torch.bfloat16, B * 4096, num_reqs=B, sm_count=sm)
    cfg1 = mla.triton_config(1 * H, torch.bfloat16, B * 4096, num_reqs=B, sm_count=sm)
    assert cfg4.gluon_ws and cfg4.ws_idx_ahead and cfg1.gluon_swap, (cfg4.label, cfg1.label)
    assert mla.default_splits(cfg4, B, 1, B * 4096, sm) == SPLITS
    pool = D.CachePool(B * max(LENGTHS), torch.bfloat16, dev)
    pool16 = D.CachePool(B * 4096, torch.bfloat16, dev, seed=1, run=16)
    fns = {}
    for L in LENGTHS:
        fns[f"qlen4 full L={L}"] = call(pool, 4, L, cfg4)
        fns[f"qlen4 split L={L}"] = split_only(pool, 4, L, cfg4)
        fns[f"qlen1 full L={L}"] = call(pool, 1, L, cfg1)
    fns["qlen4 full L=4096 run16"] = call(pool16, 4, 4096, cfg4)
    fns["qlen1 full L=4096 run16"] = call(pool16, 1, 4096, cfg1)
    rows4 = B * 4 * H
    br, bd = cfg4.merge_tile(rows4, SPLITS)
    fns["merge only 1024x8"] = None  # timed through time_merge_only (fresh random partials each time)
    for name, fn in fns.items():
        if not name.startswith("merge"):
            fn()
    torch.cuda.synchronize()
    rows = []
    for rnd in range(rounds):
        names = list(fns) if rnd % 2 == 0 else list(reversed(fns))
        for name in names:
            if name.startswith("merge"):
                us = D.time_merge_only(SPLITS, rows4, br, bd, part_dtype=torch.bfloat16,
                                       num_warps=cfg4.merge_num_warps(rows4))
            else:
                us = D._graph_timer(fns[name])
            rows.append(dict(round=rnd, name=name, us=us))
            print(f"{rnd} {name:28s} {us:8.2f} us", flush=True)
    med = {n: statistics.median(r["us"] for r in rows if r["name"] == n) for n in fns}
    print()
    for n, v in med.items():
        print(f"{n:28s} median {v:8.2f} us")
    summary = summarize(med)
    for k, v in summary.items():
        print(f"{k}: {v}")
    common.write_json(out, dict(benchmark="decode_b16_qlen4_breakdown", provenance=common.provenance(
        f"PYTHONPATH=src python3 scripts/decode_b16_qlen4_breakdown.py OUT.json {rounds}"),
        configs={"qlen4": cfg4.label, "qlen1": cfg1.label}, splits=SPLITS, merge_tile=[br, bd], rows=rows,
        medians=med, summary=summary))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
