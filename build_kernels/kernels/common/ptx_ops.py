"""Every inline-PTX wrapper of the kernels, in one module with one convention (sm_90a).

Why inline PTX at all: some instructions the DSL does not wrap (movmatrix, mma.sync on raw
registers, packed bf16 arithmetic, cp.async.bulk on raw addresses), and some whose exact form is
part of the rounding recipe (docs/algorithm.md §2.4: `.rn` arithmetic that ptxas must not contract into an fma,
the `.approx` transcendental forms).

Convention, the same for every wrapper:
* a `@dsl_user_op` taking DSL values and keyword-only `loc` / `ip`, emitting one `_asm` op whose
  operands are converted by `_ir` to the PTX register type the constraint names;
* shared-memory addresses are 32-bit (`Pointer.toint()` of an smem pointer), global ones 64-bit;
* register fragments are 32-bit words holding two 16-bit values, low half = lower column index
  (the mma.sync / ldmatrix / movmatrix convention, PTX ISA "Matrix fragments for mma.m16n8k16");
* names say the PTX form: `_rn` for an explicit round-to-nearest op (never contracted), `_ftz`
  when the op flushes subnormals to zero, so two helpers with the same arithmetic and different
  subnormal handling can never be mistaken for each other;
* memory and warp-collective instructions are emitted with side effects, so LLVM never moves them
  across a barrier or sinks them into a lane-divergent branch; pure arithmetic is left free. Two
  families keep both flavours because the kernels that use them were measured and checked with
  the flavour they have (changing one changes the PTX): K1's `ldmatrix_x4` / `movmatrix_trans` /
  `mma_m16n8k16_*` (side effects, Uint32 words) and K2 / pre_scan's `ldsm_x4` / `movmatrix_t` /
  `mma_bf16_16816` (pure MMA and movmatrix, Int32 words).

mma.sync.m16n8k16 fragments, with g = lane >> 2 and q = lane & 3:
* A (16x16, row): a0 = (row g, cols 2q..2q+1), a1 = (row g+8, same cols), a2 = (row g, cols 8+2q..),
  a3 = (row g+8, cols 8+2q..): `ldmatrix.x4` of the four 8x8 matrices (rows 0-7, k 0-7),
  (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
* B (16x8, col): b0 = (k 2q..2q+1, col g), b1 = (k 8+2q.., col g): an 8x8 matrix stored [n][k]
  loaded plainly, or stored [k][n] loaded with `.trans`.
* C/D (16x8 fp32): c0, c1 = (row g, cols 2q, 2q+1), c2, c3 = (row g+8, same cols).
A C fragment packed to bf16 pairs is the ldmatrix register layout of its two 8x8 matrices, and
`movmatrix.trans` of each word gives the B fragment of the same matrix, so chained products stay in
registers.
"""

from cutlass import Float32, Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def _ir(x, ty, loc, ip):
    """`x` as an MLIR value of DSL type `ty` (the operand of an asm constraint)."""
    return ty(x).ir_value(loc=loc, ip=ip)


def _asm(ret_types, args, asm, constraints, side_effects, loc, ip):
    """One inline-asm op; returns None, a single value or a tuple (several outputs, unpacked from
    the literal struct LLVM returns them in)."""
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
def lg2_approx_ftz(x, *, loc=None, ip=None) -> Float32:
    """lg2.approx.ftz.f32 (the softplus gate, docs/gate_forms.md)."""
    return Float32(_asm([T.f32()], [_ir(x, Float32, loc, ip)], "lg2.approx.ftz.f32 $0, $1;", "=f,f",
                        False, loc, ip))


@dsl_user_op
def rsqrt_approx_ftz(x, *, loc=None, ip=None) -> Float32:
    """rsqrt.approx.ftz.f32 (spec P1, fast-math rsqrtf)."""
    return Float32(_asm([T.f32()], [_ir(x, Float32, loc, ip)], "rsqrt.approx.ftz.f32 $0, $1;", "=f,f",
                        False, loc, ip))


# K1's gate and norm arithmetic: flush-to-zero forms (what the FlashKDA recipe compiles to).

@dsl_user_op
def mul_rn_ftz(a, b, *, loc=None, ip=None) -> Float32:
    """mul.rn.ftz.f32: the explicit rounding mode forbids ptxas from fusing it into a later add."""
    return Float32(_asm([T.f32()], [_ir(a, Float32, loc, ip), _ir(b, Float32, loc, ip)],
                        "mul.rn.ftz.f32 $0, $1, $2;", "=f,f,f", False, loc, ip))


@dsl_user_op
def add_rn_ftz(a, b, *, loc=None, ip=None) -> Float32:
    """add.rn.ftz.f32: never contracted with a preceding multiply."""
    return Float32(_asm([T.f32()], [_ir(a, Float32, loc, ip), _ir(b, Float32, loc, ip)],
                        "add.rn.ftz.f32 $0, $1, $2;", "=f,f,f", False, loc, ip))


@dsl_user_op
def fma_rn_ftz(a, b, c, *, loc=None, ip=None) -> Float32:
    """fma.rn.ftz.f32: a*b + c with one rounding."""
    return Float32(_asm([T.f32()], [_ir(a, Float32, loc, ip), _ir(b, Float32, loc, ip), _ir(c, Float32, loc, ip)],
                        "fma.rn.ftz.f32 $0, $1, $2, $3;", "=f,f,f,f", False, loc, ip))


# K2 / pre_scan's state arithmetic: IEEE forms, subnormals kept (docs/algorithm.md §2.4 rounds every op on its own).

@dsl_user_op
def sub_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    return Float32(_asm([T.f32()], [_ir(a, Float32, loc, ip), _ir(b, Float32, loc, ip)],
                        "sub.rn.f32 $0, $1, $2;", "=f,f,f", False, loc, ip))


@dsl_user_op
def add_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    return Float32(_asm([T.f32()], [_ir(a, Float32, loc, ip), _ir(b, Float32, loc, ip)],
                        "add.rn.f32 $0, $1, $2;", "=f,f,f", False, loc, ip))


@dsl_user_op
def mul_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    return Float32(_asm([T.f32()], [_ir(a, Float32, loc, ip), _ir(b, Float32, loc, ip)],
                        "mul.rn.f32 $0, $1, $2;", "=f,f,f", False, loc, ip))


@dsl_user_op
def fma_rn(a: Float32, b: Float32, c: Float32, *, loc=None, ip=None) -> Float32:
    return Float32(_asm([T.f32()], [_ir(a, Float32, loc, ip), _ir(b, Float32, loc, ip), _ir(c, Float32, loc, ip)],
                        "fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f", False, loc, ip))


@dsl_user_op
def select_b32(pred: Int32, a: Int32, b: Int32, *, loc=None, ip=None) -> Int32:
    """pred != 0 ? a : b, branch-free."""
    return Int32(_asm([T.i32()], [_ir(pred, Int32, loc, ip), _ir(a, Int32, loc, ip), _ir(b, Int32, loc, ip)],
                      "{\n\t.reg .pred p;\n\tsetp.ne.s32 p, $1, 0;\n\tselp.b32 $0, $2, $3, p;\n\t}",
                      "=r,r,r,r", False, loc, ip))


# --- bit views, conversions and packing -------------------------------------------------------------

@dsl_user_op
def u32_as_f32(x, *, loc=None, ip=None) -> Float32:
    return Float32(llvm.bitcast(T.f32(), _ir(x, Uint32, loc, ip), loc=loc, ip=ip))


@dsl_user_op
def f32x2_to_bf16x2(lo, hi, *, loc=None, ip=None) -> Uint32:
    """Round two fp32 values to bf16 (RNE) and pack them, lo in the low half (K1, Uint32 words)."""
    return Uint32(_asm([T.i32()], [_ir(hi, Float32, loc, ip), _ir(lo, Float32, loc, ip)],
                       "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", False, loc, ip))


@dsl_user_op
def pack_bf16x2(lo: Float32, hi: Float32, *, loc=None, ip=None) -> Int32:
    """bf(lo) in bits 0-15, bf(hi) in bits 16-31; RNE, no saturation (K2 / pre_scan, Int32 words)."""
    return Int32(_asm([T.i32()], [_ir(hi, Float32, loc, ip), _ir(lo, Float32, loc, ip)],
                      "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", False, loc, ip))


@dsl_user_op
def unpack_bf16x2(w: Int32, *, loc=None, ip=None):
    """Exact fp32 widening of the two bf16 halves (low, high)."""
    lo, hi = _asm([T.f32(), T.f32()], [_ir(w, Int32, loc, ip)],
                  "shl.b32 $0, $2, 16;\n\tand.b32 $1, $2, -65536;", "=f,=f,r", False, loc, ip)
    return Float32(lo), Float32(hi)


@dsl_user_op
def round_bf16x2(x0: Float32, x1: Float32, *, loc=None, ip=None):
    """(f32(bf(x0)), f32(bf(x1))): round to bf16 (RNE) and widen back."""
    lo, hi = _asm([T.f32(), T.f32()], [_ir(x1, Float32, loc, ip), _ir(x0, Float32, loc, ip)],
                  "{\n\t.reg .b32 w;\n\tcvt.rn.bf16x2.f32 w, $2, $3;\n\tshl.b32 $0, w, 16;\n\t"
                  "and.b32 $1, w, -65536;\n\t}", "=f,=f,f,f", False, loc, ip)
    return Float32(lo), Float32(hi)


@dsl_user_op
def to_tf32(x: Float32, *, loc=None, ip=None) -> Int32:
    """fp32 -> tf32 (round to nearest, ties away), as the b32 operand register mma.sync expects."""
    return Int32(_asm([T.i32()], [_ir(x, Float32, loc, ip)], "cvt.rna.tf32.f32 $0, $1;", "=r,f", False, loc, ip))


# --- packed bf16 arithmetic ----------------------------------------------------------------------------

@dsl_user_op
def add_bf16x2(a, b, *, loc=None, ip=None) -> Uint32:
    """add.rn.bf16x2 on packed words (K1's inverse merge: P + bf(o), where one operand of every pair
    is zero, so the sum is exact)."""
    return Uint32(_asm([T.i32()], [_ir(a, Uint32, loc, ip), _ir(b, Uint32, loc, ip)],
                       "add.rn.bf16x2 $0, $1, $2;", "=r,r,r", False, loc, ip))


# --- warp-level matrix instructions -------------------------------------------------------------

# K1 and K2 / pre_scan each keep their flavour of three instructions (module docstring): one
# implementation per instruction, the flavour (word type, side effects) its parameters.

_MOVMATRIX_TRANS = "movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;"
_LDMATRIX_X4 = "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];"
_MMA_16816_BF16 = ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                   "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")


def _movmatrix(x, word, side_effects, loc, ip):
    return word(_asm([T.i32()], [_ir(x, word, loc, ip)], _MOVMATRIX_TRANS, "=r,r", side_effects, loc, ip))


def _ldmatrix_x4(addr, word, loc, ip):
    r = _asm([T.i32()] * 4, [_ir(addr, Int32, loc, ip)], _LDMATRIX_X4, "=r,=r,=r,=r,r", True, loc, ip)
    return tuple(word(v) for v in r)


def _mma_16816_bf16(a, b, c, word, side_effects, loc, ip):
    ops = [_ir(x, word, loc, ip) for x in a] + [_ir(x, word, loc, ip) for x in b] + \
          [_ir(x, Float32, loc, ip) for x in c]
    d = _asm([T.f32()] * 4, ops, _MMA_16816_BF16, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", side_effects, loc, ip)
    return tuple(Float32(v) for v in d)


@dsl_user_op
def movmatrix_trans(x, *, loc=None, ip=None) -> Uint32:
    """Transpose an 8x8 b16 matrix held as one mma fragment word per lane (K1: side effects)."""
    return _movmatrix(x, Uint32, True, loc, ip)


@dsl_user_op
def movmatrix_t(x: Int32, *, loc=None, ip=None) -> Int32:
    """The same transpose, pure (K2 / pre_scan: register only, free to schedule)."""
    return _movmatrix(x, Int32, False, loc, ip)


@dsl_user_op
def ldmatrix_x4(smem_addr, *, loc=None, ip=None):
    """ldmatrix .x4 (no transpose), Uint32 words (K1): lane l supplies the row address of matrix
    l//8, row l%8."""
    return _ldmatrix_x4(smem_addr, Uint32, loc, ip)


@dsl_user_op
def ldsm_x4(addr: Int32, *, loc=None, ip=None):
    """The same ldmatrix .x4 as Int32 words (K2 / pre_scan)."""
    return _ldmatrix_x4(addr, Int32, loc, ip)


@dsl_user_op
def ldsm_x4_t(addr: Int32, *, loc=None, ip=None):
    """`ldmatrix.x4.trans`: each register holds the transposed 8x8 matrix's fragment."""
    r = _asm([T.i32()] * 4, [_ir(addr, Int32, loc, ip)],
             "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", True, loc, ip)
    return tuple(Int32(v) for v in r)


@dsl_user_op
def mma_m16n8k16_bf16_f32(a, b, c, *, loc=None, ip=None):
    """D = A*B + C, bf16 inputs, fp32 accumulate (K1: side effects, Uint32 words).
    a: 4 words, b: 2 words, c: 4 fp32 -> 4 fp32."""
    return _mma_16816_bf16(a, b, c, Uint32, True, loc, ip)


@dsl_user_op
def mma_bf16_16816(a, b, c, *, loc=None, ip=None):
    """The same product, pure (K2 / pre_scan, Int32 words): D = A(16x16 bf16) * B(16x8 bf16) + C."""
    return _mma_16816_bf16(a, b, c, Int32, False, loc, ip)


@dsl_user_op
def mma_tf32_1688(a, b, c, *, loc=None, ip=None):
    """D(16x8 f32) = A(16x8 tf32, row) * B(8x8 tf32, col) + C (the CP merge).

    Fragments (g = lane >> 2, q = lane & 3): a0 (g, q), a1 (g+8, q), a2 (g, q+4), a3 (g+8, q+4);
    b0 (k q, n g), b1 (k q+4, n g); c0, c1 (g, 2q..2q+1), c2, c3 (g+8, 2q..2q+1).
    """
    ops = [_ir(x, Int32, loc, ip) for x in a] + [_ir(x, Int32, loc, ip) for x in b] + \
          [_ir(x, Float32, loc, ip) for x in c]
    r = _asm([T.f32()] * 4, ops,
             "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
             "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
             "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", False, loc, ip)
    return [Float32(x) for x in r]


# --- shared memory (32-bit addresses) ---------------------------------------------------------------

@dsl_user_op
def lds_b32(addr: Int32, *, loc=None, ip=None) -> Int32:
    return Int32(_asm([T.i32()], [_ir(addr, Int32, loc, ip)], "ld.shared.b32 $0, [$1];", "=r,r", True, loc, ip))


@dsl_user_op
def lds_f32(addr: Int32, *, loc=None, ip=None) -> Float32:
    return Float32(_asm([T.f32()], [_ir(addr, Int32, loc, ip)], "ld.shared.f32 $0, [$1];", "=f,r", True, loc, ip))


@dsl_user_op
def lds_bf16_f32(addr: Int32, *, loc=None, ip=None) -> Float32:
    """One bf16 from shared memory, widened exactly to fp32."""
    return Float32(_asm([T.f32()], [_ir(addr, Int32, loc, ip)],
                        "{\n\t.reg .b32 w;\n\tld.shared.u16 w, [$1];\n\tshl.b32 $0, w, 16;\n\t}",
                        "=f,r", True, loc, ip))


@dsl_user_op
def lds_v2_f32(saddr: Int32, *, loc=None, ip=None):
    r = _asm([T.f32(), T.f32()], [_ir(saddr, Int32, loc, ip)], "ld.shared.v2.f32 {$0, $1}, [$2];", "=f,=f,r",
             True, loc, ip)
    return Float32(r[0]), Float32(r[1])


@dsl_user_op
def ld_shared_v4(smem_addr, *, loc=None, ip=None):
    """16-byte shared load as four words (address must be 16-byte aligned)."""
    r = _asm([T.i32()] * 4, [_ir(smem_addr, Int32, loc, ip)],
             "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", True, loc, ip)
    return tuple(Uint32(v) for v in r)


@dsl_user_op
def sts_b32(addr: Int32, val: Int32, *, loc=None, ip=None) -> None:
    _asm([], [_ir(addr, Int32, loc, ip), _ir(val, Int32, loc, ip)], "st.shared.b32 [$0], $1;", "r,r", True, loc, ip)


@dsl_user_op
def atom_add_shared(addr: Int32, val: Int32, *, loc=None, ip=None) -> Int32:
    """Atomic add to a 32-bit shared word; returns the old value."""
    return Int32(_asm([T.i32()], [_ir(addr, Int32, loc, ip), _ir(val, Int32, loc, ip)],
                      "atom.shared.add.u32 $0, [$1], $2;", "=r,r,r", True, loc, ip))


@dsl_user_op
def sts_v2_b32(saddr: Int32, a: Int32, b: Int32, *, loc=None, ip=None) -> None:
    _asm([], [_ir(saddr, Int32, loc, ip), _ir(a, Int32, loc, ip), _ir(b, Int32, loc, ip)],
         "st.shared.v2.b32 [$0], {$1, $2};", "r,r,r", True, loc, ip)


@dsl_user_op
def st_shared_v4(smem_addr, w, *, loc=None, ip=None) -> None:
    """16-byte shared store of four words (address must be 16-byte aligned)."""
    _asm([], [_ir(smem_addr, Int32, loc, ip)] + [_ir(v, Uint32, loc, ip) for v in w],
         "st.shared.v4.b32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r", True, loc, ip)


# --- global memory (64-bit addresses) ---------------------------------------------------------------

@dsl_user_op
def ldg_b32(addr: Int64, *, loc=None, ip=None) -> Int32:
    return Int32(_asm([T.i32()], [_ir(addr, Int64, loc, ip)], "ld.global.b32 $0, [$1];", "=r,l", True, loc, ip))


@dsl_user_op
def ldg_f32(addr: Int64, *, loc=None, ip=None) -> Float32:
    return Float32(_asm([T.f32()], [_ir(addr, Int64, loc, ip)], "ld.global.f32 $0, [$1];", "=f,l", True, loc, ip))


@dsl_user_op
def ldg_v4_f32(gaddr: Int64, *, loc=None, ip=None):
    r = _asm([T.f32()] * 4, [_ir(gaddr, Int64, loc, ip)], "ld.global.nc.v4.f32 {$0, $1, $2, $3}, [$4];",
             "=f,=f,=f,=f,l", True, loc, ip)
    return tuple(Float32(x) for x in r)


@dsl_user_op
def ldg_v2_f32(gaddr: Int64, *, loc=None, ip=None):
    """Two adjacent fp32 (8 bytes at gaddr), as they are."""
    r = _asm([T.f32()] * 2, [_ir(gaddr, Int64, loc, ip)], "ld.global.v2.f32 {$0, $1}, [$2];", "=f,=f,l", True,
             loc, ip)
    return tuple(Float32(x) for x in r)


@dsl_user_op
def ldg_bf16x4_f32(gaddr: Int64, *, loc=None, ip=None):
    """Four consecutive bf16 (8 bytes), widened exactly to fp32."""
    r = _asm([T.f32()] * 4, [_ir(gaddr, Int64, loc, ip)],
             "{\n\t.reg .b32 w0, w1;\n\tld.global.nc.v2.b32 {w0, w1}, [$4];\n\t"
             "shl.b32 $0, w0, 16;\n\tand.b32 $1, w0, -65536;\n\tshl.b32 $2, w1, 16;\n\tand.b32 $3, w1, -65536;\n\t}",
             "=f,=f,=f,=f,l", True, loc, ip)
    return tuple(Float32(x) for x in r)


@dsl_user_op
def ldg_bf16_pair(addr0: Int64, addr1: Int64, *, loc=None, ip=None) -> Int32:
    """Two bf16 loads from unrelated addresses, packed (addr0 -> low half)."""
    return Int32(_asm([T.i32()], [_ir(addr0, Int64, loc, ip), _ir(addr1, Int64, loc, ip)],
                      "{\n\t.reg .b16 a, b;\n\tld.global.b16 a, [$1];\n\tld.global.b16 b, [$2];\n\t"
                      "mov.b32 $0, {a, b};\n\t}", "=r,l,l", True, loc, ip))


@dsl_user_op
def ldg_f32_pair_bf16(addr0: Int64, addr1: Int64, *, loc=None, ip=None) -> Int32:
    """Two fp32 loads rounded to bf16 (RNE) and packed (addr0 -> low half)."""
    return Int32(_asm([T.i32()], [_ir(addr0, Int64, loc, ip), _ir(addr1, Int64, loc, ip)],
                      "{\n\t.reg .f32 a, b;\n\tld.global.f32 a, [$1];\n\tld.global.f32 b, [$2];\n\t"
                      "cvt.rn.bf16x2.f32 $0, b, a;\n\t}", "=r,l,l", True, loc, ip))


@dsl_user_op
def stg_f32(addr: Int64, val: Float32, *, loc=None, ip=None) -> None:
    _asm([], [_ir(addr, Int64, loc, ip), _ir(val, Float32, loc, ip)], "st.global.f32 [$0], $1;", "l,f", True,
         loc, ip)


@dsl_user_op
def stg_b32(addr: Int64, val: Int32, *, loc=None, ip=None) -> None:
    _asm([], [_ir(addr, Int64, loc, ip), _ir(val, Int32, loc, ip)], "st.global.b32 [$0], $1;", "l,r", True, loc, ip)


@dsl_user_op
def stg_b32_if(addr: Int64, val: Int32, pred: Int32, *, loc=None, ip=None) -> None:
    """Predicated 4-byte global store (skipped when pred == 0)."""
    _asm([], [_ir(addr, Int64, loc, ip), _ir(val, Int32, loc, ip), _ir(pred, Int32, loc, ip)],
         "{\n\t.reg .pred p;\n\tsetp.ne.s32 p, $2, 0;\n\t@p st.global.b32 [$0], $1;\n\t}", "l,r,r", True, loc, ip)


@dsl_user_op
def stg_bf16_pair(addr0: Int64, addr1: Int64, w: Int32, *, loc=None, ip=None) -> None:
    """Store the low bf16 of w at addr0 and the high one at addr1."""
    _asm([], [_ir(addr0, Int64, loc, ip), _ir(addr1, Int64, loc, ip), _ir(w, Int32, loc, ip)],
         "{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, $2;\n\tst.global.b16 [$0], a;\n\tst.global.b16 [$1], b;\n\t}",
         "l,l,r", True, loc, ip)


@dsl_user_op
def stg_f32_pair_from_bf16(addr0: Int64, addr1: Int64, w: Int32, *, loc=None, ip=None) -> None:
    """Exact fp32 widening of the two bf16 halves of w, stored at addr0 (low) and addr1 (high)."""
    _asm([], [_ir(addr0, Int64, loc, ip), _ir(addr1, Int64, loc, ip), _ir(w, Int32, loc, ip)],
         "{\n\t.reg .b32 a, b;\n\tshl.b32 a, $2, 16;\n\tand.b32 b, $2, -65536;\n\t"
         "st.global.b32 [$0], a;\n\tst.global.b32 [$1], b;\n\t}", "l,l,r", True, loc, ip)


@dsl_user_op
def stg_v2_f32(gaddr: Int64, a: Float32, b: Float32, *, loc=None, ip=None) -> None:
    _asm([], [_ir(gaddr, Int64, loc, ip), _ir(a, Float32, loc, ip), _ir(b, Float32, loc, ip)],
         "st.global.v2.f32 [$0], {$1, $2};", "l,f,f", True, loc, ip)


@dsl_user_op
def stg_v4_f32(gaddr: Int64, a: Float32, b: Float32, c: Float32, d: Float32, *, loc=None, ip=None) -> None:
    _asm([], [_ir(gaddr, Int64, loc, ip)] + [_ir(x, Float32, loc, ip) for x in (a, b, c, d)],
         "st.global.v4.f32 [$0], {$1, $2, $3, $4};", "l,f,f,f,f", True, loc, ip)


# --- asynchronous copies ----------------------------------------------------------------------------

@dsl_user_op
def cp_async_16(saddr: Int32, gaddr: Int64, *, loc=None, ip=None) -> None:
    """16-byte global -> shared copy, L2 only (cp.async.cg)."""
    _asm([], [_ir(saddr, Int32, loc, ip), _ir(gaddr, Int64, loc, ip)],
         "cp.async.cg.shared.global [$0], [$1], 16;", "r,l", True, loc, ip)


@dsl_user_op
def bulk_g2s(dst_smem: Int32, src_gmem: Int64, nbytes: Int32, mbar_smem: Int32, *, loc=None, ip=None) -> None:
    """`cp.async.bulk` global -> shared on raw addresses, completing `nbytes` transaction bytes on
    the mbarrier at `mbar_smem`.

    Issue from ONE lane (inside `cute.arch.elect_one()`): every issuing lane completes its own bytes.
    Addresses and size must be multiples of 16 bytes. (tile_ops.bulk_g2s_tensor is the tensor form.)
    """
    _asm([], [_ir(dst_smem, Int32, loc, ip), _ir(src_gmem, Int64, loc, ip), _ir(nbytes, Int32, loc, ip),
              _ir(mbar_smem, Int32, loc, ip)],
         "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
         "r,l,r,r", True, loc, ip)


@dsl_user_op
def lds_bf16_f32_if(addr: Int32, ok: Int32, *, loc=None, ip=None) -> Float32:
    """lds_bf16_f32 where ok != 0, else +0.0 (nothing read)."""
    return Float32(_asm([T.f32()], [_ir(addr, Int32, loc, ip), _ir(ok, Int32, loc, ip)],
                        "{\n\t.reg .b32 w;\n\t.reg .pred p;\n\tsetp.ne.b32 p, $2, 0;\n\tmov.b32 w, 0;\n"
                        "\t@p ld.shared.u16 w, [$1];\n\tshl.b32 $0, w, 16;\n\t}",
                        "=f,r,r", True, loc, ip))


# --- warpgroup MMA (wgmma) with the A operand in registers ------------------------------------------
# The register-state K2 (k2_regstate.py; docs/speed_limits.md, "A register-state wgmma step"). All
# 128 threads of a warpgroup issue each of these together. A wgmma reads its A registers and writes
# its accumulators asynchronously, until the wgmma.wait_group that completes it, so both pass tied
# through wgmma_fence and wgmma_wait: the compiler can neither compute them after the fence nor
# read or reuse their registers before the wait (CUTLASS calls this fencing the operands).

@dsl_user_op
def smem_desc(addr: Int32, lbo: int, sbo: int, *, loc=None, ip=None) -> Int64:
    """wgmma matrix descriptor of a no-swizzle operand at shared address `addr`: bits 0-13
    addr >> 4, 16-29 the leading byte offset >> 4 (next core matrix along K), 32-45 the stride
    byte offset >> 4 (next core matrix along M or N), base offset 0, layout type 0. For an
    MN-major operand the two offsets swap roles: lbo is the K stride, sbo the MN stride (measured,
    ci/probes/wgmma_k2_layouts.cu)."""
    fixed = (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32)
    return Int64(_asm([T.i64()], [_ir(addr, Int32, loc, ip), _ir(fixed, Int64, loc, ip)],
                      "{\n.reg .b64 a;\ncvt.u64.u32 a, $1;\nshr.b64 a, a, 4;\nand.b64 a, a, 16383;\n"
                      "or.b64 $0, a, $2;\n}", "=l,r,l", False, loc, ip))


def _tied(instr: str, words, floats, loc, ip):
    """`instr` with `words` (Int32) and `floats` (Float32) passed in and out of it, tied."""
    n_w, n_f = len(words), len(floats)
    n = n_w + n_f
    res = _asm([T.i32()] * n_w + [T.f32()] * n_f,
               [_ir(x, Int32, loc, ip) for x in words] + [_ir(x, Float32, loc, ip) for x in floats], instr,
               ",".join(["=r"] * n_w + ["=f"] * n_f + [str(i) for i in range(n)]), True, loc, ip)
    res = res if n > 1 else (res,)
    return [Int32(x) for x in res[:n_w]], [Float32(x) for x in res[n_w:]]


@dsl_user_op
def wgmma_fence(words, floats, *, loc=None, ip=None):
    """wgmma.fence after the last ordinary write of A fragments (`words`) and accumulators
    (`floats`) that the next wgmmas use; returns them, to be handed to those wgmmas."""
    return _tied("wgmma.fence.sync.aligned;", words, floats, loc, ip)


@dsl_user_op
def wgmma_commit(*, loc=None, ip=None) -> None:
    _asm([], [], "wgmma.commit_group.sync.aligned;", "", True, loc, ip)


@dsl_user_op
def wgmma_wait(pending: int, words, floats, *, loc=None, ip=None):
    """wgmma.wait_group `pending`: all but the last `pending` committed groups of this warp done;
    returns `words` and `floats`, which may be read or overwritten from here on only."""
    return _tied(f"wgmma.wait_group.sync.aligned {pending};", words, floats, loc, ip)


@dsl_user_op
def wgmma_m64n16k16_rs(acc, a, desc_b: Int64, scale_d: int, *, loc=None, ip=None):
    """D(64x16 fp32) = A(64x16 bf16, registers) B(16x16 bf16, K-major descriptor) (+ D when
    scale_d). acc: 8 fp32, warp w of the warpgroup holding rows 16 w + g and + 8, acc[4 j + c] at
    column 8 j + 2 q + (c & 1) of row + 8 (c >> 1); a: 4 words, the m16n8k16 A fragment of the
    warp's 16 rows."""
    ops = [_ir(x, Int32, loc, ip) for x in a] + [_ir(desc_b, Int64, loc, ip)] + [_ir(x, Float32, loc, ip) for x in acc]
    d = _asm([T.f32()] * 8, ops,
             "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {$0, $1, $2, $3, $4, $5, $6, $7}, "
             f"{{$8, $9, $10, $11}}, $12, {1 if scale_d else 0}, 1, 1, 0;",
             "=f,=f,=f,=f,=f,=f,=f,=f,r,r,r,r,l,0,1,2,3,4,5,6,7", True, loc, ip)
    return [Float32(x) for x in d]


@dsl_user_op
def wgmma_m64n128k16_rs_mn(acc, a, desc_b: Int64, *, loc=None, ip=None):
    """D(64x128 fp32) = A(64x16 bf16, registers) B(16x128 bf16, MN-major descriptor), from zero
    (scale-d 0: acc only gives the registers). acc: 64 fp32, acc[4 j + c] at column 8 j + 2 q +
    (c & 1) of row 16 w + g + 8 (c >> 1)."""
    ops = [_ir(x, Int32, loc, ip) for x in a] + [_ir(desc_b, Int64, loc, ip)] + [_ir(x, Float32, loc, ip) for x in acc]
    outs = ", ".join(f"${i}" for i in range(64))
    d = _asm([T.f32()] * 64, ops,
             f"wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{{outs}}}, {{$64, $65, $66, $67}}, $68, "
             "0, 1, 1, 1;",
             ",".join(["=f"] * 64 + ["r"] * 4 + ["l"] + [str(i) for i in range(64)]), True, loc, ip)
    return [Float32(x) for x in d]


@dsl_user_op
def ldg_b32_if(addr: Int64, ok: Int32, *, loc=None, ip=None) -> Int32:
    """A 4-byte global load where ok != 0, else 0 (nothing read: the address may be invalid)."""
    return Int32(_asm([T.i32()], [_ir(addr, Int64, loc, ip), _ir(ok, Int32, loc, ip)],
                      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $2, 0;\n\tmov.b32 $0, 0;\n\t@p ld.global.b32 $0, [$1];\n\t}",
                      "=r,l,r", True, loc, ip))


@dsl_user_op
def ldg_f32_pair_bf16_if(addr: Int64, ok: Int32, *, loc=None, ip=None) -> Int32:
    """Two adjacent fp32 (8 bytes at addr) rounded to bf16 (RNE) and packed, low half first, where
    ok != 0, else 0 (nothing read)."""
    return Int32(_asm([T.i32()], [_ir(addr, Int64, loc, ip), _ir(ok, Int32, loc, ip)],
                      "{\n\t.reg .pred p;\n\t.reg .f32 a, b;\n\tsetp.ne.b32 p, $2, 0;\n\tmov.f32 a, 0f00000000;\n\t"
                      "mov.f32 b, 0f00000000;\n\t@p ld.global.v2.f32 {a, b}, [$1];\n\tcvt.rn.bf16x2.f32 $0, b, a;\n\t}",
                      "=r,l,r", True, loc, ip))
