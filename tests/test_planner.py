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
    """launcher._regstate_wanted: KDA_EXPERIMENTAL_REGSTATE=1 at VB=64, =folded at VB=64 and 128,
    FlashKDA's recipe only; K2 otherwise."""
    from kda_aot import launcher

    def wanted(flag, vb, accurate=False):
        if flag is None:
            monkeypatch.delenv("KDA_EXPERIMENTAL_REGSTATE", raising=False)
        else:
            monkeypatch.setenv("KDA_EXPERIMENTAL_REGSTATE", flag)
        return launcher._regstate_wanted({"value_block": vb, "accurate": accurate})

    assert wanted(None, 64) is None and wanted("0", 64) is None
    assert wanted("1", 64) is False and wanted("1", 128) is None and wanted("1", 32) is None
    assert wanted("folded", 64) is True and wanted("folded", 128) is True and wanted("folded", 32) is None
    assert wanted("1", 64, accurate=True) is None and wanted("folded", 128, accurate=True) is None
