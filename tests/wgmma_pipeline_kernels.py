"""Two small Gluon kernels that differ only in whether a wgmma's accumulator is in flight across a loop's back edge
behind a branch: the control for the codegen tests' check that ptxas did not serialise a kernel's wgmma.

``PHI=False`` issues and waits for each product in the same iteration. ``PHI=True`` issues the next iteration's
product at the end of this one, and on the last iteration defines the carried value with ordinary instructions
instead, so the two meet in the loop's phi: ptxas then makes every wgmma of the kernel wait for the one before
(its note C7515). Compiled only, never run.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma, warpgroup_mma_init,
                                                              warpgroup_mma_wait)


@gluon.jit
def carried_product_kernel(A, OUT, iters, PHI: gl.constexpr):
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    smem_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.float16)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    r = gl.arange(0, 64, layout=gl.SliceLayout(1, ld))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
    a = gl.allocate_shared_memory(gl.float16, [64, 64], smem_l, gl.load(A + r[:, None] * 64 + c[None, :]))
    fence_async_shared()
    zero = gl.zeros([64, 64], gl.float32, layout=acc_l)
    acc = zero
    tok = warpgroup_mma_init(zero)
    if PHI:
        tok = warpgroup_mma(a, a, zero, use_acc=False, is_async=True)
    for i in range(iters):
        if PHI:
            acc += warpgroup_mma_wait(num_outstanding=0, deps=(tok, ))
            if i + 1 < iters:
                tok = warpgroup_mma(a, a, zero, use_acc=False, is_async=True)
            else:
                tok = warpgroup_mma_init(zero)
        else:
            tok = warpgroup_mma(a, a, zero, use_acc=False, is_async=True)
            acc += warpgroup_mma_wait(num_outstanding=0, deps=(tok, ))
    ro = gl.arange(0, 64, layout=gl.SliceLayout(1, acc_l))
    co = gl.arange(0, 64, layout=gl.SliceLayout(0, acc_l))
    gl.store(OUT + ro[:, None] * 64 + co[None, :], acc)
