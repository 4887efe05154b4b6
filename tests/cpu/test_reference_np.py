"""The NumPy references (kda_aot/references/reference_np.py), which the CPU tests and the demo's CPU path use
so that neither needs torch: the chunked algebra against the per-token gold, the rounding recipe's
error against the gold, packing, and, where torch is installed, agreement with reference.py (the
same algorithm, kda_aot/references/chunked.py, on the torch backend)."""

import numpy as np
import pytest

from kda_aot.references import reference_np as N

CASES = [((2, 50), 2, "fp32"), ([40, 17, 0, 33], 2, "bf16"), ([16, 1, 31], 1, None)]


@pytest.mark.parametrize("shape,H,state", CASES)
def test_chunked_exact_equals_the_gold(shape, H, state):
    x = N.make_inputs(shape, H, seed=1, state=state)
    go, gs = N.gold_prefill(**x)
    co, cs = N.chunked_prefill(**x, mode="exact")
    assert go.dtype == np.float64 and go.shape == x["q"].shape
    assert N.rel_rmse(co, go) < 1e-10 and N.rel_rmse(cs, gs) < 1e-10
    assert np.isfinite(go).all() and np.abs(go).max() > 1e-2  # not a trivial (zero) result


@pytest.mark.parametrize("shape,H,state", CASES)
def test_emulation_carries_the_recipes_error_only(shape, H, state):
    """The recipe's own error on N(0, 1) inputs is about 5.7e-3 (README); a rounding at the wrong
    point or a wrong gate is off by 1e-1 or more, and no rounding at all would be below 1e-5."""
    x = N.make_inputs(shape, H, seed=2, state=state)
    go, gs = N.gold_prefill(**x)
    eo, es = N.chunked_prefill(**x, mode="emulate")
    assert eo.dtype == N.BF16 and es.dtype == N.BF16
    assert 1e-3 < N.rel_rmse(eo, go) < 1e-2
    assert 1e-3 < N.rel_rmse(es, gs) < 1e-2


def test_packed_sequences_are_independent():
    """A packed sequence gives what it gives alone (dense, B = 1), bit for bit."""
    x = N.make_inputs([37, 0, 50], 2, seed=3, state="fp32")
    o, s = N.chunked_prefill(**x, mode="emulate")
    alone = dict(x, q=x["q"][:, 37:], k=x["k"][:, 37:], v=x["v"][:, 37:], g=x["g"][:, 37:], beta=x["beta"][:, 37:],
                 initial_state=x["initial_state"][2:], cu_seqlens=None)
    o2, s2 = N.chunked_prefill(**alone, mode="emulate")
    assert o[:, 37:].tobytes() == o2.tobytes() and s[2].tobytes() == s2[0].tobytes()
    # the empty sequence returns its initial state (bf16-rounded on entry, as the kernels keep it)
    assert s[1].tobytes() == x["initial_state"][1].astype(N.BF16).tobytes()


def test_bad_shapes_are_refused():
    x = N.make_inputs((1, 16), 1, seed=4)
    with pytest.raises(ValueError, match="cu_seqlens"):
        N.gold_prefill(**dict(x, cu_seqlens=np.array([0, 5], np.int32)))
    with pytest.raises(ValueError, match="mode"):
        N.chunked_prefill(**x, mode="fast")


def _torch_inputs_on_numpy(torch, seed, shape, state, H=2):
    """reference.make_inputs' tensors, and the same values as NumPy arrays (bf16 as ml_dtypes')."""
    import ml_dtypes

    from kda_aot import reference as R

    x = R.make_inputs(shape, H, seed=seed, state=state)

    def host(v):
        if not torch.is_tensor(v):
            return v
        return v.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if v.dtype == torch.bfloat16 else v.numpy()

    return R, x, {k: host(v) for k, v in x.items()}


def test_agrees_with_the_torch_reference():
    """Same inputs through reference.py (torch): the gold to float64 rounding, the emulation to
    the ulp differences of the two libraries' fp32 exp2 and tanh."""
    torch = pytest.importorskip("torch", reason="reference.py (the torch reference) needs torch")
    R, x, xn = _torch_inputs_on_numpy(torch, seed=5, shape=[40, 17, 0, 33], state="bf16")
    go, gs = R.gold_prefill(**x)
    ngo, ngs = N.gold_prefill(**xn)
    assert N.rel_rmse(ngo, go.numpy()) < 1e-13 and N.rel_rmse(ngs, gs.numpy()) < 1e-13
    eo, es = R.chunked_prefill(**x, mode="emulate")
    neo, nes = N.chunked_prefill(**xn, mode="emulate")
    a, b = eo.float().numpy(), neo.astype(np.float32)
    assert (a == b).mean() > 0.99 and N.rel_rmse(b, a) < 1e-3
    assert N.rel_rmse(nes.astype(np.float32), es.float().numpy()) < 1e-3


class _TorchFunctions:
    """approx= hooks for the NumPy backend that compute ex2, tanh and rsqrt with torch's fp32
    functions, the defaults of the torch backend."""

    def __init__(self, torch, R):
        self.torch, self.R = torch, R

    def _on_torch(self, fn, x):
        return fn(self.torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy()

    def ex2(self, x):
        return self._on_torch(self.R._ex2, x)

    def tanh(self, x):
        return self._on_torch(self.R._tanh, x)

    def rsqrt(self, x):
        return self._on_torch(self.R._rsqrt, x)


@pytest.mark.parametrize("shape,state", [([40, 17, 0, 33], "bf16"), ((2, 37), "fp32"), ((5, 16), None)])
@pytest.mark.parametrize("mode", ["emulate", "accurate"])
def test_the_two_backends_round_alike_bit_for_bit(shape, state, mode):
    """One algorithm on two backends: given the same fp32 ex2, tanh and rsqrt (the only functions
    whose last bits the libraries choose), NumPy's emulation is torch's, bit for bit; every other
    step is exact or rounded by the recipe (products of bf16 values summed in fp64, fmas in fp64)."""
    torch = pytest.importorskip("torch", reason="reference.py (the torch reference) needs torch")
    R, x, xn = _torch_inputs_on_numpy(torch, seed=6, shape=shape, state=state)
    o, s = R.chunked_prefill(**x, mode=mode)
    no, ns = N.chunked_prefill(**xn, mode=mode, approx=_TorchFunctions(torch, R))
    assert no.dtype == N.BF16 and ns.dtype == (N.BF16 if mode == "emulate" else np.float32)
    assert np.array_equal(no.astype(np.float32), o.float().numpy())
    assert np.array_equal(ns.astype(np.float32), s.float().numpy())


@pytest.mark.parametrize("gate,beta_form,neg", [("safe", "logits", False), ("sigmoid", "logits", True),
                                                ("softplus", "probs", False), ("log_decay", "logits", False)])
def test_the_two_backends_agree_on_the_gold_of_every_gate_form(gate, beta_form, neg):
    """The float64 gold and chunked algebra on both backends, for each gate and beta form: equal to
    float64 rounding (the libraries' exp, sigmoid and BLAS differ in the last bits)."""
    torch = pytest.importorskip("torch", reason="reference.py (the torch reference) needs torch")
    R, x, xn = _torch_inputs_on_numpy(torch, seed=7, shape=[23, 0, 9], state="fp32")
    if gate == "log_decay":
        x["g"] = -x["g"].float().abs() * 0.2
        xn["g"] = x["g"].numpy()
    if beta_form == "probs":
        x["beta"] = torch.sigmoid(x["beta"].float())
        xn["beta"] = x["beta"].numpy()
    forms = dict(gate=gate, beta_form=beta_form, allow_neg_eigval=neg, lower_bound=-2.0 if gate == "sigmoid" else None)
    go, gs = R.gold_prefill(**dict(x, **forms))
    ngo, ngs = N.gold_prefill(**dict(xn, **forms))
    assert ngo.dtype == np.float64 and np.abs(ngo).max() > 1e-2
    assert N.rel_rmse(ngo, go.numpy()) < 1e-13 and N.rel_rmse(ngs, gs.numpy()) < 1e-13
    logd = R.gate_log_decay(x["g"], x["A_log"], x["dt_bias"], forms["lower_bound"], gate)
    assert N.rel_rmse(N.gate_log_decay(xn["g"], xn["A_log"], xn["dt_bias"], forms["lower_bound"], gate),
                      logd.numpy()) < 1e-14
    if gate == "safe":
        co, cs = R.chunked_prefill(**x, mode="exact")
        nco, ncs = N.chunked_prefill(**xn, mode="exact")
        assert N.rel_rmse(nco, co.numpy()) < 1e-13 and N.rel_rmse(ncs, cs.numpy()) < 1e-13
