"""One 16-token tile's preparation, the arithmetic of K1's stages (k1_prepare.py; docs/algorithm.md
§2.4 P1-P8): the L2 norm, the gate and its decay factors, the decayed tile images, and the two 16 x 16
products with the inverse. A module of its own so that every kernel which prepares tiles traces the
very same operations, in the same order, and so writes the same bits.

Each function is traced inline into its caller: the shared-memory buffers (cute tensors) and the
thread's coordinates come in, registers go out, and where a stage writes per-fragment results the
caller passes the store (so that its order among the arithmetic stays what K1's always was).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32

from ... import shared_constants as ABI_CONSTANTS
from .ptx_ops import (add_bf16x2, add_rn, add_rn_ftz, ex2_approx_ftz, f32x2_to_bf16x2, fma_rn_ftz, ld_shared_v4,
                      ldmatrix_x4, lds_b32, lds_f32, lg2_approx_ftz, mma_m16n8k16_bf16_f32, movmatrix_trans,
                      mul_rn_ftz, rsqrt_approx_ftz, st_shared_v4, sub_rn, u32_as_f32)
from .tile_ops import CHUNK, D, LOG2E, bf16x2_to_f32x2, raw_tile_layout, round_bf16, sigmoid_tanh

PAD_ROW = D + 8  # staging row stride in elements (272 B, a multiple of 16 for the bulk copies)
KSTEP_BYTES = 512  # one 16-column k-step of a raw image: core matrices (0,2kk),(1,2kk),(0,2kk+1),(1,2kk+1)
# Row stride (elements) of the fp32 decay factors (numerics="accurate"). Stage 3 reads them 32 bytes
# per lane with 8 consecutive rows in 8 consecutive lanes: at PAD_ROW (544 B) those rows start 8 banks
# apart, so a quarter warp touches 16 of the 32 banks (2-way conflicts); at 528 B they start 4 apart.
F32_FACTOR_ROW = D + 4

# The general K1's forms by their codes (build_kernels/shared_constants.py GATE_CODES, BETA_CODES, the
# one table of them). Gate 0 is FlashKDA's K1 itself, whose code paths below are those of the
# default arguments.
_GATE, _BETA = dict(ABI_CONSTANTS.GATE_CODES), dict(ABI_CONSTANTS.BETA_CODES)
GATE_SAFE, GATE_SIGMOID, GATE_SOFTPLUS, GATE_LOGDECAY = (_GATE[g] for g in ("safe", "sigmoid", "softplus", "log_decay"))
BETA_LOGITS, BETA_LOGITS2, BETA_PROBS = (_BETA[b] for b in ("logits", "logits2", "probs"))
# A tile whose cumulative log2-decay stays within +-FAST_RANGE on every channel keeps FlashKDA's
# factorization (2^G, 2^-G): both factors are normal numbers and every product of them, the masked
# upper triangle of Kd Ki^T included, stays below 2^(FAST_RANGE + 7), inside fp32's 2^128. Other tiles
# ("wide" tiles) form the two 16 x 16 products element by element (wide_tile_products).
FAST_RANGE = 120.0
# log1p(y) by its series below y = 1/16: five terms leave a relative error under y^5 / 6 < 1.6e-7, where
# lg2.approx(1 + y) would carry an absolute error near 2^-22 on a result of about 1.44 y.
SOFTPLUS_SERIES_BELOW = 0.0625
SOFTPLUS_LINEAR_ABOVE = 20.0  # softplus(x) = x past it, as FLA's softplus


def select(cond, a, b, ty):
    return ty(cutlass.select_(cond, ty(a), ty(b)))


# --- register-fragment algebra for the 16x16 products -----------------------------------------------
# A 16x16 matrix M in mma accumulator layout is M[nb][h]: one word per lane holding row 8h + lane//4,
# columns 8nb + 2(lane%4) + {0, 1}. That is also exactly the A operand {M00, M01, M10, M11}; the B
# operand of column block nb is the transpose of the row-0 / row-1 blocks of that column block.

def _a_operand(M):
    return (M[0][0], M[0][1], M[1][0], M[1][1])


def _b_operands(M):
    return [(movmatrix_trans(M[nb][0]), movmatrix_trans(M[nb][1])) for nb in range(2)]


def _matmul_bf16(a_op, b_ops):
    """bf16 x bf16 with fp32 accumulation from zero, 16x16x16: [nb][2h + e] accumulators."""
    zero = Float32(0.0)
    return [list(mma_m16n8k16_bf16_f32(a_op, b_ops[nb], (zero, zero, zero, zero))) for nb in range(2)]


def _bf16_words(acc):
    """A 16x16 fp32 accumulator as bf16 fragment words [nb][h] (round to nearest even)."""
    return [[f32x2_to_bf16x2(acc[nb][2 * h], acc[nb][2 * h + 1]) for h in range(2)] for nb in range(2)]


def _f32x4(addr):
    """Four consecutive fp32 values from shared memory (16-byte aligned address)."""
    return [u32_as_f32(w) for w in ld_shared_v4(addr)]


def _f32x8(addr):
    """Eight consecutive fp32 values from shared memory (32-byte aligned address)."""
    words = ld_shared_v4(addr) + ld_shared_v4(addr + 16)
    return [u32_as_f32(w) for w in words]


def l2norm_hat(src, row_valid, quad, hat, keep_raw=False):
    """P1 for one token row of q or k (4 lanes per row, 4 chunks of 8 per lane): the staging row at
    shared address `src` (rows >= m were never loaded, read as zero) into hat[0..15], bf(x * rsqrt)
    as 4 words per chunk. keep_raw (numerics="accurate"): hat keeps the row x itself (zero past m)
    and the return value rsqrt lets stage 3 form q^ = x * rsqrt in fp32 (hat_f32x2), so q^ and k^
    are never rounded before they are gated; the registers are the same 16 words plus one."""
    xs = []
    partial = []
    for s in range(4):
        words = ld_shared_v4(src + 16 * (quad + 4 * s))
        if keep_raw:
            for t in range(4):
                hat[4 * s + t] = select(row_valid, words[t], 0, Uint32)
        vals = []
        for t in range(4):
            lo_v, hi_v = bf16x2_to_f32x2(words[t])
            # Rows >= m were never loaded: their staging bytes are stale, use zero.
            vals.append(select(row_valid, lo_v, 0.0, Float32))
            vals.append(select(row_valid, hi_v, 0.0, Float32))
        p = Float32(0.0)
        for v in vals:
            p = fma_rn_ftz(v, v, p)
        xs.append(vals)
        partial.append(p)
    # Butterfly p_j += p_{j^o}, o = 8, 4, 2, 1: j^8 and j^4 are this lane's s^2 and s^1, j^2 and
    # j^1 are lanes ^16 and ^8. IEEE addition commutes, so every lane of a row ends bit-equal.
    t8 = [add_rn_ftz(partial[s], partial[s ^ 2]) for s in range(2)]
    ssq = add_rn_ftz(t8[0], t8[1])
    ssq = add_rn_ftz(ssq, cute.arch.shuffle_sync_bfly(ssq, offset=16))
    ssq = add_rn_ftz(ssq, cute.arch.shuffle_sync_bfly(ssq, offset=8))
    inv_norm = rsqrt_approx_ftz(add_rn_ftz(ssq, Float32(1e-6)))
    if not keep_raw:
        for s in range(4):
            for t in range(4):
                hat[4 * s + t] = f32x2_to_bf16x2(mul_rn_ftz(xs[s][2 * t], inv_norm),
                                                 mul_rn_ftz(xs[s][2 * t + 1], inv_norm))
    return inv_norm


def hat_f32x2(word, inv_norm):
    """Two elements of q^ or k^ in fp32 from a raw hat word (l2norm_hat keep_raw): x * rsqrt, the
    product that FlashKDA's recipe rounds to bf16 at once."""
    x0, x1 = bf16x2_to_f32x2(word)
    return mul_rn_ftz(x0, inv_norm), mul_rn_ftz(x1, inv_norm)


def split_bf16x2(a0, a1):
    """(hi, lo) words of two fp32 values: hi = bf(a), lo = bf(a - hi). a - hi is exact in fp32 (hi is
    a's nearest bf16), and sub.rn keeps subnormal differences, as the reference's subtraction does."""
    hi = f32x2_to_bf16x2(a0, a1)
    h0, h1 = bf16x2_to_f32x2(hi)
    return hi, f32x2_to_bf16x2(sub_rn(a0, h0), sub_rn(a1, h1))


def gate_factors(sGin, sE, sEbar, chan, dt, a_log_h, gate_c, m, factor):
    """P2-P4 for one key channel (one thread): activation, the sequential cumulative sum over the 16
    rows, e = 2^G and ebar = 2^-G into sE and sEbar as `factor` (bf16, or fp32 for "accurate").
    Returns gamma = 2^G_tot (fp32)."""
    A = ex2_approx_ftz(mul_rn_ftz(a_log_h, Float32(LOG2E)))
    G = Float32(0.0)
    for r in range(CHUNK):
        x = add_rn_ftz(Float32(sGin[r, chan]), dt)
        x = mul_rn_ftz(A, x)
        a2 = mul_rn_ftz(gate_c, sigmoid_tanh(x))
        # Padded rows add exactly 0, so G stays at the last valid row and gamma is right.
        G = add_rn_ftz(G, select(r < m, a2, 0.0, Float32))
        sE[r, chan] = factor(ex2_approx_ftz(G))
        sEbar[r, chan] = factor(ex2_approx_ftz(-G))
    gamma = ex2_approx_ftz(G)
    return gamma


def softplus_log2(x) -> Float32:
    """log2(1 + e^x) in fp32: softplus(x) in base 2, the activation of gate="softplus" (docs/gate_forms.md)."""
    t = mul_rn_ftz(x, Float32(LOG2E))
    y = ex2_approx_ftz(t)
    ny = -y
    series = fma_rn_ftz(y, Float32(-0.2), Float32(0.25))
    for c in (1.0 / 3.0, 0.5, 1.0):
        series = fma_rn_ftz(ny, series, Float32(c))
    series = mul_rn_ftz(mul_rn_ftz(y, series), Float32(LOG2E))
    direct = lg2_approx_ftz(add_rn_ftz(Float32(1.0), y))
    small = select(y < Float32(SOFTPLUS_SERIES_BELOW), series, direct, Float32)
    return select(x > Float32(SOFTPLUS_LINEAR_ABOVE), t, small, Float32)


def gate_factors_general(sGin, sE, sEbar, sG, chan, dt, A, gate_c, m, factor, gate_form):
    """P2-P4 of the general K1 for one key channel (one thread): the form's log2-decay per row, its
    cumulative sum G over the rows (fp32, also kept in sG for wide tiles), e = 2^G and ebar = 2^-G
    into sE / sEbar as gate_factors writes them. Returns (gamma = 2^G_tot, wide): wide is 1 when
    |G| exceeds FAST_RANGE on some row of this channel."""
    G = Float32(0.0)
    wide = Int32(0)
    for r in range(CHUNK):
        x = Float32(sGin[r, chan])
        if gate_form == GATE_LOGDECAY:
            a2 = mul_rn_ftz(x, Float32(LOG2E))
        else:
            x = add_rn_ftz(x, dt)
            if gate_form == GATE_SIGMOID:
                a2 = mul_rn_ftz(gate_c, sigmoid_tanh(mul_rn_ftz(A, x)))
            else:
                a2 = mul_rn_ftz(-A, softplus_log2(x))
        G = add_rn_ftz(G, select(r < m, a2, 0.0, Float32))
        sE[r, chan] = factor(ex2_approx_ftz(G))
        sEbar[r, chan] = factor(ex2_approx_ftz(-G))
        sG[r, chan] = G
        wide = wide | select(G < Float32(-FAST_RANGE), 1, 0, Int32) | select(G > Float32(FAST_RANGE), 1, 0, Int32)
    return ex2_approx_ftz(G), wide


@cute.jit
def decayed_images(hat: cute.Tensor, row: Int32, quad: Int32, is_k: cutlass.Boolean, sE: cute.Tensor,
                   sEbar: cute.Tensor, sGb: cute.Tensor, sQd: cute.Tensor, sKd: cute.Tensor, sKi: cute.Tensor,
                   sKr: cute.Tensor, scale: Float32, accurate: cutlass.Constexpr[bool], inv_norm=None, sQlo=None,
                   sKilo=None):
    """P5 for one token row (4 lanes per row): from the normed row `hat` of k (is_k) or q, the decayed
    tiles written as raw 8x8-core-matrix images (docs/algorithm.md §4.8): Kd, Ki and Kr from k, Qd
    from q. accurate: hat is the raw row and inv_norm its rsqrt (l2norm_hat keep_raw); each gated
    operand is rounded once from fp32 q^ / k^ and fp32 factors (K1', docs/numerics.md), and the
    rounding residues of Qd and Ki go to sQlo and sKilo for Mqk (mqk_split_products)."""
    if cutlass.const_expr(accurate):
        # ---- stage 3 of numerics="accurate" (K1'): Qd = bf(q^ 2^G scale), Kd = bf(k^ 2^G),
        # Ki = bf(k^ 2^-G), Kr = bf(k^ 2^-G gamma), each rounded once from fp32 q^, k^ and factors.
        e_row = sE.iterator.toint() + row * (F32_FACTOR_ROW * 4)
        ebar_row = sEbar.iterator.toint() + row * (F32_FACTOR_ROW * 4)
        for s in cutlass.range_constexpr(4):
            j = quad + 4 * s
            img = 2 * cute.crd2idx((row, 8 * j), raw_tile_layout())
            ev = _f32x8(e_row + 32 * j)
            if is_k:
                ebv = _f32x8(ebar_row + 32 * j)
                gv = _f32x8(sGb.iterator.toint() + 32 * j)
                kd = []
                ki = []
                ki_lo = []
                kr = []
                for t in cutlass.range_constexpr(4):
                    k0, k1 = hat_f32x2(hat[4 * s + t], inv_norm)
                    kd.append(f32x2_to_bf16x2(k0 * ev[2 * t], k1 * ev[2 * t + 1]))
                    i0 = k0 * ebv[2 * t]
                    i1 = k1 * ebv[2 * t + 1]
                    hi, lo = split_bf16x2(i0, i1)
                    ki.append(hi)
                    ki_lo.append(lo)
                    kr.append(f32x2_to_bf16x2(i0 * gv[2 * t], i1 * gv[2 * t + 1]))
                st_shared_v4(sKd.iterator.toint() + img, kd)
                st_shared_v4(sKi.iterator.toint() + img, ki)
                st_shared_v4(sKilo.iterator.toint() + img, ki_lo)
                st_shared_v4(sKr.iterator.toint() + img, kr)
            else:
                qd = []
                qd_lo = []
                for t in cutlass.range_constexpr(4):
                    q0, q1 = hat_f32x2(hat[4 * s + t], inv_norm)
                    hi, lo = split_bf16x2((q0 * ev[2 * t]) * scale, (q1 * ev[2 * t + 1]) * scale)
                    qd.append(hi)
                    qd_lo.append(lo)
                st_shared_v4(sQd.iterator.toint() + img, qd)
                st_shared_v4(sQlo.iterator.toint() + img, qd_lo)
    else:
        # ---- stage 3: decayed tiles (P5), written into the raw images.
        e_row = sE.iterator.toint() + row * (PAD_ROW * 2)
        ebar_row = sEbar.iterator.toint() + row * (PAD_ROW * 2)
        if is_k:
            for s in cutlass.range_constexpr(4):
                j = quad + 4 * s
                img = 2 * cute.crd2idx((row, 8 * j), raw_tile_layout())
                we = ld_shared_v4(e_row + 16 * j)
                web = ld_shared_v4(ebar_row + 16 * j)
                wgb = ld_shared_v4(sGb.iterator.toint() + 16 * j)
                kd = []
                ki = []
                kr = []
                for t in cutlass.range_constexpr(4):
                    k0, k1 = bf16x2_to_f32x2(hat[4 * s + t])
                    e0, e1 = bf16x2_to_f32x2(we[t])
                    eb0, eb1 = bf16x2_to_f32x2(web[t])
                    gb0, gb1 = bf16x2_to_f32x2(wgb[t])
                    kd.append(f32x2_to_bf16x2(k0 * e0, k1 * e1))
                    ki_w = f32x2_to_bf16x2(k0 * eb0, k1 * eb1)
                    ki.append(ki_w)
                    i0, i1 = bf16x2_to_f32x2(ki_w)
                    kr.append(f32x2_to_bf16x2(i0 * gb0, i1 * gb1))
                st_shared_v4(sKd.iterator.toint() + img, kd)
                st_shared_v4(sKi.iterator.toint() + img, ki)
                st_shared_v4(sKr.iterator.toint() + img, kr)
        else:
            bscale = round_bf16(scale)
            for s in cutlass.range_constexpr(4):
                j = quad + 4 * s
                img = 2 * cute.crd2idx((row, 8 * j), raw_tile_layout())
                we = ld_shared_v4(e_row + 16 * j)
                qd = []
                for t in cutlass.range_constexpr(4):
                    q0, q1 = bf16x2_to_f32x2(hat[4 * s + t])
                    e0, e1 = bf16x2_to_f32x2(we[t])
                    qe0, qe1 = bf16x2_to_f32x2(f32x2_to_bf16x2(q0 * e0, q1 * e1))
                    qd.append(f32x2_to_bf16x2(qe0 * bscale, qe1 * bscale))
                st_shared_v4(sQd.iterator.toint() + img, qd)
    # The S2G bulk copies read the images through the async proxy.


@cute.jit
def decayed_images_wide(hat: cute.Tensor, row: Int32, quad: Int32, is_k: cutlass.Boolean, sE: cute.Tensor,
                        sG: cute.Tensor, sQd: cute.Tensor, sKd: cute.Tensor, sKr: cute.Tensor, sQh: cute.Tensor,
                        sKh: cute.Tensor, scale: Float32, accurate: cutlass.Constexpr[bool], inv_norm=None):
    """decayed_images for a wide tile (docs/gate_forms.md): Qd and Kd from e = 2^G <= 1 by the same
    recipe, Kr = bf(k 2^(G_tot - G)) with the exponent formed as a difference (Ki * gamma would
    overflow), no Ki; the normed row q^ or k^ is kept (bf16, staging stride) for wide_tile_products.
    accurate: hat is the raw row (l2norm_hat keep_raw), the images come from fp32 q^ / k^."""
    e_stride = F32_FACTOR_ROW * 4 if cutlass.const_expr(accurate) else PAD_ROW * 2
    e_row = sE.iterator.toint() + row * e_stride
    g_row = sG.iterator.toint() + row * (F32_FACTOR_ROW * 4)
    g_last = sG.iterator.toint() + (CHUNK - 1) * (F32_FACTOR_ROW * 4)
    bscale = round_bf16(scale)
    for s in cutlass.range_constexpr(4):
        j = quad + 4 * s
        img = 2 * cute.crd2idx((row, 8 * j), raw_tile_layout())
        words = []
        vals = []  # q^ / k^ in fp32 (accurate only)
        for t in cutlass.range_constexpr(4):
            if cutlass.const_expr(accurate):
                v0, v1 = hat_f32x2(hat[4 * s + t], inv_norm)
                vals.append((v0, v1))
                words.append(f32x2_to_bf16x2(v0, v1))
            else:
                words.append(hat[4 * s + t])
        if is_k:
            st_shared_v4(sKh.iterator.toint() + row * (PAD_ROW * 2) + 16 * j, words)
            kd = []
            kr = []
            for half in cutlass.range_constexpr(2):  # four channels at a time: 48 registers hold it
                gv = _f32x4(g_row + 32 * j + 16 * half)
                gl = _f32x4(g_last + 32 * j + 16 * half)
                ev = _factors4(e_row, j, half, accurate)
                for t in cutlass.range_constexpr(2):
                    if cutlass.const_expr(accurate):
                        k0, k1 = vals[2 * half + t]
                    else:
                        k0, k1 = bf16x2_to_f32x2(words[2 * half + t])
                    kd.append(f32x2_to_bf16x2(k0 * ev[2 * t], k1 * ev[2 * t + 1]))
                    kr.append(f32x2_to_bf16x2(k0 * ex2_approx_ftz(gl[2 * t] - gv[2 * t]),
                                              k1 * ex2_approx_ftz(gl[2 * t + 1] - gv[2 * t + 1])))
            st_shared_v4(sKd.iterator.toint() + img, kd)
            st_shared_v4(sKr.iterator.toint() + img, kr)
        else:
            st_shared_v4(sQh.iterator.toint() + row * (PAD_ROW * 2) + 16 * j, words)
            qd = []
            for half in cutlass.range_constexpr(2):
                ev = _factors4(e_row, j, half, accurate)
                for t in cutlass.range_constexpr(2):
                    if cutlass.const_expr(accurate):
                        q0, q1 = vals[2 * half + t]
                        qd.append(f32x2_to_bf16x2((q0 * ev[2 * t]) * scale, (q1 * ev[2 * t + 1]) * scale))
                    else:
                        q0, q1 = bf16x2_to_f32x2(words[2 * half + t])
                        qe0, qe1 = bf16x2_to_f32x2(f32x2_to_bf16x2(q0 * ev[2 * t], q1 * ev[2 * t + 1]))
                        qd.append(f32x2_to_bf16x2(qe0 * bscale, qe1 * bscale))
            st_shared_v4(sQd.iterator.toint() + img, qd)


def _factors4(e_row, j, half, accurate):
    """Four decay factors e of chunk j (channels 8j + 4 half ..): fp32 (accurate) or bf16 widened."""
    if accurate:
        return _f32x4(e_row + 32 * j + 16 * half)
    words = ld_shared_v4(e_row + 16 * j)
    return bf16x2_to_f32x2(words[2 * half]) + bf16x2_to_f32x2(words[2 * half + 1])


@cute.jit
def wide_tile_products(sG: cute.Tensor, sQh: cute.Tensor, sKh: cute.Tensor, sL: cute.Tensor, sM: cute.Tensor,
                       warp: Int32, lane: Int32, scale: Float32):
    """The two 16 x 16 products of a wide tile, element by element: L[i, j] = sum_c k^_i k^_j 2^(G_i - G_j)
    (j < i) and Mqk[i, j] = scale sum_c q^_i k^_j 2^(G_i - G_j) (j <= i), fp32, every exponent a difference
    of the cumulative log-decays, so no factor leaves fp32's range (docs/gate_forms.md). Entries above
    the diagonal are written as 0. Warp w takes rows w and 15 - w (17 pairs), lane l the channels 4l..4l+3;
    a butterfly over the lanes sums them."""
    g_base = sG.iterator.toint()
    q_base = sQh.iterator.toint()
    k_base = sKh.iterator.toint()
    g_row_bytes = F32_FACTOR_ROW * 4
    h_row_bytes = PAD_ROW * 2
    for rr in cutlass.range_constexpr(2):
        i = warp
        if cutlass.const_expr(rr == 1):
            i = (CHUNK - 1) - warp
        gi = _f32x4(g_base + i * g_row_bytes + 16 * lane)
        qi = bf16x2_to_f32x2(lds_b32(q_base + i * h_row_bytes + 8 * lane)) + \
            bf16x2_to_f32x2(lds_b32(q_base + i * h_row_bytes + 8 * lane + 4))
        ki = bf16x2_to_f32x2(lds_b32(k_base + i * h_row_bytes + 8 * lane)) + \
            bf16x2_to_f32x2(lds_b32(k_base + i * h_row_bytes + 8 * lane + 4))
        for j in cutlass.range(CHUNK, unroll=1):  # a loop, not unrolled: the path is rare, registers are not
            gj = _f32x4(g_base + j * g_row_bytes + 16 * lane)
            kj = bf16x2_to_f32x2(lds_b32(k_base + j * h_row_bytes + 8 * lane)) + \
                bf16x2_to_f32x2(lds_b32(k_base + j * h_row_bytes + 8 * lane + 4))
            l_sum = Float32(0.0)
            m_sum = Float32(0.0)
            for c in cutlass.range_constexpr(4):
                f = ex2_approx_ftz(gi[c] - gj[c])
                l_sum = fma_rn_ftz(ki[c] * kj[c], f, l_sum)
                m_sum = fma_rn_ftz(qi[c] * kj[c], f, m_sum)
            for step in cutlass.range_constexpr(5):
                l_sum = l_sum + cute.arch.shuffle_sync_bfly(l_sum, offset=16 >> step)
                m_sum = m_sum + cute.arch.shuffle_sync_bfly(m_sum, offset=16 >> step)
            if lane == 0:
                sL[i, j] = select(j < i, l_sum, 0.0, Float32)
                sM[i, j] = select(j <= i, m_sum * scale, 0.0, Float32)


def product_fragments(src_addr, row_lo, col0):
    """A 16 x 16 fp32 matrix (row-major, shared address src_addr) in the accumulator layout qk_products
    returns: acc[nb][2h + e] = M[8h + row_lo, 8nb + col0 + e]."""
    return [[lds_f32(src_addr + 4 * ((8 * h + row_lo) * CHUNK + 8 * nb + col0 + e)) for h in range(2) for e in range(2)]
            for nb in range(2)]


def qk_products(a_img, b_img):
    """(Kd | Qd) Ki^T, 16x16 over K = 128, for one warp: 8 k-steps in order, fp32 accumulation
    (P6/P7), from the lane's ldmatrix addresses of the A image and of Ki."""
    zero = Float32(0.0)
    acc = [[zero, zero, zero, zero], [zero, zero, zero, zero]]
    for kk in range(D // 16):
        a_op = ldmatrix_x4(a_img + kk * KSTEP_BYTES)
        b4 = ldmatrix_x4(b_img + kk * KSTEP_BYTES)  # Ki rows 0-7 / 8-15 are the two n-blocks
        acc[0] = list(mma_m16n8k16_bf16_f32(a_op, (b4[0], b4[2]), acc[0]))
        acc[1] = list(mma_m16n8k16_bf16_f32(a_op, (b4[1], b4[3]), acc[1]))
    return acc


def mqk_split_products(q_img, qlo_img, ki_img, kilo_img, nb):
    """numerics="accurate" (K1'): column block nb (warp-uniform) of Mqk = Qd32 Ki32^T, with each fp32
    operand as a bf16 pair hi + lo (decayed_images): Qd Ki^T, Qd_lo Ki^T and Qd Ki_lo^T in three fp32
    accumulators over the 8 k-steps in order, summed (Qd_lo Ki^T + Qd Ki_lo^T) + Qd Ki^T. The lo x lo
    term (about 2^-16 of a product) is far below the bf16 rounding of Mqk. Returns the block's four
    accumulator values in qk_products' layout (acc[nb])."""
    zero = Float32(0.0)
    main = [zero, zero, zero, zero]
    q_lo = [zero, zero, zero, zero]
    k_lo = [zero, zero, zero, zero]
    second = nb != 0
    for kk in range(D // 16):
        off = kk * KSTEP_BYTES
        a_op = ldmatrix_x4(q_img + off)
        a_lo = ldmatrix_x4(qlo_img + off)
        b4 = ldmatrix_x4(ki_img + off)  # Ki rows 0-7 / 8-15 are the two n-blocks
        b4_lo = ldmatrix_x4(kilo_img + off)
        b_op = (select(second, b4[1], b4[0], Uint32), select(second, b4[3], b4[2], Uint32))
        b_lo = (select(second, b4_lo[1], b4_lo[0], Uint32), select(second, b4_lo[3], b4_lo[2], Uint32))
        main = list(mma_m16n8k16_bf16_f32(a_op, b_op, main))
        q_lo = list(mma_m16n8k16_bf16_f32(a_lo, b_op, q_lo))
        k_lo = list(mma_m16n8k16_bf16_f32(a_op, b_lo, k_lo))
    return [add_rn(add_rn(q_lo[i], k_lo[i]), main[i]) for i in range(4)]


def mqk_block_words(acc, row_lo, col0, nb, store):
    """P7 on column block nb (warp-uniform) of Mqk (mqk_split_products): bf(acc), causal (i >= j);
    store(h, word) for the block's two fragment words, as mqk_words masks them."""
    causal_mask = _causal_mask(row_lo, col0)
    first = nb == 0
    masks = (select(first, causal_mask, 0, Uint32), select(first, 0xFFFFFFFF, causal_mask, Uint32))
    for h in range(2):
        store(h, f32x2_to_bf16x2(acc[2 * h], acc[2 * h + 1]) & masks[h])


def beta_strength(x, beta_form):
    """b from the loaded beta value: sigma~(x) (FlashKDA's), 2 sigma~(x) (allow_neg_eigval) or x (probabilities)."""
    if beta_form == BETA_PROBS:
        return x
    sig = sigmoid_tanh(x)
    return mul_rn_ftz(sig, Float32(2.0)) if beta_form == BETA_LOGITS2 else sig


def _forward_substitution(x, row, col0, lane):
    """The inverse of one unit lower 8x8 diagonal block of I + L in fp32 (P8), in place on the lane's
    two entries x = [X[row, col0], X[row, col0 + 1]] (block-local row `row` = lane // 4), which
    start as -L below the diagonal, 1 on it and 0 above. Step s takes row s as the pivot (final
    after step s - 1) and, for every row below it, X[i, p] = fma(X[i, s], X[s, p], X[i, p]) on the
    columns p < s, where X[i, s] is still -L[i, s]: FlashKDA's order (rank-1 updates below the
    pivot, s ascending), one rounding per fma. Row s lives in lanes 4s .. 4s + 3, column s of the
    lane's own row in lane (lane & ~3) | (s >> 1)."""
    for s in range(1, 7):  # step 0 updates nothing left of the pivot, row 7 is never one
        mult = cute.arch.shuffle_sync(x[s & 1], (lane & ~3) | (s >> 1))
        below = row > s
        for e in range(2):
            pivot = cute.arch.shuffle_sync(x[e], 4 * s + (lane & 3))
            x[e] = select(below & (col0 + e < s), fma_rn_ftz(mult, pivot, x[e]), x[e], Float32)
    return x


def inverse_fragments(acc, row_lo, col0, logit_lo, logit_hi, lane, beta_form=BETA_LOGITS):
    """P6 and P8 on Kd Ki^T's accumulator (FlashKDA's stable-inverse recipe, docs/algorithm.md
    §2.4): L = fp32(acc * b) per row, strictly lower; the two 8x8 diagonal blocks A, B of I + L
    inverted in fp32 by forward substitution, then the 16x16 merged with bf16 operands and fp32
    accumulation: P = diag(bf(A^-1), bf(B^-1)), M = [0 0; bf(C) 0] with C = L's lower-left block,
    dc = P M, o = bf(-dc) P, INV = P + bf(o), as (I + L)^-1 = [A^-1 0; -B^-1 C A^-1 B^-1]. No power
    of L is formed, so keys that are nearly parallel inside a tile (entries of L near 1) keep INV
    accurate. b = sigma(beta) for FlashKDA's logits (beta_strength gives the other forms).
    Returns (INV as bf16 fragment words [nb][h], b of rows row_lo and row_lo + 8)."""
    sig = [beta_strength(logit_lo, beta_form), beta_strength(logit_hi, beta_form)]
    zero = Float32(0.0)
    # P6: the diagonal blocks (h == nb) as -L below the diagonal, 1 on it, 0 above; the
    # lower-left block C (h = 1, nb = 0) as L itself.
    blocks = []
    for d in range(2):
        x = []
        for e in range(2):
            c = col0 + e
            neg_l = -mul_rn_ftz(acc[d][2 * d + e], sig[d])
            x.append(select(row_lo > c, neg_l, select(row_lo == c, Float32(1.0), zero, Float32), Float32))
        blocks.append(_forward_substitution(x, row_lo, col0, lane))
    c_block = [mul_rn_ftz(acc[0][2 + e], sig[1]) for e in range(2)]
    # P8, the merge: P and M as bf16 words in the accumulator layout [nb][h].
    none = Uint32(0)
    P = [[f32x2_to_bf16x2(blocks[0][0], blocks[0][1]), none],
         [none, f32x2_to_bf16x2(blocks[1][0], blocks[1][1])]]
    M = [[none, f32x2_to_bf16x2(c_block[0], c_block[1])], [none, none]]
    p_op = _a_operand(P)
    dc = _matmul_bf16(p_op, _b_operands(M))
    neg_dc = [[mul_rn_ftz(dc[nb][i], Float32(-1.0)) for i in range(4)] for nb in range(2)]
    o = _bf16_words(_matmul_bf16(_a_operand(_bf16_words(neg_dc)), _b_operands(P)))
    inv = [[add_bf16x2(P[nb][h], o[nb][h]) for h in range(2)] for nb in range(2)]
    return inv, sig[0], sig[1]


def _causal_mask(row_lo, col0):
    """The bf16 halves of a diagonal block's fragment word (row row_lo, columns col0, col0 + 1) that
    P7 keeps: column <= row."""
    return select(row_lo >= col0, 0x0000FFFF, 0, Uint32) | select(row_lo >= col0 + 1, 0xFFFF0000, 0, Uint32)


def mqk_words(acc, row_lo, col0, make_store):
    """P7 on Qd Ki^T's accumulator: bf(acc), causal (i >= j). make_store() gives store(nb, h, word),
    called for each fragment word in K1's order."""
    causal_mask = _causal_mask(row_lo, col0)
    store = make_store()
    for nb in range(2):
        for h in range(2):
            w = f32x2_to_bf16x2(acc[nb][2 * h], acc[nb][2 * h + 1])
            if h == nb:
                w = w & causal_mask
            elif h < nb:
                w = Uint32(0)
            store(nb, h, w)
