"""Intracard CP on dense [B, T] input (segment tables from the shape, cp_seg_tables_dense): against
serial, and against the same tokens passed packed (whose CP path tests/gpu/test_cp.py covers).

Until the launcher passed cp_seg_tables_dense its `t_total`, every dense call that planned CP
raised TypeError, and no GPU test made one (tests/cpu/test_call_path.py now checks the launch on the
CPU)."""

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
torch = pytest.importorskip("torch")


@pytest.mark.parametrize("B,T,H,state", [(1, 8192, 8, "fp32"), (2, 4096, 4, "bf16"), (3, 3000, 2, None)])
def test_dense_cp_matches_serial_and_packed(B, T, H, state):
    import kda_aot
    from kda_aot import reference

    x = reference.make_inputs((B, T), H, seed=4, device="cuda", state=state)
    args = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"], output_final_state=True)
    toks = [x[n] for n in ("q", "k", "v", "g", "beta")]
    out = torch.full((B, T, H, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    o_cp, s_cp = kda_aot.prefill(*toks, **args, cp="on", out=out)
    o_ser, s_ser = kda_aot.prefill(*toks, **args, cp="off")
    assert not torch.isnan(o_cp).any()
    assert reference.rel_rmse(o_cp, o_ser) < 4e-3 and reference.rel_rmse(s_cp, s_ser) < 4e-3
    # dense input plans on the host like packed input with host lengths (docs/call_path.md): the
    # first segment of every sequence starts from serial's state, so its rows are serial's bits
    plan = kda_aot.plan_prefill([T] * B, H, mode="on")
    flat_cp, flat_ser = o_cp.reshape(B * T, H, 128), o_ser.reshape(B * T, H, 128)
    for first, _ in plan.per_seq:
        a, b = plan.seg_token_start[first], plan.seg_token_start[first + 1]
        assert torch.equal(flat_cp[a:b], flat_ser[a:b]), (a, b)
    # and the same tokens packed take the varlen CP path: within the CP bound of the dense result
    packed = [t.reshape(1, B * T, *t.shape[2:]) for t in toks]
    cu = torch.arange(B + 1, dtype=torch.int32, device="cuda") * T
    o_pk, s_pk = kda_aot.prefill(*packed, **args, cp="on", cu_seqlens=cu, seq_lens=[T] * B)
    assert reference.rel_rmse(o_cp.reshape(o_pk.shape), o_pk) < 4e-3 and reference.rel_rmse(s_cp, s_pk) < 4e-3
