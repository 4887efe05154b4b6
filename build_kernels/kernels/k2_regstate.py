"""K2 with the state in registers: the chunk recurrence as warpgroup MMAs (docs/k2_regstate.md: what
it measured and when the planner picks it; docs/speed_limits.md, "A register-state wgmma step").

The same recipe, arguments, grid order and stage ring as K2 (k2_recurrence.py), bit for bit the same
results (tests/gpu/test_k2_regstate.py), with every product of the tile step computed transposed
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

Grid (n_seq * n_heads, 1, 128 // VB), VB in REGSTATE_VALUE_BLOCKS (64, 128: build_kernels/shared_constants.py);
CTA: VB // 64 warpgroups of MMA warps, then the producer
(recurrence_common.produce_tiles, K2's stage layout): one warp at VB = 64, a warpgroup at VB = 128
that keeps 24 registers per thread and hands the rest to the MMA warpgroups (setmaxnreg), whose one
warp issues the copies (RegstateConfig.producer_warps says why; docs/k2_regstate.md has what each
form measured).
Warpgroup wg owns the value columns vblk * VB + 64 wg .. + 63; lane (g, q) of its warp wl holds
value rows 16 wl + g and + 8 of every m64 fragment. Every mode of K2's kernel: serial with every
state I/O (K2RegstateSerial, registry entry k2_regstate), CP segments (K2RegstateSegments,
k2_regstate_segments) and state pool with checkpoints (K2RegstateExt, k2_regstate_ext), each with
the arguments of K2's host entry of the same mode. With accurate=True
(numerics="accurate", serial and segments: the recipe has no state pool) the MMA warpgroups run
regstate_step.mma_warpgroups_accurate, the accurate mma.sync K2's arithmetic on the same products:
the fp32 master state in registers at Q5's accumulator positions, Q1 reading its bf16 pairs.

Order within a step (what ptxas made of the others, seen in the SASS of the probe): o1's chain is
waited for only with Q5's, so that its eight k-steps, queued on the tensor cores between u's and
Q5, stay off the chain; Q4's MMAs come after Q5's wait (issued while Q5 may still read U^T, ptxas
gave their results U^T's registers and waited for Q5 right there).
"""

import dataclasses
from typing import Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from .. import shared_constants as ABI_CONSTANTS
from .common.k2_entries import ExtEntry, SegmentsEntry, SerialEntry
from .common.recurrence_common import (K2Params, SequenceTiles, alloc_ring, init_ring, k2_cta_sequence, k2_stage_bytes,
                                       k2_tile_source, produce_tiles)
from .common.regstate_step import WG_COLS, mma_warpgroups, mma_warpgroups_accurate
from .common.state_io import k2_state_slots
from .common.tile_ops import D

# The producer warpgroup's registers per thread after the trade (setmaxnreg's least; one warp issues
# the copies and needs no more), and what the VB=128 MMA warpgroups take: with 232 (and 40 for the
# producer) the variants that load an entry state spilled 16 bytes.
PRODUCER_REGS = 24
MMA_REGS = 240


@dataclasses.dataclass(frozen=True)
class RegstateConfig:
    """The static configuration of one register-state K2 kernel, and the policy that follows from it:
    the fields of k2_recurrence.K2Config (the same modes and state I/O) but the ablation, at the
    value blocks of ABI_CONSTANTS.REGSTATE_VALUE_BLOCKS, the one statement of where this K2 exists
    (the registry builds its twins there)."""

    value_block: int
    accurate: bool = False
    segmented: bool = False
    has_initial: bool = True
    has_final: bool = True
    state_fp32: bool = False
    final_fp32: bool = False
    ext: bool = False

    def __post_init__(self):
        assert self.value_block in ABI_CONSTANTS.REGSTATE_VALUE_BLOCKS, self.value_block
        assert not (self.ext and self.accurate), "the accurate recipe has no state-pool K2"

    @property
    def mma_warps(self) -> int:
        """4 MMA warps (a warpgroup) per 64 value columns."""
        return 4 * (self.value_block // WG_COLS)

    @property
    def producer_warps(self) -> int:
        """Registers are allocated per SM sub-partition (four of 16384, a CTA's warps dealt round-robin).
        At VB=64 a CTA of 4 MMA warps and one producer warp runs alone on its SM at 217-227 registers.
        At VB=128 a ninth warp would put three warps on one sub-partition, so ptxas caps the kernel at
        168 registers and it spills. So VB=128 has a producer warpgroup: 12 warps launched at 168, three
        per sub-partition, and after the trade 2 x MMA_REGS + PRODUCER_REGS = 504 = 3 x 168 there.
        (Without a producer, the MMA warps taking turns with the copies, both VBs measured slower.)"""
        return 1 if self.value_block == WG_COLS else 4

    @property
    def producer_warpgroup(self) -> bool:
        """Whether the producer is a warpgroup, which trades its registers to the MMA warpgroups."""
        return self.producer_warps == 4

    @property
    def threads(self) -> int:
        """The MMA warps, then the producer (producer_warps)."""
        return 32 * (self.mma_warps + self.producer_warps)


class K2Regstate:
    """The register-state K2 kernel of one static configuration (RegstateConfig). The mode classes
    below put the host entry of each mode (common/k2_entries.py, the mma.sync K2's entries) before it."""

    def __init__(self, config: RegstateConfig):
        self.config = config

    def _launch(self, params: K2Params, n_seq: Int32, n_heads: Int32, stream: cuda.CUstream):
        cfg = self.config
        self.kernel(*params).launch(grid=(n_seq * n_heads, 1, D // cfg.value_block), block=(cfg.threads, 1, 1),
                                    stream=stream, use_pdl=True, min_blocks_per_mp=1, preferred_smem_carveout=-1)

    @cute.kernel
    def kernel(self, v_ptr: Int64, out_ptr: Int64, qd_ptr: Int64, kd_ptr: Int64, kr_ptr: Int64, gt_ptr: Int64,
               inv_ptr: Int64, mqk_ptr: Int64, bsig_ptr: Int64, mStart: cute.Tensor, mPrefix: cute.Tensor,
               init_ptr: Optional[Int64], final_ptr: Optional[Int64], mSlot: Optional[cute.Tensor], n_heads: Int32,
               cap: Int32, idx_ptr: Optional[Int64], slot_stride: Optional[Int64], n_pool: Optional[Int32],
               ck_ptr: Optional[Int64], ck_every: Optional[Int32], mSeqStart: Optional[cute.Tensor],
               n_real: Optional[Int32], order_ptr: Optional[Int64], ck_tab: Optional[Int64], ck_k: Optional[Int32],
               ck_stride: Optional[Int64], v_st: Int64, v_sh: Int64):
        """K2's kernel parameters (recurrence_common.K2Params) and modes (k2_recurrence.K2Recurrence):
        the CTA's ring, then the roles: the producer (load) and the MMA warpgroups (mma)."""
        cfg = self.config
        p = K2Params(v_ptr, out_ptr, qd_ptr, kd_ptr, kr_ptr, gt_ptr, inv_ptr, mqk_ptr, bsig_ptr, mStart, mPrefix,
                     init_ptr, final_ptr, mSlot, n_heads, cap, idx_ptr, slot_stride, n_pool, ck_ptr, ck_every,
                     mSeqStart, n_real, order_ptr, ck_tab, ck_k, ck_stride, v_st, v_sh)

        n, h, vblk = k2_cta_sequence(n_heads, order_ptr)  # K2's grid and dispatch order
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()

        smem = cutlass.memory.SmemAllocator()
        full, empty, buf_addr = alloc_ring(smem, k2_stage_bytes(cfg.value_block))

        tile0 = mPrefix[n]
        ntiles = mPrefix[n + 1] - tile0
        busy, slot, in_slot = k2_state_slots(n, ntiles, mSlot, idx_ptr, n_pool, init_ptr, final_ptr, cfg.has_final,
                                             cfg.segmented, cfg.ext)
        if busy > 0:
            init_ring(warp, full, empty, 32 * cfg.mma_warps)
            seq = SequenceTiles(mStart[n], mStart[n + 1], tile0, ntiles)
            h64 = Int64(h)
            H64 = Int64(n_heads)

            tile_source = k2_tile_source(seq, p, h64, vblk, cfg.value_block, rows_by_add=cfg.producer_warpgroup,
                                         accurate=cfg.accurate)
            if warp >= cfg.mma_warps:
                self.load(warp, full, empty, buf_addr, seq, tile_source)
            else:
                self.mma(p, seq, warp, lane, vblk, n, h64, H64, full, empty, buf_addr, slot, in_slot)

    @cute.jit
    def load(self, warp: Int32, full: cute.Pointer, empty: cute.Pointer, buf_addr: Int32, seq: SequenceTiles,
             tile_source: tuple):
        """The producer (K2's): its first warp issues every tile's copies; a producer warpgroup first
        hands its registers to the MMA warpgroups."""
        if cutlass.const_expr(self.config.producer_warpgroup):
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
        if warp == self.config.mma_warps:
            produce_tiles(full, empty, buf_addr, seq.ntiles, *tile_source)

    @cute.jit
    def mma(self, p: K2Params, seq: SequenceTiles, warp: Int32, lane: Int32, vblk: Int32, n: Int32, h64: Int64,
            H64: Int64, full: cute.Pointer, empty: cute.Pointer, buf_addr: Int32, slot: Int32, in_slot: Int32):
        """The MMA warpgroups: the register-state step of the recipe (regstate_step.py)."""
        cfg = self.config
        if cutlass.const_expr(cfg.producer_warpgroup):
            cute.arch.setmaxregister_increase(MMA_REGS)
        if cutlass.const_expr(cfg.accurate):
            mma_warpgroups_accurate(cfg, p, seq, warp, lane, vblk, n, h64, H64, full, empty, buf_addr, slot)
        else:
            mma_warpgroups(cfg, p, seq, warp, lane, vblk, n, h64, H64, full, empty, buf_addr, slot, in_slot)


class K2RegstateSerial(SerialEntry, K2Regstate):
    """Serial host entry (registry entry k2_regstate) with the arguments of k2_recurrence.K2Serial;
    accurate: numerics="accurate" (docs/numerics.md), bit for bit the mma.sync K2's accurate step."""

    def __init__(self, has_initial: bool, has_final: bool, state_fp32: bool, value_block: int,
                 accurate: bool = False):
        super().__init__(RegstateConfig(value_block, accurate, False, has_initial, has_final, state_fp32, state_fp32))


class K2RegstateSegments(SegmentsEntry, K2Regstate):
    """Segmented host entry (registry entry k2_regstate_segments) with the arguments of
    k2_recurrence.K2Segments (a CP call's K2); accurate as in K2RegstateSerial."""

    def __init__(self, final_fp32: bool, value_block: int, accurate: bool = False):
        super().__init__(RegstateConfig(value_block, accurate, True, True, True, True, final_fp32))


class K2RegstateExt(ExtEntry, K2Regstate):
    """State-pool and checkpoint host entry (registry entry k2_regstate_ext) with the arguments and
    meaning of k2_recurrence.K2Ext."""

    def __init__(self, segments: bool, state_fp32: bool, final_fp32: bool, value_block: int):
        super().__init__(RegstateConfig(value_block, False, segments, True, True, state_fp32, final_fp32, ext=True))


# The registry's entry names (the manifest's, which the runtime looks variants up by): each is the
# class whose __call__ is that host entry, configured from the variant's constants (compile.py).
k2_regstate, k2_regstate_segments, k2_regstate_ext = K2RegstateSerial, K2RegstateSegments, K2RegstateExt
