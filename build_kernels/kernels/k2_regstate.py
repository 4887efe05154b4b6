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
value rows 16 wl + g and + 8 of every m64 fragment. FlashKDA's recipe only; every mode of K2's kernel: serial with every
state I/O (k2_regstate), CP segments (k2_regstate_segments) and state pool with checkpoints
(k2_regstate_ext), each with the arguments of K2's host entry of the same mode.

Order within a step (what ptxas made of the others, seen in the SASS of the probe): o1's chain is
waited for only with Q5's, so that its eight k-steps, queued on the tensor cores between u's and
Q5, stay off the chain; Q4's MMAs come after Q5's wait (issued while Q5 may still read U^T, ptxas
gave their results U^T's registers and waited for Q5 right there).
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Float32

from .ptx_ops import (add_rn, fma_rn, ldg_b32_if, ldg_f32_pair_bf16_if, lds_bf16_f32, lds_bf16_f32_if,
                      lds_v2_f32, ldsm_x4, mma_bf16_16816, movmatrix_t, mul_rn, pack_bf16x2, round_bf16x2, smem_desc,
                      stg_b32, stg_b32_if, stg_v2_f32, sub_rn, unpack_bf16x2, wgmma_commit, wgmma_fence,
                      wgmma_m64n16k16_rs, wgmma_m64n128k16_rs_mn, wgmma_wait)
from .recurrence_common import (HEAD_ROW_BYTES, K2_OFF_BSIG, K2_OFF_GT, K2_OFF_INV, K2_OFF_KD, K2_OFF_KR,
                                K2_OFF_MQK, K2_OFF_QD, K2_OFF_V, STAGES, alloc_ring, init_ring, k2_cta_sequence,
                                k2_stage_bytes, k2_tile_source, produce_tiles, v_stride)
from .state_io import checkpoint_due, k2_state_slots, sequence_start_of
from .tile_ops import CHUNK, D

# The stage is K2's (recurrence_common, K2_OFF_*), K1's images as they are. Kd and Qd are K-major
# wgmma B operands (k16 step kb at + 512 kb; 256 bytes between the two 8-key halves, 128 between
# token blocks), Kr an MN-major one (128 bytes between token blocks, 256 between 8-key blocks).
WG_COLS = 64  # value columns per warpgroup (the M of every wgmma)


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


def _state_word_offset(col_wg, r0, q, kb: int, e: int):
    """Element offset (v * D + k) of A-fragment word e of k-block kb: value row r0 + 8 (e & 1) of
    the warpgroup's columns, keys 16 kb + 8 (e >> 1) + 2q and + 1."""
    return Int64(col_wg + r0 + 8 * (e & 1)) * D + Int64(16 * kb + 8 * (e >> 1) + 2 * q)


def _load_state(init_ptr, base, ok, col_wg, r0, q, fp32: bool):
    """Q6 entry: this lane's A-fragment words of the state, bf(state[base + v * D + k]) (fp32 RNE or
    bf16 as is), or 0 where ok == 0 (nothing read)."""
    words = []
    for kb in range(D // 16):
        for e in range(4):
            e0 = base + _state_word_offset(col_wg, r0, q, kb, e)
            if fp32:
                words.append(ldg_f32_pair_bf16_if(init_ptr + e0 * 4, ok))
            else:
                words.append(ldg_b32_if(init_ptr + e0 * 2, ok))
    return words


def _store_state(ptr, base, words, col_wg, r0, q, fp32: bool):
    """Q6 exit (and checkpoints): this lane's words at state[base + v * D + k], bf16 as they are or
    exactly widened to fp32. A plain function (traced inline), so it can sit in a dynamic `if`."""
    for kb in range(D // 16):
        for e in range(4):
            e0 = base + _state_word_offset(col_wg, r0, q, kb, e)
            if fp32:
                lo, hi = unpack_bf16x2(words[4 * kb + e])
                stg_v2_f32(ptr + e0 * 4, lo, hi)
            else:
                stg_b32(ptr + e0 * 2, words[4 * kb + e])


@cute.kernel
def _k2_regstate_kernel(v_ptr: Int64, out_ptr: Int64, qd_ptr: Int64, kd_ptr: Int64, kr_ptr: Int64, gt_ptr: Int64,
                        inv_ptr: Int64, mqk_ptr: Int64, bsig_ptr: Int64, mStart: cute.Tensor, mPrefix: cute.Tensor,
                        init_ptr: Int64, final_ptr: Int64, mSlot: cute.Tensor, n_heads: Int32, cap: Int32,
                        idx_ptr: Int64, slot_stride: Int64, n_pool: Int32, ck_ptr: Int64, ck_every: Int32,
                        mSeqStart: cute.Tensor, n_real: Int32, order_ptr: Int64,
                        has_initial: cutlass.Constexpr[bool], has_final: cutlass.Constexpr[bool],
                        state_fp32: cutlass.Constexpr[bool], value_block: cutlass.Constexpr[int],
                        final_fp32: cutlass.Constexpr[bool], final_slots: cutlass.Constexpr[bool],
                        ext: cutlass.Constexpr[bool]):
    """K2's kernel parameters and modes (k2_recurrence._k2_kernel): serial, segmented (final_slots:
    entry from the fp32 carries, the exit at final_slot[segment]) and state I/O by slot with
    checkpoints (ext); FlashKDA's recipe only."""
    VB = value_block
    MMA_WARPS = 4 * (VB // WG_COLS)
    VSTR = v_stride(VB)
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

        tile_source = k2_tile_source(tok0, tok_end, h64, H64, cap, tile0, vblk, VB, v_ptr, qd_ptr, kd_ptr, kr_ptr,
                                     gt_ptr, inv_ptr, mqk_ptr, bsig_ptr)
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
            wg = warp // 4
            wl = warp % 4
            g = lane >> 2
            q = lane & 3
            r0 = 16 * wl + g  # this lane's first value row within its warpgroup's 64
            col_wg = vblk * VB + WG_COLS * wg  # first global value column of the warpgroup
            state_base = (Int64(n) * H64 + h64) * Int64(D * D)  # element index of state[n, h, 0, 0]
            # ldmatrix.x4 of a row-major 16 x 16 (INV, Mqk): matrix j4 = lane >> 3 is rows 8 (j4 & 1),
            # columns 8 (j4 >> 1); n-block nb's B fragment is then (f[nb], f[nb + 2])
            off_sq = 32 * (8 * ((lane >> 3) & 1) + (lane & 7)) + 16 * (lane >> 4)
            zero = Float32(0.0)

            ck_base = tok0  # checkpoints count tokens from the start of the CTA's sequence
            if cutlass.const_expr(ext and final_slots):
                ck_base = sequence_start_of(tok0, ck_ptr, mSeqStart, n_real)

            # -------- Q6 entry: the state as Q1's A fragments, a_s[4 kb + e]; bf(initial) or 0
            if cutlass.const_expr(ext and not final_slots):
                # by slot (state pool, or a plain state with slot = n): no entry slot -> 0
                a_s = _load_state(init_ptr, Int64(cutlass.max(in_slot, 0)) * slot_stride + h64 * Int64(D * D),
                                  Int32(in_slot >= 0), col_wg, r0, q, state_fp32)
            elif cutlass.const_expr(has_initial):
                a_s = _load_state(init_ptr, state_base, Int32(1), col_wg, r0, q, state_fp32)
            else:
                a_s = [Int32(0)] * 32

            for i in cutlass.range(ntiles, unroll=1):
                s = i % STAGES
                cute.arch.mbarrier_wait(full + s, (i // STAGES) & 1)
                sb = buf_addr + s * SB
                start = tok0 + i * CHUNK
                m = cutlass.min(tok_end - start, CHUNK)

                # -------- Q1: u^T's chain, then o1^T's, each its own commit group
                a_s, acc = wgmma_fence(a_s, [zero] * 16)
                acc_u = acc[:8]
                acc_o = acc[8:]
                desc_kd = smem_desc(sb + K2_OFF_KD, 256, 128)
                desc_qd = smem_desc(sb + K2_OFF_QD, 256, 128)
                for kb in cutlass.range_constexpr(D // 16):
                    # + 512 bytes per k16 step: + 32 in the descriptor's address field
                    acc_u = wgmma_m64n16k16_rs(acc_u, a_s[4 * kb:4 * kb + 4], desc_kd + Int64(32 * kb), kb > 0)
                wgmma_commit()
                for kb in cutlass.range_constexpr(D // 16):
                    acc_o = wgmma_m64n16k16_rs(acc_o, a_s[4 * kb:4 * kb + 4], desc_qd + Int64(32 * kb), kb > 0)
                wgmma_commit()

                # stage-only operands, read while Q1 runs. u^T's element c = 4 j + hh is (value row
                # r0 + 8 (hh >> 1), token 8 j + 2q + (hh & 1)); bs[2 j + x] is bsig of token 8 j + 2q + x;
                # gam[4 kb + 2 half + x] is gamma of key 16 kb + 8 half + 2q + x. v rows >= m read as 0
                # (the stage holds only the m copied rows).
                f_inv = ldsm_x4(sb + K2_OFF_INV + off_sq)
                f_mqk = ldsm_x4(sb + K2_OFF_MQK + off_sq)
                bs = [lds_bf16_f32(sb + K2_OFF_BSIG + 2 * (8 * (x >> 1) + 2 * q + (x & 1))) for x in range(4)]
                vv = []
                for c in cutlass.range_constexpr(8):
                    t = 8 * (c // 4) + 2 * q + (c & 1)
                    vcol = WG_COLS * wg + r0 + 8 * ((c % 4) >> 1)
                    vv.append(lds_bf16_f32_if(sb + K2_OFF_V + t * VSTR + vcol * 2, Int32(t < m)))
                gam = []
                for kb in cutlass.range_constexpr(D // 16):
                    for half in cutlass.range_constexpr(2):
                        gam += list(lds_v2_f32(sb + K2_OFF_GT + 4 * (16 * kb + 8 * half + 2 * q)))

                acc_u = wgmma_wait(1, [], acc_u)[1]  # u^T's group done (o1's may still run)

                # -------- Q2 on u^T's accumulator: A-fragment word 2 j + hp of r^T is (value row
                # r0 + 8 hp, tokens 8 j + 2q, + 1), accumulator elements 4 j + 2 hp, + 1
                a_r = []
                for j in cutlass.range_constexpr(2):
                    for hp in cutlass.range_constexpr(2):
                        c = 4 * j + 2 * hp
                        u0, u1 = round_bf16x2(acc_u[c], acc_u[c + 1])
                        d0, d1 = round_bf16x2(sub_rn(vv[c], u0), sub_rn(vv[c + 1], u1))
                        a_r.append(pack_bf16x2(mul_rn(d0, bs[2 * j]), mul_rn(d1, bs[2 * j + 1])))

                # -------- Q3: U^T = bf(acc32(r^T INV^T)), token blocks 0 and 1
                uu = list(mma_bf16_16816(a_r, (f_inv[0], f_inv[2]), (zero, zero, zero, zero))) + \
                    list(mma_bf16_16816(a_r, (f_inv[1], f_inv[3]), (zero, zero, zero, zero)))
                a_u = [pack_bf16x2(uu[4 * j + 2 * hp], uu[4 * j + 2 * hp + 1]) for j in range(2) for hp in range(2)]

                # -------- Q5: S = bf(fma(S, gamma, acc32(U^T Kr))), one m64n128k16
                a_u, d5 = wgmma_fence(a_u, [zero] * 64)
                d5 = wgmma_m64n128k16_rs_mn(d5, a_u, smem_desc(sb + K2_OFF_KR, 128, 256))
                wgmma_commit()
                words, floats = wgmma_wait(0, a_u + a_s, d5 + acc_o)  # Q5 and o1's chain done
                a_u = words[:4]
                a_s = words[4:]
                d5 = floats[:64]
                acc_o = floats[64:]
                # accumulator element 8 kb + 2 e + x sits where half x of a_s[4 kb + e] does
                for kb in cutlass.range_constexpr(D // 16):
                    for e in cutlass.range_constexpr(4):
                        s0, s1 = unpack_bf16x2(a_s[4 * kb + e])
                        gi = 4 * kb + 2 * (e >> 1)
                        a_s[4 * kb + e] = pack_bf16x2(fma_rn(s0, gam[gi], d5[8 * kb + 2 * e]),
                                                      fma_rn(s1, gam[gi + 1], d5[8 * kb + 2 * e + 1]))

                # -------- Q4: out = bf(bf(o1) + bf(acc32(Mqk U))), off the chain. Word (j, hp) holds
                # (value row r0 + 8 hp, tokens 8 j + 2q, + 1); movmatrix makes it (token 8 j + g, value
                # rows 16 wl + 8 hp + 2q, + 1), one 4-byte store of a token row as K2 stores them
                o2 = list(mma_bf16_16816(a_u, (f_mqk[0], f_mqk[2]), (zero, zero, zero, zero))) + \
                    list(mma_bf16_16816(a_u, (f_mqk[1], f_mqk[3]), (zero, zero, zero, zero)))
                for j in cutlass.range_constexpr(2):
                    row = Int64(start + 8 * j + g) * H64 + h64
                    ok = Int32(8 * j + g < m)
                    for hp in cutlass.range_constexpr(2):
                        c = 4 * j + 2 * hp
                        o1a, o1b = round_bf16x2(acc_o[c], acc_o[c + 1])
                        o2a, o2b = round_bf16x2(o2[c], o2[c + 1])
                        word = movmatrix_t(pack_bf16x2(add_rn(o1a, o2a), add_rn(o1b, o2b)))
                        col = col_wg + 16 * wl + 8 * hp + 2 * q
                        stg_b32_if(out_ptr + row * HEAD_ROW_BYTES + Int64(col) * 2, word, ok)

                # every thread releases its own stage reads; the wgmmas' are complete (wait 0 above)
                cute.arch.mbarrier_arrive(empty + s)
                if cutlass.const_expr(ext):
                    # checkpoint (docs/state_pool.md): the state after a full tile that ends C tokens
                    # past a multiple of C of its sequence goes to slot (end token) // C - 1
                    ck = checkpoint_due(ck_ptr, ck_every, ck_base, start, m)
                    if ck >= 0:
                        _store_state(ck_ptr, (Int64(ck) * H64 + h64) * Int64(D * D), a_s, col_wg, r0, q, final_fp32)

            # -------- Q6 exit: bf16 as is, or fp32 exactly widened
            if cutlass.const_expr(has_final):
                if slot >= 0:
                    if cutlass.const_expr(ext):
                        _store_state(final_ptr, Int64(slot) * slot_stride + h64 * Int64(D * D), a_s, col_wg, r0, q,
                                     final_fp32)
                    else:
                        _store_state(final_ptr, (Int64(slot) * H64 + h64) * Int64(D * D), a_s, col_wg, r0, q,
                                     final_fp32)


def _launch(kernel, n_seq: Int32, n_heads: Int32, value_block: int, stream):
    return kernel.launch(grid=(n_seq * n_heads, 1, D // value_block), block=(regstate_threads(value_block), 1, 1),
                         stream=stream, use_pdl=True, min_blocks_per_mp=1,
                         preferred_smem_carveout=-1)


@cute.jit
def k2_regstate(v: cute.Pointer, out: cute.Pointer, ws_qd: cute.Pointer, ws_kd: cute.Pointer,
                ws_kr: cute.Pointer, ws_gt: cute.Pointer, ws_inv: cute.Pointer, ws_mqk: cute.Pointer,
                ws_bsig: cute.Pointer, seq_start: cute.Pointer, tile_prefix: cute.Pointer, seq_order: cute.Pointer,
                initial_state: cute.Pointer, final_state: cute.Pointer, t_total: Int32, n_seq: Int32,
                n_heads: Int32, cap: Int32, stream: cuda.CUstream,
                has_initial: cutlass.Constexpr[bool], has_final: cutlass.Constexpr[bool],
                state_fp32: cutlass.Constexpr[bool], value_block: cutlass.Constexpr[int]):
    """Serial host entry with K2's arguments (k2_recurrence.k2_recurrence). value_block 64 with the
    producer warp, or 128 with the producer warpgroup (producer_warps says why)."""
    assert value_block in (64, 128)
    table = cute.make_layout(n_seq + 1)
    _launch(_k2_regstate_kernel(
        v.toint(), out.toint(), ws_qd.toint(), ws_kd.toint(), ws_kr.toint(), ws_gt.toint(), ws_inv.toint(),
        ws_mqk.toint(), ws_bsig.toint(), cute.make_tensor(seq_start, table), cute.make_tensor(tile_prefix, table),
        initial_state.toint(), final_state.toint(), cute.make_tensor(seq_start, table), n_heads, cap,
        Int64(0), Int64(0), Int32(0), Int64(0), Int32(0), cute.make_tensor(seq_start, table), n_seq, seq_order.toint(),
        has_initial, has_final, state_fp32, value_block, state_fp32, False, False),
        n_seq, n_heads, value_block, stream)


@cute.jit
def k2_regstate_segments(v: cute.Pointer, out: cute.Pointer, ws_qd: cute.Pointer, ws_kd: cute.Pointer,
                         ws_kr: cute.Pointer, ws_gt: cute.Pointer, ws_inv: cute.Pointer, ws_mqk: cute.Pointer,
                         ws_bsig: cute.Pointer, seg_start: cute.Pointer, seg_prefix: cute.Pointer,
                         carries: cute.Pointer, final_state: cute.Pointer, final_slot: cute.Pointer, t_total: Int32,
                         n_seg: Int32, n_heads: Int32, cap: Int32, stream: cuda.CUstream,
                         final_fp32: cutlass.Constexpr[bool], value_block: cutlass.Constexpr[int]):
    """Segmented host entry with k2_recurrence.k2_segments' arguments (a CP call's K2)."""
    assert value_block in (64, 128)
    table = cute.make_layout(n_seg + 1)
    _launch(_k2_regstate_kernel(
        v.toint(), out.toint(), ws_qd.toint(), ws_kd.toint(), ws_kr.toint(), ws_gt.toint(), ws_inv.toint(),
        ws_mqk.toint(), ws_bsig.toint(), cute.make_tensor(seg_start, table), cute.make_tensor(seg_prefix, table),
        carries.toint(), final_state.toint(), cute.make_tensor(final_slot, cute.make_layout(n_seg)), n_heads, cap,
        Int64(0), Int64(0), Int32(0), Int64(0), Int32(0), cute.make_tensor(seg_start, table), n_seg, Int64(0),
        True, True, True, value_block, final_fp32, True, False),
        n_seg, n_heads, value_block, stream)


@cute.jit
def k2_regstate_ext(v: cute.Pointer, out: cute.Pointer, ws_qd: cute.Pointer, ws_kd: cute.Pointer,
                    ws_kr: cute.Pointer, ws_gt: cute.Pointer, ws_inv: cute.Pointer, ws_mqk: cute.Pointer,
                    ws_bsig: cute.Pointer, seq_start: cute.Pointer, tile_prefix: cute.Pointer,
                    seq_order: cute.Pointer, initial_state: cute.Pointer, final_state: cute.Pointer,
                    final_slot: cute.Pointer, state_index: cute.Pointer, checkpoints: cute.Pointer,
                    real_seq_start: cute.Pointer, slot_stride: Int64, n_pool: Int32, checkpoint_every: Int32,
                    n_real: Int32, t_total: Int32, n_seq: Int32, n_heads: Int32, cap: Int32, stream: cuda.CUstream,
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
        True, True, state_fp32, value_block, final_fp32, segments, True),
        n_seq, n_heads, value_block, stream)
