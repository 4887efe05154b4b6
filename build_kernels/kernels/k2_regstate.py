"""K2 with the state in registers: the chunk recurrence as warpgroup MMAs (docs/k2_regstate.md: what
it measured and when the planner picks it; docs/speed_limits.md, "A register-state wgmma step").

The same recipe, arguments, grid order and stage ring as K2 (k2_recurrence.py), bit for bit the same
results (tests/test_k2_regstate_gpu.py), with every product of the tile step computed transposed
(M = value columns), so that its A operand is the state or U and can stay in registers:

  Q1  u^T = S Kd^T, o1^T = S Qd^T   wgmma m64n16k16, 8 k-steps each, A = S (registers), B = Kd, Qd
                                    (K1's raw images in the stage, K-major descriptors)
  Q2  r^T = bf(bf(v^T - bf(u^T)) * bsig)  on u^T's accumulator, which packs into r^T's A fragment
  Q3  U^T = bf(acc32(r^T INV^T))    m16n8k16, 2 per warp (INV is row-major in the stage, which no
                                    wgmma descriptor describes; a warp's slice of an m64 A fragment
                                    is an m16n8k16 A fragment, and one ldmatrix.x4 of INV gives the
                                    B fragments, as K2 reads INV's A fragment)
  Q5  S = bf(fma(S, gamma, acc32(U^T Kr)))  wgmma m64n128k16, A = U^T, B = Kr (MN-major: N = keys);
                                    its accumulator is the next Q1's A fragment as it stands
  Q4  out^T = bf(bf(o1^T) + bf(acc32(U^T Mqk^T)))  m16n8k16 x 2 after Q5's wait, movmatrix'd back
                                    to (token, value pair) words and stored as K2 stores them

So the state never leaves the registers: no state stores, no ldmatrix of the state, no __syncwarp,
and Q1's and Q5's B operands are read once per warpgroup instead of once per warp. Each product
accumulates exactly as K2's m16n8k16 chain does (ci/probes/mma_vs_wgmma.cu, wgmma_k2_layouts.cu,
k2_wgmma_chain.cu).

Grid (n_seq * n_heads, 1, 128 // VB); CTA: VB // 64 warpgroups of MMA warps, then the producer
(recurrence_common.produce_tiles, K2's stage layout): one warp at VB = 64, a warpgroup at VB = 128
that keeps 24 registers per thread and hands the rest to the MMA warpgroups (setmaxnreg), whose one
warp issues the copies (producer_warps says why; docs/k2_regstate.md has what each form measured).
Warpgroup wg owns the value columns vblk * VB + 64 wg .. + 63; lane (g, q) of its warp wl holds
value rows 16 wl + g and + 8 of every m64 fragment. Every mode of K2's kernel: serial with every
state I/O (k2_regstate), CP segments (k2_regstate_segments) and state pool with checkpoints
(k2_regstate_ext), each with the arguments of K2's host entry of the same mode. With accurate=True
(numerics="accurate", serial and segments: the recipe has no state pool) the MMA warpgroups run
regstate_step.mma_warpgroups_accurate, the accurate mma.sync K2's arithmetic on the same products:
the fp32 master state in registers at Q5's accumulator positions, Q1 reading its bf16 pairs.

Order within a step (what ptxas made of the others, seen in the SASS of the probe): o1's chain is
waited for only with Q5's, so that its eight k-steps, queued on the tensor cores between u's and
Q5, stay off the chain; Q4's MMAs come after Q5's wait (issued while Q5 may still read U^T, ptxas
gave their results U^T's registers and waited for Q5 right there).
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from .recurrence_common import (K2Params, SequenceTiles, alloc_ring, init_ring, k2_cta_sequence, k2_stage_bytes,
                                k2_tile_source, produce_tiles)
from .regstate_step import WG_COLS, mma_warpgroups, mma_warpgroups_accurate
from .state_io import k2_state_slots
from .tile_ops import D

# The producer warpgroup's registers per thread after the trade (setmaxnreg's least; one warp issues
# the copies and needs no more), and what the VB=128 MMA warpgroups take: with 232 (and 40 for the
# producer) the variants that load an entry state spilled 16 bytes.
PRODUCER_REGS = 24
MMA_REGS = 240


def producer_warps(vb: int) -> int:
    """Registers are allocated per SM sub-partition (four of 16384, a CTA's warps dealt round-robin).
    At VB=64 a CTA of 4 MMA warps and one producer warp runs alone on its SM at 217-227 registers.
    At VB=128 a ninth warp would put three warps on one sub-partition, so ptxas caps the kernel at
    168 registers and it spills. So VB=128 has a producer warpgroup: 12 warps launched at 168, three
    per sub-partition, and after the trade 2 x MMA_REGS + PRODUCER_REGS = 504 = 3 x 168 there.
    (Without a producer, the MMA warps taking turns with the copies, both VBs measured slower.)"""
    return 1 if vb == WG_COLS else 4


def regstate_threads(vb: int) -> int:
    """4 MMA warps per 64 value columns, then the producer (producer_warps)."""
    return 32 * (4 * (vb // WG_COLS) + producer_warps(vb))


@cute.kernel
def _k2_regstate_kernel(v_ptr: Int64, out_ptr: Int64, qd_ptr: Int64, kd_ptr: Int64, kr_ptr: Int64, gt_ptr: Int64,
                        inv_ptr: Int64, mqk_ptr: Int64, bsig_ptr: Int64, mStart: cute.Tensor, mPrefix: cute.Tensor,
                        init_ptr: Int64, final_ptr: Int64, mSlot: cute.Tensor, n_heads: Int32, cap: Int32,
                        idx_ptr: Int64, slot_stride: Int64, n_pool: Int32, ck_ptr: Int64, ck_every: Int32,
                        mSeqStart: cute.Tensor, n_real: Int32, order_ptr: Int64, ck_tab: Int64, ck_k: Int32,
                        ck_stride: Int64, v_st: Int64, v_sh: Int64, has_initial: cutlass.Constexpr[bool],
                        has_final: cutlass.Constexpr[bool], state_fp32: cutlass.Constexpr[bool], value_block: cutlass.Constexpr[int],
                        final_fp32: cutlass.Constexpr[bool], final_slots: cutlass.Constexpr[bool],
                        ext: cutlass.Constexpr[bool], accurate: cutlass.Constexpr[bool] = False):
    """K2's kernel parameters and modes (k2_recurrence._k2_kernel): serial, segmented (final_slots:
    entry from the fp32 carries, the exit at final_slot[segment]) and state I/O by slot with
    checkpoints (ext); accurate: numerics="accurate" (serial and segmented only)."""
    VB = value_block
    MMA_WARPS = 4 * (VB // WG_COLS)
    SB = k2_stage_bytes(VB)

    n, h, vblk = k2_cta_sequence(n_heads, order_ptr)  # K2's grid and dispatch order
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    lane = cute.arch.lane_idx()

    smem = cutlass.memory.SmemAllocator()
    full, empty, buf_addr = alloc_ring(smem, SB)

    tile0 = mPrefix[n]
    ntiles = mPrefix[n + 1] - tile0
    busy, slot, in_slot = k2_state_slots(n, ntiles, mSlot, idx_ptr, n_pool, init_ptr, final_ptr, has_final,
                                         final_slots, ext)
    if busy > 0:
        init_ring(warp, full, empty, 32 * MMA_WARPS)
        tok0 = mStart[n]
        tok_end = mStart[n + 1]
        h64 = Int64(h)
        H64 = Int64(n_heads)

        tile_source = k2_tile_source(SequenceTiles(tok0, tok_end, tile0, ntiles),
                                     K2Params(v_ptr, out_ptr, qd_ptr, kd_ptr, kr_ptr, gt_ptr, inv_ptr, mqk_ptr,
                                              bsig_ptr, mStart, mPrefix, init_ptr, final_ptr, mSlot, n_heads, cap,
                                              idx_ptr, slot_stride, n_pool, ck_ptr, ck_every, mSeqStart, n_real,
                                              order_ptr, ck_tab, ck_k, ck_stride, v_st, v_sh), h64, vblk, VB)
        if warp >= MMA_WARPS:
            # ---------------------------------------------------------------- producer (K2's)
            if cutlass.const_expr(producer_warps(VB) == 4):
                cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == MMA_WARPS:
                produce_tiles(full, empty, buf_addr, ntiles, *tile_source)
        else:
            # ---------------------------------------------------------------- MMA warpgroups
            if cutlass.const_expr(producer_warps(VB) == 4):
                cute.arch.setmaxregister_increase(MMA_REGS)
            if cutlass.const_expr(accurate):
                mma_warpgroups_accurate(warp, lane, vblk, n, h64, H64, tok0, tok_end, ntiles, full, empty, buf_addr,
                                        out_ptr, init_ptr, final_ptr, slot, has_initial, has_final, state_fp32, VB,
                                        final_fp32)
            else:
                mma_warpgroups(warp, lane, vblk, n, h64, H64, tok0, tok_end, ntiles, full, empty, buf_addr, out_ptr,
                               init_ptr, final_ptr, slot, in_slot, slot_stride, ck_ptr, ck_every, mSeqStart, n_real,
                               ck_tab, ck_k, ck_stride, has_initial, has_final, state_fp32, VB, final_fp32, final_slots,
                               ext)


def _recipe(accurate: bool) -> tuple:
    """The kernel's trailing `accurate` argument, passed only when True: the kernel's symbol spells
    every constant it is passed, and FlashKDA's kernels keep the symbol (so the PTX) of the default."""
    return (True,) if accurate else ()


def _launch(kernel, n_seq: Int32, n_heads: Int32, value_block: int, stream):
    return kernel.launch(grid=(n_seq * n_heads, 1, D // value_block), block=(regstate_threads(value_block), 1, 1),
                         stream=stream, use_pdl=True, min_blocks_per_mp=1,
                         preferred_smem_carveout=-1)


@cute.jit
def k2_regstate(v: cute.Pointer, out: cute.Pointer, ws_qd: cute.Pointer, ws_kd: cute.Pointer,
                ws_kr: cute.Pointer, ws_gt: cute.Pointer, ws_inv: cute.Pointer, ws_mqk: cute.Pointer,
                ws_bsig: cute.Pointer, seq_start: cute.Pointer, tile_prefix: cute.Pointer, seq_order: cute.Pointer,
                initial_state: cute.Pointer, final_state: cute.Pointer, t_total: Int32, n_seq: Int32,
                n_heads: Int32, cap: Int32, v_stride_t: Int64, v_stride_h: Int64, stream: cuda.CUstream,
                has_initial: cutlass.Constexpr[bool], has_final: cutlass.Constexpr[bool],
                state_fp32: cutlass.Constexpr[bool], value_block: cutlass.Constexpr[int],
                accurate: cutlass.Constexpr[bool] = False):
    """Serial host entry with K2's arguments (k2_recurrence.k2_recurrence). value_block 64 with the
    producer warp, or 128 with the producer warpgroup (producer_warps says why); accurate:
    numerics="accurate" (docs/numerics.md), bit for bit the mma.sync K2's accurate step."""
    assert value_block in (64, 128)
    table = cute.make_layout(n_seq + 1)
    _launch(_k2_regstate_kernel(
        v.toint(), out.toint(), ws_qd.toint(), ws_kd.toint(), ws_kr.toint(), ws_gt.toint(), ws_inv.toint(),
        ws_mqk.toint(), ws_bsig.toint(), cute.make_tensor(seq_start, table), cute.make_tensor(tile_prefix, table),
        initial_state.toint(), final_state.toint(), cute.make_tensor(seq_start, table), n_heads, cap,
        Int64(0), Int64(0), Int32(0), Int64(0), Int32(0), cute.make_tensor(seq_start, table), n_seq, seq_order.toint(),
        Int64(0), Int32(0), Int64(0), v_stride_t, v_stride_h, has_initial, has_final, state_fp32, value_block,
        state_fp32, False, False, *_recipe(accurate)),
        n_seq, n_heads, value_block, stream)


@cute.jit
def k2_regstate_segments(v: cute.Pointer, out: cute.Pointer, ws_qd: cute.Pointer, ws_kd: cute.Pointer,
                         ws_kr: cute.Pointer, ws_gt: cute.Pointer, ws_inv: cute.Pointer, ws_mqk: cute.Pointer,
                         ws_bsig: cute.Pointer, seg_start: cute.Pointer, seg_prefix: cute.Pointer,
                         carries: cute.Pointer, final_state: cute.Pointer, final_slot: cute.Pointer, t_total: Int32,
                         n_seg: Int32, n_heads: Int32, cap: Int32, v_stride_t: Int64, v_stride_h: Int64,
                         stream: cuda.CUstream,
                         final_fp32: cutlass.Constexpr[bool], value_block: cutlass.Constexpr[int],
                         accurate: cutlass.Constexpr[bool] = False):
    """Segmented host entry with k2_recurrence.k2_segments' arguments (a CP call's K2); accurate as
    in k2_regstate."""
    assert value_block in (64, 128)
    table = cute.make_layout(n_seg + 1)
    _launch(_k2_regstate_kernel(
        v.toint(), out.toint(), ws_qd.toint(), ws_kd.toint(), ws_kr.toint(), ws_gt.toint(), ws_inv.toint(),
        ws_mqk.toint(), ws_bsig.toint(), cute.make_tensor(seg_start, table), cute.make_tensor(seg_prefix, table),
        carries.toint(), final_state.toint(), cute.make_tensor(final_slot, cute.make_layout(n_seg)), n_heads, cap,
        Int64(0), Int64(0), Int32(0), Int64(0), Int32(0), cute.make_tensor(seg_start, table), n_seg, Int64(0),
        Int64(0), Int32(0), Int64(0), v_stride_t, v_stride_h, True, True, True, value_block, final_fp32, True, False,
        *_recipe(accurate)),
        n_seg, n_heads, value_block, stream)


@cute.jit
def k2_regstate_ext(v: cute.Pointer, out: cute.Pointer, ws_qd: cute.Pointer, ws_kd: cute.Pointer,
                    ws_kr: cute.Pointer, ws_gt: cute.Pointer, ws_inv: cute.Pointer, ws_mqk: cute.Pointer,
                    ws_bsig: cute.Pointer, seq_start: cute.Pointer, tile_prefix: cute.Pointer,
                    seq_order: cute.Pointer, initial_state: cute.Pointer, final_state: cute.Pointer,
                    final_slot: cute.Pointer, state_index: cute.Pointer, checkpoints: cute.Pointer,
                    real_seq_start: cute.Pointer, slot_stride: Int64, n_pool: Int32, checkpoint_every: Int32,
                    n_real: Int32, checkpoint_table: cute.Pointer, checkpoint_k: Int32, checkpoint_stride: Int64,
                    t_total: Int32, n_seq: Int32, n_heads: Int32, cap: Int32, v_stride_t: Int64,
                    v_stride_h: Int64, stream: cuda.CUstream,
                    segments: cutlass.Constexpr[bool], state_fp32: cutlass.Constexpr[bool],
                    final_fp32: cutlass.Constexpr[bool], value_block: cutlass.Constexpr[int]):
    """State-pool and checkpoint host entry with k2_recurrence.k2_ext's arguments and meaning."""
    assert value_block in (64, 128)
    table = cute.make_layout(n_seq + 1)
    _launch(_k2_regstate_kernel(
        v.toint(), out.toint(), ws_qd.toint(), ws_kd.toint(), ws_kr.toint(), ws_gt.toint(), ws_inv.toint(),
        ws_mqk.toint(), ws_bsig.toint(), cute.make_tensor(seq_start, table), cute.make_tensor(tile_prefix, table),
        initial_state.toint(), final_state.toint(), cute.make_tensor(final_slot, cute.make_layout(n_seq)), n_heads,
        cap, state_index.toint(), slot_stride, n_pool, checkpoints.toint(), checkpoint_every,
        cute.make_tensor(real_seq_start, cute.make_layout(n_real + 1)), n_real, seq_order.toint(),
        checkpoint_table.toint(), checkpoint_k, checkpoint_stride, v_stride_t, v_stride_h, True, True, state_fp32, value_block, final_fp32, segments, True),
        n_seq, n_heads, value_block, stream)
