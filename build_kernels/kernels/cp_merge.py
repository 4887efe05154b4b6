"""CP merge (docs/algorithm.md §4.4): resolve the true entry state of every segment of a context-parallel plan.

For each sequence n and head h, sequentially over the segments [first, first + count) of n:

    carry[first]         = widen_fp32(initial_state[n, h])   (or 0 when has_initial=False)
    carry[first + i + 1] = carry[first + i] @ m_seg[first + i] + b_seg[first + i],  i = 0 .. count-2

All matrices are fp32 [128, 128] row-major per (segment, head); element (s, h, r, c) of m_seg, b_seg
and carries sits at ((s * n_heads + h) * 128 + r) * 128 + c; the carry is V x K (value rows), M is
K x K. Every carry[first + i], i = 0 .. count-1, is written (the first too): segmented K2 reads
them as its initial states.

Grid (128 // ROWS, n_seq, n_heads), 32 * WARPS threads (WARPS = 8). Rows of the carry are
independent, so CTA (rb, n, h) owns value rows [rb*ROWS, rb*ROWS + ROWS), ROWS = 16 (one m16 MMA
tile; H=4 with one sequence gives 32 CTAs). Per step the CTA computes acc(16 x 128) = carry @ M +
B rows with warp-level TF32 tensor-core MMA (mma.sync.m16n8k8.row.col.f32.tf32.tf32.f32): warp w
owns output columns [16w, 16w + 16) = 2 n-tiles of 8, 16 k-steps of 8, accumulator initialised
with B. Operands are rounded fp32 -> tf32 with cvt.rna.tf32.f32 (M when read from shared memory;
the carry once, when it is stored as the next step's A operand). Accumulation is fp32 in a fixed
k order, no atomics: bitwise deterministic.

m_seg's columns are swizzled (m_seg_column: element (r, c) sits at column c ^ 8 (r & 3) of row r),
which pre_scan writes and this kernel reads; b_seg and the carries are plain row-major.

What bounds a step, measured on the H200 (H=8 [8192], 15 steps; docs/cp_tuning.md): streaming
M with 16-byte cp.async (in 4 k-blocks with a barrier each, or whole matrices double-buffered
with one barrier per step) took 24.4 us; the same kernel without any M copy after the first
step 16.6 us; one contiguous 64 KiB bulk copy per step 15.8 us; 512-byte bulk copies per row
(144 per step) 75 us. So M arrives as one bulk copy per step, which needs unpadded rows, and the
swizzle keeps the B-fragment reads conflict-free without padding. With it, 4 or 16 warps instead
of 8, or two or four interleaved accumulators instead of one 16-long MMA chain, did not shorten a
step (docs/cp_tuning.md, "The merge").

Shared memory (bytes):
  M       2 x 65536: M of the step being computed and of the next one, rows unpadded, swizzled.
  B       2 x 16 rows x 136 words (8704 each): this CTA's rows of b_seg (cp.async, padded rows:
          C-fragment reads (row g, cols n0+2q..) conflict-free).
  carry   2 x 16 rows x 132 words (8448 each): tf32 bit patterns of the current carry (A operand),
          double-buffered by step parity so the epilogue of step i never races step i's readers.
          Row stride 132 words: A-fragment reads (row g, col k0+q) hit bank 4g+q, conflict-free.
  full    2 mbarriers, one per M buffer: 1 arrival + 65536 transaction bytes per step.
  total   165 KiB -> 1 CTA per SM.

Pipeline: before the carry initialisation, step 0's copies are issued (one elected lane of warp 0
arms full[0] and issues M; every thread issues its two 16-byte chunks of the B rows, one commit
group). Step i: cp.async.wait_group 0 and bar.sync (everyone's B chunks of step i landed, step
i - 1's epilogue wrote the carry, and buffers (i + 1) & 1 are no longer read), issue step i + 1
into buffers (i + 1) & 1, wait full[i & 1] at parity (i >> 1) & 1, compute. Copies past the last
step are not issued, so nothing is in flight at exit.

Programmatic dependent launch: the kernel is launched with use_pdl and waits for the previous grid
(pre_scan) before touching global memory, so its launch and set-up overlap pre_scan's tail.
"""

import dataclasses
import enum
from typing import Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .common.ptx_ops import (bulk_g2s, cp_async_16, ldg_bf16x4_f32, ldg_v4_f32, lds_b32, lds_f32, lds_v2_f32,
                             mma_tf32_1688, st_shared_v4, stg_v2_f32, stg_v4_f32, sts_v2_b32, to_tf32)
from .common.state_io import pool_slot
from .common.tile_ops import D, await_previous_grid, m_seg_column, sync_named

ROWS = 16  # carry rows (value rows) per CTA: one m16 tile
WARPS = 8  # MMA warps per CTA, each owning WARP_COLS output columns
THREADS = 32 * WARPS
WARP_COLS = D // WARPS
KSTEPS = D // 8  # m16n8k8 k-steps per step

C_STRIDE = D + 4  # words per carry row in smem
B_STRIDE = D + 8  # words per B row in smem
ROW_BYTES = D * 4  # one fp32 row of M, B or a carry in global memory
MAT = D * D  # elements per (segment, head) matrix
M_BYTES = MAT * 4  # one M, unpadded (its columns are swizzled instead, see m_seg_column)
B_BYTES = ROWS * B_STRIDE * 4
CARRY_BYTES = ROWS * C_STRIDE * 4


class MergeBarrier(enum.IntEnum):
    """The merge's CTA barriers (tile_ops.sync_named, all THREADS threads; module docstring: pipeline)."""

    FULL_ARMED = 1  # the two full mbarriers initialised and fenced
    STEP = 2  # step i: everyone's B chunks landed, step i - 1's carry published, buffers i + 1 free


# ------------------------------------------------------------------------------------------------
# trace-time helpers (plain Python: they only emit code)


def _mat_base(s, h64, H64):
    """Element index of matrix (segment or sequence s, head h): (s * H + h) * 128 * 128, in 64 bits."""
    return (Int64(s) * H64 + h64) * MAT


@cute.jit
def _issue_step(ctx: tuple, step: Int32, buf: Int32, warp: Int32, tidx: Int32):
    """Copies of step `step` into buffer buf: the whole M[first + step] as one 64 KiB bulk copy on
    full[buf] (one elected lane of warp 0), and this CTA's B rows by every thread with 16-byte
    cp.async (chunk c = tidx + THREADS j: row c >> 5, column chunk c & 31) into padded rows."""
    m_ptr, b_ptr, m_base, b_base, full, h64, H64, first, row0 = ctx
    mb = _mat_base(first + step, h64, H64)
    if warp == 0:
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(full + buf, M_BYTES)
            bulk_g2s(m_base + buf * M_BYTES, m_ptr + mb * 4, M_BYTES, (full + buf).toint())
    row = tidx >> 5
    gb = b_ptr + (mb + Int64((row0 + row) * D + (tidx & 31) * 4)) * 4
    sb = b_base + buf * B_BYTES + row * (B_STRIDE * 4) + (tidx & 31) * 16
    for j in cutlass.range_constexpr(ROWS // WARPS):
        cp_async_16(sb + j * (WARPS * B_STRIDE * 4), gb + Int64(j * WARPS * ROW_BYTES))


# ------------------------------------------------------------------------------------------------


def _first_carry(init_ptr, ib, carry_ptr, cb0, c_base, tidx, has_initial: bool, state_fp32: bool):
    """carry[first] = this CTA's rows of the widened initial state at element `ib` (or 0): the global
    fp32 copy and the tf32 A operand in shared memory. A plain function (traced inline), so the
    state-pool variant can call it inside a dynamic `if`."""
    for j in range(ROWS * D // 4 // THREADS):
        c = tidx + THREADS * j
        r = c >> 5
        col = (c & 31) * 4
        e = Int64(r * D + col)
        x = (Float32(0.0), Float32(0.0), Float32(0.0), Float32(0.0))
        if has_initial:
            if state_fp32:
                x = ldg_v4_f32(init_ptr + (ib + e) * 4)
            else:
                x = ldg_bf16x4_f32(init_ptr + (ib + e) * 2)
        stg_v4_f32(carry_ptr + (cb0 + e) * 4, x[0], x[1], x[2], x[3])
        st_shared_v4(c_base + (r * C_STRIDE + col) * 4, [to_tf32(xi) for xi in x])


@dataclasses.dataclass(frozen=True)
class MergeConfig:
    """The static configuration of one merge kernel: the initial state (has_initial; state_fp32: fp32,
    else bf16) and whether it comes from a state pool's slots (pooled, docs/state_pool.md)."""

    has_initial: bool = True
    state_fp32: bool = True
    pooled: bool = False


class CpMerge:
    """The CP merge of one static configuration (MergeConfig); CpMergePool adds the state-pool entry."""

    def __init__(self, has_initial: bool, state_fp32: bool):
        self.config = MergeConfig(has_initial, state_fp32)

    def __str__(self):
        """What the kernel's PTX symbol spells for this object (the DSL spells a kernel method's
        symbol from its object)."""
        cfg = self.config
        return f"{type(self).__name__}_{int(cfg.has_initial)}_{int(cfg.state_fp32)}"

    @cute.jit
    def __call__(self, m_seg: cute.Pointer, b_seg: cute.Pointer, initial_state: cute.Pointer, carries: cute.Pointer,
                 seg_first: cute.Pointer, seg_count: cute.Pointer, n_seq: Int32, n_heads: Int32,
                 stream: cuda.CUstream):
        """m_seg (columns swizzled, m_seg_column), b_seg, carries fp32 [n_seg, H, 128, 128]; initial_state
        [n_seq, H, 128, 128] (V x K) in bf16 or fp32 (unused when has_initial=False); seg_first /
        seg_count int32 [n_seq]. n_seq >= 1."""
        self._launch(m_seg, b_seg, initial_state, carries, seg_first, seg_count, n_seq, n_heads, stream)

    def _launch(self, m_seg, b_seg, init, carries, seg_first, seg_count, n_seq, n_heads, stream, state_index=None,
                slot_stride=None, n_pool=None):
        """Without a pool, the pool's three parameters are None, and so is the initial state without one:
        compile-time constants the DSL leaves out of the kernel's .param list (nothing reads them)."""
        table = cute.make_layout(n_seq)
        init_ptr = init.toint() if self.config.has_initial else None  # unread without one
        self.kernel(m_seg.toint(), b_seg.toint(), init_ptr, carries.toint(), cute.make_tensor(seg_first, table),
                    cute.make_tensor(seg_count, table), n_heads, None if state_index is None else state_index.toint(),
                    slot_stride, n_pool).launch(
            grid=(D // ROWS, n_seq, n_heads), block=(THREADS, 1, 1), stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, m_ptr: Int64, b_ptr: Int64, init_ptr: Optional[Int64], carry_ptr: Int64, mFirst: cute.Tensor,
               mCount: cute.Tensor, n_heads: Int32, idx_ptr: Optional[Int64], slot_stride: Optional[Int64],
               n_pool: Optional[Int32]):
        """CTA (rb, n, h): the barriers, step 0's copies, carry[first], then every step (module
        docstring: pipeline)."""
        rb, n, h = cute.arch.block_idx()
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        g = lane >> 2
        q = lane & 3

        # The shared-memory plan of the module docstring, allocated in order. The same plan as a
        # cute.struct (one allocate of a SharedStorage) moves one add in the PTX, so it stays as calls.
        smem = cutlass.memory.SmemAllocator()
        s_m = smem.allocate(2 * M_BYTES, byte_alignment=128)
        s_b = smem.allocate(2 * B_BYTES, byte_alignment=128)
        s_c = smem.allocate(2 * CARRY_BYTES, byte_alignment=128)
        full = smem.allocate_array(Int64, 2, byte_alignment=8)
        m_base = s_m.toint()
        b_base = s_b.toint()
        c_base = s_c.toint()
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(full, 1)
                cute.arch.mbarrier_init(full + 1, 1)
                cute.arch.mbarrier_init_fence()
        sync_named(MergeBarrier.FULL_ARMED, THREADS)

        await_previous_grid()  # pre_scan's m_seg / b_seg are complete and visible
        first = mFirst[n]
        count = mCount[n]
        nsteps = count - 1  # <= 0: no step
        h64 = Int64(h)
        H64 = Int64(n_heads)
        row0 = rb * ROWS  # first value row of this CTA
        ctx = (m_ptr, b_ptr, m_base, b_base, full, h64, H64, first, row0)

        if nsteps > 0:
            _issue_step(ctx, Int32(0), Int32(0), warp, tidx)
        cute.arch.cp_async_commit_group()

        self.first_carry(init_ptr, carry_ptr, idx_ptr, slot_stride, n_pool, n, count, first, row0, h64, H64, c_base,
                         tidx)

        # -------- the steps
        n0w = warp * WARP_COLS  # first output column of this warp
        a_off = (g * C_STRIDE + q) * 4  # A fragment (row g, col q) inside the carry buffer
        # B fragment (k q, n n0w + 8 nt + g) inside an M buffer; rows k0 + q and k0 + q + 4 (k0 = 8 ks)
        # share the swizzle term 8 q, so the offsets below only move by whole rows
        bm_off = [(q * D + m_seg_column(q, n0w + 8 * nt) + g) * 4 for nt in range(WARP_COLS // 8)]
        acc_off = (g * B_STRIDE + n0w + 2 * q) * 4  # C fragment (row g, cols 2q..) inside a B buffer
        cw_off = (g * C_STRIDE + n0w + 2 * q) * 4  # same position inside a carry buffer
        out_off = Int64((row0 + g) * D + n0w + 2 * q)  # same position inside a global carry matrix
        for step in cutlass.range(nsteps, unroll=1):
            buf = step & 1
            c_rd = c_base + buf * CARRY_BYTES
            c_wr = c_base + (buf ^ 1) * CARRY_BYTES
            cute.arch.cp_async_wait_group(0)  # this thread's B chunks of this step landed
            sync_named(MergeBarrier.STEP, THREADS)  # everyone's did; step - 1's carry published; buf ^ 1 free
            if step + 1 < nsteps:
                _issue_step(ctx, step + 1, buf ^ 1, warp, tidx)
            cute.arch.cp_async_commit_group()
            cute.arch.mbarrier_wait(full + buf, (step >> 1) & 1)  # M of this step landed
            acc = self.mma(m_base + buf * M_BYTES, b_base + buf * B_BYTES + acc_off, c_rd, a_off, bm_off)
            self.epilogue(acc, carry_ptr + (_mat_base(first + step + 1, h64, H64) + out_off) * 4, c_wr, cw_off)

    @cute.jit
    def first_carry(self, init_ptr: Optional[Int64], carry_ptr: Int64, idx_ptr: Optional[Int64],
                    slot_stride: Optional[Int64], n_pool: Optional[Int32],
                    n: Int32, count: Int32, first: Int32, row0: Int32, h64: Int64, H64: Int64, c_base: Int32,
                    tidx: Int32):
        """carry[first] = widened initial state (or 0): global fp32 copy + tf32 A operand in smem."""
        cfg = self.config
        if count > 0:
            cb0 = _mat_base(first, h64, H64) + Int64(row0 * D)
            if cutlass.const_expr(cfg.pooled):
                # state pool (docs/state_pool.md): sequence n starts from slot state_index[n]; no slot -> 0
                slot = pool_slot(n, idx_ptr, n_pool, init_ptr)
                if slot >= 0:
                    _first_carry(init_ptr, Int64(slot) * slot_stride + h64 * MAT + Int64(row0 * D), carry_ptr, cb0,
                                 c_base, tidx, True, cfg.state_fp32)
                else:
                    _first_carry(init_ptr, Int64(0), carry_ptr, cb0, c_base, tidx, False, cfg.state_fp32)
            else:
                _first_carry(init_ptr, (Int64(n) * H64 + h64) * MAT + Int64(row0 * D), carry_ptr, cb0, c_base, tidx,
                             cfg.has_initial, cfg.state_fp32)

    def mma(self, mbuf, bbuf, c_rd, a_off, bm_off):
        """One step's 16 x 128 product of this warp's columns: the accumulator from B's rows, then
        16 k-steps of m16n8k8 TF32 MMAs of the carry (A, tf32 in smem) and M (B, rounded on read)."""
        acc = []
        for nt in range(WARP_COLS // 8):
            c0, c1 = lds_v2_f32(bbuf + nt * 32)
            c2, c3 = lds_v2_f32(bbuf + nt * 32 + 8 * B_STRIDE * 4)
            acc.append([c0, c1, c2, c3])

        for ks in range(KSTEPS):
            ka = c_rd + a_off + ks * 32
            a = (lds_b32(ka), lds_b32(ka + 8 * C_STRIDE * 4), lds_b32(ka + 16), lds_b32(ka + 8 * C_STRIDE * 4 + 16))
            for nt in range(WARP_COLS // 8):
                kbm = mbuf + bm_off[nt] + ks * (8 * ROW_BYTES)
                bfrag = (to_tf32(lds_f32(kbm)), to_tf32(lds_f32(kbm + 4 * ROW_BYTES)))
                acc[nt] = mma_tf32_1688(a, bfrag, acc[nt])
        return acc

    def epilogue(self, acc, gout, c_wr, cw_off):
        """carry[first + step + 1] to global (fp32) and as the next step's A operand (tf32)."""
        for nt in range(WARP_COLS // 8):
            v = acc[nt]
            stg_v2_f32(gout + nt * 32, v[0], v[1])
            stg_v2_f32(gout + nt * 32 + 8 * D * 4, v[2], v[3])
            sts_v2_b32(c_wr + cw_off + nt * 32, to_tf32(v[0]), to_tf32(v[1]))
            sts_v2_b32(c_wr + cw_off + nt * 32 + 8 * C_STRIDE * 4, to_tf32(v[2]), to_tf32(v[3]))


class CpMergePool(CpMerge):
    """cp_merge whose initial states are slots of a state pool (registry entry cp_merge_pool)."""

    def __init__(self, state_fp32: bool):
        self.config = MergeConfig(True, state_fp32, pooled=True)

    @cute.jit
    def __call__(self, m_seg: cute.Pointer, b_seg: cute.Pointer, state_pool: cute.Pointer, carries: cute.Pointer,
                 seg_first: cute.Pointer, seg_count: cute.Pointer, state_index: cute.Pointer, slot_stride: Int64,
                 n_pool: Int32, n_seq: Int32, n_heads: Int32, stream: cuda.CUstream):
        """The state pool is [n_pool, H, 128, 128] (slot stride `slot_stride` elements, bf16 or fp32):
        sequence n starts from slot state_index[n]; a slot outside [0, n_pool) starts from 0
        (docs/state_pool.md)."""
        self._launch(m_seg, b_seg, state_pool, carries, seg_first, seg_count, n_seq, n_heads, stream,
                     state_index=state_index, slot_stride=slot_stride, n_pool=n_pool)


# The registry's entry names (the manifest's): the classes whose __call__ is that host entry (compile.py).
cp_merge, cp_merge_pool = CpMerge, CpMergePool
