"""The warp-specialised kernel merging its own splits (``TritonConfig.ws_split_merge``) against the second-kernel
merge (sixteenth session).

Checks first, then times. Checks: at each point, and on ragged batches, the split-merge call against the
library's call (same partials, so equal up to the order of a sum: max |diff| and the count of differing
elements) and both against the fp32 golden; the counter workspace left zeroed; one CUDA-graph replay. Times:
the library's config (the idx-ahead loader and the merge kernel) and the same with ``ws_split_merge``, at the
library's split count, under CUDA-graph replay, in interleaved rounds, with the library's qlen-1 call at
B=16 L=4k for the ratio bar.

    PYTHONPATH=src python3 scripts/decode_ws_split_merge_probe.py OUT.json [rounds]
"""

from __future__ import annotations

import dataclasses
import statistics
import sys

import torch

from workbench import mla
from workbench.bench import common
from workbench.bench import decode as D

POINTS = ((16, 4, 16, 4096), (16, 3, 16, 4096), (16, 4, 16, 1024), (16, 4, 32, 1024), (16, 4, 32, 4096),
          (16, 4, 64, 4096), (16, 3, 64, 4096), (16, 8, 16, 4096), (128, 1, 16, 4096), (128, 1, 8, 4096),
          (16, 4, 4, 4096), (16, 4, 128, 8192))


def ragged_case(heads: int, qlen: int, lens: list[int], dev, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    total = sum(lens)
    cache = torch.randn(total + 1, mla.QK_HEAD_DIM, generator=g).to(torch.bfloat16).to(dev)
    cache[0] = float("nan")  # row 0 is never indexed
    idx = (1 + torch.randperm(total, generator=g)).to(torch.int32).to(dev)
    q = torch.randn(qlen * len(lens), heads, mla.QK_HEAD_DIM, generator=g).to(torch.bfloat16).to(dev)
    qo = torch.arange(0, qlen * len(lens) + 1, qlen, dtype=torch.int32, device=dev)
    kv = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    return q, cache, qo, kv, idx


def check(q, cache, qo, kv, idx, qlen, cfg, splits, label):
    ref_o, ref_l = mla.mla_decode_triton(q, cache, qo, kv, idx, qlen, 0.07, config=cfg, num_splits=splits)
    sm_cfg = dataclasses.replace(cfg, ws_split_merge=True)
    o, l = mla.mla_decode_triton(q, cache, qo, kv, idx, qlen, 0.07, config=sm_cfg, num_splits=splits)
    launched = "red.release.gpu" in mla.LAST_COMPILED["split"].asm["ptx"]  # the split-merge variant ran
    gold, gold_l = mla.mla_decode_ref(q, cache, qo, kv, idx, 0.07)
    torch.cuda.synchronize()
    ws = mla._COUNTERS.get(q.device)
    row = dict(case=label, splits=splits, config=sm_cfg.label,
               max_diff=(o.float() - ref_o.float()).abs().max().item(),
               n_diff=int((o != ref_o).sum().item()), lse_max_diff=(l - ref_l).abs().max().item(),
               err_sm=(o.float() - gold).abs().max().item(), err_lib=(ref_o.float() - gold).abs().max().item(),
               lse_err_sm=(l - gold_l).abs().max().item(), nan=bool(torch.isnan(o).any().item()),
               counters_zero=bool(ws is None or int(ws.abs().sum().item()) == 0),
               launched_split_merge=launched)
    print(row, flush=True)
    return row


def main(out: str, rounds: int = 5) -> None:
    dev = common.require_gpu()
    D.matmul_tflops()
    sm = mla._sm_count(dev)
    checks = []
    # ragged batches: short requests whose later splits hold no token, a request of one token, 48-row blocks
    for heads, qlen, lens, splits in ((16, 4, [4, 17, 100, 1000, 4099, 33, 7, 64], 8), (16, 3, [5, 300, 2000], 4),
                                      (128, 1, [70, 1, 4000, 129], 2), (16, 4, [4096] * 16, 8),
                                      (16, 2, [900, 31], 3), (16, 4, [4, 5, 6, 4], 8)):
        x = ragged_case(heads, qlen, lens, dev, seed=len(lens))
        cfg = dataclasses.replace(mla.GLUON_WS_IDX_AHEAD_CONFIG)
        checks.append(check(*x, qlen, cfg, splits, f"ragged H={heads} qlen={qlen} lens={lens[:5]}"))
    pool = D.CachePool(max(b * l for _, _, b, l in POINTS), torch.bfloat16, dev)
    calls, meta = {}, {}
    for (h, q, b, l) in POINTS:
        base, cfg, splits, x = D.point_call(pool, h, q, b, l)
        if not cfg.gluon_ws:
            print(f"skip {(h, q, b, l)}: the library runs {cfg.label}", flush=True)
            continue
        sm_cfg = dataclasses.replace(cfg, ws_split_merge=True)
        smc, _, _, _ = D.point_call(pool, h, q, b, l, config=sm_cfg)
        calls[(h, q, b, l, "lib")] = base
        calls[(h, q, b, l, "wsm")] = smc
        meta[(h, q, b, l)] = dict(splits=splits, lib=cfg.label, wsm=sm_cfg.label)
        checks.append(check(x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], q, cfg, splits,
                            f"point {(h, q, b, l)}"))
    q1, _, _, _ = D.point_call(pool, 16, 1, 16, 4096)
    calls[(16, 1, 16, 4096, "lib")] = q1
    # a CUDA-graph replay of the split-merge call, against its eager output
    fn = calls[(16, 4, 16, 4096, "wsm")]
    eager = fn()[0].clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graphed = fn()[0]
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    graph_ok = bool(torch.equal(graphed, eager))
    print("graph replay equal to eager:", graph_ok, flush=True)

    rows = []
    keys = list(calls)
    for rnd in range(rounds):
        for k in (keys if rnd % 2 == 0 else list(reversed(keys))):
            us = D._graph_timer(calls[k])
            rows.append(dict(round=rnd, heads=k[0], qlen=k[1], batch=k[2], context=k[3], variant=k[4], us=us))
    print()
    for (h, q, b, l), m in meta.items():
        lib = [r["us"] for r in rows if (r["heads"], r["qlen"], r["batch"], r["context"], r["variant"]) == (h, q, b, l, "lib")]
        wsm = [r["us"] for r in rows if (r["heads"], r["qlen"], r["batch"], r["context"], r["variant"]) == (h, q, b, l, "wsm")]
        print(f"H={h:3d} qlen={q} B={b:3d} L={l:5d} splits {m['splits']}: lib {statistics.median(lib):7.2f} "
              f"({min(lib):.2f}-{max(lib):.2f}) wsm {statistics.median(wsm):7.2f} ({min(wsm):.2f}-{max(wsm):.2f}) us")
    per = []
    for rnd in range(rounds):
        t = {(r["qlen"], r["variant"]): r["us"] for r in rows if r["round"] == rnd and r["heads"] == 16
             and r["batch"] == 16 and r["context"] == 4096}
        per.append((t[(4, "lib")] / t[(1, "lib")], t[(4, "wsm")] / t[(1, "lib")]))
    print("B=16 L=4k qlen-4 ratio per round (lib, wsm):", " ".join(f"{a:.3f}/{b:.3f}" for a, b in per))
    common.write_json(out, dict(benchmark="decode_ws_split_merge_probe", provenance=common.provenance(
        f"PYTHONPATH=src python3 scripts/decode_ws_split_merge_probe.py OUT.json {rounds}"), checks=checks,
        graph_replay_equal=graph_ok, points={str(k): v for k, v in meta.items()}, rows=rows,
        b16_qlen4_ratio_rounds=[dict(lib=a, wsm=b) for a, b in per]))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5)
