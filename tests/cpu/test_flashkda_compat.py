"""kda_aot.flashkda_compat without a GPU: FlashKDA's fwd passed onto kda_aot.prefill (with the
float64 stand-in of tests/torch_stand_ins.py for the kernels), the refusals of what is not built,
the operator's schema and opcheck, torch.compile tracing it, and get_workspace_size as an upper
bound of the exact need (kda_aot.workspace_size_for) over every smaller call.
tests/gpu/test_flashkda_compat.py runs it on the kernels and against FlashKDA itself.
"""

import random

import pytest

torch = pytest.importorskip("torch")

from torch_stand_ins import StandIn, gold  # noqa: E402

import kda_aot  # noqa: E402
from kda_aot import api, flashkda_compat as fk  # noqa: E402
from kda_aot import reference

D = 128


@pytest.fixture
def stand_in(monkeypatch):
    fake = StandIn()
    monkeypatch.setattr(api, "prefill", fake)
    return fake


def _inputs(shape, H=2, state="fp32", seed=0):
    return reference.make_inputs(shape, H, seed=seed, state=state)


def _fwd_args(x):
    return x["q"], x["k"], x["v"], x["g"], x["beta"]


@pytest.mark.parametrize("shape,state,has_out", [((2, 20), "fp32", True), ((1, 33), "bf16", False),
                                                 ([17, 0, 6], "bf16", True), ([9, 5], None, True)])
def test_fwd_writes_out_and_final_state_in_place(stand_in, shape, state, has_out):
    x = _inputs(shape, state=state)
    out = torch.full_like(x["q"], float("nan"))
    N = 2 if isinstance(shape, tuple) else len(shape)
    final = torch.full((N, 2, D, D), float("nan"), dtype=torch.bfloat16 if state == "bf16" else torch.float32) \
        if has_out else None
    cu = None if x["cu_seqlens"] is None else x["cu_seqlens"].long()  # FlashKDA's int64
    ret = fk.fwd(*_fwd_args(x), 0.1, out, x["A_log"], x["dt_bias"], -4, initial_state=x["initial_state"],
                 final_state=final, cu_seqlens=cu)
    assert ret is None  # FlashKDA's fwd returns nothing: the outputs are the buffers
    call = stand_in.calls[-1]
    assert call["out"] is out and call["final_state"] is final and call["output_final_state"] is has_out
    assert call["gate"] == "safe" and call["beta_form"] == "logits" and call["allow_neg_eigval"] is False
    assert call["cp"] == "off", "FlashKDA's bits come from the serial recurrence"
    assert type(call["lower_bound"]) is float and call["lower_bound"] == -4.0 and type(call["scale"]) is float
    assert call["cu_seqlens"] is cu and call["workspace"] is None
    o64, s64 = gold(*_fwd_args(x), x["A_log"], x["dt_bias"], -4.0, 0.1, x["initial_state"], x["cu_seqlens"])
    assert torch.equal(out, o64.to(torch.bfloat16))
    if has_out:
        assert torch.equal(final, s64.to(final.dtype))


def test_fwd_passes_the_workspace_and_cp(stand_in):
    x = _inputs([8, 8], state=None)
    ws = torch.zeros(4096, dtype=torch.uint8)
    fk.fwd(*_fwd_args(x), 0.088, torch.empty_like(x["q"]), x["A_log"], x["dt_bias"], -5.0, cu_seqlens=x["cu_seqlens"],
           workspace=ws, cp="auto")
    call = stand_in.calls[-1]
    assert call["workspace"] is ws and call["cp"] == "auto" and bool((ws == 7).all())


def test_fwd_refuses_one_checkpoint_argument_without_the_other():
    x = _inputs((1, 16), state=None)
    out = torch.empty_like(x["q"])
    ck_state = torch.empty(1, 2, 2, D, D)
    with pytest.raises(ValueError, match="^checkpoint_offsets: needs checkpoint_state"):
        fk.fwd(*_fwd_args(x), 0.1, out, x["A_log"], x["dt_bias"], -5.0, checkpoint_offsets=torch.tensor([[16, 0]]))
    with pytest.raises(ValueError, match="^checkpoint_state: given without checkpoint_offsets"):
        fk.fwd(*_fwd_args(x), 0.1, out, x["A_log"], x["dt_bias"], -5.0, checkpoint_state=ck_state)
    with pytest.raises(TypeError, match="^out: FlashKDA's fwd writes the output into `out`"):
        fk.fwd(*_fwd_args(x), 0.1, None, x["A_log"], x["dt_bias"], -5.0)


def test_fwd_on_cpu_tensors_raises_the_walls_error():
    x = _inputs((1, 8), state=None)
    with pytest.raises(TypeError, match="^q: expected a CUDA device tensor"):
        fk.fwd(*_fwd_args(x), 0.1, torch.empty_like(x["q"]), x["A_log"], x["dt_bias"], -5.0)


# ---------------------------------------------------------------------------------------------
# the operator

def test_op_schema_follows_the_vllm_fork_and_declares_the_written_arguments():
    import kda_aot.torch as kt

    schema = kt.FLASHKDA_FWD._schema
    names = [a.name for a in schema.arguments]
    # the fork's torch.ops._flashkda_C.fwd order: workspace right after out, checkpoints last
    assert names == ["q", "k", "v", "g", "beta", "scale", "out", "workspace", "A_log", "dt_bias", "lower_bound",
                     "initial_state", "final_state", "cu_seqlens", "checkpoint_state", "checkpoint_offsets", "cp",
                     "use_vsplit", "segment_ids"]
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["out", "workspace", "final_state", "checkpoint_state"]
    assert str(schema).endswith("-> ()")


@pytest.mark.parametrize("state,varlen", [("fp32", True), ("bf16", False), (None, True)])
def test_opcheck(stand_in, state, varlen):
    x = _inputs([11, 13] if varlen else (2, 12), state=state)
    out = torch.empty_like(x["q"])
    N = x["q"].shape[0] if x["cu_seqlens"] is None else 2
    final = None if state is None else torch.empty(N, 2, D, D, dtype=x["initial_state"].dtype)
    ws = torch.empty(256, dtype=torch.uint8)
    cu = None if x["cu_seqlens"] is None else x["cu_seqlens"].long()
    result = torch.library.opcheck(fk.FLASHKDA_FWD, (*_fwd_args(x), 0.0883, out, ws, x["A_log"], x["dt_bias"], -5.0),
                                   dict(initial_state=x["initial_state"], final_state=final, cu_seqlens=cu))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_op_equals_fwd(stand_in):
    x = _inputs([10, 7], state="fp32")
    cu = x["cu_seqlens"].long()
    a, fa = torch.empty_like(x["q"]), torch.empty_like(x["initial_state"])
    b, fb = torch.empty_like(x["q"]), torch.empty_like(x["initial_state"])
    fk.fwd(*_fwd_args(x), 0.1, a, x["A_log"], x["dt_bias"], -5.0, x["initial_state"], fa, cu)
    fk.FLASHKDA_FWD(*_fwd_args(x), 0.1, b, None, x["A_log"], x["dt_bias"], -5.0, x["initial_state"], fb, cu)
    assert torch.equal(a, b) and torch.equal(fa, fb)


def test_compile_fullgraph_traces_the_op():
    """The op is one node of the graph; on meta tensors its fake implementation runs."""
    x = {k: (t.to("meta") if torch.is_tensor(t) else t) for k, t in _inputs([20, 12], state="fp32").items()}

    def fn(x, out, final):
        fk.FLASHKDA_FWD(*_fwd_args(x), 0.1, out, None, x["A_log"], x["dt_bias"], -5.0, x["initial_state"], final,
                        x["cu_seqlens"])
        return out * 2, final

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out, final = torch.empty_like(x["q"]), torch.empty_like(x["initial_state"])
    o2, f2 = torch.compile(fn, backend=backend, fullgraph=True)(x, out, final)
    targets = [n.target for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert len(graphs) == 1 and targets.count(fk.FLASHKDA_FWD) == 1
    assert o2.shape == x["q"].shape and f2.shape == final.shape


def test_op_refuses_checkpoint_offsets_without_state_at_trace_time():
    x = {k: (t.to("meta") if torch.is_tensor(t) else t) for k, t in _inputs((1, 16), state=None).items()}
    with pytest.raises(ValueError, match="^checkpoint_offsets"):
        fk.FLASHKDA_FWD(*_fwd_args(x), 0.1, torch.empty_like(x["q"]), None, x["A_log"], x["dt_bias"], -5.0,
                        checkpoint_offsets=torch.zeros(1, dtype=torch.int64, device="meta"))


# ---------------------------------------------------------------------------------------------
# get_workspace_size: one buffer for the maxima serves every smaller call

def _need(T, H, N, lens, varlen, cp, sm, checkpoint_k=0, listed=False):
    """The exact workspace of one fwd call: dense [N, T // N] (lens None) or packed `lens`,
    with cu_seqlens on the device only (FlashKDA's call gives no host lengths)."""
    if not varlen:
        return kda_aot.workspace_size_for(T // N, H, N=N, varlen=False, cp=cp, sm_count=sm, has_initial=True,
                                          has_final=True, checkpoint_k=checkpoint_k, listed=listed)
    return kda_aot.workspace_size_for(T, H, N=N, varlen=True, cp=cp, sm_count=sm, has_final=True,
                                      checkpoint_k=checkpoint_k, listed=listed)


@pytest.mark.parametrize("cp", ["off", "auto"])
@pytest.mark.parametrize("T_max,H,N_max,sm", [(8192, 24, 64, 132), (65536, 1, 4, 132), (4096, 4, 40, 132),
                                              (16384, 8, 2, 78), (300, 96, 3, 132)])
def test_get_workspace_size_bounds_every_smaller_call(T_max, H, N_max, sm, cp):
    bound = fk.get_workspace_size(T_max, H, N_max, cp=cp, sm_count=sm)
    serial_max = _need(T_max, H, N_max, None, True, "off", sm)
    # checkpoints at offsets, K = 2, and segment_ids
    with_table = _need(T_max, H, N_max, None, True, "off", sm, checkpoint_k=2, listed=True)
    assert serial_max <= with_table
    assert bound == with_table if cp == "off" else bound >= with_table
    rng = random.Random(T_max * H + N_max)
    worst = 0
    for _ in range(150):
        N = rng.randint(1, N_max)
        T = rng.randint(0, T_max)
        k = rng.choice((0, 1, 2))  # checkpoints at given offsets per sequence
        listed = rng.random() < 0.5  # segment_ids
        if rng.random() < 0.3:  # dense [B, T'] with B * T' <= T
            T = T // N * N
            need = _need(T, H, N, None, False, cp, sm, k, listed)
        else:
            need = _need(T, H, N, None, True, cp, sm, k, listed)
        worst = max(worst, need)
        assert need <= bound, (T, N, need, bound)
    for N in (1, min(N_max, max(1, sm // H)), N_max):  # the corners: all tokens, most segments
        for varlen in (True, False):
            worst = max(worst, _need(T_max // N * N, H, N, None, varlen, cp, sm))
            assert worst <= bound
    assert bound < 1.25 * worst + (60 << 20), "the bound is far above any call's need"


def test_get_workspace_size_cp_default_sm_count_and_refusals(monkeypatch):
    from kda_aot.library import streams

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(streams, "sm_count", lambda device_id: 78)
    assert fk.get_workspace_size(4096, 4, 2, cp="auto") == fk.get_workspace_size(4096, 4, 2, cp="auto", sm_count=78)
    assert fk.get_workspace_size(4096, 4, 2) == fk.get_workspace_size(4096, 4, 2, cp="off")
    for bad, name in (((-1, 4, 1), "T_total"), ((16, 4.0, 1), "H"), ((16, 4, True), "N")):
        with pytest.raises(ValueError, match=f"^{name}: expected an int"):
            fk.get_workspace_size(*bad)
    with pytest.raises(ValueError, match="^cp: expected 'off', 'auto' or 'on'"):
        fk.get_workspace_size(16, 4, 1, cp=2)
