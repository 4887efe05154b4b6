"""The register-state K2 prototype (branch k2-regstate; KDA_EXPERIMENTAL_REGSTATE=1) gives the default
K2's outputs and final states bit for bit (docs/speed_limits.md, "A register-state wgmma step").

Each case runs the prototype with the producer warp at value_split=2 (VB=64) and folded at 2 and 1
(VB=128), against K2 at the same split. Outputs are poisoned with
NaN before each run, so a token the prototype skips shows; the default K2 is itself checked
against float64 and FlashKDA elsewhere (tests/test_prefill_gpu.py, tests/test_flashkda_gpu.py)."""

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
torch = pytest.importorskip("torch")

CASES = {
    "one sequence": ([1024], 4),
    "partial tiles, empty and one-token sequences": ([300, 17, 1, 0, 77], 8),
    "long, many heads": ([5000], 16),
    "long memory (weak decay)": ([2048], 4),
}


MODES = [("1", 2), ("folded", 2), ("folded", 1)]  # KDA_EXPERIMENTAL_REGSTATE, value_split


def _run(monkeypatch, x, flag: str, split: int):
    import kda_aot
    from kda_aot import api

    monkeypatch.setenv("KDA_EXPERIMENTAL_REGSTATE", flag)
    api._PLANS.clear()  # the environment is read when a call is planned
    out = torch.full_like(x["v"], float("nan"))
    has_state = x["initial_state"] is not None
    o, ht = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                            lower_bound=x["lower_bound"], initial_state=x["initial_state"],
                            output_final_state=has_state, cu_seqlens=x["cu_seqlens"], cp="off", value_split=split,
                            out=out)
    torch.cuda.synchronize()
    (plan,) = api._PLANS.values()
    k2 = [n for n in plan.launch.program.names if n.startswith("k2_")]
    assert k2 and all(n.startswith("k2_regstate_") == (flag != "0") for n in k2), k2  # the prototype ran, or not
    assert all(n.startswith("k2_regstate_f_") == (flag == "folded") for n in k2), k2
    return o.clone(), None if ht is None else ht.clone()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"{m[0]}-split{m[1]}")
@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("state", [None, "bf16", "fp32"])
def test_regstate_k2_is_bitwise_equal_to_k2(monkeypatch, name, state, mode):
    from kda_aot import reference

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    lens, H = CASES[name]
    kw = dict(g_mean=-8.0) if name.startswith("long memory") else {}
    x = reference.make_inputs(lens, H, seed=11, device="cuda", state=state, **kw)
    flag, split = mode
    o_ref, ht_ref = _run(monkeypatch, x, "0", split)
    o_rs, ht_rs = _run(monkeypatch, x, flag, split)
    assert not torch.isnan(o_ref).any()
    differ = (o_rs.view(torch.int16) != o_ref.view(torch.int16)).sum().item()
    assert differ == 0, f"{differ} output values differ (NaN in the prototype's: {torch.isnan(o_rs).sum().item()})"
    if ht_ref is not None:
        assert torch.equal(ht_rs.view(torch.int16) if ht_rs.dtype == torch.bfloat16 else ht_rs,
                           ht_ref.view(torch.int16) if ht_ref.dtype == torch.bfloat16 else ht_ref)
