"""The numerics of the references (docs/algorithm.md §2.4, §2.5): the hooks RB/EX2/SIG of the §2.5
pseudo-code, plus the operations whose recipe differs between exact float64 math and the fp32/bf16
emulation, written once over an array backend `xp` (backend_torch or backend_numpy).

The chunked algorithm (chunked.py) calls a "math object" `m` at every point the recipe may round,
so one algorithm serves the three modes: `ExactMath` (every hook the identity), `EmulateMath`
(the §2.4 recipe, FlashKDA's) and `AccurateMath` (numerics="accurate", docs/numerics.md).
"""

from __future__ import annotations

from typing import Any

from ..library.constants import D

L2_EPS = 1e-6  # inside the square root (§2.1)


def fma32(xp, a, b, c):
    """fp32 fma with one rounding: the fp64 product of two fp32 values is exact, so only the add
    can round twice (fp64 then fp32), which is a negligible deviation from a true fma."""
    return xp.f32(xp.f64(a) * xp.f64(b) + xp.f64(c))


def acc32(xp, a, b):
    """acc32(a @ b): tensor-core fp32-accumulated product of exactly representable inputs.
    Accumulating in fp64 (products of bf16 values are exact there) and rounding once is
    deterministic, unlike CPU fp32 GEMMs whose summation order is unspecified."""
    return xp.f32(xp.f64(a) @ xp.f64(b))


def fma32_rn(xp, a, b, c):
    """fma.rn.f32 exactly: a * b + c rounded once. The fp64 product of two fp32 values is exact;
    the sum is rounded to fp64 by round-to-odd (the nearest fp64 toward the exact value with an
    odd last bit whenever the sum is inexact), after which one rounding to fp32 is the correctly
    rounded result (53 >= 24 + 2 bits), where a plain fp64 sum could round twice."""
    p = xp.f64(a) * xp.f64(b)
    c = xp.f64(c)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)  # two-sum: s + err is the exact sum
    odd = (s.view(xp.I64) & 1) == 1
    inf = xp.full_like(s, float("inf"))
    toward = xp.nextafter(s, xp.where(err > 0, inf, -inf))
    return xp.f32(xp.where((err == 0) | odd, s, toward))


class ExactMath:
    """float64, exact functions, every rounding hook is the identity (§2.5 "math" mode)."""

    exact = True  # P8 takes a float64 triangular solve instead of the stable-inverse recipe
    k1_single_rounding = False

    def __init__(self, xp):
        self.xp = xp
        self.dtype = xp.F64
        self.ex2, self.sig = xp.exp2, xp.sigmoid

    def const(self, x: float, like):
        """x in the working dtype, on `like`'s device: formed in double and cast once (§2.4 P2:
        c = f32(lb*LOG2E))."""
        return self.xp.scalar(x, self.dtype, like)

    def rb(self, x):
        return x

    def mm(self, a, b):
        return a @ b

    def fma(self, a, b, c):
        return a * b + c

    def l2n(self, x, rounded=True):
        return x / self.xp.sqrt((x * x).sum(-1)[..., None] + L2_EPS)

    def entry_state(self, s):
        """The initial state (already cast to the working dtype) as the recurrence starts from it."""
        return s


class EmulateMath(ExactMath):
    """fp32 math rounded at the §2.4 points; ex2/tanh/rsqrt from `approx` (default: exact fp32).

    The three PTX approximations used by the kernels (ex2.approx.ftz, tanh.approx, rsqrt.approx)
    cannot run on the CPU, so exact fp32 functions stand in by default; pass `approx=obj` with
    attributes ex2/tanh/rsqrt (fp32 array -> fp32 array) to substitute the real ones (e.g. on a
    GPU: kda_aot.reference.KernelApprox)."""

    exact = False

    def __init__(self, xp, approx: Any = None):
        self.xp = xp
        self.dtype = xp.F32
        self._ex2 = getattr(approx, "ex2", None) or xp.exp2
        self._tanh = getattr(approx, "tanh", None) or xp.tanh
        self._rsqrt = getattr(approx, "rsqrt", None) or xp.rsqrt
        # acc32 of exactly representable operands; a GPU caller may substitute tensor-core GEMMs.
        self.mm = getattr(approx, "mm", None) or (lambda a, b: acc32(xp, a, b))
        self.rb = xp.bf

    def fma(self, a, b, c):
        return fma32(self.xp, a, b, c)

    def ex2(self, x):
        return self._ex2(x)

    def sig(self, x):
        # Tanh-based sigmoid of the kernels: fma(th(0.5x), 0.5, 0.5).
        return fma32(self.xp, self._tanh(x * self.const(0.5, x)), 0.5, 0.5)

    def l2n(self, x, rounded=True):
        """P1: 16 lanes x 8 elements, sequential fma chain per lane, xor butterfly 8,4,2,1,
        then bf(x * rsqrt(p + 1e-6)). All lanes end with the same sum (fp add commutes).
        rounded=False: x * rsqrt in fp32, unrounded (K1' of numerics="accurate")."""
        xp = self.xp
        xr = x.reshape(*x.shape[:-1], 16, D // 16)
        p = xp.zeros(xr.shape[:-1], x.dtype, like=x)
        for i in range(D // 16):
            p = fma32(xp, xr[..., i], xr[..., i], p)
        lane = xp.arange(16, like=x)
        for o in (8, 4, 2, 1):
            p = p + p[..., lane ^ o]
        r = self._rsqrt(p + self.const(L2_EPS, p))
        y = (xr * r[..., None]).reshape(x.shape)
        return self.rb(y) if rounded else y

    def entry_state(self, s):
        return self.rb(s)  # Q6: S = bf(initial), RNE


class AccurateMath(EmulateMath):
    """numerics="accurate": K1' (the gated operands rounded once); the state enters and stays in fp32."""

    k1_single_rounding = True

    def entry_state(self, s):
        return s
