"""kda_aot.torch without a GPU: the op schemas, the fake implementations (under FakeTensorMode with
fake CUDA tensors), torch.compile(fullgraph=True) tracing through them, torch.library.opcheck with
a CPU stand-in for the kernels, and the FLA drop-in's argument mapping and refusals.

The stand-in replaces kda_aot.api.prefill (which the ops look up on every call) by the float64
gold reference rounded to the kernels' output dtypes; it honours out=, final_state= and writes the
workspace, so opcheck sees the same mutations the kernels make. What it cannot check, the real
kernels behind the op, tests/gpu/test_torch_op.py does.
"""

import re
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kda_aot  # noqa: E402
import kda_aot.torch as kt  # noqa: E402
from kda_aot import api  # noqa: E402
from kda_aot import reference

D = 128


from readme_snippets import readme_example  # noqa: E402
from torch_stand_ins import FORMS, Recording, StandIn, gold, with_forms  # noqa: E402


@pytest.fixture
def stand_in(monkeypatch):
    fake = StandIn()
    monkeypatch.setattr(api, "prefill", fake)
    return fake


@pytest.fixture
def recording(monkeypatch):
    fake = Recording()
    monkeypatch.setattr(api, "prefill", fake)
    return fake


def _inputs(shape, H=2, seed=0, state="fp32", device="cpu"):
    return reference.make_inputs(shape, H, seed=seed, device=device, state=state)


def _args(x):
    return (x["q"], x["k"], x["v"], x["g"], x["beta"])


# ---------------------------------------------------------------------------------------------
# import and schema

def test_plain_import_does_not_import_torch_and_kda_aot_torch_registers_the_ops():
    code = ("import sys, kda_aot; assert 'torch' not in sys.modules, 'kda_aot imported torch'; "
            "import kda_aot.torch, torch; print(torch.ops.kda_aot.prefill.default, torch.ops.kda_aot.prefill_out)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "kda_aot.prefill.default" in done.stdout


def test_schemas_declare_exactly_the_written_arguments():
    functional = str(kt.PREFILL._schema)
    assert functional.startswith("kda_aot::prefill(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor? A_log, "
                                 "Tensor? dt_bias, float? lower_bound=None, float? scale=None, "
                                 "Tensor? initial_state=None, bool output_final_state=False, Tensor? cu_seqlens=None, "
                                 "Tensor? cu_seqlens_cpu=None")
    # the gate and beta forms come last: positional callers of the earlier schema keep working
    assert functional.endswith('str numerics="flashkda", str gate="safe", str beta_form="logits", '
                               "bool allow_neg_eigval=False) -> (Tensor, Tensor)") and "!" not in functional
    written = [a.name for a in kt.PREFILL_OUT._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["out", "final_state", "workspace", "checkpoint_state"]
    # checkpoints at given offsets come last: positional callers of the earlier schemas keep working
    # (alias set names differ between torch releases)
    def schema(op):
        return re.sub(r"\(\w+!\)", "(!)", str(op._schema))

    assert schema(kt.PREFILL_OUT).endswith('str gate="safe", str beta_form="logits", '
                                           "bool allow_neg_eigval=False, Tensor? checkpoint_offsets=None, "
                                           "Tensor(!)? checkpoint_state=None, Tensor? segment_ids=None) -> ()")
    assert schema(kt.PREFILL_POOL).endswith('str gate="safe", str beta_form="logits", '
                                            "bool allow_neg_eigval=False, Tensor? checkpoint_offsets=None, "
                                            "Tensor(!)? checkpoint_state=None, Tensor? checkpoint_slots=None, "
                                            "Tensor? segment_ids=None) -> Tensor")


# ---------------------------------------------------------------------------------------------
# fake implementations: shapes and dtypes, with fake CUDA tensors

def _fake_cuda(x, mode):
    """make_inputs' tensors as fake CUDA tensors (no GPU needed: nothing is allocated)."""
    with mode:
        return {k: (torch.empty(t.shape, dtype=t.dtype, device="cuda") if torch.is_tensor(t) else t)
                for k, t in x.items()}


@pytest.mark.parametrize("shape,state,want_final", [((2, 40), "fp32", True), ((2, 40), "bf16", True),
                                                    ([30, 0, 9], None, True), ([30, 9], "fp32", False)])
def test_fake_impl_shapes(shape, state, want_final):
    mode = FakeTensorMode()
    x = _fake_cuda(_inputs(shape, state=state), mode)
    with mode:
        o, final = kt.PREFILL(*_args(x), x["A_log"], x["dt_bias"], -5.0, None, x["initial_state"], want_final,
                              x["cu_seqlens"])
    assert o.shape == x["q"].shape and o.dtype == torch.bfloat16 and o.device.type == "cuda"
    N = 2 if isinstance(shape, tuple) else len(shape)
    dtype = torch.bfloat16 if state == "bf16" else torch.float32
    assert final.dtype == dtype
    assert tuple(final.shape) == ((N, 2, D, D) if want_final else (0,))


# ---------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True) traces the op (fake CUDA tensors, no GPU)

class Recorder:
    """A backend that keeps the graphs and runs them eagerly (here on fake tensors)."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def targets(self):
        return [n.target for gm in self.graphs for n in gm.graph.nodes if n.op == "call_function"]


def _compile_and_run(fn, x, device="cuda"):
    """Compile `fn` with fullgraph=True (any graph break raises) and run it on fake CUDA tensors,
    or on meta tensors: CPU-only torch cannot copy a fake CUDA tensor (contiguous() of a transposed
    state), and on "meta" the op's fake implementation is its kernel."""
    torch._dynamo.reset()
    rec = Recorder()
    compiled = torch.compile(fn, backend=rec, fullgraph=True)
    if device == "meta":
        return rec, compiled({k: (t.to("meta") if torch.is_tensor(t) else t) for k, t in x.items()})
    mode = FakeTensorMode()
    fx = _fake_cuda(x, mode)
    with mode:
        return rec, compiled(fx)


def test_compile_fullgraph_functional_op():
    def fn(x):
        o, final = kt.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=-4.0,
                              initial_state=x["initial_state"], output_final_state=True, cu_seqlens=x["cu_seqlens"])
        return o.float() * 2, final

    rec, (o, final) = _compile_and_run(fn, _inputs([33, 7], state="fp32"))
    assert len(rec.graphs) == 1 and rec.targets().count(kt.PREFILL) == 1
    assert o.shape == (1, 40, 2, D) and final.shape == (2, 2, D, D)


def test_compile_fullgraph_out_variant():
    def fn(x):
        out = torch.empty_like(x["q"])
        final = torch.empty_like(x["initial_state"])
        kt.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                   output_final_state=True, out=out, final_state=final)
        return out, final

    rec, (o, final) = _compile_and_run(fn, _inputs((2, 24), state="bf16"))
    assert rec.targets().count(kt.PREFILL_OUT) == 1 and final.dtype == torch.bfloat16


def test_compile_fullgraph_aot_functionalizes_the_out_variant():
    """Under AOTAutograd the mutating op becomes auto_functionalized and the writes come back."""
    def fn(x):
        out = torch.empty_like(x["q"])
        kt.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], out=out)
        return out + 1

    torch._dynamo.reset()
    mode = FakeTensorMode()
    fx = _fake_cuda(_inputs((1, 16), state=None), mode)
    with mode:
        o = torch.compile(fn, backend="aot_eager", fullgraph=True)(fx)
    assert o.shape == (1, 16, 2, D)


@pytest.mark.parametrize("state_v_first", [False, True])
def test_compile_fullgraph_chunk_kda(state_v_first):
    def fn(x):
        state = x["initial_state"] if state_v_first else x["initial_state"].transpose(-1, -2)
        return kt.chunk_kda(*_args(x), initial_state=state, output_final_state=True,
                            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                            safe_gate=True, lower_bound=-5.0, state_v_first=state_v_first,
                            cu_seqlens=x["cu_seqlens"].long(), A_log=x["A_log"], dt_bias=x["dt_bias"].reshape(-1))

    rec, (o, final) = _compile_and_run(fn, _inputs([20, 12], state="fp32"), device="meta")
    assert len(rec.graphs) == 1 and rec.targets().count(kt.PREFILL) == 1
    assert o.shape == (1, 32, 2, D) and final.shape == (2, 2, D, D) and final.is_contiguous()


# ---------------------------------------------------------------------------------------------
# opcheck with the stand-in (schema, fake vs real, autograd registration, AOT dispatch)

def _opcheck(op, args, kwargs=None):
    result = torch.library.opcheck(op, args, kwargs or {})
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("shape,state,final", [((2, 20), "fp32", True), ([17, 0, 6], "bf16", True),
                                               ([9, 5], None, False), ((1, 16), None, True)])
def test_opcheck_functional(stand_in, shape, state, final):
    x = _inputs(shape, state=state)
    hint = None if x["cu_seqlens"] is None else x["cu_seqlens"].long()
    _opcheck(kt.PREFILL, (*_args(x), x["A_log"], x["dt_bias"], -5.0, None, x["initial_state"], final,
                          x["cu_seqlens"], hint))


@pytest.mark.parametrize("final", [True, False])
def test_opcheck_out_variant(stand_in, final):
    x = _inputs([11, 13], state="fp32")
    out = torch.empty_like(x["q"])
    fs = torch.empty_like(x["initial_state"]) if final else None
    ws = torch.empty(256, dtype=torch.uint8)
    _opcheck(kt.PREFILL_OUT, (*_args(x), x["A_log"], x["dt_bias"], out, fs, ws),
             dict(initial_state=x["initial_state"], cu_seqlens=x["cu_seqlens"]))


def test_op_passes_every_argument_through(stand_in):
    x = _inputs([10, 6], state="bf16")
    o, final = kt.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=-3.5, scale=0.1,
                          initial_state=x["initial_state"], output_final_state=True, cu_seqlens=x["cu_seqlens"],
                          cu_seqlens_cpu=[0, 10, 16], cp="off")
    call = stand_in.calls[-1]
    assert call["lower_bound"] == -3.5 and call["scale"] == pytest.approx(0.1) and call["cp"] == "off"
    assert call["cu_seqlens_cpu"].tolist() == [0, 10, 16] and call["output_final_state"] is True
    o64, s64 = reference.gold_prefill(*_args(x), x["A_log"], x["dt_bias"], -3.5, 0.1, x["initial_state"],
                                      x["cu_seqlens"])
    assert torch.equal(o, o64.to(torch.bfloat16)) and torch.equal(final, s64.to(torch.bfloat16))
    _, none = kt.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"])
    assert none is None


@pytest.mark.parametrize("given_out", [False, True])
def test_ops_pass_numerics_through(stand_in, given_out):
    x = _inputs([10, 6], state="fp32")
    out = {"out": torch.empty_like(x["q"])} if given_out else {}
    for numerics in ("accurate", "flashkda"):
        kt.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                   output_final_state=True, cu_seqlens=x["cu_seqlens"], numerics=numerics, **out)
        assert stand_in.calls[-1]["numerics"] == numerics
    kt.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"], **out)
    assert stand_in.calls[-1]["numerics"] == "flashkda"  # the operators' default


@pytest.mark.parametrize("form", FORMS, ids=[f["gate"] for f in FORMS])
@pytest.mark.parametrize("op", ["functional", "out"])
def test_ops_pass_the_gate_and_beta_forms_through(stand_in, form, op):
    """(The pool op: tests/cpu/test_torch_pool.py.)"""
    x, params, forms = with_forms(_inputs([10, 6], state="fp32"), form)
    out = {"out": torch.empty_like(x["q"])} if op == "out" else {}
    o, fs = kt.prefill(*_args(x), initial_state=x["initial_state"], output_final_state=True, cu_seqlens=x["cu_seqlens"],
                       **params, **forms, **out)
    call = stand_in.calls[-1]
    assert {name: call[name] for name in forms} == forms
    assert all(call[name] is value for name, value in params.items())  # None stays None, tensors pass as they are
    assert call["g"].dtype == x["g"].dtype and call["beta"].dtype == x["beta"].dtype
    o64, s64 = gold(*_args(x), params["A_log"], params["dt_bias"], forms["lower_bound"], None, x["initial_state"],
                    x["cu_seqlens"], **{k: forms[k] for k in ("gate", "beta_form", "allow_neg_eigval")})
    assert torch.equal(o, o64.to(torch.bfloat16)) and torch.equal(fs, s64.float())


def test_out_variant_allocates_what_is_missing(stand_in):
    x = _inputs((2, 8), state=None)
    out = torch.empty_like(x["q"])
    o, final = kt.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], output_final_state=True, out=out)
    assert o is out and final.shape == (2, 2, D, D) and final.dtype == torch.float32
    with pytest.raises(ValueError, match="^final_state: a buffer was given"):
        kt.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], final_state=final)
    with pytest.raises(TypeError, match="^cu_seqlens_cpu: expected integer"):
        kt.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens_cpu=[0.0, 8.0])


def test_forward_with_grad_inputs_works_backward_raises(stand_in):
    x = _inputs((1, 8), state=None)
    A_log = x["A_log"].clone().requires_grad_()
    o, _ = kt.prefill(*_args(x), A_log=A_log, dt_bias=x["dt_bias"])
    with pytest.raises(RuntimeError, match="no autograd formula"):
        o.float().sum().backward()


def test_op_and_chunk_kda_under_inference_mode(stand_in):
    """Serving engines run under torch.inference_mode()."""
    x = _inputs([6, 5], state="fp32")
    with torch.inference_mode():
        o, fs = kt.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                           output_final_state=True, cu_seqlens=x["cu_seqlens"])
        o2, ht = kt.chunk_kda(*_args(x), initial_state=x["initial_state"].transpose(-1, -2), output_final_state=True,
                              cu_seqlens=x["cu_seqlens"], A_log=x["A_log"], dt_bias=x["dt_bias"], **FLAGS)
    assert torch.equal(o, o2) and torch.equal(fs.transpose(-1, -2), ht)


def test_real_op_on_cpu_tensors_raises_the_walls_error():
    x = _inputs((1, 8), state=None)
    with pytest.raises(TypeError, match="^q: expected a CUDA device tensor"):
        kt.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"])


# ---------------------------------------------------------------------------------------------
# chunk_kda: FLA semantics mapped onto the op

FLAGS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
             lower_bound=-5.0)


def _fla_gold(x, state_kv):
    """The float64 gold in FLA's layout: initial and final state [N, H, K, V]."""
    s0 = None if state_kv is None else state_kv.transpose(-1, -2)
    o, s = reference.gold_prefill(*_args(x), x["A_log"], x["dt_bias"], x["lower_bound"], None, s0, x["cu_seqlens"])
    return o, s.transpose(-1, -2)


@pytest.mark.parametrize("state_v_first", [False, True])
@pytest.mark.parametrize("shape", [(2, 19), [13, 0, 21]])
def test_chunk_kda_state_layouts(stand_in, shape, state_v_first):
    x = _inputs(shape, state="fp32")
    h0_kv = x["initial_state"].transpose(-1, -2).contiguous()  # an FLA caller's [N, H, K, V] state
    cu = None if x["cu_seqlens"] is None else x["cu_seqlens"].long()
    o, ht = kt.chunk_kda(*_args(x), initial_state=x["initial_state"] if state_v_first else h0_kv,
                         output_final_state=True, state_v_first=state_v_first, cu_seqlens=cu,
                         cu_seqlens_cpu=None if cu is None else cu.clone(), A_log=x["A_log"],
                         dt_bias=x["dt_bias"].reshape(-1), **FLAGS)
    passed = stand_in.calls[-1]["initial_state"]
    assert passed.is_contiguous() and torch.equal(passed, x["initial_state"])  # V-first into the kernels
    o64, s64_kv = _fla_gold(x, h0_kv)
    assert torch.equal(o, o64.to(torch.bfloat16)) and ht.dtype == torch.float32 and ht.is_contiguous()
    assert torch.equal(ht, (s64_kv.transpose(-1, -2) if state_v_first else s64_kv).float())


def test_chunk_kda_without_state_and_without_final(stand_in):
    x = _inputs((1, 9), state=None)
    o, ht = kt.chunk_kda(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"].reshape(-1), **FLAGS)
    assert ht is None and o.shape == x["q"].shape


def test_chunk_kda_widens_bf16_gate_parameters_and_copies_non_contiguous_inputs(stand_in):
    x = _inputs((1, 9), state=None)
    A16, dt16 = x["A_log"].bfloat16(), x["dt_bias"].reshape(-1).bfloat16()
    q_strided = x["q"].transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    o, _ = kt.chunk_kda(q_strided, *_args(x)[1:], A_log=A16, dt_bias=dt16, **FLAGS)
    call = stand_in.calls[-1]
    assert call["q"].is_contiguous() and call["A_log"].dtype == torch.float32
    assert torch.equal(call["A_log"], A16.float()) and torch.equal(call["dt_bias"], dt16.float())
    with torch.no_grad():  # contiguous inputs pass as they are: no copy behind the caller's back
        kt.chunk_kda(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], **FLAGS)
    call = stand_in.calls[-1]
    assert call["q"] is x["q"] and call["beta"] is x["beta"] and call["A_log"] is x["A_log"]


def test_chunk_kda_deprecated_transpose_state_layout(stand_in):
    x = _inputs((1, 5), state="fp32")
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        kt.chunk_kda(*_args(x), initial_state=x["initial_state"], transpose_state_layout=True,
                     A_log=x["A_log"], dt_bias=x["dt_bias"], **FLAGS)
    assert torch.equal(stand_in.calls[-1]["initial_state"], x["initial_state"])  # taken as V-first
    with pytest.raises(ValueError, match="Cannot pass both"):
        kt.chunk_kda(*_args(x), state_v_first=True, transpose_state_layout=True, A_log=x["A_log"],
                     dt_bias=x["dt_bias"], **FLAGS)


def test_chunk_kda_accepts_options_that_change_nothing(stand_in):
    x = _inputs([7, 4], state=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kt.chunk_kda(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"],
                     disable_recompute=True, chunk_size=32, use_graph=True, max_num_seqs=2, **FLAGS)


# FLA's flags -> kda_aot.prefill's forms (the table of fla_compat's docstring). "A" and "dt" say
# which of A_log / dt_bias the caller passes; "want" is (gate, beta_form, allow_neg_eigval,
# lower_bound, A_log passed on, dt_bias passed on).
GATE_IN = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
MAPPING = [
    ("flashkda", dict(GATE_IN, safe_gate=True, lower_bound=-5.0), "A dt", ("safe", "logits", False, -5.0, 1, 1)),
    ("bounded-no-safe-gate", dict(GATE_IN, lower_bound=-2.5), "A dt", ("safe", "logits", False, -2.5, 1, 1)),
    ("bounded-below-5", dict(GATE_IN, lower_bound=-8.0), "A dt", ("sigmoid", "logits", False, -8.0, 1, 1)),
    ("bounded-no-A_log", dict(GATE_IN, safe_gate=True, lower_bound=-3.0), "dt",
     ("sigmoid", "logits", False, -3.0, 0, 1)),
    ("bounded-no-dt_bias", dict(GATE_IN, lower_bound=-5.0), "A", ("sigmoid", "logits", False, -5.0, 1, 0)),
    ("bounded-no-params", dict(GATE_IN, lower_bound=-1.0), "", ("sigmoid", "logits", False, -1.0, 0, 0)),
    ("softplus", dict(GATE_IN), "A dt", ("softplus", "logits", False, None, 1, 1)),
    ("softplus-no-dt_bias", dict(GATE_IN), "A", ("softplus", "logits", False, None, 1, 0)),
    ("softplus-neg-eigval", dict(GATE_IN, allow_neg_eigval=True), "A dt", ("softplus", "logits", True, None, 1, 1)),
    ("softplus-probs", dict(GATE_IN, use_beta_sigmoid_in_kernel=False), "A dt",
     ("softplus", "probs", False, None, 1, 1)),
    ("log-decay", dict(use_qk_l2norm_in_kernel=True), "A dt", ("log_decay", "probs", False, None, 0, 0)),
    ("log-decay-safe-hint", dict(use_qk_l2norm_in_kernel=True, safe_gate=True, lower_bound=-5.0), "",
     ("log_decay", "probs", False, None, 0, 0)),
    ("log-decay-logits", dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
     "", ("log_decay", "logits", True, None, 0, 0)),
]


@pytest.mark.parametrize("flags,params,want", [m[1:] for m in MAPPING], ids=[m[0] for m in MAPPING])
def test_chunk_kda_maps_fla_flags_onto_the_forms(recording, flags, params, want):
    x = _inputs((1, 9), state=None)
    given = {name: x[name] for name, word in (("A_log", "A"), ("dt_bias", "dt")) if word in params.split()}
    kt.chunk_kda(*_args(x), **given, **flags)
    call = recording.calls[-1]
    gate, beta_form, neg, lb, a_on, dt_on = want
    assert (call["gate"], call["beta_form"], call["allow_neg_eigval"], call["lower_bound"]) == (gate, beta_form, neg, lb)
    assert (call["A_log"] is not None, call["dt_bias"] is not None) == (bool(a_on), bool(dt_on))
    if a_on:
        assert call["A_log"] is x["A_log"]
    if dt_on:
        assert call["dt_bias"] is x["dt_bias"]


@pytest.mark.parametrize("g_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("beta_dtype", [torch.bfloat16, torch.float32])
def test_chunk_kda_precomputed_gate_and_probabilities_as_vllm_passes_them(stand_in, g_dtype, beta_dtype):
    """vLLM's Kimi-Linear layer: g an fp32 log-decay computed outside, beta sigmoid-ed in fp32,
    only use_qk_l2norm_in_kernel=True; A_log and dt_bias are not used (FLA ignores them too)."""
    x = _inputs([12, 20], state="fp32")
    g = (-torch.nn.functional.softplus(x["g"].float()) * 3).to(g_dtype)
    beta = torch.sigmoid(x["beta"].float()).to(beta_dtype)
    h0 = x["initial_state"].transpose(-1, -2).contiguous()
    o, ht = kt.chunk_kda(x["q"], x["k"], x["v"], g, beta, initial_state=h0, output_final_state=True,
                         use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu_seqlens"].long(), A_log=x["A_log"])
    call = stand_in.calls[-1]
    assert call["g"] is g and call["beta"] is beta and call["A_log"] is None and call["dt_bias"] is None
    o64, s64 = gold(x["q"], x["k"], x["v"], g, beta, None, None, None, None, x["initial_state"], x["cu_seqlens"],
                    gate="log_decay", beta_form="probs")
    assert torch.equal(o, o64.to(torch.bfloat16)) and torch.equal(ht, s64.transpose(-1, -2).float())


def test_chunk_kda_goes_through_the_op_only_when_autograd_or_compile_needs_it(stand_in, monkeypatch):
    """Eager calls without autograd (serving) call kda_aot.prefill directly: no dispatcher in
    between. With grad enabled the op is used, so that backward raises instead of silently
    returning no gradient for q, k, v."""
    from kda_aot import _torch_ops

    via_op = []
    real = _torch_ops.prefill
    monkeypatch.setattr(_torch_ops, "prefill", lambda *a, **kw: via_op.append(1) or real(*a, **kw))
    x = _inputs((1, 9), state=None)
    q = x["q"].clone().requires_grad_()
    o, _ = kt.chunk_kda(q, *_args(x)[1:], A_log=x["A_log"], dt_bias=x["dt_bias"], **FLAGS)
    assert via_op == [1]
    with pytest.raises(RuntimeError, match="no autograd formula"):
        o.float().sum().backward()
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            kt.chunk_kda(q, *_args(x)[1:], A_log=x["A_log"], dt_bias=x["dt_bias"], **FLAGS)
    assert via_op == [1] and len(stand_in.calls) == 3


UNSUPPORTED = [
    (dict(use_qk_l2norm_in_kernel=False), "^use_qk_l2norm_in_kernel=False"),
    (dict(return_intermediate_states=True), "^return_intermediate_states=True"),
    (dict(cp_context=object()), "^cp_context"),
    (dict(head_first=False), "^head_first: not an option"),
    (dict(q="float16"), "^q: dtype torch.float16"),
    (dict(k="float32"), "^k: dtype torch.float32"),
    (dict(v="float16"), "^v: dtype torch.float16"),
    (dict(g="float32"), "^g: dtype torch.float32 is not supported; kda_aot takes bfloat16 with use_gate_in_kernel"),
    (dict(use_gate_in_kernel=False, g="float16"), "^g: dtype torch.float16 is not supported; kda_aot takes bfloat16 "
                                                  "or float32"),
    (dict(beta="float16"), "^beta: dtype torch.float16"),
    (dict(head_dim=64), "^q: head dim 64"),
    (dict(gva=True), "^v: 4 value heads but q has 2"),
    (dict(state="float16"), "^initial_state: dtype torch.float16"),
    (dict(A_log="float64"), "^A_log: dtype torch.float64"),
    (dict(safe_gate=False, lower_bound=0.0), "^lower_bound: 0.0 is not supported"),
    (dict(safe_gate=False, lower_bound=float("-inf")), "^lower_bound: -inf is not supported"),
]


@pytest.mark.parametrize("change,message", UNSUPPORTED, ids=[m.strip("^").split(":")[0].split("=")[0] + str(i)
                                                              for i, (_, m) in enumerate(UNSUPPORTED)])
def test_chunk_kda_refuses_unsupported_options(change, message):
    """Raised before anything runs (these are CPU tensors: the kernels would refuse them anyway)."""
    x = _inputs((1, 8), state="fp32")
    kw = dict(FLAGS, A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"])
    args = dict(zip(("q", "k", "v", "g", "beta"), _args(x)))
    change = dict(change)
    for name in ("q", "k", "v", "g", "beta"):
        if name in change:
            args[name] = args[name].to(getattr(torch, change.pop(name)))
    if change.pop("head_dim", None):
        args["q"] = args["k"] = args["q"][..., :64]
    if change.pop("gva", None):
        args["v"] = torch.cat([args["v"], args["v"]], dim=2)
    if "state" in change:
        kw["initial_state"] = kw["initial_state"].to(getattr(torch, change.pop("state")))
    if "A_log" in change:
        kw["A_log"] = kw["A_log"].to(getattr(torch, change.pop("A_log")))
    kw.update(change)
    with pytest.raises(NotImplementedError, match=message):
        kt.chunk_kda(*args.values(), **kw)


@pytest.mark.parametrize("change,message", [
    (dict(lower_bound=None), "lower_bound. must be specified"),
    (dict(lower_bound=-6.0), "lower_bound. must be in the safe range"),
    (dict(lower_bound=0.0), "lower_bound. must be in the safe range"),
    (dict(safe_gate=False, lower_bound=None, A_log=None), "A_log. must be provided when .use_gate_in_kernel=True"),
    (dict(use_beta_sigmoid_in_kernel=False, allow_neg_eigval=True), "allow_neg_eigval=True. requires"),
    (dict(chunk_size=16), "chunk_size. must be either 32 or 64"),
    (dict(max_num_seqs=3), "^max_num_seqs: cu_seqlens holds 2"),
])
def test_chunk_kda_value_errors(stand_in, change, message):
    """FLA's own ValueError (same text) for what FLA itself refuses."""
    x = _inputs([4, 4], state=None)
    kw = dict(FLAGS, A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"])
    kw.update(change)
    with pytest.raises(ValueError, match=message):
        kt.chunk_kda(*_args(x), **kw)
    assert not stand_in.calls


# ---------------------------------------------------------------------------------------------
# the README's example

def test_readme_example_runs_with_the_stand_in(stand_in):
    scope = {}
    exec(compile(readme_example("cpu"), "README.md", "exec"), scope)
    assert scope["o"].shape == (1, 300, 4, D) and scope["ht"].shape == (2, 4, D, D)
    assert scope["ht"].dtype == torch.float32 and len(stand_in.calls) == 1
    call = stand_in.calls[0]
    assert call["gate"] == "safe" and call["cu_seqlens_cpu"].tolist() == [0, 200, 300]


def test_op_arguments_are_prefills_with_its_defaults():
    """The operators' schemas are generated from prefill's declarations (spec/prefill_args,
    spec/call_options): every argument is one of kda_aot.prefill's, with prefill's default."""
    import inspect

    from kda_aot import _torch_ops, api

    params = inspect.signature(api.prefill).parameters
    for op in (kt.PREFILL, kt.PREFILL_OUT, kt.PREFILL_POOL):
        for arg in op._schema.arguments:
            assert arg.name in params, (op, arg.name)
            if arg.has_default_value():
                assert arg.default_value == params[arg.name].default, (op, arg.name)
    for name in _torch_ops.OPS:
        assert str(getattr(torch.ops.kda_aot, name).default._schema) == f"kda_aot::{name}" + _torch_ops.op_schema(name)
