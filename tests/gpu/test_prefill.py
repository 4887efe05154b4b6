"""Serial prefill (K1 + K2) on the GPU: against the GPU reference, the float64 gold, and itself.

The GPU reference is kda_aot.reference.chunked_prefill(mode="emulate") run with torch on the GPU,
with the kernels' own PTX approximations (ex2.approx.ftz, tanh.approx, rsqrt.approx, from the
library's test kernels) substituted for the exact functions.
"""

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def lib():
    from kda_aot.library.loader import get_library

    library = get_library()
    if not library.has("k1_prepare"):  # a broken build, not a reason to skip (only a missing GPU is)
        pytest.fail("the kernel library has no k1_prepare: every build ships K1 and K2")
    return library


def _inputs(shape, H, seed, state=None):
    from kda_aot import reference

    return reference.make_inputs(shape, H, seed=seed, device="cuda", state=state)


def _run(x, *, output_final_state=True, value_split=None, out=None, final_state=None, **kw):
    import kda_aot

    args = {k: x[k] for k in ("A_log", "dt_bias", "lower_bound", "initial_state", "cu_seqlens")}
    return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=output_final_state,
                           value_split=value_split, out=out, final_state=final_state, cp="off", **args, **kw)


def _ulp_report(a, b):
    """Largest distance in bf16 units of last place, and the fraction of bit-equal elements."""
    ai = a.contiguous().view(torch.int16).int()
    bi = b.contiguous().view(torch.int16).int()
    # map sign-magnitude to a monotone integer line
    ai = torch.where(ai < 0, -32768 - ai, ai)
    bi = torch.where(bi < 0, -32768 - bi, bi)
    d = (ai - bi).abs()
    return int(d.max()), float((d == 0).float().mean())


CASES = [
    pytest.param((2, 256), 4, None, id="B2-T256-H4-nostate"),
    pytest.param([1, 15, 16, 17, 100, 0, 513], 3, "bf16", id="varlen7-H3-bf16"),
    pytest.param((1, 4096), 8, "bf16", id="T4096-H8-bf16"),
    pytest.param((2, 333), 2, "fp32", id="B2-T333-H2-fp32"),
    pytest.param((1, 1), 1, "fp32", id="T1-H1-fp32"),
]


@pytest.mark.parametrize("shape,H,state", CASES)
@pytest.mark.parametrize("split", [1, 2, 4])
def test_matches_gpu_reference(lib, gpu_approx, shape, H, state, split):
    from kda_aot import reference

    x = _inputs(shape, H, seed=11, state=state)
    o, s = _run(x, value_split=split)
    ref_o, ref_s = reference.chunked_prefill(**x, mode="emulate", approx=gpu_approx)
    if state == "fp32":
        assert s.dtype == torch.float32
    ulp_o, exact_o = _ulp_report(o, ref_o)
    ulp_s, exact_s = _ulp_report(s.to(torch.bfloat16), ref_s)
    assert torch.equal(s.to(torch.bfloat16).float(), s.float()), "fp32 final state must be bf16-valued"
    assert torch.equal(o, ref_o) and torch.equal(s.to(torch.bfloat16), ref_s), (
        f"not bit-exact: output max {ulp_o} ulp ({exact_o:.4%} exact), state max {ulp_s} ulp ({exact_s:.4%} exact)")


def _fk_accuracy_inputs(shape, H, gate):
    """FK's accuracy setting (docs/algorithm.md §5.2): q, k, v ~ U(0,1), fp32 h0 ~ N(0,1), A_log = 0, gate sweep."""
    x = _inputs(shape, H, seed=5, state="fp32")
    gen = torch.Generator(device="cuda").manual_seed(3)
    for name in ("q", "k", "v"):
        x[name] = torch.rand(x[name].shape, generator=gen, device="cuda").to(torch.bfloat16)
    x["initial_state"] = torch.randn(x["initial_state"].shape, generator=gen, device="cuda")
    x["A_log"] = torch.zeros_like(x["A_log"])
    g = {"uniform": lambda t: (torch.rand(t.shape, generator=gen, device="cuda") * 16 - 8),
         "normal": lambda t: 8 * torch.randn(t.shape, generator=gen, device="cuda"),
         "strong-decay": lambda t: torch.full(t.shape, 8.0, device="cuda"),
         "weak-decay": lambda t: torch.full(t.shape, -8.0, device="cuda")}[gate](x["g"])
    x["g"] = g.to(torch.bfloat16)
    x["dt_bias"] = torch.zeros_like(x["dt_bias"])
    return x


SHAPES_TO_8192 = [((1, 8192), 2), ([4096, 1, 2047, 33], 2), ((3, 500), 1)]


@pytest.mark.parametrize("shape,H", SHAPES_TO_8192)
@pytest.mark.parametrize("gate", ["uniform", "normal", "strong-decay"])
def test_close_to_float64_gold(lib, shape, H, gate):
    from kda_aot import reference

    x = _fk_accuracy_inputs(shape, H, gate)
    o, s = _run(x)
    gold_o, gold_s = reference.gold_prefill(**x)
    bound_o = 6e-3 if x["cu_seqlens"] is not None else 5e-3  # docs/algorithm.md §5.3
    assert reference.rel_rmse(o, gold_o) < bound_o
    assert reference.rel_rmse(s, gold_s) < 5e-3


@pytest.mark.parametrize("shape,H", [((1, 8192), 2)])
def test_random_inputs_close_to_gold(lib, shape, H):
    """make_inputs' N(0,1) inputs: the bf16 recipe itself sits near 5.7e-3 on the output here (the
    CPU emulation measures the same), so the bound is the recipe's own error plus a margin."""
    from kda_aot import reference

    x = _inputs(shape, H, seed=21, state="fp32")
    o, s = _run(x)
    gold_o, gold_s = reference.gold_prefill(**x)
    emu_o, emu_s = reference.chunked_prefill(**x, mode="emulate")
    err_o, err_s = reference.rel_rmse(o, gold_o), reference.rel_rmse(s, gold_s)
    assert err_s < 5e-3
    assert err_o < 1.1 * reference.rel_rmse(emu_o, gold_o) + 1e-4 and err_o < 7e-3


@pytest.mark.parametrize("shape,H", SHAPES_TO_8192)
def test_weak_decay_error_is_the_recipe_error(lib, gpu_approx, shape, H):
    """g = -8 with A_log = 0 barely decays: the state integrates thousands of tokens and its bf16
    storage (docs/algorithm.md §3.4, FlashKDA's choice) dominates the error; FK treats ht as warn-only here.
    The large state makes u = Kd S^T cancel, where the torch reference's tensor-core GEMM
    (cuBLAS blocking) and the kernel's mma.sync k-order may round differently, and with no decay
    such 1-ulp differences persist and grow in the state (measured on the H200 against the
    reference: output 1.2e-3 to 2.4e-3, final state 2.1e-3 to 6.2e-3 at T=8192; both sit about
    1e-2 from the gold). The kernel must stay within 1e-2 of the GPU reference and 2e-2 of the
    gold."""
    from kda_aot import reference

    x = _fk_accuracy_inputs(shape, H, "weak-decay")
    o, s = _run(x)
    ref_o, ref_s = reference.chunked_prefill(**x, mode="emulate", approx=gpu_approx)
    assert reference.rel_rmse(o, ref_o) < 1e-2 and reference.rel_rmse(s, ref_s) < 1e-2
    gold_o, gold_s = reference.gold_prefill(**x)
    assert reference.rel_rmse(o, gold_o) < 2e-2 and reference.rel_rmse(s, gold_s) < 2e-2


def test_poisoned_outputs_are_overwritten_and_guards_untouched(lib):
    x = _inputs([17, 40, 1, 16], 3, seed=2, state="bf16")
    T, H, N = x["q"].shape[1], 3, 4
    n_out, n_state = T * H * 128, N * H * 128 * 128
    guard = 4096
    buf = torch.full((n_out + guard,), float("nan"), dtype=torch.bfloat16, device="cuda")
    sbuf = torch.full((n_state + guard,), float("nan"), dtype=torch.bfloat16, device="cuda")
    buf[n_out:] = 7.0
    sbuf[n_state:] = -3.0
    out = buf[:n_out].view(1, T, H, 128)
    final = sbuf[:n_state].view(N, H, 128, 128)
    _run(x, out=out, final_state=final)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), "some output elements were never written"
    assert not torch.isnan(final).any(), "some final-state elements were never written"
    assert torch.all(buf[n_out:] == 7.0), "a write went past the end of out"
    assert torch.all(sbuf[n_state:] == -3.0), "a write went past the end of final_state"


def test_deterministic_over_20_runs(lib):
    x = _inputs([1300, 547, 2048, 963, 271, 3063], 4, seed=9, state="fp32")
    o0, s0 = _run(x)
    for _ in range(19):
        o, s = _run(x)
        assert torch.equal(o, o0) and torch.equal(s, s0)
    # The same values at new addresses (fresh tensors, as a serving loop passes them), with the
    # previous copies still alive so the allocator cannot hand back the same blocks.
    keep = []
    for _ in range(5):
        y = {k: (t.clone() if torch.is_tensor(t) else t) for k, t in x.items()}
        keep.append(y)
        o, s = _run(y)
        assert torch.equal(o, o0) and torch.equal(s, s0)


def test_empty_sequences_pass_the_initial_state_through(lib):
    x = _inputs([0, 20, 0], 2, seed=4, state="fp32")
    o, s = _run(x)
    init = x["initial_state"]
    assert torch.equal(s[0], init[0].to(torch.bfloat16).float())
    assert torch.equal(s[2], init[2].to(torch.bfloat16).float())
    assert not torch.equal(s[1], init[1].to(torch.bfloat16).float())
