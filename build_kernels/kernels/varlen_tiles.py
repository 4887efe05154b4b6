"""Sequence tables on the device: token starts and the per-sequence tile prefix sum.

seq_start[n] = cu_seqlens[n] as int32 (or n*T for dense inputs), and
tile_prefix[0] = 0, tile_prefix[n + 1] = tile_prefix[n] + ceil(len_n / CHUNK), with
len_n = cu_seqlens[n + 1] - cu_seqlens[n] (spec 1.3: a sequence owns ceil(len/16) tiles and the
global tile index of its tile j is tile_prefix[n] + j). K1 and K2 read this table, so a packed batch
needs no device-to-host copy to be launched (docs/kernel_abi.md).

One CTA of THREADS threads scans the sequences in blocks of THREADS: a warp-level inclusive scan
with shuffles, the warp totals through shared memory, and a running carry across blocks. A single
CTA is enough: N is at most a few thousand sequences and the kernel is one pass over 8 bytes each.
Negative lengths (an invalid cu_seqlens the host could not check) count as zero tiles.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from .tile_ops import CHUNK, await_previous_grid

THREADS = 256
WARPS = THREADS // 32


@cute.kernel
def _seq_tables_kernel(mCu: cute.Tensor, mStart: cute.Tensor, mPrefix: cute.Tensor, n_seq: Int32, seq_len: Int32,
                       dense: cutlass.Constexpr[bool]):
    tidx, _, _ = cute.arch.thread_idx()
    lane = cute.arch.lane_idx()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    await_previous_grid()

    smem = cutlass.memory.SmemAllocator()
    sWarpTotal = smem.allocate_tensor(Int32, cute.make_layout(WARPS), byte_alignment=16)

    if tidx == 0:
        mPrefix[0] = Int32(0)
        mStart[0] = Int32(0)
    carry = Int32(0)
    for base in cutlass.range(0, n_seq, THREADS, unroll=1):
        i = base + tidx
        tiles = Int32(0)
        if i < n_seq:
            if cutlass.const_expr(dense):
                mStart[i + 1] = (i + 1) * seq_len
                tiles = (seq_len + (CHUNK - 1)) // CHUNK
            else:
                end = Int64(mCu[i + 1])
                mStart[i + 1] = Int32(end)
                length = end - Int64(mCu[i])
                if length > 0:
                    tiles = Int32((length + (CHUNK - 1)) // CHUNK)
        # Inclusive scan inside the warp.
        x = tiles
        for offset in cutlass.range_constexpr(5):
            y = cute.arch.shuffle_sync_up(x, 1 << offset)
            if lane >= (1 << offset):
                x = x + y
        if lane == 31:
            sWarpTotal[warp] = x
        cute.arch.barrier()
        before = Int32(0)
        block_total = Int32(0)
        for w in cutlass.range_constexpr(WARPS):
            s = sWarpTotal[w]
            if w < warp:
                before = before + s
            block_total = block_total + s
        if i < n_seq:
            mPrefix[i + 1] = carry + before + x
        carry = carry + block_total
        # The warp totals are overwritten by the next block.
        cute.arch.barrier()


@cute.jit
def seq_tables_varlen(cu_seqlens: cute.Pointer, seq_start: cute.Pointer, tile_prefix: cute.Pointer, n_seq: Int32,
                      stream: cuda.CUstream):
    """cu_seqlens int32/int64 [n_seq + 1] -> seq_start, tile_prefix int32 [n_seq + 1]."""
    table = cute.make_layout(n_seq + 1)
    _seq_tables_kernel(cute.make_tensor(cu_seqlens, table), cute.make_tensor(seq_start, table),
                       cute.make_tensor(tile_prefix, table), n_seq, Int32(0), False).launch(
        grid=(1, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True)


@cute.jit
def seq_tables_dense(seq_start: cute.Pointer, tile_prefix: cute.Pointer, n_seq: Int32, seq_len: Int32,
                     stream: cuda.CUstream):
    """Dense [B, T] input: B sequences of seq_len tokens each."""
    table = cute.make_layout(n_seq + 1)
    start = cute.make_tensor(seq_start, table)
    _seq_tables_kernel(start, start, cute.make_tensor(tile_prefix, table), n_seq, seq_len, True).launch(
        grid=(1, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True)
