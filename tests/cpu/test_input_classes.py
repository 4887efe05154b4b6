"""The benchmark's and tests' input classes (kda_aot/references/input_classes.py), on the CPU: each class's
statistics, the gate parameters FLA's layer draws, bf16-exact values, determinism by seed."""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from kda_aot.references import input_classes as ic

B, T, H = 2, 256, 4


def _bf16_exact(x):
    return np.array_equal(x, x.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_bf16_values_is_round_to_nearest_even():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(10000, dtype=np.float32) * 50,
                        np.float32([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 0.0, -0.0, 3e38])])
    assert np.array_equal(ic.bf16_values(x), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert ic.bf16_values(np.float32([1 + 2 ** -8]))[0] == 1.0  # a tie goes to the even neighbour


@pytest.mark.parametrize("cls", ["random", "model", "long", "heavy", "correlated", "correlated_weak"])
@pytest.mark.parametrize("gate", ["safe", "sigmoid", "softplus"])
def test_shapes_dtypes_and_bf16_exact(cls, gate):
    x = ic.make_class_inputs(cls, B, T, H, gate=gate, seed=1)
    for name in ("q", "k", "v", "g"):
        assert x[name].shape == (B, T, H, 128) and x[name].dtype == np.float32 and _bf16_exact(x[name]), name
    assert x["beta"].shape == (B, T, H) and _bf16_exact(x["beta"])
    assert x["A_log"].shape == (H,) and x["A_log"].dtype == np.float32
    assert x["dt_bias"].shape == (H, 128) and x["dt_bias"].dtype == np.float32
    assert x["lower_bound"] == (None if gate == "softplus" else -5.0)
    assert (x["cls"], x["gate"], x["g_dtype"], x["initial_state"]) == (cls, gate, "bf16", None)


def test_random_is_the_historic_distribution():
    x = ic.make_class_inputs("random", B, 2048, H, seed=0)
    for name in ("q", "k", "v", "g", "beta"):
        assert abs(x[name].mean()) < 0.01 and abs(x[name].std() - 1) < 0.01, name
    for name in ("A_log", "dt_bias"):
        assert 0 <= x[name].min() and x[name].max() < 1, name
    assert abs(x["dt_bias"].mean() - 0.5) < 0.05


def test_model_draws_what_flas_layer_initialises():
    safe = ic.make_class_inputs("model", 1, 64, 64, gate="safe", seed=0)
    soft = ic.make_class_inputs("model", 1, 64, 64, gate="softplus", seed=0)
    # safe_gate=True: A_log = 0; the default (softplus) layer: A = exp(A_log) ~ U(1, 16) per head.
    assert np.all(safe["A_log"] == 0)
    A = np.exp(soft["A_log"].astype(np.float64))
    assert 1 - 1e-6 <= A.min() and A.max() <= 16 + 1e-5 and A.std() > 2
    # dt_bias is the inverse softplus of a log-uniform dt in [1e-3, 0.1]: softplus(dt_bias) = dt.
    for x in (safe, soft):
        dt = np.logaddexp(0.0, x["dt_bias"].astype(np.float64))
        assert 1e-3 * (1 - 1e-4) <= dt.min() and dt.max() <= 0.1 * (1 + 1e-4)
        assert abs(np.log(dt).mean() - (np.log(1e-3) + np.log(0.1)) / 2) < 0.05  # uniform in log
    assert np.array_equal(safe["dt_bias"], soft["dt_bias"])
    assert abs(safe["g"].mean()) < 0.01 and abs(safe["g"].std() - 1) < 0.01
    # Long memory: the per-token log-decay is about -5 * sigmoid(-4.6), far from random's.
    model = ic.log_decay(safe["g"], safe["A_log"], safe["dt_bias"], -5.0)
    rnd = ic.make_class_inputs("random", 1, 64, 64, seed=0)
    random = ic.log_decay(rnd["g"], rnd["A_log"], rnd["dt_bias"], -5.0)
    assert -0.2 < np.median(model) < -0.01 and np.median(random) < -2


def test_long_and_heavy_gates():
    long = ic.make_class_inputs("long", B, 2048, H, seed=0)
    assert abs(long["g"].mean() + 8) < 0.01 and abs(long["g"].std() - 1) < 0.02
    heavy = ic.make_class_inputs("heavy", B, 2048, H, seed=0)
    g = heavy["g"]
    assert g.max() == 30.0 and g.min() == -30.0
    outliers = np.abs(g) >= 10
    assert abs(outliers.mean() - 0.01) < 0.001
    assert (g[outliers] > 0).mean() == pytest.approx(0.5, abs=0.05)
    assert np.abs(g[~outliers]).max() < 7  # the rest stays N(0, 1)


@pytest.mark.parametrize("g_dtype", ["fp32", "bf16"])
def test_logdecay_class(g_dtype):
    x = ic.make_class_inputs("logdecay", B, 4096, H, gate="log_decay", seed=0, g_dtype=g_dtype)
    g = x["g"]
    assert x["A_log"] is None and x["dt_bias"] is None and x["lower_bound"] is None and x["g_dtype"] == g_dtype
    assert g.max() < 0 and g.min() >= -80 and g.min() < -70 and g.max() > -2e-4
    mags = np.log(-g.astype(np.float64))  # log-uniform magnitudes in [1e-4, 80]
    assert abs(mags.mean() - (np.log(1e-4) + np.log(80)) / 2) < 0.05
    assert _bf16_exact(g) == (g_dtype == "bf16")


@pytest.mark.parametrize("cls", ["random", "model", "long", "heavy"])
@pytest.mark.parametrize("decay_from", ["safe", "softplus"])
def test_log_decay_form_is_the_gates_own_decay(cls, decay_from):
    gated = ic.make_class_inputs(cls, B, T, H, gate=decay_from, seed=5)
    x = ic.make_class_inputs(cls, B, T, H, gate="log_decay", seed=5, decay_from=decay_from)
    assert x["g"].dtype == np.float32 and x["A_log"] is None and x["lower_bound"] is None
    want = ic.log_decay(gated["g"], gated["A_log"], gated["dt_bias"], gated["lower_bound"]).astype(np.float32)
    assert np.array_equal(x["g"], want)
    for name in ("q", "k", "v", "beta"):
        assert np.array_equal(x[name], gated[name])
    assert x["g"].max() <= 0
    if decay_from == "safe":
        assert x["g"].min() >= -5


def test_log_decay_formulas_in_float64():
    g = np.array([[[[-1.0] * 128, [2.0] * 128]]])  # [1, 1, H=2, 128]
    A_log, dt = np.log(np.array([2.0, 0.5])), np.full((2, 128), 0.25)
    safe = ic.log_decay(g, A_log, dt, -5.0)
    assert safe[0, 0, 0, 0] == pytest.approx(-5 / (1 + np.exp(2 * 0.75)), rel=1e-14)
    soft = ic.log_decay(g, A_log, dt, None)
    assert soft[0, 0, 1, 0] == pytest.approx(-0.5 * np.log1p(np.exp(2.25)), rel=1e-14)
    assert np.isfinite(ic.log_decay(np.full((1, 1, 1, 128), 1e4), np.zeros(1), np.zeros((1, 128)), None)).all()


def test_regate_keeps_the_draws_and_refuses_log_decays():
    x = ic.make_class_inputs("model", B, T, H, gate="safe", seed=2, state="fp32")
    y = ic.regate(x, "softplus", seed=2)
    assert y["q"] is x["q"] and y["g"] is x["g"] and y["initial_state"] is x["initial_state"]
    assert y["gate"] == "softplus" and np.array_equal(y["A_log"], ic.gate_params("model", H, "softplus", 2)[0])
    z = ic.regate(x, "log_decay", seed=2)
    assert np.array_equal(z["g"], ic.make_class_inputs("model", B, T, H, gate="log_decay", seed=2)["g"])
    with pytest.raises(ValueError, match="^inputs:"):
        ic.regate(z, "safe", seed=2)


def test_determinism_by_seed_and_independent_fields():
    a = ic.make_class_inputs("heavy", B, T, H, seed=11, state="bf16")
    b = ic.make_class_inputs("heavy", B, T, H, seed=11, state="bf16")
    c = ic.make_class_inputs("heavy", B, T, H, seed=12, state="bf16")
    for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state"):
        assert np.array_equal(a[name], b[name]), name
        assert not np.array_equal(a[name], c[name]), name
    # q, k, v and beta come from their own streams: the class and the gate do not change them.
    m = ic.make_class_inputs("model", B, T, H, gate="softplus", seed=11)
    for name in ("q", "k", "v", "beta"):
        assert np.array_equal(a[name], m[name]), name
    assert not np.array_equal(a["q"], a["k"])


def test_initial_state():
    x = ic.make_class_inputs("random", 1, 16, H, seed=0, state="bf16", n_states=3)
    s = x["initial_state"]
    assert s.shape == (3, H, 128, 128) and _bf16_exact(s) and abs(s.std() - 0.1) < 0.005
    assert ic.make_class_inputs("random", 2, 16, H, state="fp32")["initial_state"].shape == (2, H, 128, 128)


def test_cu_seqlens():
    cu = ic.cu_seqlens([5, 0, 7])
    assert cu.dtype == np.int32 and cu.tolist() == [0, 5, 5, 12]
    with pytest.raises(ValueError, match="^lens:"):
        ic.cu_seqlens([3, -1])


@pytest.mark.parametrize("kwargs, start", [
    (dict(cls="x"), "cls:"), (dict(gate="exp"), "gate:"), (dict(cls="logdecay"), "cls:"),
    (dict(g_dtype="fp16"), "g_dtype:"), (dict(g_dtype="fp32"), "g_dtype:"), (dict(state="fp16"), "state:"),
    (dict(decay_from="sigmoid"), "decay_from:"), (dict(H=0), "H:"), (dict(T=-1), "T:"), (dict(B=1.5), "B:"),
    (dict(eps=0.1), "eps, beta_logit, weak_g:"), (dict(cls="correlated", eps=-1.0), "eps:"),
    (dict(cls="correlated", weak_g=-8.0), "weak_g:")])
def test_errors_name_the_argument(kwargs, start):
    args = dict(cls="random", B=1, T=16, H=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match="^" + start):
        ic.make_class_inputs(args.pop("cls"), args.pop("B"), args.pop("T"), args.pop("H"), **args)


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("eps", ic.EPS_SWEEP)
def test_correlated_keys_are_nearly_parallel(eps):
    """k = base + eps noise per (batch row, head): the cosine between keys of one head falls with
    eps, beta is one logit everywhere, and the gates are "model"'s draws."""
    x = ic.make_class_inputs("correlated", B, T, H, seed=2, eps=eps, beta_logit=4.0)
    kh = _unit(x["k"].astype(np.float64))
    cos = np.einsum("bthd,bshd->bhts", kh[:, :16], kh[:, :16])
    if eps == 0.0:
        assert np.array_equal(x["k"], np.broadcast_to(x["k"][:, :1], x["k"].shape))
    assert cos.min() > {0.0: 0.999, 0.05: 0.99, 0.2: 0.9, 0.5: 0.5}[eps]
    assert np.all(x["beta"] == 4.0)
    model = ic.make_class_inputs("model", B, T, H, seed=2)
    assert np.array_equal(x["g"], model["g"]) and np.array_equal(x["dt_bias"], model["dt_bias"])
    assert np.array_equal(x["q"], model["q"]) and np.array_equal(x["v"], model["v"])


def test_correlated_weak_gate_and_the_repeated_key_case():
    x = ic.make_class_inputs("correlated_weak", 1, 32, 2, gate="softplus")
    assert np.all(x["g"] == ic.WEAK_G) and not x["A_log"].any() and not x["dt_bias"].any()
    assert np.all(x["beta"] == ic.CORRELATED_BETA_LOGIT)
    decay = ic.log_decay(x["g"], x["A_log"], x["dt_bias"], x["lower_bound"])
    assert np.all((decay < 0) & (decay > -1e-3))  # forgets almost nothing per token
    r = ic.repeated_key_case(T=64)
    assert r["q"].shape == (1, 64, 2, 128) and np.all(r["g"] == -12.0) and np.all(r["beta"] == 8.0)
    assert np.array_equal(r["k"], np.broadcast_to(r["k"][:, :1], r["k"].shape))
    assert (r["gate"], r["lower_bound"]) == ("safe", -5.0) and not r["A_log"].any()


def test_gate_params_refuses_log_decay():
    with pytest.raises(ValueError, match="^gate:"):
        ic.gate_params("random", 2, "log_decay")


def test_importing_it_imports_no_torch():
    code = "import sys, kda_aot.references.input_classes; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
