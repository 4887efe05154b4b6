"""K2: the chunk recurrence of KDA prefill (docs/algorithm.md §2.3, 2.4 Q1-Q7, 3.3, 4.8, 6; docs/kernel_abi.md).

Grid (n_seq, n_heads, 128 // VB), VB = value_block in {128, 64, 32}. CTA (n, h, vb) runs every tile
of sequence n for head h and owns the value channels [vb*VB, vb*VB + VB): their rows of the state
S (V x K, kept transposed as S^T[k, v] in bf16 shared memory for the whole sequence) and their
output columns. Tile j of sequence n is global tile tile_prefix[n] + j, workspace slot
h*cap + tile_prefix[n] + j, first token seq_start[n] + 16 j, valid rows m = min(16, seq_start[n+1] - start).
A CTA whose sequence has no tile and which writes no final state (has_final False, or final_slot < 0)
exits at once, without reading its entry state (CP padding segments have no carry).

Thread roles (no store warp: outputs go straight from the MMA warps as predicated stores):
  warps 0..W-1  MMA warps, W = VB / NW with NW = 16 (VB=128, W=8, 288 threads), 8 (VB=64, W=8, 288
             threads) or 8 (VB=32, W=4, 160 threads), chosen by measurement (see _NW). Warp w owns NW
             value columns (NB = NW/8 n-blocks of 8) and the matching slice of S^T; nothing it touches
             in smem state is shared with another warp, so the MMA warps never synchronise with each
             other, only with the producer through the stage barriers.
  warp W     producer: elected lanes arm the stage and issue every bulk copy of a tile (3 elect regions).
             The serial accurate VB=128 kernel has no warp W (K2Config.folded_producer): MMA warp 0 issues the
             first FOLDED_PREFETCH = 2 tiles before the entry state loads, and MMA warp i % W issues tile
             i + 2 at the start of tile i, so that its 8-warp CTAs fit two per SM at 128 registers
             (docs/k2_producer.md).

Per tile, per MMA warp (all fragments in registers; fp32 ops separately rounded, docs/algorithm.md §2.4):
  Q1  u = bf(acc32(Kd S^T)), o1 = bf(acc32(Qd S^T)): 8 k-steps of m16n8k16 per n-block, A from the raw
      Kd/Qd images (ldmatrix.x4, lane address base + 512 kb + 16 lane), B from S^T (ldmatrix.x4.trans)
  Q2  r = bf(bf(v - u) * bsig), v rows >= m forced to 0 (the stage holds only m copied rows)
  Q3  U = bf(acc32(INV r)): r's C fragment -> bf16 pairs -> movmatrix.trans -> B fragment
  Q4  out = bf(bf(o1) + bf(acc32(Mqk U))), predicated 4-byte global stores of rows < m only
  Q5  S^T[k, v] = bf(fma(f32(S^T[k, v]), gamma[k], acc32(Kr^T U)[k, v])), A = Kr^T from the raw Kr
      image (ldmatrix.x4.trans), B = U (the movmatrix'd fragment of Q3). Each lane owns the state words
      at its C-fragment positions for the whole sequence: it keeps them in registers (st_words, loaded
      once after Q6 entry) and writes each new word to shared memory (one 32-bit conflict-free store)
      only for Q1's ldmatrix. Measured on the H200, reading the old word from registers instead of
      shared memory (the kernel is bound by shared-memory throughput): serial H=64 [8192] 0.791 ->
      0.753 ms, 8 x [1024] 0.610 -> 0.570 ms; same values, bit for bit.
  Q6  entry S = bf(initial) (fp32 RNE or bf16 as is) or 0; exit bf16 or exact fp32 widening, written
      by each MMA warp for its own columns even when the sequence has no tile.

Shared memory (bytes):
  state S^T   VB * 128 * 2 (32768 / 16384 / 8192). Warp region of NW columns: 8x8 core matrices of 128
              bytes (rows k, 8 v per row), core (kc, vc) at 128 * (vc + NB * kc).
  stages      STAGES = 3 x STAGE_BYTES, each: qd 4096 | kd 4096 | kr 4096 | gt 512 | inv 512 | mqk 512 |
              bsig 32 (accurate: + its residue 32) (+pad to 128) | v 16 rows x (2 VB + 16) (rows padded by
              16 B: conflict-free 32-bit reads)
              = 18304 / 16256 / 15232 per stage
  barriers    2 * STAGES mbarriers
  total       87856 (VB=128), 65328 (64), 54064 (32) bytes incl. alignment

Pipeline protocol (hand-rolled ring, STAGES stages, tile i uses stage s = i % STAGES, round r = i // STAGES):
  full[s]   arrive count 1. Producer: wait empty[s] at parity (r & 1) ^ 1 (passes at once in round 0),
            then one elected lane does arrive.expect_tx(full[s], 13856 (accurate 13888) + m * 2 VB) and
            issues the copies that complete exactly those bytes on full[s]: qd, kd, kr (4096 each, raw
            images), gt 512, inv 512, mqk 512, bsig 32 (accurate: and its residue, 32) and m rows of v
            (2 VB bytes each). MMA warps wait full[s] at parity r & 1.
  empty[s]  arrive count 32 W. Every MMA thread arrives once after its last read of the stage (end of
            Q5), so each thread's own arrive releases its own reads before the producer's next bulk
            write; an elected arrive after __syncwarp is equivalent on the hardware but racecheck does
            not carry the other lanes' reads through the __syncwarp (docs/sanitizers.md).
  State     Q1 reads other lanes' S^T words (ldmatrix), Q5 then overwrites them: a __syncwarp between
            the two (WAR), and the end-of-tile __syncwarp before the next Q1 (RAW).
  Folded   warp i % W issues tile i + 2 into stage (i + 2) % STAGES = (i - 1) % STAGES at the start
            of tile i, after the same empty wait: every warp released tile i - 1 at its end, so the
            wait is short, and the copies have more than a tile to land.
  Every tile the producer issues is consumed, so no copy is in flight when the CTA exits.
"""

import dataclasses
from typing import Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Float32

from .common.k2_entries import ExtEntry, SegmentsEntry, SerialEntry
from .common.ptx_ops import (add_rn, ldg_bf16_pair, ldg_f32, ldg_f32_pair_bf16, lds_b32, lds_f32, ldsm_x4, ldsm_x4_t,
                             mma_bf16_16816, pack_bf16x2, round_bf16x2, select_b32, stg_b32_if, stg_bf16_pair, stg_f32,
                             stg_f32_pair_from_bf16, sts_b32, unpack_bf16x2)
from .common.recurrence_common import (HEAD_ROW_BYTES, K2_OFF_BSIG, K2_OFF_GT, K2_OFF_INV, K2_OFF_KD, K2_OFF_KR,
                                       K2_OFF_MQK, K2_OFF_QD, K2_OFF_V, STAGES, K2Params, SequenceTiles, alloc_ring,
                                       init_ring, k2_cta_sequence, k2_stage_bytes, k2_tile_source, lds_bsig, mma_split,
                                       mma_warps, produce_first_tiles, produce_in_turn, produce_tiles, solve_u_fragment,
                                       solve_u_fragment_accurate, state_f32_step, state_words_step, v_stride,
                                       wait_stage_full)
from .. import shared_constants as ABI_CONSTANTS
from .common.state_io import checkpoint_origin, checkpoint_target, k2_state_slots
from .common.tile_ops import D


@dataclasses.dataclass(frozen=True)
class K2Config:
    """The static configuration of one mma.sync K2 kernel, and the policy that follows from it.

    value_block: value columns per CTA (VALUE_BLOCKS); accurate: numerics="accurate"
    (docs/numerics.md); segmented: a CP call's K2 (entry states from the fp32 carries, the exit state
    of segment j at final_slot[j]); has_initial / has_final: the state I/O; state_fp32 /
    final_fp32: the entry and the exit state (and checkpoints) in fp32; ext: state I/O by slot
    and checkpoints (docs/state_pool.md); ablation: a partial accurate recipe, for the
    measurement only (recurrence_common.py, level). (value_block, accurate, segmented) first: the
    launch policy depends on nothing else."""

    value_block: int
    accurate: bool = False
    segmented: bool = False
    has_initial: bool = True
    has_final: bool = True
    state_fp32: bool = False
    final_fp32: bool = False
    ext: bool = False
    ablation: int = 0

    def __post_init__(self):
        assert self.value_block in ABI_CONSTANTS.VALUE_BLOCKS, self.value_block
        assert not (self.ext and self.accurate), "the accurate recipe has no state-pool K2"

    @property
    def mma_warps(self) -> int:
        """MMA warps of a CTA: each owns nw value columns (recurrence_common.mma_warps)."""
        return mma_warps(self.value_block)

    @property
    def nw(self) -> int:
        """Value columns per MMA warp."""
        return self.value_block // self.mma_warps

    @property
    def folded_producer(self) -> bool:
        """Whether the MMA warps also produce the tiles (taking turns), in place of a producer warp.

        Only the serial accurate VB=128 kernel. Its fp32 state needs 128 registers per thread, and
        registers are allocated per SM sub-partition (four of 16384, a CTA's warps dealt round-robin),
        so two CTAs per SM fit with 8 warps each (4 per sub-partition) but not with 9 (5 on two of
        them: at most 96 registers, which spills). Issuing copies lengthens a warp's tile, so folding pays
        only where the second CTA per SM does: with more CTAs than SMs. Folded, H=64 [8192] at VB=64
        went from 0.760 to 0.989 ms and the CP rows (segments, fewer CTAs than SMs) lost 6-7%
        (docs/k2_producer.md)."""
        return self.accurate and self.value_block == 128 and not self.segmented

    @property
    def bsig_residue(self) -> bool:
        """Whether Q2 takes sigma(beta) to 16 bits, bf16 plus the residue K1' stores beside it
        (docs/kernel_abi.md, bsig): the accurate recipe; its ablations keep bf16 sigma(beta)."""
        return self.accurate and self.ablation == 0

    @property
    def threads(self) -> int:
        """Threads per K2 CTA: the MMA warps, and the producer warp unless they produce themselves."""
        return 32 * (self.mma_warps + (0 if self.folded_producer else 1))

    @property
    def schedule(self):
        """(hoist, P1, P5): how far ahead of their use the PTX issues K2's shared-memory operand reads.
        hoist: Q2-Q4's operands (INV, Mqk, bsig, v) before Q1; P1: Q1's Kd, Qd and S^T fragments this
        many k-steps ahead; P5: Q5's Kr^T fragment and gamma this many m-blocks ahead. (False, 0, 0)
        is the plain order, each read right before its MMA. ptxas reschedules either way, within the
        registers it allows itself (min_ctas); the table holds what measured faster
        (docs/k2_schedule.md). The accurate recipe keeps the plain order."""
        if self.accurate:
            return False, 0, 0
        return _SCHEDULE.get((self.value_block, self.segmented), (False, 0, 0))

    @property
    def min_ctas(self):
        """The CTAs per SM ptxas may assume for a K2 variant (min_blocks_per_mp, PTX .minnctapersm), or
        None. Given only .reqntid, ptxas holds the default VB=64 kernel at 56 registers and issues each
        ldmatrix right before the MMA that reads it, so the MMA waits out the read (Nsight Compute: 37%
        of K2's warp stall samples were MMAs on the short scoreboard). Told one CTA per SM, which is
        what a VB=64 grid gets (value_split picks VB=64 only for at most one CTA per SM), it takes 96
        registers and reads ahead. VB=128: two CTAs per SM, as its grids have; ptxas then stays at 96
        registers, the most at which two 9-warp CTAs fit (registers are allocated per SM
        sub-partition, docs/k2_producer.md). The accurate recipe has no hint: told two CTAs, ptxas
        caps its folded 8-warp VB=128 kernel at 128 registers and k2_inout_bf16_vb128_acc then spills
        16 bytes; unhinted, every accurate variant fits without a spill."""
        if self.accurate:
            return None
        return _MIN_CTAS.get(self.value_block)

    @property
    def launch_hint(self) -> dict:
        """min_ctas as launch options. The carveout is given (-1: the driver's default) so that
        compiling needs no GPU: without it the DSL asks the device for its shared memory size."""
        n = self.min_ctas
        return {} if n is None else {"min_blocks_per_mp": n, "preferred_smem_carveout": -1}


# (value_block, segmented) -> schedule, measured on the H200 (docs/k2_schedule.md)
_SCHEDULE = {(64, False): (True, 2, 2), (64, True): (True, 2, 2), (128, True): (True, 1, 1)}
_MIN_CTAS = {128: 2, 64: 1}


def _q1_operands(sb, region, kb, off_a, off_sb, NB: int, b_pair):
    """Q1's operands of k-step kb: the Kd and Qd A fragments and the NB S^T B fragments."""
    a_k = ldsm_x4(sb + K2_OFF_KD + 512 * kb + off_a)
    a_q = ldsm_x4(sb + K2_OFF_QD + 512 * kb + off_a)
    bfrags = []
    if NB >= 2:
        for p in range(NB // 2):
            bq = ldsm_x4_t(region + 128 * (2 * p + 2 * NB * kb) + off_sb)
            bfrags += [(bq[0], bq[1]), (bq[2], bq[3])]
    else:
        if kb % 2 == 0:
            b_pair[0] = ldsm_x4_t(region + 256 * kb + off_sb)
        t = kb % 2
        bfrags.append((b_pair[0][2 * t], b_pair[0][2 * t + 1]))
    return a_k, a_q, bfrags


def _q2_q4_operands(sb, off_sq, g, bsig_residue: bool):
    """Q2-Q4's stage operands: the INV and Mqk A fragments, bsig of rows g and g + 8 (with its
    residue: K2Config.bsig_residue)."""
    return (ldsm_x4(sb + K2_OFF_INV + off_sq), ldsm_x4(sb + K2_OFF_MQK + off_sq),
            lds_bsig(sb, K2_OFF_BSIG, g, bsig_residue), lds_bsig(sb, K2_OFF_BSIG, g + 8, bsig_residue))


def _v_words(v_a0, nb, ok0, ok1, VSTR: int):
    """n-block nb's two packed v words (rows g and g + 8), 0 for rows >= m: the stage holds only
    the m copied rows."""
    return (select_b32(ok0, lds_b32(v_a0 + 16 * nb), Int32(0)),
            select_b32(ok1, lds_b32(v_a0 + 8 * VSTR + 16 * nb), Int32(0)))


def _q5_operands(sb, mb, off_kr, g):
    """Q5's operands of m-block mb: the Kr^T A fragment (keys 16 mb ..) and gamma of keys g and g + 8."""
    return (ldsm_x4_t(sb + K2_OFF_KR + 512 * mb + off_kr), lds_f32(sb + K2_OFF_GT + 4 * (16 * mb + g)),
            lds_f32(sb + K2_OFF_GT + 4 * (16 * mb + 8 + g)))


def _store_exit_state(final_ptr, final_base, region, lane, col0, NB: int, NW: int, final_fp32: bool):
    """Q6 exit: this warp's columns of S^T from smem to final_state[slot, h] (V x K), bf16 as is or
    exactly widened to fp32. A plain function (traced inline) so its locals stay out of the kernel's
    dynamic `if` around the call."""
    for jj in range(D // 32):
        k = lane + 32 * jj
        kaddr = region + 128 * NB * (k >> 3) + 16 * (k & 7)
        for p in range(NW // 2):
            word = lds_b32(kaddr + 128 * (p // 4) + 4 * (p % 4))
            e0 = final_base + Int64(col0 + 2 * p) * D + Int64(k)
            if final_fp32:
                stg_f32_pair_from_bf16(final_ptr + e0 * 4, final_ptr + (e0 + D) * 4, word)
            else:
                stg_bf16_pair(final_ptr + e0 * 2, final_ptr + (e0 + D) * 2, word)


def _load_entry_state(init_ptr, state_base, region, lane, col0, NB: int, NW: int, has_initial: bool,
                      state_fp32: bool):
    """Q6 entry: this warp's columns of S^T = bf(initial[slot, h]) (fp32 RNE or bf16 as is), or 0.
    Word (k, v pair p) sits at region + 128 * (vc + NB * kc) + 16 * (k & 7) + 4 * (p & 3). A plain
    function (traced inline), so the state-pool variants can call it inside a dynamic `if`."""
    for jj in range(D // 32):
        k = lane + 32 * jj
        kaddr = region + 128 * NB * (k >> 3) + 16 * (k & 7)
        for p in range(NW // 2):
            waddr = kaddr + 128 * (p // 4) + 4 * (p % 4)
            if has_initial:
                e0 = state_base + Int64(col0 + 2 * p) * D + Int64(k)
                if state_fp32:
                    word = ldg_f32_pair_bf16(init_ptr + e0 * 4, init_ptr + (e0 + D) * 4)
                else:
                    word = ldg_bf16_pair(init_ptr + e0 * 2, init_ptr + (e0 + D) * 2)
                sts_b32(waddr, word)
            else:
                sts_b32(waddr, Int32(0))


def _load_master_state(st, st_words, init_ptr, state_base, col0, g, q, NB: int, from_f32: bool):
    """numerics="accurate" entry: this lane's fp32 master state at its Q5 C-fragment positions
    (st[4 (nb + NB mb) + c] = S^T[16 mb + g + 8 (c >> 1), col0 + 8 nb + 2 q + (c & 1)]): an fp32
    initial state (or carry) read as it is, else the exact widening of the bf16 words already loaded."""
    for mb in range(D // 16):
        for nb in range(NB):
            e = 4 * (nb + NB * mb)
            if from_f32:
                a = state_base + Int64(col0 + 8 * nb + 2 * q) * D + Int64(16 * mb + g)
                for c in range(4):
                    st[e + c] = ldg_f32(init_ptr + (a + Int64(D * (c & 1) + 8 * (c >> 1))) * 4)
            else:
                iw = 2 * (mb * NB + nb)
                st[e], st[e + 1] = unpack_bf16x2(st_words[iw])
                st[e + 2], st[e + 3] = unpack_bf16x2(st_words[iw + 1])


def _store_master_state(st, final_ptr, final_base, col0, g, q, NB: int):
    """numerics="accurate" exit of an fp32 final state: the master values as they are (no bf16 step)."""
    for mb in range(D // 16):
        for nb in range(NB):
            e = 4 * (nb + NB * mb)
            a = final_base + Int64(col0 + 8 * nb + 2 * q) * D + Int64(16 * mb + g)
            for c in range(4):
                stg_f32(final_ptr + (a + Int64(D * (c & 1) + 8 * (c >> 1))) * 4, st[e + c])


class K2Recurrence:
    """The mma.sync K2 kernel of one static configuration (K2Config). The mode classes below put the
    host entry of each mode (common/k2_entries.py, shared with the register-state K2) before it."""

    def __init__(self, config: K2Config):
        self.config = config

    def _launch(self, params: K2Params, n_seq: Int32, n_heads: Int32, stream: cuda.CUstream):
        cfg = self.config
        self.kernel(*params).launch(grid=(n_seq * n_heads, 1, D // cfg.value_block), block=(cfg.threads, 1, 1),
                                    stream=stream, use_pdl=True, **cfg.launch_hint)

    @cute.kernel
    def kernel(self, v_ptr: Int64, out_ptr: Int64, qd_ptr: Int64, kd_ptr: Int64, kr_ptr: Int64, gt_ptr: Int64,
               inv_ptr: Int64, mqk_ptr: Int64, bsig_ptr: Int64, mStart: cute.Tensor, mPrefix: cute.Tensor,
               init_ptr: Optional[Int64], final_ptr: Optional[Int64], mSlot: Optional[cute.Tensor], n_heads: Int32,
               cap: Int32, idx_ptr: Optional[Int64], slot_stride: Optional[Int64], n_pool: Optional[Int32],
               ck_ptr: Optional[Int64], ck_every: Optional[Int32], mSeqStart: Optional[cute.Tensor],
               n_real: Optional[Int32], order_ptr: Optional[Int64], ck_tab: Optional[Int64], ck_k: Optional[Int32],
               ck_stride: Optional[Int64], v_st: Int64, v_sh: Int64):
        """The CTA (n, h, vblk): its stage ring and state buffer, then the roles (module docstring):
        the producer warp (load) and the MMA warps (mma). Parameters: K2Params."""
        cfg = self.config
        p = K2Params(v_ptr, out_ptr, qd_ptr, kd_ptr, kr_ptr, gt_ptr, inv_ptr, mqk_ptr, bsig_ptr, mStart, mPrefix,
                     init_ptr, final_ptr, mSlot, n_heads, cap, idx_ptr, slot_stride, n_pool, ck_ptr, ck_every,
                     mSeqStart, n_real, order_ptr, ck_tab, ck_k, ck_stride, v_st, v_sh)
        LOAD_WARP = cfg.mma_warps  # the producer warp; the folded kernel's CTA has no warp of this index

        n, h, vblk = k2_cta_sequence(n_heads, order_ptr)  # grid and dispatch order (docs/dispatch_order.md)
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()

        smem = cutlass.memory.SmemAllocator()
        full, empty, buf_addr = alloc_ring(smem, k2_stage_bytes(cfg.value_block))
        sstate = smem.allocate(cfg.value_block * D * 2, byte_alignment=128)

        tile0 = mPrefix[n]
        ntiles = mPrefix[n + 1] - tile0
        busy, slot, in_slot = k2_state_slots(n, ntiles, mSlot, idx_ptr, n_pool, init_ptr, final_ptr, cfg.has_final,
                                             cfg.segmented, cfg.ext)
        if busy > 0:
            init_ring(warp, full, empty, 32 * cfg.mma_warps)

            seq = SequenceTiles(mStart[n], mStart[n + 1], tile0, ntiles)
            h64 = Int64(h)
            H64 = Int64(n_heads)

            if warp == LOAD_WARP:
                self.load(p, seq, h64, vblk, full, empty, buf_addr)
            else:
                self.mma(p, seq, warp, lane, n, h64, H64, vblk, full, empty, buf_addr, sstate, slot, in_slot)

    @cute.jit
    def load(self, p: K2Params, seq: SequenceTiles, h64: Int64, vblk: Int32, full: cute.Pointer,
             empty: cute.Pointer, buf_addr: Int32):
        """The producer warp: every tile of the sequence into the ring (none when folded: the MMA
        warps issue them, mma)."""
        if cutlass.const_expr(not self.config.folded_producer):
            produce_tiles(full, empty, buf_addr, seq.ntiles, *k2_tile_source(seq, p, h64, vblk, self.config.value_block,
                                                                              accurate=self.config.bsig_residue))

    @cute.jit
    def mma(self, p: K2Params, seq: SequenceTiles, warp: Int32, lane: Int32, n: Int32, h64: Int64, H64: Int64,
            vblk: Int32, full: cute.Pointer, empty: cute.Pointer, buf_addr: Int32, sstate: cute.Pointer,
            slot: Int32, in_slot: Int32):
        """The MMA warps: the entry state (Q6), every tile's Q1-Q5 with its output and checkpoint, the
        exit state (Q6); folded, also the tiles' copies (module docstring)."""
        cfg = self.config
        VB = cfg.value_block
        MMA_WARPS = cfg.mma_warps
        FOLDED = cfg.folded_producer
        NW = cfg.nw  # value columns per MMA warp
        NB = NW // 8  # n-blocks of 8 per warp
        SB = k2_stage_bytes(VB)
        HOIST = cfg.schedule[0]
        if cutlass.const_expr(FOLDED):
            # the MMA warps produce: warp 0 the first FOLDED_PREFETCH tiles now, overlapping the entry
            # state's load, then warp i % MMA_WARPS tile i + FOLDED_PREFETCH at the start of tile i
            tile_source = k2_tile_source(seq, p, h64, vblk, VB, accurate=cfg.bsig_residue)
            produce_first_tiles(warp, seq.ntiles, full, empty, buf_addr, tile_source)
        w = warp
        g = lane >> 2  # C-fragment row (and row + 8)
        q = lane & 3  # C-fragment column pair
        j4 = lane >> 3  # ldmatrix matrix index supplied by this lane
        i8 = lane & 7  # ldmatrix row supplied by this lane
        region = sstate.toint() + w * (NW * D * 2)
        col0 = vblk * VB + w * NW  # first global value column of this warp
        state_base = (Int64(n) * H64 + h64) * Int64(D * D)  # element index of state[n, h, 0, 0]
        ck_base, ck_targets = checkpoint_origin(cfg, seq, n, p)  # where checkpoints count from

        # lane offsets (bytes)
        off_a = lane * 16  # A operand from a raw image: base + 512 kb + 16 lane
        if cutlass.const_expr(NB >= 2):
            off_sb = 128 * ((j4 >> 1) + NB * (j4 & 1)) + 16 * i8  # + 128 * (2 p + 2 NB kb)
        else:
            off_sb = 16 * lane  # matrices kc = 2 kb .. 2 kb + 3: + 256 kb
        off_kr = 256 * (j4 & 1) + 128 * (j4 >> 1) + 16 * i8  # + 512 mb (transposed Kr^T A operand)
        off_sq = 32 * (8 * (j4 & 1) + i8) + 16 * (j4 >> 1)  # row-major 16x16 A operand

        self.load_entry_state(p, region, lane, col0, state_base, h64, in_slot)
        zero = Float32(0.0)
        st_words, st = self.state_registers(p, region, lane, col0, state_base, g, q)
        for i in cutlass.range(seq.ntiles, unroll=1):
            s = i % STAGES
            if cutlass.const_expr(FOLDED):
                produce_in_turn(warp, i, seq.ntiles, MMA_WARPS, full, empty, buf_addr, tile_source)
            wait_stage_full(full, i, s)
            sb = buf_addr + s * SB
            start, m = seq.tile(i)

            hoisted = None
            if cutlass.const_expr(HOIST):
                # Q2-Q4's operands depend only on the stage: read before Q1, they have landed
                # by the time Q1 ends (docs/k2_schedule.md)
                hoisted = self.q2_q4_operands(sb, off_sq, g, q, w, m)
            acc_u, acc_o = self.q1(sb, region, off_a, off_sb, zero)
            # Q1's ldmatrix read other lanes' S^T words that Q5 overwrites below: the warp's
            # reads are done before any lane writes (racecheck's warp-level WAR hazard).
            cute.arch.sync_warp()
            u_frag = self.q2_q4(p, sb, acc_u, acc_o, hoisted, off_sq, g, q, w, m, start, col0, h64, H64, zero)
            st_words = self.q5(sb, region, lane, off_kr, g, u_frag, st, st_words, zero)

            # state writes visible to the whole warp before the next Q1; every thread releases
            # its own stage reads (empty[s] counts 32 arrivals per MMA warp)
            cute.arch.sync_warp()
            cute.arch.mbarrier_arrive(empty + s)
            if cutlass.const_expr(cfg.ext):
                # checkpoint (docs/state_pool.md): the state after a full tile that ends every C
                # tokens of its sequence, or at one of its given offsets
                ck_dst = checkpoint_target(p.ck_ptr, p.ck_every, ck_base, start, m, ck_targets, p.ck_stride, H64,
                                           h64)
                if ck_dst >= Int64(0):
                    _store_exit_state(p.ck_ptr, ck_dst, region, lane, col0, NB, NW, cfg.final_fp32)

        self.store_exit_state(p, region, lane, col0, g, q, h64, H64, slot, st)

    @cute.jit
    def load_entry_state(self, p: K2Params, region: Int32, lane: Int32, col0: Int32, state_base: Int64, h64: Int64,
                         in_slot: Int32):
        """Q6 entry: S^T[k, v] = bf(initial[n, h, v, k]) or 0, this warp's columns, then a
        __syncwarp before the lanes read each other's words."""
        cfg = self.config
        NW = cfg.nw
        NB = NW // 8
        if cutlass.const_expr(cfg.ext and not cfg.segmented):
            # state I/O by slot (state pool, or a plain state with slot = n): no entry slot -> 0
            if in_slot >= 0:
                _load_entry_state(p.init_ptr, Int64(in_slot) * p.slot_stride + h64 * Int64(D * D), region, lane,
                                  col0, NB, NW, True, cfg.state_fp32)
            else:
                _load_entry_state(p.init_ptr, Int64(0), region, lane, col0, NB, NW, False, cfg.state_fp32)
        else:
            _load_entry_state(p.init_ptr, state_base, region, lane, col0, NB, NW, cfg.has_initial, cfg.state_fp32)
        cute.arch.sync_warp()

    def state_registers(self, p: K2Params, region, lane, col0, state_base, g, q):
        """(st_words, st): this lane's words of S^T at its Q5 C-fragment positions, kept in registers
        across tiles: Q5 reads the old state from here instead of shared memory (the kernel is bound
        by shared memory throughput) and still writes the new one there for Q1's ldmatrix. Same
        values. st: numerics="accurate"'s fp32 master state (None otherwise); shared memory then keeps
        only its bf16 copy, Q1's MMA operand (docs/numerics.md)."""
        cfg = self.config
        NB = cfg.nw // 8
        st_words = []
        for mb in range(D // 16):
            for nb in range(NB):
                w_a0 = region + 128 * (nb + NB * (2 * mb)) + 4 * lane
                st_words.append(lds_b32(w_a0))
                st_words.append(lds_b32(w_a0 + 128 * NB))
        st = None
        if cfg.accurate:
            st = cute.make_rmem_tensor(32 * NB, Float32)
            _load_master_state(st, st_words, p.init_ptr, state_base, col0, g, q, NB, cfg.has_initial and cfg.state_fp32)
        return st_words, st

    def q2_q4_operands(self, sb, off_sq, g, q, w, m):
        """Q2-Q4's stage operands, read ahead of Q1 (schedule's hoist): the INV and Mqk A fragments,
        bsig of rows g and g + 8, the row predicates and the v words of every n-block."""
        NW = self.config.nw
        VSTR = v_stride(self.config.value_block)
        a_inv, a_mqk, bs0, bs1 = _q2_q4_operands(sb, off_sq, g, self.config.bsig_residue)
        ok0 = Int32(g < m)
        ok1 = Int32(g + 8 < m)
        v_a0 = sb + K2_OFF_V + g * VSTR + (w * NW + 2 * q) * 2
        return a_inv, a_mqk, bs0, bs1, ok0, ok1, [_v_words(v_a0, nb, ok0, ok1, VSTR) for nb in range(NW // 8)]

    def q1(self, sb, region, off_a, off_sb, zero):
        """Q1: the u and o1 accumulators, 8 sequential k-steps, operands read P1 k-steps ahead."""
        NB = self.config.nw // 8
        P1 = self.config.schedule[1]
        acc_u = [[zero, zero, zero, zero] for _ in range(NB)]
        acc_o = [[zero, zero, zero, zero] for _ in range(NB)]
        q1_ops = []
        b_pair = [None]  # NB == 1: the .x4.trans read of an even k-step serves the odd one too
        for kb in range(min(P1, D // 16)):
            q1_ops.append(_q1_operands(sb, region, kb, off_a, off_sb, NB, b_pair))
        for kb in range(D // 16):
            if kb + P1 < D // 16:
                q1_ops.append(_q1_operands(sb, region, kb + P1, off_a, off_sb, NB, b_pair))
            a_k, a_q, bfrags = q1_ops[kb]
            for nb in range(NB):
                acc_u[nb] = list(mma_bf16_16816(a_k, bfrags[nb], acc_u[nb]))
                acc_o[nb] = list(mma_bf16_16816(a_q, bfrags[nb], acc_o[nb]))
        return acc_u, acc_o

    def q2_q4(self, p: K2Params, sb, acc_u, acc_o, hoisted, off_sq, g, q, w, m, start, col0, h64, H64, zero):
        """Q2-Q4 per n-block: r, U (returned: the B fragments of Q5) and the output rows < m, as
        predicated 4-byte stores. hoisted: q2_q4_operands' reads, or None to read them here."""
        cfg = self.config
        NW = cfg.nw
        NB = NW // 8
        VSTR = v_stride(cfg.value_block)
        if hoisted is None:
            a_inv, a_mqk, bs0, bs1 = _q2_q4_operands(sb, off_sq, g, self.config.bsig_residue)
            ok0 = Int32(g < m)
            ok1 = Int32(g + 8 < m)
        else:
            a_inv, a_mqk, bs0, bs1, ok0, ok1, v_pre = hoisted
        row0 = Int64(start + g) * H64 + h64
        out_a0 = p.out_ptr + row0 * HEAD_ROW_BYTES + Int64(col0 + 2 * q) * 2
        out_a1 = out_a0 + Int64(8) * H64 * HEAD_ROW_BYTES
        if hoisted is None:
            v_a0 = sb + K2_OFF_V + g * VSTR + (w * NW + 2 * q) * 2
        u_frag = []
        for nb in range(NB):
            if hoisted is not None:
                v_words = lambda: v_pre[nb]  # noqa: E731
            else:  # read where Q2 needs them
                v_words = lambda: _v_words(v_a0, nb, ok0, ok1, VSTR)  # noqa: E731
            if cfg.accurate and cfg.ablation != 1:
                # r as hi + lo into INV r, U rounded once; out = bf(o1 + acc32(Mqk U)), one rounding
                ub = solve_u_fragment_accurate(acc_u[nb], v_words, bs0, bs1, a_inv, zero, cfg.ablation)
                u_frag.append(ub)
                o2 = mma_split(a_mqk, ub, zero)
                ow0 = pack_bf16x2(add_rn(acc_o[nb][0], o2[0]), add_rn(acc_o[nb][1], o2[1]))
                ow1 = pack_bf16x2(add_rn(acc_o[nb][2], o2[2]), add_rn(acc_o[nb][3], o2[3]))
            else:  # FlashKDA's Q2-Q4 (and the ablation kernel with only the state in fp32)
                ub = solve_u_fragment(acc_u[nb], v_words, bs0, bs1, a_inv, zero)
                u_frag.append((ub, None) if cfg.accurate else ub)
                o2 = mma_bf16_16816(a_mqk, ub, (zero, zero, zero, zero))
                o1r0, o1r1 = round_bf16x2(acc_o[nb][0], acc_o[nb][1])
                o1r2, o1r3 = round_bf16x2(acc_o[nb][2], acc_o[nb][3])
                o2r0, o2r1 = round_bf16x2(o2[0], o2[1])
                o2r2, o2r3 = round_bf16x2(o2[2], o2[3])
                ow0 = pack_bf16x2(add_rn(o1r0, o2r0), add_rn(o1r1, o2r1))
                ow1 = pack_bf16x2(add_rn(o1r2, o2r2), add_rn(o1r3, o2r3))
            stg_b32_if(out_a0 + 16 * nb, ow0, ok0)
            stg_b32_if(out_a1 + 16 * nb, ow1, ok1)
        return u_frag

    def q5(self, sb, region, lane, off_kr, g, u_frag, st, st_words, zero):
        """Q5: S^T = bf(fma(S^T, gamma, Kr^T U)), 8 m-blocks of 16 keys, Kr^T and gamma read P5
        m-blocks ahead; each new word into st_words (returned) and shared memory (for Q1)."""
        cfg = self.config
        NB = cfg.nw // 8
        P5 = cfg.schedule[2]
        q5_ops = []
        for mb in range(min(P5, D // 16)):
            q5_ops.append(_q5_operands(sb, mb, off_kr, g))
        for mb in range(D // 16):
            if mb + P5 < D // 16:
                q5_ops.append(_q5_operands(sb, mb + P5, off_kr, g))
            a_kr, gam0, gam1 = q5_ops[mb]
            for nb in range(NB):
                w_a0 = region + 128 * (nb + NB * (2 * mb)) + 4 * lane
                w_a1 = w_a0 + 128 * NB
                if cfg.accurate:
                    ds = mma_split(a_kr, u_frag[nb], zero)
                    wa, wb = state_f32_step(st, 4 * (nb + NB * mb), gam0, gam1, ds)
                    sts_b32(w_a0, wa)
                    sts_b32(w_a1, wb)
                else:
                    ds = mma_bf16_16816(a_kr, u_frag[nb], (zero, zero, zero, zero))
                    iw = 2 * (mb * NB + nb)
                    st_words[iw], st_words[iw + 1] = state_words_step(st_words[iw], st_words[iw + 1], gam0, gam1, ds)
                    sts_b32(w_a0, st_words[iw])
                    sts_b32(w_a1, st_words[iw + 1])
        return st_words

    @cute.jit
    def store_exit_state(self, p: K2Params, region: Int32, lane: Int32, col0: Int32, g: Int32, q: Int32, h64: Int64,
                         H64: Int64, slot: Int32, st):
        """Q6 exit: written by each MMA warp for its own columns, even when the sequence has no tile."""
        cfg = self.config
        NW = cfg.nw
        NB = NW // 8
        if cutlass.const_expr(cfg.has_final):
            if slot >= 0:
                if cutlass.const_expr(cfg.ext):  # never accurate (K2Config asserts it)
                    _store_exit_state(p.final_ptr, Int64(slot) * p.slot_stride + h64 * Int64(D * D), region, lane,
                                      col0, NB, NW, cfg.final_fp32)
                elif cutlass.const_expr(cfg.accurate and cfg.final_fp32):
                    _store_master_state(st, p.final_ptr, (Int64(slot) * H64 + h64) * Int64(D * D), col0, g, q, NB)
                else:  # bf16 (in accurate mode the shared copy is bf(master): the same values)
                    _store_exit_state(p.final_ptr, (Int64(slot) * H64 + h64) * Int64(D * D), region, lane, col0,
                                      NB, NW, cfg.final_fp32)


class K2Serial(SerialEntry, K2Recurrence):
    """Serial K2 (registry entry k2_recurrence): a sequence per CTA, its state I/O as the constants say."""

    def __init__(self, has_initial: bool, has_final: bool, state_fp32: bool, value_block: int,
                 accurate: bool = False, ablation: int = 0):
        super().__init__(K2Config(value_block, accurate, False, has_initial, has_final, state_fp32, state_fp32,
                                  ablation=ablation))


class K2Segments(SegmentsEntry, K2Recurrence):
    """Segmented K2 of a CP call (registry entry k2_segments; docs/algorithm.md §4.5)."""

    def __init__(self, final_fp32: bool, value_block: int, accurate: bool = False):
        super().__init__(K2Config(value_block, accurate, True, True, True, True, final_fp32))


class K2Ext(ExtEntry, K2Recurrence):
    """K2 with state I/O by slot and checkpoints (registry entry k2_ext; docs/state_pool.md),
    serial (segments=False) or segmented (segments=True)."""

    def __init__(self, segments: bool, state_fp32: bool, final_fp32: bool, value_block: int):
        super().__init__(K2Config(value_block, False, segments, True, True, state_fp32, final_fp32, ext=True))


# The registry's entry names (the manifest's, which the runtime looks variants up by): each is the
# class whose __call__ is that host entry, configured from the variant's constants (compile.py).
k2_recurrence, k2_segments, k2_ext = K2Serial, K2Segments, K2Ext
