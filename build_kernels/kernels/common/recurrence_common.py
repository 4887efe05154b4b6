"""What the two K2 kernels (k2_recurrence.py, k2_regstate.py) and CP pre_scan (cp_pre_scan.py)
share: the stage ring, its producer warp, K2's stage layout (both K2s copy the same tiles into the
same places) and the Q2/Q3 and Q5 fragment steps.

It is a module of its own so that no kernel module imports another: pre_scan's S-chain must be
bit-identical to K2 (docs/algorithm.md §4.6 item 2), which holds because both trace these very functions;
pre_scan keeps its own stage layout (offsets, fixed transaction bytes), and each kernel its body.
"""

from typing import Any, NamedTuple, Optional

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from .ptx_ops import (add_rn, bulk_g2s, fma_rn, lds_bf16_f32, ldg_b32, mma_bf16_16816, movmatrix_t, mul_rn, pack_bf16x2,
                      round_bf16x2, sub_rn, unpack_bf16x2)
from ... import shared_constants as ABI_CONSTANTS
from .tile_ops import CHUNK, D, await_previous_grid, bsig_residue_slot0

STAGES = 3
# Value columns per MMA warp, per value_block. Measured on an H200 (H=64, T=8192, us per 16-token tile):
# VB=128: NW 32/16/8 -> 1.92/1.56/1.81; VB=64: NW 16/8 -> 1.30/1.10; VB=32: NW 16/8 -> 1.41/1.12.
_NW = {128: 16, 64: 8, 32: 8}


def mma_warps(vb: int) -> int:
    """MMA warps of a CTA: each owns NW value columns."""
    return vb // _NW[vb]


# Byte sizes of one slot's copy into a stage: the workspace slot sizes (docs/kernel_abi.md), from
# the table the runtime lays the workspace out with.
TILE_BYTES = ABI_CONSTANTS.TILE_IMAGE_BYTES  # one raw 16x128 bf16 image (qd, kd, kr)
GT_BYTES = ABI_CONSTANTS.SLOT["gt"]
SQ_BYTES = ABI_CONSTANTS.SLOT["inv"]  # inv / mqk (16x16 bf16 each)
assert ABI_CONSTANTS.SLOT["mqk"] == SQ_BYTES and ABI_CONSTANTS.SLOT["qd"] == TILE_BYTES
BSIG_BYTES = ABI_CONSTANTS.BSIG_PLANE_BYTES  # one plane of the bsig region: sigma(beta), or its residue
assert ABI_CONSTANTS.SLOT["bsig"] == 2 * BSIG_BYTES
HEAD_ROW_BYTES = D * 2  # one token row of one head in v / out


def v_stride(vb: int) -> int:
    """Bytes per v row in a stage: VB bf16 values padded by 16 B (conflict-free 32-bit reads)."""
    return 2 * vb + 16


# K2's stage layout (bytes): qd | kd | kr | gt | inv | mqk | bsig (+96 pad) | v rows. The mma.sync K2
# (k2_recurrence.py) and the register-state K2 (k2_regstate.py) copy the same tiles into the same
# places; pre_scan has a layout of its own (cp_pre_scan.py).
K2_OFF_QD, K2_OFF_KD, K2_OFF_KR = 0, TILE_BYTES, 2 * TILE_BYTES
K2_OFF_GT = 3 * TILE_BYTES
K2_OFF_INV = K2_OFF_GT + GT_BYTES
K2_OFF_MQK = K2_OFF_INV + SQ_BYTES
K2_OFF_BSIG = K2_OFF_MQK + SQ_BYTES
K2_OFF_V = K2_OFF_BSIG + 128
assert K2_OFF_V - K2_OFF_BSIG >= 2 * BSIG_BYTES  # bsig's pad holds the accurate recipe's residue slot


def bsig_residue_plane(bsig_ptr: Int64, n_heads, cap) -> Int64:
    """The address of the bsig region's second plane (tile_ops.bsig_residue_slot0): the residues
    bf(sigma - bf(sigma)) that numerics="accurate" adds back."""
    return bsig_ptr + bsig_residue_slot0(n_heads, cap) * BSIG_BYTES


def bsig_smalls(off: int, bsig_ptr, n_heads, cap, accurate: bool) -> tuple:
    """The bsig copies of a stage (produce_tile's smalls): sigma(beta) at `off`; with
    numerics="accurate" also its residue at off + 32 (the stage's bsig pad has room)."""
    hi = ((off, bsig_ptr, BSIG_BYTES),)
    if accurate:
        return hi + ((off + BSIG_BYTES, bsig_residue_plane(bsig_ptr, n_heads, cap), BSIG_BYTES),)
    return hi


def k2_stage_bytes(vb: int) -> int:
    return (K2_OFF_V + CHUNK * v_stride(vb) + 127) // 128 * 128


def k2_tile_source(seq, p, h64, vblk, VB: int, rows_by_add: bool = False, accurate: bool = False):
    """The arguments of produce_tile(s) after the ring and the tile index: where tile j of this
    CTA's (sequence, head) comes from (seq: SequenceTiles, p: K2Params), and K2's stage layout. v is
    read in place with its token and head strides v_st, v_sh (elements, Int64; rows of 128 contiguous
    16-byte aligned values). rows_by_add: produce_tile's v-row addressing; accurate: the stage also
    holds the bsig residues (bsig_smalls)."""
    return (seq.tok0, seq.tok_end, h64 * Int64(p.cap) + Int64(seq.tile0),
            p.v_ptr + h64 * p.v_sh * 2 + Int64(vblk * (VB * 2)), p.v_st * 2,
            ((K2_OFF_QD, p.qd_ptr), (K2_OFF_KD, p.kd_ptr), (K2_OFF_KR, p.kr_ptr)),
            ((K2_OFF_GT, p.gt_ptr, GT_BYTES), (K2_OFF_INV, p.inv_ptr, SQ_BYTES), (K2_OFF_MQK, p.mqk_ptr, SQ_BYTES))
            + bsig_smalls(K2_OFF_BSIG, p.bsig_ptr, p.n_heads, p.cap, accurate),
            k2_stage_bytes(VB), K2_OFF_V, v_stride(VB), VB * 2, rows_by_add)


def lds_bsig(sb, off: int, row, accurate: bool):
    """sigma(beta) of a stage row as fp32: the bf16 value, plus (numerics="accurate") its residue
    from the next 32 bytes; the sum of the two bf16 is exact in fp32."""
    b = lds_bf16_f32(sb + off + 2 * row)
    if accurate:
        b = add_rn(b, lds_bf16_f32(sb + off + BSIG_BYTES + 2 * row))
    return b


class K2Params(NamedTuple):
    """The parameters of both K2 kernels (k2_recurrence.py, k2_regstate.py) in the order of their
    PTX .param lists: device pointers as Int64, the sequence (or segment) tables as tensors. What a
    mode or variant has not is None, a compile-time constant the DSL leaves out of the .param list:
    the state pool, index and checkpoint arguments outside the ext variants, final_slot outside a
    segmented K2, seq_order in a segmented K2 (segments run in order), the entry / exit state where
    the variant has none (K2Config.has_initial / has_final). A pointer a mode does pass may still be
    null at run time (seq_order, state_index, checkpoints); the kernel tests those. k2_params is the
    one place that fills this in."""

    v_ptr: Any
    out_ptr: Any
    qd_ptr: Any
    kd_ptr: Any
    kr_ptr: Any
    gt_ptr: Any
    inv_ptr: Any
    mqk_ptr: Any
    bsig_ptr: Any
    mStart: Any  # [n + 1] token offsets of the sequences (or CP segments)
    mPrefix: Any  # [n + 1] their first global tiles
    init_ptr: Any  # entry states (or the CP carries)
    final_ptr: Any
    mSlot: Any  # [n] final_slot of the segments (a segmented K2)
    n_heads: Any
    cap: Any
    idx_ptr: Any  # state_index (ext; null: slot n)
    slot_stride: Any
    n_pool: Any
    ck_ptr: Any  # checkpoint destination (ext; null: none)
    ck_every: Any
    mSeqStart: Any  # [n_real + 1] the real sequences' starts (an ext K2)
    n_real: Any
    order_ptr: Any  # seq_order (null: the sequence order)
    ck_tab: Any
    ck_k: Any
    ck_stride: Any
    v_st: Any
    v_sh: Any


def _address(ptr):
    """A pointer argument as the kernel's Int64 parameter; None (the mode has none) stays None."""
    return None if ptr is None else ptr.toint()


def k2_params(cfg, v, out, workspace: tuple, seq_start, tile_prefix, n_seq, n_heads, cap, v_stride_t, v_stride_h,
              initial_state, final_state, final_slot=None, seq_order=None, state_index=None, slot_stride=None,
              n_pool=None, checkpoints=None, checkpoint_every=None, real_seq_start=None, n_real=None,
              checkpoint_table=None, checkpoint_k=None, checkpoint_stride=None) -> K2Params:
    """A K2 host entry's arguments as the kernel's parameters (host side, traced inline): workspace
    is (ws_qd, ws_kd, ws_kr, ws_gt, ws_inv, ws_mqk, ws_bsig); what a mode does not pass (None), and
    the state pointers the variant's constants leave unread (cfg.has_initial / has_final), are None."""
    table = cute.make_layout(n_seq + 1)
    m_slot = None if final_slot is None else cute.make_tensor(final_slot, cute.make_layout(n_seq))
    m_seq_start = None if real_seq_start is None else cute.make_tensor(real_seq_start, cute.make_layout(n_real + 1))
    return K2Params(v.toint(), out.toint(), *(w.toint() for w in workspace), cute.make_tensor(seq_start, table),
                    cute.make_tensor(tile_prefix, table), _address(initial_state if cfg.has_initial else None),
                    _address(final_state if cfg.has_final else None), m_slot, n_heads, cap, _address(state_index),
                    slot_stride, n_pool, _address(checkpoints), checkpoint_every, m_seq_start, n_real,
                    _address(seq_order), _address(checkpoint_table), checkpoint_k, checkpoint_stride, v_stride_t,
                    v_stride_h)


class SequenceTiles(NamedTuple):
    """Where a K2 CTA's sequence (or CP segment) lies, as flash-attention's SeqlenInfo: tokens
    [tok0, tok_end), global tiles tile0 .. tile0 + ntiles - 1 (docs/kernel_abi.md). The kernels read
    the tile prefix first (it decides whether the CTA has work) and the token offsets once it has."""

    tok0: Any
    tok_end: Any
    tile0: Any
    ntiles: Any

    def tile(self, i):
        """(first token, valid rows m <= CHUNK) of the sequence's tile i."""
        start = self.tok0 + i * CHUNK
        return start, cutlass.min(self.tok_end - start, CHUNK)


@cute.jit
def k2_cta_sequence(n_heads: Int32, order_ptr: Optional[Int64]):
    """(n, h, vblk) of a K2 CTA: one CTA per (sequence, head) pair on grid x, sequence-major, the
    value block on z. The GPU starts CTAs about in block order, so all heads of a sequence start
    together and, through seq_order (the tables kernel's longest-first order; null: identity, for
    segments and dense inputs), the longest sequences first (docs/dispatch_order.md). seq_order is
    read after the wait for the kernel that wrote it."""
    pair, _, vblk = cute.arch.block_idx()
    h = pair % n_heads
    n = pair // n_heads
    await_previous_grid()
    if cutlass.const_expr(order_ptr is not None):
        if order_ptr != Int64(0):
            n = ldg_b32(order_ptr + Int64(n) * 4)
    return n, h, vblk


# Tiles in flight ahead of the one being computed when the MMA warps produce (a folded kernel): tile
# i + FOLDED_PREFETCH goes into the stage tile i - 1 used, which every warp has released by the time
# any warp starts tile i.
FOLDED_PREFETCH = STAGES - 1


def alloc_ring(smem, stage_size: int):
    """The stage ring of K2 and pre_scan in shared memory, allocated first: 2 * STAGES mbarriers
    (full[s], then empty[s]) and STAGES stages of stage_size bytes (each kernel has its own stage
    layout). Returns (full, empty, buffer address); init_ring initialises the barriers once the
    kernel's other buffers are allocated.

    Hand-rolled rather than the DSL's pipeline.PipelineTmaAsync, which would change the PTX and the
    protocol (module docstrings of the kernels): it arms full[s] with a transaction count fixed at
    creation, where a tile's bytes depend on its valid rows m, and releases empty[s] from one
    signalling thread per consumer warp, where every MMA thread arrives (docs/sanitizers.md)."""
    bars = smem.allocate_array(Int64, 2 * STAGES, byte_alignment=8)
    buf = smem.allocate(STAGES * stage_size, byte_alignment=128)
    return bars, bars + STAGES, buf.toint()


@cute.jit
def init_ring(warp: Int32, full: cute.Pointer, empty: cute.Pointer, consumers: cutlass.Constexpr[int]):
    """The stage ring's barriers (full: 1 arrival + tx bytes, empty: `consumers` arrivals, one per
    consumer thread), then a CTA sync."""
    if warp == 0:
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(STAGES):
                cute.arch.mbarrier_init(full + s, 1)
                cute.arch.mbarrier_init(empty + s, consumers)
            cute.arch.mbarrier_init_fence()
    cute.arch.barrier()


def wait_stage_full(full: cute.Pointer, i, s=None):
    """Tile i's stage of the ring (s = i % STAGES, unless the caller formed it already) once its
    copies have landed: the stage's full barrier completes once per round, so round i // STAGES
    waits at that round's parity. Emitted inline."""
    if s is None:
        s = i % STAGES
    cute.arch.mbarrier_wait(full + s, (i // STAGES) & 1)
    return s


def wait_stage_empty(empty: cute.Pointer, i):
    """Tile i's stage once its consumers released round i // STAGES - 1: the parity before this
    round's, which a fresh barrier passes at once (round 0). Emitted inline."""
    s = i % STAGES
    cute.arch.mbarrier_wait(empty + s, ((i // STAGES) & 1) ^ 1)
    return s


@cute.jit
def produce_tile(full: cute.Pointer, empty: cute.Pointer, buf_addr: Int32, i: Int32, tok0: Int32, tok_end: Int32,
                 slot0: Int64, v_row0: Int64, row_step: Int64, images: tuple, smalls: tuple,
                 stage: cutlass.Constexpr[int], off_v: cutlass.Constexpr[int], vstr: cutlass.Constexpr[int],
                 v_bytes: cutlass.Constexpr[int], rows_by_add: cutlass.Constexpr[bool] = False):
    """Tile i of the ring, issued by one whole warp: wait for its stage to be free, arm it with the
    exact bytes of its copies, and issue them (three elected regions: arm + raw images, the small
    per-tile tensors, the m valid v rows).

    images: ((smem offset, global base), ...) of 4 KiB raw tile images; smalls: ((smem offset,
    global base, bytes), ...) of per-slot tensors; v rows start at v_row0 + token * row_step. The
    armed bytes are those copies' (a compile-time sum) plus m * v_bytes.
    rows_by_add: each row's address is the last one's plus row_step, else v_row0 + token * row_step
    per row. The choice moves ptxas's schedule of the whole kernel, so each kernel takes the form
    that measured fastest for it (docs/design.md, "The producer's v-row address, chosen per
    kernel"): the add at the register-state K2's VB=128 (its producer warpgroup then keeps 24
    registers), the product everywhere else (pre_scan ran 7.5% slower with the add, H=12 [32768],
    Nsight Compute).
    """
    s = wait_stage_empty(empty, i)
    start = tok0 + i * CHUNK
    m = cutlass.min(tok_end - start, CHUNK)
    slot = slot0 + Int64(i)
    sb = buf_addr + s * stage
    fb = (full + s).toint()
    fixed_tx = len(images) * TILE_BYTES + sum(nbytes for _, _, nbytes in smalls)
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(full + s, fixed_tx + m * v_bytes)
        for off, base in images:
            bulk_g2s(sb + off, base + slot * TILE_BYTES, TILE_BYTES, fb)
    with cute.arch.elect_one():
        for off, base, nbytes in smalls:
            bulk_g2s(sb + off, base + slot * nbytes, nbytes, fb)
    with cute.arch.elect_one():
        vrow = v_row0 + Int64(start) * row_step
        if cutlass.const_expr(rows_by_add):
            for r in cutlass.range(m, unroll=1):
                bulk_g2s(sb + off_v + r * vstr, vrow, v_bytes, fb)
                vrow = vrow + row_step
        else:
            for r in cutlass.range(m, unroll=1):
                bulk_g2s(sb + off_v + r * vstr, vrow + Int64(r) * row_step, v_bytes, fb)


@cute.jit
def produce_tiles(full: cute.Pointer, empty: cute.Pointer, buf_addr: Int32, ntiles: Int32, tok0: Int32,
                  tok_end: Int32, slot0: Int64, v_row0: Int64, row_step: Int64, images: tuple, smalls: tuple,
                  stage: cutlass.Constexpr[int], off_v: cutlass.Constexpr[int], vstr: cutlass.Constexpr[int],
                  v_bytes: cutlass.Constexpr[int], rows_by_add: cutlass.Constexpr[bool] = False):
    """The producer warp of K2 and pre_scan: every tile in order, each as produce_tile."""
    for i in cutlass.range(ntiles, unroll=1):
        produce_tile(full, empty, buf_addr, i, tok0, tok_end, slot0, v_row0, row_step, images, smalls, stage, off_v,
                     vstr, v_bytes, rows_by_add)


@cute.jit
def produce_first_tiles(warp: Int32, ntiles: Int32, full: cute.Pointer, empty: cute.Pointer, buf_addr: Int32,
                        tile_source: tuple):
    """A folded kernel's first FOLDED_PREFETCH tiles, issued by MMA warp 0 before its entry state
    loads (tile_source: k2_tile_source's tuple)."""
    if warp == 0:
        for t in cutlass.range_constexpr(FOLDED_PREFETCH):
            if t < ntiles:
                produce_tile(full, empty, buf_addr, Int32(t), *tile_source)


@cute.jit
def produce_in_turn(warp: Int32, i: Int32, ntiles: Int32, n_warps: cutlass.Constexpr[int], full: cute.Pointer,
                    empty: cute.Pointer, buf_addr: Int32, tile_source: tuple):
    """A folded kernel at the start of tile i: MMA warp i % n_warps issues tile i + FOLDED_PREFETCH
    into the stage tile i - 1 used, so each warp pays for one tile's copies in n_warps."""
    if warp == i % n_warps:
        if i + FOLDED_PREFETCH < ntiles:
            produce_tile(full, empty, buf_addr, i + FOLDED_PREFETCH, *tile_source)


def _v_values(v_words, zero):
    """The four fp32 v values of a lane's C-fragment (rows g, g + 8): `v_words()` emits the reads of
    the two packed bf16 words where K2 has them; None is pre_scan's M-chain, v = 0."""
    if v_words is None:
        return zero, zero, zero, zero
    vw0, vw1 = v_words()
    v0, v1 = unpack_bf16x2(vw0)
    v2, v3 = unpack_bf16x2(vw1)
    return v0, v1, v2, v3


def solve_u_fragment(acc, v_words, bs0, bs1, a_inv, zero):
    """Q2 + Q3 for one n-block, shared by K2 and pre_scan's two chains (docs/algorithm.md §4.6 needs them
    bit-identical): u = bf(acc), r = bf(bf(v - u) * bsig), U = bf(acc32(INV r)); returns U as the
    B fragment of the next MMAs (movmatrix'd bf16 pairs). `v_words()` emits the reads of the two
    packed v words (rows g and g + 8) where K2 has them; None is pre_scan's M-chain, v = 0."""
    u0, u1 = round_bf16x2(acc[0], acc[1])
    u2, u3 = round_bf16x2(acc[2], acc[3])
    v0, v1, v2, v3 = _v_values(v_words, zero)
    d0, d1 = round_bf16x2(sub_rn(v0, u0), sub_rn(v1, u1))
    d2, d3 = round_bf16x2(sub_rn(v2, u2), sub_rn(v3, u3))
    r_lo = pack_bf16x2(mul_rn(d0, bs0), mul_rn(d1, bs0))
    r_hi = pack_bf16x2(mul_rn(d2, bs1), mul_rn(d3, bs1))
    uu = mma_bf16_16816(a_inv, (movmatrix_t(r_lo), movmatrix_t(r_hi)), (zero, zero, zero, zero))
    return movmatrix_t(pack_bf16x2(uu[0], uu[1])), movmatrix_t(pack_bf16x2(uu[2], uu[3]))


def state_words_step(w0, w1, gam0, gam1, ds):
    """Q5 on one lane's two packed bf16 state words (rows g and g + 8 of an m-block):
    bf(fma(S, gamma, ds)) with fp32 math, shared by K2 and pre_scan's S-chain (docs/algorithm.md §4.6 needs the
    two bit-identical). Returns the new words; the caller keeps them and stores them for Q1."""
    s0, s1 = unpack_bf16x2(w0)
    s2, s3 = unpack_bf16x2(w1)
    return (pack_bf16x2(fma_rn(s0, gam0, ds[0]), fma_rn(s1, gam0, ds[1])),
            pack_bf16x2(fma_rn(s2, gam1, ds[2]), fma_rn(s3, gam1, ds[3])))


# ------------------------------------------------------------------------------------------------
# numerics="accurate" (docs/numerics.md): the same tile step with fp32 kept where FlashKDA rounds to
# bf16 and the rounding costs accuracy. MMA operands stay bf16; an fp32 operand x enters an MMA as
# two bf16 operands, hi = bf(x) and lo = bf(x - hi) (about 16 significant bits), accumulated into
# one fp32 accumulator.


def bf16_b_fragment(c):
    """An fp32 C fragment rounded once to bf16, as the B fragment of the next MMA (movmatrix'd)."""
    return movmatrix_t(pack_bf16x2(c[0], c[1])), movmatrix_t(pack_bf16x2(c[2], c[3]))


def split_b_fragment(c):
    """An fp32 C fragment (rows g, g + 8; columns 2q, 2q + 1) as two bf16 B fragments (hi, lo)
    of the next MMA, movmatrix'd as solve_u_fragment does: x = hi + lo to about 2^-17 relative."""
    h0, h1 = round_bf16x2(c[0], c[1])
    h2, h3 = round_bf16x2(c[2], c[3])
    hi = (movmatrix_t(pack_bf16x2(h0, h1)), movmatrix_t(pack_bf16x2(h2, h3)))
    lo = (movmatrix_t(pack_bf16x2(sub_rn(c[0], h0), sub_rn(c[1], h1))),
          movmatrix_t(pack_bf16x2(sub_rn(c[2], h2), sub_rn(c[3], h3))))
    return hi, lo


def mma_split(a, b_pair, zero):
    """acc32(A (hi + lo)) from zero: the hi product first, then lo accumulated into it (lo None: hi alone)."""
    hi, lo = b_pair
    d = mma_bf16_16816(a, hi, (zero, zero, zero, zero))
    return d if lo is None else mma_bf16_16816(a, lo, d)


# `level` selects another recipe for the ablation kernels that measure what each step costs and
# buys (registry's k2_ablation, docs/numerics.md); 0 is numerics="accurate" (A1-A3 and A5 with
# K1': U rounded once to bf16 for Q4 and Q5):
#   1  A1 only: FlashKDA's Q2-Q4 (u, v - u, r, U and the output rounded as in docs/algorithm.md §2.4)
#   2  A1 + A2 + A5: u unrounded, r and U rounded once to bf16, one output rounding
#   3  the recipe before K1' and the once-rounded U: Q4 and Q5 take U as hi + lo (A4; nine more MMAs per n-block,
#      about 12% of the time; with K1' it buys less than K1' itself, docs/numerics.md)
# The U fragment solve_u_fragment_accurate returns carries its level: a lo half only at level 3, so
# Q4 and Q5 are mma_split of it at every level.
def solve_u_fragment_accurate(acc, v_words, bs0, bs1, a_inv, zero, level: int = 0):
    """Q2 + Q3 of numerics="accurate": r = (v - u) * bsig in fp32 from the unrounded u (FlashKDA
    rounds u and v - u to bf16), U = acc32(INV (r_hi + r_lo)); returns U split as (hi, lo) B
    fragments for Q4 and Q5. v_words as in solve_u_fragment (None: v = 0, the M-chain)."""
    if level == 1:
        return solve_u_fragment(acc, v_words, bs0, bs1, a_inv, zero), None
    v0, v1, v2, v3 = _v_values(v_words, zero)
    r = (mul_rn(sub_rn(v0, acc[0]), bs0), mul_rn(sub_rn(v1, acc[1]), bs0),
         mul_rn(sub_rn(v2, acc[2]), bs1), mul_rn(sub_rn(v3, acc[3]), bs1))
    if level == 2:
        return bf16_b_fragment(mma_bf16_16816(a_inv, bf16_b_fragment(r), (zero, zero, zero, zero))), None
    if level == 3:
        return split_b_fragment(mma_split(a_inv, split_b_fragment(r), zero))
    return bf16_b_fragment(mma_split(a_inv, split_b_fragment(r), zero)), None


def state_f32_step(st, e: int, gam0, gam1, ds):
    """Q5 of numerics="accurate" on one lane's four fp32 master-state values st[e .. e + 3] (rows g,
    g + 8 of an m-block): fma(S, gamma, ds) with no bf16 rounding. Returns the bf16 words of the new
    values (rows g and g + 8), the copy Q1 reads as its MMA operand."""
    for c in range(4):
        st[e + c] = fma_rn(st[e + c], gam0 if c < 2 else gam1, ds[c])
    return pack_bf16x2(st[e], st[e + 1]), pack_bf16x2(st[e + 2], st[e + 3])
