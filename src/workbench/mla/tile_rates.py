"""How fast Hopper's tensor cores run the two products of an MLA decode tile, by the tile's width in tokens.

A 64-row MLA decode program computes, per tile of ``BN`` tokens, ``S = q k^T`` (64 x 576 by 576 x ``BN``, both
operands in shared memory) and ``O += P V`` (64 x ``BN`` by ``BN`` x 512, ``P`` from registers). The width of the
tile sets the shape of ``S``'s wgmma instruction, ``m64n<BN>k16``, and with it how many bytes of shared memory
each instruction reads per FLOP: the ``A`` operand (64 x 16 query values, 2 KB) is read whatever ``N`` is, so a
narrow tile reads more bytes per FLOP, and past the shared memory's bandwidth the instruction waits on its reads.

These kernels measure that. Each program holds its operands in shared memory and runs one product ``iters``
times, the next repeat issued before the last one is waited for, so that the tensor cores never wait on an
issuing warp: the rate is the best that shape can reach. Two warpgroups of 64 rows share each SM, as in the
decode kernels. :func:`product_flops` counts the FLOPs a launch does, so a
benchmark can turn a time into a rate. Outputs are the last repeat's product, for the check against
:func:`reference_product`. NVIDIA sm_90, 16-bit dtypes.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from workbench.mla.gluon import _cta_barrier
from workbench.mla.inputs import KV_LORA_RANK, QK_HEAD_DIM

__all__ = ["BLOCK_M", "PRODUCTS", "TILE_WIDTHS", "check_product_args", "product_flops", "reference_product",
           "run_product"]

BLOCK_M = 128  # rows per program: two warpgroups of 64
NUM_WARPS = 8
D_K = QK_HEAD_DIM  # MLA's q k^T depth (512 latent + 64 rope)
D_V_HALF = KV_LORA_RANK // 2  # one warpgroup's half of the 512 output columns
TILE_WIDTHS = (32, 64)  # tokens per tile: the earlier 32-token gluon_ws; FlashMLA and the current gluon_ws
PRODUCTS = ("qk", "pv")  # S = q k^T (both operands in shared memory); O += P V (P from registers)


@gluon.jit
def _qk_kernel(Q, K, OUT, iters, BN: gl.constexpr):
    """``iters`` times ``S = Q K^T`` (Q: BLOCK_M x 576, K: BN x 576, both in shared memory in three column
    blocks, 256 + 256 + 64, three wgmma groups; the decode kernels keep 512 + 64, the same 36 k-steps in two
    groups); stores the last S (fp32)."""
    BM: gl.constexpr = 128
    dtype: gl.constexpr = Q.dtype.element_ty
    G: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1], instr_shape=[16, BN, 16])
    q_l0 = _stage(Q, 576, BM, 256, 0, dtype, G)
    q_l1 = _stage(Q, 576, BM, 256, 256, dtype, G)
    q_r = _stage(Q, 576, BM, 64, 512, dtype, G)
    k_l0 = _stage(K, 576, BN, 256, 0, dtype, G)
    k_l1 = _stage(K, 576, BN, 256, 256, dtype, G)
    k_r = _stage(K, 576, BN, 64, 512, dtype, G)
    fence_async_shared()
    _cta_barrier()
    zero = gl.zeros([BM, BN], gl.float32, layout=S_L)
    # two S in flight: the next one is issued before the last is waited for (its three wgmma groups stay out)
    tok_b = _qk(q_l0, q_l1, q_r, k_l0, k_l1, k_r, zero)
    s = zero
    for _ in range(iters - 1):
        tok_a = _qk(q_l0, q_l1, q_r, k_l0, k_l1, k_r, zero)
        s = warpgroup_mma_wait(num_outstanding=3, deps=(tok_b, ))
        tok_b = tok_a
    s = warpgroup_mma_wait(num_outstanding=0, deps=(tok_b, ))
    _store_once(OUT, s, BM, BN, S_L)


@gluon.jit
def _qk(q_l0, q_l1, q_r, k_l0, k_l1, k_r, zero):
    """Issue one ``S = q k^T`` over the three column blocks (three async wgmma groups)."""
    tok = warpgroup_mma(q_l0, k_l0.permute((1, 0)), zero, use_acc=False, is_async=True)
    tok = warpgroup_mma(q_l1, k_l1.permute((1, 0)), tok, is_async=True)
    return warpgroup_mma(q_r, k_r.permute((1, 0)), tok, is_async=True)


@gluon.jit
def _pv_kernel(P, V, OUT, iters, BN: gl.constexpr):
    """``iters`` times ``O += P V`` (P: BLOCK_M x BN in registers, V: BN x 256 in shared memory, each warpgroup's
    half of the output columns); stores O (fp32)."""
    BM: gl.constexpr = 128
    HALF: gl.constexpr = 256
    dtype: gl.constexpr = P.dtype.element_ty
    G: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1], instr_shape=[16, HALF, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    v_s = _stage(V, HALF, BN, HALF, 0, dtype, G)
    fence_async_shared()
    _cta_barrier()
    p_rows = gl.arange(0, BM, layout=gl.SliceLayout(1, G))
    p_cols = gl.arange(0, BN, layout=gl.SliceLayout(0, G))
    p = gl.convert_layout(gl.load(P + p_rows[:, None] * BN + p_cols[None, :]), P_L)
    acc = gl.zeros([BM, HALF], gl.float32, layout=O_L)
    for _ in range(iters):  # one product in flight on the accumulator while the next is issued
        tok = warpgroup_mma(p, v_s, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(tok, ))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    _store_once(OUT, acc, BM, HALF, O_L)


@gluon.jit
def _store_once(OUT, x, ROWS: gl.constexpr, COLS: gl.constexpr, L: gl.constexpr):
    """Program 0 stores ``x`` (``ROWS`` x ``COLS`` fp32, in layout ``L``) row-major: every program computes the
    same product."""
    if gl.program_id(0) == 0:
        rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, L))
        cols = gl.arange(0, COLS, layout=gl.SliceLayout(0, L))
        gl.store(OUT + rows[:, None] * COLS + cols[None, :], x)


@gluon.jit
def _stage(X, STRIDE: gl.constexpr, ROWS: gl.constexpr, COLS: gl.constexpr, col0: gl.constexpr,
           dtype: gl.constexpr, G: gl.constexpr):
    """Columns ``col0 .. col0 + COLS`` of the row-major ``X`` (``ROWS`` rows of ``STRIDE`` values) in shared
    memory, 128-byte swizzled as wgmma reads them."""
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, COLS], dtype)
    r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, G))
    c = gl.arange(0, COLS, layout=gl.SliceLayout(0, G))
    return gl.allocate_shared_memory(dtype, [ROWS, COLS], layout, gl.load(X + r[:, None] * STRIDE + col0 + c[None, :]))


def check_product_args(product: str, width: int, iters: int, programs: int) -> None:
    """Reject what the kernels do not run, before any launch: ``product`` one of :data:`PRODUCTS`, ``width`` one
    of :data:`TILE_WIDTHS`, ``iters`` and ``programs`` positive integers."""
    if product not in PRODUCTS:
        raise ValueError(f"product must be one of {PRODUCTS}, got {product!r}")
    if width not in TILE_WIDTHS:
        raise ValueError(f"width must be one of {TILE_WIDTHS} (tokens per tile), got {width!r}")
    for name, value in (("iters", iters), ("programs", programs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def product_flops(product: str, width: int, iters: int, programs: int) -> float:
    """FLOPs of one launch: ``programs`` x ``iters`` x the product on ``BLOCK_M`` rows (2 x 128 x width x 576 for
    ``qk``, 2 x 128 x width x 256 for ``pv``, each warpgroup's half of the output)."""
    check_product_args(product, width, iters, programs)
    depth = D_K if product == "qk" else D_V_HALF
    return 2.0 * BLOCK_M * width * depth * iters * programs


def product_inputs(product: str, width: int, device: torch.device | str, dtype: torch.dtype = torch.bfloat16,
                   seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random operands for one program of ``product``: ``(q, k)`` of shapes (128, 576) and (width, 576) for
    ``qk``; ``(p, v)`` of shapes (128, width) and (width, 256) for ``pv``."""
    check_product_args(product, width, 1, 1)
    g = torch.Generator(device="cpu").manual_seed(seed)
    if product == "qk":
        a, b = torch.randn(BLOCK_M, D_K, generator=g), torch.randn(width, D_K, generator=g)
    else:
        a, b = torch.rand(BLOCK_M, width, generator=g), torch.randn(width, D_V_HALF, generator=g)
    return a.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype)


def reference_product(product: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What one repeat of the kernel computes, in fp32: ``a b^T`` for ``qk``, ``a b`` for ``pv``."""
    if product not in PRODUCTS:
        raise ValueError(f"product must be one of {PRODUCTS}, got {product!r}")
    a32, b32 = a.float(), b.float()
    return a32 @ b32.T if product == "qk" else a32 @ b32


def run_product(product: str, a: torch.Tensor, b: torch.Tensor, iters: int, programs: int) -> torch.Tensor:
    """Launch ``programs`` programs of ``product`` on the operands of :func:`product_inputs` (every program reads
    the same operands: they are read once, into shared memory), each repeating the product ``iters`` times.
    Returns the product (fp32): for ``pv`` the sum of the repeats (``iters`` x ``a b``), for ``qk`` the last."""
    width = b.shape[0]
    check_product_args(product, width, iters, programs)
    want = ((BLOCK_M, D_K), (width, D_K)) if product == "qk" else ((BLOCK_M, width), (width, D_V_HALF))
    named = (("a", a, want[0]), ("b", b, want[1]))
    for name, t, shape in named:
        if tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous {shape} tensor for {product} at width {width}, "
                             f"got {tuple(t.shape)}{'' if t.is_contiguous() else ' (not contiguous)'}")
        if t.dtype not in (torch.bfloat16, torch.float16) or t.dtype != a.dtype:
            raise ValueError(f"{name} must be bf16 or fp16 like a, got {t.dtype}")
    for name, t, _ in named:
        if not t.is_cuda:
            raise ValueError(f"{name} must be on a CUDA device, got {t.device}")
    out = torch.empty(BLOCK_M, width if product == "qk" else D_V_HALF, device=a.device, dtype=torch.float32)
    kernel = _qk_kernel if product == "qk" else _pv_kernel
    kernel[(programs, )](a, b, out, iters, BN=width, num_warps=NUM_WARPS)
    return out
