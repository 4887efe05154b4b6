"""K1 -- per-(tile, head) preparation of the chunked KDA workspace (docs/algorithm.md §3.1, 3.2, 2.4 P1-P8, 4.8).

Grid (cap, H), 256 threads, one CTA per (global tile upper-bound index, head). Each warp finds the
CTA's sequence in `tile_prefix` (_locate_tile), the CTA exits at once when its tile is past
`tile_prefix[N]`, and otherwise turns the 16 x 128 tile of q, k, g (+ beta, A_log, dt_bias) into
the workspace slot `s = h*cap + tile` (docs/kernel_abi.md): raw smem images of Qd, Kd, Kr,
gamma = 2^G_tot (fp32), INV = (I+L)^-1, Mqk, bf(sigma(beta)).

Stages and thread roles (warps w0..w7):
  0. all:      every warp resolves (sequence, first token, m valid rows) by itself; w0 initialises
               the mbarrier (CTA barrier K1Barrier.LOAD_ARMED).
  1. all:      warp w, one elected lane, issues the 256-byte `cp.async.bulk` G2S copies of token rows
               w and w+8 (if < m) of q, k, g into padded staging rows (rows >= m are never read
               from global memory, so no other sequence's data enters the CTA); w0 arms the
               barrier with 3*256*m bytes.
               Meanwhile every thread prefetches A_log, its dt_bias channel and (w0) two beta logits.
  2. w0-w3:    gate (P2-P4), one thread per key channel: activation, sequential cumsum over the 16
               rows, e = bf(2^G), ebar = bf(2^-G) to smem, gamma to the workspace, bf(gamma) to smem.
     w4-w7:    L2 norm (P1) of q (w4, w5) and k (w6, w7), 4 lanes per row, 4 chunks of 8 per lane;
               q^, k^ stay in registers.
     -- barrier B1, K1Barrier.GATED (one bar.sync, all 256 threads, outside the role branches:
        docs/sanitizers.md) --
  3. w4-w7:    decayed tiles (P5) written as raw 8x8-core-matrix images (docs/algorithm.md §4.8): Qd over the q
               staging buffer, Kd over k, Kr over g, Ki (K1-internal) in its own buffer.
     -- fence.proxy.async.shared (w4-w7), barrier B2, K1Barrier.IMAGES (one bar.sync, all threads) --
  4. w7:       one elected lane bulk-stores the three 4 KiB images (S2G), commits and waits.
     w0:       L = Kd Ki^T (bf16 mma.sync, fp32 acc), beta row scale in fp32, strict-lower mask;
               INV by FlashKDA's stable recipe (fp32 forward substitution of the two 8x8 diagonal
               blocks over shuffles, the 16x16 merged by two bf16 products with fp32 accumulation;
               all in registers); stores INV and bsig.
     w1:       Mqk = Qd Ki^T -> bf16, causal mask, store.
     K1' (numerics="accurate"): q^ and k^ stay fp32 until they are gated (stage 2b keeps the raw
               row and its rsqrt), each gated operand is rounded once, and stage 3 also writes the
               residues Qd_lo = bf(Qd32 - Qd), Ki_lo = bf(Ki32 - Ki); w1 and w2 then form one
               8-column block of Mqk each from Qd Ki^T + Qd_lo Ki^T + Qd Ki_lo^T (76 MMAs a tile
               where K1 has 44).

Shared memory (static, 26,120 B + alignment, so smem allows 8 CTAs/SM; registers allow
CTAS_PER_SM = 5 at 48 per thread, which the launch asks ptxas to keep):
  sQin, sKin, sGin  3 x 16 x 136 bf16 = 3 x 4352 B   staging (row stride 272 B: 8 consecutive rows
                                                     hit 8 distinct bank quads), later the Qd, Kd,
                                                     Kr images (4096 B each) alias them
  sKi               4096 B                           Ki image (ldmatrix B operand of both products)
  sE, sEbar         2 x 4352 B                       bf(2^G), bf(2^-G), padded rows like staging
                                                     (K1': fp32, 2 x 16 x 132 x 4 = 2 x 8448 B)
  sGb               256 B                            bf(gamma)
  mbar              8 B
  sQlo, sKilo       2 x 4096 B                       K1' only: the residue images (the general K1'
                                                     lays them over sG, which only wide tiles read)
K1' takes 42,760 B and stays at five CTAs per SM.

Rounding follows docs/algorithm.md §2.4 op by op. The gate and norm arithmetic uses explicit `.rn` PTX
(ptx_ops.mul_rn_ftz/add_rn_ftz/fma_rn_ftz) so ptxas cannot contract `c*s` into the cumsum; products of
two bf16 values are exact in fp32, so P5 products are fp32 multiplies followed by one RNE
conversion.
"""

import dataclasses
import enum
from typing import Any, NamedTuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, Uint8, Uint32

from .common.ptx_ops import ex2_approx_ftz, ldg_b32, mul_rn_ftz, sub_rn
from .common.tile_ops import (CHUNK, D, LOG2E, await_previous_grid, bsig_residue_slot0, bulk_g2s_tensor,
                              bulk_s2g_elected, raw_tile_layout, round_bf16, sync_named)
from .common.tile_prep import (BETA_LOGITS, F32_FACTOR_ROW, GATE_LOGDECAY, GATE_SAFE, PAD_ROW, decayed_images,
                               decayed_images_wide, gate_factors, gate_factors_general, inverse_fragments, l2norm_hat,
                               mqk_block_words, mqk_split_products, mqk_words, product_fragments, qk_products,
                               select as _select, wide_tile_products)

THREADS = 256
# Five CTAs per SM, set by registers: 48 per thread at most (ptxas would otherwise take 57 for the
# accurate twin and drop to four). Six (40 registers) spill and measured only 1-2% faster
# (docs/speed_limits.md).
CTAS_PER_SM = 5
ROW_BYTES = D * 2  # one token row of one head, bf16
G_ROW_BYTES = {False: D * 2, True: D * 4}  # one row of g: bf16, or an fp32 log-decay
TILE_BYTES = CHUNK * D * 2  # one raw image


class K1Barrier(enum.IntEnum):
    """K1's CTA barriers (tile_ops.sync_named, all THREADS threads), in the order of the module
    docstring's stages. Each is ONE bar.sync that every thread executes outside the role branches:
    a barrier reached from two different instructions (one per role) is what synccheck reports as
    "Divergent thread(s) in block", although the hardware counts the arrivals alike."""

    LOAD_ARMED = 1  # stage 0: the load mbarrier initialised and fenced
    GATED = 2  # B1: e, ebar, bf(gamma) published; the staging reads done
    IMAGES = 3  # B2: the decayed images written and fenced for the bulk stores
    WIDE_PRODUCTS = 4  # B3 (general K1, wide tiles): the wide-tile products published


def _staging_g_layout(g_fp32: bool):
    """The g staging rows: bf16 at PAD_ROW, or a precomputed fp32 log-decay at F32_FACTOR_ROW (528 B)."""
    row = F32_FACTOR_ROW if g_fp32 else PAD_ROW
    return cute.make_layout((CHUNK, row), stride=(row, 1))


def _factor_layout(accurate: bool):
    """sE / sEbar: bf16 rows at the staging stride (FlashKDA's K1, unchanged), fp32 rows at
    F32_FACTOR_ROW (K1')."""
    row = F32_FACTOR_ROW if accurate else PAD_ROW
    return cute.make_layout((CHUNK, row), stride=(row, 1))


@cute.jit
def _locate_tile(tile: Int32, tile_prefix: Int64, seq_start: Int64, n_seq: Int32, lane: Int32):
    """(found, first token, valid rows) of global tile `tile`, each warp on its own.

    Lane j of a pass looks at sequence base + j: the tile is that sequence's when
    tile_prefix[j] <= tile < tile_prefix[j + 1]. That holds for exactly one j < N when
    tile < tile_prefix[N] (the prefix is non-decreasing from 0, so empty sequences never match)
    and for none otherwise. The four loads of a pass are independent, so up to 32 sequences cost
    one round of global latency before the first bulk copy; the binary search this replaces
    cost log2(N) + 2 dependent rounds."""
    found = Int32(0)
    tok0 = Int32(0)
    m = Int32(0)
    base = Int32(0)
    while base < n_seq:
        j = base + lane
        jj = cutlass.min(j, n_seq - 1)  # lanes past N repeat the last sequence, in bounds
        first_tile = ldg_b32(tile_prefix + Int64(jj) * 4)
        end_tile = ldg_b32(tile_prefix + Int64(jj + 1) * 4)
        start = ldg_b32(seq_start + Int64(jj) * 4)
        end = ldg_b32(seq_start + Int64(jj + 1) * 4)
        # start <= end always holds (the tables are clamped non-decreasing); testing it makes the
        # vote wait for all four loads, so ptxas cannot sink two of them behind it (a second round).
        mine = _select(j < n_seq, 1, 0, Int32) & _select(first_tile <= tile, 1, 0, Int32) \
            & _select(tile < end_tile, 1, 0, Int32) & _select(start <= end, 1, 0, Int32)
        ballot = cute.arch.vote_ballot_sync(mine != 0)
        if ballot != 0:
            src = 31 - cute.arch.clz(ballot)  # the one lane that matched
            tok = start + CHUNK * (tile - first_tile)
            rows = _select(end - tok < CHUNK, end - tok, CHUNK, Int32)
            tok0 = cute.arch.shuffle_sync(tok, src)
            m = cute.arch.shuffle_sync(rows, src)
            found = Int32(1)
            base = n_seq
        else:
            base = base + 32
    return found, tok0, m


@dataclasses.dataclass(frozen=True)
class K1Config:
    """The static configuration of one K1 kernel. accurate: the numerics="accurate" twin (K1',
    docs/numerics.md): the same workspace, the gated operands each rounded once. gate_form /
    beta_form / g_fp32: tile_prep's codes; any gate form but GATE_SAFE is the general K1
    (docs/gate_forms.md), whose A_log / dt_bias pointers may be null, g an fp32 log-decay.
    strided: q, k, g and beta are read at the stride arguments (strided views); without it they
    are contiguous [T, H, 128] / [T, H] and one row offset (token * H + head) serves all three
    row loads (the stride arguments are unread). The contiguous K1 is a kernel of its own because
    the per-tensor stride products cost it 0.9-2.6 % (docs/design.md, "K1: a contiguous kernel and
    a strided twin")."""

    accurate: bool = False
    gate_form: int = GATE_SAFE
    beta_form: int = BETA_LOGITS
    g_fp32: bool = False
    strided: bool = False

    @property
    def general(self) -> bool:
        """The general K1: its extra code (wide tiles, optional A_log / dt_bias) is compiled in."""
        return self.gate_form != GATE_SAFE

    @property
    def factor(self):
        """The decay factors 2^G, 2^-G and gamma: bf16 in FlashKDA's recipe (P4/P5), fp32 with
        numerics="accurate", whose gated operands are each rounded once (docs/numerics.md, K1')."""
        return Float32 if self.accurate else BFloat16


class K1Params(NamedTuple):
    """The kernel's parameters, in the order of its PTX .param list."""

    q: Any
    k: Any
    g: Any
    beta: Any
    a_log: Any
    dt_bias: Any
    seq_start: Any
    tile_prefix: Any
    ws_qd: Any
    ws_kd: Any
    ws_kr: Any
    ws_gt: Any
    ws_inv: Any
    ws_mqk: Any
    ws_bsig: Any
    n_seq: Any
    n_heads: Any
    cap: Any
    scale: Any
    gate_c: Any
    q_st: Any
    q_sh: Any
    k_st: Any
    k_sh: Any
    g_st: Any
    g_sh: Any
    b_st: Any


class K1Smem(NamedTuple):
    """K1's shared memory (module docstring), in allocation order; the general K1 adds sKi_buf, sG
    and sWide, the accurate K1' sQlo and sKilo, the rounding residues of Qd and Ki for Mqk (None
    otherwise). sQd, sKd, sKr are the output images over the staging buffers (all
    staging reads finish before barrier B1)."""

    sQin: Any
    sKin: Any
    sGin: Any
    sKi_buf: Any
    sKi: Any
    sE: Any
    sEbar: Any
    sGb: Any
    mbar: Any
    sG: Any
    sWide: Any
    sQlo: Any
    sKilo: Any
    sQd: Any
    sKd: Any
    sKr: Any


class WideTile(NamedTuple):
    """The general K1's wide-tile path (docs/gate_forms.md): the flag (the same for every thread),
    a wide tile's q^ / k^ rows (wide_tile_operands) and, after B2, its two products in fp32."""

    flag: Any
    sQh: Any
    sKh: Any
    sL: Any
    sM: Any


class K1Prepare:
    """K1 of one static configuration (K1Config); registry entry k1_prepare."""

    def __init__(self, accurate: bool = False, gate_form: int = GATE_SAFE, beta_form: int = BETA_LOGITS,
                 g_fp32: bool = False, strided: bool = False):
        self.config = K1Config(accurate, gate_form, beta_form, g_fp32, strided)

    def __str__(self):
        """What the kernel's PTX symbol spells for this object (the DSL spells a kernel method's
        symbol from its object)."""
        cfg = self.config
        return f"K1Prepare_{int(cfg.accurate)}_{cfg.gate_form}_{cfg.beta_form}_{int(cfg.g_fp32)}_{int(cfg.strided)}"

    @cute.jit
    def __call__(self, q: cute.Pointer, k: cute.Pointer, g: cute.Pointer, beta: cute.Pointer, a_log: cute.Pointer,
                 dt_bias: cute.Pointer, seq_start: cute.Pointer, tile_prefix: cute.Pointer, ws_qd: cute.Pointer,
                 ws_kd: cute.Pointer, ws_kr: cute.Pointer, ws_gt: cute.Pointer, ws_inv: cute.Pointer,
                 ws_mqk: cute.Pointer, ws_bsig: cute.Pointer, t_total: Int32, n_seq: Int32, n_heads: Int32,
                 cap: Int32, q_stride_t: Int64, q_stride_h: Int64, k_stride_t: Int64, k_stride_h: Int64,
                 g_stride_t: Int64, g_stride_h: Int64, beta_stride_t: Int64, scale: Float32, gate_c: Float32,
                 stream: cuda.CUstream):
        """Token-major inputs read in place: q/k/g (t, h, d) at t * stride_t + h * stride_h + d (elements;
        rows of 128 contiguous, 16-byte aligned values), beta (t, h) at t * beta_stride_t + h (the
        strided K1; the contiguous K1 leaves the strides unread);
        gate_c = f32(lb * LOG2E) formed in double on the host. t_total is part of the ABI but not needed:
        every row read lies inside [seq_start[n], seq_start[n+1]). The general K1 (K1Config) may
        take null a_log and dt_bias, an fp32 g and an fp32 beta."""
        self.kernel(q, k, g, beta, a_log, dt_bias, seq_start, tile_prefix, ws_qd, ws_kd, ws_kr, ws_gt, ws_inv, ws_mqk,
                    ws_bsig, n_seq, n_heads, cap, scale, gate_c, q_stride_t, q_stride_h, k_stride_t, k_stride_h,
                    g_stride_t, g_stride_h, beta_stride_t).launch(
            grid=(cap, n_heads, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True,
            min_blocks_per_mp=CTAS_PER_SM, preferred_smem_carveout=-1)  # -1: compiling needs no GPU

    def shared_storage(self, smem) -> K1Smem:
        """Allocates K1's shared memory (module docstring) from the kernel's allocator."""
        cfg = self.config
        stage_layout = cute.make_layout((CHUNK, PAD_ROW), stride=(PAD_ROW, 1))
        sQin = smem.allocate_tensor(BFloat16, stage_layout, byte_alignment=128)
        sKin = smem.allocate_tensor(BFloat16, stage_layout, byte_alignment=128)
        sGin = smem.allocate_tensor(Float32 if cfg.g_fp32 else BFloat16, _staging_g_layout(cfg.g_fp32),
                                    byte_alignment=128)
        sKi_buf = None
        if cfg.general:
            # Ki's buffer holds a wide tile's q^ rows (wide_tile_operands), at the staging stride
            sKi_buf = smem.allocate_tensor(BFloat16, stage_layout, byte_alignment=128)
            sKi = cute.make_tensor(sKi_buf.iterator, raw_tile_layout())
        else:
            sKi = smem.allocate_tensor(BFloat16, raw_tile_layout(), byte_alignment=128)
        factor = cfg.factor
        sE = smem.allocate_tensor(factor, _factor_layout(cfg.accurate), byte_alignment=128)
        sEbar = smem.allocate_tensor(factor, _factor_layout(cfg.accurate), byte_alignment=128)
        sGb = smem.allocate_tensor(factor, cute.make_layout(D), byte_alignment=16)
        mbar = smem.allocate_array(Int64, 1)
        sG = None
        sWide = None
        if cfg.general:
            # G per row and channel (fp32) for wide tiles, and each gate warp's vote "some |G| > FAST_RANGE"
            sG = smem.allocate_tensor(Float32, cute.make_layout((CHUNK, F32_FACTOR_ROW), stride=(F32_FACTOR_ROW, 1)),
                                      byte_alignment=128)
            sWide = smem.allocate_array(Int32, 4)
        sQlo = None
        sKilo = None
        if cfg.accurate:
            if cfg.general:
                # over sG (8,448 B), which only a wide tile reads after B1; only other tiles write these
                base = cute.recast_ptr(sG.iterator, dtype=BFloat16)
                sQlo = cute.make_tensor(base, raw_tile_layout())
                sKilo = cute.make_tensor(base + CHUNK * D, raw_tile_layout())
            else:
                sQlo = smem.allocate_tensor(BFloat16, raw_tile_layout(), byte_alignment=128)
                sKilo = smem.allocate_tensor(BFloat16, raw_tile_layout(), byte_alignment=128)
        return K1Smem(sQin, sKin, sGin, sKi_buf, sKi, sE, sEbar, sGb, mbar, sG, sWide, sQlo, sKilo,
                      cute.make_tensor(sQin.iterator, raw_tile_layout()), cute.make_tensor(sKin.iterator, raw_tile_layout()),
                      cute.make_tensor(cute.recast_ptr(sGin.iterator, dtype=BFloat16), raw_tile_layout()))

    @cute.kernel
    def kernel(self, q: cute.Pointer, k: cute.Pointer, g: cute.Pointer, beta: cute.Pointer, a_log: cute.Pointer,
               dt_bias: cute.Pointer, seq_start: cute.Pointer, tile_prefix: cute.Pointer, ws_qd: cute.Pointer,
               ws_kd: cute.Pointer, ws_kr: cute.Pointer, ws_gt: cute.Pointer, ws_inv: cute.Pointer,
               ws_mqk: cute.Pointer, ws_bsig: cute.Pointer, n_seq: Int32, n_heads: Int32, cap: Int32,
               scale: Float32, gate_c: Float32, q_st: Int64, q_sh: Int64, k_st: Int64, k_sh: Int64, g_st: Int64,
               g_sh: Int64, b_st: Int64):
        """The stages of the module docstring, B1 and B2 (and the general K1's B3) between them."""
        cfg = self.config
        p = K1Params(q, k, g, beta, a_log, dt_bias, seq_start, tile_prefix, ws_qd, ws_kd, ws_kr, ws_gt, ws_inv, ws_mqk,
                     ws_bsig, n_seq, n_heads, cap, scale, gate_c, q_st, q_sh, k_st, k_sh, g_st, g_sh, b_st)
        tidx, _, _ = cute.arch.thread_idx()
        tile, head, _ = cute.arch.block_idx()
        await_previous_grid()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()

        sm = self.shared_storage(cutlass.memory.SmemAllocator())

        # ---- stage 0: which sequence / rows (every warp by itself, one round of loads), then the load
        # barrier. Initialising the barrier before the lookup instead measured 0.5-1% slower
        # (docs/k1_profile.md).
        found, tok0, m = _locate_tile(tile, tile_prefix.toint(), seq_start.toint(), n_seq, lane)
        if found != 0:
            slot = Int64(head) * Int64(cap) + Int64(tile)
            self.load(p, sm, warp, head, tok0, m)
            chan, gate_a, dt, row_lo, logit_lo, logit_hi = self.scalars(p, tidx, warp, lane, head, tok0, m)

            cute.arch.mbarrier_wait(sm.mbar, 0)

            # Stage 2b/3 lane mapping of w4-w7 (computed by every warp, used by w4-w7 only): lane -> row
            # 8*(w&1) + lane%8, chunk index j = lane//8 + 4 s (s = 0..3, columns 8j..8j+7). 8 consecutive
            # lanes are 8 rows of one core matrix, so the 16-byte staging reads (padded rows) and image
            # writes (raw layout) are conflict free.
            wn = warp - 4
            is_k = wn >= 2
            row = 8 * (wn & 1) + (lane & 7)
            quad = lane >> 3
            # bf(x * rsqrt) of stage 2b, 4 words per chunk, kept across B1 for stage 3 (registers: every
            # index is a compile-time constant).
            hat = cute.make_rmem_tensor(16, Uint32)
            # K1' keeps the raw rows in hat and their rsqrt here (l2norm_hat keep_raw)
            norm = cute.make_rmem_tensor(1, Float32) if cutlass.const_expr(cfg.accurate) else None
            self.gate_and_norm(p, sm, warp, lane, chan, gate_a, dt, m, slot, row, quad, is_k, hat, norm)
            sync_named(K1Barrier.GATED, THREADS)

            wide = None
            if cutlass.const_expr(cfg.general):
                wide = self.wide_tile(sm)
            self.images(p, sm, warp, wide, row, quad, is_k, hat, norm)
            sync_named(K1Barrier.IMAGES, THREADS)

            self.store_images(p, sm, warp, slot)
            self.products(p, sm, warp, lane, wide, slot, m, row_lo, logit_lo, logit_hi)

    @cute.jit
    def load(self, p: K1Params, sm: K1Smem, warp: Int32, head: Int32, tok0: Int32, m: Int32):
        """Stage 0's barrier, then stage 1: bulk loads of the m valid token rows (64-bit element
        offsets, docs/algorithm.md §6.5). Warp w owns rows w and w + 8; one elected lane per (warp,
        row) issues the three 256-byte copies, so every copy is issued exactly once (4.8.1 cute.copy
        does not elect, guide 5.3)."""
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(sm.mbar, 1)
            cute.arch.mbarrier_init_fence()
        sync_named(K1Barrier.LOAD_ARMED, THREADS)

        row_layout = cute.make_layout(D)
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(sm.mbar, (2 * ROW_BYTES + G_ROW_BYTES[self.config.g_fp32]) * m)
        for half in cutlass.range_constexpr(2):
            r = warp + 8 * half
            if r < m:
                q_off, k_off, g_off = self.row_offsets(p, tok0 + r, head)
                with cute.arch.elect_one():
                    bulk_g2s_tensor(cute.make_tensor(p.q + q_off, row_layout),
                                    cute.make_tensor(sm.sQin.iterator + r * PAD_ROW, row_layout), sm.mbar)
                    bulk_g2s_tensor(cute.make_tensor(p.k + k_off, row_layout),
                                    cute.make_tensor(sm.sKin.iterator + r * PAD_ROW, row_layout), sm.mbar)
                    bulk_g2s_tensor(cute.make_tensor(p.g + g_off, row_layout),
                                    cute.make_tensor(sm.sGin.iterator + r * sm.sGin.layout.stride[0], row_layout),
                                    sm.mbar)

    @cute.jit
    def row_offsets(self, p: K1Params, tok: Int32, head: Int32):
        """Element offsets of token tok's row of `head` in q, k and g (64-bit, docs/algorithm.md
        §6.5): each at its own token / head stride (strided K1), or the one offset of contiguous
        rows, (tok * H + head) * 128."""
        if cutlass.const_expr(self.config.strided):
            t64 = Int64(tok)
            h64 = Int64(head)
            return t64 * p.q_st + h64 * p.q_sh, t64 * p.k_st + h64 * p.k_sh, t64 * p.g_st + h64 * p.g_sh
        row_off = (Int64(tok) * Int64(p.n_heads) + Int64(head)) * D
        return row_off, row_off, row_off

    @cute.jit
    def beta_offset(self, p: K1Params, tok: Int32, head: Int32):
        """Element offset of beta[tok, head]: at beta's token stride (strided K1) or tok * H + head."""
        if cutlass.const_expr(self.config.strided):
            return Int64(tok) * p.b_st + Int64(head)
        return Int64(tok) * Int64(p.n_heads) + Int64(head)

    @cute.jit
    def scalars(self, p: K1Params, tidx: Int32, warp: Int32, lane: Int32, head: Int32, tok0: Int32, m: Int32):
        """Scalars whose global latency overlaps the bulk loads: (key channel, the gate's A (general
        K1: exp(A_log), 1 without A_log) or A_log, the bias dt (0 without dt_bias), and warp 0's row
        lane // 4 with the beta logits of it and of row + 8)."""
        chan = tidx & (D - 1)
        if cutlass.const_expr(self.config.general):
            # A = exp(A_log) (1 without A_log), the bias 0 without dt_bias; log_decay reads neither
            A = Float32(1.0)
            dt = Float32(0.0)
            if cutlass.const_expr(self.config.gate_form != GATE_LOGDECAY):
                if p.a_log.toint() != Int64(0):
                    A = ex2_approx_ftz(mul_rn_ftz(cute.make_tensor(p.a_log, cute.make_layout(p.n_heads))[head],
                                                  Float32(LOG2E)))
                if p.dt_bias.toint() != Int64(0):
                    dt = Float32(cute.make_tensor(p.dt_bias, cute.make_layout(p.n_heads * D))[head * D + chan])
        else:
            A = cute.make_tensor(p.a_log, cute.make_layout(p.n_heads))[head]  # A_log: gate_factors takes it
            dt = cute.make_tensor(p.dt_bias, cute.make_layout(p.n_heads * D))[head * D + chan]
        # Warp 0 later owns rows lane//4 and lane//4 + 8 of the 16x16 products; padded rows get the
        # logit 0 of the reference (Q7), their L rows are zero anyway and bsig is forced to 0.
        row_lo = lane >> 2
        logit_lo = Float32(0.0)
        logit_hi = Float32(0.0)
        if warp == 0:
            if row_lo < m:
                logit_lo = Float32(cute.make_tensor(p.beta + self.beta_offset(p, tok0 + row_lo, head),
                                                    cute.make_layout(1))[0])
            if row_lo + 8 < m:
                logit_hi = Float32(cute.make_tensor(p.beta + self.beta_offset(p, tok0 + row_lo + 8, head),
                                                    cute.make_layout(1))[0])
        return chan, A, dt, row_lo, logit_lo, logit_hi

    @cute.jit
    def gate_and_norm(self, p: K1Params, sm: K1Smem, warp: Int32, lane: Int32, chan: Int32, gate_a, dt, m: Int32,
                      slot: Int64, row: Int32, quad: Int32, is_k, hat: cute.Tensor, norm):
        """Stage 2: the L2 norm (P1) of q and k in w4-w7 (hat; K1': the raw row, its rsqrt in norm), the gate (P2-P4) in w0-w3, a thread
        per key channel: e, ebar and bf(gamma) to shared memory, gamma to the workspace."""
        cfg = self.config
        if warp >= 4:
            # ---- stage 2b: L2 norm (P1).
            row_valid = row < m
            src = _select(is_k, sm.sKin.iterator.toint(), sm.sQin.iterator.toint(), Int32) + row * (PAD_ROW * 2)
            if cutlass.const_expr(cfg.accurate):
                norm[0] = l2norm_hat(src, row_valid, quad, hat, keep_raw=True)
            else:
                l2norm_hat(src, row_valid, quad, hat)
        else:
            # ---- stage 2a: gate (P2-P4), thread = key channel.
            if cutlass.const_expr(cfg.general):
                gamma, wide = gate_factors_general(sm.sGin, sm.sE, sm.sEbar, sm.sG, chan, dt, gate_a, p.gate_c, m,
                                                   cfg.factor, cfg.gate_form)
                ballot = cute.arch.vote_ballot_sync(wide != 0)
                if lane == 0:
                    sm.sWide[warp] = _select(ballot != 0, 1, 0, Int32)
            else:
                gamma = gate_factors(sm.sGin, sm.sE, sm.sEbar, chan, dt, gate_a, p.gate_c, m, cfg.factor)
            cute.make_tensor(p.ws_gt + slot * D, cute.make_layout(D))[chan] = gamma
            sm.sGb[chan] = cfg.factor(gamma)

    def wide_tile(self, sm: K1Smem) -> WideTile:
        """The general K1 after B1: whether the tile is wide (some gate warp voted so) and the
        buffers of its path, over Ki's, ebar's and e's."""
        stage_layout = cute.make_layout((CHUNK, PAD_ROW), stride=(PAD_ROW, 1))
        flag = sm.sWide[0] | sm.sWide[1] | sm.sWide[2] | sm.sWide[3]  # the same for every thread
        sQh = cute.make_tensor(sm.sKi_buf.iterator, stage_layout)
        sKh = cute.make_tensor(cute.recast_ptr(sm.sEbar.iterator, dtype=BFloat16), stage_layout)
        sL = cute.make_tensor(cute.recast_ptr(sm.sE.iterator, dtype=Float32), cute.make_layout((CHUNK, CHUNK),
                                                                                                 stride=(CHUNK, 1)))
        sM = cute.make_tensor(cute.recast_ptr(sm.sE.iterator, dtype=Float32) + CHUNK * CHUNK,
                              cute.make_layout((CHUNK, CHUNK), stride=(CHUNK, 1)))
        return WideTile(flag, sQh, sKh, sL, sM)

    @cute.jit
    def images(self, p: K1Params, sm: K1Smem, warp: Int32, wide, row: Int32, quad: Int32, is_k, hat: cute.Tensor,
               norm):
        """Stage 3 (w4-w7): the decayed tiles (P5) as raw images, then the fence that lets stage 4's
        bulk stores read them through the async proxy."""
        accurate = self.config.accurate
        inv_norm = norm[0] if cutlass.const_expr(accurate) else None
        if warp >= 4:
            if cutlass.const_expr(self.config.general):
                if wide.flag != 0:
                    # no Ki (2^-G overflows): its buffer and ebar's take q^ and k^ for the products
                    decayed_images_wide(hat, row, quad, is_k, sm.sE, sm.sG, sm.sQd, sm.sKd, sm.sKr, wide.sQh,
                                        wide.sKh, p.scale, accurate, inv_norm)
                else:
                    decayed_images(hat, row, quad, is_k, sm.sE, sm.sEbar, sm.sGb, sm.sQd, sm.sKd, sm.sKi, sm.sKr,
                                   p.scale, accurate, inv_norm, sm.sQlo, sm.sKilo)
            else:
                decayed_images(hat, row, quad, is_k, sm.sE, sm.sEbar, sm.sGb, sm.sQd, sm.sKd, sm.sKi, sm.sKr, p.scale,
                               accurate, inv_norm, sm.sQlo, sm.sKilo)
            # The S2G bulk copies read the images through the async proxy.
            cute.arch.fence_proxy("async.shared", space="cta")

    @cute.jit
    def store_images(self, p: K1Params, sm: K1Smem, warp: Int32, slot: Int64):
        """Stage 4, w7: one elected lane bulk-stores the three 4 KiB images, commits and waits."""
        if warp == 7:
            img_bytes = cute.make_layout(TILE_BYTES)
            ws_off = slot * TILE_BYTES
            bulk_s2g_elected([
                (cute.make_tensor(cute.recast_ptr(sm.sQd.iterator, dtype=Uint8), img_bytes),
                 cute.make_tensor(p.ws_qd + ws_off, img_bytes)),
                (cute.make_tensor(cute.recast_ptr(sm.sKd.iterator, dtype=Uint8), img_bytes),
                 cute.make_tensor(p.ws_kd + ws_off, img_bytes)),
                (cute.make_tensor(cute.recast_ptr(sm.sKr.iterator, dtype=Uint8), img_bytes),
                 cute.make_tensor(p.ws_kr + ws_off, img_bytes)),
            ])

    @cute.jit
    def products(self, p: K1Params, sm: K1Smem, warp: Int32, lane: Int32, wide, slot: Int64, m: Int32,
                 row_lo: Int32, logit_lo, logit_hi):
        """Stage 4, w0 and w1 (after the general K1's wide-tile products and B3): (Kd | Qd) Ki^T, 16x16
        over K = 128, 8 k-steps in order, fp32 accumulation (P6/P7); w0 turns L into INV and bsig
        (store_inverse), w1 Mqk (store_mqk)."""
        cfg = self.config
        if cutlass.const_expr(cfg.general):
            if wide.flag != 0:
                wide_tile_products(sm.sG, wide.sQh, wide.sKh, wide.sL, wide.sM, warp, lane, p.scale)
                sync_named(K1Barrier.WIDE_PRODUCTS, THREADS)
        if cutlass.const_expr(cfg.accurate):
            self.products_accurate(p, sm, warp, lane, wide, slot, m, row_lo, logit_lo, logit_hi)
        else:
            if warp < 2:
                a_img = _select(warp == 0, sm.sKd.iterator.toint(), sm.sQd.iterator.toint(), Int32) + lane * 16
                b_img = sm.sKi.iterator.toint() + lane * 16
                if cutlass.const_expr(cfg.general):
                    col0 = 2 * (lane & 3)
                    acc = self.general_products(
                        wide, lambda: _select(warp == 0, wide.sL.iterator.toint(), wide.sM.iterator.toint(), Int32),
                        a_img, b_img, row_lo, col0)
                else:
                    acc = qk_products(a_img, b_img)
                    # Fragment coordinates: row 8h + row_lo, column 8nb + col0 + {0, 1}; only the diagonal
                    # blocks (h == nb) need per-element masks, compared on block-local indices.
                    col0 = 2 * (lane & 3)

                word_out = row_lo * (CHUNK // 2) + (lane & 3)  # u32 index of (row_lo, col0) in a 16x16 bf16 tile
                small_off = slot * (CHUNK * CHUNK)
                if warp == 0:
                    self.store_inverse(p, acc, lane, row_lo, col0, logit_lo, logit_hi, word_out, small_off, slot, m)
                else:
                    self.store_mqk(p, acc, row_lo, col0, word_out, small_off)

    @cute.jit
    def general_products(self, wide, wide_src, a_img, b_img, row_lo: Int32, col0: Int32):
        """A general K1's 16x16 accumulator (qk_products' layout): a wide tile's from
        wide_tile_products (the fp32 matrix at the shared address wide_src() forms, inside the
        wide branch as before), the others' from the images."""
        acc_r = cute.make_rmem_tensor(8, Float32)
        if wide.flag != 0:
            frags = product_fragments(wide_src(), row_lo, col0)
            for i in cutlass.range_constexpr(8):
                acc_r[i] = frags[i // 4][i % 4]
        else:
            frags = qk_products(a_img, b_img)
            for i in cutlass.range_constexpr(8):
                acc_r[i] = frags[i // 4][i % 4]
        return [[acc_r[0], acc_r[1], acc_r[2], acc_r[3]], [acc_r[4], acc_r[5], acc_r[6], acc_r[7]]]

    @cute.jit
    def products_accurate(self, p: K1Params, sm: K1Smem, warp: Int32, lane: Int32, wide, slot: Int64, m: Int32,
                          row_lo: Int32, logit_lo, logit_hi):
        """Stage 4 of K1': w0 as in products (L = Kd Ki^T, INV and bsig); Mqk from the fp32 operands'
        bf16 pairs (tile_prep.mqk_split_products), w1 column block 0 and w2 block 1, three products
        each. A general K1's wide tile takes Mqk from wide_tile_products in w1."""
        cfg = self.config
        col0 = 2 * (lane & 3)
        word_out = row_lo * (CHUNK // 2) + (lane & 3)  # u32 index of (row_lo, col0) in a 16x16 bf16 tile
        small_off = slot * (CHUNK * CHUNK)
        if warp == 0:
            a_img = sm.sKd.iterator.toint() + lane * 16
            b_img = sm.sKi.iterator.toint() + lane * 16
            if cutlass.const_expr(cfg.general):
                acc = self.general_products(wide, lambda: wide.sL.iterator.toint(), a_img, b_img, row_lo, col0)
            else:
                acc = qk_products(a_img, b_img)
            self.store_inverse(p, acc, lane, row_lo, col0, logit_lo, logit_hi, word_out, small_off, slot, m)
        else:
            if warp < 3:
                if cutlass.const_expr(cfg.general):
                    if wide.flag != 0:
                        if warp == 1:
                            frags = product_fragments(wide.sM.iterator.toint(), row_lo, col0)
                            self.store_mqk(p, frags, row_lo, col0, word_out, small_off)
                    else:
                        self.mqk_split_block(p, sm, warp, lane, row_lo, col0, word_out, small_off)
                else:
                    self.mqk_split_block(p, sm, warp, lane, row_lo, col0, word_out, small_off)

    def mqk_split_block(self, p: K1Params, sm: K1Smem, warp, lane, row_lo, col0, word_out, small_off):
        """w1 / w2 of K1': column block warp - 1 of Mqk from the bf16 pairs, masked and stored."""
        nb = warp - 1
        lane_off = lane * 16
        acc = mqk_split_products(sm.sQd.iterator.toint() + lane_off, sm.sQlo.iterator.toint() + lane_off,
                                 sm.sKi.iterator.toint() + lane_off, sm.sKilo.iterator.toint() + lane_off, nb)
        mMqk = cute.make_tensor(cute.recast_ptr(p.ws_mqk + small_off, dtype=Uint32),
                                cute.make_layout(CHUNK * CHUNK // 2))

        def store(h, w):
            mMqk[word_out + h * 8 * (CHUNK // 2) + nb * 4] = w

        mqk_block_words(acc, row_lo, col0, nb, store)

    @cute.jit
    def store_inverse(self, p: K1Params, acc, lane: Int32, row_lo: Int32, col0: Int32, logit_lo, logit_hi,
                      word_out: Int32, small_off: Int64, slot: Int64, m: Int32):
        """w0: L -> INV = (I+L)^-1 (tile_prep.inverse_fragments) and bf(sigma(beta)), stored."""
        inv, sig_lo, sig_hi = inverse_fragments(acc, row_lo, col0, logit_lo, logit_hi, lane, self.config.beta_form)
        mInv = cute.make_tensor(cute.recast_ptr(p.ws_inv + small_off, dtype=Uint32),
                                cute.make_layout(CHUNK * CHUNK // 2))
        for nb in cutlass.range_constexpr(2):
            for h in cutlass.range_constexpr(2):
                mInv[word_out + h * 8 * (CHUNK // 2) + nb * 4] = inv[nb][h]
        if (lane & 3) == 0:
            mBsig = cute.make_tensor(p.ws_bsig + slot * CHUNK, cute.make_layout(CHUNK))
            mBsig[row_lo] = BFloat16(_select(row_lo < m, round_bf16(sig_lo), 0.0, Float32))
            mBsig[row_lo + 8] = BFloat16(_select(row_lo + 8 < m, round_bf16(sig_hi), 0.0, Float32))
            if cutlass.const_expr(self.config.accurate):
                # the residue plane (docs/kernel_abi.md, bsig): bf(sigma - bf(sigma)), which the
                # accurate K2 and pre_scan add back (sigma to 16 bits)
                plane = bsig_residue_slot0(p.n_heads, p.cap) * CHUNK
                mLo = cute.make_tensor(p.ws_bsig + (plane + slot * CHUNK), cute.make_layout(CHUNK))
                mLo[row_lo] = BFloat16(_select(row_lo < m, round_bf16(sub_rn(sig_lo, round_bf16(sig_lo))), 0.0,
                                               Float32))
                mLo[row_lo + 8] = BFloat16(_select(row_lo + 8 < m, round_bf16(sub_rn(sig_hi, round_bf16(sig_hi))),
                                                   0.0, Float32))

    def store_mqk(self, p: K1Params, acc, row_lo, col0, word_out, small_off):
        """w1, P7: Mqk = bf(acc), keep i >= j."""
        def make_store():
            mMqk = cute.make_tensor(cute.recast_ptr(p.ws_mqk + small_off, dtype=Uint32),
                                    cute.make_layout(CHUNK * CHUNK // 2))

            def store(nb, h, w):
                mMqk[word_out + h * 8 * (CHUNK // 2) + nb * 4] = w
            return store

        mqk_words(acc, row_lo, col0, make_store)


# The registry's entry name (the manifest's): the class whose __call__ is the host entry (compile.py).
k1_prepare = K1Prepare
