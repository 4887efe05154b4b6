"""Torch references for KDA prefill (docs/algorithm.md §2): the float64 gold and the chunked algorithm.

Three references, all on the inputs' device (CPU or CUDA):

* `gold_prefill`: the per-token delta-rule recurrence of §2.2 in float64 with exact functions,
  unrounded initial state and scale. This is what accuracy targets (§5.3 item 1) compare against.
* `chunked_prefill(mode="exact")`: the CHUNK=16 algebra of §2.3 in float64 with no rounding. It
  must agree with the gold to ~1e-10; it checks the chunked algebra, not the numerics.
* `chunked_prefill(mode="emulate")`: the same code with the §2.4 rounding recipe (P1-P8, Q1-Q7)
  hooked in at exactly the listed points (§2.5 pseudo-code). On the CPU the PTX approximations
  ex2/tanh/rsqrt are replaced by exact fp32 functions, so this is a ~1-2 bf16-ulp emulation of the
  kernels, not a bitwise one (§2.4 note); a GPU caller may pass the real approximations via
  `approx=`.
* `chunked_prefill(mode="accurate")`: the recipe of numerics="accurate" (docs/numerics.md): K1'
  (each gated operand rounded once from fp32 q^, k^ and factors, Mqk from their bf16 pairs), the
  tile step with an fp32 state, unrounded u, r entering INV r as a bf16 hi + lo pair, U rounded
  once, and one output rounding. Not bitwise (the order of the kernels' fp32
  accumulation is not modelled); it measures what each rounding costs on the CPU.

Inputs follow the low-level API (§1.1/§1.3): token-major [B, T, H, 128] tensors, beta logits
[B, T, H], V-first states [N, H, V, K], optional packed `cu_seqlens` (then B = 1).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union

import torch

from .library.constants import CHUNK, D  # head dim K = V = 128 only (§1.4); tile = chunk of 16 tokens (§2.3)
from .library.constants import LOG2E
from .spec.gate_forms import BETA_FORMS, GATES, resolve_lower_bound

L2_EPS = 1e-6  # inside the square root (§2.1)


# ------------------------------------------------------------------------------------------------
# Rounding primitives of §2.4 (fp32 tensors in, fp32 tensors holding the rounded values out)


def _bf(x: torch.Tensor) -> torch.Tensor:
    """bf(x): fp32 -> bf16 round-to-nearest-even, kept in an fp32 container."""
    return x.float().to(torch.bfloat16).float()


def _fma32(a: torch.Tensor, b, c) -> torch.Tensor:
    """fp32 fma with one rounding: the fp64 product of two fp32 values is exact, so only the add
    can round twice (fp64 then fp32), which is a negligible deviation from a true fma."""
    a = a.double()
    b = b.double() if torch.is_tensor(b) else b
    c = c.double() if torch.is_tensor(c) else c
    return (a * b + c).float()


def _acc32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc32(a @ b): tensor-core fp32-accumulated product of exactly representable inputs.
    Accumulating in fp64 (products of bf16 values are exact there) and rounding once is
    deterministic, unlike CPU fp32 GEMMs whose summation order is unspecified."""
    return (a.double() @ b.double()).float()


# The three PTX approximations used by the kernels (ex2.approx.ftz, tanh.approx, rsqrt.approx).
# The CPU cannot run them, so these exact fp32 stand-ins are the defaults; pass
# `approx=obj` with attributes ex2/tanh/rsqrt to substitute the real ones (e.g. on a GPU).


def _ex2(x: torch.Tensor) -> torch.Tensor:
    return torch.exp2(x)


def _tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x)


def _rsqrt(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / torch.sqrt(x)


# ------------------------------------------------------------------------------------------------
# Numerics: the hooks RB/EX2/SIG of the §2.5 pseudo-code, plus the operations whose recipe
# differs between exact float64 math and the fp32/bf16 emulation.


class _ExactMath:
    """float64, exact functions, every rounding hook is the identity (§2.5 "math" mode)."""

    dtype = torch.float64

    def const(self, x: float, like: torch.Tensor) -> torch.Tensor:
        return torch.tensor(x, dtype=self.dtype, device=like.device)

    def rb(self, x):
        return x

    def ex2(self, x):
        return torch.exp2(x)

    def sig(self, x):
        return torch.sigmoid(x)

    def mm(self, a, b):
        return a @ b

    def fma(self, a, b, c):
        return a * b + c

    def l2n(self, x, rounded=True):
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_EPS)

    def entry_state(self, s):
        return s.double()


class _EmulateMath:
    """fp32 math rounded at the §2.4 points; ex2/tanh/rsqrt from `approx` (default: exact fp32)."""

    dtype = torch.float32

    def __init__(self, approx: Any = None):
        self._ex2 = getattr(approx, "ex2", None) or _ex2
        self._tanh = getattr(approx, "tanh", None) or _tanh
        self._rsqrt = getattr(approx, "rsqrt", None) or _rsqrt
        # acc32 of exactly representable operands; a GPU caller may substitute tensor-core GEMMs.
        self.mm = getattr(approx, "mm", None) or _acc32

    def const(self, x: float, like: torch.Tensor) -> torch.Tensor:
        # Constants are formed in double and cast to fp32 once (§2.4 P2: c = f32(lb*LOG2E)).
        return torch.tensor(x, dtype=self.dtype, device=like.device)

    rb = staticmethod(_bf)
    fma = staticmethod(_fma32)

    def ex2(self, x):
        return self._ex2(x)

    def sig(self, x):
        # Tanh-based sigmoid of the kernels: fma(th(0.5x), 0.5, 0.5).
        return _fma32(self._tanh(x * self.const(0.5, x)), 0.5, 0.5)

    def l2n(self, x, rounded=True):
        """P1: 16 lanes x 8 elements, sequential fma chain per lane, xor butterfly 8,4,2,1,
        then bf(x * rsqrt(p + 1e-6)). All lanes end with the same sum (fp add commutes).
        rounded=False: x * rsqrt in fp32, unrounded (K1' of numerics="accurate")."""
        xr = x.unflatten(-1, (16, D // 16))
        p = torch.zeros(xr.shape[:-1], dtype=x.dtype, device=x.device)
        for i in range(D // 16):
            p = _fma32(xr[..., i], xr[..., i], p)
        lane = torch.arange(16, device=x.device)
        for o in (8, 4, 2, 1):
            p = p + p[..., lane ^ o]
        r = self._rsqrt(p + self.const(L2_EPS, p))
        y = (xr * r[..., None]).flatten(-2)
        return _bf(y) if rounded else y

    def entry_state(self, s):
        return _bf(s.float())  # Q6: S = bf(initial), RNE


# ------------------------------------------------------------------------------------------------
# Argument handling shared by both references


def _check_args(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens) -> int:
    """Shape checks (§1.4 subset that matters for a math reference); returns N."""
    if q.dim() != 4 or q.shape[-1] != D:
        raise ValueError(f"q must be [B, T, H, {D}], got {tuple(q.shape)}")
    B, T, H, _ = q.shape
    for name, x in (("k", k), ("v", v), ("g", g)):
        if x.shape != q.shape:
            raise ValueError(f"{name} shape {tuple(x.shape)} != q shape {tuple(q.shape)}")
    if beta.shape != (B, T, H):
        raise ValueError(f"beta must be [B, T, H] = {(B, T, H)}, got {tuple(beta.shape)}")
    if A_log.shape != (H,):
        raise ValueError(f"A_log must be [H] = {(H,)}, got {tuple(A_log.shape)}")
    if dt_bias.numel() != H * D:
        raise ValueError(f"dt_bias must be [H, {D}], got {tuple(dt_bias.shape)}")
    if cu_seqlens is None:
        n = B
    else:
        if B != 1:
            raise ValueError("cu_seqlens requires B == 1")
        cu = cu_seqlens.tolist() if cu_seqlens.dim() == 1 else []
        if len(cu) < 2 or cu[0] != 0 or cu[-1] != T:
            raise ValueError(f"cu_seqlens must be 1-D, start at 0 and end at T={T}: {cu}")
        if any(b < a for a, b in zip(cu, cu[1:])):
            raise ValueError(f"cu_seqlens must be non-decreasing: {cu}")
        n = len(cu) - 1
    if initial_state is not None and initial_state.shape != (n, H, D, D):
        raise ValueError(f"initial_state must be [N, H, {D}, {D}] with N={n}, "
                         f"got {tuple(initial_state.shape)}")
    return n


def _run(core, math_, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, initial_state,
         cu_seqlens):
    """Cast once to the working dtype, then call `core` per independent batch of (sequence, head)
    rows. `core` sees tensors [L, X, ...] where X enumerates (sequence, head) pairs sharing the
    same length L, so every op is batched over heads (and over batch rows in the dense case).

    Dense B > 1: all batch rows have length T, so they run as one batch X = B*H.
    Varlen: each sequence runs alone on its own token slice, which makes isolation structural:
    a sequence never sees another sequence's tokens, not even as padding (§6.1, §6.6).
    """
    n = _check_args(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens)
    B, T, H, _ = q.shape
    wdt = math_.dtype  # working dtype: fp64 (gold, exact) or fp32 (emulate)
    dev = q.device
    if scale is None:
        scale = D ** -0.5
    q, k, v, g, beta = (x.to(wdt) for x in (q, k, v, g, beta))
    A_log = A_log.to(device=dev, dtype=wdt)
    dt_bias = dt_bias.to(device=dev, dtype=wdt).reshape(H, D)
    if initial_state is None:
        s0 = torch.zeros(n, H, D, D, dtype=wdt, device=dev)
    else:
        s0 = math_.entry_state(initial_state.to(dev))

    o = torch.zeros(B, T, H, D, dtype=wdt, device=dev)
    final = torch.empty(n, H, D, D, dtype=wdt, device=dev)
    params = dict(lb=float(lower_bound), scale=float(scale))
    if cu_seqlens is None:
        def rows(x):  # [B, T, H, ...] -> [T, B*H, ...]
            return x.transpose(0, 1).flatten(1, 2)

        o_rows, s = core(math_, rows(q), rows(k), rows(v), rows(g), rows(beta),
                         A_log.repeat(B), dt_bias.repeat(B, 1), s0.flatten(0, 1), **params)
        o.copy_(o_rows.unflatten(1, (B, H)).transpose(0, 1))
        final.copy_(s.unflatten(0, (B, H)))
    else:
        cu = cu_seqlens.tolist()
        for i in range(n):
            a, b = cu[i], cu[i + 1]
            o_seq, s = core(math_, q[0, a:b], k[0, a:b], v[0, a:b], g[0, a:b], beta[0, a:b],
                            A_log, dt_bias, s0[i], **params)
            o[0, a:b] = o_seq
            final[i] = s
    return o, final


# ------------------------------------------------------------------------------------------------
# Gold: per-token recurrence (§2.2)


def _gold_core(m, q, k, v, g, beta, A_log, dt_bias, s, *, lb, scale):
    """§2.2 pseudo-code for X (sequence, head) rows at once; q..g [L, X, D], beta [L, X]."""
    alpha = torch.exp(lb * torch.sigmoid(torch.exp(A_log)[:, None] * (g + dt_bias)))
    return _delta_rule(m, q, k, v, alpha, torch.sigmoid(beta), s, scale)


def _delta_rule(m, q, k, v, alpha, b, s, scale):
    """The per-token recurrence of §2.2 with the decays alpha [L, X, D] and strengths b [L, X] given."""
    qh = m.l2n(q) * scale
    kh = m.l2n(k)
    o = torch.empty_like(v)
    s = s.clone()
    for t in range(q.shape[0]):
        s.mul_(alpha[t][:, None, :])  # decay key channels (columns)
        resid = v[t] - torch.bmm(s, kh[t][:, :, None])[..., 0]  # [X, V]
        s.baddbmm_((b[t][:, None] * resid)[:, :, None], kh[t][:, None, :])
        o[t] = torch.bmm(s, qh[t][:, :, None])[..., 0]  # output uses the post-update state
    return o, s


def gate_log_decay(g: torch.Tensor, A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
                   lower_bound: Optional[float], gate: str = "safe") -> torch.Tensor:
    """The natural-log decay of every (token, head, key channel) in float64, exact functions
    (kda_aot/spec/gate_forms.py lists the forms). g [B, T, H, 128]; A_log [H] or None; dt_bias [H, 128]
    / [H*128] or None."""
    if gate not in GATES:
        raise ValueError(f"gate: expected one of {GATES}, got {gate!r}")
    x = g.double()
    if gate == "log_decay":
        return x
    H = g.shape[2]
    if dt_bias is not None:
        x = x + dt_bias.to(device=g.device, dtype=torch.float64).reshape(H, D)
    a = None if A_log is None else torch.exp(A_log.to(device=g.device, dtype=torch.float64))[:, None]
    if gate == "softplus":
        return -a * torch.logaddexp(torch.zeros((), dtype=torch.float64, device=g.device), x)
    lb = resolve_lower_bound(gate, lower_bound)
    return lb * torch.sigmoid(x if a is None else a * x)


def beta_strength(beta: torch.Tensor, beta_form: str = "logits", allow_neg_eigval: bool = False) -> torch.Tensor:
    """b, the delta rule's write strength per (token, head), in float64."""
    if beta_form not in BETA_FORMS:
        raise ValueError(f"beta_form: expected one of {BETA_FORMS}, got {beta_form!r}")
    b = beta.double()
    if beta_form == "probs":
        return b
    return torch.sigmoid(b) * (2.0 if allow_neg_eigval else 1.0)


def _gold_core_direct(m, q, k, v, logd, b, A_log, dt_bias, s, *, lb, scale):
    """_gold_core with the log-decay and b given (the gate and beta forms applied before)."""
    return _delta_rule(m, q, k, v, torch.exp(logd), b, s, scale)


def gold_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor], lower_bound: Optional[float],
                 scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
                 cu_seqlens: Optional[torch.Tensor] = None, gate: str = "safe", beta_form: str = "logits",
                 allow_neg_eigval: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Float64 gold of §2.2 (FLA fused_recurrent semantics): exact sigmoid/exp/softplus, unrounded
    scale and the unrounded initial state (fp32 or bf16) widened to fp64. `gate`, `beta_form` and
    `allow_neg_eigval` are prefill's (kda_aot/spec/gate_forms.py); the default is FlashKDA's configuration.

    Returns (o [B, T, H, 128] fp64, final_state [N, H, 128, 128] fp64). Empty sequences return
    their initial state (or zeros).
    """
    if (gate, beta_form, allow_neg_eigval) == ("safe", "logits", False):
        lower_bound = resolve_lower_bound("safe", lower_bound)
        return _run(_gold_core, _ExactMath(), q, k, v, g, beta, A_log, dt_bias, lower_bound, scale,
                    initial_state, cu_seqlens)
    logd = gate_log_decay(g, A_log, dt_bias, lower_bound, gate)
    b = beta_strength(beta, beta_form, allow_neg_eigval)
    H = q.shape[2]
    zeros_a = torch.zeros(H, dtype=torch.float64, device=q.device)  # unused by the direct core
    zeros_dt = torch.zeros(H, D, dtype=torch.float64, device=q.device)
    return _run(_gold_core_direct, _ExactMath(), q, k, v, logd, b, zeros_a, zeros_dt, 0.0, scale,
                initial_state, cu_seqlens)


# ------------------------------------------------------------------------------------------------
# Chunked algorithm (§2.3 algebra, §2.4 rounding, §2.5 structure)


def _to_tiles(x: torch.Tensor, length: int) -> torch.Tensor:
    """[L, X, ...] -> [nt, X, 16, ...], padded rows explicitly zero (Q7; never neighbour data)."""
    nt = -(-length // CHUNK)
    pad = x.new_zeros((nt * CHUNK - length,) + tuple(x.shape[1:]))
    x = torch.cat([x, pad]).unflatten(0, (nt, CHUNK))
    return x.transpose(1, 2)


def _cumsum_rows(a2: torch.Tensor) -> torch.Tensor:
    """P3: sequential G_i = G_{i-1} + a2_i in the working dtype. torch.cumsum is avoided because
    on the CPU it accumulates fp32 in double."""
    out, acc = [], torch.zeros_like(a2[..., 0, :])
    for i in range(a2.shape[-2]):
        acc = acc + a2[..., i, :]
        out.append(acc)
    return torch.stack(out, dim=-2)


def _gate_log2(m, g, A_log, dt_bias, lb):
    """P2: a2 = c * sig(A * (g + dt)), A = ex2(A_log*LOG2E), c = f32(lb*LOG2E); each op rounded
    separately. g [nt, X, 16, D], A_log [X], dt_bias [X, D]."""
    A = m.ex2(A_log * m.const(LOG2E, A_log))
    x = A[:, None, None] * (g + dt_bias[:, None, :])
    return m.const(lb * LOG2E, x) * m.sig(x)


def _fma32_rn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fma.rn.f32 exactly: a * b + c rounded once. The fp64 product of two fp32 values is exact;
    the sum is rounded to fp64 by round-to-odd (the nearest fp64 toward the exact value with an
    odd last bit whenever the sum is inexact), after which one rounding to fp32 is the correctly
    rounded result (53 >= 24 + 2 bits), where a plain fp64 sum could round twice."""
    p = a.double() * b.double()
    c = c.double()
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)  # two-sum: s + err is the exact sum
    odd = (s.view(torch.int64) & 1) == 1
    inf = torch.full_like(s, float("inf"))
    toward = torch.nextafter(s, torch.where(err > 0, inf, -inf))
    return torch.where((err == 0) | odd, s, toward).float()


def _inverse16(m, L):
    """P8: INV = (I + L)^-1 for strictly lower 16x16 L [..., 16, 16] (docs/algorithm.md §2.4).

    Exact math: a float64 triangular solve. Emulation: FlashKDA's stable-inverse recipe
    (September 2026). The two 8x8 diagonal blocks A and B of I + L are inverted in fp32 by
    forward substitution: X[i, p] starts at -L[i, p] and takes fma(-L[i, s], X[s, p], X[i, p])
    for s = p + 1 .. i - 1 in that order (each row of the pivot s final before it is used). The
    16x16 result is merged with bf16 operands and fp32 accumulation: P = diag(bf(A^-1), bf(B^-1)),
    M = [0 0; bf(C) 0] with C = L's lower-left block, dc = P M, o = bf(-dc) P, INV = P + bf(o)
    (nonzero blocks disjoint: (I + L)^-1 = [A^-1 0; -B^-1 C A^-1 B^-1]). No power of L is
    formed, so nearly parallel keys with a large beta (entries of L near 1) stay accurate, where
    the earlier fp16 Neumann product (I - L)(I + L^2)(I + L^4)(I + L^8) cancelled catastrophically."""
    eye = torch.eye(CHUNK, dtype=L.dtype, device=L.device)
    if isinstance(m, _ExactMath):
        return torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False, unitriangular=True)
    h = CHUNK // 2
    blocks = torch.stack([L[..., :h, :h], L[..., h:, h:]], dim=-3)  # [..., 2, 8, 8]
    X = torch.tril(-blocks, -1) + torch.eye(h, dtype=L.dtype, device=L.device)
    for s in range(1, h - 1):  # step 0 has no column left of the pivot, row 7 is never a pivot
        X[..., s + 1:, :s] = _fma32_rn(X[..., s + 1:, s:s + 1].expand(*X.shape[:-2], h - 1 - s, s),
                                       X[..., s:s + 1, :s].expand(*X.shape[:-2], h - 1 - s, s),
                                       X[..., s + 1:, :s])
    P = torch.zeros_like(L)
    P[..., :h, :h] = m.rb(X[..., 0, :, :])
    P[..., h:, h:] = m.rb(X[..., 1, :, :])
    M = torch.zeros_like(L)
    M[..., h:, :h] = m.rb(L[..., h:, :h])
    dc = m.mm(P, M)
    o = m.mm(m.rb(-dc), P)
    return m.rb(P + m.rb(o))


def _prepare_tiles(m, q, k, g, beta, A_log, dt_bias, lb, scale, length):
    """K1 (§3.1): every per-tile quantity, token-parallel over all tiles and rows.
    Returns Qd, Kd, Kr [nt, X, 16, D], gamma [nt, X, D], b [nt, X, 16], INV and Mqk [nt, X, 16, 16].
    """
    nt = -(-length // CHUNK)
    valid = torch.arange(nt * CHUNK, device=q.device) < length
    valid = valid.unflatten(0, (nt, CHUNK))[:, None, :, None]  # [nt, 1, 16, 1]
    single = getattr(m, "k1_single_rounding", False)
    # padded rows are 0 -> 0 after normalisation; K1' keeps q^ and k^ in fp32 until they are gated
    qh = m.l2n(_to_tiles(q, length), rounded=not single)
    kh = m.l2n(_to_tiles(k, length), rounded=not single)
    a2 = _gate_log2(m, _to_tiles(g, length), A_log, dt_bias, lb)
    a2 = torch.where(valid, a2, torch.zeros_like(a2))  # padded rows add exactly 0 (P3)
    G = _cumsum_rows(a2)
    gam = m.ex2(G[..., -1, :])  # P4: fp32 gamma, stored unrounded
    if single:
        # K1' of numerics="accurate" (docs/numerics.md): each gated operand rounded once, from
        # fp32 q^, k^ and factors (FlashKDA rounds q^, k^, 2^G, 2^-G, gamma and the scale first)
        e, ebar = m.ex2(G), m.ex2(-G)
        Qdf = qh * e * m.const(scale, qh)
        Qd = m.rb(Qdf)
        Kd = m.rb(kh * e)
        Kif = kh * ebar
        Ki = m.rb(Kif)
        Kr = m.rb(Kif * gam[..., None, :])
        # Mqk from the bf16 pairs of Qd and Ki (hi + lo, lo = bf(x - hi)): three fp32-accumulated
        # products, summed (Qd_lo Ki^T + Qd Ki_lo^T) + Qd Ki^T as K1' sums them
        Qlo = m.rb(Qdf - Qd)
        Kilo_t = m.rb(Kif - Ki).transpose(-1, -2)
    else:
        e, ebar = m.rb(m.ex2(G)), m.rb(m.ex2(-G))
        Qd = m.rb(m.rb(qh * e) * m.rb(m.const(scale, qh)))  # P5
        Kd = m.rb(kh * e)
        Ki = m.rb(kh * ebar)
        Kr = m.rb(Ki * m.rb(gam)[..., None, :])
    b = m.sig(_to_tiles(beta, length))  # padded logits are 0 -> 0.5, harmless (k = v = 0)
    Kit = Ki.transpose(-1, -2)
    L = torch.tril(m.mm(Kd, Kit), diagonal=-1) * b[..., :, None]  # P6: fp32, row-scaled by b
    if single:
        Mqk = torch.tril(m.rb((m.mm(Qlo, Kit) + m.mm(Qd, Kilo_t)) + m.mm(Qd, Kit)))
    else:
        Mqk = torch.tril(m.rb(m.mm(Qd, Kit)))  # P7
    INV = _inverse16(m, L)
    return Qd, Kd, Kr, gam, b, INV, Mqk


def _chunked_core(m, q, k, v, g, beta, A_log, dt_bias, s, *, lb, scale):
    """§2.5 for X (sequence, head) rows sharing length L: K1 preparation over all tiles, then the
    K2 tile recurrence batched over X. Returns (o [L, X, D], S [X, V, K])."""
    length = q.shape[0]
    if length == 0:
        return v.clone(), s.clone()
    Qd, Kd, Kr, gam, b, INV, Mqk = _prepare_tiles(m, q, k, g, beta, A_log, dt_bias, lb, scale,
                                                  length)
    vt = _to_tiles(v, length)
    bb = m.rb(b)[..., None]
    outs = []
    for j in range(vt.shape[0]):
        st = s.transpose(-1, -2)
        u = m.rb(m.mm(Kd[j], st))  # Q1
        o1 = m.rb(m.mm(Qd[j], st))
        r = m.rb(m.rb(vt[j] - u) * bb[j])  # Q2
        U = m.rb(m.mm(INV[j], r))  # Q3
        outs.append(m.rb(o1 + m.rb(m.mm(Mqk[j], U))))  # Q4
        ds = m.mm(U.transpose(-1, -2), Kr[j])  # Q5: (Kr^T U)^T, [X, V, K]
        s = m.rb(m.fma(s, gam[j][:, None, :], ds))
    o = torch.stack(outs).transpose(1, 2).flatten(0, 1)[:length]  # padded rows never written
    return o, s


class _AccurateMath(_EmulateMath):
    """numerics="accurate": K1' (the gated operands rounded once); the state enters and stays in fp32."""

    k1_single_rounding = True

    def entry_state(self, s):
        return s.float()


def _split_mm(m, a, x):
    """acc32(a (hi + lo)) with hi = bf(x), lo = bf(x - hi): an fp32 operand as two bf16 operands."""
    hi = m.rb(x)
    return (a.double() @ hi.double() + a.double() @ m.rb(x - hi).double()).float()


def _chunked_core_accurate(m, q, k, v, g, beta, A_log, dt_bias, s, *, lb, scale):
    """_chunked_core with the accurate tile step (docs/numerics.md: K1', A1-A5, Q5 with bf(U))."""
    length = q.shape[0]
    if length == 0:
        return v.clone(), s.clone()
    Qd, Kd, Kr, gam, b, INV, Mqk = _prepare_tiles(m, q, k, g, beta, A_log, dt_bias, lb, scale, length)
    vt = _to_tiles(v, length)
    # sigma(beta) to 16 bits: bf16 plus the residue K1' stores beside it (the sum is exact in fp32)
    b_hi = m.rb(b)
    bb = (b_hi + m.rb(b - b_hi))[..., None]
    outs = []
    for j in range(vt.shape[0]):
        st = m.rb(s).transpose(-1, -2)  # A1: the MMA operand is bf(S); S itself stays fp32
        u = m.mm(Kd[j], st)  # A2: u unrounded
        o1 = m.mm(Qd[j], st)
        r = (vt[j] - u) * bb[j]
        U = m.rb(_split_mm(m, INV[j], r))  # A3: r as hi + lo; U rounded once, for Q4 and Q5
        outs.append(m.rb(o1 + m.mm(Mqk[j], U)))  # A5: one rounding
        ds = m.mm(Kr[j].transpose(-1, -2), U).transpose(-1, -2)
        s = m.fma(s, gam[j][:, None, :], ds)  # A1: no bf16 rounding
    o = torch.stack(outs).transpose(1, 2).flatten(0, 1)[:length]
    return o, s


class KernelApprox:
    """The kernels' PTX approximations (ex2.approx.ftz, tanh.approx, rsqrt.approx.ftz) run by the
    library's approx_* kernels, and fp32-accumulated tensor-core products, for the torch
    reference's `approx=` hook: with them the reference rounds exactly as the kernels do."""

    def __init__(self, lib):
        self.lib = lib

    def _run(self, name, x):
        x32 = x.float().contiguous()
        y = torch.empty_like(x32)
        if x32.numel():
            self.lib.kernel(name)(x32.data_ptr(), y.data_ptr(), x32.numel(),
                                  torch.cuda.current_stream().cuda_stream)
        return y

    def ex2(self, x):
        return self._run("approx_ex2", x)

    def tanh(self, x):
        return self._run("approx_tanh", x)

    def rsqrt(self, x):
        return self._run("approx_rsqrt", x)

    def mm(self, a, b):
        # The kernels multiply bf16 operands with fp32 accumulation; torch.bmm with out_dtype does
        # the same on tensor cores. Every product of the recipe has bf16-exact operands; fp16 is
        # kept for a caller whose operands are exact only there.
        def exact(t, dt):
            return torch.equal(t.to(dt).float(), t.float())

        dt = torch.bfloat16 if exact(a, torch.bfloat16) and exact(b, torch.bfloat16) else torch.float16
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a3 = a.to(dt).expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
        b3 = b.to(dt).expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
        try:
            out = torch.bmm(a3, b3, out_dtype=torch.float32)
        except (TypeError, RuntimeError):
            # A torch without out_dtype: exact products summed in fp64, rounded once (the CPU
            # emulation's choice); a bitwise comparison then may miss a few ulps and fails.
            return (a.double() @ b.double()).float()
        return out.reshape(*batch, a.shape[-2], b.shape[-1])


def chunked_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float,
                    scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
                    cu_seqlens: Optional[torch.Tensor] = None, mode: str = "emulate",
                    approx: Any = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Chunked C=16 reference (§2.3, §2.5).

    mode="exact": float64, exact functions, no rounding; equals `gold_prefill` to ~1e-10.
        Returns fp64 (o, final_state).
    mode="emulate": the §2.4 recipe (P1-P8, Q1-Q7) in fp32 with bf16 RNE roundings.
        `approx` may provide ex2/tanh/rsqrt callables (fp32 tensor -> fp32 tensor) replacing the
        exact fp32 defaults `_ex2`, `_tanh`, `_rsqrt`. Returns bf16 (o, final_state); an fp32
        final state of the kernels is the exact widening of this bf16 state (Q6).
    mode="accurate": numerics="accurate" (docs/numerics.md). Returns bf16 o and fp32 final_state.
    """
    core = _chunked_core
    if mode == "exact":
        m = _ExactMath()
    elif mode == "emulate":
        m = _EmulateMath(approx)
    elif mode == "accurate":
        m, core = _AccurateMath(approx), _chunked_core_accurate
    else:
        raise ValueError(f"mode must be 'exact', 'emulate' or 'accurate', got {mode!r}")
    o, final = _run(core, m, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale,
                    initial_state, cu_seqlens)
    if mode == "emulate":  # values are bf16-representable: the casts are exact
        o, final = o.to(torch.bfloat16), final.to(torch.bfloat16)
    elif mode == "accurate":
        o = o.to(torch.bfloat16)
    return o, final


# ------------------------------------------------------------------------------------------------
# Workspace layouts the tests need to read or write directly


def m_seg_swizzle(m: torch.Tensor) -> torch.Tensor:
    """[..., 128, 128] M_j matrices <-> the column-swizzled layout pre_scan writes and the merge reads
    (docs/kernel_abi.md): row r keeps column c at c ^ 8 (r & 3). XOR is its own inverse, so the same
    gather converts both ways."""
    r = torch.arange(D, device=m.device).unsqueeze(1)
    c = torch.arange(D, device=m.device).unsqueeze(0)
    idx = (c ^ (8 * (r & 3))).expand(*m.shape)
    return m.gather(-1, idx.contiguous())


# ------------------------------------------------------------------------------------------------
# Metrics and inputs


def rel_rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b||_2 / (||b||_2 + 1e-8) in float64, b the reference (§5.1 err_ratio)."""
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / (torch.linalg.vector_norm(b) + 1e-8))


def make_inputs(shape: Union[Tuple[int, int], Sequence[int]], H: int, seed: int,
                device: Union[str, torch.device] = "cpu",
                state: Optional[str] = None, g_mean: float = 0.0, lower_bound: float = -5.0) -> dict:
    """Realistic random inputs as keyword arguments of the references.

    `shape`: a tuple (B, T) gives dense inputs; a list of sequence lengths gives packed varlen
    inputs (B = 1, int32 cu_seqlens). q, k, v, g and beta logits ~ N(0, 1) in bf16 (FK/CL test
    practice, §5.2); A_log, dt_bias ~ U(0, 1) fp32; lower_bound -5; initial_state ~ 0.1 N(0, 1)
    in `state` dtype ("bf16" | "fp32") or None. Drawn on the CPU from `seed`, then moved to
    `device`, so the values do not depend on the device.

    Long-memory classes (docs/numerics.md): `g_mean` shifts the gates to N(g_mean, 1) (-8: weak
    decay through the gate's sigmoid), `lower_bound` -0.05 decays weakly whatever g is.
    """
    if isinstance(shape, tuple):
        B, T = shape
        n, cu = B, None
    else:
        lens = [int(x) for x in shape]
        B, T, n = 1, sum(lens), len(lens)
        cu = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    gen = torch.Generator().manual_seed(seed)

    def randn(*size):
        return torch.randn(*size, generator=gen)

    def rand(*size):
        return torch.rand(*size, generator=gen)

    bf16 = torch.bfloat16
    out = dict(
        q=randn(B, T, H, D).to(bf16), k=randn(B, T, H, D).to(bf16),
        v=randn(B, T, H, D).to(bf16), g=(randn(B, T, H, D) + g_mean).to(bf16),
        beta=randn(B, T, H).to(bf16),
        A_log=rand(H), dt_bias=rand(H, D), lower_bound=float(lower_bound), scale=D ** -0.5,
        initial_state=None, cu_seqlens=cu,
    )
    if state is not None:
        dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
        if state not in dtypes:
            raise ValueError(f"state must be None, 'bf16' or 'fp32', got {state!r}")
        out["initial_state"] = (randn(n, H, D, D) * 0.1).to(dtypes[state])
    return {key: (val.to(device) if torch.is_tensor(val) else val) for key, val in out.items()}
