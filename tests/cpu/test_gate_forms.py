"""CPU tests of the gate and beta forms (kda_aot/spec/gate_forms.py, docs/gate_forms.md): the validation
wall's rules for each form, the K1 each form runs, and the float64 reference's forms against
hand-written formulas. No GPU needed."""

from __future__ import annotations

import math

import pytest

from kda_aot.spec import gate_forms
from kda_aot.spec.gate_forms import BETA_FORMS, GATES, Form, k1_kernel
from kda_aot.intake.validation import validate_prefill

from test_validation import make_args, replace


def form_args(gate, **over):
    """Valid arguments for `gate` (A_log / dt_bias / lower_bound as the form wants them)."""
    args = make_args()
    rules = dict(zip(("A_log", "dt_bias", "lower_bound"), gate_forms.needs(gate)))
    for name in ("A_log", "dt_bias"):
        if rules[name] == "absent":
            args[name] = None
    if rules["lower_bound"] == "absent":
        args["lower_bound"] = None
    args.update(gate=gate, **over)
    return args


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("beta_form", BETA_FORMS)
@pytest.mark.parametrize("beta_dtype", ["bfloat16", "float32"])
def test_every_form_validates(gate, beta_form, beta_dtype):
    args = replace(form_args(gate, beta_form=beta_form), "beta", dtype=beta_dtype)
    p = validate_prefill(**args)
    assert p.form == Form(gate, beta_form, False, False, beta_dtype == "float32")


def test_default_is_flashkdas_configuration():
    p = validate_prefill(**make_args())
    assert p.form.flashkda and p.form == gate_forms.FLASHKDA and p.lower_bound == -5.0


@pytest.mark.parametrize("gate", ["", "Safe", "softplus ", "exp", 1, None])
def test_unknown_gate(gate):
    with pytest.raises(ValueError, match="^gate: expected one of 'safe', 'sigmoid', 'softplus', 'log_decay'"):
        validate_prefill(**{**make_args(), "gate": gate})


@pytest.mark.parametrize("beta_form", ["logit", "sigmoid", None, 0])
def test_unknown_beta_form(beta_form):
    with pytest.raises(ValueError, match="^beta_form: expected one of 'logits', 'probs'"):
        validate_prefill(**{**make_args(), "beta_form": beta_form})


def test_neg_eigval_needs_logits():
    with pytest.raises(ValueError, match="^allow_neg_eigval: .*beta_form='logits'"):
        validate_prefill(**{**make_args(), "beta_form": "probs", "allow_neg_eigval": True})
    with pytest.raises(TypeError, match="^allow_neg_eigval: expected a bool"):
        validate_prefill(**{**make_args(), "allow_neg_eigval": 1})
    assert validate_prefill(**{**make_args(), "allow_neg_eigval": True}).form.neg_eigval


@pytest.mark.parametrize("gate,name", [("safe", "A_log"), ("safe", "dt_bias"), ("softplus", "A_log")])
def test_required_gate_parameters(gate, name):
    with pytest.raises(TypeError, match=f"^{name}: a tensor is required with gate='{gate}'"):
        validate_prefill(**{**form_args(gate), name: None})


@pytest.mark.parametrize("name", ["A_log", "dt_bias"])
def test_log_decay_takes_no_gate_parameters(name):
    args = form_args("log_decay")
    args[name] = make_args()[name]
    with pytest.raises(ValueError, match=f"^{name}: must be None with gate='log_decay'"):
        validate_prefill(**args)


@pytest.mark.parametrize("gate,name", [("sigmoid", "A_log"), ("sigmoid", "dt_bias"), ("softplus", "dt_bias")])
def test_optional_gate_parameters(gate, name):
    assert validate_prefill(**{**form_args(gate), name: None}).form.gate == gate


@pytest.mark.parametrize("gate", ["softplus", "log_decay"])
def test_lower_bound_must_be_none_without_a_bound(gate):
    with pytest.raises(ValueError, match=f"^lower_bound: must be None with gate='{gate}'"):
        validate_prefill(**form_args(gate, lower_bound=-5.0))
    assert validate_prefill(**form_args(gate)).lower_bound is None


@pytest.mark.parametrize("lb", [-6.0, -20.0, -1e4, -1e-3])
def test_sigmoid_takes_any_negative_bound(lb):
    assert validate_prefill(**form_args("sigmoid", lower_bound=lb)).lower_bound == lb


@pytest.mark.parametrize("lb", [-6.0, -20.0])
def test_safe_bound_stays_in_flashkdas_range(lb):
    with pytest.raises(ValueError, match=r"^lower_bound: expected a finite value in \[-5, 0\).*gate='sigmoid' takes"):
        validate_prefill(**form_args("safe", lower_bound=lb))


@pytest.mark.parametrize("lb", [0.0, 1.0, math.nan, -math.inf, -1e39, -3e38])
def test_sigmoid_bound_must_be_finite_negative(lb):
    # -3e38 times log2(e) leaves float32: the kernels' constant c = f32(lb * log2 e) would be inf
    with pytest.raises(ValueError, match="^lower_bound: expected a finite value below 0"):
        validate_prefill(**form_args("sigmoid", lower_bound=lb))


@pytest.mark.parametrize("gate", ["safe", "sigmoid", "softplus"])
def test_fp32_g_only_for_log_decay(gate):
    with pytest.raises(TypeError, match=f"^g: expected dtype bfloat16 with gate='{gate}', got float32"):
        validate_prefill(**replace(form_args(gate), "g", dtype="float32"))
    assert validate_prefill(**replace(form_args("log_decay"), "g", dtype="float32")).form.g_fp32


def test_fp32_beta_alignment_is_four_bytes():
    args = replace(make_args(), "beta", dtype="float32")
    with pytest.raises(ValueError, match="^beta: data pointer .* is not 4-byte aligned"):
        validate_prefill(**replace(args, "beta", ptr=args["beta"].ptr + 2))


def test_k1_kernel_names():
    assert k1_kernel(Form(), False) == "k1_prepare" and k1_kernel(Form(), True) == "k1_prepare_acc"
    assert k1_kernel(Form("safe", "probs"), False) == "k1x_sigmoid_probs_bf16"
    assert k1_kernel(Form("softplus", "logits", True, False, True), True) == "k1x_softplus_logits2_f32_acc"
    assert k1_kernel(Form("log_decay", "probs", False, True, True), False) == "k1x_logdecay_f32_probs_f32"
    assert k1_kernel(Form(), False, strided=True) == "k1_prepare_strided"
    assert k1_kernel(Form("softplus", "probs"), True, strided=True) == "k1x_softplus_probs_bf16_acc_strided"


def test_every_form_has_its_k1_in_the_registry():
    import sys
    from pathlib import Path

    sys.path.append(str(Path(__file__).resolve().parents[2]))  # build_kernels lives in the source tree only
    from build_kernels.registry import all_variants

    names = {v.name for v in all_variants()}
    for gate in GATES:
        for beta_form in BETA_FORMS:
            for neg in ((False, True) if beta_form == "logits" else (False,)):
                for g_fp32 in ((False, True) if gate == "log_decay" else (False,)):
                    for beta_fp32 in (False, True):
                        for accurate in (False, True):
                            name = k1_kernel(Form(gate, beta_form, neg, g_fp32, beta_fp32), accurate)
                            assert name in names, name


# --------------------------------------------------------------------------------------------
# The float64 reference's forms

def _small_inputs(seed=0, T=40, H=2):
    torch = pytest.importorskip("torch")
    from kda_aot import reference

    inp = reference.make_inputs((1, T), H, seed, state="fp32")
    return torch, reference, inp


def _gold(reference, inp, **over):
    kw = dict(inp)
    kw.update(over)
    return reference.gold_prefill(kw["q"], kw["k"], kw["v"], kw["g"], kw["beta"], kw["A_log"], kw["dt_bias"],
                                  kw["lower_bound"], kw["scale"], kw["initial_state"], kw["cu_seqlens"],
                                  gate=kw.get("gate", "safe"), beta_form=kw.get("beta_form", "logits"),
                                  allow_neg_eigval=kw.get("allow_neg_eigval", False))


def test_gold_softplus_is_the_log_decay_it_defines():
    torch, reference, inp = _small_inputs()
    x = inp["g"].double() + inp["dt_bias"].double()
    logd = -torch.exp(inp["A_log"].double())[:, None] * torch.nn.functional.softplus(x)
    o1, s1 = _gold(reference, inp, gate="softplus", lower_bound=None)
    o2, s2 = _gold(reference, inp, gate="log_decay", g=logd, A_log=None, dt_bias=None, lower_bound=None)
    assert torch.allclose(o1, o2, rtol=1e-12, atol=1e-12) and torch.allclose(s1, s2, rtol=1e-12, atol=1e-12)
    o0, _ = _gold(reference, inp)
    assert reference.rel_rmse(o1, o0) > 1e-3  # a different gate gives a different answer


def test_gold_sigmoid_without_A_log_is_A_log_zero():
    torch, reference, inp = _small_inputs(1)
    o1, s1 = _gold(reference, inp, gate="sigmoid", A_log=None, lower_bound=-7.5)
    o2, s2 = _gold(reference, inp, gate="sigmoid", A_log=torch.zeros_like(inp["A_log"]), lower_bound=-7.5)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


def test_gold_safe_equals_sigmoid_form():
    torch, reference, inp = _small_inputs(2)
    o1, s1 = _gold(reference, inp)
    o2, s2 = _gold(reference, inp, gate="sigmoid")
    assert torch.allclose(o1, o2, rtol=1e-12, atol=1e-13) and torch.allclose(s1, s2, rtol=1e-12, atol=1e-13)


def test_gold_probability_beta_and_neg_eigval():
    torch, reference, inp = _small_inputs(3)
    probs = torch.sigmoid(inp["beta"].double())
    o1, _ = _gold(reference, inp)
    o2, _ = _gold(reference, inp, beta=probs, beta_form="probs")
    assert torch.allclose(o1, o2, rtol=1e-12, atol=1e-13)
    o3, _ = _gold(reference, inp, allow_neg_eigval=True)
    o4, _ = _gold(reference, inp, beta=2 * probs, beta_form="probs")
    assert torch.allclose(o3, o4, rtol=1e-12, atol=1e-13) and reference.rel_rmse(o3, o1) > 1e-3


def test_gate_table_rows_agree():
    """The build's table of forms gives each gate its code and its needs in one order: a gate with
    a code but no needs (or the reverse) would reach the wall without rules."""
    from kda_aot.library.constants import GATE_CODES, GATE_NEEDS
    from kda_aot.spec import gate_forms

    assert [g for g, _ in GATE_CODES] == [g for g, *_ in GATE_NEEDS] == list(gate_forms.GATES)
    for gate, a_log, dt_bias, bound in GATE_NEEDS:
        assert a_log in ("required", "optional", "absent") and dt_bias in ("required", "optional", "absent")
        assert bound in ("safe", "negative", "absent")
        assert gate_forms.needs(gate) == (a_log, dt_bias, bound)
