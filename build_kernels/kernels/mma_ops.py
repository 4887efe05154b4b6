"""Register-level PTX helpers for warp-MMA kernels on sm_90a (inline asm through `dsl_user_op`).

Everything here works on raw 32-bit shared-memory addresses (`Pointer.toint()` of an smem pointer),
64-bit global addresses and packed 32-bit registers, so the caller controls every layout exactly
(raw tile images, docs/algorithm.md §4.8). Conventions for `mma.sync.m16n8k16` fragments (PTX ISA, "Matrix
fragments for mma.m16n8k16"), with g = lane >> 2 and q = lane & 3:

* A (16x16, row): a0 = (row g, cols 2q..2q+1), a1 = (row g+8, same cols), a2 = (row g, cols 8+2q..),
  a3 = (row g+8, cols 8+2q..). This is `ldmatrix.x4` of the four 8x8 matrices
  (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
* B (16x8, col): b0 = (k 2q..2q+1, col g), b1 = (k 8+2q.., col g): an 8x8 matrix stored
  [n][k] loaded plainly, or stored [k][n] loaded with `.trans`.
* C/D (16x8 fp32): c0, c1 = (row g, cols 2q, 2q+1), c2, c3 = (row g+8, same cols).

A C fragment packed to bf16 pairs ((c0, c1) and (c2, c3)) is exactly the ldmatrix register
layout of the two 8x8 matrices (rows 0-7) and (rows 8-15); `movmatrix.trans` of each word gives the
B fragment of the same 16x8 matrix used as the K x N operand of the next product, so results stay in
registers between chained products.

Memory-touching helpers are marked as having side effects so LLVM never moves them across barriers;
ptxas still schedules the SASS. Arithmetic helpers use explicit `.rn` so ptxas cannot contract a
separately rounded multiply and add into an fma (docs/algorithm.md §2.4 rounds every op on its own).
"""

from typing import Optional, Tuple

from cutlass import Float32, Int32, Int64
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def _asm(ret, operands, text, constraints, side_effects):
    return llvm.inline_asm(ret, operands, text, constraints, has_side_effects=side_effects,
                           is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def _struct(*types):
    return llvm.StructType.get_literal(list(types))


def _i32(x, loc, ip):
    return Int32(x).ir_value(loc=loc, ip=ip)


def _i64(x, loc, ip):
    return Int64(x).ir_value(loc=loc, ip=ip)


def _f32(x, loc, ip):
    return Float32(x).ir_value(loc=loc, ip=ip)


def _unpack(res, ty, n, wrap):
    return tuple(wrap(llvm.extractvalue(ty, res, [i])) for i in range(n))


# --------------------------------------------------------------------------------------------
# shared-memory loads into MMA fragments


@dsl_user_op
def ldsm_x4(addr: Int32, *, loc: Optional[ir.Location] = None,
            ip: Optional[ir.InsertionPoint] = None) -> Tuple[Int32, Int32, Int32, Int32]:
    """`ldmatrix.x4` (no transpose): lane l supplies the row address (l & 7) of matrix l >> 3."""
    res = _asm(_struct(T.i32(), T.i32(), T.i32(), T.i32()), [_i32(addr, loc, ip)],
               "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];",
               "=r,=r,=r,=r,r", True)
    return _unpack(res, T.i32(), 4, Int32)


@dsl_user_op
def ldsm_x4_t(addr: Int32, *, loc: Optional[ir.Location] = None,
              ip: Optional[ir.InsertionPoint] = None) -> Tuple[Int32, Int32, Int32, Int32]:
    """`ldmatrix.x4.trans`: each register holds the transposed 8x8 matrix's fragment."""
    res = _asm(_struct(T.i32(), T.i32(), T.i32(), T.i32()), [_i32(addr, loc, ip)],
               "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0, $1, $2, $3}, [$4];",
               "=r,=r,=r,=r,r", True)
    return _unpack(res, T.i32(), 4, Int32)


@dsl_user_op
def lds_b32(addr: Int32, *, loc: Optional[ir.Location] = None,
            ip: Optional[ir.InsertionPoint] = None) -> Int32:
    return Int32(_asm(T.i32(), [_i32(addr, loc, ip)], "ld.shared.b32 $0, [$1];", "=r,r", True))


@dsl_user_op
def lds_f32(addr: Int32, *, loc: Optional[ir.Location] = None,
            ip: Optional[ir.InsertionPoint] = None) -> Float32:
    return Float32(_asm(T.f32(), [_i32(addr, loc, ip)], "ld.shared.f32 $0, [$1];", "=f,r", True))


@dsl_user_op
def lds_bf16_f32(addr: Int32, *, loc: Optional[ir.Location] = None,
                 ip: Optional[ir.InsertionPoint] = None) -> Float32:
    """One bf16 from shared memory, widened exactly to fp32."""
    return Float32(_asm(T.f32(), [_i32(addr, loc, ip)],
                        "{\n\t.reg .b32 w;\n\tld.shared.u16 w, [$1];\n\tshl.b32 $0, w, 16;\n\t}",
                        "=f,r", True))


@dsl_user_op
def sts_b32(addr: Int32, val: Int32, *, loc: Optional[ir.Location] = None,
            ip: Optional[ir.InsertionPoint] = None) -> None:
    _asm(None, [_i32(addr, loc, ip), _i32(val, loc, ip)], "st.shared.b32 [$0], $1;", "r,r", True)


# --------------------------------------------------------------------------------------------
# tensor-core MMA and register transposes


@dsl_user_op
def mma_bf16_16816(a: Tuple, b: Tuple, c: Tuple, *, loc: Optional[ir.Location] = None,
                   ip: Optional[ir.InsertionPoint] = None) -> Tuple[Float32, Float32, Float32, Float32]:
    """D = A(16x16 bf16) * B(16x8 bf16) + C (fp32), `mma.sync.aligned.m16n8k16.row.col`."""
    ops = [_i32(x, loc, ip) for x in a] + [_i32(x, loc, ip) for x in b] + [_f32(x, loc, ip) for x in c]
    res = _asm(_struct(T.f32(), T.f32(), T.f32(), T.f32()), ops,
               "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
               "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", False)
    return _unpack(res, T.f32(), 4, Float32)


@dsl_user_op
def movmatrix_t(x: Int32, *, loc: Optional[ir.Location] = None,
                ip: Optional[ir.InsertionPoint] = None) -> Int32:
    """Transpose an 8x8 b16 matrix held one packed pair per lane (`movmatrix.trans`)."""
    return Int32(_asm(T.i32(), [_i32(x, loc, ip)], "movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;", "=r,r",
                      False))


# --------------------------------------------------------------------------------------------
# bf16 packing and separately rounded fp32 arithmetic


@dsl_user_op
def pack_bf16x2(lo: Float32, hi: Float32, *, loc: Optional[ir.Location] = None,
                ip: Optional[ir.InsertionPoint] = None) -> Int32:
    """bf(lo) in bits 0-15, bf(hi) in bits 16-31; round to nearest even, no saturation."""
    return Int32(_asm(T.i32(), [_f32(hi, loc, ip), _f32(lo, loc, ip)], "cvt.rn.bf16x2.f32 $0, $1, $2;",
                      "=r,f,f", False))


@dsl_user_op
def unpack_bf16x2(w: Int32, *, loc: Optional[ir.Location] = None,
                  ip: Optional[ir.InsertionPoint] = None) -> Tuple[Float32, Float32]:
    """Exact fp32 widening of the two bf16 halves (low, high)."""
    res = _asm(_struct(T.f32(), T.f32()), [_i32(w, loc, ip)],
               "shl.b32 $0, $2, 16;\n\tand.b32 $1, $2, -65536;", "=f,=f,r", False)
    return _unpack(res, T.f32(), 2, Float32)


@dsl_user_op
def round_bf16x2(x0: Float32, x1: Float32, *, loc: Optional[ir.Location] = None,
                 ip: Optional[ir.InsertionPoint] = None) -> Tuple[Float32, Float32]:
    """(f32(bf(x0)), f32(bf(x1))): round to bf16 (RNE) and widen back."""
    res = _asm(_struct(T.f32(), T.f32()), [_f32(x1, loc, ip), _f32(x0, loc, ip)],
               "{\n\t.reg .b32 w;\n\tcvt.rn.bf16x2.f32 w, $2, $3;\n\tshl.b32 $0, w, 16;\n\t"
               "and.b32 $1, w, -65536;\n\t}", "=f,=f,f,f", False)
    return _unpack(res, T.f32(), 2, Float32)


@dsl_user_op
def sub_rn(a: Float32, b: Float32, *, loc: Optional[ir.Location] = None,
           ip: Optional[ir.InsertionPoint] = None) -> Float32:
    return Float32(_asm(T.f32(), [_f32(a, loc, ip), _f32(b, loc, ip)], "sub.rn.f32 $0, $1, $2;", "=f,f,f",
                        False))


@dsl_user_op
def add_rn(a: Float32, b: Float32, *, loc: Optional[ir.Location] = None,
           ip: Optional[ir.InsertionPoint] = None) -> Float32:
    return Float32(_asm(T.f32(), [_f32(a, loc, ip), _f32(b, loc, ip)], "add.rn.f32 $0, $1, $2;", "=f,f,f",
                        False))


@dsl_user_op
def mul_rn(a: Float32, b: Float32, *, loc: Optional[ir.Location] = None,
           ip: Optional[ir.InsertionPoint] = None) -> Float32:
    return Float32(_asm(T.f32(), [_f32(a, loc, ip), _f32(b, loc, ip)], "mul.rn.f32 $0, $1, $2;", "=f,f,f",
                        False))


@dsl_user_op
def fma_rn(a: Float32, b: Float32, c: Float32, *, loc: Optional[ir.Location] = None,
           ip: Optional[ir.InsertionPoint] = None) -> Float32:
    return Float32(_asm(T.f32(), [_f32(a, loc, ip), _f32(b, loc, ip), _f32(c, loc, ip)],
                        "fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f", False))


@dsl_user_op
def select_b32(pred: Int32, a: Int32, b: Int32, *, loc: Optional[ir.Location] = None,
               ip: Optional[ir.InsertionPoint] = None) -> Int32:
    """pred != 0 ? a : b, branch-free."""
    return Int32(_asm(T.i32(), [_i32(pred, loc, ip), _i32(a, loc, ip), _i32(b, loc, ip)],
                      "{\n\t.reg .pred p;\n\tsetp.ne.s32 p, $1, 0;\n\tselp.b32 $0, $2, $3, p;\n\t}",
                      "=r,r,r,r", False))


# --------------------------------------------------------------------------------------------
# global memory (64-bit addresses)


@dsl_user_op
def stg_b32_if(addr: Int64, val: Int32, pred: Int32, *, loc: Optional[ir.Location] = None,
               ip: Optional[ir.InsertionPoint] = None) -> None:
    """Predicated 4-byte global store (skipped when pred == 0)."""
    _asm(None, [_i64(addr, loc, ip), _i32(val, loc, ip), _i32(pred, loc, ip)],
         "{\n\t.reg .pred p;\n\tsetp.ne.s32 p, $2, 0;\n\t@p st.global.b32 [$0], $1;\n\t}", "l,r,r", True)


@dsl_user_op
def ldg_bf16_pair(addr0: Int64, addr1: Int64, *, loc: Optional[ir.Location] = None,
                  ip: Optional[ir.InsertionPoint] = None) -> Int32:
    """Two bf16 loads from unrelated addresses, packed (addr0 -> low half)."""
    return Int32(_asm(T.i32(), [_i64(addr0, loc, ip), _i64(addr1, loc, ip)],
                      "{\n\t.reg .b16 a, b;\n\tld.global.b16 a, [$1];\n\tld.global.b16 b, [$2];\n\t"
                      "mov.b32 $0, {a, b};\n\t}", "=r,l,l", True))


@dsl_user_op
def ldg_f32_pair_bf16(addr0: Int64, addr1: Int64, *, loc: Optional[ir.Location] = None,
                      ip: Optional[ir.InsertionPoint] = None) -> Int32:
    """Two fp32 loads rounded to bf16 (RNE) and packed (addr0 -> low half)."""
    return Int32(_asm(T.i32(), [_i64(addr0, loc, ip), _i64(addr1, loc, ip)],
                      "{\n\t.reg .f32 a, b;\n\tld.global.f32 a, [$1];\n\tld.global.f32 b, [$2];\n\t"
                      "cvt.rn.bf16x2.f32 $0, b, a;\n\t}", "=r,l,l", True))


@dsl_user_op
def stg_bf16_pair(addr0: Int64, addr1: Int64, w: Int32, *, loc: Optional[ir.Location] = None,
                  ip: Optional[ir.InsertionPoint] = None) -> None:
    """Store the low bf16 of w at addr0 and the high one at addr1."""
    _asm(None, [_i64(addr0, loc, ip), _i64(addr1, loc, ip), _i32(w, loc, ip)],
         "{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, $2;\n\tst.global.b16 [$0], a;\n\tst.global.b16 [$1], b;\n\t}",
         "l,l,r", True)


@dsl_user_op
def stg_f32_pair_from_bf16(addr0: Int64, addr1: Int64, w: Int32, *, loc: Optional[ir.Location] = None,
                           ip: Optional[ir.InsertionPoint] = None) -> None:
    """Exact fp32 widening of the two bf16 halves of w, stored at addr0 (low) and addr1 (high)."""
    _asm(None, [_i64(addr0, loc, ip), _i64(addr1, loc, ip), _i32(w, loc, ip)],
         "{\n\t.reg .b32 a, b;\n\tshl.b32 a, $2, 16;\n\tand.b32 b, $2, -65536;\n\t"
         "st.global.b32 [$0], a;\n\tst.global.b32 [$1], b;\n\t}", "l,l,r", True)


# --------------------------------------------------------------------------------------------
# non-tensor bulk copy (caller must elect exactly one lane, docs/build.md §3)


@dsl_user_op
def bulk_g2s(dst_smem: Int32, src_gmem: Int64, nbytes: Int32, mbar_smem: Int32, *,
             loc: Optional[ir.Location] = None, ip: Optional[ir.InsertionPoint] = None) -> None:
    """`cp.async.bulk` global -> shared completing `nbytes` transaction bytes on the mbarrier.

    Issue from ONE lane (inside `cute.arch.elect_one()`): every issuing lane completes its own bytes.
    Addresses and size must be multiples of 16 bytes.
    """
    _asm(None, [_i32(dst_smem, loc, ip), _i64(src_gmem, loc, ip), _i32(nbytes, loc, ip),
                _i32(mbar_smem, loc, ip)],
         "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
         "r,l,r,r", True)
