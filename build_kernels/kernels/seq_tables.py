"""Sequence tables on the device: token starts and the per-sequence tile prefix sum.

Varlen (`seq_tables_varlen`): the runtime never reads cu_seqlens back, so the kernel must turn ANY
content into tables K1 and K2 can follow without leaving their buffers. It clamps first:

    c[i] = min(t_total, max(0, max_{j <= i} cu[j]))      (64-bit before narrowing, i = 0..N)
    seq_start[i] = c[i],  tile_prefix[0] = 0,  tile_prefix[i + 1] = tile_prefix[i] + ceil((c[i+1] - c[i]) / 16)

c is non-decreasing and inside [0, t_total], so every sequence is a (possibly empty) run of real
tokens, and tile_prefix[N] <= ceil(t_total / 16) + N - 1 < cap (docs/kernel_abi.md). For a valid
cu_seqlens (0 = cu[0] <= cu[1] <= ... <= cu[N] = t_total) this is the identity: seq_start = cu.
clamp(max(a, b)) = max(clamp(a), clamp(b)), so each thread clamps its own entry and the kernel
max-scans the clamped values (docs/algorithm.md §1.3: a sequence owns ceil(len/16) tiles and the global tile
index of its tile j is tile_prefix[n] + j).

Dense (`seq_tables_dense`): seq_start[n] = n*T, nothing to clamp (the host knows the shape).

Dispatch order (varlen, `seq_order` non-null): K2 runs one CTA per (sequence, head, value block)
and the GPU starts CTAs roughly in block-index order, so with uneven lengths the longest
sequences should start first (longest-processing-time-first; docs/dispatch_order.md has the
measurement). The kernel writes seq_order[0..N) = the sequence indices, longest first, by a
counting sort on a 64-bucket key of the tile count (`length_bucket`: exact below 4 tiles, then 4
buckets per octave, so sequences within about 19% of each other may come in either order; the
order only decides which CTA starts when, never what a CTA computes, so results stay
bit-identical whatever order the atomics give).

One CTA of THREADS threads walks the sequences in blocks of THREADS: warp-level inclusive scans
with shuffles, the warp results through shared memory, and a running carry across blocks (a max
for the clamped starts, a sum for the tiles). A single CTA is enough: N is at most a few thousand
sequences and the kernel is one pass over 8 bytes each.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from .common.listed_sequences import ListedMode, mark_listed
from .common.ptx_ops import atom_add_shared, ldg_b32, lds_b32, stg_b32, sts_b32
from .common.table_kernel import TableKernel
from .common.tile_ops import CHUNK, await_previous_grid, block_scan, clamp_token, tile_count

THREADS = 256
WARPS = THREADS // 32
BUCKETS = 64  # sort keys of length_bucket


@cute.jit
def length_bucket(tiles: Int32) -> Int32:
    """Sort key of a sequence of `tiles` tiles, 0 for the longest: 63 - f(tiles) with f monotone,
    f(t) = t for t < 4, else 4 floor(log2 t) + the two bits below the leading one (t >= 2^16: 63)."""
    top = Int32(0)  # floor(log2 t) for t >= 1
    for k in cutlass.range_constexpr(1, 16):
        if tiles >= (1 << k):
            top = Int32(k)
    f = tiles
    if tiles >= 4:
        f = 4 * top + ((tiles >> (top - 2)) & 3)
    if tiles >= (1 << 16):
        f = Int32(BUCKETS - 1)
    return (BUCKETS - 1) - f


@cute.jit
def longest_first_order(mPrefix: cute.Tensor, order_ptr: Int64, n_seq: Int32, tidx: Int32, hist: Int32):
    """seq_order[0..n_seq) = sequence indices by length_bucket (longest first): a shared-memory
    histogram of the keys, its exclusive scan, then each sequence takes the next place of its
    bucket. `hist` is the shared address of BUCKETS words; the tables in mPrefix are complete (the
    caller synced the CTA after writing them)."""
    if tidx < BUCKETS:
        sts_b32(hist + 4 * tidx, Int32(0))
    cute.arch.barrier()
    for base in cutlass.range(0, n_seq, THREADS, unroll=1):
        i = base + tidx
        if i < n_seq:
            atom_add_shared(hist + 4 * length_bucket(mPrefix[i + 1] - mPrefix[i]), Int32(1))
    cute.arch.barrier()
    if tidx == 0:  # 64 words: a serial exclusive scan is shorter than a parallel one
        run = Int32(0)
        for b in cutlass.range_constexpr(BUCKETS):
            c = lds_b32(hist + 4 * b)
            sts_b32(hist + 4 * b, run)
            run = run + c
    cute.arch.barrier()
    for base in cutlass.range(0, n_seq, THREADS, unroll=1):
        i = base + tidx
        if i < n_seq:
            place = atom_add_shared(hist + 4 * length_bucket(mPrefix[i + 1] - mPrefix[i]), Int32(1))
            stg_b32(order_ptr + Int64(place) * 4, i)


class SeqTablesVarlen(TableKernel):
    """The sequence tables from cu_seqlens (registry entry seq_tables_varlen): clamped, and K2's
    longest-first dispatch order when seq_order is given (module docstring). No static
    configuration (cu_seqlens' integer type is the pointer's); SeqTablesListed is the mode of a
    call that runs its listed sequences only."""

    dense = False

    @cute.jit
    def __call__(self, cu_seqlens: cute.Pointer, seq_start: cute.Pointer, tile_prefix: cute.Pointer,
                 seq_order: cute.Pointer, n_seq: Int32, t_total: Int32, stream: cuda.CUstream):
        """cu_seqlens int32/int64 [n_seq + 1] (any content) -> seq_start, tile_prefix int32 [n_seq + 1],
        clamped to tokens [0, t_total) (module docstring); t_total >= 0 is the token count of q.
        seq_order int32 [n_seq] (null: not written): the sequences longest first, K2's dispatch order."""
        table = cute.make_layout(n_seq + 1)
        self.kernel(cute.make_tensor(cu_seqlens, table), cute.make_tensor(seq_start, table),
                    cute.make_tensor(tile_prefix, table), seq_order.toint(), n_seq, t_total).launch(
            grid=(1, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, mCu: cute.Tensor, mStart: cute.Tensor, mPrefix: cute.Tensor, order_ptr: Int64, n_seq: Int32,
               t_total: Int32, mIds=None, idx_ptr=None, mListed=None, slot_ptr=None, n_listed=None):
        """One CTA: per block of THREADS sequences the max-scan of the clamped ends and the sum-scan of
        the tiles, then (seq_order given) the longest-first order. The listed mode's arguments
        (mIds ... n_listed) are compile-time None in the others (docs/kernel_code.md): it makes
        the flags first, counts no tile for an unlisted sequence and writes the state slots
        (SeqTablesListed). Dense (listed mode only): t_total is every sequence's length."""
        tidx, _, _ = cute.arch.thread_idx()
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        await_previous_grid()

        smem = cutlass.memory.SmemAllocator()
        sWarpMax = smem.allocate_tensor(Int32, cute.make_layout(WARPS), byte_alignment=16)
        sWarpTotal = smem.allocate_tensor(Int32, cute.make_layout(WARPS), byte_alignment=16)
        sHist = smem.allocate(BUCKETS * 4, byte_alignment=16)

        if cutlass.const_expr(self.listed):
            mark_listed(mListed, mIds, n_seq, n_listed, tidx, THREADS)
        first = Int32(0)
        if cutlass.const_expr(not self.dense):
            first = clamp_token(mCu[0], t_total)  # c[0]: where sequence 0 starts
        if tidx == 0:
            mPrefix[0] = Int32(0)
            mStart[0] = first
        carry_max = first  # c[base]: the clamped running maximum before this block
        carry = Int32(0)  # tile_prefix[base]
        for base in cutlass.range(0, n_seq, THREADS, unroll=1):
            i = base + tidx
            if cutlass.const_expr(self.dense):
                lo = i * t_total
                hi = lo + t_total
            else:
                # Thread i owns sequence i: the max-scan gives its end c[i + 1] (inclusive) and its
                # start c[i] (exclusive). Threads past N contribute 0, the identity of the clamped values.
                end = Int32(0)
                if i < n_seq:
                    end = clamp_token(mCu[i + 1], t_total)
                lo, hi, carry_max = block_scan(end, carry_max, lane, warp, sWarpMax, True, WARPS)
            tiles = Int32(0)
            if i < n_seq:
                mStart[i + 1] = hi
                if cutlass.const_expr(self.listed):
                    slot = Int32(-1)
                    if mListed[i] != 0:
                        tiles = tile_count(hi - lo)
                        slot = i
                        if idx_ptr != Int64(0):
                            slot = ldg_b32(idx_ptr + Int64(i) * 4)
                    if slot_ptr != Int64(0):
                        stg_b32(slot_ptr + Int64(i) * 4, slot)
                else:
                    tiles = tile_count(hi - lo)
            _, upto, carry = block_scan(tiles, carry, lane, warp, sWarpTotal, False, WARPS)
            if i < n_seq:
                mPrefix[i + 1] = upto
            # Both warp arrays are overwritten by the next block.
            cute.arch.barrier()
        # The barrier above also makes every thread's tile_prefix entries visible to the whole CTA.
        if order_ptr != Int64(0):
            longest_first_order(mPrefix, order_ptr, n_seq, tidx, sHist.toint())


class SeqTablesListed(ListedMode, SeqTablesVarlen):
    """The sequence tables of a call that runs its listed sequences only (registry entries
    seq_tables_listed_{int32,int64,dense}; listed_sequences.py): seq_start as SeqTablesVarlen /
    SeqTablesDense write it, the tile prefix over the listed sequences' tiles (an unlisted one
    counts 0), the listed flags, each sequence's state slot for K2's state I/O by slot, and the
    longest-first order. The static choice is `dense`: no cu_seqlens, every sequence t_total
    tokens long."""

    @cute.jit
    def __call__(self, cu_seqlens: cute.Pointer, segment_ids: cute.Pointer, state_indices: cute.Pointer,
                 listed: cute.Pointer, listed_slot: cute.Pointer, seq_start: cute.Pointer, tile_prefix: cute.Pointer,
                 seq_order: cute.Pointer, n_seq: Int32, n_listed: Int32, t_total: Int32, stream: cuda.CUstream):
        """cu_seqlens int32/int64 [n_seq + 1] (any content, clamped as SeqTablesVarlen does; unread
        when dense, where t_total is every sequence's length, else the token count of q),
        segment_ids int32 [n_listed] (any content) -> listed int32 [n_seq] (1 / 0), listed_slot int32
        [n_seq]: state_indices[n] (null: n) for a listed sequence, -1 otherwise (null: not written),
        seq_start, tile_prefix int32 [n_seq + 1], seq_order int32 [n_seq] (null: not written)."""
        table = cute.make_layout(n_seq + 1)
        start = cute.make_tensor(seq_start, table)
        m_cu = start if cutlass.const_expr(self.dense) else cute.make_tensor(cu_seqlens, table)
        self.kernel(m_cu, start, cute.make_tensor(tile_prefix, table), seq_order.toint(), n_seq, t_total,
                    cute.make_tensor(segment_ids, cute.make_layout(n_listed)), state_indices.toint(),
                    cute.make_tensor(listed, cute.make_layout(n_seq)), listed_slot.toint(), n_listed).launch(
            grid=(1, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True)


class SeqTablesDense(TableKernel):
    """The sequence tables of a dense [B, T] input (registry entry seq_tables_dense): B sequences of
    seq_len tokens each."""

    @cute.jit
    def __call__(self, seq_start: cute.Pointer, tile_prefix: cute.Pointer, n_seq: Int32, seq_len: Int32,
                 stream: cuda.CUstream):
        """Dense [B, T] input: B sequences of seq_len tokens each."""
        table = cute.make_layout(n_seq + 1)
        start = cute.make_tensor(seq_start, table)
        self.kernel(start, start, cute.make_tensor(tile_prefix, table), n_seq, seq_len).launch(
            grid=(1, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, mCu: cute.Tensor, mStart: cute.Tensor, mPrefix: cute.Tensor, n_seq: Int32, seq_len: Int32):
        """One CTA: seq_start[n] = n seq_len and the tile prefix. mCu is unread (seq_start's tensor);
        it stays a parameter, so that the PTX .param list (and seq_tables_dense's PTX) stays as it is."""
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
                mStart[i + 1] = (i + 1) * seq_len
                tiles = (seq_len + (CHUNK - 1)) // CHUNK
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


# The registry's entry names (the manifest's): the classes whose __call__ is that host entry (compile.py).
seq_tables_varlen, seq_tables_dense, seq_tables_listed = SeqTablesVarlen, SeqTablesDense, SeqTablesListed
