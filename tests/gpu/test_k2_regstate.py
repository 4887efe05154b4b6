"""The register-state K2 (KDA_K2_KERNEL=regstate) gives the mma.sync K2's
(KDA_K2_KERNEL=k2) outputs, final states, pool slots and checkpoints bit for bit
(docs/k2_regstate.md): serial, CP (its segmented K2 and the no-final-state K2 of a CP call) and the
state pool with checkpoints, in FlashKDA's recipe; serial and CP with numerics="accurate" too (its
twins against the accurate mma.sync K2, fp32 master state and all; it has no state pool).

Each case runs the register-state kernel at value_split=2 (VB=64, producer warp) and 1 (VB=128,
producer warpgroup), against K2 at the same split; the launch program is checked to hold its
kernels (or K2's). Every output is poisoned with NaN before each run, so a token the register-state kernel
skips shows; K2 is itself checked against float64 and FlashKDA elsewhere
(tests/gpu/test_prefill.py, tests/gpu/test_flashkda.py). The mma.sync K2 at VB=64 and 128 is a
measurement-only kernel: against a library of the shipped lattice these tests skip, naming the
measurement build (KDA_KERNEL_LATTICE=all; docs/testing.md)."""

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
torch = pytest.importorskip("torch")

D = 128
MODES = [("regstate", 2), ("regstate", 1)]  # KDA_K2_KERNEL, value_split
SERIAL = {
    "one sequence": ([1024], 4),
    "partial tiles, empty and one-token sequences": ([300, 17, 1, 0, 77], 8),
    "long, many heads": ([5000], 16),
    "long memory (weak decay)": ([2048], 4),
}
CP = {"two segments counts": ([8192, 2048], 4, 4), "always": ([4096, 1000, 0, 2500], 4, "on")}
NUMERICS = ["flashkda", "accurate"]


def _prefill(monkeypatch, flag, x, **kw):
    """prefill under KDA_K2_KERNEL=flag, new NaN outputs; returns the cloned results
    and the K2-family kernels its program ran."""
    import kda_aot
    from kda_aot import api
    from kda_aot.errors import KernelNotBuiltError

    monkeypatch.setenv("KDA_K2_KERNEL", flag)
    api._PLANS.clear()  # the environment is read when a call is planned
    out = torch.full_like(x["v"], float("nan"))
    args = {k: x[k] for k in ("A_log", "dt_bias", "lower_bound", "cu_seqlens")}
    try:
        res = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], out=out, **args, **kw)
    except KernelNotBuiltError as exc:  # a library of the shipped lattice: no mma.sync K2 at VB=64, 128
        pytest.skip(f"needs the measurement build (KDA_KERNEL_LATTICE=all bash ci/build_wheels.sh cu12; "
                    f"docs/testing.md): {str(exc).split(', which', 1)[0]}, which the loaded library does not hold")
    torch.cuda.synchronize()
    (plan,) = api._PLANS.values()
    k2 = [n for n in plan.launch.program.names if n.startswith("k2_")]
    flat = []
    for r in res:
        if r is None:
            continue
        flat += [r.states.clone(), r.index.clone()] if hasattr(r, "states") else [r.clone()]
    return flat, k2


def _check_ran(k2, flag, numerics="flashkda"):
    assert k2, "no K2 ran"
    if flag == "k2":
        assert not any(n.startswith("k2_regstate") for n in k2), k2
    else:
        assert all(n.startswith("k2_regstate_") for n in k2), k2
    # numerics="accurate" runs its own K2s (either form), FlashKDA's recipe none of them
    assert all(n.endswith("_acc") is (numerics == "accurate") for n in k2), k2


def _same(a, b):
    return torch.equal(a.contiguous().view(torch.int8), b.contiguous().view(torch.int8))


def _compare(ref, got):
    assert len(ref) == len(got)
    assert not torch.isnan(ref[0]).any(), "K2's output has NaN"
    for i, (r, g) in enumerate(zip(ref, got)):
        if not _same(r, g):
            differ = (r.view(torch.int8) != g.view(torch.int8)).sum().item()
            pytest.fail(f"result {i}: {differ} bytes differ")


def _compare_with_k2(monkeypatch, flag, x, call):
    """The same call under KDA_K2_KERNEL=k2 and =flag: each ran its kernels, with equal bytes."""
    ref, k2_ref = _prefill(monkeypatch, "k2", x, **call)
    got, k2_got = _prefill(monkeypatch, flag, x, **call)
    numerics = call.get("numerics", "flashkda")
    _check_ran(k2_ref, "k2", numerics)
    _check_ran(k2_got, flag, numerics)
    _compare(ref, got)


def _skip_without_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no GPU")


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"{m[0]}-split{m[1]}")
@pytest.mark.parametrize("name", SERIAL)
@pytest.mark.parametrize("state", [None, "bf16", "fp32"])
def test_serial_is_bitwise_equal_to_k2(monkeypatch, name, state, mode, numerics):
    from kda_aot import reference

    _skip_without_gpu()
    lens, H = SERIAL[name]
    kw = dict(g_mean=-8.0) if name.startswith("long memory") else {}
    x = reference.make_inputs(lens, H, seed=11, device="cuda", state=state, **kw)
    flag, split = mode
    call = dict(initial_state=x["initial_state"], output_final_state=state is not None, cp="off", value_split=split,
                numerics=numerics)
    _compare_with_k2(monkeypatch, flag, x, call)


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"{m[0]}-split{m[1]}")
@pytest.mark.parametrize("name", CP)
@pytest.mark.parametrize("state", [None, "bf16", "fp32"])
@pytest.mark.parametrize("final", [False, True], ids=["no-final", "final"])
def test_cp_is_bitwise_equal_to_k2(monkeypatch, name, state, final, mode, numerics):
    from kda_aot import reference

    _skip_without_gpu()
    lens, H, cp = CP[name]
    x = reference.make_inputs(lens, H, seed=12, device="cuda", state=state or ("fp32" if final else None))
    flag, split = mode
    call = dict(initial_state=x["initial_state"] if state else None, output_final_state=final, cp=cp,
                value_split=split, numerics=numerics)
    _compare_with_k2(monkeypatch, flag, x, call)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"{m[0]}-split{m[1]}")
@pytest.mark.parametrize("cp", ["off", 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_state_pool_and_checkpoints_are_bitwise_equal_to_k2(monkeypatch, cp, dtype, mode):
    """Slots by index, one of them -1 (padding: no entry read, nothing written), a gap between the
    pool's slots, and checkpoints every 64 tokens."""
    from kda_aot import reference

    _skip_without_gpu()
    lens, H = [3000, 0, 700, 77, 1600], 4
    x = reference.make_inputs(lens, H, seed=13, device="cuda")
    S, slot = 7, H * D * D
    gen = torch.Generator(device="cuda").manual_seed(14)
    storage = torch.empty(S * (slot + 256), dtype=dtype, device="cuda")
    pool0 = storage.as_strided((S, H, D, D), (slot + 256, D * D, D, 1))
    pool0.copy_((0.1 * torch.randn((S, H, D, D), generator=gen, device="cuda")).to(dtype))
    idx = torch.tensor([5, 2, -1, 0, 6], dtype=torch.int32, device="cuda")
    flag, split = mode
    results = {}
    for f in ("k2", flag):
        st = storage.clone()
        pool = st.as_strided((S, H, D, D), (slot + 256, D * D, D, 1))
        res, k2 = _prefill(monkeypatch, f, x, state_pool=pool, state_indices=idx, cp=cp, checkpoint_every=64,
                           value_split=split)
        _check_ran(k2, f)
        results[f] = res + [st]
    _compare(results["k2"], results[flag])
