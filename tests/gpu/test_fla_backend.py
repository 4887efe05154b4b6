"""FLA's own entry points on kda-aot's kernels through FLA's backend registry (kda_aot/fla_backend.py),
where fla (flash-linear-attention 0.6.0, with fla-core) is installed.

Each test runs FLA's code twice under torch.inference_mode(): with the backend (kda_aot.api.prefill
wrapped to count the calls that reach it: the proof that kda-aot ran) and with FLA_KDA_AOT=0,
which hands the same calls to FLA's Triton kernels (FLA_FLASH_KDA=0 keeps FlashKDA's backend out of
both runs). The outputs differ by the bf16 recipes of two different kernels: kda-aot keeps the
state in bf16 between 16-token chunks (FlashKDA's recipe), FLA in fp32. The bound, 3e-2 relative
RMSE, is about 3x the gap measured for FlashKDA's configuration (8.7e-3 for the layer) and far
below what a mapping mistake gives (a wrong gate form, a missed transpose or beta sigmoid moves
the output by 1e-1 or more). The figures are printed, and appended to $OUT/fla_backend.txt when
OUT is set. FLA's Triton autotuning makes the first call of each shape slow (minutes).

    python -m pytest tests/gpu/test_fla_backend.py -s
"""

import pytest
from reports import append_report

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]
torch = pytest.importorskip("torch")
pytest.importorskip("fla.layers", reason="fla (flash-linear-attention) is not installed")

BOUND = 3e-2


def _report(name, err):
    line = f"{name}: relative RMSE against FLA's Triton path {err:.3e}"
    print("\n" + line)
    append_report("fla_backend.txt", line + "\n")


@pytest.fixture
def counted(monkeypatch):
    """The gate form of every call that reaches kda_aot.api.prefill."""
    import kda_aot.torch  # noqa: F401  (registers the backend)
    from kda_aot import api, fla_backend

    assert fla_backend.BACKEND is not None, "fla is installed but kda-aot did not register with it"
    calls = []
    real = api.prefill

    def counting(*args, **kwargs):
        calls.append(kwargs.get("gate"))
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "prefill", counting)
    monkeypatch.setenv("FLA_FLASH_KDA", "0")
    monkeypatch.delenv("FLA_KDA_AOT", raising=False)
    return calls


def _both(fn, monkeypatch, counted):
    """fn() with kda-aot, then with FLA's Triton path; (ours, FLA's, calls that reached kda-aot)."""
    with torch.inference_mode():
        ours = fn()
        calls = list(counted)
        monkeypatch.setenv("FLA_KDA_AOT", "0")
        try:
            theirs = fn()
        finally:
            monkeypatch.delenv("FLA_KDA_AOT")
    assert len(counted) == len(calls), "a call reached kda-aot with FLA_KDA_AOT=0"
    return ours, theirs, calls


def _rel_rmse(a, b):
    from kda_aot import reference

    return reference.rel_rmse(a, b)


LAYER_GATES = {"softplus": {}, "safe": dict(safe_gate=True, lower_bound=-5.0)}


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("gate", list(LAYER_GATES))
def test_kimi_delta_attention_layer(counted, monkeypatch, gate, padded):
    from fla.layers import KimiDeltaAttention

    torch.manual_seed(0)
    layer = KimiDeltaAttention(hidden_size=512, head_dim=128, num_heads=4, layer_idx=0, **LAYER_GATES[gate])
    layer = layer.to(device="cuda", dtype=torch.bfloat16).eval()
    x = torch.randn(2, 300, 512, device="cuda", dtype=torch.bfloat16)
    mask = None
    if padded:  # left padding: FLA unpads to packed sequences with cu_seqlens
        mask = torch.ones(2, 300, dtype=torch.long, device="cuda")
        mask[1, :120] = 0
    ours, theirs, calls = _both(lambda: layer(x, attention_mask=mask)[0], monkeypatch, counted)
    assert calls == [gate], calls
    err = _rel_rmse(ours if mask is None else ours[mask.bool()], theirs if mask is None else theirs[mask.bool()])
    _report(f"KimiDeltaAttention gate={gate} {'padded' if padded else 'dense'}", err)
    assert err < BOUND, err


@pytest.mark.parametrize("gate", list(LAYER_GATES))
def test_kda_for_causal_lm_prefill_then_continue(counted, monkeypatch, gate):
    """Two layers, hidden 256, two heads of 128: a 200-token prefill, then 100 more tokens from the
    cache (the recurrent state comes back in as initial_state), through FLA's model forward."""
    from fla.models import KDAConfig, KDAForCausalLM

    torch.manual_seed(1)
    config = KDAConfig(hidden_size=256, num_heads=2, head_dim=128, num_hidden_layers=2, vocab_size=1024,
                       **LAYER_GATES[gate])
    model = KDAForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    first = torch.randint(0, 1024, (2, 200), device="cuda")
    then = torch.randint(0, 1024, (2, 100), device="cuda")

    def run():
        out = model(input_ids=first, use_cache=True)
        more = model(input_ids=then, past_key_values=out.past_key_values, use_cache=True)
        return torch.cat([out.logits, more.logits], dim=1)

    ours, theirs, calls = _both(run, monkeypatch, counted)
    assert calls == [gate] * 4, calls  # 2 layers x 2 forwards
    err = _rel_rmse(ours, theirs)
    _report(f"KDAForCausalLM gate={gate}", err)
    assert err < BOUND, err


# fla.ops.kda.chunk_kda, FLA's entry point, for each flag combination (fla_compat's table)
COMBOS = {
    "flashkda": dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0),
    "sigmoid-no-A_log": dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=-3.0, A_log=None),
    "softplus": dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True),
    "softplus-neg-eigval": dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
    "softplus-probs": dict(use_gate_in_kernel=True),
    "log-decay-fp32-probs": dict(precomputed=torch.float32),
    "log-decay-bf16-logits": dict(precomputed=torch.bfloat16, use_beta_sigmoid_in_kernel=True),
}
WANT = {"flashkda": "safe", "sigmoid-no-A_log": "sigmoid", "softplus": "softplus", "softplus-neg-eigval": "softplus",
        "softplus-probs": "softplus", "log-decay-fp32-probs": "log_decay", "log-decay-bf16-logits": "log_decay"}


@pytest.mark.parametrize("state_v_first", [True, False])
@pytest.mark.parametrize("name", list(COMBOS))
def test_fla_chunk_kda_entry_point(counted, monkeypatch, name, state_v_first):
    import math

    from fla.ops.kda import chunk_kda

    torch.manual_seed(2)
    lens, H = [700, 64, 1300], 4
    T = sum(lens)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    q, k, v = (torch.randn(1, T, H, 128, **bf) for _ in range(3))
    raw_g = torch.randn(1, T, H, 128, **bf)
    beta_logits = torch.randn(1, T, H, **bf)
    # Kimi-Linear's parameters: A_log = log U(1, 16), dt_bias as FLA's layer initialises it
    A_log = torch.log(torch.empty(H, device="cuda").uniform_(1, 16))
    dt = torch.exp(torch.rand(H * 128, device="cuda") * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    cu = torch.tensor([0, 700, 764, T], dtype=torch.long, device="cuda")
    h0 = 0.1 * torch.randn(3, H, 128, 128, device="cuda")
    kw = dict(COMBOS[name])
    precomputed = kw.pop("precomputed", None)
    g = raw_g
    if precomputed is not None:  # vLLM's Kimi-Linear layer: the log-decay computed outside
        g = (-torch.exp(A_log)[:, None] * torch.nn.functional.softplus(raw_g.float() + dt_bias.view(H, 128))).to(
            precomputed)
    beta = beta_logits if kw.get("use_beta_sigmoid_in_kernel") else torch.sigmoid(beta_logits.float())
    params = dict(A_log=kw.pop("A_log", A_log), dt_bias=dt_bias)

    def run():
        return chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                         state_v_first=state_v_first, cu_seqlens=cu, **params, **kw)

    (o, ht), (fo, fht), calls = _both(run, monkeypatch, counted)
    assert calls == [WANT[name]], calls
    assert ht.dtype == fht.dtype == torch.float32 and ht.shape == fht.shape
    err_o, err_s = _rel_rmse(o, fo), _rel_rmse(ht, fht)
    _report(f"fla.ops.kda.chunk_kda {name} state_v_first={state_v_first} output", err_o)
    _report(f"fla.ops.kda.chunk_kda {name} state_v_first={state_v_first} final state", err_s)
    assert err_o < BOUND and err_s < BOUND, (err_o, err_s)


def test_training_mode_is_left_to_fla(counted):
    """With autograd on, the verifier declines (kda-aot has no backward) and FLA's kernels run."""
    from fla.ops.kda import chunk_kda

    bf = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, 128, 2, 128, **bf, requires_grad=True)
    o, _ = chunk_kda(q, q.detach(), q.detach(), q.detach(), q.detach()[..., 0], use_qk_l2norm_in_kernel=True,
                     use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, A_log=torch.zeros(2, device="cuda"))
    o.float().sum().backward()
    assert counted == [] and q.grad is not None
