"""The validation wall for the state pool and checkpoints (docs/state_pool.md), on the CPU.

TensorDesc fakes go through validate_prefill exactly as the device calls' descriptions do; the
few checks prefill makes before the wall (output_final_state with a pool) and the host copy of
state_indices (validate="host") are called directly.
"""

import dataclasses
import sys
from pathlib import Path

import pytest

from kda_aot.intake.arguments import check_state_indices_host
from kda_aot.intake.validation import validate_prefill

sys.path.insert(0, str(Path(__file__).parent))  # the sibling helpers below, when run on its own
from test_validation import desc, make_args  # noqa: E402

D = 128


def pool_args(N=3, H=4, S=5, dtype="float32", stride0=None, T=64, every=None, **kw):
    args = make_args(B=1, T=T, H=H, cu=N + 1, cu_dtype="int32", **kw)
    slot = H * D * D
    pool = desc("state_pool", (S, H, D, D), dtype, strides=(stride0 or slot, D * D, D, 1))
    args.update(state_pool=pool, state_indices=desc("state_indices", (N,), "int32"), checkpoint_every=every)
    return args


def test_pool_problem_fields_and_padded_stride():
    p = validate_prefill(**pool_args(stride0=4 * D * D + 64))
    assert p.pooled and p.n_pool == 5 and p.slot_stride == 4 * D * D + 64 and p.state_dtype == "float32"
    assert not p.has_initial and not p.has_final
    one = validate_prefill(**pool_args(S=1, stride0=7))  # a single slot: its stride is never used
    assert one.slot_stride == 4 * D * D


@pytest.mark.parametrize("other", ["initial_state", "final_state"])
def test_pool_excludes_plain_states(other):
    args = pool_args()
    args[other] = desc(other, (3, 4, D, D), "float32")
    with pytest.raises(ValueError, match=rf"^state_pool: cannot be combined with {other}"):
        validate_prefill(**args)


def test_pool_and_indices_come_together():
    args = pool_args()
    with pytest.raises(ValueError, match=r"^state_indices: required with state_pool"):
        validate_prefill(**dict(args, state_indices=None))
    with pytest.raises(ValueError, match=r"^state_indices: given without state_pool"):
        validate_prefill(**dict(args, state_pool=None))


def test_output_final_state_with_pool_is_refused_before_anything():
    import kda_aot

    with pytest.raises(ValueError, match=r"^state_pool: cannot be combined with output_final_state"):
        kda_aot.prefill(None, None, None, None, None, A_log=None, dt_bias=None, state_pool=object(),
                        output_final_state=True)


@pytest.mark.parametrize("change, message", [
    (dict(dtype="float16"), r"^state_pool: expected dtype bfloat16 or float32"),
    (dict(shape=(5, 3, D, D)), r"^state_pool: expected shape \[S, 4, 128, 128\]"),
    (dict(shape=(0, 4, D, D)), r"^state_pool: needs at least one slot"),
    (dict(strides=(4 * D * D, D * D, 1, D)), r"^state_pool: each slot must be contiguous"),
    (dict(strides=(4 * D * D - 4, D * D, D, 1)), r"^state_pool: slot stride .* smaller than a slot"),
    (dict(strides=(4 * D * D + 2, D * D, D, 1)), r"^state_pool: slot stride .* not a multiple of 16 bytes"),
    (dict(ptr=0x7F00_0000_0008), r"^state_pool: data pointer .* not 16-byte aligned"),
    (dict(device="cpu"), r"^state_pool: expected a CUDA device tensor"),
    (dict(readonly=True), r"^state_pool: the producer marked this tensor read-only"),
])
def test_pool_layout_refusals(change, message):
    args = pool_args()
    pool = dataclasses.replace(args["state_pool"], **change)
    with pytest.raises((TypeError, ValueError), match=message):
        validate_prefill(**dict(args, state_pool=pool))


@pytest.mark.parametrize("change, message", [
    (dict(dtype="int64"), r"^state_indices: expected dtype int32"),
    (dict(shape=(4,), strides=(1,)), r"^state_indices: expected shape \(3,\)"),
    (dict(strides=(2,)), r"^state_indices: must be contiguous"),
    (dict(ptr=0x7F00_0000_0002), r"^state_indices: data pointer .* not 4-byte aligned"),
])
def test_index_refusals(change, message):
    args = pool_args()
    idx = dataclasses.replace(args["state_indices"], **change)
    with pytest.raises((TypeError, ValueError), match=message):
        validate_prefill(**dict(args, state_indices=idx))


def test_pool_overlaps_are_refused():
    args = pool_args(stride0=4 * D * D + 1024)
    pool = args["state_pool"]
    # inside the padding of the last-but-one slot: the span, not the element count, decides
    inside = pool.ptr + (4 * D * D + 512) * 4
    with pytest.raises(ValueError, match=r"^state_pool: memory overlaps state_indices"):
        validate_prefill(**dict(args, state_indices=dataclasses.replace(args["state_indices"], ptr=inside)))
    with pytest.raises(ValueError, match=r"^state_pool: memory overlaps out"):
        validate_prefill(**dict(args, out=dataclasses.replace(args["out"], ptr=inside)))
    with pytest.raises(ValueError, match=r"^state_pool: memory overlaps q"):
        validate_prefill(**dict(args, q=dataclasses.replace(args["q"], ptr=inside)))


def test_checkpoint_every_values():
    for bad, err in ((True, TypeError), (64.0, TypeError), ("64", TypeError), (0, ValueError), (8, ValueError),
                     (40, ValueError), (-64, ValueError)):
        with pytest.raises(err, match=r"^checkpoint_every: "):
            validate_prefill(**pool_args(every=bad))
    p = validate_prefill(**pool_args(every=16, T=100))
    assert p.checkpoint_every == 16 and p.n_checkpoints == 6
    assert validate_prefill(**pool_args(every=64, T=63)).n_checkpoints == 0


def test_checkpoint_buffers():
    args = make_args(B=2, T=160, H=4, initial="bfloat16")
    args.update(checkpoint_every=64)
    good = dict(checkpoints=desc("checkpoints", (5, 4, D, D), "bfloat16"),
                checkpoint_index=desc("checkpoint_index", (5, 2), "int32"))
    p = validate_prefill(**args, **good)
    assert p.n_checkpoints == 5 and p.state_dtype == "bfloat16"
    with pytest.raises(ValueError, match=r"^checkpoints: dtype float32 differs from initial_state dtype bfloat16"):
        validate_prefill(**args, **dict(good, checkpoints=desc("checkpoints", (5, 4, D, D), "float32")))
    with pytest.raises(ValueError, match=r"^checkpoints: expected shape \(5, 4, 128, 128\)"):
        validate_prefill(**args, **dict(good, checkpoints=desc("checkpoints", (4, 4, D, D), "bfloat16")))
    with pytest.raises(ValueError, match=r"^checkpoint_index: expected shape \(5, 2\)"):
        validate_prefill(**args, **dict(good, checkpoint_index=desc("checkpoint_index", (5,), "int32")))
    with pytest.raises(TypeError, match=r"^checkpoint_index: expected dtype int32"):
        validate_prefill(**args, **dict(good, checkpoint_index=desc("checkpoint_index", (5, 2), "int64")))
    ck = good["checkpoints"]
    with pytest.raises(ValueError, match=r"^checkpoint_index: memory overlaps checkpoints"):
        validate_prefill(**args, **dict(good, checkpoint_index=desc("checkpoint_index", (5, 2), "int32",
                                                                      ptr=ck.ptr + 64)))
    with pytest.raises(ValueError, match=r"^checkpoints: a checkpoint buffer was given but checkpoint_every is None"):
        validate_prefill(**dict(args, checkpoint_every=None), **good)
    with pytest.raises(ValueError, match=r"^checkpoints: memory overlaps q"):
        validate_prefill(**args, **dict(good, checkpoints=dataclasses.replace(ck, ptr=args["q"].ptr)))


def test_host_index_check():
    check_state_indices_host([3, -1, 0, -1, 2], 4)
    with pytest.raises(ValueError, match=r"^state_indices: slot 0 appears at entries 1 and 3"):
        check_state_indices_host([2, 0, -1, 0], 4)
    with pytest.raises(ValueError, match=r"^state_indices: entry 2 = 4 is past the pool's 4 slots"):
        check_state_indices_host([0, 1, 4], 4)


def test_workspace_size_for_checkpoints_and_layout():
    import kda_aot
    from kda_aot.plan.workspace import cp_layout

    base = kda_aot.workspace_size_for(8192, 8, N=2, varlen=True, seq_lens=[6000, 2192], cp="on")
    with_ck = kda_aot.workspace_size_for(8192, 8, N=2, varlen=True, seq_lens=[6000, 2192], cp="on",
                                         checkpoint_every=64)
    assert with_ck > base  # the CP call also builds the sequences' own tables
    layout = cp_layout(8, 600, 2, 16, sequence_tables=True)
    assert layout.regions["real_seq_start"][1] == 12 and layout.regions["real_tile_prefix"][1] == 12


# ------------------------------------------------------------------------------------------------
# what the calls launch (recorded, no GPU)

@pytest.fixture
def rec(monkeypatch):
    from kda_aot import api
    from recording import Recorder

    r = Recorder(monkeypatch)
    yield r
    api.empty_cache()


def _ws():
    from recording import device_buffer

    return device_buffer("workspace", (1 << 28,), "uint8")  # never dereferenced: any size that suffices


def _padded_pool(S, H, dtype, pad):
    from recording import device_buffer

    base = device_buffer("state_pool", (S * (H * D * D + pad),), dtype)
    return dataclasses.replace(base, shape=(S, H, D, D), strides=(H * D * D + pad, D * D, D, 1))


def test_serial_pool_call_hands_the_pool_to_k2_in_place(rec):
    from recording import call, device_buffer, problem_args

    x = problem_args(H=2, lens=[100, 60, 40])
    pool = _padded_pool(6, 2, "float32", 256)
    idx = device_buffer("state_indices", (3,), "int32")
    o, fs = call(x, state_pool=pool, state_indices=idx, cp="off", workspace=_ws())
    assert fs is None
    names = [launch.name for launch in rec.last]
    assert names == ["seq_tables_int32", "k1_prepare", "k2_regstate_ext_f32_vb64"], names
    k2 = rec.last[-1].args
    assert k2["initial_state"] == k2["final_state"] == pool.ptr and k2["state_index"] == idx.ptr
    assert k2["slot_stride"] == 2 * D * D + 256 and k2["n_pool"] == 6 and k2["checkpoints"] == 0


def test_cp_pool_call_with_checkpoints(rec):
    from recording import call, device_buffer, problem_args

    x = problem_args(H=2, lens=[4096, 1000])
    pool = _padded_pool(3, 2, "bfloat16", 0)
    idx = device_buffer("state_indices", (2,), "int32")
    ck = device_buffer("checkpoints", (5096 // 64, 2, D, D), "bfloat16")
    ix = device_buffer("checkpoint_index", (5096 // 64, 2), "int32")
    o, fs, cps = call(x, state_pool=pool, state_indices=idx, cp=4, checkpoint_every=64, checkpoints=ck,
                      checkpoint_index=ix, workspace=_ws())
    assert fs is None and cps.states is ck and cps.index is ix
    names = [launch.name for launch in rec.last]
    assert names[:3] == ["cp_seg_tables_int32", "seq_tables_int32", "checkpoint_index"], names
    # 5 segments x 2 heads: the segmented K2 splits the value columns in two (planner.cp_splits) and
    # runs the register-state twin
    assert "cp_merge_pool_bf16" in names and names[-1] == "k2_regstate_ext_segments_bf16_vb64", names
    args = {launch.name: launch.args for launch in rec.last}
    merge, k2 = args["cp_merge_pool_bf16"], args[names[-1]]
    assert merge["state_pool"] == pool.ptr and merge["state_index"] == idx.ptr
    assert k2["final_state"] == pool.ptr and k2["checkpoints"] == ck.ptr and k2["checkpoint_every"] == 64
    assert k2["real_seq_start"] == args["seq_tables_int32"]["seq_start"]
    assert args["checkpoint_index"]["checkpoint_index"] == ix.ptr and args["checkpoint_index"]["n_slots"] == 79


def test_default_calls_launch_what_they_did(rec):
    """Without the new arguments nothing changes: the same kernels as before (the register-state K2
    at VB=64 on few pairs, docs/k2_regstate.md)."""
    from recording import call, problem_args

    call(problem_args(H=2, lens=[100, 60], state="float32"), cp="off", workspace=_ws())
    assert [launch.name for launch in rec.last] == ["seq_tables_int32", "k1_prepare", "k2_regstate_inout_f32_vb64"]


def test_checkpoints_without_states_and_without_heads(rec):
    """Checkpoints alone take k2_ext with no state pointers (fp32 checkpoints); with H == 0 there is
    nothing to compute but the index table is still written on the device."""
    from recording import call, device_buffer, problem_args

    x = problem_args(H=2, lens=[200, 56])
    ck = device_buffer("checkpoints", (4, 2, D, D), "float32")
    ix = device_buffer("checkpoint_index", (4, 2), "int32")
    call(x, cp="off", checkpoint_every=64, checkpoints=ck, checkpoint_index=ix, workspace=_ws())
    names = [launch.name for launch in rec.last]
    assert names == ["seq_tables_int32", "checkpoint_index", "k1_prepare", "k2_regstate_ext_f32_vb64"], names
    k2 = rec.last[-1].args
    assert k2["initial_state"] == k2["final_state"] == k2["state_index"] == 0
    assert k2["checkpoints"] == ck.ptr and k2["n_pool"] == 2 and k2["slot_stride"] == 2 * D * D

    y = problem_args(H=0, lens=[200, 56])
    ck0 = device_buffer("checkpoints", (4, 0, D, D), "float32")
    call(y, cp="off", checkpoint_every=64, checkpoints=ck0, checkpoint_index=ix, workspace=_ws())
    assert [launch.name for launch in rec.last] == ["seq_tables_int32", "checkpoint_index"]
    assert rec.last[0].args["seq_order"] == 0, "no K2 follows: the tables kernel need not sort"
    call(x, cp="off", checkpoint_every=64, checkpoints=ck, checkpoint_index=ix, workspace=_ws())
    assert rec.last[0].args["seq_order"] != 0  # with heads, K2 follows the longest-first order


def test_host_copy_of_the_indices_is_checked_on_every_call(rec):
    """state_indices_cpu: repeated or out-of-pool slots refused before anything runs, no read-back."""
    from kda_aot import api
    from kda_aot.intake import arguments
    from recording import call, device_buffer, problem_args

    def no_read_back(*a, **k):
        raise AssertionError("state_indices_cpu must not read anything back")

    x = problem_args(H=2, lens=[30, 20, 10])
    pool = _padded_pool(4, 2, "float32", 0)
    idx = device_buffer("state_indices", (3,), "int32")
    arguments.read_device_array, saved = no_read_back, arguments.read_device_array
    try:
        call(x, state_pool=pool, state_indices=idx, state_indices_cpu=[3, -1, 0], cp="off", workspace=_ws())
        assert len(rec.calls) == 1
        with pytest.raises(ValueError, match=r"^state_indices: slot 3 appears at entries 0 and 2"):
            call(x, state_pool=pool, state_indices=idx, state_indices_cpu=[3, -1, 3], cp="off", workspace=_ws())
        with pytest.raises(ValueError, match=r"^state_indices: entry 1 = 4 is past the pool's 4 slots"):
            call(x, state_pool=pool, state_indices=idx, state_indices_cpu=[0, 4, 1], cp="off", workspace=_ws())
        with pytest.raises(ValueError, match=r"^state_indices_cpu: expected 3 entries like state_indices, got 2"):
            call(x, state_pool=pool, state_indices=idx, state_indices_cpu=[0, 1], cp="off", workspace=_ws())
        with pytest.raises(ValueError, match=r"^state_indices_cpu: a host copy of state_indices, given without"):
            call(x, state_indices_cpu=[0, 1, 2], cp="off", workspace=_ws())
        assert len(rec.calls) == 1, "a refused call launched something"
    finally:
        arguments.read_device_array = saved
