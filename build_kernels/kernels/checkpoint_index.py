"""The checkpoint index table (docs/state_pool.md): for every checkpoint slot s in [0, n_slots),
(sequence, tokens of the prefix) of the state K2 writes there, or (-1, -1) for a hole.

Slot s holds checkpoint j >= 1 of sequence n when s = start_n // C + j - 1 and j * C <= len_n
(state_io's layout: the checkpoint at global token p = start_n + j C sits at slot p // C - 1). Only
the largest n with start_n // C <= s can own s (any later sequence starts past the earlier one's
checkpoints), so each thread binary-searches the sequence table for that n and checks j. It reads
the clamped sequence tables (seq_start, docs/kernel_abi.md), so any cu_seqlens content gives a
well-defined table, and every entry is written on every call: no host knowledge of the lengths.

Grid (ceil(n_slots / 256),) x 256 threads, one slot per thread.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32

from .common.table_kernel import TableKernel
from .common.tile_ops import await_previous_grid

THREADS = 256


class CheckpointIndex(TableKernel):
    """The checkpoint index kernel (registry entry checkpoint_index); CheckpointIndexListed is the
    mode of a call that runs its listed sequences only."""

    @cute.jit
    def __call__(self, seq_start: cute.Pointer, checkpoint_index: cute.Pointer, n_seq: Int32, n_slots: Int32,
                 checkpoint_every: Int32, stream: cuda.CUstream):
        """seq_start int32 [n_seq + 1] (the sequence tables) -> checkpoint_index int32 [n_slots, 2]
        (sequence, prefix tokens) or (-1, -1). n_slots >= 1, checkpoint_every >= 16."""
        self.kernel(cute.make_tensor(seq_start, cute.make_layout(n_seq + 1)),
                    cute.make_tensor(checkpoint_index, cute.make_layout(2 * n_slots)), n_seq, n_slots,
                    checkpoint_every, None).launch(
            grid=((n_slots + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, mStart: cute.Tensor, mIndex: cute.Tensor, n_seq: Int32, n_slots: Int32, every: Int32,
               mListed):
        """Slot s per thread: the binary search for its sequence, then the check of j. Listed mode
        (mListed, the flags; compile-time None otherwise): an unlisted sequence's slots are holes,
        as K2 writes none of its checkpoints."""
        bidx, _, _ = cute.arch.block_idx()
        tidx, _, _ = cute.arch.thread_idx()
        await_previous_grid()
        s = bidx * THREADS + tidx
        if s < n_slots:
            seq = Int32(-1)
            pos_out = Int32(-1)
            if n_seq > 0:
                pos = Int32(0)
                for b in cutlass.range_constexpr(30, -1, -1):
                    cand = pos + Int32(1 << b)
                    if cand < n_seq:
                        if mStart[cand] // every <= s:
                            pos = cand
                start = mStart[pos]
                j = s - start // every + 1
                if j >= 1:
                    if j * every <= mStart[pos + 1] - start:
                        seq = pos
                        pos_out = j * every
                        if cutlass.const_expr(self.listed):
                            if mListed[pos] == 0:
                                seq = Int32(-1)
                                pos_out = Int32(-1)
            mIndex[2 * s] = seq
            mIndex[2 * s + 1] = pos_out


class CheckpointIndexListed(CheckpointIndex):
    """The checkpoint index of a call that runs its listed sequences only (registry entry
    checkpoint_index_listed): listed int32 [n_seq], the flags the call's first table kernel wrote."""

    listed = True

    @cute.jit
    def __call__(self, seq_start: cute.Pointer, listed: cute.Pointer, checkpoint_index: cute.Pointer, n_seq: Int32,
                 n_slots: Int32, checkpoint_every: Int32, stream: cuda.CUstream):
        self.kernel(cute.make_tensor(seq_start, cute.make_layout(n_seq + 1)),
                    cute.make_tensor(checkpoint_index, cute.make_layout(2 * n_slots)), n_seq, n_slots,
                    checkpoint_every, cute.make_tensor(listed, cute.make_layout(n_seq))).launch(
            grid=((n_slots + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True)


# The registry's entry names (the manifest's): the classes whose __call__ is the host entry (compile.py).
checkpoint_index, checkpoint_index_listed = CheckpointIndex, CheckpointIndexListed
