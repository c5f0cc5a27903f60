"""The tensor-core rate of the MLA decode tile's two products at 32- and 64-token tiles (Hopper).

    workbench bench tile_rates --out src/workbench/data/bench_tile_rates_h200.json
    (or: PYTHONPATH=src python benchmarks/tile_rates.py --out ...)

For each product of :mod:`workbench.mla.tile_rates` (``qk``: ``S = q k^T``, both operands in shared memory;
``pv``: ``O += P V``, ``P`` from registers) and each tile width, one program per SM runs the product ``--iters``
times with the next repeat always issued before the last is waited for; the median time of ``--repeats`` launches
gives the rate. A bf16 matrix product of 8192^3 is timed in the same run as the device's ceiling. Before timing,
every kernel's product is checked against :func:`workbench.mla.tile_rates.reference_product`.
:func:`workbench.perfmodel.tile_schedule_floor_us` turns the rates into the least time a schedule on such tiles
can take at a decode point.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from workbench.bench import common
from workbench.mla import tile_rates as tr


def check(product: str, width: int, dev: torch.device, iters: int = 3) -> float:
    """The kernel's product against the reference (``iters`` repeats; ``pv`` sums them): the largest error,
    relative to the largest reference value. Raises if it exceeds bf16 rounding of the inputs' sums."""
    a, b = tr.product_inputs(product, width, dev)
    out = tr.run_product(product, a, b, iters, 1)
    ref = tr.reference_product(product, a, b) * (iters if product == "pv" else 1)
    err = ((out - ref).abs().max() / ref.abs().max()).item()
    if not err < 1e-4:
        raise RuntimeError(f"{product} at width {width}: relative error {err:.2e} against the reference")
    return err


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--iters", type=int, default=4096, help="repeats of the product inside one launch")
    parser.add_argument("--repeats", type=int, default=15, help="timed launches per kernel (the median is kept)")
    parser.add_argument("--out", default="bench_tile_rates.json", help="where the JSON goes")


def main(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise ValueError(f"--repeats is {args.repeats}; it must be at least 1")
    dev = common.require_gpu()
    programs = torch.cuda.get_device_properties(dev).multi_processor_count
    tr.check_product_args("qk", 32, args.iters, programs)
    t0 = time.time()
    matmul = common.matmul_rate()
    rows = []
    for product in tr.PRODUCTS:
        for width in tr.TILE_WIDTHS:
            err = check(product, width, dev)
            a, b = tr.product_inputs(product, width, dev)
            us = common.time_eager(lambda: tr.run_product(product, a, b, args.iters, programs), reps=1,
                                   repeats=args.repeats)
            tflops = tr.product_flops(product, width, args.iters, programs) / (us * 1e-6) / 1e12
            rows.append({"product": product, "width": width, "iters": args.iters, "programs": programs, "us": us,
                         "tflops": tflops, "fraction_of_matmul": tflops / matmul["tflops"],
                         "relative_error": err})
            print(f"{product} width {width}: {us:9.1f} us  {tflops:6.1f} TFLOP/s "
                  f"({tflops / matmul['tflops']:.2f} of the matmul's {matmul['tflops']:.0f})")
    payload = {"benchmark": "tile_rates", "provenance": common.provenance(), "matmul_bf16": matmul, "rates": rows,
               "formulas": {"flops": "programs * iters * 2 * 128 * width * (576 for qk, 256 for pv)",
                            "method": "one program per SM, two warpgroups of 64 rows each; the next repeat issued "
                                      "before the last is waited for; median of the timed launches"},
               "seconds": time.time() - t0}
    print(f"wrote {common.write_json(args.out, payload)}")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))
