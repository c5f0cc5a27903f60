"""Which decode kernel and tile a call launches, and with how many KV splits.

The choice is data: ``data/tuned/decode_<family>.json`` holds, per device family, an ordered list of rules (the
first whose conditions hold gives the :class:`TritonConfig`), each with the points it was measured at and the
command that regenerates it (``benchmarks/decode.py tune`` on NVIDIA; on ROCm the tiles are chosen to fit the
LDS, not measured). :func:`triton_config` walks that table; :func:`choose_num_splits` picks the split count from
a wave-quantisation cost model; :func:`shared_memory_ladder` is what a GPU with less shared memory than an H200
steps down to.

Four kernels (``TritonConfig.kernel``):

* ``"triton"``: :func:`workbench.mla.triton_kernels.mla_decode_split_kernel`, on every GPU and the interpreter;
* ``"gluon_swap"``: :mod:`workbench.mla.gluon_swap`, Hopper, at most 32 folded rows (tokens as ``wgmma``'s M);
* ``"gluon"``: :mod:`workbench.mla.gluon`, Hopper, 64-row blocks, the two warpgroups in lockstep;
* ``"gluon_ws"``: :mod:`workbench.mla.gluon_ws`, Hopper, 64-row blocks, warp-specialised (FlashMLA's seesaw on
  64-token tiles): its fixed costs (the loader's start, the hand-overs) pay from about 128 KV tokens per program.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Any

import torch
import triton

from workbench import device
from workbench.mla.inputs import KV_LORA_RANK, QK_HEAD_DIM

__all__ = ["KERNELS", "TUNED_DIR", "TritonConfig", "choose_num_splits", "default_splits", "interpreter_config",
           "partial_dtype", "shared_memory_ladder", "table_config", "triton_config", "tuned_table"]

KERNELS = ("triton", "gluon", "gluon_ws", "gluon_swap")
TUNED_DIR = Path(__file__).resolve().parents[1] / "data" / "tuned"
_GLUON_SHAPES = {"gluon": {(64, 64, 8, 2)}, "gluon_ws": {(64, 64, 12, 2)},
                 "gluon_swap": {(16, 64, 4, 2), (32, 64, 4, 2)}}  # (block_m, block_n, num_warps, num_stages)


@dataclasses.dataclass(frozen=True)
class TritonConfig:
    """Launch parameters of the decode: which split kernel, its tile, and the split cost model.

    The Gluon kernels have fixed tiles (``_GLUON_SHAPES``): ``gluon`` 64 rows x 64 tokens on 8 warps with two
    buffers; ``gluon_ws`` 64 rows x 64 tokens on 12 warps (two consumer warpgroups and a loader) with two;
    ``gluon_swap`` 16 or 32 rows x 64 tokens on 4 warps with two. They keep their partials in q's 16-bit dtype.
    """

    kernel: str = "triton"  # one of KERNELS
    block_m: int = 16  # folded (query, head) rows per program
    block_n: int = 32  # tokens per KV tile
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int | None = None  # resident programs per SM; None: from the compiled kernel, or estimated
    idx_ahead: bool = False  # triton: each tile's indices are loaded one tile early
    pdl: bool = False  # programmatic dependent launch (compiled NVIDIA sm_90+; ignored elsewhere): the split kernel
    #                    waits for the kernel before it before its first read, and the merge launches early
    narrow_partials: bool = False  # triton: partial outputs in q's dtype instead of fp32 (half the bytes; each
    #                                partial is rounded once more, and the merge is a convex combination of them)
    split_overhead_tokens: int = 128  # a program's fixed cost (prologue, partial write) in tokens' worth of time
    merge_overhead_tokens: int = 64  # the merge's fixed cost (a second launch) in tokens' worth of time
    merge_tokens_per_split: int = 4  # the merge's cost per split
    max_splits: int = 128
    merge_block_r: int | None = None  # merge: rows per program (None: merge_tile() picks)
    merge_block_d: int | None = None  # merge: output columns per program, divides 512 (None: picks)
    merge_split_chunk: int = 16  # merge: splits loaded at once (a power of two)
    merge_warps: int | None = None  # merge: warps per program (None: merge_num_warps() picks)

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"TritonConfig.kernel is {self.kernel!r}; it must be one of {KERNELS}")
        shape = (self.block_m, self.block_n, self.num_warps, self.num_stages)
        if self.kernel != "triton":
            if shape not in _GLUON_SHAPES[self.kernel]:
                raise ValueError(f"kernel {self.kernel!r} has fixed tiles (block_m, block_n, num_warps, num_stages) "
                                 f"in {sorted(_GLUON_SHAPES[self.kernel])}, got {shape}")
            if self.narrow_partials:
                raise ValueError("narrow_partials is a switch of the Triton split kernel; the Gluon kernels always "
                                 "keep their partials in q's 16-bit dtype")
            if self.idx_ahead:
                raise ValueError(f"idx_ahead applies to the 'triton' kernel, not {self.kernel!r} (whose gather "
                                 "already loads each tile's indices ahead of its rows)")
        else:
            for name in ("block_m", "block_n"):
                v = getattr(self, name)
                if v < 16 or v & (v - 1):
                    raise ValueError(f"TritonConfig.{name} is {v}; tl.dot needs a power of two >= 16")
            if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
                raise ValueError(f"num_warps {self.num_warps} must be 1, 2, 4, 8 or 16 and num_stages "
                                 f"{self.num_stages} >= 1")
        if self.merge_warps not in (None, 1, 2, 4, 8):
            raise ValueError(f"merge_warps is {self.merge_warps}; it must be 1, 2, 4 or 8")

    def merge_tile(self, total_rows: int, num_splits: int = 1) -> tuple[int, int]:
        """(rows, columns) per program of the merge of ``num_splits`` partials of ``total_rows`` folded rows: the
        configured ones, else one-warp programs of 8 rows (:meth:`merge_num_warps`) and the widest of 128, 64 or 32
        columns that keeps at most 128 partial values per thread (splits loaded at once x 8 x columns / 32) and
        still makes at least 512 programs: a warp then sums its splits in registers and shuffles, not through
        shared memory and a barrier. At most 64 rows (one or a few requests, many splits): 8 x 16 on 4 warps."""
        if total_rows <= 64:
            auto = (8, 16)
        else:
            chunk = min(triton.next_power_of_2(max(num_splits, 1)), self.merge_split_chunk)
            auto = (8, 32)
            for cols in (128, 64):
                if chunk * 8 * cols <= 128 * 32 and triton.cdiv(total_rows, 8) * (KV_LORA_RANK // cols) >= 512:
                    auto = (8, cols)
                    break
        return (self.merge_block_r or auto[0], self.merge_block_d or auto[1])

    def merge_num_warps(self, total_rows: int) -> int:
        """Warps per program of the merge: ``merge_warps`` if set; else one above 64 rows with the automatic tile
        (:meth:`merge_tile`), four with a configured tile or at most 64 rows."""
        if self.merge_warps is not None:
            return self.merge_warps
        return 1 if total_rows > 64 and self.merge_block_r is None and self.merge_block_d is None else 4

    @property
    def key(self) -> tuple:
        """What selects a compiled split kernel (its resources are recorded under this key)."""
        return (self.kernel, self.block_m, self.block_n, self.num_warps, self.num_stages, self.idx_ahead, self.pdl,
                self.narrow_partials)

    @property
    def label(self) -> str:
        return (f"{self.kernel} {self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}"
                + (" ia" if self.idx_ahead else "") + (" pdl" if self.pdl else "")
                + (" np" if self.narrow_partials else ""))

    def resident_per_sm(self) -> int:
        """Programs that fit on one SM at once: ``programs_per_sm`` if set; else from the registers and shared
        memory of this config's compiled kernel once one was compiled in this process; else an estimate (shared
        memory: the q tile and one KV tile; registers: the fp32 accumulator + 96)."""
        if self.programs_per_sm is not None:
            return self.programs_per_sm
        seen = RESOURCES.get(self.key)
        if seen is not None:
            regs_per_thread, smem = seen
        else:
            smem = (self.block_m + self.block_n) * QK_HEAD_DIM * 2
            regs_per_thread = self.block_m * KV_LORA_RANK // (32 * self.num_warps) + 96
        threads = 32 * self.num_warps
        return max(1, min(device.HOPPER_SHARED_MEMORY // max(smem, 1), 65_536 // max(regs_per_thread * threads, 1),
                          2048 // threads))


RESOURCES: dict[tuple, tuple[int, int]] = {}  # config key -> (registers/thread, shared bytes) of its compiled kernel


def record_resources(config: TritonConfig, compiled: Any) -> None:
    """Remember a compiled split kernel's registers and shared memory (GPU only; the interpreter has none)."""
    n_regs = getattr(compiled, "n_regs", None)
    smem = getattr(getattr(compiled, "metadata", None), "shared", None)
    if isinstance(n_regs, int) and isinstance(smem, int) and n_regs > 0:
        old = RESOURCES.get(config.key, (0, 0))
        RESOURCES[config.key] = (max(old[0], n_regs), max(old[1], smem))


def partial_dtype(cfg: TritonConfig, dtype: torch.dtype) -> torch.dtype:
    """The dtype of a split call's partial outputs: q's 16-bit dtype for the Gluon kernels and with
    ``narrow_partials``, else fp32."""
    return dtype if cfg.narrow_partials or cfg.kernel != "triton" else torch.float32


def interpreter_config() -> TritonConfig:
    """Under the interpreter: the smallest legal tile (``tl.dot`` needs 16 in every dimension), one warp, a few
    splits so that the merge runs too, and one merge program per 16 rows (a few, large, interpreted programs)."""
    return TritonConfig(block_m=16, block_n=16, num_warps=1, num_stages=1, split_overhead_tokens=16,
                        merge_overhead_tokens=8, programs_per_sm=1, max_splits=4, merge_block_r=16,
                        merge_block_d=KV_LORA_RANK)


_CONDITIONS = ("fp32", "gluon", "max_rows", "min_rows", "max_tokens", "min_tokens_per_program",
               "max_tokens_per_program", "max_row_blocks")


@functools.cache
def tuned_table(family: str) -> dict[str, Any]:
    """The tuned rules of a device family (``"nvidia"`` or ``"rocm"``), read once from ``data/tuned/``. Each rule's
    conditions and config are checked here, so a malformed table fails on its first use, naming the rule."""
    if family not in ("nvidia", "rocm"):
        raise ValueError(f"family is {family!r}; the decode tables are 'nvidia' and 'rocm'")
    path = TUNED_DIR / f"decode_{family}.json"
    table = json.loads(path.read_text())
    rules = table.get("rules")
    if not isinstance(rules, list) or not rules or table.get("generated_by") is None:
        raise ValueError(f"{path}: a table needs 'generated_by' and a non-empty list of 'rules'")
    for i, rule in enumerate(rules):
        unknown = set(rule.get("when", {})) - set(_CONDITIONS)
        if unknown:
            raise ValueError(f"{path} rule {i} ({rule.get('name')!r}): unknown conditions {sorted(unknown)}; "
                             f"known: {_CONDITIONS}")
        rule["_config"] = TritonConfig(**rule["config"])  # raises with the field's rule when a value is wrong
    whens = [rule["when"] for rule in rules]
    if {"fp32": True} not in whens or {} not in whens:
        raise ValueError(f"{path}: the table needs a rule with no condition but fp32 and one with no condition at "
                         "all, so that every fp32 and every 16-bit call finds one")
    return table


def _sm_count(dev: torch.device) -> int:
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).multi_processor_count
    return 4  # interpreter: a few splits, to exercise the merge


def _tokens_per_program(cfg: TritonConfig, rows_per_req: int, total_tokens: int, num_reqs: int,
                        sm_count: int) -> float:
    row_blocks = -(-rows_per_req // cfg.block_m)
    return total_tokens / (num_reqs * default_splits(cfg, num_reqs, row_blocks, total_tokens, sm_count))


def _matches(when: dict[str, Any], cfg: TritonConfig, rows_per_req: int, fp32: bool, gluon: bool,
             total_tokens: int | None, num_reqs: int | None, sm_count: int | None) -> bool:
    if when.get("fp32", False) != fp32 or ("gluon" in when and when["gluon"] != gluon):
        return False
    if rows_per_req > when.get("max_rows", math.inf) or rows_per_req < when.get("min_rows", 0):
        return False
    if "max_tokens" in when and (total_tokens is None or total_tokens > when["max_tokens"]):
        return False
    if "max_row_blocks" in when and -(-rows_per_req // cfg.block_m) > when["max_row_blocks"]:
        return False
    if "min_tokens_per_program" in when or "max_tokens_per_program" in when:
        if num_reqs is None or total_tokens is None or num_reqs <= 0 or total_tokens <= 0:
            return False
        if sm_count is None:
            if not torch.cuda.is_available():
                raise ValueError("triton_config(num_reqs=...) needs sm_count (the GPU's SM count) when no CUDA "
                                 "device is present to read it from")
            sm_count = _sm_count(torch.device("cuda", torch.cuda.current_device()))
        tpp = _tokens_per_program(cfg, rows_per_req, total_tokens, num_reqs, sm_count)
        if not when.get("min_tokens_per_program", 0) <= tpp <= when.get("max_tokens_per_program", math.inf):
            return False
    return True


def triton_config(rows_per_req: int, dtype: torch.dtype, total_tokens: int | None = None, *,
                  backend: str | None = None, gluon: bool | None = None, num_reqs: int | None = None,
                  sm_count: int | None = None) -> TritonConfig:
    """The launch parameters for ``rows_per_req = max_qo_len * H`` folded rows and a batch of ``total_tokens`` KV
    tokens (an upper bound is fine, such as ``kv_indices.numel()``; None: a large batch).

    ``backend``: ``"cuda"`` or ``"hip"`` (default: the one this torch was built for) picks the table
    (:func:`tuned_table`); ``gluon`` (None: :func:`workbench.device.gluon_available`) whether the Gluon kernels may
    be chosen (16-bit only); ``num_reqs`` (with ``total_tokens``) and ``sm_count`` (default: the current CUDA
    device's) give the tokens per program that separate the two 64-row Gluon kernels. Under the interpreter:
    :func:`interpreter_config`. A GPU whose programs get less shared memory than the chosen tile needs steps down
    :func:`shared_memory_ladder` in :func:`workbench.mla.mla_decode_triton`.
    """
    backend = backend or ("hip" if torch.version.hip is not None else "cuda")
    if backend not in ("cuda", "hip"):
        raise ValueError(f"backend must be 'cuda' or 'hip', got {backend!r}")
    if not isinstance(rows_per_req, int) or rows_per_req < 1:
        raise ValueError(f"rows_per_req is {rows_per_req!r}; it must be an int >= 1 (max_qo_len * num_heads)")
    if device.interpreter_active():
        return interpreter_config()
    if gluon is None:
        gluon = backend == "cuda" and device.gluon_available()
    return table_config(rows_per_req, dtype, total_tokens, family="rocm" if backend == "hip" else "nvidia",
                        gluon=gluon, num_reqs=num_reqs, sm_count=sm_count)


def table_config(rows_per_req: int, dtype: torch.dtype, total_tokens: int | None = None, *, family: str = "nvidia",
                 gluon: bool = True, num_reqs: int | None = None, sm_count: int | None = None) -> TritonConfig:
    """The config the tuned table of ``family`` gives a call on a GPU of that family (``gluon``: whether the Gluon
    kernels run there: an NVIDIA Hopper GPU), whatever runs here: what :func:`triton_config` returns on that GPU.
    ``sm_count`` is the GPU's (an H200 has 132); the rules that separate the 64-row Gluon kernels need it with
    ``num_reqs`` and ``total_tokens``."""
    if not isinstance(rows_per_req, int) or rows_per_req < 1:
        raise ValueError(f"rows_per_req is {rows_per_req!r}; it must be an int >= 1 (max_qo_len * num_heads)")
    fp32 = dtype.itemsize > 2
    gluon = gluon and not fp32
    for rule in tuned_table(family)["rules"]:
        cfg = rule["_config"]
        if _matches(rule["when"], cfg, rows_per_req, fp32, gluon, total_tokens, num_reqs, sm_count):
            return cfg
    raise AssertionError("unreachable: the table has catch-all rules (checked by tuned_table)")


def choose_num_splits(num_reqs: int, row_blocks: int, avg_kv_len: float, config: TritonConfig,
                      sm_count: int) -> int:
    """KV splits per request, from a wave-quantisation cost model.

    With ``s`` splits there are ``P = num_reqs * row_blocks * s`` programs, run in
    ``ceil(P / (sm_count * resident_per_sm))`` waves, each program costing its ``ceil(L / s)`` tokens
    plus a fixed overhead; any ``s > 1`` adds the merge. Pick the ``s`` with the smallest
    ``waves * (ceil(L / s) + split_overhead) + merge(s)``: one full wave of long programs beats 1.1 waves.
    """
    slots = max(sm_count * config.resident_per_sm(), 1)
    programs = max(num_reqs * row_blocks, 1)
    length = max(avg_kv_len, 1.0)
    best, best_cost = 1, float("inf")
    for s in range(1, config.max_splits + 1):
        if s > 1 and length / s < 16:  # never split below one small tile
            break
        waves = math.ceil(programs * s / slots)
        cost = waves * (math.ceil(length / s) + config.split_overhead_tokens)
        cost += config.merge_overhead_tokens + config.merge_tokens_per_split * s if s > 1 else 0
        if cost < best_cost:
            best, best_cost = s, cost
    return best


def default_splits(config: TritonConfig, num_reqs: int, row_blocks: int, total_tokens: int, sm_count: int) -> int:
    """The launch's split count when the caller gives none (:func:`choose_num_splits` per request).
    ``total_tokens`` may be an upper bound such as ``kv_indices.numel()``."""
    return choose_num_splits(num_reqs, row_blocks, total_tokens / max(num_reqs, 1), config, sm_count)


def shared_memory_ladder(cfg: TritonConfig) -> list[TritonConfig]:
    """Smaller configs of the Triton split kernel, in the order :func:`workbench.mla.mla_decode_triton` falls back
    on them when ``cfg``'s kernel asks for more shared memory than the GPU gives one program (Triton raises
    ``OutOfResources`` when it loads the kernel, before anything runs): two pipeline stages; then a 32-token tile;
    then 32 rows (from 64); then the 16-row tile (16x32, 4 warps, 3 stages), and smaller. Every rung with two or
    more stages loads the next tile's indices one tile ahead (without it Triton gives the row gather one buffer).
    The order is the one an H200 measured for those tiles at 128 heads B=64 L=4k with its shared memory limited to
    99 KB (64x64 s2 306 us, 64x32 s2 433, 32x64 s2 537, 16x32 w4 s3 684). A GPU takes the first rung that fits.
    Each rung keeps ``cfg``'s other fields and estimates its residency. The Gluon kernels have no ladder: they run
    on Hopper only, where their tiles fit."""
    if cfg.kernel != "triton":
        return []
    M, N, W, S = cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages
    shapes = [(M, N, W, 2)] if S > 2 else []
    if N > 32:
        shapes.append((M, 32, W, 2))
    if M > 32:
        shapes.append((32, N, W, 2))
    shapes += [(16, min(N, 32), 4, 3), (16, min(N, 32), 4, 2), (16, 16, 4, 2), (16, 16, 4, 1)]
    rungs: list[TritonConfig] = []
    seen = {(M, N, W, S)}
    for m, n, w, st in shapes:
        if (m, n, w, st) in seen or m > M or n > N or st > S or (m, n, st) == (M, N, S):  # smaller tiles only
            continue
        seen.add((m, n, w, st))
        rungs.append(dataclasses.replace(cfg, block_m=m, block_n=n, num_warps=w, num_stages=st,
                                         idx_ahead=cfg.idx_ahead or st > 1, programs_per_sm=None))
    return rungs
