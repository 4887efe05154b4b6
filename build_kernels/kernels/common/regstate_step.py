"""The MMA warpgroups of the register-state K2 (docs/k2_regstate.md): the entry state, every tile's
step (Q1-Q5, Q4's output, the checkpoints) and the exit state, for a CTA whose tiles arrive through
K2's stage ring (recurrence_common). A module of its own so that every kernel that runs the
register-state step traces the same operations: k2_regstate.py, whose producer copies K1's tiles
into the ring, and any kernel that fills the ring another way.

What each step computes, and why in this order, is k2_regstate.py's docstring. The accurate recipe's
step (numerics="accurate", mma_warpgroups_accurate) follows it, with the fp32 master state of the
mma.sync K2's accurate step in registers beside Q1's bf16 A fragments.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .ptx_ops import (add_rn, fma_rn, ldg_b32, ldg_b32_if, ldg_f32_pair_bf16_if, ldg_v2_f32,
                      lds_bf16_f32_if, lds_v2_f32, ldsm_x4, mma_bf16_16816, movmatrix_t, mul_rn, pack_bf16x2,
                      round_bf16x2, smem_desc, stg_b32, stg_b32_if, stg_v2_f32, sub_rn, unpack_bf16x2, wgmma_commit,
                      wgmma_fence, wgmma_m64n16k16_rs, wgmma_m64n128k16_rs_mn, wgmma_wait)
from .recurrence_common import (HEAD_ROW_BYTES, K2_OFF_BSIG, K2_OFF_GT, K2_OFF_INV, K2_OFF_KD, K2_OFF_KR,
                                K2_OFF_MQK, K2_OFF_QD, K2_OFF_V, K2Params, SequenceTiles, k2_stage_bytes, lds_bsig,
                                v_stride, wait_stage_full)
from .state_io import checkpoint_origin, checkpoint_run_target, checkpoint_runs
from .tile_ops import D

# The stage is K2's (recurrence_common, K2_OFF_*), K1's images as they are. Kd and Qd are K-major
# wgmma B operands (k16 step kb at + 512 kb; 256 bytes between the two 8-key halves, 128 between
# token blocks), Kr an MN-major one (128 bytes between token blocks, 256 between 8-key blocks).
WG_COLS = 64  # value columns per warpgroup (the M of every wgmma)


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


def _lane_layout(warp, lane, vblk, n, h64, H64, VB: int):
    """Where a lane of the MMA warpgroups works, both recipes (emitted inline): (warpgroup, warp
    in it wl, C-fragment row g and column pair q, first value row r0 = 16 wl + g within the
    warpgroup's 64, first global value column of the warpgroup, element index of state[n, h, 0, 0],
    and the lane's ldmatrix.x4 offset in a row-major 16 x 16 (INV, Mqk): matrix j4 = lane >> 3 is
    rows 8 (j4 & 1), columns 8 (j4 >> 1), so n-block nb's B fragment is (f[nb], f[nb + 2]))."""
    wg = warp // 4
    wl = warp % 4
    g = lane >> 2
    q = lane & 3
    r0 = 16 * wl + g
    col_wg = vblk * VB + WG_COLS * wg
    state_base = (Int64(n) * H64 + h64) * Int64(D * D)
    off_sq = 32 * (8 * ((lane >> 3) & 1) + (lane & 7)) + 16 * (lane >> 4)
    return wg, wl, g, q, r0, col_wg, state_base, off_sq


def _next_tile(i, full, buf_addr, SB: int, seq):
    """Tile i of the sequence (SequenceTiles) from the ring, both recipes (emitted inline): wait until
    its stage is full; (stage, its shared address, first token, valid rows)."""
    s = wait_stage_full(full, i)
    sb = buf_addr + s * SB
    return (s, sb) + seq.tile(i)


def _q1_chains(a_s, sb, zero):
    """Q1 of one tile, both recipes (emitted inline): u^T = S Kd^T and o1^T = S Qd^T as two
    m64n16k16 chains over the state's A fragments a_s and the stage's raw Kd / Qd images, each its
    own commit group (the caller waits for u^T first). Returns (a_s as fenced, acc_u, acc_o)."""
    a_s, acc = wgmma_fence(a_s, [zero] * 16)
    acc_u = acc[:8]
    acc_o = acc[8:]
    desc_kd = smem_desc(sb + K2_OFF_KD, 256, 128)
    desc_qd = smem_desc(sb + K2_OFF_QD, 256, 128)
    for kb in range(D // 16):  # a plain helper: Python's loop unrolls at trace time
        # + 512 bytes per k16 step: + 32 in the descriptor's address field
        acc_u = wgmma_m64n16k16_rs(acc_u, a_s[4 * kb:4 * kb + 4], desc_kd + Int64(32 * kb), kb > 0)
    wgmma_commit()
    for kb in range(D // 16):  # a plain helper: Python's loop unrolls at trace time
        acc_o = wgmma_m64n16k16_rs(acc_o, a_s[4 * kb:4 * kb + 4], desc_qd + Int64(32 * kb), kb > 0)
    wgmma_commit()
    return a_s, acc_u, acc_o


def _stage_operands(sb, off_sq, q, wg, r0, m, VSTR: int, bsig_residue: bool = False):
    """A tile's stage-only operands, read while Q1 runs: the INV and Mqk B fragments, bsig, v^T and
    gamma. u^T's element c = 4 j + hh is (value row r0 + 8 (hh >> 1), token 8 j + 2q + (hh & 1));
    bs[2 j + x] is bsig of token 8 j + 2q + x; gam[4 kb + 2 half + x] is gamma of key 16 kb + 8 half
    + 2q + x. v rows >= m read as 0 (the stage holds only the m copied rows). bsig_residue: bsig
    with its residue (numerics="accurate", recurrence_common.lds_bsig)."""
    f_inv = ldsm_x4(sb + K2_OFF_INV + off_sq)
    f_mqk = ldsm_x4(sb + K2_OFF_MQK + off_sq)
    bs = [lds_bsig(sb, K2_OFF_BSIG, 8 * (x >> 1) + 2 * q + (x & 1), bsig_residue) for x in range(4)]
    vv = []
    for c in range(8):
        t = 8 * (c // 4) + 2 * q + (c & 1)
        vcol = WG_COLS * wg + r0 + 8 * ((c % 4) >> 1)
        vv.append(lds_bf16_f32_if(sb + K2_OFF_V + t * VSTR + vcol * 2, Int32(t < m)))
    gam = []
    for kb in range(D // 16):
        for half in range(2):
            gam += list(lds_v2_f32(sb + K2_OFF_GT + 4 * (16 * kb + 8 * half + 2 * q)))
    return f_inv, f_mqk, bs, vv, gam


def _q2_q3(acc_u, vv, bs, f_inv, zero):
    """Q2 and Q3 of FlashKDA's recipe (emitted inline): r^T = bf(bf(v^T - bf(u^T)) * bsig) on u^T's
    accumulator, then U^T = bf(acc32(r^T INV^T)) for token blocks 0 and 1; returns U^T's A fragment.
    A-fragment word 2 j + hp of r^T is (value row r0 + 8 hp, tokens 8 j + 2q, + 1), accumulator
    elements 4 j + 2 hp, + 1."""
    a_r = []
    for j in range(2):
        for hp in range(2):
            c = 4 * j + 2 * hp
            u0, u1 = round_bf16x2(acc_u[c], acc_u[c + 1])
            d0, d1 = round_bf16x2(sub_rn(vv[c], u0), sub_rn(vv[c + 1], u1))
            a_r.append(pack_bf16x2(mul_rn(d0, bs[2 * j]), mul_rn(d1, bs[2 * j + 1])))
    uu = list(mma_bf16_16816(a_r, (f_inv[0], f_inv[2]), (zero, zero, zero, zero))) + \
        list(mma_bf16_16816(a_r, (f_inv[1], f_inv[3]), (zero, zero, zero, zero)))
    return [pack_bf16x2(uu[4 * j + 2 * hp], uu[4 * j + 2 * hp + 1]) for j in range(2) for hp in range(2)]


def _q5_chain(a_u, a_s, acc_o, sb, zero):
    """Q5's product, both recipes (emitted inline): acc32(U^T Kr) as one m64n128k16, then the wait
    for it and for o1's chain. Returns (a_u, a_s, d5, acc_o) as the wait hands them back."""
    a_u, d5 = wgmma_fence(a_u, [zero] * 64)
    d5 = wgmma_m64n128k16_rs_mn(d5, a_u, smem_desc(sb + K2_OFF_KR, 128, 256))
    wgmma_commit()
    words, floats = wgmma_wait(0, a_u + a_s, d5 + acc_o)  # Q5 and o1's chain done
    return words[:4], words[4:], floats[:64], floats[64:]


def _q4_store(out_ptr, a_u, f_mqk, acc_o, start, m, g, q, wl, col_wg, h64, H64, zero, accurate: bool):
    """Q4, both recipes (emitted inline): o2^T = acc32(U^T Mqk^T) for token blocks 0 and 1, out =
    bf(bf(o1) + bf(o2)) (FlashKDA) or bf(o1 + o2) (accurate: one rounding). Word (j, hp) holds (value
    row r0 + 8 hp, tokens 8 j + 2q, + 1); movmatrix makes it (token 8 j + g, value rows 16 wl + 8 hp
    + 2q, + 1), one 4-byte store of a token row as K2 stores them, rows < m only."""
    o2 = list(mma_bf16_16816(a_u, (f_mqk[0], f_mqk[2]), (zero, zero, zero, zero))) + \
        list(mma_bf16_16816(a_u, (f_mqk[1], f_mqk[3]), (zero, zero, zero, zero)))
    for j in range(2):
        row = Int64(start + 8 * j + g) * H64 + h64
        ok = Int32(8 * j + g < m)
        for hp in range(2):
            c = 4 * j + 2 * hp
            if accurate:
                word = movmatrix_t(pack_bf16x2(add_rn(acc_o[c], o2[c]), add_rn(acc_o[c + 1], o2[c + 1])))
            else:
                o1a, o1b = round_bf16x2(acc_o[c], acc_o[c + 1])
                o2a, o2b = round_bf16x2(o2[c], o2[c + 1])
                word = movmatrix_t(pack_bf16x2(add_rn(o1a, o2a), add_rn(o1b, o2b)))
            col = col_wg + 16 * wl + 8 * hp + 2 * q
            stg_b32_if(out_ptr + row * HEAD_ROW_BYTES + Int64(col) * 2, word, ok)


def _tile_step(p: K2Params, i, a_s, full, empty, buf_addr, SB: int, VSTR: int, seq: SequenceTiles, off_sq, q, wg,
               r0, g, wl, col_wg, h64, H64, zero):
    """Tile i of the default recipe's register-state step (emitted inline): Q1-Q5 on the state's A
    fragments a_s, the output tile, and the stage released; returns the new a_s. A plain function:
    its loops unroll as Python's."""
    s, sb, start, m = _next_tile(i, full, buf_addr, SB, seq)

    # -------- Q1: u^T's chain, then o1^T's, each its own commit group
    a_s, acc_u, acc_o = _q1_chains(a_s, sb, zero)

    # stage-only operands, read while Q1 runs (_stage_operands: which element is which)
    f_inv, f_mqk, bs, vv, gam = _stage_operands(sb, off_sq, q, wg, r0, m, VSTR)

    acc_u = wgmma_wait(1, [], acc_u)[1]  # u^T's group done (o1's may still run)
    # -------- Q2, Q3: U^T = bf(acc32(r^T INV^T))
    a_u = _q2_q3(acc_u, vv, bs, f_inv, zero)
    # -------- Q5: S = bf(fma(S, gamma, acc32(U^T Kr))), one m64n128k16
    a_u, a_s, d5, acc_o = _q5_chain(a_u, a_s, acc_o, sb, zero)
    # accumulator element 8 kb + 2 e + x sits where half x of a_s[4 kb + e] does
    for kb in range(D // 16):
        for e in range(4):
            s0, s1 = unpack_bf16x2(a_s[4 * kb + e])
            gi = 4 * kb + 2 * (e >> 1)
            a_s[4 * kb + e] = pack_bf16x2(fma_rn(s0, gam[gi], d5[8 * kb + 2 * e]),
                                          fma_rn(s1, gam[gi + 1], d5[8 * kb + 2 * e + 1]))
    # -------- Q4, off the chain: out = bf(bf(o1) + bf(acc32(Mqk U)))
    _q4_store(p.out_ptr, a_u, f_mqk, acc_o, start, m, g, q, wl, col_wg, h64, H64, zero, False)

    # every thread releases its own stage reads; the wgmmas' are complete (wait 0 above)
    cute.arch.mbarrier_arrive(empty + s)
    return a_s


@cute.jit
def mma_warpgroups(cfg, p: K2Params, seq: SequenceTiles, warp: Int32, lane: Int32, vblk: Int32, n: Int32, h64: Int64,
                   H64: Int64, full: cute.Pointer, empty: cute.Pointer, buf_addr: Int32, slot: Int32, in_slot: Int32):
    """The MMA warps' whole part of a register-state K2 CTA (warp < 4 VB / 64): every tile of its
    (sequence or segment, head) from the ring, in order; the modes and state I/O of K2's kernel
    (cfg: k2_regstate.RegstateConfig; p: the kernel's parameters). Each thread arrives once on
    empty[s] per tile it has consumed."""
    VB = cfg.value_block
    VSTR = v_stride(VB)
    SB = k2_stage_bytes(VB)
    wg, wl, g, q, r0, col_wg, state_base, off_sq = _lane_layout(warp, lane, vblk, n, h64, H64, VB)
    zero = Float32(0.0)

    ck_base, ck_targets = checkpoint_origin(cfg, seq, n, p)  # where checkpoints count from

    # -------- Q6 entry: the state as Q1's A fragments, a_s[4 kb + e]; bf(initial) or 0
    if cutlass.const_expr(cfg.ext and not cfg.segmented):
        # by slot (state pool, or a plain state with slot = n): no entry slot -> 0
        a_s = _load_state(p.init_ptr, Int64(cutlass.max(in_slot, 0)) * p.slot_stride + h64 * Int64(D * D),
                          Int32(in_slot >= 0), col_wg, r0, q, cfg.state_fp32)
    elif cutlass.const_expr(cfg.has_initial):
        a_s = _load_state(p.init_ptr, state_base, Int32(1), col_wg, r0, q, cfg.state_fp32)
    else:
        a_s = [Int32(0)] * 32

    if cutlass.const_expr(cfg.ext):
        # checkpoints (docs/state_pool.md) between runs of tiles, so that the tile loop itself is
        # the plain one: run r < n_ck ends with the tile after which checkpoint r is stored
        n_ck, ck_first, ck_step, ck_k_first = checkpoint_runs(p.ck_ptr, p.ck_every, ck_base, seq.tok0, seq.tok_end,
                                                              ck_targets)
        lo = Int32(0)
        for r in cutlass.range(n_ck + 1, unroll=1):
            hi = seq.ntiles
            if r < n_ck:
                hi = ck_first + r * ck_step
            for i in cutlass.range(lo, hi, unroll=1):
                a_s = _tile_step(p, i, a_s, full, empty, buf_addr, SB, VSTR, seq, off_sq, q, wg, r0, g, wl, col_wg,
                                 h64, H64, zero)
            lo = hi
            if r < n_ck:
                ck_dst = checkpoint_run_target(p.ck_every, r, ck_k_first, hi, seq.tok0, ck_targets, p.ck_stride, H64,
                                               h64)
                _store_state(p.ck_ptr, ck_dst, a_s, col_wg, r0, q, cfg.final_fp32)
    else:
        for i in cutlass.range(seq.ntiles, unroll=1):
            a_s = _tile_step(p, i, a_s, full, empty, buf_addr, SB, VSTR, seq, off_sq, q, wg, r0, g, wl, col_wg, h64,
                             H64, zero)

    # -------- Q6 exit: bf16 as is, or fp32 exactly widened
    if cutlass.const_expr(cfg.has_final):
        if slot >= 0:
            if cutlass.const_expr(cfg.ext):
                _store_state(p.final_ptr, Int64(slot) * p.slot_stride + h64 * Int64(D * D), a_s, col_wg, r0, q,
                             cfg.final_fp32)
            else:
                _store_state(p.final_ptr, (Int64(slot) * H64 + h64) * Int64(D * D), a_s, col_wg, r0, q,
                             cfg.final_fp32)


# ------------------------------------------------------------------------------------------------
# numerics="accurate" (docs/numerics.md): the mma.sync K2's accurate step (k2_recurrence.py with
# accurate=True), transposed as above. The state's fp32 master lives in the lanes that update it,
# at its accumulator positions (st[8 kb + 2 e + x] is half x of a_s[4 kb + e]); a_s, Q1's A operand,
# is bf(master), as the mma.sync K2's shared copy is.


def _load_master(init_ptr, base, col_wg, r0, q, fp32: bool):
    """numerics="accurate" entry: (master, a_s). An fp32 state (or carry) read as it is, a_s its RNE
    bf16 pairs; a bf16 state's words as they are, the master their exact widening."""
    st = []
    words = []
    for kb in range(D // 16):
        for e in range(4):
            e0 = base + _state_word_offset(col_wg, r0, q, kb, e)
            if fp32:
                lo, hi = ldg_v2_f32(init_ptr + e0 * 4)
                words.append(pack_bf16x2(lo, hi))
            else:
                words.append(ldg_b32(init_ptr + e0 * 2))
                lo, hi = unpack_bf16x2(words[-1])
            st += [lo, hi]
    return st, words


def _store_master(ptr, base, st, col_wg, r0, q):
    """numerics="accurate" exit of an fp32 final state: the master values as they are."""
    for kb in range(D // 16):
        for e in range(4):
            e0 = base + _state_word_offset(col_wg, r0, q, kb, e)
            stg_v2_f32(ptr + e0 * 4, st[8 * kb + 2 * e], st[8 * kb + 2 * e + 1])


@cute.jit
def mma_warpgroups_accurate(cfg, p: K2Params, seq: SequenceTiles, warp: Int32, lane: Int32, vblk: Int32, n: Int32,
                            h64: Int64, H64: Int64, full: cute.Pointer, empty: cute.Pointer, buf_addr: Int32,
                            slot: Int32):
    """mma_warpgroups in numerics="accurate": the serial and segmented modes (no state pool), the
    arithmetic of the mma.sync K2's accurate step element for element:
      Q1  u^T, o1^T as in FlashKDA's recipe, from a_s = bf(master)
      Q2  r^T = (v^T - u^T) * bsig in fp32 (u not rounded), split hi = bf(r), lo = bf(r - hi)
      Q3  U^T = bf(acc32(hi INV^T, then lo INV^T into the same accumulator))
      Q5  master = fma(master, gamma, acc32(U^T Kr)), a_s = bf(master)
      Q4  out^T = bf(o1^T + acc32(U^T Mqk^T)), one rounding
    Exit: the master as it is (fp32) or a_s (bf16)."""
    VB = cfg.value_block
    VSTR = v_stride(VB)
    SB = k2_stage_bytes(VB)
    wg, wl, g, q, r0, col_wg, state_base, off_sq = _lane_layout(warp, lane, vblk, n, h64, H64, VB)
    zero = Float32(0.0)

    # -------- Q6 entry: the fp32 master st and Q1's A fragments a_s = bf(st); 0 without a state
    if cutlass.const_expr(cfg.has_initial):
        st, a_s = _load_master(p.init_ptr, state_base, col_wg, r0, q, cfg.state_fp32)
    else:
        st = [zero] * 64
        a_s = [Int32(0)] * 32

    for i in cutlass.range(seq.ntiles, unroll=1):
        s, sb, start, m = _next_tile(i, full, buf_addr, SB, seq)

        # -------- Q1: u^T's chain, then o1^T's, each its own commit group
        a_s, acc_u, acc_o = _q1_chains(a_s, sb, zero)

        f_inv, f_mqk, bs, vv, gam = _stage_operands(sb, off_sq, q, wg, r0, m, VSTR, bsig_residue=True)

        acc_u = wgmma_wait(1, [], acc_u)[1]

        # -------- Q2 in fp32 on u^T's accumulator, r^T as hi + lo A fragments (word 2 j + hp:
        # value row r0 + 8 hp, tokens 8 j + 2q, + 1)
        a_hi = []
        a_lo = []
        for j in cutlass.range_constexpr(2):
            for hp in cutlass.range_constexpr(2):
                c = 4 * j + 2 * hp
                r_a = mul_rn(sub_rn(vv[c], acc_u[c]), bs[2 * j])
                r_b = mul_rn(sub_rn(vv[c + 1], acc_u[c + 1]), bs[2 * j + 1])
                h_a, h_b = round_bf16x2(r_a, r_b)
                a_hi.append(pack_bf16x2(h_a, h_b))
                a_lo.append(pack_bf16x2(sub_rn(r_a, h_a), sub_rn(r_b, h_b)))

        # -------- Q3: U^T = bf(acc32(r_hi^T INV^T + r_lo^T INV^T)), token blocks 0 and 1
        uu = []
        for tb in cutlass.range_constexpr(2):
            d3 = mma_bf16_16816(a_hi, (f_inv[tb], f_inv[tb + 2]), (zero, zero, zero, zero))
            uu += list(mma_bf16_16816(a_lo, (f_inv[tb], f_inv[tb + 2]), d3))
        a_u = [pack_bf16x2(uu[4 * j + 2 * hp], uu[4 * j + 2 * hp + 1]) for j in range(2) for hp in range(2)]

        # -------- Q5: master = fma(master, gamma, acc32(U^T Kr)), one m64n128k16
        a_u, _, d5, acc_o = _q5_chain(a_u, a_s, acc_o, sb, zero)
        # accumulator element 8 kb + 2 e + x sits where st[8 kb + 2 e + x] does
        new_st = []
        a_s = []
        for kb in cutlass.range_constexpr(D // 16):
            for e in cutlass.range_constexpr(4):
                gi = 4 * kb + 2 * (e >> 1)
                x0 = 8 * kb + 2 * e
                s0 = fma_rn(st[x0], gam[gi], d5[x0])
                s1 = fma_rn(st[x0 + 1], gam[gi + 1], d5[x0 + 1])
                new_st += [s0, s1]
                a_s.append(pack_bf16x2(s0, s1))
        st = new_st

        # -------- Q4: out = bf(o1 + acc32(Mqk U)), one rounding, stored as mma_warpgroups stores it
        _q4_store(p.out_ptr, a_u, f_mqk, acc_o, start, m, g, q, wl, col_wg, h64, H64, zero, True)

        cute.arch.mbarrier_arrive(empty + s)

    # -------- Q6 exit: the master (fp32) or its bf16 words
    if cutlass.const_expr(cfg.has_final):
        if slot >= 0:
            if cutlass.const_expr(cfg.final_fp32):
                _store_master(p.final_ptr, (Int64(slot) * H64 + h64) * Int64(D * D), st, col_wg, r0, q)
            else:
                _store_state(p.final_ptr, (Int64(slot) * H64 + h64) * Int64(D * D), a_s, col_wg, r0, q, False)
