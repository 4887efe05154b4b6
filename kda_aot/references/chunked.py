"""The references' algorithm (docs/algorithm.md §2), written once over an array backend `xp`:
backend_torch (kda_aot.reference, on the inputs' device) or backend_numpy (reference_np.py, no
torch). Each public function takes the backend first; those two modules bind it.

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

The rounding hooks are rounding.py's math objects `m` (which carry the backend as `m.xp`). Inputs
follow the low-level API (§1.1/§1.3): token-major [B, T, H, 128] arrays, beta logits [B, T, H],
V-first states [N, H, V, K], optional packed `cu_seqlens` (then B = 1).
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Optional, Tuple

from ..library.constants import CHUNK, D  # head dim K = V = 128 only (§1.4); tile = chunk of 16 tokens (§2.3)
from ..library.constants import LOG2E
from ..spec.gate_forms import BETA_FORMS, GATES, resolve_lower_bound
from .rounding import AccurateMath, EmulateMath, ExactMath, fma32_rn

Array = Any  # a torch.Tensor or a NumPy array, as the backend makes them


def bind(xp, fn):
    """`fn` with its backend argument fixed to `xp`: kda_aot.reference's and reference_np.py's public
    functions, with fn's name, docstring and signature (less `xp`)."""
    @functools.wraps(fn)
    def bound(*args, **kwargs):
        return fn(xp, *args, **kwargs)

    sig = inspect.signature(fn)
    bound.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])
    return bound


# ------------------------------------------------------------------------------------------------
# Argument handling shared by both references


def _check_args(xp, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens) -> int:
    """Shape checks (§1.4 subset that matters for a math reference); returns N."""
    if q.ndim != 4 or q.shape[-1] != D:
        raise ValueError(f"q must be [B, T, H, {D}], got {tuple(q.shape)}")
    B, T, H, _ = q.shape
    for name, x in (("k", k), ("v", v), ("g", g)):
        if x.shape != q.shape:
            raise ValueError(f"{name} shape {tuple(x.shape)} != q shape {tuple(q.shape)}")
    if tuple(beta.shape) != (B, T, H):
        raise ValueError(f"beta must be [B, T, H] = {(B, T, H)}, got {tuple(beta.shape)}")
    if tuple(A_log.shape) != (H,):
        raise ValueError(f"A_log must be [H] = {(H,)}, got {tuple(A_log.shape)}")
    if math.prod(dt_bias.shape) != H * D:
        raise ValueError(f"dt_bias must be [H, {D}], got {tuple(dt_bias.shape)}")
    if cu_seqlens is None:
        n = B
    else:
        if B != 1:
            raise ValueError("cu_seqlens requires B == 1")
        cu = xp.int_list(cu_seqlens) or []
        if len(cu) < 2 or cu[0] != 0 or cu[-1] != T:
            raise ValueError(f"cu_seqlens must be 1-D, start at 0 and end at T={T}: {cu}")
        if any(b < a for a, b in zip(cu, cu[1:])):
            raise ValueError(f"cu_seqlens must be non-decreasing: {cu}")
        n = len(cu) - 1
    if initial_state is not None and tuple(initial_state.shape) != (n, H, D, D):
        raise ValueError(f"initial_state must be [N, H, {D}, {D}] with N={n}, "
                         f"got {tuple(initial_state.shape)}")
    return n


def _run(core, m, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, initial_state, cu_seqlens):
    """Cast once to the working dtype, then call `core` per independent batch of (sequence, head)
    rows. `core` sees arrays [L, X, ...] where X enumerates (sequence, head) pairs sharing the
    same length L, so every op is batched over heads (and over batch rows in the dense case).

    Dense B > 1: all batch rows have length T, so they run as one batch X = B*H.
    Varlen: each sequence runs alone on its own token slice, which makes isolation structural:
    a sequence never sees another sequence's tokens, not even as padding (§6.1, §6.6).
    """
    xp = m.xp
    n = _check_args(xp, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens)
    B, T, H, _ = q.shape
    wdt = m.dtype  # working dtype: fp64 (gold, exact) or fp32 (emulate, accurate)
    if scale is None:
        scale = D ** -0.5
    q, k, v, g, beta = (xp.cast(x, wdt) for x in (q, k, v, g, beta))
    A_log = xp.cast(A_log, wdt, like=q)
    dt_bias = xp.cast(dt_bias, wdt, like=q).reshape(H, D)
    if initial_state is None:
        s0 = xp.zeros((n, H, D, D), wdt, like=q)
    else:
        s0 = m.entry_state(xp.cast(initial_state, wdt, like=q))

    o = xp.zeros((B, T, H, D), wdt, like=q)
    final = xp.empty((n, H, D, D), wdt, like=q)
    params = dict(lb=float(lower_bound), scale=float(scale))
    if cu_seqlens is None:
        def rows(x):  # [B, T, H, ...] -> [T, B*H, ...]
            return xp.swapaxes(x, 0, 1).reshape(T, B * H, *x.shape[3:])

        o_rows, s = core(m, rows(q), rows(k), rows(v), rows(g), rows(beta),
                         xp.tile(A_log, (B,)), xp.tile(dt_bias, (B, 1)), s0.reshape(B * H, D, D), **params)
        o[...] = xp.swapaxes(o_rows.reshape(T, B, H, D), 0, 1)
        final[...] = s.reshape(B, H, D, D)
    else:
        cu = xp.int_list(cu_seqlens)
        for i in range(n):
            a, b = cu[i], cu[i + 1]
            o_seq, s = core(m, q[0, a:b], k[0, a:b], v[0, a:b], g[0, a:b], beta[0, a:b],
                            A_log, dt_bias, s0[i], **params)
            o[0, a:b] = o_seq
            final[i] = s
    return o, final


# ------------------------------------------------------------------------------------------------
# Gold: per-token recurrence (§2.2)


def _gold_core(m, q, k, v, g, beta, A_log, dt_bias, s, *, lb, scale):
    """§2.2 pseudo-code for X (sequence, head) rows at once; q..g [L, X, D], beta [L, X]."""
    xp = m.xp
    alpha = xp.exp(lb * xp.sigmoid(xp.exp(A_log)[:, None] * (g + dt_bias)))
    return _delta_rule(m, q, k, v, alpha, xp.sigmoid(beta), s, scale)


def _delta_rule(m, q, k, v, alpha, b, s, scale):
    """The per-token recurrence of §2.2 with the decays alpha [L, X, D] and strengths b [L, X] given."""
    xp = m.xp
    qh = m.l2n(q) * scale
    kh = m.l2n(k)
    o = xp.empty_like(v)
    s = xp.copy(s)
    for t in range(q.shape[0]):
        s *= alpha[t][:, None, :]  # decay key channels (columns)
        resid = v[t] - (s @ kh[t][:, :, None])[..., 0]  # [X, V]
        xp.add_outer_(s, b[t][:, None] * resid, kh[t])
        o[t] = (s @ qh[t][:, :, None])[..., 0]  # output uses the post-update state
    return o, s


def gate_log_decay(xp, g: Array, A_log: Optional[Array], dt_bias: Optional[Array],
                   lower_bound: Optional[float], gate: str = "safe") -> Array:
    """The natural-log decay of every (token, head, key channel) in float64, exact functions
    (kda_aot/spec/gate_forms.py lists the forms). g [B, T, H, 128]; A_log [H] or None; dt_bias [H, 128]
    / [H*128] or None."""
    if gate not in GATES:
        raise ValueError(f"gate: expected one of {GATES}, got {gate!r}")
    x = xp.cast(g, xp.F64)
    if gate == "log_decay":
        return x
    H = g.shape[2]
    if dt_bias is not None:
        x = x + xp.cast(dt_bias, xp.F64, like=x).reshape(H, D)
    a = None if A_log is None else xp.exp(xp.cast(A_log, xp.F64, like=x))[:, None]
    if gate == "softplus":
        return -a * xp.logaddexp(xp.zeros((), xp.F64, like=x), x)
    lb = resolve_lower_bound(gate, lower_bound)
    return lb * xp.sigmoid(x if a is None else a * x)


def beta_strength(xp, beta: Array, beta_form: str = "logits", allow_neg_eigval: bool = False) -> Array:
    """b, the delta rule's write strength per (token, head), in float64."""
    if beta_form not in BETA_FORMS:
        raise ValueError(f"beta_form: expected one of {BETA_FORMS}, got {beta_form!r}")
    b = xp.cast(beta, xp.F64)
    if beta_form == "probs":
        return b
    return xp.sigmoid(b) * (2.0 if allow_neg_eigval else 1.0)


def _gold_core_direct(m, q, k, v, logd, b, A_log, dt_bias, s, *, lb, scale):
    """_gold_core with the log-decay and b given (the gate and beta forms applied before)."""
    return _delta_rule(m, q, k, v, m.xp.exp(logd), b, s, scale)


def gold_prefill(xp, q: Array, k: Array, v: Array, g: Array, beta: Array,
                 A_log: Optional[Array], dt_bias: Optional[Array], lower_bound: Optional[float],
                 scale: Optional[float] = None, initial_state: Optional[Array] = None,
                 cu_seqlens: Optional[Array] = None, gate: str = "safe", beta_form: str = "logits",
                 allow_neg_eigval: bool = False) -> Tuple[Array, Array]:
    """Float64 gold of §2.2 (FLA fused_recurrent semantics): exact sigmoid/exp/softplus, unrounded
    scale and the unrounded initial state (fp32 or bf16) widened to fp64. `gate`, `beta_form` and
    `allow_neg_eigval` are prefill's (kda_aot/spec/gate_forms.py); the default is FlashKDA's configuration.

    Returns (o [B, T, H, 128] fp64, final_state [N, H, 128, 128] fp64). Empty sequences return
    their initial state (or zeros).
    """
    if (gate, beta_form, allow_neg_eigval) == ("safe", "logits", False):
        lower_bound = resolve_lower_bound("safe", lower_bound)
        return _run(_gold_core, ExactMath(xp), q, k, v, g, beta, A_log, dt_bias, lower_bound, scale,
                    initial_state, cu_seqlens)
    logd = gate_log_decay(xp, g, A_log, dt_bias, lower_bound, gate)
    b = beta_strength(xp, beta, beta_form, allow_neg_eigval)
    H = q.shape[2]
    zeros_a = xp.zeros((H,), xp.F64, like=q)  # unused by the direct core
    zeros_dt = xp.zeros((H, D), xp.F64, like=q)
    return _run(_gold_core_direct, ExactMath(xp), q, k, v, logd, b, zeros_a, zeros_dt, 0.0, scale,
                initial_state, cu_seqlens)


# ------------------------------------------------------------------------------------------------
# Chunked algorithm (§2.3 algebra, §2.4 rounding, §2.5 structure)


def _to_tiles(xp, x, length: int):
    """[L, X, ...] -> [nt, X, 16, ...], padded rows explicitly zero (Q7; never neighbour data)."""
    nt = -(-length // CHUNK)
    pad = xp.zeros((nt * CHUNK - length,) + tuple(x.shape[1:]), x.dtype, like=x)
    x = xp.concatenate([x, pad]).reshape(nt, CHUNK, *x.shape[1:])
    return xp.swapaxes(x, 1, 2)


def _cumsum_rows(xp, a2):
    """P3: sequential G_i = G_{i-1} + a2_i in the working dtype. torch.cumsum is avoided because
    on the CPU it accumulates fp32 in double."""
    out, acc = [], xp.zeros_like(a2[..., 0, :])
    for i in range(a2.shape[-2]):
        acc = acc + a2[..., i, :]
        out.append(acc)
    return xp.stack(out, -2)


def _gate_log2(m, g, A_log, dt_bias, lb):
    """P2: a2 = c * sig(A * (g + dt)), A = ex2(A_log*LOG2E), c = f32(lb*LOG2E); each op rounded
    separately. g [nt, X, 16, D], A_log [X], dt_bias [X, D]."""
    A = m.ex2(A_log * m.const(LOG2E, A_log))
    x = A[:, None, None] * (g + dt_bias[:, None, :])
    return m.const(lb * LOG2E, x) * m.sig(x)


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
    xp = m.xp
    if m.exact:
        return xp.unit_lower_inverse(xp.eye(CHUNK, L.dtype, like=L) + L)
    h = CHUNK // 2
    blocks = xp.stack([L[..., :h, :h], L[..., h:, h:]], -3)  # [..., 2, 8, 8]
    X = xp.tril(-blocks, -1) + xp.eye(h, L.dtype, like=L)
    for s in range(1, h - 1):  # step 0 has no column left of the pivot, row 7 is never a pivot
        shape = (*X.shape[:-2], h - 1 - s, s)
        X[..., s + 1:, :s] = fma32_rn(xp, xp.broadcast_to(X[..., s + 1:, s:s + 1], shape),
                                      xp.broadcast_to(X[..., s:s + 1, :s], shape), X[..., s + 1:, :s])
    P = xp.zeros_like(L)
    P[..., :h, :h] = m.rb(X[..., 0, :, :])
    P[..., h:, h:] = m.rb(X[..., 1, :, :])
    M = xp.zeros_like(L)
    M[..., h:, :h] = m.rb(L[..., h:, :h])
    dc = m.mm(P, M)
    o = m.mm(m.rb(-dc), P)
    return m.rb(P + m.rb(o))


def _prepare_tiles(m, q, k, g, beta, A_log, dt_bias, lb, scale, length):
    """K1 (§3.1): every per-tile quantity, token-parallel over all tiles and rows.
    Returns Qd, Kd, Kr [nt, X, 16, D], gamma [nt, X, D], b [nt, X, 16], INV and Mqk [nt, X, 16, 16].
    """
    xp = m.xp
    nt = -(-length // CHUNK)
    valid = xp.arange(nt * CHUNK, like=q) < length
    valid = valid.reshape(nt, CHUNK)[:, None, :, None]  # [nt, 1, 16, 1]
    single = m.k1_single_rounding
    # padded rows are 0 -> 0 after normalisation; K1' keeps q^ and k^ in fp32 until they are gated
    qh = m.l2n(_to_tiles(xp, q, length), rounded=not single)
    kh = m.l2n(_to_tiles(xp, k, length), rounded=not single)
    a2 = _gate_log2(m, _to_tiles(xp, g, length), A_log, dt_bias, lb)
    a2 = xp.where(valid, a2, xp.zeros_like(a2))  # padded rows add exactly 0 (P3)
    G = _cumsum_rows(xp, a2)
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
        Kilo_t = xp.swapaxes(m.rb(Kif - Ki), -1, -2)
    else:
        e, ebar = m.rb(m.ex2(G)), m.rb(m.ex2(-G))
        Qd = m.rb(m.rb(qh * e) * m.rb(m.const(scale, qh)))  # P5
        Kd = m.rb(kh * e)
        Ki = m.rb(kh * ebar)
        Kr = m.rb(Ki * m.rb(gam)[..., None, :])
    b = m.sig(_to_tiles(xp, beta, length))  # padded logits are 0 -> 0.5, harmless (k = v = 0)
    Kit = xp.swapaxes(Ki, -1, -2)
    L = xp.tril(m.mm(Kd, Kit), -1) * b[..., :, None]  # P6: fp32, row-scaled by b
    if single:
        Mqk = xp.tril(m.rb((m.mm(Qlo, Kit) + m.mm(Qd, Kilo_t)) + m.mm(Qd, Kit)))
    else:
        Mqk = xp.tril(m.rb(m.mm(Qd, Kit)))  # P7
    INV = _inverse16(m, L)
    return Qd, Kd, Kr, gam, b, INV, Mqk


def _chunked_core(m, q, k, v, g, beta, A_log, dt_bias, s, *, lb, scale):
    """§2.5 for X (sequence, head) rows sharing length L: K1 preparation over all tiles, then the
    K2 tile recurrence batched over X. Returns (o [L, X, D], S [X, V, K])."""
    xp = m.xp
    length = q.shape[0]
    if length == 0:
        return xp.copy(v), xp.copy(s)
    Qd, Kd, Kr, gam, b, INV, Mqk = _prepare_tiles(m, q, k, g, beta, A_log, dt_bias, lb, scale,
                                                  length)
    vt = _to_tiles(xp, v, length)
    bb = m.rb(b)[..., None]
    outs = []
    for j in range(vt.shape[0]):
        st = xp.swapaxes(s, -1, -2)
        u = m.rb(m.mm(Kd[j], st))  # Q1
        o1 = m.rb(m.mm(Qd[j], st))
        r = m.rb(m.rb(vt[j] - u) * bb[j])  # Q2
        U = m.rb(m.mm(INV[j], r))  # Q3
        outs.append(m.rb(o1 + m.rb(m.mm(Mqk[j], U))))  # Q4
        ds = m.mm(xp.swapaxes(U, -1, -2), Kr[j])  # Q5: (Kr^T U)^T, [X, V, K]
        s = m.rb(m.fma(s, gam[j][:, None, :], ds))
    return _untile(xp, outs, length), s


def _untile(xp, outs, length):
    """The tiles' outputs [X, 16, D] each -> [L, X, D]; padded rows are never written."""
    o = xp.swapaxes(xp.stack(outs), 1, 2)
    return o.reshape(-1, *o.shape[2:])[:length]


def _split_mm(m, a, x):
    """acc32(a (hi + lo)) with hi = bf(x), lo = bf(x - hi): an fp32 operand as two bf16 operands."""
    xp = m.xp
    hi = m.rb(x)
    return xp.f32(xp.f64(a) @ xp.f64(hi) + xp.f64(a) @ xp.f64(m.rb(x - hi)))


def _chunked_core_accurate(m, q, k, v, g, beta, A_log, dt_bias, s, *, lb, scale):
    """_chunked_core with the accurate tile step (docs/numerics.md: K1', A1-A5, Q5 with bf(U))."""
    xp = m.xp
    length = q.shape[0]
    if length == 0:
        return xp.copy(v), xp.copy(s)
    Qd, Kd, Kr, gam, b, INV, Mqk = _prepare_tiles(m, q, k, g, beta, A_log, dt_bias, lb, scale, length)
    vt = _to_tiles(xp, v, length)
    # sigma(beta) to 16 bits: bf16 plus the residue K1' stores beside it (the sum is exact in fp32)
    b_hi = m.rb(b)
    bb = (b_hi + m.rb(b - b_hi))[..., None]
    outs = []
    for j in range(vt.shape[0]):
        st = xp.swapaxes(m.rb(s), -1, -2)  # A1: the MMA operand is bf(S); S itself stays fp32
        u = m.mm(Kd[j], st)  # A2: u unrounded
        o1 = m.mm(Qd[j], st)
        r = (vt[j] - u) * bb[j]
        U = m.rb(_split_mm(m, INV[j], r))  # A3: r as hi + lo; U rounded once, for Q4 and Q5
        outs.append(m.rb(o1 + m.mm(Mqk[j], U)))  # A5: one rounding
        ds = xp.swapaxes(m.mm(xp.swapaxes(Kr[j], -1, -2), U), -1, -2)
        s = m.fma(s, gam[j][:, None, :], ds)  # A1: no bf16 rounding
    return _untile(xp, outs, length), s


def chunked_prefill(xp, q: Array, k: Array, v: Array, g: Array, beta: Array, A_log: Array, dt_bias: Array,
                    lower_bound: float, scale: Optional[float] = None, initial_state: Optional[Array] = None,
                    cu_seqlens: Optional[Array] = None, mode: str = "emulate",
                    approx: Any = None) -> Tuple[Array, Array]:
    """Chunked C=16 reference (§2.3, §2.5).

    mode="exact": float64, exact functions, no rounding; equals `gold_prefill` to ~1e-10.
        Returns fp64 (o, final_state).
    mode="emulate": the §2.4 recipe (P1-P8, Q1-Q7) in fp32 with bf16 RNE roundings.
        `approx` may provide ex2/tanh/rsqrt callables (fp32 array -> fp32 array) replacing the
        exact fp32 defaults (the backend's exp2, tanh and rsqrt). Returns bf16 (o, final_state);
        an fp32 final state of the kernels is the exact widening of this bf16 state (Q6).
    mode="accurate": numerics="accurate" (docs/numerics.md). Returns bf16 o and fp32 final_state.
    """
    core = _chunked_core
    if mode == "exact":
        m = ExactMath(xp)
    elif mode == "emulate":
        m = EmulateMath(xp, approx)
    elif mode == "accurate":
        m, core = AccurateMath(xp, approx), _chunked_core_accurate
    else:
        raise ValueError(f"mode must be 'exact', 'emulate' or 'accurate', got {mode!r}")
    o, final = _run(core, m, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale,
                    initial_state, cu_seqlens)
    if mode == "emulate":  # values are bf16-representable: the casts are exact
        o, final = xp.cast(o, xp.BF16), xp.cast(final, xp.BF16)
    elif mode == "accurate":
        o = xp.cast(o, xp.BF16)
    return o, final
