"""Does a short timing right after an idle pause run at lower clocks? (sixteenth session)

The benchmarks time each point right after its kernels compile on first use, and the GPU idles meanwhile. This
probe times the same calls after an idle pause of ``PAUSE_S`` (as a compile leaves), once as the benchmarks do
('cold') and once after ``BUSY_S`` of back-to-back device copies right before the timing ('busy'), in
interleaved rounds, while a host thread samples the SM clock through NVML every millisecond. Calls: the
expansion at the bar points (library config), the store-only floor and a torch fill of the same bytes at
256 x 4k, and the MLA decode at B=16 L=4k qlen 1 and 4 (library configs).

    PYTHONPATH=src python3 scripts/bench_clock_probe.py OUT.json [rounds]
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

import torch
import triton

from workbench import expand as E
from workbench.bench import common
from workbench.bench import decode as D
from workbench.bench import expand as BE

PAUSE_S = 0.5  # the idle gap a compile leaves (a Triton compile takes about this long or more)
BUSY_S = 0.2  # back-to-back copies before a 'busy' timing


class ClockSampler:
    """SM clock (MHz) samples from NVML on a host thread, tagged with the label set when they were taken."""

    def __init__(self) -> None:
        import pynvml
        pynvml.nvmlInit()
        self._nvml = pynvml
        self._h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        self.label = None
        self.samples: dict[str, list[int]] = {}
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop:
            if self.label is not None:
                mhz = self._nvml.nvmlDeviceGetClockInfo(self._h, self._nvml.NVML_CLOCK_SM)
                self.samples.setdefault(self.label, []).append(mhz)
            time.sleep(0.001)

    def stop(self) -> None:
        self._stop = True
        self._t.join()


def busy(seconds: float) -> None:
    a = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t0 = time.time()
    while time.time() - t0 < seconds:
        for _ in range(20):
            b.copy_(a)
        torch.cuda.synchronize()


def main(out: str, rounds: int = 5) -> None:
    dev = common.require_gpu()
    busy(1.0)
    calls = {}
    for r, n in ((256, 4096), (1, 97000)):
        bt, sl, _ = BE._make_inputs(r, n, BE.K_DEFAULT, dev)
        o = torch.empty(r * n, dtype=torch.int32, device=dev)
        ip = torch.empty(r + 1, dtype=torch.int32, device=dev)
        cfg = E.expand_config(r, n)
        calls[f"expand {r}x{n}"] = (lambda bt=bt, sl=sl, o=o, ip=ip, n=n, cfg=cfg: E.expand_page_indices(
            bt, sl, BE.K_DEFAULT, out=o, kv_indptr=ip, max_seq_len=n, validate=False, config=cfg))
    n = 256 * 4096
    so = torch.empty(n, dtype=torch.int32, device=dev)
    calls["store only 256x4k (PDL)"] = lambda: BE._store_only_kernel[(triton.cdiv(n, 1024),)](
        so, n, BLOCK=1024, num_warps=4, PDL=True, launch_pdl=True)
    fb = torch.empty(n, dtype=torch.int32, device=dev)
    calls["torch fill 256x4k"] = lambda: fb.fill_(7)
    pool = D.CachePool(16 * 4096, torch.bfloat16, dev)
    for q in (1, 4):
        fn, cfg, splits, _ = D.point_call(pool, 16, q, 16, 4096)
        calls[f"decode B=16 L=4k qlen {q}"] = fn
    for fn in calls.values():  # compile everything first
        fn()
    torch.cuda.synchronize()

    sampler = ClockSampler()
    rows = []
    try:
        for rnd in range(rounds):
            for name, fn in calls.items():
                for mode in (("cold", "busy") if rnd % 2 == 0 else ("busy", "cold")):
                    time.sleep(PAUSE_S)
                    if mode == "busy":
                        busy(BUSY_S)
                    key = f"{rnd}|{name}|{mode}"
                    sampler.label = key
                    us = common.time_cuda_graph(fn)
                    sampler.label = None
                    clocks = sampler.samples.get(key, [])
                    rows.append(dict(round=rnd, call=name, mode=mode, us=us,
                                     sm_mhz_min=min(clocks) if clocks else None,
                                     sm_mhz_median=statistics.median(clocks) if clocks else None,
                                     clock_samples=len(clocks)))
                    print(f"{rnd} {name:26s} {mode:4s} {us:8.2f} us  SM clock "
                          f"{rows[-1]['sm_mhz_min']}-{rows[-1]['sm_mhz_median']} MHz ({len(clocks)} samples)",
                          flush=True)
    finally:
        sampler.stop()
    print()
    for name in calls:
        for mode in ("cold", "busy"):
            us = [r["us"] for r in rows if r["call"] == name and r["mode"] == mode]
            mhz = [r["sm_mhz_min"] for r in rows if r["call"] == name and r["mode"] == mode and r["sm_mhz_min"]]
            print(f"{name:26s} {mode:4s} median {statistics.median(us):8.2f} us  range {min(us):.2f}-{max(us):.2f}"
                  f"  lowest SM clock {min(mhz) if mhz else '-'} MHz")
    common.write_json(out, dict(benchmark="bench_clock_probe", provenance=common.provenance(
        f"PYTHONPATH=src python3 scripts/bench_clock_probe.py OUT.json {rounds}"), pause_s=PAUSE_S, busy_s=BUSY_S,
        rows=rows))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5)
