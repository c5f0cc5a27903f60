"""Shared benchmark machinery: CUDA-graph timing, the copy-bandwidth ceiling, and provenance.

How things are timed (the device tool's METHOD.md): warm up first; capture the work in a CUDA
graph (``graph_reps`` launches per graph) and time graph replays with CUDA events; report the
median over ``repeats`` replays, divided by the launches per replay. Inputs are random, never zeros.
The ceiling every result is compared with is measured in the same run (:func:`copy_bandwidth`).
"""

from __future__ import annotations

import datetime
import os
import platform as _platform
import shlex
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from workbench import jsonio

__all__ = ["copy_bandwidth", "kernel_device_us", "matmul_rate", "provenance", "require_gpu", "time_cuda_graph",
           "time_eager", "write_json"]


def require_gpu() -> torch.device:
    """The CUDA/ROCm device, or a clear error: benchmarks need a compiled GPU, not the interpreter."""
    if not torch.cuda.is_available():
        raise RuntimeError("benchmarks need a CUDA or ROCm GPU; this machine has none (torch.cuda.is_available() is False)")
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1 is set: unset it to benchmark compiled kernels")
    return torch.device("cuda")


def _capture(fn: Callable[[], Any], graph_reps: int, warmup: int) -> torch.cuda.CUDAGraph:
    """Warm ``fn`` up on a side stream, capture ``graph_reps`` calls into one CUDA graph, replay it once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(graph_reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def time_cuda_graph(fn: Callable[[], Any], *, graph_reps: int = 20, repeats: int = 30, warmup: int = 3) -> float:
    """Median time of one ``fn()`` call in microseconds, under CUDA-graph replay.

    ``fn`` must be capturable: no host synchronisation, no allocation that changes between calls.
    ``graph_reps`` calls are captured into one graph to amortise the replay launch.
    """
    graph = _capture(fn, graph_reps, warmup)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / graph_reps)
    return statistics.median(times)


def kernel_device_us(fn: Callable[[], Any], *, graph_reps: int = 20, replays: int = 5) -> dict[str, Any]:
    """What the GPU spends *executing* one ``fn()`` call, as the profiler (CUPTI) reports kernel start and end,
    under the same CUDA-graph replay as :func:`time_cuda_graph`. That replay's period per call also holds the
    gap between one kernel's end and the next one's start (the launch of a graph node: about 1.1 us on an
    H200, paid even by an empty kernel); this holds only the kernels' own time.

    Returns ``{"us": median over calls of the summed kernel time per call, "kernels_per_call", "names"}``.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    graph = _capture(fn, graph_reps, warmup=1)
    with warnings.catch_warnings():
        # torch 2.11 warns that a profiler "clears events at the end of each cycle" when it is started again;
        # this one runs one cycle, so nothing is lost (the warning showed in chapter 2's GPU run)
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                graph.replay()
            torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    calls = graph_reps * replays
    if not kernels or len(kernels) % calls:
        raise RuntimeError(f"the profiler saw {len(kernels)} kernels for {calls} calls; expected a multiple")
    per = len(kernels) // calls
    durations = [sum(k.time_range.elapsed_us() for k in kernels[i * per:(i + 1) * per]) for i in range(calls)]
    return {"us": statistics.median(durations), "kernels_per_call": per,
            "names": sorted({k.name for k in kernels[:per]})}


def time_eager(fn: Callable[[], Any], *, reps: int = 20, repeats: int = 15, warmup: int = 3) -> float:
    """Median time of one ``fn()`` call in microseconds, launched eagerly (for code that cannot be captured)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def matmul_rate(n: int = 8192) -> dict[str, float]:
    """The bf16 matrix-product rate of an ``n``^3 ``torch.matmul`` under CUDA-graph replay, the device's compute
    ceiling for the benchmarks: ``{"n", "time_us", "tflops"}``."""
    dev = require_gpu()
    a, b = (torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    us = time_cuda_graph(lambda: torch.matmul(a, b, out=c), graph_reps=5, repeats=10)
    del a, b, c
    torch.cuda.empty_cache()
    return {"n": n, "time_us": us, "tflops": 2 * n**3 / (us * 1e-6) / 1e12}


def copy_bandwidth(nbytes: int = 2 << 30) -> dict[str, Any]:
    """Device copy bandwidth in GB/s (bytes read + written), measured three ways; the ceiling is the largest.

    ``graph_memcpy``: ``copy_`` captured in a CUDA graph, where it becomes a memcpy node (on the H200
    here only ~2.7 TB/s); ``eager_copy``: the same ``copy_`` launched eagerly; ``graph_kernel``: an
    elementwise copy kernel (``torch.bitwise_not``) under graph replay (both ~4.2-4.3 TB/s). Taking the
    largest is the conservative choice for bars expressed as a fraction of it. ``nbytes`` per buffer
    (default 2 GiB, far above any L2) so the cache does not flatter it.

    Returns ``{"gb_s", "method", "runs": {method: gb_s}, "bytes_per_buffer"}``.
    """
    device = require_gpu()
    src = torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), dtype=torch.int32, device=device)
    dst = torch.empty_like(src)
    per_s = 2 * nbytes * 1e6 / 1e9  # GB moved (read + write) times 1e6 us/s
    runs = {
        "graph_memcpy": per_s / time_cuda_graph(lambda: dst.copy_(src), graph_reps=5, repeats=20),
        "eager_copy": per_s / time_eager(lambda: dst.copy_(src), reps=5, repeats=10),
        "graph_kernel": per_s / time_cuda_graph(lambda: torch.bitwise_not(src, out=dst), graph_reps=5, repeats=10),
    }
    del src, dst
    torch.cuda.empty_cache()
    method = max(runs, key=runs.get)
    return {"gb_s": runs[method], "method": method, "runs": runs, "bytes_per_buffer": nbytes}


def provenance(command: str | None = None) -> dict[str, Any]:
    """Who measured what, where and when: device, driver, versions, date, and the command line."""
    import triton

    info: dict[str, Any] = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(shlex.quote(a) for a in sys.argv),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "host": _platform.node(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            device=props.name,
            sm_count=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            compute_capability=f"{props.major}.{props.minor}",
        )
    return info


def write_json(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
    """Write a benchmark result (pretty, sorted keys) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jsonio.dumps(payload, indent=1, sort_keys=True) + "\n")
    return path
