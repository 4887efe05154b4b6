"""The call path on the CPU, with launches recorded (tests/recording.py): what a call launches, that
a later call of the same shape reuses its plan with the new pointers, that pointer checks still run
on every call, and that nothing is kept or read back."""

import gc
import threading
import weakref

import pytest

from recording import Recorder, call, device_buffer, fresh, problem_args  # noqa: E402

from kda_aot import api  # noqa: E402
from kda_aot.intake import arguments  # noqa: E402
from kda_aot.plan import launcher
from kda_aot.intake.tensors import TensorDesc  # noqa: E402


@pytest.fixture
def rec(monkeypatch):
    r = Recorder(monkeypatch)
    # No call may read anything back to the host unless validate="host".
    monkeypatch.setattr(arguments, "read_device_array", _no_read_back)
    yield r
    api.empty_cache()


def _no_read_back(*a, **k):
    raise AssertionError("the call read cu_seqlens back to the host")


def _ws(x, **kw):
    n = api.workspace_size(**{k: v for k, v in x.items() if k != "stream"}, **kw)
    return device_buffer("workspace", (n,), "uint8")


def _names(launches):
    return [launch.name for launch in launches]


def test_serial_dense_launches_every_kernel_with_the_callers_pointers(rec):
    x = problem_args(T=64, H=2, state="bfloat16")
    ws = _ws(x)
    call(x, workspace=ws)
    launches = rec.last
    assert _names(launches) == ["seq_tables_dense", "k1_prepare", "k2_regstate_inout_bf16_vb64"]
    k1, k2 = launches[1].args, launches[2].args
    assert (k1["q"], k1["k"], k1["g"], k1["beta"], k1["a_log"], k1["dt_bias"]) == tuple(
        x[n].ptr for n in ("q", "k", "g", "beta", "A_log", "dt_bias"))
    assert (k2["v"], k2["out"], k2["initial_state"], k2["final_state"]) == tuple(
        x[n].ptr for n in ("v", "out", "initial_state", "final_state"))
    assert k2["stream"] == 7 and k1["n_heads"] == 2 and k2["n_seq"] == 1
    for name, value in list(k1.items()) + list(k2.items()):
        if name.startswith("ws_") or name in ("seq_start", "tile_prefix"):
            assert ws.ptr <= value < ws.ptr + ws.nbytes, name


def test_a_fresh_call_reuses_the_plan_with_its_own_pointers(rec):
    x = problem_args(T=100, H=2, lens=[60, 40])
    x["workspace"] = _ws(x)
    call(x)
    plans = dict(api._PLANS)
    y = fresh(x)
    call(y)
    assert api._PLANS == plans, "a second call of the same shape built a new plan"
    first, second = rec.calls
    assert _names(first) == _names(second)
    assert second[0].args["cu_seqlens"] == y["cu_seqlens"].ptr != first[0].args["cu_seqlens"]
    assert second[-1].args["out"] == y["out"].ptr
    assert second[1].args["ws_qd"] - first[1].args["ws_qd"] == y["workspace"].ptr - x["workspace"].ptr


def test_varlen_without_hints_reads_nothing_back(rec):
    x = problem_args(lens=[100, 0, 37], H=3, cu_dtype="int64")
    call(x, workspace=_ws(x))
    assert _names(rec.last)[0] == "seq_tables_int64"
    assert rec.last[0].args["t_total"] == 137 and rec.last[0].args["n_seq"] == 3


@pytest.mark.parametrize("name", ["q", "v", "out", "beta"])
def test_a_misaligned_pointer_on_a_known_shape_is_refused_before_launch(rec, name):
    x = problem_args(T=64, H=2)
    x["workspace"] = _ws(x)
    call(x)
    y = fresh(x)
    d = y[name]
    y[name] = TensorDesc(name=name, ptr=d.ptr + 2 if name == "beta" else d.ptr + 8, shape=d.shape, strides=d.strides,
                         dtype=d.dtype, device=d.device, device_id=d.device_id)
    if name == "beta":  # bf16 beta only needs 2-byte alignment: accepted
        call(y)
        assert len(rec.calls) == 2
        return
    with pytest.raises(ValueError, match=f"^{name}: data pointer .* is not 16-byte aligned"):
        call(y)
    assert len(rec.calls) == 1


def test_outputs_overlapping_inputs_are_refused_on_a_known_shape(rec):
    x = problem_args(T=64, H=2)
    x["workspace"] = _ws(x)
    call(x)
    y = fresh(x)
    y["out"] = TensorDesc(name="out", ptr=y["k"].ptr, shape=y["k"].shape, strides=y["k"].strides, dtype="bfloat16",
                          device="cuda", device_id=0)
    with pytest.raises(ValueError, match="^out: memory overlaps k"):
        call(y)
    y = fresh(x)
    y["workspace"] = device_buffer("workspace", x["workspace"].shape, "uint8", ptr=y["v"].ptr)
    with pytest.raises(ValueError, match="^workspace: overlaps"):
        call(y)
    assert len(rec.calls) == 1


def test_workspace_checks(rec):
    x = problem_args(T=64, H=2)
    need = api.workspace_size(**x)
    assert need == api.workspace_size_for(64, 2)
    with pytest.raises(ValueError, match=f"^workspace: this call needs {need} bytes"):
        call(x, workspace=device_buffer("workspace", (need - 1,), "uint8"))
    with pytest.raises(ValueError, match="^workspace: data pointer .* is not 256-byte aligned"):
        call(x, workspace=device_buffer("workspace", (need,), "uint8", ptr=(1 << 40) + 128))
    assert not rec.calls


def test_no_cache_keeps_a_callers_object(rec):
    class Owner:
        pass

    x = problem_args(T=32, H=1)
    owners = []
    for name in list(x):
        if isinstance(x[name], TensorDesc):
            o = Owner()
            owners.append(weakref.ref(o))
            d = x[name]
            x[name] = TensorDesc(name=d.name, ptr=d.ptr, shape=d.shape, strides=d.strides, dtype=d.dtype,
                                 device=d.device, device_id=d.device_id, owner=o)
            del o
    call(x, workspace=_ws(x))
    del x
    gc.collect()
    assert all(r() is None for r in owners), "a cache kept a caller's tensor alive"


def test_threads_share_plans_safely(rec, monkeypatch):
    monkeypatch.setattr(api, "_PLANS_MAX", 4)  # eviction under contention
    errors = []
    shapes = [problem_args(T=16 * (i + 1), H=1) for i in range(6)]
    for x in shapes:
        x["workspace"] = _ws(x)

    def work(i):
        try:
            for r in range(20):
                call(fresh(shapes[(i + r) % len(shapes)]), workspace=shapes[(i + r) % len(shapes)]["workspace"])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(rec.calls) == 160


def test_gate_constant_is_formed_in_double_and_rounded_once():
    import numpy as np

    assert launcher.gate_constant(-5.0) == float(np.float32(-5.0 * 1.4426950408889634))


@pytest.mark.parametrize("hint", [False, True])
def test_cp_auto_cuts_on_the_device(rec, hint):
    """H=8 [8192, 2048]: the device builds the segment tables, with the host plan's cut when a
    hint is given and device_plan's otherwise (12 + 3 segments of at most 43 tiles either way);
    120 (segment, head) pairs at VB=128 run the register-state K2 (planner.k2_kernel)."""
    from kda_aot.plan import cp_plan
    import cp_twins

    lens = [8192, 2048]
    x = problem_args(lens=lens, H=8, state="float32")
    kw = dict(seq_lens=lens) if hint else {}
    call(x, workspace=_ws(x, **kw), **kw)
    names = _names(rec.last)
    assert names == ["cp_seg_tables_int32", "k1_prepare", "cp_pre_scan_vb128", "cp_merge_f32",
                     "k2_regstate_segments_f32_vb128"], names
    tables = rec.last[0].args
    if hint:
        plan = cp_plan.plan_prefill(lens, 8, sm_count=132)
        want = (plan.seg_len, plan.max_count, plan.min_tiles, plan.n_segments)
    else:
        want = cp_plan.device_plan(sum(lens), 2, 8, 132, "auto")
    assert (tables["seg_len"], tables["max_count"], tables["min_tiles"], tables["max_segments"]) == want
    segs = cp_twins.device_segment_tables([0, 8192, 10240], 10240, *want)
    assert sum(segs[4]) == 15  # seg_count: 12 + 3
    k2 = rec.last[-1].args
    assert k2["n_seg"] == want[3] and k2["final_state"] == x["final_state"].ptr
    assert rec.last[2].args["n_scan"] == want[3] - 2


def test_serial_shapes_stay_serial_without_hints(rec):
    x = problem_args(lens=[1024] * 8, H=64)
    call(x, workspace=_ws(x))
    assert _names(rec.last)[0] == "seq_tables_int32"


def test_pointer_sweep_matches_pairwise_overlap():
    """check_pointers' address-order sweep against the plain pairwise rule, on random layouts."""
    import random

    from kda_aot.plan.call_plan import CallPlan, UnsafePointers

    rng = random.Random(5)
    for _ in range(3000):
        n_read, n_written = rng.randint(1, 9), rng.randint(1, 3)
        read = tuple((i, rng.randint(1, 64)) for i in range(n_read))
        written = tuple((9 + i, rng.randint(1, 64)) for i in range(n_written))
        ptrs = [rng.randrange(0, 400, 4) for _ in range(13)]
        plan = CallPlan(problem=None, launch=None, out_shape=(), final_shape=None, final_dtype=None,
                        alloc_final=False, align=((0, 3), (9, 3)), written=written, read=read,
                        workspace_given=False)

        def hits(a, b):
            return ptrs[a[0]] < ptrs[b[0]] + b[1] and ptrs[b[0]] < ptrs[a[0]] + a[1]

        want = any(hits(w, r) for w in written for r in read) or any(
            hits(a, b) for i, a in enumerate(written) for b in written[i + 1:])
        try:
            plan.check_pointers(ptrs)
            got = False
        except UnsafePointers:
            got = True
        assert got == want, (ptrs, read, written)


def test_a_non_hopper_device_is_refused_before_launch(rec, monkeypatch):
    from kda_aot.library import streams
    from kda_aot.library.loader import KdaError

    monkeypatch.setattr(streams, "compute_capability", lambda device_id: (8, 0))
    x = problem_args(T=32, H=1)
    with pytest.raises(KdaError, match=r"^q: on cuda:0, a GPU of compute capability 8\.0; .*sm_90a"):
        call(x, workspace=device_buffer("workspace", (1 << 20,), "uint8"))
    assert not rec.calls


def test_dense_cp_builds_its_tables_from_the_shape(rec):
    """Dense [1, 8192] at H=8 plans CP: cp_seg_tables_dense gets n_seq = B and t_total = T per
    sequence (its registry arguments; a wrong name made every dense CP call raise TypeError)."""
    x = problem_args(T=8192, H=8, state="float32")
    call(x, workspace=_ws(x))
    names = _names(rec.last)
    assert names[0] == "cp_seg_tables_dense" and "cp_pre_scan_vb128" in names, names
    assert rec.last[0].args["t_total"] == 8192 and rec.last[0].args["n_seq"] == 1


@pytest.mark.parametrize("cp,value_split", [("off", 2), ("off", 1), (4, 2)])
def test_a_forced_mma_sync_k2_runs_only_where_the_library_holds_it(rec, monkeypatch, cp, value_split):
    """KDA_K2_KERNEL=k2 at VB=64 or 128: the mma.sync K2 runs from a library of every variant
    (KDA_KERNEL_LATTICE=all); a library of the shipped lattice refuses the call before any launch,
    naming the switch, the kernel and the measurement build. Unforced, both run the twin."""
    from kda_aot.errors import KernelNotBuiltError

    lens = [200, 100]
    x = problem_args(lens=lens, H=2, state="float32")
    kw = dict(cp=cp, value_split=value_split, seq_lens=lens)

    def k2_names():
        call(x, workspace=_ws(x, **kw), **kw)
        return [n for n in _names(rec.last) if n.startswith("k2_")]

    monkeypatch.setenv("KDA_K2_KERNEL", "k2")
    api.empty_cache()
    if rec.lib.missing_variants():
        with pytest.raises(KernelNotBuiltError, match=r"^KDA_K2_KERNEL=k2 forces the mma\.sync K2 k2_\w+_vb\d+, which "
                                                      r".*KDA_KERNEL_LATTICE=all.*KDA_AOT_LIB_DIR"):
            k2_names()
        assert rec.calls == []
    else:
        k2 = k2_names()
        assert k2 and not any(n.startswith("k2_regstate") for n in k2), k2
    monkeypatch.delenv("KDA_K2_KERNEL")
    api.empty_cache()
    k2 = k2_names()
    assert k2 and all(n.startswith("k2_regstate_") for n in k2), k2


def _packed_view(name: str, T: int, H: int, width: int, column: int) -> TensorDesc:
    """A [1, T, H, 128] column block of a [T, width] bf16 projection (token stride width)."""
    base = device_buffer(name + "_projection", (T, width), "bfloat16")
    return TensorDesc(name=name, ptr=base.ptr + 2 * column, shape=(1, T, H, 128), strides=(T * width, width, 128, 1),
                      dtype="bfloat16", device=base.device, device_id=base.device_id)


@pytest.mark.parametrize("strided, k1", [((), "k1_prepare"), (("v",), "k1_prepare"), (("q",), "k1_prepare_strided"),
                                         (("q", "k", "v", "g"), "k1_prepare_strided"),
                                         (("beta",), "k1_prepare_strided")])
def test_k1_reads_strides_only_for_strided_q_k_g_or_beta(rec, strided, k1):
    """Contiguous q, k, g and beta run the K1 with one row offset; a strided one of them runs its
    strided twin with the view's strides (v is K2's: its strides never change the K1)."""
    T, H = 64, 2
    x = problem_args(T=T, H=H)
    for i, name in enumerate(n for n in strided if n != "beta"):
        x[name] = _packed_view(name, T, H, 4 * H * 128 + 64, i * H * 128)
    if "beta" in strided:
        proj = device_buffer("beta_projection", (T, H + 3), "bfloat16")
        x["beta"] = TensorDesc(name="beta", ptr=proj.ptr, shape=(1, T, H), strides=(T * (H + 3), H + 3, 1),
                               dtype="bfloat16", device=proj.device, device_id=proj.device_id)
    call(x, workspace=_ws(x))
    launch = rec.last[1]
    assert launch.name == k1
    expected_t = {n: (4 * H * 128 + 64 if n in strided else H * 128) for n in "qkg"}
    assert {n: launch.args[f"{n}_stride_t"] for n in "qkg"} == expected_t
    assert launch.args["beta_stride_t"] == (H + 3 if "beta" in strided else H)
