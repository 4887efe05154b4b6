"""Planner decisions (pure Python)."""

import pytest

from kda_aot import planner


@pytest.mark.parametrize("T,N,varlen,want", [
    (0, 3, False, 0), (5, 0, True, 0), (16, 2, False, 2), (17, 2, False, 4),
    (8192, 1, False, 512), (8192, 6, True, 518), (1, 1, True, 2),
])
def test_tile_capacity(T, N, varlen, want):
    assert planner.tile_capacity(T, N, varlen) == want


@pytest.mark.parametrize("N,H,sms,want", [
    # the six serial benchmark shapes (measured on the H200, docs/value_split.md) and edge cases
    (1, 64, 132, 2), (1, 96, 132, 4), (8, 64, 132, 1), (6, 64, 132, 1), (8, 96, 132, 1), (6, 96, 132, 1),
    (1, 4, 132, 4), (1, 132, 132, 1), (1, 66, 132, 2),
])
def test_value_split_fills_the_machine(N, H, sms, want):
    assert planner.value_split(N, H, sms) == want


def test_plan_serial_picks_state_variant():
    plan = planner.plan_serial(T=100, N=2, H=4, varlen=False, has_initial=True, has_final=False,
                               state_dtype="float32", sm_count=132)
    assert plan.k2_constants == {"has_initial": True, "has_final": False, "state_fp32": True, "value_block": 32,
                                 "accurate": False, "ablation": 0}
    plan = planner.plan_serial(T=100, N=2, H=4, varlen=False, has_initial=True, has_final=False,
                               state_dtype="float32", sm_count=132, numerics="accurate")
    assert plan.k2_constants["accurate"] is True
    plan = planner.plan_serial(T=100, N=2, H=4, varlen=False, has_initial=False, has_final=False,
                               state_dtype=None, sm_count=132, value_split_override=1)
    assert plan.k2_constants["value_block"] == 128 and plan.k2_constants["state_fp32"] is False
    with pytest.raises(ValueError, match="value_split"):
        planner.plan_serial(T=1, N=1, H=1, varlen=False, has_initial=False, has_final=False, state_dtype=None,
                            sm_count=132, value_split_override=3)


def test_the_regstate_prototype_is_asked_for_only_where_it_exists(monkeypatch):
    """launcher._maybe_regstate: K2's twin under KDA_EXPERIMENTAL_REGSTATE=1 / =folded when the
    library has it; K2 itself otherwise (no variable, another value, no twin: accurate, VB=32)."""
    from types import SimpleNamespace

    from kda_aot import launcher

    lib = SimpleNamespace(kernels={n: None for n in ("k2_regstate_in_f32_vb64", "k2_regstate_f_in_f32_vb64",
                                                      "k2_regstate_f_segments_bf16_vb128")})

    def pick(flag, name):
        if flag is None:
            monkeypatch.delenv("KDA_EXPERIMENTAL_REGSTATE", raising=False)
        else:
            monkeypatch.setenv("KDA_EXPERIMENTAL_REGSTATE", flag)
        return launcher._maybe_regstate(lib, name)

    assert pick(None, "k2_in_f32_vb64") == "k2_in_f32_vb64" and pick("0", "k2_in_f32_vb64") == "k2_in_f32_vb64"
    assert pick("1", "k2_in_f32_vb64") == "k2_regstate_in_f32_vb64"
    assert pick("folded", "k2_in_f32_vb64") == "k2_regstate_f_in_f32_vb64"
    assert pick("folded", "k2_segments_bf16_vb128") == "k2_regstate_f_segments_bf16_vb128"
    assert pick("1", "k2_segments_bf16_vb128") == "k2_segments_bf16_vb128"
    assert pick("folded", "k2_in_f32_vb32") == "k2_in_f32_vb32"
    assert pick("folded", "k2_in_f32_vb64_acc") == "k2_in_f32_vb64_acc"
