"""Planner decisions (pure Python)."""

import pytest

from kda_aot.plan import planner


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


@pytest.mark.parametrize("N,H,want", [(1, 4, 2), (1, 32, 2), (1, 64, 2), (1, 96, 1), (1, 128, 1), (6, 64, 1)])
def test_serial_calls_split_at_most_in_two(N, H, want):
    """Serial calls of either recipe choose VB=128 or 64, where the register-state K2 runs (the
    accurate recipe has its own twins, docs/k2_regstate.md)."""
    kw = dict(T=8192, N=N, H=H, varlen=N > 1, has_initial=False, has_final=False, state_dtype=None, sm_count=132)
    assert planner.plan_serial(**kw).value_split == want
    assert planner.plan_serial(**kw, numerics="accurate").value_split == want


def test_plan_serial_picks_state_variant():
    plan = planner.plan_serial(T=100, N=2, H=4, varlen=False, has_initial=True, has_final=False,
                               state_dtype="float32", sm_count=132)
    assert plan.k2_constants == {"has_initial": True, "has_final": False, "state_fp32": True, "value_block": 64,
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


def test_k2_kernel_picks_the_register_state_twin_where_it_exists():
    """planner.k2_kernel: regstate at VB=64 and 128, k2 at VB=32 (docs/k2_regstate.md)."""
    assert planner.k2_kernel(64) == "regstate" and planner.k2_kernel(128) == "regstate"
    assert planner.k2_kernel(32) == "k2"


def test_k2_kernel_name_takes_a_twin_only_where_it_exists(monkeypatch):
    """launcher.k2_kernel_name: the planner's pick, or the one KDA_K2_KERNEL forces, when the library
    has that twin; K2 itself otherwise (k2, no twin: VB=32, or not in this library). A library of
    the shipped lattice lacks the mma.sync K2 where a twin exists: forcing it is an error naming
    KDA_K2_KERNEL, the kernel and the measurement build; one of all variants runs it. An unknown
    KDA_K2_KERNEL is an error naming it."""
    from types import SimpleNamespace

    from kda_aot.errors import KernelNotBuiltError
    from kda_aot.library import constants
    from kda_aot.plan import launcher

    shipped = SimpleNamespace(kernels=dict.fromkeys(constants.SHIPPED), path="/lib/libkda_kernels.so")
    every = SimpleNamespace(kernels=dict.fromkeys(constants.variant_constants()))

    def pick(flag, name, vb, lib=shipped):
        if flag is None:
            monkeypatch.delenv("KDA_K2_KERNEL", raising=False)
        else:
            monkeypatch.setenv("KDA_K2_KERNEL", flag)
        # the mma.sync variant `name` by its entry and constants, as the launcher asks for it
        assert constants.variant_constants()[name]["value_block"] == vb
        return launcher.k2_kernel_name(lib, constants.ENTRIES[name], **constants.variant_constants()[name])

    for lib in (shipped, every):
        assert pick(None, "k2_in_f32_vb64", 64, lib) == "k2_regstate_in_f32_vb64"
        assert pick(None, "k2_segments_bf16_vb128", 128, lib) == "k2_regstate_segments_bf16_vb128"
        assert pick(None, "k2_ext_segments_f32_vb64", 64, lib) == "k2_regstate_ext_segments_f32_vb64"
        assert pick("regstate", "k2_in_bf16_vb128", 128, lib) == "k2_regstate_in_bf16_vb128"
        assert pick(None, "k2_in_f32_vb32", 32, lib) == "k2_in_f32_vb32"
        assert pick("regstate", "k2_in_f32_vb32", 32, lib) == "k2_in_f32_vb32"
        assert pick("k2", "k2_in_f32_vb32", 32, lib) == "k2_in_f32_vb32"
        # numerics="accurate": its own twins, by the same name rule
        assert pick(None, "k2_in_bf16_vb64_acc", 64, lib) == "k2_regstate_in_bf16_vb64_acc"
        assert pick(None, "k2_segments_f32_vb128_acc", 128, lib) == "k2_regstate_segments_f32_vb128_acc"
        assert pick(None, "k2_in_bf16_vb32_acc", 32, lib) == "k2_in_bf16_vb32_acc"
    # forced mma.sync K2 where a twin exists: in a library of all variants only
    assert pick("k2", "k2_in_f32_vb64", 64, every) == "k2_in_f32_vb64"
    assert pick("k2", "k2_segments_bf16_vb128", 128, every) == "k2_segments_bf16_vb128"
    assert pick("k2", "k2_in_bf16_vb64_acc", 64, every) == "k2_in_bf16_vb64_acc"
    for name, vb in (("k2_in_f32_vb64", 64), ("k2_segments_bf16_vb128", 128), ("k2_ext_bf16_vb64", 64)):
        with pytest.raises(KernelNotBuiltError, match=rf"^KDA_K2_KERNEL=k2 forces the mma\.sync K2 {name}, which the "
                                                      r"kernel library /lib/libkda_kernels\.so does not hold: it is a "
                                                      r"measurement-only kernel.*KDA_KERNEL_LATTICE=all.*KDA_AOT_LIB_DIR"
                                                      r".*unset KDA_K2_KERNEL$"):
            pick("k2", name, vb)
    # the ablations (ci/numerics_table.py) are measurement-only too
    assert pick(None, "k2_inout_bf16_vb64_acc_l1", 64, every) == "k2_inout_bf16_vb64_acc_l1"
    with pytest.raises(KernelNotBuiltError, match=r"^K2 k2_inout_bf16_vb64_acc_l1 is asked for, .*KDA_KERNEL_LATTICE=all"):
        pick(None, "k2_inout_bf16_vb64_acc_l1", 64)
    # a library without the twin runs K2 itself
    assert pick("regstate", "k2_in_bf16_vb128", 128, SimpleNamespace(kernels={"k2_in_bf16_vb128": None})) == \
        "k2_in_bf16_vb128"
    with pytest.raises(ValueError, match="KDA_K2_KERNEL"):
        pick("folded", "k2_in_f32_vb64", 64)


def test_kda_k2_ext_forces_k2_ext_only_for_flashkdas_recipe(monkeypatch):
    """launcher._forced_k2_ext (KDA_K2_EXT, the measurement switch of bench --state-io-cost): on for
    FlashKDA's recipe only (k2_ext has no accurate variant), off when unset or 0, and any other
    value is an error naming it."""
    from types import SimpleNamespace

    from kda_aot.plan import launcher

    default, accurate = SimpleNamespace(numerics="flashkda"), SimpleNamespace(numerics="accurate")
    monkeypatch.delenv("KDA_K2_EXT", raising=False)
    assert not launcher._forced_k2_ext(default)
    monkeypatch.setenv("KDA_K2_EXT", "0")
    assert not launcher._forced_k2_ext(default)
    monkeypatch.setenv("KDA_K2_EXT", "1")
    assert launcher._forced_k2_ext(default) and not launcher._forced_k2_ext(accurate)
    monkeypatch.setenv("KDA_K2_EXT", "yes")
    with pytest.raises(ValueError, match="KDA_K2_EXT"):
        launcher._forced_k2_ext(default)


@pytest.mark.parametrize("S, N, H, want", [
    # (segments, sequences, heads) of the CP shapes timed on the H200 (docs/cp_tuning.md, "Per-kernel
    # value splits") -> the fastest (pre_scan split, K2 split) measured for each kernel
    (16, 1, 4, (2, 2)),  # H=4 [8192]
    (20, 2, 4, (4, 1)),  # H=4 [8192, 2048]
    (32, 1, 4, (1, 1)),  # H=4 [16384]
    (16, 1, 8, (1, 1)),  # H=8 [8192]
    (15, 2, 8, (1, 1)),  # H=8 [8192, 2048]
    (8, 1, 4, (4, 2)),  # H=4 [4096]
    (33, 1, 4, (1, 1)),  # H=4 [32768]
])
def test_cp_splits_choose_each_kernels_split_from_its_own_grid(S, N, H, want):
    assert planner.cp_splits(S, N, H, 132) == want
    # numerics="accurate": the same rule (its segmented K2 has a register-state twin too)
    assert planner.cp_splits(S, N, H, 132, "accurate") == want


def test_cp_splits_with_no_non_last_segment_still_names_a_split():
    assert planner.cp_splits(2, 2, 4, 132) == (4, 2)  # pre_scan is not launched then; the split is unused
