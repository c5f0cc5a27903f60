"""How high is the H200's bf16 matrix-product rate, over more shapes than the bench's one 8192^3 product?

The qlen-8 decode bars need 803-812 TFLOP/s at two points (``workbench results``), against 766 TFLOP/s for the
8192^3 ``torch.matmul`` that ``workbench bench decode`` measures as its compute ceiling. This probe checks that
ceiling is not an artifact of that one shape: cuBLAS (``torch.matmul`` / ``torch.bmm``) on square products of
4096-16384 and on the two products of the decode itself, batched over requests, at the bar points' sizes:

* scores: ``(B, 128, 576) @ (B, 576, L)`` (16 heads x qlen 8 = 128 query rows, keys of 576 dims);
* output: ``(B, 128, L) @ (B, L, 512)`` (probabilities times the first 512 dims of each row).

Each shape is timed under CUDA-graph replay (``bench.common.time_cuda_graph``), in ``ROUNDS`` interleaved rounds;
the JSON keeps every timing. Inputs are random normal bf16. Nothing is asserted: it reports.

Run on an H200: PYTHONPATH=src python3 scripts/matmul_ceiling_probe.py OUT.json [ROUNDS]
"""
from __future__ import annotations

import sys

import torch

from workbench.bench import common

SQUARE = (4096, 8192, 12288, 16384)
DECODE_POINTS = ((64, 32768), (128, 8192), (64, 4096), (16, 4096))  # (B, L) of the qlen-8 bars
ROWS = 128  # 16 heads x qlen 8


def _shapes():
    for n in SQUARE:
        yield f"square {n}", (n, n, n), 1
    for b, l in DECODE_POINTS:
        yield f"scores B={b} L={l // 1024}k", (ROWS, l, 576), b  # (m, n, k) per request
        yield f"output B={b} L={l // 1024}k", (ROWS, 512, l), b


def _timer(m: int, n: int, k: int, batch: int, dev: torch.device):
    g = torch.Generator(device=dev).manual_seed(0)
    if batch == 1:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=g)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16, generator=g)
        c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        fn = lambda: torch.matmul(a, b, out=c)  # noqa: E731
    else:
        a = torch.randn(batch, m, k, device=dev, dtype=torch.bfloat16, generator=g)
        b = torch.randn(batch, k, n, device=dev, dtype=torch.bfloat16, generator=g)
        c = torch.empty(batch, m, n, device=dev, dtype=torch.bfloat16)
        fn = lambda: torch.bmm(a, b, out=c)  # noqa: E731
    return fn, (a, b, c)


def main(out: str, rounds: int = 3) -> None:
    dev = common.require_gpu()
    rows = []
    for r in range(rounds):
        for label, (m, n, k), batch in _shapes():
            fn, keep = _timer(m, n, k, batch, dev)
            us = common.time_cuda_graph(fn, graph_reps=5, repeats=10)
            flops = 2.0 * batch * m * n * k
            rows.append(dict(label=label, m=m, n=n, k=k, batch=batch, round=r, us=us, tflops=flops / (us * 1e-6) / 1e12))
            print(f"round {r} {label:22s} {us:10.1f} us {rows[-1]['tflops']:6.0f} TFLOP/s", flush=True)
            del fn, keep
            torch.cuda.empty_cache()
    best = {}
    for x in rows:
        best[x["label"]] = max(best.get(x["label"], 0.0), x["tflops"])
    payload = dict(rows=rows, best_tflops=best, provenance=common.provenance(
        f"PYTHONPATH=src python3 scripts/matmul_ceiling_probe.py OUT.json {rounds}"))
    common.write_json(out, payload)
    print("best:", {k: round(v) for k, v in best.items()})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
