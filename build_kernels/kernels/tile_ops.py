"""Constants and tile helpers shared by every kernel (spec notation: C = CHUNK, K = V = D)."""

import cutlass
import cutlass.cute as cute

CHUNK = 16  # tokens per tile (docs/algorithm.md §2.3); the 16x16 inverse and the gate range argument rely on it
D = 128  # head dimension, K = V = 128


def await_previous_grid():
    """Programmatic dependent launch (every kernel of a prefill is launched with use_pdl=True).

    The launch of a kernel overlaps the tail of the kernel before it in the stream: its CTAs may
    start once every CTA of that kernel has exited, before the grid's completion and memory flush
    are processed; griddepcontrol.wait then blocks until that kernel has completed and its memory
    is visible. Every CTA calls this before its first global access and before any early exit, so
    each kernel completes only after its predecessor did, and ordering stays transitive along the
    chain.

    No kernel calls griddepcontrol.launch_dependents early: measured on the H200, triggering at
    CTA start let the next kernels' CTAs sit resident in griddepcontrol.wait beside the running
    ones, and serial H=64 T=8192 went from 0.78 to 1.71 ms (docs/cp_tuning.md). A late trigger
    (K2 and pre_scan after their tile loop, the merge in its last step) was slower too: H=8 [8192]
    CP 0.155 -> 0.186 ms, segmented K2 launched beside the merge (third session, same document).
    """
    cute.arch.griddepcontrol_wait()


def raw_tile_layout():
    """(16, 128) -> element offset of the raw 4 KiB tile image (docs/kernel_abi.md, docs/algorithm.md §4.8).

    8x8 core matrices of 128 bytes; core matrix (mi, ki) starts at element 64*(mi + 2*ki), rows of
    8 elements inside it. Call inside a @cute.jit / @cute.kernel context.
    """
    return cute.make_layout(((8, 2), (8, D // 8)), stride=((8, 64), (1, 128)))


# ---------------------------------------------------------------------------------------------
# Device helpers shared by K1 / K2 / pre_scan (names are stable: other kernels import them).
#
# PTX the DSL does not wrap (movmatrix, mma.sync on raw registers, packed f16 arithmetic) or whose
# exact form matters for the rounding recipe (docs/algorithm.md §2.4: .rn arithmetic that ptxas must not fuse
# into fma, the .approx.ftz transcendental forms) goes through inline asm. Register fragments are
# plain 32-bit words (Uint32) holding two 16-bit values, low half = lower column index, which is
# the mma.sync / ldmatrix / movmatrix convention.
#
# Memory and warp-collective instructions are emitted with side effects so LLVM never moves them
# across a barrier or sinks them into a lane-divergent branch; pure arithmetic is left free.
# ---------------------------------------------------------------------------------------------

from cutlass import Float32, Int32, Int64, Uint32  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402
from cutlass.cutlass_dsl import T, dsl_user_op  # noqa: E402

LOG2E = 1.4426950408889634  # f32(LOG2E) is what spec P2 multiplies A_log by


def _ir(x, ty, loc, ip):
    return ty(x).ir_value(loc=loc, ip=ip)


def _asm(ret_types, args, asm, constraints, side_effects, loc, ip):
    """One inline-asm op; returns a single value or a tuple (several outputs)."""
    if not ret_types:
        res_ty = None
    elif len(ret_types) == 1:
        res_ty = ret_types[0]
    else:
        res_ty = llvm.StructType.get_literal(list(ret_types))
    res = llvm.inline_asm(res_ty, args, asm, constraints, has_side_effects=side_effects,
                          is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    if not ret_types:
        return None
    if len(ret_types) == 1:
        return res
    return tuple(llvm.extractvalue(t, res, [i], loc=loc, ip=ip) for i, t in enumerate(ret_types))


# --- fp32 scalar math with a fixed PTX form -------------------------------------------------------

@dsl_user_op
def ex2_approx_ftz(x, *, loc=None, ip=None) -> Float32:
    """ex2.approx.ftz.f32 (spec P2/P4: every 2^x of the recipe)."""
    return Float32(_asm([T.f32()], [_ir(x, Float32, loc, ip)], "ex2.approx.ftz.f32 $0, $1;", "=f,f",
                        False, loc, ip))


@dsl_user_op
def tanh_approx(x, *, loc=None, ip=None) -> Float32:
    """tanh.approx.f32 (the only PTX form; used by the sigmoid of docs/algorithm.md §2.4)."""
    return Float32(_asm([T.f32()], [_ir(x, Float32, loc, ip)], "tanh.approx.f32 $0, $1;", "=f,f",
                        False, loc, ip))


@dsl_user_op
def rsqrt_approx_ftz(x, *, loc=None, ip=None) -> Float32:
    """rsqrt.approx.ftz.f32 (spec P1, fast-math rsqrtf)."""
    return Float32(_asm([T.f32()], [_ir(x, Float32, loc, ip)], "rsqrt.approx.ftz.f32 $0, $1;", "=f,f",
                        False, loc, ip))


@dsl_user_op
def fmul_rn(a, b, *, loc=None, ip=None) -> Float32:
    """mul.rn.ftz.f32: the explicit rounding mode forbids ptxas from fusing it into a later add."""
    return Float32(_asm([T.f32()], [_ir(a, Float32, loc, ip), _ir(b, Float32, loc, ip)],
                        "mul.rn.ftz.f32 $0, $1, $2;", "=f,f,f", False, loc, ip))


@dsl_user_op
def fadd_rn(a, b, *, loc=None, ip=None) -> Float32:
    """add.rn.ftz.f32: never contracted with a preceding multiply."""
    return Float32(_asm([T.f32()], [_ir(a, Float32, loc, ip), _ir(b, Float32, loc, ip)],
                        "add.rn.ftz.f32 $0, $1, $2;", "=f,f,f", False, loc, ip))


@dsl_user_op
def ffma_rn(a, b, c, *, loc=None, ip=None) -> Float32:
    """fma.rn.ftz.f32: a*b + c with one rounding."""
    return Float32(_asm([T.f32()], [_ir(a, Float32, loc, ip), _ir(b, Float32, loc, ip), _ir(c, Float32, loc, ip)],
                        "fma.rn.ftz.f32 $0, $1, $2, $3;", "=f,f,f,f", False, loc, ip))


def sigmoid_tanh(x) -> Float32:
    """sigma~(x) = fma(tanh.approx(0.5 x), 0.5, 0.5) (docs/algorithm.md §2.4, FlashKDA's fast sigmoid)."""
    return ffma_rn(tanh_approx(fmul_rn(x, Float32(0.5))), Float32(0.5), Float32(0.5))


# --- bit views and conversions ------------------------------------------------------------------

@dsl_user_op
def f32_as_u32(x, *, loc=None, ip=None) -> Uint32:
    return Uint32(llvm.bitcast(T.i32(), _ir(x, Float32, loc, ip), loc=loc, ip=ip))


@dsl_user_op
def u32_as_f32(x, *, loc=None, ip=None) -> Float32:
    return Float32(llvm.bitcast(T.f32(), _ir(x, Uint32, loc, ip), loc=loc, ip=ip))


def bf16x2_to_f32x2(x):
    """(low, high) bf16 halves of a packed word as exact fp32 values."""
    x = Uint32(x)
    return u32_as_f32(x << Uint32(16)), u32_as_f32(x & Uint32(0xFFFF0000))


@dsl_user_op
def f32x2_to_bf16x2(lo, hi, *, loc=None, ip=None) -> Uint32:
    """Round two fp32 values to bf16 (RNE) and pack them, lo in the low half."""
    return Uint32(_asm([T.i32()], [_ir(hi, Float32, loc, ip), _ir(lo, Float32, loc, ip)],
                       "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", False, loc, ip))


def round_bf16(x) -> Float32:
    """bf(x) as an fp32 value (RNE)."""
    return u32_as_f32(f32x2_to_bf16x2(Float32(0.0), x))


@dsl_user_op
def f32x2_to_f16x2(lo, hi, *, loc=None, ip=None) -> Uint32:
    """Round two fp32 values to fp16 (RNE) and pack them, lo in the low half."""
    return Uint32(_asm([T.i32()], [_ir(hi, Float32, loc, ip), _ir(lo, Float32, loc, ip)],
                       "cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f", False, loc, ip))


@dsl_user_op
def f16x2_to_f32x2(x, *, loc=None, ip=None):
    """(low, high) fp16 halves of a packed word as exact fp32 values."""
    lo, hi = _asm([T.f32(), T.f32()], [_ir(x, Uint32, loc, ip)],
                  "{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, $2;\n\tcvt.f32.f16 $0, l;\n\tcvt.f32.f16 $1, h;\n\t}",
                  "=f,=f,r", False, loc, ip)
    return Float32(lo), Float32(hi)


# --- packed fp16 arithmetic (IEEE, round to nearest, subnormals kept: no .ftz) ----------------------

def _f16x2_op(op):
    @dsl_user_op
    def fn(a, b, *, loc=None, ip=None) -> Uint32:
        return Uint32(_asm([T.i32()], [_ir(a, Uint32, loc, ip), _ir(b, Uint32, loc, ip)],
                           f"{op}.rn.f16x2 $0, $1, $2;", "=r,r,r", False, loc, ip))
    fn.__name__ = f"{op}_f16x2"
    fn.__doc__ = f"{op}.rn.f16x2 on packed words."
    return fn


add_f16x2 = _f16x2_op("add")
sub_f16x2 = _f16x2_op("sub")
mul_f16x2 = _f16x2_op("mul")


# --- warp-level matrix instructions -------------------------------------------------------------

@dsl_user_op
def movmatrix_trans(x, *, loc=None, ip=None) -> Uint32:
    """Transpose an 8x8 b16 matrix held as one mma fragment word per lane (register only)."""
    return Uint32(_asm([T.i32()], [_ir(x, Uint32, loc, ip)], "movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;",
                       "=r,r", True, loc, ip))


@dsl_user_op
def ldmatrix_x4(smem_addr, *, loc=None, ip=None):
    """ldmatrix .x4 (no transpose): lane l supplies the row address of matrix l//8, row l%8."""
    r = _asm([T.i32()] * 4, [_ir(smem_addr, Int32, loc, ip)],
             "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", True, loc, ip)
    return tuple(Uint32(v) for v in r)


@dsl_user_op
def ld_shared_v4(smem_addr, *, loc=None, ip=None):
    """16-byte shared load as four words (address must be 16-byte aligned)."""
    r = _asm([T.i32()] * 4, [_ir(smem_addr, Int32, loc, ip)],
             "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", True, loc, ip)
    return tuple(Uint32(v) for v in r)


@dsl_user_op
def st_shared_v4(smem_addr, w, *, loc=None, ip=None) -> None:
    """16-byte shared store of four words (address must be 16-byte aligned)."""
    _asm([], [_ir(smem_addr, Int32, loc, ip)] + [_ir(v, Uint32, loc, ip) for v in w],
         "st.shared.v4.b32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r", True, loc, ip)


@dsl_user_op
def mma_m16n8k16_bf16_f32(a, b, c, *, loc=None, ip=None):
    """D = A*B + C, bf16 inputs, fp32 accumulate. a: 4 words, b: 2 words, c: 4 fp32 -> 4 fp32."""
    args = [_ir(v, Uint32, loc, ip) for v in a] + [_ir(v, Uint32, loc, ip) for v in b] + \
           [_ir(v, Float32, loc, ip) for v in c]
    d = _asm([T.f32()] * 4, args,
             "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
             "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
             "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", True, loc, ip)
    return tuple(Float32(v) for v in d)


@dsl_user_op
def mma_m16n8k16_f16_f16(a, b, c, *, loc=None, ip=None):
    """D = A*B + C, fp16 inputs, fp16 accumulate. a: 4 words, b: 2 words, c: 2 words -> 2 words."""
    args = [_ir(v, Uint32, loc, ip) for v in a] + [_ir(v, Uint32, loc, ip) for v in b] + \
           [_ir(v, Uint32, loc, ip) for v in c]
    d = _asm([T.i32()] * 2, args,
             "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {$0, $1}, {$2, $3, $4, $5}, {$6, $7}, {$8, $9};",
             "=r,=r,r,r,r,r,r,r,r,r", True, loc, ip)
    return tuple(Uint32(v) for v in d)


# --- non-tensor bulk copies (cp.async.bulk) -----------------------------------------------------
# 4.8.1 does NOT elect a lane inside cute.copy for these atoms (docs/build.md §3): the caller
# decides who issues. One issue per copy: wrap in exactly one elect_one, or give each lane its own
# copy. Both tensors are flat byte ranges: 16-B aligned, size a multiple of 16.

def bulk_g2s(gsrc, sdst, mbar) -> None:
    """Issue one G2S bulk copy completing on mbar (the caller has armed mbar with its bytes)."""
    cute.copy(cute.make_copy_atom(cpasync.CopyBulkG2SOp(), gsrc.element_type), gsrc, sdst, mbar_ptr=mbar)


def bulk_s2g(ssrc, gdst) -> None:
    """Issue one S2G bulk copy into the calling thread's open bulk group."""
    cute.copy(cute.make_copy_atom(cpasync.CopyBulkS2GOp(), ssrc.element_type), ssrc, gdst)


def bulk_s2g_elected(pairs) -> None:
    """One elected lane of the calling warp issues every (smem, gmem) copy, commits and waits until
    the sources have been read (bulk groups are per thread, so issue and wait share one lane).
    Writers must have run fence_proxy('async.shared') and a barrier with this warp before."""
    with cute.arch.elect_one():
        for ssrc, gdst in pairs:
            bulk_s2g(ssrc, gdst)
        cute.arch.cp_async_bulk_commit_group()
        cute.arch.cp_async_bulk_wait_group(0, read=True)


# --- the single-CTA table kernels (varlen_tiles, cp_seg_tables) ---------------------------------

def clamp_token(value, t_total: Int32) -> Int32:
    """min(t_total, max(0, value)) of a cu_seqlens entry of either width, computed in 64 bits so
    an int64 entry past 2^31 cannot wrap into range (t_total >= 0)."""
    v = Int64(value)
    v = cutlass.max(v, Int64(0))
    v = cutlass.min(v, Int64(t_total))
    return Int32(v)


def tile_count(length: Int32) -> Int32:
    """ceil(length / 16) of a clamped length in [0, 2^31 - 1], rounded up in 64 bits (no wrap)."""
    return Int32((Int64(length) + (CHUNK - 1)) // CHUNK)


@cute.jit
def block_scan(x: Int32, carry: Int32, lane: Int32, warp: Int32, s_warp: cute.Tensor,
               use_max: cutlass.Constexpr[bool], warps: cutlass.Constexpr[int]):
    """Scan of one Int32 per thread in thread order, continuing from `carry` (the result of the
    blocks before): (exclusive, inclusive, block total) with op = max (use_max) or +.

    Warp scans with shuffles, the warp results through s_warp [warps] in shared memory. With max,
    every value must be >= 0 (0 is then the identity the lanes past the table contribute). The
    caller syncs the CTA before s_warp is written again (the next call)."""
    for offset in cutlass.range_constexpr(5):
        y = cute.arch.shuffle_sync_up(x, 1 << offset)
        if lane >= (1 << offset):
            x = cutlass.max(x, y) if cutlass.const_expr(use_max) else x + y
    below = cute.arch.shuffle_sync_up(x, 1)  # the warp's inclusive scan at lane - 1
    if lane == 31:
        s_warp[warp] = x
    cute.arch.barrier()
    before = carry
    total = carry
    for w in cutlass.range_constexpr(warps):
        s = s_warp[w]
        if cutlass.const_expr(use_max):
            if w < warp:
                before = cutlass.max(before, s)
            total = cutlass.max(total, s)
        else:
            if w < warp:
                before = before + s
            total = total + s
    excl = before
    if lane > 0:
        excl = cutlass.max(before, below) if cutlass.const_expr(use_max) else before + below
    incl = cutlass.max(before, x) if cutlass.const_expr(use_max) else before + x
    return excl, incl, total
