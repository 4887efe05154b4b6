"""Test-only kernel: the PTX approximations of docs/algorithm.md §2.4 applied elementwise to fp32 arrays.

The GPU reference of the rounding recipe (tests) calls this to reproduce ex2.approx.ftz.f32,
tanh.approx.f32 and rsqrt.approx.ftz.f32 bit for bit, from the same helpers the kernels use
(ptx_ops). One thread per element, 256 threads per CTA; n > 0 is the caller's responsibility
(the runtime never launches a zero-size grid).
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32

from .ptx_ops import ex2_approx_ftz, rsqrt_approx_ftz, tanh_approx

THREADS = 256
OPS = {0: "ex2.approx.ftz.f32", 1: "tanh.approx.f32", 2: "rsqrt.approx.ftz.f32"}


@cute.kernel
def _approx_math_kernel(mX: cute.Tensor, mY: cute.Tensor, n: Int32, op: cutlass.Constexpr[int]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < n:
        x = mX[i]
        if cutlass.const_expr(op == 0):
            y = ex2_approx_ftz(x)
        elif cutlass.const_expr(op == 1):
            y = tanh_approx(x)
        else:
            y = rsqrt_approx_ftz(x)
        mY[i] = y


@cute.jit
def approx_math(x: cute.Pointer, y: cute.Pointer, n: Int32, stream: cuda.CUstream, op: cutlass.Constexpr[int]):
    """y[i] = OPS[op](x[i]) for i < n (fp32 in, fp32 out)."""
    assert op in OPS, op
    layout = cute.make_layout(n)
    _approx_math_kernel(cute.make_tensor(x, layout), cute.make_tensor(y, layout), n, op).launch(
        grid=((n + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1), stream=stream)
