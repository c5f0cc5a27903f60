"""Experimental warp-specialised gluon kernel (workbench.mla_gluon_ws): correctness against the golden and the
default gluon kernel, then CUDA-graph times beside mla.GLUON_CONFIG. Run on an H200:
PYTHONPATH=src python3 scripts/gluon_ws_probe.py"""
import json, os, sys, torch, triton
from workbench import mla, mla_gluon_ws as WS
from workbench.bench import decode as d, common

dev = common.require_gpu()


def ws_decode(q, cache, qo_indptr, kv_indptr, kv_indices, max_qo_len, sm_scale, num_splits, out=None):
    total_q, heads, _ = q.shape
    B = qo_indptr.numel() - 1
    rows = total_q * heads
    rb = triton.cdiv(max_qo_len * heads, 64)
    out = torch.empty(total_q, heads, 512, dtype=q.dtype, device=q.device) if out is None else out
    lse = torch.empty(total_q, heads, dtype=torch.float32, device=q.device)
    direct = num_splits == 1
    o_dst, l_dst = (out, lse) if direct else (torch.empty(num_splits, rows, 512, device=q.device),
                                               torch.empty(num_splits, rows, device=q.device))
    WS.mla_decode_gluon_ws_kernel[(rb, num_splits, B)](
        q, cache, kv_indices, qo_indptr, kv_indptr, o_dst, l_dst, cache.stride(0), rows, sm_scale * mla._LOG2E,
        num_splits, NUM_HEADS=heads, DIRECT=direct, D_LATENT=512, D_ROPE=64, PDL=True, num_warps=WS.NUM_WARPS,
        maxnreg=WS.MAX_REGS, launch_pdl=True)
    if not direct:
        mla._launch_merge(o_dst, l_dst, out, lse, rows, num_splits, mla.GLUON_CONFIG, GDC_WAIT=True, launch_pdl=True)
    return out, lse


# 1. correctness: ragged causal cases, NaN in unused cache rows, against the golden
sys.path.insert(0, "tests")
from test_mla import make_case  # noqa: E402
bad = 0
for heads, qo in ((16, [4, 4, 4]), (16, [3, 1, 4]), (128, [1, 1, 1]), (16, [16, 7, 1]), (16, [8, 8])):
    for splits in (1, 3, 8):
        for dtype in (torch.bfloat16, torch.float16):
            kv = [max(n, q) for n, q in zip([4099, 1, 100, 37], qo)]
            case = make_case(qo, kv, heads, dtype=dtype, device="cuda", seed=heads + splits)
            args = (case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"], max(qo), 0.07)
            o, l = ws_decode(*args, splits)
            ref_o, ref_l = mla.mla_decode_ref(case["q"].float(), case["kv_cache"].float(), case["qo_indptr"],
                                              case["kv_indptr"], case["kv_indices"], 0.07)
            g_o, _ = mla.mla_decode_triton(*args, config=mla.GLUON_CONFIG, num_splits=splits)
            e = (o.float() - ref_o).abs().max().item()
            eg = (g_o.float() - ref_o).abs().max().item()
            el = (l - ref_l).abs().max().item()
            ok = torch.isfinite(o).all().item() and e <= 2 * eg + 1e-2 and el < 1e-3
            bad += not ok
            print(f"H{heads} q{qo} s{splits} {dtype}: ws err {e:.2e} (gluon {eg:.2e}) lse {el:.1e} {'ok' if ok else 'BAD'}")
print("correctness:", "ALL OK" if not bad else f"{bad} BAD")
if bad:
    sys.exit(1)

# 2. times at the compute-bound bar points, beside the default gluon kernel (cost-model split counts)
pool = d.CachePool(64 * 32768 + 64, torch.bfloat16, dev)
res = []
for h, q, b, l in ((128, 1, 64, 4096), (16, 4, 16, 4096), (16, 4, 64, 4096), (16, 4, 64, 32768),
                   (16, 8, 64, 4096)):
    x = d.make_inputs(pool, h, q, b, l, seed=3)
    out = torch.empty(b * q, h, 512, dtype=torch.bfloat16, device=dev)
    rb = -(-q * h // 64)
    s_g = mla.default_splits(mla.GLUON_CONFIG, b, rb, b * l, mla._sm_count(dev))
    a = (x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], q, mla.default_sm_scale())
    t_g = d._graph_timer(lambda: mla.mla_decode_triton(*a, config=mla.GLUON_CONFIG, num_splits=s_g, out=out))
    row = dict(heads=h, qlen=q, batch=b, context=l, splits=s_g, gluon_us=t_g)
    for s in sorted({s_g, max(1, s_g // 2), s_g * 2} if s_g > 1 else {1, 2}):
        row[f"ws_s{s}_us"] = d._graph_timer(lambda: ws_decode(*a, s, out=out))
    res.append(row)
    print(row, flush=True)
os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
json.dump(dict(provenance=common.provenance("scripts/gluon_ws_probe.py"), rows=res),
          open(os.path.join(os.environ.get("OUT", "."), "ws_probe.json"), "w"), indent=1)
