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

from .common.ptx_ops import ex2_approx_ftz, rsqrt_approx_ftz, tanh_approx

THREADS = 256
OPS = {0: "ex2.approx.ftz.f32", 1: "tanh.approx.f32", 2: "rsqrt.approx.ftz.f32"}


class ApproxMath:
    """The elementwise approximation OPS[op] (registry entry approx_math); op is the static
    configuration."""

    def __init__(self, op: int):
        assert op in OPS, op
        self.op = op

    def __str__(self):
        """What the kernel's PTX symbol spells for this object (the DSL spells a kernel method's
        symbol from its object)."""
        return f"ApproxMath_{self.op}"

    @cute.jit
    def __call__(self, x: cute.Pointer, y: cute.Pointer, n: Int32, stream: cuda.CUstream):
        """y[i] = OPS[op](x[i]) for i < n (fp32 in, fp32 out)."""
        layout = cute.make_layout(n)
        self.kernel(cute.make_tensor(x, layout), cute.make_tensor(y, layout), n).launch(
            grid=((n + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mY: cute.Tensor, n: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * THREADS + tidx
        if i < n:
            x = mX[i]
            if cutlass.const_expr(self.op == 0):
                y = ex2_approx_ftz(x)
            elif cutlass.const_expr(self.op == 1):
                y = tanh_approx(x)
            else:
                y = rsqrt_approx_ftz(x)
            mY[i] = y


# The registry's entry name (the manifest's): the class whose __call__ is the host entry (compile.py).
approx_math = ApproxMath
