"""CP final states: final_state[n, h] = seg_final[last_seg[n], h] in the caller's state dtype.

Segmented K2 writes every segment's exit state as fp32 (the exact widening of its bf16 state,
spec 4.5); a sequence's final state is its last segment's. The values are bf16-representable, so
the bf16 output is exact too. One CTA per (sequence, head) copies one 128x128 state with 16-byte
loads; it is a few microseconds of memory traffic next to the recurrence.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from .tile_ops import D, await_previous_grid

THREADS = 256
VEC = 4  # fp32 elements per vector load
PER_THREAD = D * D // (THREADS * VEC)


@cute.kernel
def _gather_kernel(mSeg: cute.Tensor, mFinal: cute.Tensor, mLast: cute.Tensor, n_heads: Int32,
                   out_bf16: cutlass.Constexpr[bool]):
    bidx, _, _ = cute.arch.block_idx()
    tidx, _, _ = cute.arch.thread_idx()
    await_previous_grid()
    n = bidx // n_heads
    h = bidx - n * n_heads
    src = (Int64(mLast[n]) * Int64(n_heads) + Int64(h)) * Int64(D * D // VEC)
    dst = (Int64(n) * Int64(n_heads) + Int64(h)) * Int64(D * D // VEC)
    for i in cutlass.range_constexpr(PER_THREAD):
        j = Int64(i * THREADS + tidx)
        vals = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
        cute.autovec_copy(mSeg[None, src + j], vals)
        if cutlass.const_expr(out_bf16):
            out = cute.make_rmem_tensor(cute.make_layout(VEC), BFloat16)
            out.store(vals.load().to(BFloat16))
            cute.autovec_copy(out, mFinal[None, dst + j])
        else:
            cute.autovec_copy(vals, mFinal[None, dst + j])


@cute.jit
def cp_gather_final(seg_final: cute.Pointer, final_state: cute.Pointer, last_seg: cute.Pointer,
                    n_seg: Int32, n_seq: Int32, n_heads: Int32, stream: cuda.CUstream,
                    out_bf16: cutlass.Constexpr[bool] = False):
    """seg_final fp32 [n_seg, H, 128, 128] -> final_state [n_seq, H, 128, 128] (bf16 or fp32)."""
    vec_rows = lambda count: cute.make_layout((VEC, Int64(count) * n_heads * (D * D // VEC)),
                                              stride=(1, VEC))
    mSeg = cute.make_tensor(seg_final, vec_rows(n_seg))
    mFinal = cute.make_tensor(final_state, vec_rows(n_seq))
    mLast = cute.make_tensor(last_seg, cute.make_layout(n_seq))
    _gather_kernel(mSeg, mFinal, mLast, n_heads, out_bf16).launch(
        grid=(n_seq * n_heads, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True)
