"""The runtime called the way serving engines call it (docs/call_path.md): device-only cu_seqlens,
fresh tensors every call, the caller's stream, CUDA graphs, several threads. Every result is
compared bit for bit with an eager call on the default stream, and outputs are poisoned first."""

import gc
import threading

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
torch = pytest.importorskip("torch")

SHAPES = {
    "serial": ([300, 17, 0, 1000], 4),
    "cp": ([8192, 2048], 8),  # cp="auto" splits it with device cu_seqlens alone
}


def _inputs(lens, H, seed, state="fp32"):
    from kda_aot import reference

    return reference.make_inputs(lens, H, seed=seed, device="cuda", state=state)


def _call(x, cu=None, **kw):
    import kda_aot

    return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                           lower_bound=x["lower_bound"], initial_state=x["initial_state"], output_final_state=True,
                           cu_seqlens=x["cu_seqlens"] if cu is None else cu, **kw)


def _lens(x):
    return (x["cu_seqlens"][1:] - x["cu_seqlens"][:-1]).tolist()


def _equal(a, b):
    return all(torch.equal(p, q) for p, q in zip(a, b))


@pytest.mark.parametrize("name", list(SHAPES))
def test_no_host_sync_with_device_cu_seqlens(name):
    """A call queued behind a long kernel returns while that kernel still runs: it never waited."""
    lens, H = SHAPES[name]
    x = _inputs(lens, H, seed=1)
    _call(x)  # the first call of a shape builds its plan (host work only, but keep it out)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(1e9))  # about half a second of GPU time
    for _ in range(3):
        _call(x)
    assert not torch.cuda.current_stream().query(), "prefill waited for the GPU (a host sync)"
    torch.cuda.synchronize()


@pytest.mark.parametrize("name", list(SHAPES))
def test_device_plan_equals_host_hint_and_serial(name):
    lens, H = SHAPES[name]
    x = _inputs(lens, H, seed=2)
    eager = _call(x)
    hinted = _call(x, seq_lens=_lens(x))
    serial = _call(x, cp="off")
    assert _equal(eager, hinted) and _equal(eager, serial)


def test_cp_auto_splits_with_device_cu_seqlens_only():
    from kda_aot import api

    lens, H = SHAPES["cp"]
    x = _inputs(lens, H, seed=3)
    _call(x)
    kinds = {plan.launch.kind for plan in api._PLANS.values()}
    assert "cp" in kinds


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("hint", [False, True])
def test_graph_replay_equals_eager_on_new_data(name, hint):
    lens, H = SHAPES[name]
    static = _inputs(lens, H, seed=4)
    kw = dict(seq_lens=_lens(static)) if hint else {}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _call(static, **kw)  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_static, s_static = _call(static, **kw)
    for seed in (5, 6):
        fresh = _inputs(lens, H, seed=seed)
        for key in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens"):
            static[key].copy_(fresh[key])
        o_static.fill_(float("nan"))
        s_static.fill_(float("nan"))
        graph.replay()
        want = _call(fresh)
        assert _equal((o_static, s_static), want), f"replay on seed {seed} differs from eager"


def test_two_graphs_of_different_shapes_replay_in_turn():
    graphs = []
    for name in SHAPES:
        lens, H = SHAPES[name]
        static = _inputs(lens, H, seed=7)
        _call(static)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = _call(static)
        graphs.append((g, outs, _call(static), static))  # the captured inputs must stay alive
    for _ in range(3):
        for g, outs, want, _static in graphs:
            outs[0].fill_(float("nan"))
            g.replay()
            assert _equal(outs, want)


def test_threads_sharing_and_owning_streams_match_sequential():
    """8 threads x 10 rounds: threads 0-3 share one stream, 4-7 have one each; fresh outputs."""
    inputs = [_inputs([64 * (i + 1), 100, 31 * i], 2 + i % 3, seed=10 + i) for i in range(8)]
    want = [_call(x) for x in inputs]
    torch.cuda.synchronize()
    shared = torch.cuda.Stream()
    own = [torch.cuda.Stream() for _ in range(4)]
    results, errors = {}, []

    def work(i):
        try:
            stream = shared if i < 4 else own[i - 4]
            with torch.cuda.stream(stream):
                got = [_call(inputs[i]) for _ in range(10)]
            stream.synchronize()
            results[i] = got
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(8):
        assert all(_equal(got, want[i]) for got in results[i]), f"thread {i} differs"


def test_explicit_stream_argument_with_allocated_outputs():
    x = _inputs([500, 20], 3, seed=20)
    want = _call(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    got = _call(x, stream=side)
    side.synchronize()
    assert _equal(got, want)


def test_memory_is_flat_over_fresh_calls_and_empty_cache_frees():
    import kda_aot
    from kda_aot.plan.workspace import ARENA

    x = _inputs([40, 24], 2, seed=30)
    _call(x)
    # Tensors left unreachable by earlier tests of this process must not be collected inside the
    # loop: that would lower the count below the base, whatever the calls keep.
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    for _ in range(10000):
        y = {k: (t.clone() if torch.is_tensor(t) else t) for k, t in x.items()}
        o, s = _call(y)
        del y, o, s
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base, "calls kept device memory alive"
    assert ARENA.nbytes() == 0, "torch callers must not use the arena"
    kda_aot.empty_cache()


def test_caller_workspace_is_used_and_size_is_reported():
    import kda_aot

    x = _inputs([700, 5], 2, seed=31)
    n = kda_aot.workspace_size(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                               initial_state=x["initial_state"], output_final_state=True, cu_seqlens=x["cu_seqlens"])
    ws = torch.full((n,), 0xAB, dtype=torch.uint8, device="cuda")
    want = _call(x)
    got = _call(x, workspace=ws)
    assert _equal(got, want)
    assert not torch.all(ws == 0xAB), "the given workspace was not used"
    with pytest.raises(ValueError, match="^workspace: this call needs"):
        _call(x, workspace=ws[: n - 256])


def test_validate_host_checks_values_and_default_does_not_read_them():
    x = _inputs([100, 50], 2, seed=32)
    bad = torch.tensor([0, 120, 100], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="^cu_seqlens: must be non-decreasing"):
        _call(x, cu=bad, validate="host")
    out = torch.full_like(x["q"], float("nan"))
    _call(x, cu=bad, out=out)  # accepted: the kernels clamp; memory safety is checked under memcheck
    torch.cuda.synchronize()


def test_empty_work_passes_the_initial_state_through():
    """T = 0 with states: the final state equals the initial state rounded to bf16 (docs/algorithm.md §1.4)."""
    for state in ("bf16", "fp32"):
        x = _inputs((2, 0), 3, seed=33, state=state)
        o, s = _dense_call(x)
        init = x["initial_state"]
        assert torch.equal(s, init.to(torch.bfloat16).to(init.dtype)), state


def _dense_call(x):
    import kda_aot

    return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                           lower_bound=x["lower_bound"], initial_state=x["initial_state"], output_final_state=True)


def test_current_device_is_unchanged():
    x = _inputs([64], 1, seed=34)
    before = torch.cuda.current_device()
    _call(x)
    assert torch.cuda.current_device() == before


def test_bogus_stream_raises_instead_of_faulting():
    """A garbage handle is refused naming `stream`, in a subprocess so a fault cannot take the
    test process down with it."""
    import subprocess
    import sys

    code = ("import torch, kda_aot\n"
            "from kda_aot import reference\n"
            "x = reference.make_inputs([64], 1, seed=0, device='cuda')\n"
            "try:\n"
            "    kda_aot.prefill(x['q'], x['k'], x['v'], x['g'], x['beta'], A_log=x['A_log'], dt_bias=x['dt_bias'],\n"
            "                    cu_seqlens=x['cu_seqlens'], stream=0xdeadbeef)\n"
            "except ValueError as exc:\n"
            "    print('refused:', exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: stream:" in out.stdout, out.stdout
