"""The input classes of the benchmark and the tests: what q, k, v, g, beta and the gate parameters
look like, in one place (NumPy only; torch is never imported here).

    make_class_inputs(cls, B, T, H, *, gate="safe", seed=0, ...) -> dict of NumPy arrays

Classes (CLASSES):

* "random": the inputs every test and benchmark used first: q, k, v, g, beta logits ~ N(0, 1),
  A_log and dt_bias ~ U(0, 1), lower_bound -5. The gates forget within tens of tokens.
* "model": A_log and dt_bias as FLA's `fla.layers.KimiDeltaAttention` (flash-linear-attention
  0.6.0) initialises them, g ~ N(0, 1) as a projection of normalised activations gives. dt is
  log-uniform in [1e-3, 0.1] (clamped below at 1e-4) and dt_bias = dt + log(-expm1(-dt)) is its
  inverse softplus. A_log is 0 where FLA's layer runs its safe gate (safe_gate=True, the bounded
  sigmoid gate: here gate "safe" and "sigmoid") and log(U(1, 16)) per head otherwise (its default,
  the softplus gate). The gates decay by about 1e-2 per token: long memory, as trained models have.
* "long": g ~ N(-8, 1), the rest as "random": long memory through the gate's sigmoid.
* "heavy": "random" with 1 % of g replaced by outliers of magnitude U(10, 30) and random sign, and
  the extremes +30 and -30 both present: the gate's saturation on both sides.
* "logdecay": gate "log_decay" only. g is the per-token natural log-decay itself, -exp(u) with
  u ~ U(log 1e-4, log 80): decays from almost none down to -80 (exp(-80) ~ 2e-35).
* "correlated": nearly parallel keys with a large beta, as repeated tokens, padding and templated
  prompts give: per (batch row, head) one base key c ~ N(0, 1), k_t = c + eps n_t with
  n_t ~ N(0, 1) (`eps`, default 0.05; 0 repeats one key), every beta logit equal to `beta_logit`
  (default 6, b = 0.9975), the gates as "model". Inside a 16-token tile the entries of L approach
  b: the hard case for the intra-chunk solve (docs/numerics.md).
* "correlated_weak": "correlated" with a weak decay: g = `weak_g` everywhere (default -8) and
  A_log = dt_bias = 0, so the gate forgets almost nothing (about 1.7e-3 per token with
  lower_bound -5). Errors of the write direction then stay in the state for the whole sequence.
  `repeated_key_case()` is the reproducer of this class that made earlier recipes return NaN.

Gate forms (GATES, the `gate` argument of kda_aot.prefill): "safe" and "sigmoid" (lower_bound -5),
"softplus" (lower_bound None), "log_decay" (A_log, dt_bias and lower_bound None; g fp32 unless
g_dtype="bf16"). With "log_decay", the classes other than "logdecay" give g as the log-decay
that their own gate computes (`decay_from`, float64, then rounded to g's dtype), so a log_decay
row decays exactly like the row of that gate.

Values the kernels take in bf16 (q, k, v, beta, g unless fp32) are fp32 arrays holding values
exactly representable in bf16, so moving them to a bf16 tensor rounds nothing. Every field is
drawn from its own stream of `seed`, so q, k, v and beta do not depend on the class or the gate.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..library.constants import D

CLASSES = ("random", "model", "long", "heavy", "logdecay", "correlated", "correlated_weak")
CORRELATED = ("correlated", "correlated_weak")
GATES = ("safe", "sigmoid", "softplus", "log_decay")
LOWER_BOUND = -5.0
# FLA's KimiDeltaAttention: dt log-uniform in [DT_MIN, DT_MAX], clamped below at DT_FLOOR; A = exp(A_log)
# uniform in [A_MIN, A_MAX] for its default (softplus) gate.
DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 0.1, 1e-4
A_MIN, A_MAX = 1.0, 16.0
LONG_G_MEAN = -8.0
HEAVY_FRACTION, HEAVY_MIN, HEAVY_MAX = 0.01, 10.0, 30.0
LOGDECAY_MIN, LOGDECAY_MAX = 1e-4, 80.0
# The correlated classes: key noise, beta logit and the weak class's raw gate, by default; the
# accuracy table and the tests sweep EPS_SWEEP and beta logits up to 6.
CORRELATED_EPS, CORRELATED_BETA_LOGIT, WEAK_G = 0.05, 6.0, -8.0
EPS_SWEEP = (0.0, 0.05, 0.2, 0.5)
STATE_SCALE = 0.1
# One stream per field: a field's values depend on (seed, field) only.
_STREAMS = {"q": 1, "k": 2, "v": 3, "g": 4, "beta": 5, "A_log": 6, "dt_bias": 7, "outliers": 8, "state": 9,
            "key_base": 10}


def _rng(seed: int, field: str) -> np.random.Generator:
    return np.random.default_rng([int(seed), _STREAMS[field]])


def bf16_values(x: np.ndarray) -> np.ndarray:
    """Finite x rounded to bf16 (round to nearest even), kept as fp32: the value a cast to bf16
    gives, computed on the bits in one pass over a copy."""
    x = np.array(x, np.float32)  # a copy: the bits are rounded in place
    u = x.view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    u &= np.uint32(0xFFFF0000)
    return x


def fla_dt_bias(H: int, rng: np.random.Generator) -> np.ndarray:
    """dt_bias [H, 128] as FLA's KimiDeltaAttention draws it: the inverse softplus of a
    log-uniform dt in [1e-3, 0.1] (clamped at 1e-4), in float64 then fp32."""
    u = rng.random((H, D))
    dt = np.maximum(np.exp(u * (np.log(DT_MAX) - np.log(DT_MIN)) + np.log(DT_MIN)), DT_FLOOR)
    return (dt + np.log(-np.expm1(-dt))).astype(np.float32)


def gate_params(cls: str, H: int, gate: str, seed: int = 0):
    """(A_log [H] fp32, dt_bias [H, 128] fp32, lower_bound) of class `cls` for gate `gate`
    ("safe", "sigmoid" or "softplus"): the parameters the gate reads."""
    _check(cls, gate)
    if gate == "log_decay":
        raise ValueError("gate: 'log_decay' reads no gate parameters")
    lower_bound = None if gate == "softplus" else LOWER_BOUND
    if cls == "correlated_weak":
        return np.zeros(H, np.float32), np.zeros((H, D), np.float32), lower_bound
    if cls in ("model", "correlated"):
        dt_bias = fla_dt_bias(H, _rng(seed, "dt_bias"))
        if gate == "softplus":
            A_log = np.log(_rng(seed, "A_log").uniform(A_MIN, A_MAX, H)).astype(np.float32)
        else:
            A_log = np.zeros(H, np.float32)
        return A_log, dt_bias, lower_bound
    A_log = _rng(seed, "A_log").random(H, dtype=np.float32)
    dt_bias = _rng(seed, "dt_bias").random((H, D), dtype=np.float32)
    return A_log, dt_bias, lower_bound


def log_decay(g: np.ndarray, A_log: np.ndarray, dt_bias: np.ndarray, lower_bound: Optional[float]) -> np.ndarray:
    """The per-channel natural log-decay a gate computes from g [..., H, 128], in float64:
    lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) with a lower bound, else
    -exp(A_log) * softplus(g + dt_bias)."""
    x = np.asarray(g, np.float64) + np.asarray(dt_bias, np.float64).reshape(-1, D)
    a = np.exp(np.asarray(A_log, np.float64))[:, None]
    if lower_bound is None:
        return -a * np.logaddexp(0.0, x)  # softplus(x) = log(1 + e^x), without overflow
    return lower_bound / (1.0 + np.exp(-a * x))


def make_class_inputs(cls: str, B: int, T: int, H: int, *, gate: str = "safe", seed: int = 0,
                      g_dtype: Optional[str] = None, decay_from: str = "safe", state: Optional[str] = None,
                      n_states: Optional[int] = None, eps: Optional[float] = None,
                      beta_logit: Optional[float] = None, weak_g: Optional[float] = None) -> dict:
    """Inputs of class `cls` for kda_aot.prefill's gate form `gate`, as NumPy arrays.

    Returns a dict: q, k, v, g [B, T, H, 128] and beta [B, T, H] (fp32 arrays; bf16 values except
    an fp32 g), A_log [H] and dt_bias [H, 128] (fp32, None with gate "log_decay"), lower_bound
    (float or None), gate, cls, g_dtype ("bf16" or "fp32": the dtype g is meant to have on the
    device), initial_state (None, or [n_states (default B), H, 128, 128] ~ 0.1 N(0, 1) with values
    of `state`, "bf16" or "fp32"). `g_dtype` is "bf16" by default, "fp32" by default with gate
    "log_decay"; `decay_from` ("safe" or "softplus") is the gate whose log-decay a "log_decay" g
    holds for the classes other than "logdecay". `eps`, `beta_logit` and `weak_g` shape the
    correlated classes (their defaults CORRELATED_EPS, CORRELATED_BETA_LOGIT, WEAK_G) and are
    refused with any other class.
    """
    _check(cls, gate)
    if cls not in CORRELATED and (eps, beta_logit, weak_g) != (None, None, None):
        raise ValueError(f"eps, beta_logit, weak_g: only the classes {CORRELATED} take them, got cls={cls!r}")
    if weak_g is not None and cls != "correlated_weak":
        raise ValueError(f"weak_g: only 'correlated_weak' takes it, got cls={cls!r}")
    eps = CORRELATED_EPS if eps is None else float(eps)
    if not np.isfinite(eps) or eps < 0:
        raise ValueError(f"eps: expected a finite value >= 0, got {eps!r}")
    if g_dtype is None:
        g_dtype = "fp32" if gate == "log_decay" else "bf16"
    if g_dtype not in ("bf16", "fp32"):
        raise ValueError(f"g_dtype: expected 'bf16' or 'fp32', got {g_dtype!r}")
    if g_dtype == "fp32" and gate != "log_decay":
        raise ValueError(f"g_dtype: 'fp32' needs gate='log_decay' (gate {gate!r} takes a bf16 g)")
    if decay_from not in ("safe", "softplus"):
        raise ValueError(f"decay_from: expected 'safe' or 'softplus', got {decay_from!r}")
    if state not in (None, "bf16", "fp32"):
        raise ValueError(f"state: expected None, 'bf16' or 'fp32', got {state!r}")
    for name, n in (("B", B), ("T", T), ("H", H)):
        if not isinstance(n, (int, np.integer)) or n < (0 if name == "T" else 1):
            raise ValueError(f"{name}: expected an int >= {0 if name == 'T' else 1}, got {n!r}")
    shape = (B, T, H, D)
    out = {name: bf16_values(_rng(seed, name).standard_normal(shape, dtype=np.float32)) for name in ("q", "k", "v")}
    out["beta"] = bf16_values(_rng(seed, "beta").standard_normal((B, T, H), dtype=np.float32))
    if cls in CORRELATED:
        base = _rng(seed, "key_base").standard_normal((B, 1, H, D), dtype=np.float32)
        # the same noise draws as "random"'s k, scaled: eps = 0 repeats the base key exactly
        out["k"] = bf16_values(base + np.float32(eps) * _rng(seed, "k").standard_normal(shape, dtype=np.float32))
        logit = CORRELATED_BETA_LOGIT if beta_logit is None else float(beta_logit)
        out["beta"] = np.full((B, T, H), bf16_values(np.float32(logit)), np.float32)
    out.update(cls=cls, gate=None, g_dtype=None, A_log=None, dt_bias=None, lower_bound=None, initial_state=None)
    if cls == "logdecay":
        u = _rng(seed, "g").uniform(np.log(LOGDECAY_MIN), np.log(LOGDECAY_MAX), shape)
        out.update(gate=gate, g_dtype=g_dtype, g=bf16_values(-np.exp(u)) if g_dtype == "bf16" else
                   (-np.exp(u)).astype(np.float32))
    else:
        out = regate(dict(out, g=_raw_gate_input(cls, shape, seed, weak_g)), gate, seed=seed, g_dtype=g_dtype,
                     decay_from=decay_from)
    if state is not None:
        n = B if n_states is None else int(n_states)
        s = _rng(seed, "state").standard_normal((n, H, D, D), dtype=np.float32) * np.float32(STATE_SCALE)
        out["initial_state"] = bf16_values(s) if state == "bf16" else s
    return out


def regate(inputs: dict, gate: str, *, seed: int = 0, g_dtype: Optional[str] = None,
           decay_from: str = "safe") -> dict:
    """The same draws (q, k, v, beta, the gate's input g, the state) for another gate form: a new
    dict sharing those arrays, with the gate parameters of `gate` and, for "log_decay", g replaced
    by its log-decay. `inputs` must hold the gate's input (a gate other than "log_decay") and
    `seed` must be the seed that drew it."""
    cls = inputs["cls"]
    _check(cls, gate)
    if inputs.get("gate") == "log_decay" or cls == "logdecay":
        raise ValueError("inputs: g already holds log-decays, the gate's input is gone")
    if g_dtype is None:
        g_dtype = "fp32" if gate == "log_decay" else "bf16"
    if g_dtype not in ("bf16", "fp32") or (g_dtype == "fp32" and gate != "log_decay"):
        raise ValueError(f"g_dtype: expected 'bf16' (or 'fp32' with gate='log_decay'), got {g_dtype!r}")
    H = inputs["q"].shape[2]
    out = dict(inputs, gate=gate, g_dtype=g_dtype, A_log=None, dt_bias=None, lower_bound=None)
    if gate == "log_decay":
        decay = log_decay(inputs["g"], *gate_params(cls, H, decay_from, seed))
        out["g"] = bf16_values(decay) if g_dtype == "bf16" else decay.astype(np.float32)
    else:
        out["A_log"], out["dt_bias"], out["lower_bound"] = gate_params(cls, H, gate, seed)
    return out


def _raw_gate_input(cls: str, shape, seed: int, weak_g: Optional[float] = None) -> np.ndarray:
    """The gate's input g before the gate (bf16 values) for the classes that have one."""
    if cls == "correlated_weak":
        return bf16_values(np.full(shape, WEAK_G if weak_g is None else weak_g, np.float32))
    g = _rng(seed, "g").standard_normal(shape, dtype=np.float32)
    if cls == "long":
        g = g + np.float32(LONG_G_MEAN)
    elif cls == "heavy":
        rng = _rng(seed, "outliers")
        flat = g.reshape(-1)
        n = max(2, int(round(HEAVY_FRACTION * flat.size))) if flat.size >= 2 else flat.size
        where = rng.choice(flat.size, size=n, replace=False)
        flat[where] = rng.uniform(HEAVY_MIN, HEAVY_MAX, n) * rng.choice(np.array([-1.0, 1.0]), n)
        if n >= 2:  # both saturations, whatever the draw
            flat[where[0]], flat[where[1]] = HEAVY_MAX, -HEAVY_MAX
    return bf16_values(g)


def repeated_key_case(T: int = 16384, H: int = 2, seed: int = 0) -> dict:
    """One key repeated over a whole sequence with a weak gate and a large beta: the reproducer with
    which serving engines saw the recurrent state go non-finite under the fp16 Neumann inverse
    (raw gate -12, A_log = dt_bias = 0, beta logit 8, safe gate, lower_bound -5)."""
    return make_class_inputs("correlated_weak", 1, T, H, seed=seed, eps=0.0, beta_logit=8.0, weak_g=-12.0)


def cu_seqlens(lens) -> np.ndarray:
    """The packed int32 cu_seqlens [N + 1] of sequence lengths `lens`."""
    lens = [int(n) for n in lens]
    if any(n < 0 for n in lens):
        raise ValueError(f"lens: lengths must be >= 0, got {lens}")
    return np.concatenate([[0], np.cumsum(lens, dtype=np.int64)]).astype(np.int32)


def _check(cls: str, gate: str) -> None:
    if cls not in CLASSES:
        raise ValueError(f"cls: expected one of {', '.join(map(repr, CLASSES))}, got {cls!r}")
    if gate not in GATES:
        raise ValueError(f"gate: expected one of {', '.join(map(repr, GATES))}, got {gate!r}")
    if cls == "logdecay" and gate != "log_decay":
        raise ValueError(f"cls: 'logdecay' is a log-decay g and needs gate='log_decay', got gate={gate!r}")
