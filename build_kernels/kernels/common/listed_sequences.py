"""Listed sequences (`segment_ids`, docs/state_pool.md "Listed sequences"): a call that runs the
recurrence over some of its sequences only. Shared by the table kernels that honour the list
(seq_tables.SeqTablesListed, cp_seg_tables.CpSegTablesListed, checkpoint_index.CheckpointIndexListed).

The list is turned into one flag per sequence, `listed[n]` (1: run, 0: leave untouched), written
by the first table kernel of the call. Everything else follows from giving an unlisted sequence no
tile: K1 and K2 only ever visit the tiles of the tile prefix, so an unlisted sequence's tokens are
neither read nor written, and its K2 CTA (no tile, no final state: its state slot is -1) exits
at once. A listed sequence keeps its own tokens, tiles and segments, computed exactly as in the
launch without a list, so its outputs and states are that launch's bits.

Any list content is memory-safe: an entry outside [0, N) is skipped and a repeated one sets the
same flag twice, so the flags are those of the set of valid entries.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from .table_kernel import TableKernel


class ListedMode(TableKernel):
    """The listed mode of a table kernel class, mixed in before it: the `listed` flag its kernel
    tests under const_expr, and the one static choice, `dense` (no cu_seqlens) or varlen, which
    the PTX symbol spells."""

    listed = True

    def __init__(self, dense: bool):
        self.dense = dense

    def __str__(self):
        """What the kernel's PTX symbol spells for this object."""
        return f"{type(self).__name__}_{'dense' if self.dense else 'varlen'}"


@cute.jit
def mark_listed(mListed: cute.Tensor, mIds: cute.Tensor, n_seq: Int32, n_listed: Int32, tidx: Int32,
                threads: cutlass.Constexpr[int]):
    """listed[n] = 1 when n appears in ids[0..n_listed), else 0, for n < n_seq: one CTA of `threads`
    threads. The CTA barriers order the clearing before the marking and the marking before any
    thread reads a flag (bar.sync orders the CTA's global memory accesses too)."""
    for x in cutlass.range(tidx, n_seq, threads, unroll=1):
        mListed[x] = Int32(0)
    cute.arch.barrier()
    for m in cutlass.range(tidx, n_listed, threads, unroll=1):
        seq = mIds[m]
        if seq >= 0:
            if seq < n_seq:
                mListed[seq] = Int32(1)
    cute.arch.barrier()
