"""Benchmark of the per-token index expansion (``workbench bench expand``).

Byte formula, stated before measuring. For a batch with ``seq_lens = L_r`` and kernel block size ``K``
the expansion must at least

* read the block-table entries it uses: ``4 * sum_r ceil(L_r / K)`` bytes (int32 ids), and
* write one int32 index per token: ``4 * sum_r L_r`` bytes,

so ``bytes = 4 * sum_r (ceil(L_r / K) + L_r)``, about ``4 * (1 + 1/K)`` bytes per token (4.25 at K = 16).
The ``seq_lens`` read and the ``kv_indptr`` write (``8 * num_reqs + 4`` bytes) are left out: they are
negligible here. Achieved bandwidth is ``bytes / time``, compared with the device-to-device copy
bandwidth measured in the same run (:func:`workbench.bench.common.copy_bandwidth`, read + write).

Contenders, all timed under CUDA-graph replay except the dense one:

* ``kernel``: :func:`workbench.expand.expand_page_indices` (one launch, 2-D grid, computes ``kv_indptr`` too);
* ``serial``: the one-program-per-request design of vLLM v0.20 (:func:`workbench.expand._launch_serial`),
  given a precomputed ``kv_indptr`` (its ``cumsum`` is not timed: this favours it);
* ``dense``: plain torch ``[R, max_len]`` indices + boolean mask; the mask compaction synchronises with
  the host, so it cannot be captured and is timed eagerly (:func:`workbench.bench.common.time_eager`).

Each case below 128k tokens is also timed with a loose bound, ``max_seq_len=131072`` (one CUDA graph for
every step would be sized by the model's maximum length): with ``loose_bound=True`` and with the default
launch (:func:`_time_loose_bound`; outputs checked against the tight call's).

Also measured, for context: the write-only ``fill_`` bandwidth, a ``fill_`` of each case's output buffer
(the same bytes written with no indexing at all), and the time of a one-store kernel under the same
replay (the floor any launch pays). The copy ceiling is the largest of three copy measurements
(:func:`workbench.bench.common.copy_bandwidth`), taken before and after the cases.

``--sweep`` (:data:`SWEEP`, :func:`run_sweep`) also times, per case, launch parameters of the library
kernel, its first revision (chunks aligned to the output, :func:`_expand_v1_kernel`), a precomputed
``kv_indptr`` instead of the in-kernel prefix sum, and a store-only kernel writing the same bytes with no
loads (the floor of any expansion kernel); every expansion variant's output is checked.

Bars (H200, K = 16): at 512 x 128k at least 90 % of the copy bandwidth; at most 2 us at 1 x 97k
and at 256 x 4k; at least 10x faster than ``serial`` at 1 x 97k.
Nothing here imports plotly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import triton
import triton.language as tl

from workbench import expand as E
from workbench.device import pdl_available as device_pdl_available
from workbench.bench.common import (copy_bandwidth, kernel_device_us, provenance, require_gpu, time_cuda_graph,
                                    time_eager, write_json)

__all__ = ["BARS", "CASES", "SWEEP", "Bar", "Variant", "check_bars", "expand_bytes", "format_sweep", "format_table", "run"]

K_DEFAULT = 16

# (num_reqs, seq_len per request); tokens are K-aligned except 97_000 (a real ~97k context).
CASES: tuple[tuple[int, int], ...] = (
    (1, 97_000),
    (4, 65_536),
    (32, 32_768),
    (256, 4_096),
    (512, 131_072),
    (1_024, 1_000),  # a large decode batch: the prefix sum's cost grows with the number of requests
    (16_384, 32),  # many tiny requests: requests packed into groups (ExpandConfig.group)
)

@dataclasses.dataclass(frozen=True)
class Variant:
    """One line of the ``--sweep``: which kernel, with which launch parameters.

    ``kernel``: ``"kernel"`` (the library's), ``"v1"`` (its first revision, chunks aligned to the output:
    :func:`_expand_v1_kernel`) or ``"store_only"`` (writes the same number of int32 with no loads at all:
    the floor any expansion kernel of this shape pays, :func:`_store_only_kernel`). ``streaming``: ``None``
    follows :func:`workbench.expand.expand_config`'s rule, as do ``block_t``, ``num_warps`` and ``group`` when
    ``None``. ``cap``: programs per request; ``"wave"`` picks about one wave (``16 * SM count`` programs in
    all); ``None``: one program per chunk.
    """

    label: str
    kernel: str = "kernel"
    block_t: int | None = None
    num_warps: int | None = None
    streaming: bool | None = None
    cap: int | str | None = None
    indptr_in: bool = False
    chunks_first: bool = True
    pdl: bool | None = None  # None: expand_config's choice (store_only: no PDL)
    prefix_u32: bool | None = None  # None: expand_config's choice
    group: int | None = None  # requests per program; None: expand_config's choice


# What ``--sweep`` times, per case (``expand_config()`` is chosen from such a sweep). "default" runs first and
# last, so the spread between the two is the noise of the sweep.
SWEEP: tuple[Variant, ...] = (
    Variant("default"),
    Variant("no PDL", pdl=False),
    Variant("PDL on", pdl=True),
    Variant("prefix int64", prefix_u32=False),
    Variant("prefix uint32", prefix_u32=True),
    Variant("1 warp", num_warps=1),
    Variant("2 warps", num_warps=2),
    Variant("4 warps", num_warps=4),
    Variant("no request groups", group=1),
    Variant("1024/4 (before the 8th session)", block_t=1024, num_warps=4, group=1),
    Variant("1024/2", block_t=1024, num_warps=2, group=1),
    Variant("512/2", block_t=512, num_warps=2, group=1),
    Variant("2048/8", block_t=2048, num_warps=8, group=1),
    Variant("requests first (grid order)", chunks_first=False),
    Variant("v1 (output-aligned chunks)", kernel="v1", block_t=1024, num_warps=4),
    Variant("1024/8", block_t=1024, num_warps=8, group=1),
    Variant("2048/4", block_t=2048, num_warps=4, group=1),
    Variant("4096/8", block_t=4096, num_warps=8, group=1),
    Variant("streaming on", streaming=True),
    Variant("streaming off", streaming=False),
    Variant("one wave, striding", cap="wave"),
    Variant("precomputed kv_indptr", indptr_in=True),
    Variant("store only 1024/4", kernel="store_only", block_t=1024, num_warps=4),
    Variant("store only 1024/4 PDL", kernel="store_only", block_t=1024, num_warps=4, pdl=True),
    Variant("store only 4096/8", kernel="store_only", block_t=4096, num_warps=8),
    Variant("default (again)"),
)


def expand_bytes(seq_lens: list[int], K: int) -> int:
    """Minimum bytes moved: int32 block-table entries read plus one int32 index written per token."""
    return sum(4 * (-(-n // K)) + 4 * n for n in seq_lens)


@dataclasses.dataclass(frozen=True)
class Bar:
    name: str
    case: tuple[int, int]
    metric: str  # key of the case result
    op: str  # ">=" or "<="
    target: float
    unit: str


BARS: tuple[Bar, ...] = (
    Bar("bandwidth at 512 x 128k", (512, 131_072), "kernel_frac_copy", ">=", 0.90, "x copy bandwidth"),
    Bar("latency at 1 x 97k", (1, 97_000), "kernel_us", "<=", 2.0, "us"),
    Bar("latency at 256 x 4k", (256, 4_096), "kernel_us", "<=", 2.0, "us"),
    Bar("speed-up over serial at 1 x 97k", (1, 97_000), "speedup_vs_serial", ">=", 10.0, "x"),
)


def _make_inputs(num_reqs: int, seq_len: int, K: int, device: torch.device, seed: int = 0):
    """Random permuted block ids (block 0 reserved), int32, exactly as many blocks as the tokens need."""
    g = torch.Generator(device=device).manual_seed(seed)
    blocks = -(-seq_len // K)
    ids = 1 + torch.randperm(num_reqs * blocks, generator=g, device=device, dtype=torch.int64)
    block_table = ids.to(torch.int32).reshape(num_reqs, blocks)
    seq_lens = torch.full((num_reqs,), seq_len, dtype=torch.int32, device=device)
    return block_table, seq_lens, num_reqs * blocks + 1


@triton.jit
def _one_store(x_ptr):  # the smallest kernel: one program, one store
    tl.store(x_ptr, 1)


@triton.jit
def _store_only_kernel(out_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Writes ``out[i] = i`` for ``i < n``: the same bytes as an expansion of ``n`` tokens, with no loads.
    ``PDL``: launched with PDL, it waits for the kernel before (which may still write ``out``) first."""
    if PDL:
        E.pdl_wait_then_release()
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, offs.to(tl.int32), mask=offs < n)


@triton.jit
def _expand_v1_kernel(
    block_table_ptr, block_table_stride, seq_lens_ptr, kv_indptr_ptr, kv_indices_ptr,
    K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, STORE_CACHE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """The library kernel's first revision, kept for the sweep's comparison: chunks aligned to the OUTPUT.

    Every full chunk is then a 16-byte-aligned store, but a program must finish the prefix sum over
    ``seq_lens[:r]`` before it knows which tokens (so which block ids) its chunk holds: the block-id load
    waits for the prefix sum, two memory latencies in a row before the first store. ``PDL`` as in the
    library kernel (wait before the first read, then let the next kernel launch), so that the sweep compares
    the two designs under the same launch.
    """
    if PDL:
        E.pdl_wait_then_release()
    r = tl.program_id(0)
    c = tl.program_id(1)
    n_c = tl.num_programs(1)
    start = tl.program_id(0).to(tl.int64) * 0
    for i in range(0, r, BLOCK_R):
        offs = i + tl.arange(0, BLOCK_R)
        start += tl.sum(tl.load(seq_lens_ptr + offs, mask=offs < r, other=0).to(tl.int64))
    seq_len = tl.load(seq_lens_ptr + r).to(tl.int32)
    end = start + seq_len
    if c == 0:
        tl.store(kv_indptr_ptr + r + 1, end.to(tl.int32))
        if r == 0:
            tl.store(kv_indptr_ptr, start.to(tl.int32))
    row = block_table_ptr + r.to(tl.int64) * block_table_stride
    lane = tl.arange(0, BLOCK_T)
    for chunk in range((start // BLOCK_T) + c, (end + BLOCK_T - 1) // BLOCK_T, n_c):
        base = tl.multiple_of(chunk * BLOCK_T, BLOCK_T)
        off = (base - start).to(tl.int32)
        t = off + lane
        dst = kv_indices_ptr + base + lane
        if (off >= 0) & (off + BLOCK_T <= seq_len):
            tu = t.to(tl.uint32)
            blk = tl.load(row + tu // K)
            tl.store(dst, (blk * K + (tu % K).to(tl.int32)).to(tl.int32), cache_modifier=STORE_CACHE)
        else:
            m = (t >= 0) & (t < seq_len)
            blk = tl.load(row + t // K, mask=m, other=0)
            tl.store(dst, (blk * K + t % K).to(tl.int32), mask=m, cache_modifier=STORE_CACHE)


def _variant_launcher(v: Variant, block_table, seq_lens, K: int, out, indptr, max_seq_len: int):
    """A zero-argument launch of variant ``v`` (capturable), and the config it ran with."""
    num_reqs = block_table.shape[0]
    cap = 65535
    if v.cap == "wave":
        sms = torch.cuda.get_device_properties(block_table.device).multi_processor_count if block_table.is_cuda else 4
        cap = max(1, 16 * sms // num_reqs)
    elif v.cap is not None:
        cap = int(v.cap)
    # expand_config's choice for every field the variant leaves at None
    given = dict(block_t=v.block_t, num_warps=v.num_warps, streaming_stores=v.streaming, pdl=v.pdl,
                 prefix_u32=v.prefix_u32, group=v.group)
    cfg = dataclasses.replace(E.expand_config(num_reqs, max_seq_len), max_chunk_programs=cap,
                              chunks_first=v.chunks_first, **{k: x for k, x in given.items() if x is not None})
    if v.kernel == "kernel":
        return (lambda: E._launch_expand(block_table, seq_lens, K, out, indptr, max_seq_len, cfg,
                                         indptr_in=v.indptr_in)), cfg
    if v.kernel == "v1":
        chunks = max(1, triton.cdiv(max_seq_len, cfg.block_t) + 1)
        block_r = min(triton.next_power_of_2(max(num_reqs, 16)), 1024)
        v1_pdl = E.pdl_launch_options(cfg.pdl and device_pdl_available(out.device))
        return (lambda: _expand_v1_kernel[(num_reqs, chunks)](
            block_table, block_table.stride(0), seq_lens, indptr, out, K=K, BLOCK_T=cfg.block_t, BLOCK_R=block_r,
            STORE_CACHE=".cs" if cfg.streaming_stores else "", num_warps=cfg.num_warps, **v1_pdl)), cfg
    if v.kernel == "store_only":
        n = out.numel()
        store_pdl = v.pdl is True and device_pdl_available(out.device)
        return (lambda: _store_only_kernel[(triton.cdiv(n, cfg.block_t),)](
            out, n, BLOCK=cfg.block_t, num_warps=cfg.num_warps, **E.pdl_launch_options(store_pdl))), cfg
    raise ValueError(f"Variant.kernel must be 'kernel', 'v1' or 'store_only', got {v.kernel!r}")


def run_sweep(block_table, seq_lens, K: int, out, max_seq_len: int, nbytes: int, ref_out, ref_indptr):
    """Time every :data:`SWEEP` variant on one case; check each expansion variant's output against the reference."""
    rows = []
    for v in SWEEP:
        indptr = torch.empty_like(ref_indptr)
        if v.indptr_in:
            indptr.copy_(ref_indptr)
        fn, cfg = _variant_launcher(v, block_table, seq_lens, K, out, indptr, max_seq_len)
        out.fill_(-1)
        us = time_cuda_graph(fn)
        torch.cuda.synchronize()
        row = {"label": v.label, "kernel": v.kernel, **dataclasses.asdict(cfg), "indptr_in": v.indptr_in,
               "us": us, "gb_s": nbytes / (us * 1e-6) / 1e9}
        if v.kernel != "store_only":
            row["agree"] = bool(torch.equal(out, ref_out)) and bool(torch.equal(indptr, ref_indptr))
        rows.append(row)
    return rows


def _time_kernel(block_table, seq_lens, K, out, indptr, max_seq_len, config) -> float:
    return time_cuda_graph(lambda: E.expand_page_indices(
        block_table, seq_lens, K, out=out, kv_indptr=indptr, max_seq_len=max_seq_len, validate=False, config=config))


LOOSE_BOUND = 131_072  # a model's maximum length: the bound a graph that serves every step would be sized by
LOOSE_DEFAULT_MAX_PROGRAMS = 1 << 20  # the loose bound with the default launch is timed up to this many programs


def _time_loose_bound(block_table, seq_lens, K, out, indptr, num_reqs) -> dict[str, Any]:
    """The same expansion with ``max_seq_len=LOOSE_BOUND`` instead of the tight bound: with
    ``loose_bound=True`` (``kernel_loose_bound_us``) and with the default launch
    (``kernel_loose_bound_default_us``; skipped above ``LOOSE_DEFAULT_MAX_PROGRAMS`` programs: 16,384 x 32 took
    27 ms in the committed ``loose_bound_probe``). Both outputs are checked against the tight call's."""
    res: dict[str, Any] = {"loose_bound": LOOSE_BOUND}
    want_out, want_indptr = out.clone(), indptr.clone()
    loose_out, loose_indptr = torch.empty_like(out), torch.empty_like(indptr)
    default = E.expand_config(num_reqs, LOOSE_BOUND)
    runs = [("kernel_loose_bound_us", E.expand_config(num_reqs, LOOSE_BOUND, loose_bound=True))]
    if -(-num_reqs // default.group) * -(-LOOSE_BOUND // default.block_t) <= LOOSE_DEFAULT_MAX_PROGRAMS:
        runs.append(("kernel_loose_bound_default_us", default))
    for key, cfg in runs:
        loose_out.fill_(-1)
        res[key] = time_cuda_graph(lambda: E.expand_page_indices(
            block_table, seq_lens, K, out=loose_out, kv_indptr=loose_indptr, max_seq_len=LOOSE_BOUND,
            validate=False, config=cfg))
        torch.cuda.synchronize()
        res[key.replace("kernel_", "agree_").replace("_us", "")] = bool(torch.equal(loose_out, want_out)) and bool(
            torch.equal(loose_indptr, want_indptr))
    res["loose_bound_config"] = dataclasses.asdict(runs[0][1])
    return res


def probe_case(num_reqs: int, seq_len: int, round_: int, ragged: bool = False, K: int = K_DEFAULT):
    """The common start of the in-kernel probes (``scripts/expand_prefix_probe.py``, ``expand_indptr_probe.py``):
    a batch (``ragged``: lengths drawn from 1..``seq_len``), its reference from the spec, an output buffer, and
    the two baseline rows every probe times first: a store-only kernel launched with PDL writing the same number
    of int32 (``"store only PDL"``, the floor) and the library's call (``"library"``).
    Returns ``(block_table, seq_lens, ref_out, ref_indptr, out, rows)``."""
    device = require_gpu()
    bt, sl, _ = _make_inputs(num_reqs, seq_len, K, device)
    if ragged:
        sl = torch.randint(1, seq_len + 1, (num_reqs,), device=device, dtype=torch.int32)
    ref_out, ref_indptr = E.expand_page_indices_ref(bt.cpu(), sl.cpu(), K)
    n = int(ref_indptr[-1])
    out = torch.empty(n, dtype=torch.int32, device=device)
    indptr = torch.empty(num_reqs + 1, dtype=torch.int32, device=device)
    floor = time_cuda_graph(lambda: _store_only_kernel[(triton.cdiv(n, 1024),)](
        out, n, BLOCK=1024, num_warps=4, PDL=True, launch_pdl=True))
    lib = time_cuda_graph(lambda: E.expand_page_indices(bt, sl, K, out=out, kv_indptr=indptr, max_seq_len=seq_len,
                                                        validate=False))
    rows = [dict(round=round_, R=num_reqs, L=seq_len, label="store only PDL", us=floor),
            dict(round=round_, R=num_reqs, L=seq_len, label="library", us=lib)]
    return bt, sl, ref_out, ref_indptr, out, rows


def probe_batch(num_reqs: int, seq_len: int, K: int = K_DEFAULT, *, ragged: bool = False, seed: int = 0):
    """The batch of the in-kernel probes that time their own kernels (``scripts/expand_*_probe.py``): random
    permuted block ids for ``num_reqs`` requests of ``seq_len`` tokens (``ragged``: lengths drawn uniformly from
    1..``seq_len`` with ``seed``), the spec's output for it, and an output and a ``kv_indptr`` buffer of its size.
    Returns ``(block_table, seq_lens, ref_out, ref_indptr, out, indptr)``."""
    device = require_gpu()
    bt, sl, _ = _make_inputs(num_reqs, seq_len, K, device, seed=seed)
    if ragged:
        sl = torch.randint(1, seq_len + 1, (num_reqs,), device=device, dtype=torch.int32,
                           generator=torch.Generator(device=device).manual_seed(seed))
    ref_out, ref_indptr = E.expand_page_indices_ref(bt.cpu(), sl.cpu(), K)
    out = torch.empty(int(ref_indptr[-1]), dtype=torch.int32, device=device)
    indptr = torch.empty(num_reqs + 1, dtype=torch.int32, device=device)
    return bt, sl, ref_out, ref_indptr, out, indptr


def time_probe_variants(variants, out: torch.Tensor, indptr: torch.Tensor, **fields: Any) -> list[dict[str, Any]]:
    """Time each ``(label, fn, want_out, want_indptr)`` of ``variants`` under CUDA-graph replay, with ``out`` and
    ``indptr`` filled with -1 first, and check what ``fn`` left in them against ``want_out`` and ``want_indptr``
    (``None``: not checked; ``agree`` is None when neither is). One row per variant: ``fields`` (round, R, L, ...)
    with ``label``, ``us`` and ``agree``, as :func:`workbench.bench.common.report_probe_rounds` reads them."""
    rows = []
    for label, fn, want_out, want_indptr in variants:
        out.fill_(-1)
        indptr.fill_(-1)
        us = time_cuda_graph(fn)
        torch.cuda.synchronize()
        checks = [bool(torch.equal(got.cpu(), want)) for got, want in ((out, want_out), (indptr, want_indptr))
                  if want is not None]
        rows.append(dict(fields, label=label, us=us, agree=all(checks) if checks else None))
    return rows


def time_expand_variants(num_reqs: int, seq_len: int, width: int, variants, round_: int = 0,
                         K: int = K_DEFAULT, ragged: bool = False) -> list[dict[str, Any]]:
    """The probes' measurement (``scripts/expand_*_probe.py``): one batch of ``num_reqs`` requests of ``seq_len``
    tokens whose block table is ``width`` tokens wide (as a graph sized by a loose bound would allocate it; the
    entries past each request's blocks hold block 0), and each ``(label, max_seq_len, config)`` of ``variants``
    (``config`` None: :func:`workbench.expand.expand_config`'s) timed under CUDA-graph replay and checked against
    the dense torch expansion. ``ragged``: lengths drawn uniformly from 1..``seq_len`` (seeded; the block table
    keeps ``seq_len`` tokens of room). Rows as :func:`workbench.bench.common.report_probe_rounds` reads them."""
    device = require_gpu()
    block_table, seq_lens, _ = _make_inputs(num_reqs, seq_len, K, device)
    if ragged:
        g = torch.Generator(device=device).manual_seed(1234 + num_reqs)
        seq_lens = torch.randint(1, seq_len + 1, (num_reqs,), generator=g, device=device, dtype=torch.int32)
    wide = torch.zeros(num_reqs, -(-max(width, seq_len) // K), dtype=torch.int32, device=device)
    wide[:, : block_table.shape[1]] = block_table
    ref_out, ref_indptr = E.expand_page_indices_dense(block_table, seq_lens, K)
    out = torch.empty(ref_out.numel(), dtype=torch.int32, device=device)
    indptr = torch.empty(num_reqs + 1, dtype=torch.int32, device=device)
    rows = []
    for label, bound, config in variants:
        used = config or E.expand_config(num_reqs, bound)
        out.fill_(-1)
        us = time_cuda_graph(lambda: E.expand_page_indices(wide, seq_lens, K, out=out, kv_indptr=indptr,
                                                           max_seq_len=bound, validate=False, config=used))
        torch.cuda.synchronize()
        ok = bool(torch.equal(out, ref_out)) and bool(torch.equal(indptr, ref_indptr))
        rows.append(dict(round=round_, R=num_reqs, L=seq_len, bound=bound, label=label, us=us, agree=ok,
                         config=dataclasses.asdict(used), **({"ragged": True} if ragged else {})))
    del wide, block_table, out
    torch.cuda.empty_cache()
    return rows


def _time_after_fill(fn) -> float:
    """Time of ``fn()`` right after a one-int ``fill_`` (a kernel that does not trigger dependents early), under
    graph replay: the period of (fill_, fn) pairs less the period of fill_ alone."""
    x = torch.empty(1, dtype=torch.int32, device=require_gpu())

    def pair() -> None:
        x.fill_(1)
        fn()

    return time_cuda_graph(pair) - time_cuda_graph(lambda: x.fill_(1))


def _device_us(fn) -> float | None:
    """Kernel execution time per call from the profiler (None where the profiler sees no kernels)."""
    try:
        return kernel_device_us(fn)["us"]
    except RuntimeError:
        return None


def device_times(num_reqs: int, seq_len: int, K: int = K_DEFAULT) -> dict[str, float | None]:
    """Kernel execution time (profiler) of the expansion and of ``fill_`` on the same bytes, one batch shape."""
    device = require_gpu()
    block_table, seq_lens, _ = _make_inputs(num_reqs, seq_len, K, device)
    out = torch.empty(num_reqs * seq_len, dtype=torch.int32, device=device)
    indptr = torch.empty(num_reqs + 1, dtype=torch.int32, device=device)
    config = E.expand_config(num_reqs, seq_len)
    res = {"kernel_device_us": _device_us(lambda: E.expand_page_indices(
        block_table, seq_lens, K, out=out, kv_indptr=indptr, max_seq_len=seq_len, validate=False, config=config)),
        "fill_same_bytes_device_us": _device_us(lambda: out.fill_(7))}
    del block_table, seq_lens, out
    torch.cuda.empty_cache()
    return res


def launch_floor_us() -> float:
    """Time of a Triton kernel that stores one int (one program) under the same graph replay: the floor."""
    x = torch.empty(1, dtype=torch.int32, device=require_gpu())
    return time_cuda_graph(lambda: _one_store[(1,)](x))


def fill_bandwidth(nbytes: int = 256 << 20) -> dict[str, float]:
    """Write-only bandwidth (``torch.fill_`` on an int32 buffer), bytes written over time."""
    buf = torch.empty(nbytes // 4, dtype=torch.int32, device=require_gpu())
    us = time_cuda_graph(lambda: buf.fill_(7), graph_reps=10)
    del buf
    return {"bytes": nbytes, "time_us": us, "gb_s": nbytes / (us * 1e-6) / 1e9}


def run_case(num_reqs: int, seq_len: int, K: int = K_DEFAULT, *, copy_gb_s: float, sweep: bool = False,
             dense: bool = True) -> dict[str, Any]:
    """Time the three contenders on one batch shape; check they agree; return a JSON-able dict."""
    device = require_gpu()
    block_table, seq_lens, num_blocks = _make_inputs(num_reqs, seq_len, K, device)
    total = num_reqs * seq_len
    nbytes = expand_bytes([seq_len] * num_reqs, K)
    E.validate_expand_inputs(block_table, seq_lens, K, num_blocks=num_blocks, max_seq_len=seq_len)
    out = torch.empty(total, dtype=torch.int32, device=device)
    indptr = torch.empty(num_reqs + 1, dtype=torch.int32, device=device)
    config = E.expand_config(num_reqs, seq_len)

    res: dict[str, Any] = {"num_reqs": num_reqs, "seq_len": seq_len, "K": K, "tokens": total, "bytes": nbytes,
                           "config": dataclasses.asdict(config)}
    res["kernel_us"] = _time_kernel(block_table, seq_lens, K, out, indptr, seq_len, config)
    # [0, cumsum(seq_lens)], prepared outside the timed regions: the input of the serial kernel and of this
    # kernel with the caller's kv_indptr (neither writes it), and the reference for the in-kernel one.
    given_indptr = torch.zeros(num_reqs + 1, dtype=torch.int32, device=device)
    given_indptr[1:] = torch.cumsum(seq_lens, 0)
    # The caller's kv_indptr instead of the in-kernel prefix sum (expand_page_indices(precomputed_kv_indptr=True)),
    # as vLLM's builder has it before the expansion: the same launch with one dependent read less. Not a bar's
    # metric (the bars time the call that computes kv_indptr too); reported beside it.
    given_out = torch.empty_like(out)
    res["kernel_indptr_given_us"] = time_cuda_graph(lambda: E.expand_page_indices(
        block_table, seq_lens, K, out=given_out, kv_indptr=given_indptr, max_seq_len=seq_len, validate=False,
        config=config, precomputed_kv_indptr=True))
    # The same kernel launched without PDL: back to back, a PDL launch overlaps the next call's launch with this
    # call's run, which is what the graph replay measures. After a kernel that does not trigger its dependents
    # early, a step sees something in between: kernel_after_fill_us times the expansion right after a one-int
    # torch fill_ (a graph of (fill_, expansion) pairs, less a graph of fill_ alone).
    res["kernel_no_pdl_us"] = _time_kernel(block_table, seq_lens, K, out, indptr, seq_len,
                                           dataclasses.replace(config, pdl=False))
    res["kernel_after_fill_us"] = _time_after_fill(lambda: E.expand_page_indices(
        block_table, seq_lens, K, out=out, kv_indptr=indptr, max_seq_len=seq_len, validate=False, config=config))
    # A plain fill of a buffer of the same size (not `out`, which the checks below compare): what writing
    # these bytes costs with no indexing at all.
    fill_buf = torch.empty_like(out)
    res["fill_same_bytes_us"] = time_cuda_graph(lambda: fill_buf.fill_(7))
    del fill_buf
    if seq_len < LOOSE_BOUND:
        res.update(_time_loose_bound(block_table, seq_lens, K, out, indptr, num_reqs))

    serial_out = torch.empty_like(out)
    res["serial_us"] = time_cuda_graph(lambda: E._launch_serial(block_table, given_indptr, K, serial_out))
    torch.cuda.synchronize()
    res["agree_serial"] = bool(torch.equal(out, serial_out)) and bool(torch.equal(indptr, given_indptr))
    res["agree_indptr_given"] = bool(torch.equal(given_out, serial_out))
    del given_out
    if dense:
        heavy = num_reqs * seq_len > 8_000_000
        res["dense_us"] = time_eager(lambda: E.expand_page_indices_dense(block_table, seq_lens, K, max_seq_len=seq_len),
                                     reps=3 if heavy else 10, repeats=5 if heavy else 10, warmup=1)
        res["agree_dense"] = bool(torch.equal(E.expand_page_indices_dense(block_table, seq_lens, K)[0], out))

    for name in ("kernel", "serial", "dense"):
        if f"{name}_us" in res:
            gb_s = nbytes / (res[f"{name}_us"] * 1e-6) / 1e9
            res[f"{name}_gb_s"] = gb_s
            res[f"{name}_frac_copy"] = gb_s / copy_gb_s
    res["speedup_vs_serial"] = res["serial_us"] / res["kernel_us"]

    if sweep:
        res["sweep"] = run_sweep(block_table, seq_lens, K, out, seq_len, nbytes, serial_out, given_indptr)
    del block_table, seq_lens, out, serial_out
    torch.cuda.empty_cache()
    return res


def check_bars(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each bar with its measured value and PASS/MISS (bars whose case was not run are left out)."""
    by_shape = {(c["num_reqs"], c["seq_len"]): c for c in cases if c["K"] == K_DEFAULT}
    verdicts = []
    for bar in BARS:
        case = by_shape.get(bar.case)
        if case is None:
            continue
        value = case[bar.metric]
        ok = value >= bar.target if bar.op == ">=" else value <= bar.target
        verdicts.append({**dataclasses.asdict(bar), "value": value, "verdict": "PASS" if ok else "MISS"})
    return verdicts


def run(cases: tuple[tuple[int, int], ...] = CASES, K: int = K_DEFAULT, *, sweep: bool = False, dense: bool = True,
        command: str | None = None, out: str | None = None) -> dict[str, Any]:
    """Run the whole benchmark; write JSON to ``out`` when given; return the result dict."""
    require_gpu()
    # The GPU idles at low clocks: warm it up with copies first, and measure the ceilings again at the end;
    # the largest copy bandwidth of all is the ceiling (the conservative choice for the bar).
    copies = [copy_bandwidth()["runs"], copy_bandwidth()["runs"]]
    floor_us = launch_floor_us()
    fill = fill_bandwidth()
    results = [run_case(r, n, K, copy_gb_s=max(max(c.values()) for c in copies), sweep=sweep, dense=dense)
               for r, n in cases]
    copies.append(copy_bandwidth()["runs"])
    # Last: kernel execution times from the profiler. Once CUPTI is attached it slows every later launch
    # (graph replays measured after it took ~0.7 us more per call), so nothing is timed after this.
    for res, (r, n) in zip(results, cases):
        res.update(device_times(r, n, K))
    one = torch.empty(1, dtype=torch.int32, device=require_gpu())
    floor_device_us = _device_us(lambda: _one_store[(1,)](one))
    best = max(((k, v) for c in copies for k, v in c.items()), key=lambda kv: kv[1])
    copy = {"gb_s": best[1], "method": best[0], "bytes_per_buffer": 2 << 30}
    for res in results:  # fractions against the final ceiling
        for name in ("kernel", "serial", "dense"):
            if f"{name}_gb_s" in res:
                res[f"{name}_frac_copy"] = res[f"{name}_gb_s"] / copy["gb_s"]
    payload = {
        "benchmark": "expand",
        "provenance": provenance(command),
        "byte_formula": "bytes = 4 * sum_r(ceil(L_r / K) + L_r): int32 block-table entries read + one int32 index "
                        "written per token (seq_lens read and kv_indptr write left out)",
        "timing": "median of CUDA-graph replays (20 calls per graph); dense: eager (boolean indexing syncs); "
                  "*_device_us: the kernels' own execution time from the profiler (CUPTI), under the same replay "
                  "(measured last: the profiler slows later launches)",
        "copy": copy,
        "copy_runs": copies,
        "fill": fill,
        "launch_floor_us": floor_us,
        "launch_floor_device_us": floor_device_us,
        "cases": results,
        "bars": check_bars(results),
    }
    if out:
        write_json(out, payload)
    return payload


def format_table(payload: dict[str, Any]) -> str:
    """The result as a text table, then the bars with PASS/MISS."""
    copy = payload["copy"]["gb_s"]
    lines = [
        f"device: {payload['provenance'].get('device', '?')}   copy ceiling (read+write): {copy:.0f} GB/s "
        f"({payload['copy']['method']}; all runs: "
        + "; ".join(", ".join(f"{k} {v:.0f}" for k, v in run.items()) for run in payload["copy_runs"]) + ")",
        f"write-only fill: {payload['fill']['gb_s']:.0f} GB/s   one-store Triton kernel under graph replay: "
        f"{payload['launch_floor_us']:.2f} us",
        "bytes = 4 * sum(ceil(L/K) + L)   (block-table entries read + 4 B written per token)",
        "",
        f"{'case':>14} {'tokens':>11} {'kernel us':>10} {'GB/s':>7} {'%copy':>6} {'serial us':>10} "
        f"{'speedup':>8} {'dense us':>9} {'fill us':>8} {'no PDL us':>10} {'after fill_':>12} {'indptr given':>13} "
        f"{'128k bound':>11} {'(default)':>10}",
    ]
    for c in payload["cases"]:
        dense = f"{c['dense_us']:9.1f}" if "dense_us" in c else f"{'-':>9}"
        lines.append(
            f"{c['num_reqs']:>5} x {c['seq_len']:<6} {c['tokens']:>11,} {c['kernel_us']:10.2f} {c['kernel_gb_s']:7.0f} "
            f"{100 * c['kernel_frac_copy']:5.1f}% {c['serial_us']:10.2f} {c['speedup_vs_serial']:7.1f}x {dense} "
            f"{c['fill_same_bytes_us']:8.2f} {_cell(c, 'kernel_no_pdl_us', 10)} {_cell(c, 'kernel_after_fill_us', 12)} "
            f"{_cell(c, 'kernel_indptr_given_us', 13)} {_cell(c, 'kernel_loose_bound_us', 11)} "
            f"{_cell(c, 'kernel_loose_bound_default_us', 10)}"
        )
    lines += ["", f"{'bar':36} {'target':>16} {'measured':>10}  verdict"]
    for b in payload["bars"]:
        lines.append(f"{b['name']:36} {b['op'] + ' ' + format(b['target'], 'g') + ' ' + b['unit']:>16} "
                     f"{b['value']:10.3g}  {b['verdict']}")
    if any("sweep" in c for c in payload["cases"]):
        lines += ["", format_sweep(payload)]
    return "\n".join(lines)


def _cell(case: dict[str, Any], key: str, width: int) -> str:
    """``case[key]`` in us, or '-' (results from before the key existed lack it)."""
    return f"{case[key]:{width}.2f}" if key in case else f"{'-':>{width}}"


def format_sweep(payload: dict[str, Any]) -> str:
    """The ``--sweep`` part of a result: one row per :data:`SWEEP` variant, one column (us) per case."""
    shapes = [c for c in payload["cases"] if "sweep" in c]
    if not shapes:
        return "no sweep in this result (run with --sweep)"
    lines = ["sweep (us; '!' marks an expansion whose output disagreed with the serial kernel's):",
             f"{'variant':28}" + "".join(f"{str(c['num_reqs']) + 'x' + str(c['seq_len']):>14}" for c in shapes)]
    for i, row in enumerate(shapes[0]["sweep"]):
        cells = []
        for c in shapes:
            s = c["sweep"][i]
            cells.append(f"{s['us']:13.2f}{'!' if s.get('agree') is False else ' '}")
        lines.append(f"{row['label']:28}" + "".join(cells))
    return "\n".join(lines)


def probe_ranges(runs: list[dict[str, Any]], num_reqs: int, seq_len: int, *,
                 over: str | None = None) -> dict[str, dict[str, Any]]:
    """The spread of each variant of the ``scripts/expand_*_probe.py`` runs (``[{"provenance", "rows"}, ...]``,
    as :func:`workbench.bench.common.report_probe_rounds` writes them) at one batch: per label, in the order
    first seen, ``lo`` and ``hi`` (us), ``n`` (timings), ``agree`` (False if any round's output disagreed with
    the probe's reference, None if none was checked), and with ``over`` the label of a reference variant timed in
    the same rounds, ``over_lo`` / ``over_hi``: the variant's time minus the reference's in the same run and
    round (so machine-to-machine and round-to-round drift cancel). A label without its reference in some round
    has no ``over_*``; a reference missing from every run is an error."""
    if over is not None and not any(r["label"] == over and (r["R"], r["L"]) == (num_reqs, seq_len)
                                    for run in runs for r in run["rows"]):
        raise ValueError(f"over={over!r}: no row of {num_reqs} x {seq_len} has that label")
    out: dict[str, dict[str, Any]] = {}
    diffs: dict[str, list[float]] = {}
    for run in runs:
        rows = [r for r in run["rows"] if (r["R"], r["L"]) == (num_reqs, seq_len)]
        ref = {r["round"]: r["us"] for r in rows if r["label"] == over}
        for r in rows:
            s = out.setdefault(r["label"], {"lo": r["us"], "hi": r["us"], "n": 0, "agree": None})
            s["lo"], s["hi"], s["n"] = min(s["lo"], r["us"]), max(s["hi"], r["us"]), s["n"] + 1
            if r.get("agree") is not None:
                s["agree"] = bool(r["agree"]) and s["agree"] is not False
            if r["round"] in ref:
                diffs.setdefault(r["label"], []).append(r["us"] - ref[r["round"]])
    for label, d in diffs.items():
        if len(d) == out[label]["n"]:
            out[label].update(over_lo=min(d), over_hi=max(d))
    return out
