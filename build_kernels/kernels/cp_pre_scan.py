"""CP pre_scan (docs/algorithm.md §4.2, 4.3, 4.6): per pre-scanned segment and head, the segment's affine transfer
S_end = S_start @ M_j + B_j in the [V, K] state orientation, for the CP merge (cp_merge.py).

Grid (n_scan, n_heads, 128 // VB), VB = value_block in {128, 64, 32}. CTA (x, h, vb) handles segment
j = scan_seg[x] (never the last segment of its sequence, so all its tiles are full; rows >= m are
still masked exactly as K2 does); j < 0 (the padding of device-built tables) exits at once. Segment j covers global tiles tile_prefix[j] .. tile_prefix[j+1]-1,
tile i at workspace slot h*cap + tile_prefix[j] + i, first token seq_start[j] + 16 i.

Two chains run per tile in the same MMA warps, sharing the stage (and the Kd / Kr A fragments):

* S-chain (B_j): K2's per-tile state update on the bf16 S^T (K x V) from S = 0, with the same code as
  k2_recurrence.py minus Q4 (recurrence_common.py): Q1 u = bf(acc32(Kd S^T)) (8 k-steps of m16n8k16, same ldmatrix operands
  and k order), Q2 r = bf(bf(v - u) * bsig) (v rows >= m forced to 0), Q3 U = bf(acc32(INV r)) via
  movmatrix, Q5 S^T = bf(fma(S^T, gamma, acc32(Kr^T U))). Each accumulator sees exactly K2's MMA
  sequence and rounding PTX (same ptx_ops helpers), warp w owns the same NW value columns as in K2,
  so B_j is bit-identical to K2's final state run from zero over the same tiles (docs/algorithm.md §4.6 item 2).
  b_seg[j, h, v, k] = f32(S^T[k, v]) (exact widening), written like K2's fp32 final state.

* M-chain (M_j): docs/algorithm.md §4.2 duality. With v := 0 the K2 step maps a K x K "state" X (rows play the value
  channels) to X A_c with A_c = Diag(gamma) - Kd^T Diag(bsig) INV^T Kr:
      u_X = Kd X^T (16 x K), U_X = INV Diag(bsig) (0 - u_X), X^T_new = Diag(gamma) X^T + Kr^T U_X,
  i.e. X_new = X Diag(gamma) - X Kd^T Diag(bsig) INV^T Kr = X A_c. From X_0 = I, after tiles c_1..c_n,
  X = A_{c_1} A_{c_2} ... A_{c_n} = M_j. Rows of X evolve independently (X_new[i, :] = X[i, :] A_c), so
  CTA vb owns rows [vb*VB, vb*VB + VB) of X exactly as it owns value rows of S, warp w rows
  col0 .. col0 + NW. Arithmetic: u_X = bf(acc32(Kd Xb^T)) with Xb = bf(X) the bf16 mirror (smem, same
  layout as S^T); r_X = bf(bf(0 - u_X) * bsig); U_X = bf(acc32(INV r_X)); the canonical X^T is an fp32
  register accumulator (C-fragment positions of the Q5 product) updated X^T = fma(X^T, gamma,
  acc32(Kr^T U_X)) with no bf16 rounding; the mirror is re-rounded from it after every tile.

Orientation (what merge needs): merge computes carry[V, K] @ m_seg[K, K] + b_seg[V, K] with
row-major [128, 128] blocks. With S_out = S_in A_c + B_c (S is V x K, docs/algorithm.md §4.2), a segment gives
S_end = S_start (A_{c_1} ... A_{c_n}) + B_j, so m_seg[j, h] must hold M_j = X_end with
m_seg[j, h, a, b] = M_j[a, b] = X_end[a, b] = X^T_end[b, a]: row a = the X row ("value" index owned
by the CTA/warp), column b = key index, the same [row = value, col = key] placement as b_seg (and
K2's final state). Check: carry @ M = sum_a carry[v, a] M[a, b]; for one tile, (S A_c)[v, b] =
sum_a S[v, a] A_c[a, b]. The kernel stores the fragment element X^T[k, i] at m_seg[.., i, k], in
column tile_ops.m_seg_column(i, k) = k ^ 8 (i & 3) of row i: the merge loads a whole M with one
bulk copy and reads it conflict-free without row padding (docs/kernel_abi.md).

Thread roles (as K2): warps 0..W-1 MMA warps (W = mma_warps(VB), NW = VB / W value columns / X rows
each; CpPreScan.mma), warp W producer (CpPreScan.load: elected lanes arm the stage and issue the bulk
copies, 3 elect regions).

Shared memory (bytes):
  S^T         VB * 256 (bf16, K2's warp-region core-matrix layout)
  X mirror    VB * 256 (bf16, same layout)
  stages      STAGES = 3 x SB, each: kd 4096 | kr 4096 | gt 512 | inv 512 | bsig 32 (accurate: + its
              residue 32) (+pad to 128) |
              v 16 rows x (2 VB + 16) = 13696 / 11648 / 10624 per stage (VB = 128 / 64 / 32)
  barriers    2 * STAGES mbarriers
  total       ~106.7 KB (VB=128), ~67.8 KB (64), ~48.3 KB (32) incl. alignment

Pipeline: K2's ring (full[s] count 1, expect_tx = 9248 (accurate 9280) + m * 2 VB bytes = kd + kr + gt +
inv + bsig (+ residue) + m v rows; empty[s] count 32 W, every MMA thread arrives once after Q5 of both chains; a __syncwarp
between Q1's ldmatrix of S^T / Xb^T and Q5's writes of them, docs/sanitizers.md). Every tile the
producer issues is consumed, so no copy is in flight at exit.
"""

import dataclasses
from typing import Any, NamedTuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .. import shared_constants as ABI_CONSTANTS
from .common.ptx_ops import (fma_rn, ldg_b32, lds_b32, lds_f32, ldsm_x4, ldsm_x4_t, mma_bf16_16816, pack_bf16x2,
                             select_b32, stg_f32, stg_f32_pair_from_bf16, sts_b32, unpack_bf16x2)
from .common.recurrence_common import (BSIG_BYTES, GT_BYTES, SQ_BYTES, TILE_BYTES, SequenceTiles, alloc_ring,
                                       bsig_smalls, init_ring, lds_bsig, mma_split, mma_warps, produce_tiles,
                                       solve_u_fragment, solve_u_fragment_accurate, state_f32_step, state_words_step,
                                       v_stride, wait_stage_full)
from .common.tile_ops import CHUNK, D, await_previous_grid, m_seg_column

OFF_KD, OFF_KR = 0, TILE_BYTES
OFF_GT = 2 * TILE_BYTES
OFF_INV = OFF_GT + GT_BYTES
OFF_BSIG = OFF_INV + SQ_BYTES
OFF_V = OFF_BSIG + 128
assert OFF_V - OFF_BSIG >= 2 * BSIG_BYTES  # bsig's pad holds the accurate recipe's residue slot
BF16_ONE = 0x3F80


def stage_bytes(vb: int) -> int:
    return (OFF_V + CHUNK * v_stride(vb) + 127) // 128 * 128


@dataclasses.dataclass(frozen=True)
class PreScanConfig:
    """The static configuration of one pre_scan kernel: value block and numerics recipe."""

    value_block: int
    accurate: bool = False  # numerics="accurate" (docs/numerics.md): B_j from K2's accurate chain in fp32

    def __post_init__(self):
        assert self.value_block in ABI_CONSTANTS.VALUE_BLOCKS, self.value_block

    @property
    def mma_warps(self) -> int:
        """K2's MMA warps (recurrence_common.mma_warps): warp w owns K2's value columns."""
        return mma_warps(self.value_block)

    @property
    def nw(self) -> int:
        """Value columns (S) / X rows per MMA warp."""
        return self.value_block // self.mma_warps

    @property
    def threads(self) -> int:
        """The MMA warps, then the producer warp."""
        return 32 * (self.mma_warps + 1)


class PreScanParams(NamedTuple):
    """The kernel's parameters, in the order of its PTX .param list (device pointers as Int64)."""

    v_ptr: Any
    kd_ptr: Any
    kr_ptr: Any
    gt_ptr: Any
    inv_ptr: Any
    bsig_ptr: Any
    start_ptr: Any
    prefix_ptr: Any
    scan_ptr: Any
    bseg_ptr: Any
    mseg_ptr: Any
    n_heads: Any
    cap: Any
    v_st: Any
    v_sh: Any


class CpPreScan:
    """CP pre_scan of one static configuration (PreScanConfig); registry entry cp_pre_scan."""

    def __init__(self, value_block: int, accurate: bool = False):
        self.config = PreScanConfig(value_block, accurate)

    def __str__(self):
        """What the kernel's PTX symbol spells for this object (the DSL spells a kernel method's
        symbol from its object)."""
        return f"CpPreScan_vb{self.config.value_block}{'_acc' if self.config.accurate else ''}"

    @cute.jit
    def __call__(self, v: cute.Pointer, ws_kd: cute.Pointer, ws_kr: cute.Pointer, ws_gt: cute.Pointer,
                 ws_inv: cute.Pointer, ws_bsig: cute.Pointer, seq_start: cute.Pointer, tile_prefix: cute.Pointer,
                 scan_seg: cute.Pointer, b_seg: cute.Pointer, m_seg: cute.Pointer, n_scan: Int32, n_heads: Int32,
                 cap: Int32, v_stride_t: Int64, v_stride_h: Int64, stream: cuda.CUstream):
        """pre_scan host entry: v [T_total, H, 128] bf16 read in place at token / head strides
        v_stride_t / v_stride_h (elements; 16-byte aligned rows), workspace regions kd/kr/gt/inv/bsig
        (docs/kernel_abi.md) written by K1 with the SEGMENT tables seq_start/tile_prefix [n_seg + 1],
        scan_seg int32 [n_scan] (segments to process, never a sequence's last), outputs b_seg/m_seg fp32
        [n_seg, H, 128, 128] (only the scanned segments' blocks are written)."""
        self.kernel(v.toint(), ws_kd.toint(), ws_kr.toint(), ws_gt.toint(), ws_inv.toint(), ws_bsig.toint(),
                    seq_start.toint(), tile_prefix.toint(), scan_seg.toint(), b_seg.toint(), m_seg.toint(),
                    n_heads, cap, v_stride_t, v_stride_h).launch(
            grid=(n_scan, n_heads, D // self.config.value_block), block=(self.config.threads, 1, 1), stream=stream,
            use_pdl=True)

    @cute.kernel
    def kernel(self, v_ptr: Int64, kd_ptr: Int64, kr_ptr: Int64, gt_ptr: Int64, inv_ptr: Int64, bsig_ptr: Int64,
               start_ptr: Int64, prefix_ptr: Int64, scan_ptr: Int64, bseg_ptr: Int64, mseg_ptr: Int64,
               n_heads: Int32, cap: Int32, v_st: Int64, v_sh: Int64):
        """The CTA (x, h, vblk) on segment j = scan_seg[x]: its ring and the two state buffers, then
        the roles: the producer warp (load) and the MMA warps (mma)."""
        cfg = self.config
        p = PreScanParams(v_ptr, kd_ptr, kr_ptr, gt_ptr, inv_ptr, bsig_ptr, start_ptr, prefix_ptr, scan_ptr,
                          bseg_ptr, mseg_ptr, n_heads, cap, v_st, v_sh)
        VB = cfg.value_block
        LOAD_WARP = cfg.mma_warps

        x, h, vblk = cute.arch.block_idx()
        await_previous_grid()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()

        smem = cutlass.memory.SmemAllocator()
        full, empty, buf_addr = alloc_ring(smem, stage_bytes(VB))
        sstate = smem.allocate(VB * D * 2, byte_alignment=128)
        smirror = smem.allocate(VB * D * 2, byte_alignment=128)

        j = ldg_b32(scan_ptr + Int64(x) * 4)
        # scan_seg may end in -1 entries (the device-built tables pad it up to the grid the runtime
        # sizes by a host-known bound): such a CTA does nothing. The condition is uniform over the
        # CTA, so the ring's barriers (set up inside the branch) serve all of its threads or none.
        if j >= 0:
            init_ring(warp, full, empty, 32 * cfg.mma_warps)

            tok0 = ldg_b32(start_ptr + Int64(j) * 4)
            tok_end = ldg_b32(start_ptr + Int64(j + 1) * 4)
            tile0 = ldg_b32(prefix_ptr + Int64(j) * 4)
            seq = SequenceTiles(tok0, tok_end, tile0, ldg_b32(prefix_ptr + Int64(j + 1) * 4) - tile0)
            h64 = Int64(h)
            H64 = Int64(n_heads)

            if warp == LOAD_WARP:
                self.load(p, seq, h64, vblk, full, empty, buf_addr)
            else:
                self.mma(p, seq, warp, lane, j, h64, H64, vblk, full, empty, buf_addr, sstate, smirror)

    @cute.jit
    def load(self, p: PreScanParams, seq: SequenceTiles, h64: Int64, vblk: Int32, full: cute.Pointer,
             empty: cute.Pointer, buf_addr: Int32):
        """The producer warp: every tile of the segment into the ring, pre_scan's stage layout."""
        VB = self.config.value_block
        produce_tiles(full, empty, buf_addr, seq.ntiles, seq.tok0, seq.tok_end, h64 * Int64(p.cap) + Int64(seq.tile0),
                      p.v_ptr + h64 * p.v_sh * 2 + Int64(vblk * (VB * 2)), p.v_st * 2,
                      ((OFF_KD, p.kd_ptr), (OFF_KR, p.kr_ptr)),
                      ((OFF_GT, p.gt_ptr, GT_BYTES), (OFF_INV, p.inv_ptr, SQ_BYTES))
                      + bsig_smalls(OFF_BSIG, p.bsig_ptr, p.n_heads, p.cap, self.config.accurate),
                      stage_bytes(VB), OFF_V, v_stride(VB), VB * 2)

    @cute.jit
    def mma(self, p: PreScanParams, seq: SequenceTiles, warp: Int32, lane: Int32, j: Int32, h64: Int64, H64: Int64,
            vblk: Int32, full: cute.Pointer, empty: cute.Pointer, buf_addr: Int32, sstate: cute.Pointer,
            smirror: cute.Pointer):
        """The MMA warps: both chains from their entry (S = 0, X = I), every tile's Q1, Q2 + Q3 and
        Q5 of both, then b_seg and m_seg of this warp's columns / rows."""
        cfg = self.config
        VB = cfg.value_block
        NW = cfg.nw
        NB = NW // 8
        SB = stage_bytes(VB)
        w = warp
        g = lane >> 2
        q = lane & 3
        j4 = lane >> 3
        i8 = lane & 7
        region = sstate.toint() + w * (NW * D * 2)
        mregion = smirror.toint() + w * (NW * D * 2)
        col0 = vblk * VB + w * NW  # first global value column (S) / X row (M) of this warp
        out_base = (Int64(j) * H64 + h64) * Int64(D * D)  # element index of b_seg/m_seg[j, h, 0, 0]

        off_a = lane * 16
        if cutlass.const_expr(NB >= 2):
            off_sb = 128 * ((j4 >> 1) + NB * (j4 & 1)) + 16 * i8
        else:
            off_sb = 16 * lane
        off_kr = 256 * (j4 & 1) + 128 * (j4 >> 1) + 16 * i8
        off_sq = 32 * (8 * (j4 & 1) + i8) + 16 * (j4 >> 1)

        xr = self.entry(region, mregion, lane, col0)

        zero = Float32(0.0)
        # The S-chain's words at this lane's Q5 positions, kept in registers across tiles exactly as
        # K2 keeps them (S starts at 0): Q5 reads the old state here, shared memory only feeds Q1.
        st_words = [Int32(0) for _ in range(2 * (D // 16) * NB)]
        st = None
        if cutlass.const_expr(cfg.accurate):
            # numerics="accurate": K2's accurate chain, the S-chain's fp32 master state from 0
            st = cute.make_rmem_tensor(32 * NB, Float32)
            for e in cutlass.range_constexpr(32 * NB):
                st[e] = zero
        for i in cutlass.range(seq.ntiles, unroll=1):
            s = wait_stage_full(full, i)
            sb = buf_addr + s * SB
            start, m = seq.tile(i)

            acc_u, acc_x = self.q1(sb, region, mregion, off_a, off_sb, zero)
            # Q1's ldmatrix read other lanes' S^T / Xb^T words that Q5 overwrites (WAR in the warp)
            cute.arch.sync_warp()
            u_frag, x_frag = self.q2_q3(sb, off_sq, g, q, w, m, acc_u, acc_x, zero)
            st_words = self.q5(sb, region, mregion, lane, off_kr, g, u_frag, x_frag, st, st_words, xr, zero)

            cute.arch.sync_warp()
            cute.arch.mbarrier_arrive(empty + s)  # every thread releases its own stage reads

        self.store(p, region, lane, col0, g, q, out_base, st, xr)

    def entry(self, region, mregion, lane, col0):
        """Entry: S^T = 0, mirror Xb^T = I (X^T[k, i] = [k == col0 + i], exact in bf16), a __syncwarp,
        and the canonical X^T (fp32, returned) in registers at the Q5 C-fragment positions: element
        4 (nb + NB mb) + c is X^T[16 mb + g + 8 (c >> 1), col0 + 8 nb + 2 q + (c & 1)], initialised
        from the exact mirror."""
        NW = self.config.nw
        NB = NW // 8
        for jj in range(D // 32):
            k = lane + 32 * jj
            koff = 128 * NB * (k >> 3) + 16 * (k & 7)
            for p in range(NW // 2):
                woff = koff + 128 * (p // 4) + 4 * (p % 4)
                sts_b32(region + woff, Int32(0))
                c = col0 + 2 * p
                word = (select_b32(Int32(k == c), Int32(BF16_ONE), Int32(0))
                        + select_b32(Int32(k == c + 1), Int32(BF16_ONE << 16), Int32(0)))
                sts_b32(mregion + woff, word)
        cute.arch.sync_warp()

        xr = cute.make_rmem_tensor(32 * NB, Float32)
        for mb in range(D // 16):
            for nb in range(NB):
                e = 4 * (nb + NB * mb)
                w_a0 = mregion + 128 * (nb + NB * (2 * mb)) + 4 * lane
                xr[e], xr[e + 1] = unpack_bf16x2(lds_b32(w_a0))
                xr[e + 2], xr[e + 3] = unpack_bf16x2(lds_b32(w_a0 + 128 * NB))
        return xr

    def q1(self, sb, region, mregion, off_a, off_sb, zero):
        """Q1: u = Kd S^T (S-chain), u_X = Kd Xb^T (M-chain), shared A fragments."""
        NB = self.config.nw // 8
        acc_u = [[zero, zero, zero, zero] for _ in range(NB)]
        acc_x = [[zero, zero, zero, zero] for _ in range(NB)]
        bq = [None, None, None, None]
        bx = [None, None, None, None]
        for kb in range(D // 16):
            a_k = ldsm_x4(sb + OFF_KD + 512 * kb + off_a)
            if NB >= 2:
                for p in range(NB // 2):
                    bq = ldsm_x4_t(region + 128 * (2 * p + 2 * NB * kb) + off_sb)
                    bx = ldsm_x4_t(mregion + 128 * (2 * p + 2 * NB * kb) + off_sb)
                    for t in range(2):
                        acc_u[2 * p + t] = list(mma_bf16_16816(a_k, (bq[2 * t], bq[2 * t + 1]), acc_u[2 * p + t]))
                        acc_x[2 * p + t] = list(mma_bf16_16816(a_k, (bx[2 * t], bx[2 * t + 1]), acc_x[2 * p + t]))
            else:
                if kb % 2 == 0:
                    bq = ldsm_x4_t(region + 256 * kb + off_sb)
                    bx = ldsm_x4_t(mregion + 256 * kb + off_sb)
                t = kb % 2
                acc_u[0] = list(mma_bf16_16816(a_k, (bq[2 * t], bq[2 * t + 1]), acc_u[0]))
                acc_x[0] = list(mma_bf16_16816(a_k, (bx[2 * t], bx[2 * t + 1]), acc_x[0]))
        return acc_u, acc_x

    def q2_q3(self, sb, off_sq, g, q, w, m, acc_u, acc_x, zero):
        """Q2, Q3 per n-block: the S-chain exactly as K2, the M-chain with v = 0; returns both chains'
        U fragments (numerics="accurate": both with K2's accurate Q2 + Q3, r as hi + lo, U rounded
        once)."""
        NW = self.config.nw
        VSTR = v_stride(self.config.value_block)
        a_inv = ldsm_x4(sb + OFF_INV + off_sq)
        bs0 = lds_bsig(sb, OFF_BSIG, g, self.config.accurate)
        bs1 = lds_bsig(sb, OFF_BSIG, g + 8, self.config.accurate)
        ok0 = Int32(g < m)
        ok1 = Int32(g + 8 < m)
        v_a0 = sb + OFF_V + g * VSTR + (w * NW + 2 * q) * 2
        u_frag = []
        x_frag = []
        solve = solve_u_fragment_accurate if self.config.accurate else solve_u_fragment
        for nb in range(NW // 8):
            u_frag.append(solve(
                acc_u[nb], lambda: (select_b32(ok0, lds_b32(v_a0 + 16 * nb), Int32(0)),
                                    select_b32(ok1, lds_b32(v_a0 + 8 * VSTR + 16 * nb), Int32(0))),
                bs0, bs1, a_inv, zero))
            x_frag.append(solve(acc_x[nb], None, bs0, bs1, a_inv, zero))
        return u_frag, x_frag

    def q5(self, sb, region, mregion, lane, off_kr, g, u_frag, x_frag, st, st_words, xr, zero):
        """Q5: S^T = bf(fma(S^T, gamma, Kr^T U)); X^T = fma(X^T, gamma, Kr^T U_X) in fp32, its mirror
        re-rounded. Returns the S-chain's words."""
        accurate = self.config.accurate
        NB = self.config.nw // 8
        for mb in range(D // 16):
            a_kr = ldsm_x4_t(sb + OFF_KR + 512 * mb + off_kr)
            gam0 = lds_f32(sb + OFF_GT + 4 * (16 * mb + g))
            gam1 = lds_f32(sb + OFF_GT + 4 * (16 * mb + 8 + g))
            for nb in range(NB):
                w_a0 = region + 128 * (nb + NB * (2 * mb)) + 4 * lane
                w_a1 = w_a0 + 128 * NB
                if accurate:
                    ds = mma_split(a_kr, u_frag[nb], zero)
                    wa, wb = state_f32_step(st, 4 * (nb + NB * mb), gam0, gam1, ds)
                    sts_b32(w_a0, wa)
                    sts_b32(w_a1, wb)
                    dx = mma_split(a_kr, x_frag[nb], zero)
                else:
                    ds = mma_bf16_16816(a_kr, u_frag[nb], (zero, zero, zero, zero))
                    iw = 2 * (mb * NB + nb)
                    st_words[iw], st_words[iw + 1] = state_words_step(st_words[iw], st_words[iw + 1], gam0, gam1, ds)
                    sts_b32(w_a0, st_words[iw])
                    sts_b32(w_a1, st_words[iw + 1])
                    dx = mma_bf16_16816(a_kr, x_frag[nb], (zero, zero, zero, zero))

                e = 4 * (nb + NB * mb)
                n0 = fma_rn(xr[e], gam0, dx[0])
                n1 = fma_rn(xr[e + 1], gam0, dx[1])
                n2 = fma_rn(xr[e + 2], gam1, dx[2])
                n3 = fma_rn(xr[e + 3], gam1, dx[3])
                xr[e] = n0
                xr[e + 1] = n1
                xr[e + 2] = n2
                xr[e + 3] = n3
                m_a0 = mregion + 128 * (nb + NB * (2 * mb)) + 4 * lane
                sts_b32(m_a0, pack_bf16x2(n0, n1))
                sts_b32(m_a0 + 128 * NB, pack_bf16x2(n2, n3))
        return st_words

    def store(self, p: PreScanParams, region, lane, col0, g, q, out_base, st, xr):
        """Exit: b_seg[j, h, v, k] = f32(S^T[k, v]) (exact; accurate: the fp32 master state, K2's
        fragment positions), m_seg[j, h, i, k] = X^T[k, i] (fp32, column k swizzled)."""
        NW = self.config.nw
        NB = NW // 8
        if self.config.accurate:
            for mb in range(D // 16):
                for nb in range(NB):
                    e = 4 * (nb + NB * mb)
                    a = out_base + Int64(col0 + 8 * nb + 2 * q) * D + Int64(16 * mb + g)
                    for c in range(4):
                        stg_f32(p.bseg_ptr + (a + Int64(D * (c & 1) + 8 * (c >> 1))) * 4, st[e + c])
        else:
            for jj in range(D // 32):
                k = lane + 32 * jj
                koff = 128 * NB * (k >> 3) + 16 * (k & 7)
                for pp in range(NW // 2):
                    word = lds_b32(region + koff + 128 * (pp // 4) + 4 * (pp % 4))
                    e0 = out_base + Int64(col0 + 2 * pp) * D + Int64(k)
                    stg_f32_pair_from_bf16(p.bseg_ptr + e0 * 4, p.bseg_ptr + (e0 + D) * 4, word)
        # m_seg's columns are swizzled for the merge's bulk copy (tile_ops.m_seg_column): row r keeps
        # column c at c ^ 8 (r & 3); this lane's rows are i0 = col0 + 8 nb + 2q and i0 + 1
        for mb in range(D // 16):
            for nb in range(NB):
                e = 4 * (nb + NB * mb)
                i0 = col0 + 8 * nb + 2 * q
                k0 = 16 * mb + g
                r0 = out_base + Int64(i0) * D
                r1 = r0 + D
                stg_f32(p.mseg_ptr + (r0 + Int64(m_seg_column(i0, k0))) * 4, xr[e])
                stg_f32(p.mseg_ptr + (r1 + Int64(m_seg_column(i0 + 1, k0))) * 4, xr[e + 1])
                stg_f32(p.mseg_ptr + (r0 + Int64(m_seg_column(i0, k0 + 8))) * 4, xr[e + 2])
                stg_f32(p.mseg_ptr + (r1 + Int64(m_seg_column(i0 + 1, k0 + 8))) * 4, xr[e + 3])


# The registry's entry name (the manifest's): the class whose __call__ is the host entry (compile.py).
cp_pre_scan = CpPreScan
