"""CP segment tables on the device (docs/kernel_abi.md): the tables of a context-parallel call
built from cu_seqlens (or the dense shape) without a device-to-host copy.

The exact CPU twin is device_segment_tables in tests/cp_twins.py; in short, with c the clamped
cu_seqlens of seq_tables (any content is safe) and t_n = ceil((c[n+1] - c[n]) / 16):

    c_n = max(1, min(ceil(t_n / seg_len), max_count, t_n // min_tiles))   segments of sequence n
    seg_first[n] = min(F_n, S), F_n = sum_{m<n} c_m; seg_count[n] = the c_n segments below S
    segment F_n + i: local tile offset o_i = i * (t_n // c_n) + min(i, t_n % c_n) (split_sizes),
        seg_start = c[n] + 16 o_i, seg_prefix = tile_prefix[n] + o_i  (tables [S+1]: s+1 ends s)
    final_slot = n for the last segment of n, else -1; scan_seg[F_n - n + i] = F_n + i for the
        non-last ones (ascending, compacted), -1 in every later entry
    entries from sum c_n to S: (c[N], total tiles), i.e. empty padding segments, final_slot -1

S = max_segments is the host's bound (kda_aot.plan.cp_plan.device_plan). Every write is below S + 1 / S / N
entries: segments from S on are dropped (entry S is then where segment S would start), which
device_plan's seg_len never needs.

One CTA of THREADS threads walks the sequences in blocks of THREADS. Per block: three CTA scans
(tile_ops.block_scan) give each thread its sequence's c[n], c[n+1] (max-scan of the clamped
entries), tile_prefix[n] and F_n (sum scans), carried across blocks; the block's per-sequence
values go to shared memory; then the threads take the block's segments F_base .. F_end - 1 in
turn, each finding its sequence by a binary search over the block's F (strictly increasing, as
c_n >= 1). So the work is O(N + S) with no serial loop over one long sequence's segments.
"""

from typing import Any, NamedTuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from .common.listed_sequences import ListedMode, mark_listed
from .common.table_kernel import TableKernel
from .common.tile_ops import CHUNK, await_previous_grid, block_scan, clamp_token, tile_count

THREADS = 256
WARPS = THREADS // 32


class SegTables(NamedTuple):
    """The output tables (module docstring) as tensors, in the kernel's parameter order."""

    mSegStart: Any
    mSegPrefix: Any
    mScan: Any
    mFirst: Any
    mCount: Any
    mFinal: Any


class BlockValues(NamedTuple):
    """A block's per-sequence values in shared memory, for the threads that write its segments."""

    sFirst: Any  # F_n of the block's sequences
    sCount: Any  # c_n
    sTiles: Any  # t_n
    sPrefix: Any  # tile_prefix[n]
    sStart: Any  # c[n]


def _tables(seg_start, seg_prefix, scan_seg, seg_first, seg_count, final_slot, n_seq, max_segments) -> SegTables:
    seg = cute.make_layout(max_segments + 1)
    per_seg = cute.make_layout(max_segments)
    per_seq = cute.make_layout(n_seq)
    return SegTables(cute.make_tensor(seg_start, seg), cute.make_tensor(seg_prefix, seg),
                     cute.make_tensor(scan_seg, per_seg), cute.make_tensor(seg_first, per_seq),
                     cute.make_tensor(seg_count, per_seq), cute.make_tensor(final_slot, per_seg))


class CpSegTables(TableKernel):
    """The CP segment tables from cu_seqlens (registry entry cp_seg_tables_varlen); CpSegTablesDense
    is the dense mode, CpSegTablesListed the mode of a call that runs its listed sequences only.
    The static choices are `dense` (no cu_seqlens, every sequence t_total long) and `listed`."""

    dense = False

    @cute.jit
    def __call__(self, cu_seqlens: cute.Pointer, seg_start: cute.Pointer, seg_prefix: cute.Pointer,
                 scan_seg: cute.Pointer, seg_first: cute.Pointer, seg_count: cute.Pointer,
                 final_slot: cute.Pointer, n_seq: Int32, t_total: Int32, seg_len: Int32, max_count: Int32,
                 min_tiles: Int32, max_segments: Int32, stream: cuda.CUstream):
        """cu_seqlens int32/int64 [n_seq + 1] (any content, clamped to [0, t_total]) -> the CP tables,
        int32: seg_start, seg_prefix [S + 1], scan_seg [S], seg_first, seg_count [n_seq], final_slot [S]
        with S = max_segments (module docstring)."""
        tables = _tables(seg_start, seg_prefix, scan_seg, seg_first, seg_count, final_slot, n_seq, max_segments)
        self._launch(cute.make_tensor(cu_seqlens, cute.make_layout(n_seq + 1)), tables, n_seq, t_total, seg_len,
                     max_count, min_tiles, max_segments, stream)

    def _launch(self, m_cu, tables: SegTables, n_seq, t_total, seg_len, max_count, min_tiles, max_segments, stream,
                m_ids=None, m_listed=None, n_listed=None):
        # m_ids, m_listed, n_listed: the listed mode's, compile-time None in the others (left out
        # of their PTX, docs/kernel_code.md)
        self.kernel(m_cu, *tables, n_seq, t_total, seg_len, max_count, min_tiles, max_segments, m_ids, m_listed,
                    n_listed).launch(grid=(1, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, mCu: cute.Tensor, mSegStart: cute.Tensor, mSegPrefix: cute.Tensor, mScan: cute.Tensor,
               mFirst: cute.Tensor, mCount: cute.Tensor, mFinal: cute.Tensor, n_seq: Int32, t_total: Int32,
               seg_len: Int32, max_count: Int32, min_tiles: Int32, max_segments: Int32, mIds, mListed, n_listed):
        """The one CTA: per block of THREADS sequences the three scans and the block's segments
        (block_segments), then the padding segments (padding). mCu is unread when dense. Listed
        mode: the flags first (listed_sequences.mark_listed); an unlisted sequence then has no tile
        and one empty segment at its start, with no final slot and seg_count 0 (the merge writes
        no carry for it). The empty segment is what ends the listed segment before it at the right
        token: K1 and K2 take a segment's end from the next segment's start, and without it the
        last tile of a listed sequence followed by an unlisted one would run on into the unlisted
        tokens. The listed sequences are cut exactly as without a list."""
        dense = self.dense
        out = SegTables(mSegStart, mSegPrefix, mScan, mFirst, mCount, mFinal)
        tidx, _, _ = cute.arch.thread_idx()
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        await_previous_grid()

        smem = cutlass.memory.SmemAllocator()
        sWarpMax = smem.allocate_tensor(Int32, cute.make_layout(WARPS), byte_alignment=16)
        sWarpTiles = smem.allocate_tensor(Int32, cute.make_layout(WARPS), byte_alignment=16)
        sWarpSegs = smem.allocate_tensor(Int32, cute.make_layout(WARPS), byte_alignment=16)
        block = cute.make_layout(THREADS)
        sv = BlockValues(*(smem.allocate_tensor(Int32, block, byte_alignment=16) for _ in range(5)))

        S = max_segments
        length = cutlass.max(seg_len, Int32(1))  # scalars below 1 count as 1: no division by zero
        per_seg = cutlass.max(min_tiles, Int32(1))

        # scan_seg's entries are written in sequence order below; all others stay -1. Program order
        # plus the CTA barriers of the first block's scans put these stores first.
        for x in cutlass.range(tidx, S, THREADS, unroll=1):
            mScan[x] = Int32(-1)
        if cutlass.const_expr(self.listed):
            mark_listed(mListed, mIds, n_seq, n_listed, tidx, THREADS)

        carry_max = Int32(0)  # c[base] (varlen)
        if cutlass.const_expr(not dense):
            carry_max = clamp_token(mCu[0], t_total)
        carry_tiles = Int32(0)  # tile_prefix[base]
        carry_segs = Int32(0)  # F_base
        for base in cutlass.range(0, n_seq, THREADS, unroll=1):
            i = base + tidx
            lo = i * t_total  # dense: t_total is the length of every sequence
            hi = lo + t_total
            if cutlass.const_expr(not dense):
                end = Int32(0)
                if i < n_seq:
                    end = clamp_token(mCu[i + 1], t_total)
                lo, hi, carry_max = block_scan(end, carry_max, lane, warp, sWarpMax, True, WARPS)
            tiles = Int32(0)
            count = Int32(0)
            if i < n_seq:
                tiles = tile_count(hi - lo)
                by_len = Int32((Int64(tiles) + Int64(length) - 1) // Int64(length))  # 64 bits: no wrap
                count = cutlass.max(Int32(1), cutlass.min(cutlass.min(by_len, max_count), tiles // per_seg))
                if cutlass.const_expr(self.listed):
                    if mListed[i] == 0:
                        tiles = Int32(0)
                        count = Int32(1)  # the empty boundary segment (kernel docstring)
            prefix, _, carry_tiles = block_scan(tiles, carry_tiles, lane, warp, sWarpTiles, False, WARPS)
            first, _, segs_end = block_scan(count, carry_segs, lane, warp, sWarpSegs, False, WARPS)
            if i < n_seq:
                mFirst[i] = cutlass.min(first, S)
                mCount[i] = cutlass.max(Int32(0), cutlass.min(count, S - first))
                if cutlass.const_expr(self.listed):
                    if mListed[i] == 0:
                        mCount[i] = Int32(0)  # no carry: the merge skips the sequence
                sv.sFirst[tidx] = first
                sv.sCount[tidx] = count
                sv.sTiles[tidx] = tiles
                sv.sPrefix[tidx] = prefix
                sv.sStart[tidx] = lo
            cute.arch.barrier()

            self.block_segments(out, sv, n_seq, base, tidx, carry_segs, segs_end, S, mListed)
            carry_segs = segs_end
            # The block's shared arrays and warp results are overwritten by the next block.
            cute.arch.barrier()

        self.padding(out, n_seq, t_total, tidx, carry_max, carry_tiles, carry_segs, S)

    @cute.jit
    def block_segments(self, out: SegTables, sv: BlockValues, n_seq: Int32, base: Int32, tidx: Int32,
                       carry_segs: Int32, segs_end: Int32, S: Int32, mListed=None):
        """The block's segments, entry S included (the end of segment S - 1 when it is not padding):
        thread by thread, each finds its sequence by a binary search over the block's F."""
        n_block = cutlass.min(n_seq - base, Int32(THREADS))
        for s in cutlass.range(carry_segs + tidx, cutlass.min(segs_end, S + 1), THREADS, unroll=1):
            k = Int32(0)  # the last of the block's sequences with F <= s
            for bit in cutlass.range_constexpr(7, -1, -1):
                probe = k + (1 << bit)
                if probe < n_block:
                    if sv.sFirst[probe] <= s:
                        k = probe
            seq = base + k
            f = sv.sFirst[k]
            c_n = sv.sCount[k]
            t_n = sv.sTiles[k]
            part = s - f
            size = t_n // c_n
            local = part * size + cutlass.min(part, t_n - size * c_n)
            out.mSegStart[s] = sv.sStart[k] + CHUNK * local
            out.mSegPrefix[s] = sv.sPrefix[k] + local
            if s < S:
                if part == c_n - 1:
                    final = seq
                    if cutlass.const_expr(self.listed):
                        if mListed[seq] == 0:
                            final = Int32(-1)  # an unlisted sequence's boundary segment: no final state
                    out.mFinal[s] = final
                else:
                    out.mFinal[s] = Int32(-1)
                    out.mScan[f - seq + part] = s

    @cute.jit
    def padding(self, out: SegTables, n_seq: Int32, t_total: Int32, tidx: Int32, carry_max: Int32,
                carry_tiles: Int32, carry_segs: Int32, S: Int32):
        """Padding segments: empty, at the end of the token and tile axes."""
        c_end = carry_max
        if cutlass.const_expr(self.dense):
            c_end = n_seq * t_total
        for s in cutlass.range(carry_segs + tidx, S + 1, THREADS, unroll=1):
            out.mSegStart[s] = c_end
            out.mSegPrefix[s] = carry_tiles
            if s < S:
                out.mFinal[s] = Int32(-1)


class CpSegTablesDense(CpSegTables):
    """Dense [B, T] input (registry entry cp_seg_tables_dense): n_seq = B sequences of t_total = T
    tokens each (the twin's dense_cu(B, T) in tests/cp_twins.py with B * T tokens)."""

    dense = True

    @cute.jit
    def __call__(self, seg_start: cute.Pointer, seg_prefix: cute.Pointer, scan_seg: cute.Pointer,
                 seg_first: cute.Pointer, seg_count: cute.Pointer, final_slot: cute.Pointer, n_seq: Int32,
                 t_total: Int32, seg_len: Int32, max_count: Int32, min_tiles: Int32, max_segments: Int32,
                 stream: cuda.CUstream):
        """The kernel's cu_seqlens parameter is seg_start's tensor, unread (it stays a parameter: the
        kernel's PTX .param list is the same in both modes)."""
        tables = _tables(seg_start, seg_prefix, scan_seg, seg_first, seg_count, final_slot, n_seq, max_segments)
        self._launch(tables.mSegStart, tables, n_seq, t_total, seg_len, max_count, min_tiles, max_segments, stream)


class CpSegTablesListed(ListedMode, CpSegTables):
    """A call that runs its listed sequences only (registry entries cp_seg_tables_listed_{int32,int64,
    dense}; listed_sequences.py): the tables of CpSegTables / CpSegTablesDense over the listed
    sequences, and the listed flags. cu_seqlens is unread when dense."""

    @cute.jit
    def __call__(self, cu_seqlens: cute.Pointer, segment_ids: cute.Pointer, listed: cute.Pointer,
                 seg_start: cute.Pointer, seg_prefix: cute.Pointer, scan_seg: cute.Pointer, seg_first: cute.Pointer,
                 seg_count: cute.Pointer, final_slot: cute.Pointer, n_seq: Int32, n_listed: Int32, t_total: Int32,
                 seg_len: Int32, max_count: Int32, min_tiles: Int32, max_segments: Int32, stream: cuda.CUstream):
        """segment_ids int32 [n_listed] (any content) -> listed int32 [n_seq] (1 / 0) and the CP
        tables of CpSegTables.__call__."""
        tables = _tables(seg_start, seg_prefix, scan_seg, seg_first, seg_count, final_slot, n_seq, max_segments)
        m_cu = tables.mSegStart if cutlass.const_expr(self.dense) else \
            cute.make_tensor(cu_seqlens, cute.make_layout(n_seq + 1))
        self._launch(m_cu, tables, n_seq, t_total, seg_len, max_count, min_tiles, max_segments, stream,
                     cute.make_tensor(segment_ids, cute.make_layout(n_listed)),
                     cute.make_tensor(listed, cute.make_layout(n_seq)), n_listed)


# The registry's entry names (the manifest's): the classes whose __call__ is that host entry (compile.py).
cp_seg_tables_varlen, cp_seg_tables_dense, cp_seg_tables_listed = CpSegTables, CpSegTablesDense, CpSegTablesListed
