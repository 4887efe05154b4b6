"""Checkpoints at given offsets and strided inputs on the CPU: every rule of the validation wall
(TensorDesc fakes through validate_prefill, as in tests/cpu/test_validation.py), the Problem fields the
launcher reads, the pointer vector, the call plan's read and written spans, the plan key of strided
torch tensors, and the torch front ends' schemas and routing. The kernels behind them run in
tests/gpu/test_checkpoint_offsets.py and tests/gpu/test_strided_inputs.py.
"""

import dataclasses
import sys
from pathlib import Path
from typing import Optional

import pytest

from kda_aot import api
from kda_aot.intake import arguments
from kda_aot.plan import call_plan, program
from kda_aot.intake.validation import ALIGNMENT, extent_bytes, validate_prefill

sys.path.insert(0, str(Path(__file__).parent))  # the sibling helpers below, when run on its own
from test_validation import desc, make_args, replace  # noqa: E402

D = 128
CHECKPOINT_ARGS = ("checkpoint_state", "checkpoint_offsets", "checkpoint_slots")


def contiguous_strides(H):
    return (H * D, D) * 4 + (H,)


# --------------------------------------------------------------------------------------------
# Strided q, k, v, g, beta

def strided(args, name, strides, **changes):
    return {**args, name: dataclasses.replace(args[name], strides=tuple(strides), **changes)}


def test_contiguous_inputs_fill_the_strides_with_their_contiguous_values():
    assert validate_prefill(**make_args(B=2, T=64, H=4)).strides == contiguous_strides(4)
    assert validate_prefill(**make_args(T=100, H=3, cu=4)).strides == contiguous_strides(3)


def test_column_slices_of_a_packed_projection():
    """q, k, v, g as column blocks of one [T, W] projection (token stride W), beta from another."""
    T, H = 64, 2
    W = 4 * H * D + 24  # a multiple of 8
    args = make_args(B=1, T=T, H=H, cu=3, cu_dtype="int32")
    for name in ("q", "k", "v", "g"):
        args = strided(args, name, (T * W, W, D, 1))
    args = strided(args, "beta", (T * (H + 5), H + 5, 1))
    p = validate_prefill(**args)
    assert p.strides == (W, D) * 4 + (H + 5,)


def test_head_strided_and_dense_batched_views():
    B, T, H = 2, 32, 3
    args = make_args(B=B, T=T, H=H)
    args = strided(args, "k", (T * H * 2 * D, H * 2 * D, 2 * D, 1))  # every other head block
    args = strided(args, "v", (T * H * D, H * D, D, 1))
    p = validate_prefill(**args)
    assert p.strides[2:4] == (H * 2 * D, 2 * D) and p.strides[4:6] == (H * D, D)


def test_size_one_dims_carry_no_stride():
    """A [1, T, H, 128] view with any batch stride, one head with any head stride, one token: the
    strides normalise to what the contiguous call has (so they share a plan)."""
    T, H = 48, 2
    args = make_args(B=1, T=T, H=H)
    args = strided(args, "q", (12345 * 8, H * D, D, 1))
    args = strided(args, "beta", (-7, H, 1))
    assert validate_prefill(**args).strides == contiguous_strides(H)
    one_head = make_args(B=2, T=T, H=1)
    one_head = strided(one_head, "g", (T * D, D, 999, 1))
    one_head = strided(one_head, "beta", (T, 1, 5))
    assert validate_prefill(**one_head).strides == contiguous_strides(1)


def test_one_token_per_batch_row_uses_the_batch_stride():
    """[B, 1, H, 128]: the B tokens are rows B apart, so the token stride is the batch stride."""
    args = make_args(B=3, T=1, H=2)
    args = strided(args, "q", (4 * 2 * D, 7, D, 1))
    p = validate_prefill(**args)
    assert p.strides[:2] == (4 * 2 * D, D)
    with pytest.raises(ValueError, match=r"^q: token stride 260 is not a multiple of 8 elements \(16-byte rows\)"):
        validate_prefill(**strided(args, "q", (260, 7, D, 1)))


def test_zero_strides_broadcast_an_input():
    args = strided(make_args(B=1, T=16, H=2), "k", (0, 0, 0, 1))
    assert validate_prefill(**args).strides[2:4] == (0, 0)


@pytest.mark.parametrize("name", ["q", "k", "v", "g"])
def test_token_and_head_strides_are_16_byte_multiples(name):
    args = make_args(B=1, T=16, H=2)
    with pytest.raises(ValueError, match=rf"^{name}: token stride 100 is not a multiple of 8 elements \(16-byte rows\)"):
        validate_prefill(**strided(args, name, (1600, 100, D, 1)))
    with pytest.raises(ValueError, match=rf"^{name}: head stride 132 is not a multiple of 8 elements"):
        validate_prefill(**strided(args, name, (16 * 512, 512, 132, 1)))


def test_fp32_log_decay_g_takes_4_element_multiples():
    args = make_args(B=1, T=16, H=2)
    args.update(A_log=None, dt_bias=None, lower_bound=None, gate="log_decay")
    g = dataclasses.replace(args["g"], dtype="float32")
    args["g"] = dataclasses.replace(g, strides=(16 * 260, 260, D, 1))
    assert validate_prefill(**args).strides[6:8] == (260, D)
    args["g"] = dataclasses.replace(g, strides=(16 * 258, 258, D, 1))
    with pytest.raises(ValueError, match=r"^g: token stride 258 is not a multiple of 4 elements \(16-byte rows\)"):
        validate_prefill(**args)


@pytest.mark.parametrize("name", ["q", "k", "v", "g"])
def test_the_head_dim_stride_is_one(name):
    with pytest.raises(ValueError, match=rf"^{name}: the last \(head dim\) stride must be 1"):
        validate_prefill(**strided(make_args(B=1, T=16, H=2), name, (16 * 512, 512, 256, 2)))


@pytest.mark.parametrize("name, strides, what", [
    ("q", (64 * 512, -512, D, 1), "token"), ("k", (64 * 512, 512, -D, 1), "head"),
    ("beta", (64 * 2, -2, 1), "token"), ("v", (-64 * 512, 512, D, 1), "batch"),
])
def test_negative_strides_are_refused(name, strides, what):
    args = make_args(B=2, T=64, H=4 if name == "v" else 2)
    with pytest.raises(ValueError, match=rf"^{name}: negative {what} stride"):
        validate_prefill(**strided(args, name, strides))


def test_batches_must_be_one_run_of_tokens():
    B, T, H = 2, 64, 2
    args = make_args(B=B, T=T, H=H)
    with pytest.raises(ValueError, match=r"^v: batch stride 40000 is not T \* token stride \(64 \* 256 = 16384\)"):
        validate_prefill(**strided(args, "v", (40000, H * D, D, 1)))
    with pytest.raises(ValueError, match=r"^beta: batch stride 200 is not T \* token stride"):
        validate_prefill(**strided(args, "beta", (200, 3, 1)))


def test_beta_takes_any_token_stride_and_adjacent_heads():
    args = make_args(B=1, T=16, H=3)
    assert validate_prefill(**strided(args, "beta", (16 * 7, 7, 1))).strides[8] == 7
    with pytest.raises(ValueError, match=r"^beta: head stride 2 must be 1"):
        validate_prefill(**strided(args, "beta", (16 * 7, 7, 2)))


@pytest.mark.parametrize("name, shape, strides", [
    ("out", (2, 64, 4, D), (64 * 1024, 1024, D, 1)),
    ("initial_state", (2, 4, D, D), (8 * D * D, D * D, D, 1)),
    ("cu_seqlens", (3,), (2,)),
    ("A_log", (4,), (2,)),
])
def test_the_other_tensors_stay_contiguous(name, shape, strides):
    args = make_args(B=1 if name == "cu_seqlens" else 2, initial="float32", cu=3 if name == "cu_seqlens" else None)
    args = replace(args, name, shape=shape, strides=strides)
    with pytest.raises(ValueError, match=rf"^{name}: must be contiguous"):
        validate_prefill(**args)


def test_layout_errors_come_after_shape_errors_and_before_values():
    args = strided(make_args(B=1, T=16, H=2), "q", (16 * 512, 100, D, 1))
    with pytest.raises(ValueError, match=r"^k: expected shape"):
        validate_prefill(**replace(args, "k", shape=(1, 16, 3, D)))
    with pytest.raises(ValueError, match=r"^q: token stride 100"):
        validate_prefill(**dict(args, lower_bound=1.0))


def test_extent_of_a_strided_view_ends_at_its_last_element():
    q = desc("q", (1, 10, 2, D), "bfloat16", strides=(0, 1000, D, 1))
    assert extent_bytes(q) == (9 * 1000 + D + D - 1 + 1) * 2
    assert extent_bytes(desc("k", (1, 0, 2, D), "bfloat16", strides=(0, 1000, D, 1))) == 0


def test_an_output_in_the_gaps_of_a_strided_input_is_refused():
    """out placed between q's rows (inside its span, not on its elements) is refused like any
    overlap; right after q's last element it is accepted."""
    T, H = 16, 1
    args = make_args(B=1, T=T, H=H)
    q = dataclasses.replace(args["q"], strides=(T * 4 * D, 4 * D, D, 1))
    out_ptr = q.ptr + D * 2  # the gap after q's first row
    args = dict(args, q=q, out=dataclasses.replace(args["out"], ptr=out_ptr))
    with pytest.raises(ValueError, match=r"^out: memory overlaps q"):
        validate_prefill(**args)
    assert extent_bytes(q) % 16 == 0
    args["out"] = dataclasses.replace(args["out"], ptr=q.ptr + extent_bytes(q))
    validate_prefill(**args)


# --------------------------------------------------------------------------------------------
# Checkpoints at given offsets

def ck_args(N=3, H=2, K=None, offsets_dtype="int32", state="float32", pool=False, slots=False, T=64, **kw):
    """Valid varlen args with checkpoint_offsets [N] (K None) or [N, K] and its destination."""
    args = make_args(B=1, T=T, H=H, cu=N + 1, cu_dtype="int32", **kw)
    oshape = (N,) if K is None else (N, K)
    args["checkpoint_offsets"] = desc("checkpoint_offsets", oshape, offsets_dtype)
    if pool:
        args["state_pool"] = desc("state_pool", (5, H, D, D), state or "float32")
        args["state_indices"] = desc("state_indices", (N,), "int32")
    if slots:
        args["checkpoint_slots"] = desc("checkpoint_slots", oshape, "int32")
    else:
        sshape = (N, H, D, D) if K is None else (N, K, H, D, D)
        args["checkpoint_state"] = desc("checkpoint_state", sshape, state)
    return args


@pytest.mark.parametrize("K, k", [(None, 1), (1, 1), (2, 2)])
@pytest.mark.parametrize("offsets_dtype", ["int32", "int64"])
def test_buffer_checkpoints_problem_fields(K, k, offsets_dtype):
    p = validate_prefill(**ck_args(K=K, offsets_dtype=offsets_dtype, state="bfloat16"))
    assert (p.checkpoint_k, p.checkpoint_into, p.checkpoint_offsets_dtype) == (k, "buffer", offsets_dtype)
    assert p.state_dtype == "bfloat16", "with no other state, checkpoint_state decides the state dtype"
    assert p.checkpoint_every == 0 and not p.pooled


@pytest.mark.parametrize("K", [None, 2])
def test_pool_slot_checkpoints_problem_fields(K):
    p = validate_prefill(**ck_args(K=K, pool=True, slots=True, state="bfloat16"))
    assert (p.checkpoint_k, p.checkpoint_into, p.checkpoint_offsets_dtype) == (K or 1, "pool", "int32")
    assert p.pooled and p.state_dtype == "bfloat16"


def test_buffer_checkpoints_with_a_pool_and_dense_input():
    p = validate_prefill(**ck_args(K=2, pool=True, state="float32"))
    assert p.checkpoint_into == "buffer" and p.pooled
    args = make_args(B=2, T=32, H=2)
    args.update(checkpoint_offsets=desc("checkpoint_offsets", (2,), "int64"),
                checkpoint_state=desc("checkpoint_state", (2, 2, D, D), "float32"))
    assert validate_prefill(**args).checkpoint_k == 1


def test_no_checkpoint_fields_without_offsets():
    p = validate_prefill(**make_args())
    assert (p.checkpoint_k, p.checkpoint_into, p.checkpoint_offsets_dtype) == (0, None, None)


def test_offsets_need_exactly_one_destination():
    args = ck_args()
    with pytest.raises(ValueError, match=r"^checkpoint_offsets: needs a destination"):
        validate_prefill(**dict(args, checkpoint_state=None))
    both = ck_args(pool=True)
    both["checkpoint_slots"] = desc("checkpoint_slots", (3,), "int32")
    with pytest.raises(ValueError, match=r"^checkpoint_offsets: takes one destination"):
        validate_prefill(**both)


@pytest.mark.parametrize("name", ["checkpoint_state", "checkpoint_slots"])
def test_a_destination_needs_offsets(name):
    args = ck_args(pool=True, slots=name == "checkpoint_slots")
    with pytest.raises(ValueError, match=rf"^{name}: given without checkpoint_offsets"):
        validate_prefill(**dict(args, checkpoint_offsets=None))


def test_slots_need_the_pool():
    args = ck_args(slots=True)
    with pytest.raises(ValueError, match=r"^checkpoint_slots: requires state_pool"):
        validate_prefill(**args)


def test_offsets_exclude_checkpoint_every():
    with pytest.raises(ValueError, match=r"^checkpoint_offsets: cannot be combined with checkpoint_every"):
        validate_prefill(**ck_args(), checkpoint_every=16)


def test_accurate_numerics_are_not_built_with_offsets():
    with pytest.raises(NotImplementedError, match=r"^numerics: 'accurate' with .*checkpoint_offsets"):
        validate_prefill(**ck_args(), numerics="accurate")


@pytest.mark.parametrize("name, dtype", [("checkpoint_offsets", "float32"), ("checkpoint_offsets", "int16"),
                                         ("checkpoint_slots", "int64"), ("checkpoint_state", "float16")])
def test_dtypes(name, dtype):
    args = ck_args(pool=name == "checkpoint_slots", slots=name == "checkpoint_slots")
    with pytest.raises(TypeError, match=rf"^{name}: expected dtype"):
        validate_prefill(**replace(args, name, dtype=dtype))


@pytest.mark.parametrize("other", ["initial_state", "final_state", "state_pool"])
def test_one_state_dtype_per_call(other):
    if other == "state_pool":
        args = ck_args(pool=True, state="float32")
        args = replace(args, "state_pool", dtype="bfloat16")
    else:
        args = ck_args(state="float32", **{other.split("_")[0]: "bfloat16"})
    with pytest.raises(ValueError, match=r"^(checkpoint_state|final_state): dtype .* differs"):
        validate_prefill(**args)


@pytest.mark.parametrize("shape", [(4,), (3, 3), (3, 0), (3, 2, 1), ()])
def test_offsets_shape(shape):
    with pytest.raises(ValueError, match=r"^checkpoint_offsets: expected shape \(3,\) \[N\] or \(3, K\)"):
        validate_prefill(**replace(ck_args(), "checkpoint_offsets", shape=shape))


def test_slots_shape_follows_the_offsets():
    args = ck_args(K=2, pool=True, slots=True)
    with pytest.raises(ValueError, match=r"^checkpoint_slots: expected shape \(3, 2\) like checkpoint_offsets"):
        validate_prefill(**replace(args, "checkpoint_slots", shape=(3,)))


@pytest.mark.parametrize("K, bad", [(None, (3, 1, 2, D, D)), (None, (3, 3, D, D)), (1, (3, 2, D, D)),
                                    (2, (3, 1, 2, D, D)), (2, (3, 2, 2, D, 64))])
def test_state_shape_follows_the_offsets(K, bad):
    with pytest.raises(ValueError, match=r"^checkpoint_state: expected shape"):
        validate_prefill(**replace(ck_args(K=K), "checkpoint_state", shape=bad))


def test_empty_batch_of_sequences():
    args = make_args(B=0, T=16, H=2)
    args.update(checkpoint_offsets=desc("checkpoint_offsets", (0, 2), "int32"),
                checkpoint_state=desc("checkpoint_state", (0, 2, 2, D, D), "float32"))
    assert validate_prefill(**args).checkpoint_k == 2


@pytest.mark.parametrize("name", CHECKPOINT_ARGS)
def test_device(name):
    args = ck_args(pool=name == "checkpoint_slots", slots=name == "checkpoint_slots")
    with pytest.raises(TypeError, match=rf"^{name}: expected a CUDA device tensor"):
        validate_prefill(**replace(args, name, device="cpu", device_id=-1))
    with pytest.raises(ValueError, match=rf"^{name}: on cuda:1, but q is on cuda:0"):
        validate_prefill(**replace(args, name, device_id=1))


def test_checkpoint_state_is_written_the_offsets_and_slots_are_read():
    args = ck_args()
    with pytest.raises(ValueError, match=r"^checkpoint_state: the producer marked this tensor read-only"):
        validate_prefill(**replace(args, "checkpoint_state", readonly=True))
    validate_prefill(**replace(args, "checkpoint_offsets", readonly=True))
    pooled = ck_args(pool=True, slots=True)
    validate_prefill(**replace(pooled, "checkpoint_slots", readonly=True))


@pytest.mark.parametrize("name, shape, strides", [
    ("checkpoint_state", (3, 2, D, D), (2 * D * D, D * D, 1, D)),
    ("checkpoint_offsets", (3,), (2,)),
    ("checkpoint_slots", (3,), (2,)),
])
def test_checkpoint_buffers_are_contiguous(name, shape, strides):
    args = ck_args(pool=name == "checkpoint_slots", slots=name == "checkpoint_slots")
    with pytest.raises(ValueError, match=rf"^{name}: must be contiguous"):
        validate_prefill(**replace(args, name, shape=shape, strides=strides))


def test_alignment_table():
    assert ALIGNMENT["checkpoint_state"] == {"bfloat16": 16, "float32": 16}
    assert ALIGNMENT["checkpoint_offsets"] == {"int32": 4, "int64": 8}
    assert ALIGNMENT["checkpoint_slots"] == {"int32": 4}


@pytest.mark.parametrize("name, dtype, offset, align", [
    ("checkpoint_state", "float32", 8, 16), ("checkpoint_state", "bfloat16", 2, 16),
    ("checkpoint_offsets", "int32", 2, 4), ("checkpoint_offsets", "int64", 4, 8), ("checkpoint_slots", "int32", 2, 4),
])
def test_alignment(name, dtype, offset, align):
    args = ck_args(pool=name == "checkpoint_slots", slots=name == "checkpoint_slots",
                   offsets_dtype=dtype if name == "checkpoint_offsets" else "int32",
                   state=dtype if name == "checkpoint_state" else "float32")
    with pytest.raises(ValueError, match=rf"^{name}: data pointer .* not {align}-byte aligned"):
        validate_prefill(**replace(args, name, ptr=args[name].ptr + offset))


@pytest.mark.parametrize("other", ["q", "beta", "cu_seqlens", "checkpoint_offsets", "initial_state"])
def test_checkpoint_state_overlaps_no_input(other):
    args = ck_args(initial="float32")
    with pytest.raises(ValueError, match=rf"^checkpoint_state: memory overlaps {other}"):
        validate_prefill(**replace(args, "checkpoint_state", ptr=args[other].ptr))


@pytest.mark.parametrize("other", ["out", "final_state", "state_pool"])
def test_checkpoint_state_overlaps_no_output(other):
    args = ck_args(pool=other == "state_pool", final="float32" if other == "final_state" else None)
    with pytest.raises(ValueError, match=rf"^checkpoint_state: memory overlaps {other}"):
        validate_prefill(**replace(args, "checkpoint_state", ptr=args[other].ptr))


@pytest.mark.parametrize("name", ["checkpoint_offsets", "checkpoint_slots"])
def test_outputs_do_not_overlap_the_offsets_or_slots(name):
    args = ck_args(pool=True, slots=True)
    with pytest.raises(ValueError, match=rf"^out: memory overlaps {name}"):
        validate_prefill(**replace(args, "out", ptr=args[name].ptr))
    with pytest.raises(ValueError, match=rf"^state_pool: memory overlaps {name}"):
        validate_prefill(**replace(args, "state_pool", ptr=args[name].ptr))


def test_offsets_and_slots_may_share_memory():
    """Both are read only, like two inputs."""
    args = ck_args(pool=True, slots=True)
    validate_prefill(**replace(args, "checkpoint_slots", ptr=args["checkpoint_offsets"].ptr))


def test_phases_order_the_checkpoint_errors():
    args = ck_args()
    # kinds and pairing before device, device before dtype, dtype before shape, shape before layout
    with pytest.raises(ValueError, match=r"^checkpoint_offsets: needs a destination"):
        validate_prefill(**replace(dict(args, checkpoint_state=None), "checkpoint_offsets", device="cpu"))
    with pytest.raises(TypeError, match=r"^checkpoint_offsets: expected a CUDA device"):
        validate_prefill(**replace(replace(args, "checkpoint_offsets", device="cpu", dtype="float32"),
                                   "checkpoint_state", dtype="float16"))
    with pytest.raises(TypeError, match=r"^checkpoint_state: expected dtype"):
        validate_prefill(**replace(replace(args, "checkpoint_state", dtype="float16"), "checkpoint_offsets",
                                   shape=(9,)))
    with pytest.raises(ValueError, match=r"^checkpoint_offsets: expected shape"):
        validate_prefill(**replace(replace(args, "checkpoint_offsets", shape=(9,)), "checkpoint_state",
                                   ptr=args["checkpoint_state"].ptr + 4))
    with pytest.raises(TypeError, match=r"^checkpoint_state: expected a TensorDesc"):
        validate_prefill(**dict(args, checkpoint_state=[1, 2]))


# --------------------------------------------------------------------------------------------
# The pointer vector, the call plan and the plan key

def test_pointer_vector_order():
    ck = program.INPUTS.index("checkpoint_index")
    assert program.INPUTS[ck + 1:] == ("checkpoint_state", "checkpoint_offsets", "checkpoint_slots", "segment_ids",
                                       "workspace", "stream")
    assert program.INPUTS == arguments.TENSOR_ARGS + ("stream",)


def test_call_plan_writes_the_checkpoint_state_and_reads_offsets_and_slots(monkeypatch):
    class FakeLaunch:
        workspace_bytes = 0

    monkeypatch.setattr(call_plan.launcher, "serial_launch", lambda lib, problem, sms, vs: FakeLaunch())
    args = ck_args(pool=True, K=2)
    args["checkpoint_slots"] = None
    problem = validate_prefill(**dict(args, cp="off"))
    names = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "out", "cu_seqlens", "state_pool", "state_indices",
             "checkpoint_state", "checkpoint_offsets")
    given = {n: n in names for n in arguments.TENSOR_ARGS}
    nbytes = {n: extent_bytes(args[n]) if n in names else 0 for n in arguments.TENSOR_ARGS}
    alignment = {n: ALIGNMENT[n][args[n].dtype] for n in names}
    plan = call_plan.build(None, problem, lengths=None, sm_count=132, value_split=None, given=given,
                           nbytes=nbytes, alignment=alignment)
    slot = program.SLOT
    assert (slot["checkpoint_state"], nbytes["checkpoint_state"]) in plan.written
    assert (slot["checkpoint_offsets"], nbytes["checkpoint_offsets"]) in plan.read
    ptrs = [args[n].ptr if n in names else 0 for n in arguments.TENSOR_ARGS]
    plan.check_pointers(ptrs)
    ptrs[slot["checkpoint_state"]] = args["q"].ptr + 64
    with pytest.raises(call_plan.UnsafePointers):
        plan.check_pointers(ptrs)
    ptrs[slot["checkpoint_state"]] = args["checkpoint_state"].ptr + 8
    with pytest.raises(call_plan.UnsafePointers):  # 16-byte alignment
        plan.check_pointers(ptrs)


def test_workspace_size_for_takes_the_checkpoint_count():
    import kda_aot

    for bad in (3, -1, True, 1.0):
        with pytest.raises(ValueError, match=r"^checkpoint_k: expected 0, 1 or 2"):
            kda_aot.workspace_size_for(64, 2, checkpoint_k=bad)
    with pytest.raises(ValueError, match=r"^checkpoint_k: cannot be combined with checkpoint_every"):
        kda_aot.workspace_size_for(64, 2, checkpoint_k=1, checkpoint_every=16)


def test_torch_signature_carries_the_strides_of_a_non_contiguous_tensor():
    """Two calls that differ only in a stride never share a plan; contiguous tensors keep the
    cheap signature (True, not their strides)."""
    torch = pytest.importorskip("torch")
    T, H = 16, 2
    base = torch.empty(1, T, 3 * H, D, dtype=torch.bfloat16)
    wider = torch.empty(1, T, 4 * H, D, dtype=torch.bfloat16)
    plain = torch.empty(1, T, H, D, dtype=torch.bfloat16)
    beta = torch.empty(1, T, H, dtype=torch.bfloat16)

    def sig(q):
        tensors = (q, plain, plain, plain, beta) + (None,) * (len(arguments.TENSOR_ARGS) - 5)
        return arguments.torch_intake(torch.Tensor, tensors)[0]

    a, b = sig(base[:, :, :H]), sig(wider[:, :, :H])
    assert a != b and a[0][2] == base[:, :, :H].stride() and b[0][2] == wider[:, :, :H].stride()
    assert sig(base[:, :, :H]) == a, "the same layout keys the same plan"
    assert sig(plain)[0][2] is True
    assert sig(plain) != a


# --------------------------------------------------------------------------------------------
# Front ends

def _torch():
    return pytest.importorskip("torch")


@pytest.fixture
def stand_in(monkeypatch):
    _torch()
    from torch_stand_ins import StandIn

    fake = StandIn()
    monkeypatch.setattr(api, "prefill", fake)
    return fake


def test_flashkda_fwd_passes_checkpoints_and_strided_views_through(stand_in):
    torch = _torch()
    from kda_aot import flashkda_compat as fk
    from kda_aot import reference

    x = reference.make_inputs([20, 12], 2, seed=3, state="fp32")
    T, H = x["q"].shape[1], 2
    wide = torch.zeros(1, T, 4 * H, D, dtype=torch.bfloat16)
    q = wide[:, :, :H]
    q.copy_(x["q"])
    offsets = torch.tensor([[16, 0], [0, 0]], dtype=torch.int64)
    ck = torch.empty(2, 2, H, D, D)
    out = torch.empty_like(x["q"])
    fk.fwd(q, x["k"], x["v"], x["g"], x["beta"], 0.1, out, x["A_log"], x["dt_bias"], -5.0,
           initial_state=x["initial_state"], cu_seqlens=x["cu_seqlens"].long(), checkpoint_state=ck,
           checkpoint_offsets=offsets)
    call = stand_in.calls[-1]
    assert call["q"] is q and not q.is_contiguous(), "the strided view reaches prefill as it is"
    assert call["checkpoint_offsets"] is offsets and call["checkpoint_state"] is ck


def test_flashkda_op_declares_checkpoint_state_written_and_runs_without_it(stand_in):
    torch = _torch()
    from kda_aot import flashkda_compat as fk
    from kda_aot import reference

    x = reference.make_inputs([10, 6], 2, seed=4, state="fp32")
    out = torch.empty_like(x["q"])
    v0 = out._version
    fk.FLASHKDA_FWD(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.1, out, None, x["A_log"], x["dt_bias"], -5.0,
                    x["initial_state"], None, x["cu_seqlens"].long())  # trailing written arguments left out
    assert out._version > v0
    assert stand_in.calls[-1]["checkpoint_state"] is None


def test_version_bump_of_omitted_trailing_written_arguments():
    """The kernel bump_written_versions installs (on torch releases whose own bump indexes the
    arguments as passed): a trailing optional written argument may be left out, and a given one
    has its version bumped."""
    torch = _torch()
    from kda_aot import _torch_ops

    @torch.library.custom_op("kda_aot_test::trailing_written", mutates_args=("out", "extra"))
    def op(x: torch.Tensor, out: torch.Tensor, extra: Optional[torch.Tensor] = None, flag: bool = False) -> None:
        out.copy_(x)
        if extra is not None:
            extra.fill_(1.0)

    @op.register_fake
    def _(x, out, extra=None, flag=False):
        return None

    _torch_ops.bump_written_versions(op, force=True)
    x, out, extra = torch.ones(3), torch.zeros(3), torch.zeros(2)
    v_out, v_extra = out._version, extra._version
    torch.ops.kda_aot_test.trailing_written(x, out)
    assert out._version > v_out and torch.equal(out, x)
    torch.ops.kda_aot_test.trailing_written(x, out, extra)
    assert extra._version > v_extra and bool((extra == 1).all())
    result = torch.library.opcheck(op, (x, out), dict(extra=extra))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_torch_prefill_routes_the_checkpoints(stand_in):
    torch = _torch()
    import kda_aot.torch as kt
    from kda_aot import reference

    x = reference.make_inputs([16, 16], 2, seed=5, state=None)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    offsets = torch.tensor([16, 0], dtype=torch.int32)
    ck = torch.empty(2, 2, D, D)
    o, final = kt.prefill(*args, A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"],
                          checkpoint_offsets=offsets, checkpoint_state=ck, output_final_state=True)
    call = stand_in.calls[-1]
    assert call["checkpoint_offsets"] is offsets and call["checkpoint_state"] is ck
    assert call["out"] is o and final.dtype == ck.dtype, "the allocated final state takes the call's state dtype"
    with pytest.raises(ValueError, match=r"^checkpoint_slots: requires state_pool"):
        kt.prefill(*args, A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"],
                   checkpoint_offsets=offsets, checkpoint_slots=offsets)


def test_torch_ops_fakes_take_the_checkpoints():
    torch = _torch()
    import kda_aot.torch as kt
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(1, 32, 2, D, dtype=torch.bfloat16)
        beta = torch.empty(1, 32, 2, dtype=torch.bfloat16)
        A_log, dt_bias = torch.empty(2), torch.empty(2, D)
        cu = torch.tensor([0, 16, 32], dtype=torch.int32)
        offsets = torch.empty(2, 2, dtype=torch.int32)
        ck = torch.empty(2, 2, 2, D, D)
        pool, idx = torch.empty(4, 2, D, D), torch.empty(2, dtype=torch.int32)
        assert kt.PREFILL_OUT(q, q, q, q, beta, A_log, dt_bias, torch.empty_like(q), None, None, None, None, None,
                              cu, None, None, "off", "flashkda", "safe", "logits", False, offsets, ck) is None
        o = kt.PREFILL_POOL(q, q, q, q, beta, A_log, dt_bias, pool, idx, None, None, cu, None, None, "off", "safe",
                            "logits", False, offsets, None, offsets)
        assert o.shape == q.shape
