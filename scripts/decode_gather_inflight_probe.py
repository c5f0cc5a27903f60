"""How fast can a decode program stream its cache rows, by how many tiles are in flight? (twelfth session)

The qlen-1 small-batch default (16x64 w8 s3 ia) keeps one 64-token tile's copies in flight while it computes
the next (its loop waits with ``wait:2``: two copy groups, one tile), and the trace of rounds 15-16 measured a
steady 2.6 us per tile per SM: 28 GB/s per SM, 3.6 TB/s over the 128 programs of B=16 L=4k, where the large
batches' default (two programs per SM) streams about 31.8 GB/s per SM. A fourth stage, which would keep two
tiles in flight, needs 241,664 bytes of shared memory with the query tile beside it, more than the H200's
232,448. Before writing a kernel that keeps the query in registers to make room, this probe measures the
streaming alone: a Gluon kernel with the split kernel's grid, split rule, index loads and ``cp.async`` row
gather (16-byte copies, zero-filled past the end), whose only work per tile is one read of the tile from shared
memory into registers. ``NBUF`` buffers keep ``NBUF - 1`` tiles in flight. Launched back to back with PDL under
CUDA-graph replay, as the decode is; three interleaved rounds; the copy bandwidth of the same run beside it.

Run on an H200: PYTHONPATH=src python3 scripts/decode_gather_inflight_probe.py [OUT.json] [first|spin|smem]

``spin``: the tile's math is stood in for by a busy wait of 0, 350 or 700 ns per tile (``%globaltimer``), with
one and with two 64-token tiles in flight: whether the second tile in flight hides math that the first does not.
``smem``: the tile is read from shared memory 1, 2 or 4 times per tile (a barrier between reads), with one and
two tiles in flight: whether shared-memory reads at the decode's rate slow the stream.
"""
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from workbench import mla
from workbench.mla_gluon import _cta_barrier, gather_step, issue_first_tiles, program_range
from workbench.bench import common
from workbench.bench import decode as d

POINTS = ((16, 4096, 8), (64, 32768, 2), (128, 8192, 1), (32, 1024, 4))  # batch, context, splits


@gluon.jit
def _gather_stream_kernel(KV, KV_INDICES, KV_INDPTR, OUT, stride_kv, num_splits, spin_ns, BN: gl.constexpr,
                          NBUF: gl.constexpr, D_LATENT: gl.constexpr, D_ROPE: gl.constexpr, READS: gl.constexpr = 1):
    NW: gl.constexpr = gl.num_warps()
    GATHER: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    LAT_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D_LATENT], gl.bfloat16)
    ROPE_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D_ROPE], gl.bfloat16)
    pid_s = gl.program_id(0)
    req = gl.program_id(1)
    # the split kernels' prologue (PDL wait and trigger, this split's token range); no query here, so KV_INDPTR
    # stands in for QO_INDPTR and the query range it returns is unused
    _, _, kv_start, s_k, _, k_lo, k_hi, n_tiles = program_range(KV_INDPTR, KV_INDPTR, req, pid_s, num_splits, 1, BN,
                                                                True)
    k_lat_s = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, D_LATENT], LAT_SL)
    k_rope_s = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BN, D_ROPE], ROPE_SL)
    t_off, idx1 = issue_first_tiles(k_lat_s, k_rope_s, KV, KV_INDICES, kv_start, k_lo, k_hi, stride_kv, BN, NBUF,
                                    D_LATENT, D_ROPE, GATHER)
    acc = gl.zeros([BN, D_LATENT], gl.bfloat16, layout=GATHER)
    for i in range(n_tiles):
        idx1 = gather_step(k_lat_s, k_rope_s, KV, KV_INDICES, kv_start, k_lo, k_hi, i, t_off, idx1, stride_kv, BN, NBUF,
                           D_LATENT, D_ROPE, GATHER)
        for r in gl.static_range(READS):  # READS reads of the tile's latent part (a barrier between: not merged)
            if r > 0:
                _cta_barrier()
            acc = acc + k_lat_s.index(i % NBUF).load(GATHER)
        if spin_ns > 0:  # stand-in for a tile's math: every thread waits spin_ns on %globaltimer
            _spin(spin_ns, NW)
    cp.wait_group(0)
    total = gl.sum(gl.sum(acc.to(gl.float32), axis=1), axis=0)
    gl.store(OUT + req * num_splits + pid_s, total)


@gluon.jit
def _spin(spin_ns, NW: gl.constexpr):
    one: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    ns = gl.full([NW * 32], spin_ns, gl.int64, layout=one)
    gl.inline_asm_elementwise(
        "{ .reg .u64 t0, t1; .reg .pred p; mov.u64 t0, %globaltimer; SPIN_LOOP: mov.u64 t1, %globaltimer; "
        "sub.u64 t1, t1, t0; setp.lt.u64 p, t1, $1; @p bra SPIN_LOOP; mov.u64 $0, t1; }",
        "=l,l", [ns], dtype=gl.int64, is_pure=False, pack=1)


def launcher(x, splits, bn, nbuf, warps, spin_ns=0, reads=1):
    batch = x["kv_indptr"].numel() - 1
    out = torch.empty(batch * splits, dtype=torch.float32, device=x["kv_cache"].device)
    cache = x["kv_cache"]
    return lambda: _gather_stream_kernel[(splits, batch)](
        cache, x["kv_indices"], x["kv_indptr"], out, cache.stride(0), splits, spin_ns, BN=bn, NBUF=nbuf, READS=reads,
        D_LATENT=mla.KV_LORA_RANK, D_ROPE=mla.QK_ROPE_HEAD_DIM, num_warps=warps, launch_pdl=True)


# (tokens per tile, buffers, warps, spin ns, tile reads): first run, the stream alone
VARIANTS = ((64, 2, 8, 0, 1), (64, 3, 8, 0, 1), (64, 3, 4, 0, 1), (32, 3, 8, 0, 1), (32, 4, 8, 0, 1), (32, 6, 8, 0, 1),
            (32, 6, 4, 0, 1))
# second run (``spin``): a tile's math stood in for by a wait of 0.35 or 0.7 us, one or two tiles in flight
SPIN_VARIANTS = tuple((64, nbuf, 8, ns, 1) for ns in (0, 350, 700) for nbuf in (2, 3))
# third run (``smem``): the tile read from shared memory 1, 2 or 4 times (64, 128 or 256 KB per 64-token tile; the
# small-batch Triton tile's loop issues 74 16x16 ldmatrix.x4 per warp per tile, about 300 KB on 8 warps)
SMEM_VARIANTS = tuple((64, nbuf, 8, 0, reads) for reads in (1, 2, 4) for nbuf in (2, 3))
MODES = {"first": VARIANTS, "spin": SPIN_VARIANTS, "smem": SMEM_VARIANTS}


def main():
    dev = common.require_gpu()
    copy = common.copy_bandwidth()
    pool = d.CachePool(max(b * l for b, l, _ in POINTS), torch.bfloat16, dev)
    rows = []
    mode = (sys.argv[2:] or ["first"])[0]
    variants = MODES[mode]
    inputs = {p: d.make_inputs(pool, 16, 1, p[0], p[1], seed=p[0]) for p in POINTS}
    for rnd in range(3):
        for (b, l, s) in POINTS:
            x = inputs[(b, l, s)]
            nbytes = b * l * mla.QK_HEAD_DIM * 2
            out = torch.empty_like(x["q"][..., :mla.KV_LORA_RANK])
            lib = common.time_cuda_graph(lambda: mla.mla_decode_triton(
                x["q"], x["kv_cache"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"], 1, out=out))
            rows.append(dict(round=rnd, batch=b, context=l, splits=None, label="library decode", us=lib,
                             gb_s=nbytes / lib / 1e3))
            for bn, nbuf, warps, spin, reads in variants:
                us = common.time_cuda_graph(launcher(x, s, bn, nbuf, warps, spin, reads))
                rows.append(dict(round=rnd, batch=b, context=l, splits=s, us=us, gb_s=nbytes / us / 1e3,
                                 label=f"gather {bn}x{nbuf} w{warps}" + (f" spin {spin} ns" if spin else "")
                                 + (f" reads {reads}" if reads > 1 else "")))
            print(*(f"B{r['batch']:3d} L{r['context']:6d} {r['label']:22s} {r['us']:8.2f} us {r['gb_s']:7.0f} GB/s"
                    for r in rows[-1 - len(variants):]), sep="\n", flush=True)
    print(f"copy {copy['gb_s']:.0f} GB/s")
    if sys.argv[1:]:
        common.write_json(sys.argv[1], dict(benchmark="mla_decode_gather_inflight_probe",
                                            provenance=common.provenance(
                                                "PYTHONPATH=src python3 scripts/decode_gather_inflight_probe.py OUT.json"
                                                + ("" if mode == "first" else f" {mode}")),
                                            ceilings={"copy": copy}, rows=rows))


if __name__ == "__main__":
    main()
