"""The split kernel that triggers its dependents whenever it is PDL-launched (new rule) against triggering only
before a second-kernel merge (old rule), at points with one split and one small-batch point. Run on an H200:
PYTHONPATH=src python3 scripts/pdl_trigger_probe.py OUT.json"""
import json, sys, torch
from workbench import mla
from workbench.bench import common, decode as d
dev = common.require_gpu()
pool = d.CachePool(128 * 4096 + 64, torch.bfloat16, dev)
orig = mla.split_kernel_options
def old_rule(cfg, heads, dtype, dev_, *, launch_dependents=False, pdl_split=False):
    return orig(cfg, heads, dtype, dev_, launch_dependents=OLD["ld"](launch_dependents), pdl_split=pdl_split)
rows = []
for rnd in range(3):
    for h, q, b, l in ((16, 1, 128, 1024), (16, 2, 128, 1024), (16, 1, 128, 2048), (16, 2, 64, 1024), (16, 1, 16, 4096)):
        x = d.make_inputs(pool, h, q, b, l, seed=7)
        out = torch.empty(b * q, h, 512, dtype=torch.bfloat16, device=dev)
        a = (x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], q, mla.default_sm_scale())
        cfg = d.pre_swap_config(q * h, b * l, b, mla._sm_count(dev))  # the defaults when this probe ran
        s = mla.default_splits(cfg, b, 1, b * l, mla._sm_count(dev))
        row = dict(round=rnd, heads=h, qlen=q, batch=b, context=l, splits=s, config=cfg.label)
        for name, ld in (("trigger when pdl_split (new)", lambda v: v), ("no trigger with one split (old)", None)):
            if ld is None:
                # the old rule: trigger only for the second-kernel merge
                OLD = {"ld": lambda v: v and s > 1}
                mla.split_kernel_options = old_rule
            else:
                mla.split_kernel_options = orig
            row[name] = d._graph_timer(lambda: mla.mla_decode_triton(*a, config=cfg, num_splits=s, out=out))
        mla.split_kernel_options = orig
        rows.append(row); print(row, flush=True)
json.dump(dict(provenance=common.provenance("PYTHONPATH=src python3 scripts/pdl_trigger_probe.py OUT.json"), rows=rows), open(sys.argv[1], "w"), indent=1)
