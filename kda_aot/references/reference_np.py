"""NumPy references for KDA prefill: the float64 gold and the chunked algorithm, without torch.

The same definitions as reference.py (docs/algorithm.md §2), on NumPy arrays, so that the CPU
tests and the demo's CPU path need no torch:

* `gold_prefill`: the per-token delta-rule recurrence in float64 with exact functions.
* `chunked_prefill(mode="exact")`: the CHUNK=16 algebra in float64, no rounding (equals the gold
  to ~1e-10).
* `chunked_prefill(mode="emulate")`: the same code with the rounding recipe (bf16 through
  ml_dtypes, round-to-nearest-even) at the recipe's points, with exact fp32 functions for the
  kernels' PTX approximations: a ~1-2 bf16-ulp emulation of the kernels, not a bitwise one
  (reference.py with the GPU's approximations is the bitwise reference).

Arrays follow the low-level API: token-major [B, T, H, 128] (bf16 as ml_dtypes.bfloat16), beta
logits [B, T, H], V-first states [N, H, V, K], optional packed int `cu_seqlens` (then B = 1).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union

import ml_dtypes
import numpy as np

from ..library.constants import CHUNK, LOG2E, D

L2_EPS = 1e-6
BF16 = np.dtype(ml_dtypes.bfloat16)
F32, F64 = np.float32, np.float64


def _bf(x) -> np.ndarray:
    """fp32 -> bf16 (RNE) -> fp32."""
    return np.asarray(x, F32).astype(BF16).astype(F32)


def _fma32(a, b, c) -> np.ndarray:
    """fp32 fma with one rounding (the fp64 product of two fp32 values is exact)."""
    return (np.asarray(a, F64) * np.asarray(b, F64) + np.asarray(c, F64)).astype(F32)


def _acc32(a, b) -> np.ndarray:
    """fp32-accumulated product of exactly representable (bf16) operands: exact products
    summed in fp64, rounded once."""
    return (np.asarray(a, F64) @ np.asarray(b, F64)).astype(F32)


def _sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-x))


class _ExactMath:
    dtype = F64

    def const(self, x: float):
        return F64(x)

    def rb(self, x):
        return x


    def ex2(self, x):
        return np.exp2(x)

    def sig(self, x):
        return _sigmoid64(x)

    def mm(self, a, b):
        return a @ b

    def fma(self, a, b, c):
        return a * b + c

    def l2n(self, x):
        return x / np.sqrt((x * x).sum(-1, keepdims=True) + L2_EPS)

    def entry_state(self, s):
        return np.asarray(s, F64)


class _EmulateMath:
    dtype = F32

    def const(self, x: float):
        return F32(x)  # formed in double, cast to fp32 once

    rb = staticmethod(_bf)
    fma = staticmethod(_fma32)
    mm = staticmethod(_acc32)

    def ex2(self, x):
        return np.exp2(np.asarray(x, F32))

    def sig(self, x):
        # The kernels' tanh-based sigmoid: fma(tanh(0.5 x), 0.5, 0.5).
        return _fma32(np.tanh(np.asarray(x, F32) * F32(0.5)), 0.5, 0.5)

    def l2n(self, x):
        """16 lanes x 8 elements, a sequential fma chain per lane, xor butterfly 8, 4, 2, 1, then
        bf(x * rsqrt(p + 1e-6)) (reference.py's recipe)."""
        xr = x.reshape(*x.shape[:-1], 16, D // 16)
        p = np.zeros(xr.shape[:-1], F32)
        for i in range(D // 16):
            p = _fma32(xr[..., i], xr[..., i], p)
        lane = np.arange(16)
        for o in (8, 4, 2, 1):
            p = p + p[..., lane ^ o]
        r = F32(1.0) / np.sqrt(p + F32(L2_EPS))
        return _bf(xr * r[..., None]).reshape(x.shape)

    def entry_state(self, s):
        return _bf(np.asarray(s, F32))


def _n_sequences(q, beta, A_log, dt_bias, initial_state, cu_seqlens) -> int:
    if q.ndim != 4 or q.shape[-1] != D:
        raise ValueError(f"q must be [B, T, H, {D}], got {q.shape}")
    B, T, H, _ = q.shape
    if beta.shape != (B, T, H) or A_log.shape != (H,) or dt_bias.size != H * D:
        raise ValueError("beta must be [B, T, H], A_log [H] and dt_bias [H, 128]")
    if cu_seqlens is None:
        n = B
    else:
        cu = [int(c) for c in np.asarray(cu_seqlens).tolist()]
        if B != 1 or len(cu) < 2 or cu[0] != 0 or cu[-1] != T or any(b < a for a, b in zip(cu, cu[1:])):
            raise ValueError(f"cu_seqlens must be non-decreasing from 0 to T={T} with B == 1: {cu}")
        n = len(cu) - 1
    if initial_state is not None and initial_state.shape != (n, H, D, D):
        raise ValueError(f"initial_state must be [{n}, {H}, {D}, {D}], got {initial_state.shape}")
    return n


def _run(core, m, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, initial_state, cu_seqlens):
    """Cast once to the working dtype, then call `core` on [L, X, ...] rows: all batch rows at once
    (dense), or each sequence alone (packed, so a sequence never sees another's tokens)."""
    n = _n_sequences(q, beta, A_log, dt_bias, initial_state, cu_seqlens)
    B, T, H, _ = q.shape
    w = m.dtype
    scale = D ** -0.5 if scale is None else scale
    q, k, v, g, beta = (np.asarray(x).astype(w) for x in (q, k, v, g, beta))
    A_log = np.asarray(A_log).astype(w)
    dt_bias = np.asarray(dt_bias).astype(w).reshape(H, D)
    s0 = np.zeros((n, H, D, D), w) if initial_state is None else m.entry_state(initial_state).astype(w)
    o = np.zeros((B, T, H, D), w)
    final = np.empty((n, H, D, D), w)
    params = dict(lb=float(lower_bound), scale=float(scale))
    if cu_seqlens is None:
        def rows(x):  # [B, T, H, ...] -> [T, B*H, ...]
            x = np.swapaxes(x, 0, 1)
            return x.reshape(T, B * H, *x.shape[3:])

        o_rows, s = core(m, rows(q), rows(k), rows(v), rows(g), rows(beta), np.tile(A_log, B),
                         np.tile(dt_bias, (B, 1)), s0.reshape(B * H, D, D), **params)
        o[:] = np.swapaxes(o_rows.reshape(T, B, H, D), 0, 1)
        final[:] = s.reshape(B, H, D, D)
    else:
        cu = [int(c) for c in np.asarray(cu_seqlens).tolist()]
        for i in range(n):
            a, b = cu[i], cu[i + 1]
            o_seq, s = core(m, q[0, a:b], k[0, a:b], v[0, a:b], g[0, a:b], beta[0, a:b], A_log, dt_bias, s0[i],
                            **params)
            o[0, a:b] = o_seq
            final[i] = s
    return o, final


def _gold_core(m, q, k, v, g, beta, A_log, dt_bias, s, *, lb, scale):
    qh = m.l2n(q) * scale
    kh = m.l2n(k)
    alpha = np.exp(lb * _sigmoid64(np.exp(A_log)[:, None] * (g + dt_bias)))
    b = _sigmoid64(beta)
    o = np.empty_like(v)
    s = s.copy()
    for t in range(q.shape[0]):
        s *= alpha[t][:, None, :]  # decay the key channels (columns)
        resid = v[t] - (s @ kh[t][:, :, None])[..., 0]
        s += (b[t][:, None] * resid)[:, :, None] * kh[t][:, None, :]
        o[t] = (s @ qh[t][:, :, None])[..., 0]  # the output uses the updated state
    return o, s


def gold_prefill(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, A_log: np.ndarray, dt_bias: np.ndarray, lower_bound: float,
                 scale: Optional[float] = None, initial_state: Optional[np.ndarray] = None,
                 cu_seqlens: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Float64 gold: (o [B, T, H, 128], final_state [N, H, 128, 128]), both float64."""
    return _run(_gold_core, _ExactMath(), q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, initial_state,
                cu_seqlens)


def _to_tiles(x, length: int):
    """[L, X, ...] -> [nt, X, 16, ...], padded rows zero."""
    nt = -(-length // CHUNK)
    pad = np.zeros((nt * CHUNK - length,) + x.shape[1:], x.dtype)
    x = np.concatenate([x, pad]).reshape(nt, CHUNK, *x.shape[1:])
    return np.swapaxes(x, 1, 2)


def _cumsum_rows(a2):
    """Sequential G_i = G_{i-1} + a2_i in the working dtype (row axis -2)."""
    out, acc = [], np.zeros_like(a2[..., 0, :])
    for i in range(a2.shape[-2]):
        acc = acc + a2[..., i, :]
        out.append(acc)
    return np.stack(out, axis=-2)


def _fma32_rn(a, b, c) -> np.ndarray:
    """fma.rn.f32 exactly: the fp64 product is exact and the fp64 sum is taken by round-to-odd
    (reference.py's _fma32_rn says why that rounds correctly to fp32 afterwards)."""
    p = np.asarray(a, F64) * np.asarray(b, F64)
    c = np.asarray(c, F64)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    odd = (s.view(np.int64) & 1) == 1
    toward = np.nextafter(s, np.where(err > 0, np.inf, -np.inf))
    return np.where((err == 0) | odd, s, toward).astype(F32)


def _inverse16(m, L):
    """(I + L)^-1 for strictly lower 16x16 L: exact in float64, or FlashKDA's stable-inverse recipe
    in emulation (reference.py's _inverse16: fp32 forward substitution of the 8x8 diagonal
    blocks, then the bf16 merge P + bf(bf(-P M) P))."""
    eye = np.eye(CHUNK, dtype=L.dtype)
    if isinstance(m, _ExactMath):
        return np.linalg.inv(eye + L)
    h = CHUNK // 2
    X = np.stack([L[..., :h, :h], L[..., h:, h:]], axis=-3)
    X = np.tril(-X, -1) + np.eye(h, dtype=F32)
    for s in range(1, h - 1):
        shape = X.shape[:-2] + (h - 1 - s, s)
        X[..., s + 1:, :s] = _fma32_rn(np.broadcast_to(X[..., s + 1:, s:s + 1], shape),
                                       np.broadcast_to(X[..., s:s + 1, :s], shape), X[..., s + 1:, :s])
    P = np.zeros_like(L)
    P[..., :h, :h] = m.rb(X[..., 0, :, :])
    P[..., h:, h:] = m.rb(X[..., 1, :, :])
    M = np.zeros_like(L)
    M[..., h:, :h] = m.rb(L[..., h:, :h])
    o = m.mm(m.rb(-m.mm(P, M)), P)
    return m.rb(P + m.rb(o))


def _prepare_tiles(m, q, k, g, beta, A_log, dt_bias, lb, scale, length):
    nt = -(-length // CHUNK)
    valid = (np.arange(nt * CHUNK) < length).reshape(nt, CHUNK)[:, None, :, None]
    qh = m.l2n(_to_tiles(q, length))
    kh = m.l2n(_to_tiles(k, length))
    A = m.ex2(A_log * m.const(LOG2E))
    x = A[:, None, None] * (_to_tiles(g, length) + dt_bias[:, None, :])
    a2 = m.const(lb * LOG2E) * m.sig(x)
    a2 = np.where(valid, a2, np.zeros_like(a2))
    G = _cumsum_rows(a2)
    gam = m.ex2(G[..., -1, :])
    e, ebar = m.rb(m.ex2(G)), m.rb(m.ex2(-G))
    Qd = m.rb(m.rb(qh * e) * m.rb(m.const(scale)))
    Kd = m.rb(kh * e)
    Ki = m.rb(kh * ebar)
    Kr = m.rb(Ki * m.rb(gam)[..., None, :])
    b = m.sig(_to_tiles(beta, length))
    Kit = np.swapaxes(Ki, -1, -2)
    L = np.tril(m.mm(Kd, Kit), -1) * b[..., :, None]  # fp32, row-scaled by b
    Mqk = np.tril(m.rb(m.mm(Qd, Kit)))
    INV = _inverse16(m, L)
    return Qd, Kd, Kr, gam, b, INV, Mqk


def _chunked_core(m, q, k, v, g, beta, A_log, dt_bias, s, *, lb, scale):
    length = q.shape[0]
    if length == 0:
        return v.copy(), s.copy()
    Qd, Kd, Kr, gam, b, INV, Mqk = _prepare_tiles(m, q, k, g, beta, A_log, dt_bias, lb, scale, length)
    vt = _to_tiles(v, length)
    bb = m.rb(b)[..., None]
    outs = []
    for j in range(vt.shape[0]):
        st = np.swapaxes(s, -1, -2)
        u = m.rb(m.mm(Kd[j], st))
        o1 = m.rb(m.mm(Qd[j], st))
        r = m.rb(m.rb(vt[j] - u) * bb[j])
        U = m.rb(m.mm(INV[j], r))
        outs.append(m.rb(o1 + m.rb(m.mm(Mqk[j], U))))
        ds = m.mm(np.swapaxes(U, -1, -2), Kr[j])
        s = m.rb(m.fma(s, gam[j][:, None, :], ds))
    o = np.swapaxes(np.stack(outs), 1, 2)
    return o.reshape(-1, *o.shape[2:])[:length], s


def chunked_prefill(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, A_log: np.ndarray, dt_bias: np.ndarray, lower_bound: float,
                    scale: Optional[float] = None, initial_state: Optional[np.ndarray] = None, cu_seqlens: Optional[np.ndarray] = None,
                    mode: str = "emulate") -> Tuple[np.ndarray, np.ndarray]:
    """The chunked algorithm: mode="exact" (float64, no rounding) or "emulate" (the rounding
    recipe; returns bf16 arrays, as the kernels do)."""
    if mode not in ("exact", "emulate"):
        raise ValueError(f"mode must be 'exact' or 'emulate', got {mode!r}")
    m = _ExactMath() if mode == "exact" else _EmulateMath()
    o, final = _run(_chunked_core, m, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, initial_state,
                    cu_seqlens)
    if mode == "emulate":  # bf16-representable values: exact casts
        o, final = o.astype(BF16), final.astype(BF16)
    return o, final


def rel_rmse(a: Any, b: Any) -> float:
    """||a - b|| / (||b|| + 1e-8) in float64, b the reference."""
    a, b = np.asarray(a, F64), np.asarray(b, F64)
    return float(np.linalg.norm(a - b) / (np.linalg.norm(b) + 1e-8))


def make_inputs(shape: Union[Tuple[int, int], Sequence[int]], H: int, seed: int,
                state: Optional[str] = None) -> dict:
    """Random inputs as keyword arguments of the references: a tuple (B, T) gives dense inputs, a
    list of lengths packed ones (B = 1, int32 cu_seqlens). q, k, v, g, beta logits ~ N(0, 1) in
    bf16; A_log, dt_bias ~ U(0, 1) fp32; lower_bound -5; initial_state ~ 0.1 N(0, 1) in `state`
    ("bf16" | "fp32") or None. NumPy's generator: not the same values as reference.make_inputs."""
    if isinstance(shape, tuple):
        B, T = shape
        n, cu = B, None
    else:
        lens = [int(x) for x in shape]
        B, T, n = 1, sum(lens), len(lens)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    rng = np.random.default_rng(seed)

    def randn(*size):
        return rng.standard_normal(size, dtype=F32)

    out = dict(q=randn(B, T, H, D).astype(BF16), k=randn(B, T, H, D).astype(BF16),
               v=randn(B, T, H, D).astype(BF16), g=randn(B, T, H, D).astype(BF16), beta=randn(B, T, H).astype(BF16),
               A_log=rng.random(H, dtype=F32), dt_bias=rng.random((H, D), dtype=F32), lower_bound=-5.0,
               scale=D ** -0.5, initial_state=None, cu_seqlens=cu)
    if state is not None:
        if state not in ("bf16", "fp32"):
            raise ValueError(f"state must be None, 'bf16' or 'fp32', got {state!r}")
        s = randn(n, H, D, D) * F32(0.1)
        out["initial_state"] = s.astype(BF16) if state == "bf16" else s
    return out
