"""The shipped lattice (build_kernels/registry.py shipped_variants; docs/build.md, "Kernel lattice"):
every variant left out is one the planner never launches for any public argument, and every
kernel the planner can launch is in it."""

import itertools
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))  # build_kernels lives only in the source tree (appended: kda_aot stays the installed one)
from build_kernels import shared_constants as build_constants  # noqa: E402
from build_kernels import registry  # noqa: E402
from kda_aot.library import constants  # noqa: E402
from kda_aot.plan import launcher, planner  # noqa: E402

SHIPPED = {v.name: v for v in registry.shipped_variants()}
ALL = {v.name: v for v in registry.all_variants()}
LEFT_OUT = [v for name, v in ALL.items() if name not in SHIPPED]


def test_the_lattice_is_a_subset_in_the_builds_order():
    assert list(SHIPPED) == [name for name in ALL if name in SHIPPED]
    assert registry.lattice("shipped") == registry.shipped_variants()
    assert registry.lattice("all") == registry.all_variants()
    with pytest.raises(ValueError, match="kernel lattice"):
        registry.lattice("full")


def test_what_is_left_out_is_what_the_planner_never_launches():
    """A measurement-only variant is an ablation (the planner asks for ablation=0) or a mma.sync K2
    at a value block where its register-state twin, with the same arguments and constants, ships
    (the planner picks the twin there: planner.k2_kernel)."""
    families = dict((v.name, f) for f, v in registry.families())
    assert LEFT_OUT
    for v in LEFT_OUT:
        constants = dict(v.constants)
        if families[v.name] in registry.MEASUREMENT_FAMILIES:
            assert constants["ablation"] != 0, v.name
            continue
        assert families[v.name] in registry.MMA_K2_FAMILIES, v.name
        assert constants["value_block"] in build_constants.REGSTATE_VALUE_BLOCKS
        assert planner.k2_kernel(constants["value_block"]) == "regstate"
        twin = SHIPPED.get(build_constants.regstate_name(v.name))
        assert twin is not None, v.name
        assert twin.args == v.args and dict(twin.constants) == {k: c for k, c in constants.items() if k != "ablation"}


def test_every_k2_without_a_twin_ships():
    """VB=32 (value_split=4, a public argument) has only the mma.sync K2: it ships, as does every
    kernel of the other families (the approximations serve the public torch reference)."""
    for family, v in registry.families():
        if family in registry.MMA_K2_FAMILIES and dict(v.constants)["value_block"] == 32:
            assert v.name in SHIPPED, v.name
        if family not in registry.MMA_K2_FAMILIES | registry.MEASUREMENT_FAMILIES:
            assert v.name in SHIPPED, v.name
    assert {"approx_ex2", "approx_tanh", "approx_rsqrt"} <= set(SHIPPED)


def test_the_counts():
    by_family = {}
    for family, v in registry.families():
        if v.name not in SHIPPED:
            by_family[family] = by_family.get(family, 0) + 1
    assert by_family == {"k2": 14, "k2_accurate": 14, "k2_segments": 4, "k2_segments_accurate": 4, "k2_ext": 8,
                         "k2_ablation": 3}
    assert (len(SHIPPED), len(ALL)) == (196, 243)


def test_the_planner_names_every_k2_from_the_package_not_the_library():
    """constants.kernel finds the mma.sync K2 by its constants among all variants (the shipped
    library holds only its twin at VB=64 and 128)."""
    for v in ALL.values():
        if v.entry == "k2_recurrence":
            assert constants.kernel("k2_recurrence", **dict(v.constants)) == v.name
    assert constants.variant_constants() == {v.name: dict(v.constants) for v in ALL.values()}


def test_every_k2_the_launcher_can_ask_for_is_shipped(monkeypatch):
    """Every K2 name the launcher builds (serial, CP without and with a final state, the state pool
    and checkpoints through k2_ext, both recipes, every value split) resolves to a shipped kernel."""
    monkeypatch.delenv("KDA_K2_KERNEL", raising=False)
    lib = SimpleNamespace(kernels=dict.fromkeys(SHIPPED))
    asked = []
    for vb in constants.VALUE_BLOCKS:
        for accurate, (has_initial, has_final), fp32 in itertools.product((False, True), registry.STATE_IO,
                                                                         (False, True)):
            asked.append(constants.kernel("k2_recurrence", has_initial=has_initial, has_final=has_final,
                                          state_fp32=fp32 and (has_initial or has_final), value_block=vb,
                                          accurate=accurate, ablation=0))
        for dtype, acc in itertools.product(("bf16", "f32"), ("", "_acc")):
            asked.append(f"k2_segments_{dtype}_vb{vb}{acc}")
        for dtype in ("bf16", "f32"):
            asked += [f"k2_ext_{dtype}_vb{vb}", f"k2_ext_segments_{dtype}_vb{vb}"]
    for name in asked:
        assert launcher.k2_kernel_name(lib, ALL[name].entry, **dict(ALL[name].constants)) in SHIPPED, name


def test_the_runtime_knows_what_ships():
    from kda_aot.library import _abi

    assert _abi.SHIPPED == set(SHIPPED) and constants.SHIPPED is _abi.SHIPPED
    # the renamed twin of an ablation is no variant: the ablations have no twin
    assert not any(build_constants.regstate_name(v.name) in ALL for v in LEFT_OUT
                   if dict(v.constants).get("ablation"))


def test_a_library_says_which_variants_it_lacks():
    from kda_aot.library import loader

    shipped = SimpleNamespace(kernels=dict.fromkeys(SHIPPED))
    assert loader.KernelLibrary.missing_variants(shipped) == [v.name for v in sorted(LEFT_OUT, key=lambda v: v.name)]
    assert loader.KernelLibrary.missing_variants(SimpleNamespace(kernels=dict.fromkeys(ALL))) == []


def test_every_variant_is_found_by_its_entry_constants_and_pointer_dtypes():
    """constants.kernel, the one way the runtime names a kernel: each variant of the registry is the
    one match of its entry, its constants and its pointer arguments' dtypes; where constants alone
    do not decide (the tables by cu_seqlens' dtype) or are incomplete, it refuses to guess."""
    for v in ALL.values():
        dtypes = {a.name: a.dtype for a in v.args if a.kind == "ptr"}
        assert constants.kernel(v.entry, dtypes, **dict(v.constants)) == v.name, v.name
    with pytest.raises(LookupError, match="^2 kernels of entry 'seq_tables_varlen'"):
        constants.kernel("seq_tables_varlen")
    assert constants.kernel("seq_tables_varlen", {"cu_seqlens": "int64"}) == "seq_tables_int64"
    with pytest.raises(LookupError, match="^no kernel of entry 'k1_prepare'"):
        constants.kernel("k1_prepare", accurate=False)  # the other constants are not defaults: all are named
