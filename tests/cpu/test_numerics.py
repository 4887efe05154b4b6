"""numerics="flashkda" | "accurate" on the CPU: the argument, the kernels a call picks,
the manifest's variants, and the CPU emulation of both recipes against the float64 gold."""

import sys

import pytest

from recording import Recorder, call, device_buffer, problem_args  # noqa: E402

from kda_aot import api  # noqa: E402


@pytest.fixture
def rec(monkeypatch):
    r = Recorder(monkeypatch)
    yield r
    api.empty_cache()


def _ws(x, **kw):
    n = api.workspace_size(**{k: v for k, v in x.items() if k != "stream"}, **kw)
    return device_buffer("workspace", (n,), "uint8")


@pytest.mark.parametrize("numerics", ["Accurate", "fast", "", None, 1, True, ("accurate",), b"accurate"])
def test_a_bad_numerics_is_refused_naming_it(rec, numerics):
    x = problem_args(T=64, H=2)
    with pytest.raises(ValueError, match="^numerics: expected \"flashkda\" or \"accurate\""):
        call(x, numerics=numerics)
    assert not rec.calls, "nothing may launch"


def test_a_bad_numerics_is_refused_by_workspace_size_too(rec):
    x = problem_args(T=64, H=2)
    with pytest.raises(ValueError, match="^numerics: "):
        api.workspace_size(**{k: v for k, v in x.items() if k != "stream"}, numerics="fp32")


@pytest.mark.parametrize("state", [None, "bfloat16", "float32"])
def test_serial_picks_the_accurate_k2(rec, state):
    x = problem_args(T=300, H=4, state=state)
    x["workspace"] = _ws(x)
    call(x)
    default = rec.last[-1].name
    k1 = [launch.name for launch in rec.last if launch.name.startswith("k1_")]
    call(x, numerics="accurate")
    accurate = rec.last[-1].name
    # few pairs: both recipes run the register-state K2 at VB=64 (planner.REGSTATE_SPLITS), the
    # accurate one its own twin; both read and write the same state
    assert default.startswith("k2_regstate_") and default.endswith("_vb64"), default
    assert accurate == f"{default}_acc", (default, accurate)
    assert k1 == ["k1_prepare"] and [n.name for n in rec.last if n.name.startswith("k1_")] == ["k1_prepare_acc"]
    call(x, numerics="flashkda")
    assert rec.last[-1].name == default


@pytest.mark.parametrize("state,final", [("float32", True), ("bfloat16", True), ("float32", False)])
def test_cp_picks_the_accurate_pre_scan_and_segmented_k2_and_shares_the_merge(rec, state, final):
    lens = [8192, 2048]
    x = problem_args(lens=lens, H=8, state=state)
    if not final:
        x.pop("final_state")
        x["output_final_state"] = False
    kw = dict(seq_lens=lens, cp="on")
    call(x, workspace=_ws(x, **kw), **kw)
    default = [launch.name for launch in rec.last]
    call(x, workspace=_ws(x, numerics="accurate", **kw), numerics="accurate", **kw)
    accurate = [launch.name for launch in rec.last]
    assert len(default) == len(accurate) == 5
    # the tables and the merge are shared; K1 has its accurate twin K1' (same workspace)
    assert accurate[0] == default[0] and accurate[3] == default[3] and accurate[3].startswith("cp_merge_")
    assert (default[1], accurate[1]) == ("k1_prepare", "k1_prepare_acc")
    # pre_scan and the segmented K2 are the default's, each with its accurate twin (the same splits)
    assert (accurate[2], accurate[4]) == (default[2] + "_acc", default[4] + "_acc"), (default, accurate)
    assert workspace_bytes(x, kw) == workspace_bytes(x, dict(kw, numerics="accurate"))


def workspace_bytes(x, kw):
    return api.workspace_size(**{k: v for k, v in x.items() if k != "stream"}, **kw)


def test_every_state_kernel_has_an_accurate_twin_and_nothing_else_does():
    """Over every variant of the registry (a library holds the shipped lattice of them or all:
    tests/cpu/test_lattice.py, and identity.py checks each kernel's signature against them)."""
    from pathlib import Path
    from types import SimpleNamespace

    sys.path.append(str(Path(__file__).resolve().parents[2]))  # build_kernels: the source tree only
    from build_kernels.registry import all_variants

    kernels = {v.name: SimpleNamespace(entry=v.entry, args=v.args, constants=dict(v.constants))
               for v in all_variants()}
    twins = acc_twins = 0
    for name, k in kernels.items():
        if k.entry.startswith("k2_regstate"):  # the register-state K2 (registry._k2_regstate)
            assert name.startswith("k2_regstate_"), name
            if name.endswith("_acc"):  # numerics="accurate": the twin of an accurate mma.sync K2
                assert k.constants["accurate"] is True, name
                plain = kernels[name[:-len("_acc")]]
                mma = kernels[name.replace("k2_regstate_", "k2_", 1)]
                assert k.args == plain.args == mma.args and k.entry == plain.entry, name
                assert dict(k.constants, accurate=False) == dict(plain.constants), name
                acc_twins += 1
            else:  # FlashKDA's recipe (accurate=False; the state-pool twins have no such constant)
                assert k.constants.get("accurate", False) is False, name
            continue
        if k.constants.get("ablation", 0):  # measurement-only partial recipes (registry._k2_ablation)
            assert name.startswith("k2_inout_bf16_vb64_acc_l") and k.constants["ablation"] in (1, 2, 3), name
            continue
        if k.entry in ("k2_recurrence", "k2_segments", "cp_pre_scan"):
            assert k.constants["accurate"] is name.endswith("_acc"), name
            if not name.endswith("_acc"):
                twin = kernels[name + "_acc"]
                assert twin.args == k.args and twin.entry == k.entry
                assert dict(twin.constants, accurate=False) == dict(k.constants)
                assert k.constants.get("ablation", 0) == 0 == twin.constants.get("ablation", 0)
                twins += 1
        elif k.entry == "k1_prepare":  # FlashKDA's K1 and the general K1 of the other gate forms, each also strided
            strided = name.endswith("_strided")
            assert k.constants.get("strided", False) is strided, name
            base = name[:-len("_strided")] if strided else name
            assert k.constants["accurate"] is base.endswith("_acc"), name
            if base.endswith("_acc"):
                plain = kernels[base[:-len("_acc")] + ("_strided" if strided else "")]
                assert k.args == plain.args and dict(k.constants, accurate=False) == dict(plain.constants)
                twins += 1
        else:
            assert "accurate" not in k.constants and "ablation" not in k.constants and not name.endswith("_acc"), name
    assert twins == 21 + 6 + 3 + 2 * (1 + 24)  # K2, segmented K2, pre_scan, K1 and general K1 (both twins)
    assert acc_twins == 14 + 4  # register-state K2 at VB=64 and 128: serial, segmented


def _reference():
    """The torch reference (its emulation of both recipes); the tests that use it skip without torch."""
    pytest.importorskip("torch", reason="the recipe emulation (kda_aot/reference.py) runs on torch")
    from kda_aot import reference

    return reference


def _long_memory(T=1024):
    return _reference().make_inputs([T], 1, seed=5, state="fp32", g_mean=-8.0)


def test_accurate_emulation_is_closer_to_gold_on_long_memory():
    """The CPU emulation of both recipes (docs/numerics.md measures the same at larger T)."""
    reference = _reference()
    x = _long_memory()
    gold = reference.gold_prefill(**x)
    fk = reference.chunked_prefill(**x, mode="emulate")
    acc = reference.chunked_prefill(**x, mode="accurate")
    e_fk = [reference.rel_rmse(a, b) for a, b in zip(fk, gold)]
    e_acc = [reference.rel_rmse(a, b) for a, b in zip(acc, gold)]
    assert e_acc[0] < 0.9 * e_fk[0] and e_acc[1] < 0.75 * e_fk[1], (e_acc, e_fk)
    assert acc[0].dtype.is_floating_point and str(acc[0].dtype) == "torch.bfloat16"
    assert str(acc[1].dtype) == "torch.float32"


def test_accurate_emulation_builds_mqk_from_unrounded_operands_on_short_memory():
    """On N(0,1) gates (which forget within a few tokens) the output error is mostly the intra-chunk
    product Mqk's: K1' forms it from fp32 q^ and k^ through bf16 pairs, which removes over 40% of
    the default recipe's output error (0.54x here; the recipe before that removed 19%)."""
    reference = _reference()
    x = reference.make_inputs([1024], 1, seed=5, state="fp32")
    gold = reference.gold_prefill(**x)
    e_fk = [reference.rel_rmse(a, b) for a, b in zip(reference.chunked_prefill(**x, mode="emulate"), gold)]
    e_acc = [reference.rel_rmse(a, b) for a, b in zip(reference.chunked_prefill(**x, mode="accurate"), gold)]
    assert e_acc[0] < 0.6 * e_fk[0] and e_acc[1] < 0.7 * e_fk[1], (e_acc, e_fk)


def test_accurate_emulation_keeps_an_fp32_initial_state_on_an_empty_sequence():
    reference = _reference()
    import torch

    x = reference.make_inputs([0, 40], 1, seed=6, state="fp32")
    _, fs = reference.chunked_prefill(**x, mode="accurate")
    assert torch.equal(fs[0], x["initial_state"][0])
    _, fk = reference.chunked_prefill(**x, mode="emulate")
    assert torch.equal(fk[0].float(), x["initial_state"][0].to(torch.bfloat16).float())


def test_reference_mode_is_named_when_wrong():
    reference = _reference()
    with pytest.raises(ValueError, match="mode must be 'exact', 'emulate' or 'accurate'"):
        reference.chunked_prefill(**_long_memory(16), mode="fp32")


@pytest.mark.parametrize("numerics", ["flashkda", "accurate"])
def test_dense_cp_launches_with_the_manifests_arguments(rec, numerics):
    """Dense [B, T] input with cp="on" (tests/gold_cases.py "no initial state" found this path
    passing `seq_len` where the manifest declares the dense per-sequence length `t_total`)."""
    x = problem_args(T=1100, H=2)
    for name in ("q", "k", "v", "g", "out"):
        x[name] = device_buffer(name, (2, 1100, 2, 128), "bfloat16")
    x["beta"] = device_buffer("beta", (2, 1100, 2), "bfloat16")
    call(x, cp="on", numerics=numerics, workspace=_ws(x, cp="on", numerics=numerics))
    names = [launch.name for launch in rec.last]
    assert names[0] == "cp_seg_tables_dense" and rec.last[0].args["t_total"] == 1100, names
    assert names[2].startswith("cp_pre_scan_") and names[2].endswith("_acc") == (numerics == "accurate")
