"""The checkpoint table (docs/state_pool.md): the caller's checkpoint offsets and destination slots,
cleaned on the device into what K2 compares with its tile ends.

Entry (n, k) of checkpoint_offsets [N, K] (int32 or int64, sequence-relative token counts) and of
checkpoint_slots [N, K] (int32; null: slot n * K + k of a [N, K, H, 128, 128] buffer) becomes the
int32 pair (offset, slot) at checkpoint_table[2 (n K + k)]. The offset stays only when it is a
positive multiple of 16 smaller than sequence n's length (a state after a full tile that is not the
final state) and the slot lies in [0, n_dest); otherwise it becomes -1, which no tile end matches,
so that checkpoint is not written. The lengths come from the clamped sequence tables (seq_start,
docs/kernel_abi.md), so any content of the caller's tensors gives a well-defined table, and nothing
is read back to the host.

Grid (ceil(N K / 256),) x 256 threads, one entry per thread.
"""

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Int32, Int64

from .common.table_kernel import TableKernel
from .common.tile_ops import CHUNK, await_previous_grid

THREADS = 256


class CheckpointTable(TableKernel):
    """The checkpoint table kernel (registry entry checkpoint_table); no static configuration (the
    offsets' integer type is the pointer's)."""

    @cute.jit
    def __call__(self, checkpoint_offsets: cute.Pointer, checkpoint_slots: cute.Pointer, seq_start: cute.Pointer,
                 checkpoint_table: cute.Pointer, n_seq: Int32, checkpoint_k: Int32, n_dest: Int32,
                 stream: cuda.CUstream):
        """checkpoint_offsets [n_seq, checkpoint_k] (int32 or int64), checkpoint_slots int32 [n_seq,
        checkpoint_k] (null: n * K + k), seq_start int32 [n_seq + 1] (the sequence tables) ->
        checkpoint_table int32 [n_seq * checkpoint_k, 2] (offset or -1, slot). n_seq * checkpoint_k >= 1."""
        n_entries = n_seq * checkpoint_k
        self.kernel(cute.make_tensor(checkpoint_offsets, cute.make_layout(n_entries)), checkpoint_slots,
                    cute.make_tensor(seq_start, cute.make_layout(n_seq + 1)),
                    cute.make_tensor(checkpoint_table, cute.make_layout(2 * n_entries)), n_entries,
                    checkpoint_k, n_dest).launch(
            grid=((n_entries + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, mOffsets: cute.Tensor, slots_ptr: cute.Pointer, mStart: cute.Tensor, mTable: cute.Tensor,
               n_entries: Int32, k: Int32, n_dest: Int32):
        """Entry i = n K + k per thread: the cleaned (offset or -1, slot) pair."""
        bidx, _, _ = cute.arch.block_idx()
        tidx, _, _ = cute.arch.thread_idx()
        await_previous_grid()
        i = bidx * THREADS + tidx
        if i < n_entries:
            n = i // k
            off = Int64(mOffsets[i])
            length = Int64(mStart[n + 1] - mStart[n])
            dst = i
            if slots_ptr.toint() != Int64(0):
                dst = cute.make_tensor(slots_ptr, cute.make_layout(n_entries))[i]
            keep = Int32(0)
            if off > Int64(0):
                if off < length:
                    if off % Int64(CHUNK) == Int64(0):
                        if dst >= 0:
                            if dst < n_dest:
                                keep = Int32(1)
            out = Int32(-1)
            if keep != 0:
                out = Int32(off)
            mTable[2 * i] = out
            mTable[2 * i + 1] = dst


# The registry's entry name (the manifest's): the class whose __call__ is the host entry (compile.py).
checkpoint_table = CheckpointTable
