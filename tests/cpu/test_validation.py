"""CPU tests of the validation wall (kda_aot.intake.validation); no GPU needed.

Tensors are hand-built TensorDescs with contiguous strides and fake, well-aligned, disjoint
device pointers; each bad-input test changes one argument and checks the exception type and
that the message starts with the argument's name.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from kda_aot.intake.tensors import TensorDesc
from kda_aot.intake.validation import (
    ALIGNMENT,
    DEFAULT_SCALE,
    Problem,
    as_float32,
    check_cu_seqlens_host,
    check_cu_seqlens_values,
    check_seq_lens,
    parse_cp,
    validate_prefill,
)

ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8}
_next_ptr = itertools.count(1)


def strides_of(shape):
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def desc(name, shape, dtype, *, device="cuda", device_id=0, ptr=None, strides=None):
    """A contiguous tensor description at a fresh 1 MiB-spaced (so 16-byte aligned) fake address."""
    shape = tuple(shape)
    if ptr is None:
        ptr = 0x7F00_0000_0000 + next(_next_ptr) * (1 << 30)
    return TensorDesc(name=name, ptr=ptr, shape=shape,
                      strides=strides_of(shape) if strides is None else tuple(strides),
                      dtype=dtype, device=device, device_id=device_id)


def make_args(B=2, T=64, H=4, *, cu=None, cu_dtype="int64", initial=None, final=None,
              out=True, dt_flat=False, device_id=0):
    """Valid keyword arguments for validate_prefill. initial/final: None or a state dtype."""
    d = lambda name, shape, dtype: desc(name, shape, dtype, device_id=device_id)  # noqa: E731
    if cu is not None:
        B = 1
    N = B if cu is None else cu - 1
    x = (B, T, H, 128)
    return dict(
        q=d("q", x, "bfloat16"), k=d("k", x, "bfloat16"), v=d("v", x, "bfloat16"),
        g=d("g", x, "bfloat16"), beta=d("beta", (B, T, H), "bfloat16"),
        A_log=d("A_log", (H,), "float32"),
        dt_bias=d("dt_bias", (H * 128,) if dt_flat else (H, 128), "float32"),
        lower_bound=-5.0, scale=None,
        initial_state=None if initial is None else d("initial_state", (N, H, 128, 128), initial),
        final_state=None if final is None else d("final_state", (N, H, 128, 128), final),
        cu_seqlens=None if cu is None else d("cu_seqlens", (cu,), cu_dtype),
        out=d("out", x, "bfloat16") if out else None,
        cp="off",
    )


def replace(args, name, **changes):
    """args with tensor `name` rebuilt with some fields changed (shape also resets strides)."""
    old = args[name]
    if "shape" in changes and "strides" not in changes:
        changes["strides"] = strides_of(changes["shape"])
    return {**args, name: dataclasses.replace(old, **changes)}


ALL_TENSORS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "out",
               "initial_state", "final_state", "cu_seqlens")


def full_args(**kw):
    """Valid varlen args with every optional tensor present, so each can be broken in turn."""
    return make_args(cu=3, initial="float32", final="float32", **kw)


# --------------------------------------------------------------------------------------------
# Valid problems

STATE_COMBOS = [
    (None, None, None),
    ("bfloat16", None, "bfloat16"),
    ("float32", None, "float32"),
    (None, "bfloat16", "bfloat16"),
    (None, "float32", "float32"),
    ("bfloat16", "bfloat16", "bfloat16"),
    ("float32", "float32", "float32"),
]


@pytest.mark.parametrize("initial,final,state_dtype", STATE_COMBOS)
def test_valid_dense(initial, final, state_dtype):
    p = validate_prefill(**make_args(B=2, T=64, H=4, initial=initial, final=final))
    assert p == Problem(B=2, T=64, H=4, N=2, varlen=False, cu_dtype=None, state_dtype=state_dtype,
                        has_initial=initial is not None, has_final=final is not None,
                        scale=DEFAULT_SCALE, lower_bound=-5.0, device_id=0, cp="off",
                        strides=(4 * 128, 128) * 4 + (4,))


@pytest.mark.parametrize("cu_dtype", ["int32", "int64"])
@pytest.mark.parametrize("initial,final,state_dtype", STATE_COMBOS)
def test_valid_varlen(cu_dtype, initial, final, state_dtype):
    args = make_args(T=100, H=2, cu=4, cu_dtype=cu_dtype, initial=initial, final=final)
    p = validate_prefill(**args)
    assert (p.B, p.T, p.H, p.N) == (1, 100, 2, 3)
    assert p.varlen and p.cu_dtype == cu_dtype
    assert p.state_dtype == state_dtype
    assert (p.has_initial, p.has_final) == (initial is not None, final is not None)


def test_valid_options():
    args = make_args(dt_flat=True, out=False, device_id=1)
    args.update(scale=0.25, lower_bound=-0.5, cp="auto")
    p = validate_prefill(**args)
    assert (p.scale, p.lower_bound, p.device_id, p.cp) == (0.25, -0.5, 1, "auto")


def test_valid_int_scalars():
    p = validate_prefill(**{**make_args(), "scale": 1, "lower_bound": -5, "cp": 4})
    assert (p.scale, p.lower_bound, p.cp) == (1.0, -5.0, 4)
    assert isinstance(p.scale, float) and isinstance(p.lower_bound, float)


@pytest.mark.parametrize("B,T,H", [(0, 64, 4), (2, 0, 4), (2, 64, 0), (0, 0, 0)])
def test_empty_work_is_valid(B, T, H):
    p = validate_prefill(**make_args(B=B, T=T, H=H, initial="float32", final="float32"))
    assert (p.B, p.T, p.H) == (B, T, H)


def test_empty_varlen_is_valid():
    p = validate_prefill(**make_args(T=0, cu=2, final="float32"))
    assert (p.T, p.N) == (0, 1)


def test_empty_tensors_skip_alignment_and_aliasing():
    # Empty tensors may carry any pointer (e.g. 0 or 1): nothing is read or written.
    args = make_args(B=0)
    for name in ("q", "k", "v", "g", "beta", "out"):
        args = replace(args, name, ptr=1)
    validate_prefill(**args)


@pytest.mark.parametrize("cu_dtype,cu_offset", [("int32", 4), ("int64", 8)])
def test_small_vectors_accept_offsets_of_their_alignment(cu_dtype, cu_offset):
    # beta is read in bf16 pairs (2 bytes), A_log per float, cu_seqlens per entry.
    args = make_args(cu=3, cu_dtype=cu_dtype)
    for name, offset in (("beta", 2), ("A_log", 4), ("cu_seqlens", cu_offset)):
        args = replace(args, name, ptr=args[name].ptr + offset)
    validate_prefill(**args)


# --------------------------------------------------------------------------------------------
# Kinds and devices

@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta", "A_log", "dt_bias"])
def test_required_tensor_missing(name):
    with pytest.raises(TypeError, match=f"^{name}: .*required"):
        validate_prefill(**{**make_args(), name: None})


@pytest.mark.parametrize("name", ALL_TENSORS)
def test_not_a_tensor_desc(name):
    with pytest.raises(TypeError, match=f"^{name}: expected a TensorDesc"):
        validate_prefill(**{**full_args(), name: [1, 2, 3]})


@pytest.mark.parametrize("name", ALL_TENSORS)
def test_not_cuda(name):
    args = replace(full_args(), name, device="cpu", device_id=-1)
    with pytest.raises(TypeError, match=f"^{name}: expected a CUDA device tensor"):
        validate_prefill(**args)


@pytest.mark.parametrize("name", [n for n in ALL_TENSORS if n != "q"])
def test_other_device(name):
    args = replace(full_args(), name, device_id=1)
    with pytest.raises(ValueError, match=f"^{name}: on cuda:1, but q is on cuda:0"):
        validate_prefill(**args)


@pytest.mark.parametrize("name", ["out", "final_state"])
def test_read_only_output_is_refused(name):
    args = replace(full_args(), name, readonly=True)
    with pytest.raises(ValueError, match=f"^{name}: the producer marked this tensor read-only"):
        validate_prefill(**args)


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state",
                                  "cu_seqlens"])
def test_read_only_input_is_fine(name):
    validate_prefill(**replace(full_args(), name, readonly=True))


def test_read_only_is_part_of_the_description():
    # Two views of the same memory, one read-only: not the same argument (cached validation
    # keyed by descriptions must not confuse them).
    d = full_args()["out"]
    assert d != dataclasses.replace(d, readonly=True)


def test_real_cpu_torch_tensor_is_rejected():
    torch = pytest.importorskip("torch")
    from kda_aot.intake.tensors import describe

    args = make_args(B=1, T=16, H=2)
    args["q"] = describe(torch.zeros(1, 16, 2, 128, dtype=torch.bfloat16), "q")
    assert args["q"].device == "cpu"
    with pytest.raises(TypeError, match="^q: expected a CUDA device tensor"):
        validate_prefill(**args)


# --------------------------------------------------------------------------------------------
# Dtypes

BAD_DTYPES = [
    ("q", "float32"), ("k", "float16"), ("v", "float32"), ("g", "float16"),
    ("beta", "float16"), ("beta", "float64"), ("out", "float32"),
    ("A_log", "bfloat16"), ("dt_bias", "bfloat16"),
    ("initial_state", "float16"), ("final_state", "float64"),
    ("cu_seqlens", "float32"), ("cu_seqlens", "int16"),
]


@pytest.mark.parametrize("name,dtype", BAD_DTYPES)
def test_bad_dtype(name, dtype):
    args = replace(full_args(), name, dtype=dtype)
    with pytest.raises(TypeError, match=f"^{name}: expected dtype .*got {dtype}"):
        validate_prefill(**args)


@pytest.mark.parametrize("name", ALL_TENSORS)
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64",
                                   "complex64", "complex128", "float4_e2m1fn", "bool", "int8"])
def test_unknown_dtype_is_a_type_error(name, dtype):
    args = replace(full_args(), name, dtype=dtype)
    with pytest.raises(TypeError, match=f"^{name}: expected dtype .*got {dtype}"):
        validate_prefill(**args)


def test_state_dtypes_differ():
    args = make_args(initial="bfloat16", final="float32")
    with pytest.raises(ValueError, match="^final_state: dtype float32 differs from initial_state"):
        validate_prefill(**args)


# --------------------------------------------------------------------------------------------
# Shapes

def test_q_not_4d():
    args = replace(make_args(), "q", shape=(2, 64, 512))
    with pytest.raises(ValueError, match=r"^q: expected a 4-D tensor"):
        validate_prefill(**args)


def test_q_head_dim_not_128():
    args = make_args()
    for name in ("q", "k", "g", "out"):
        args = replace(args, name, shape=(2, 64, 4, 64))
    with pytest.raises(ValueError, match=r"^q: only K=V=128"):
        validate_prefill(**args)


def test_k_head_dim_not_128():
    args = replace(make_args(), "k", shape=(2, 64, 4, 64))
    with pytest.raises(ValueError, match=r"^k: expected shape \(2, 64, 4, 128\) like q, "
                                         r"got \(2, 64, 4, 64\).*only K=V=128"):
        validate_prefill(**args)


def test_v_dim_not_128():
    args = replace(make_args(), "v", shape=(2, 64, 4, 256))
    with pytest.raises(ValueError, match=r"^v: only K=V=128"):
        validate_prefill(**args)


def test_gva_not_implemented():
    args = replace(make_args(), "v", shape=(2, 64, 8, 128))
    with pytest.raises(NotImplementedError, match=r"^v: 8 value heads but q has 4"):
        validate_prefill(**args)


@pytest.mark.parametrize("name", ["k", "v", "g", "out"])
@pytest.mark.parametrize("shape", [(2, 63, 4, 128), (1, 64, 4, 128), (2, 64, 4, 128, 1)])
def test_shape_unlike_q(name, shape):
    args = replace(make_args(), name, shape=shape)
    with pytest.raises(ValueError, match=rf"^{name}: expected shape \(2, 64, 4, 128\) like q"):
        validate_prefill(**args)


def test_k_heads_unlike_q():
    args = replace(make_args(), "k", shape=(2, 64, 8, 128))
    with pytest.raises(ValueError, match=r"^k: expected shape"):
        validate_prefill(**args)


@pytest.mark.parametrize("shape", [(2, 64, 4, 1), (2, 64), (2, 64, 5), (128, 4)])
def test_beta_shape(shape):
    args = replace(make_args(), "beta", shape=shape)
    with pytest.raises(ValueError, match=r"^beta: expected shape \(2, 64, 4\)"):
        validate_prefill(**args)


@pytest.mark.parametrize("shape", [(5,), (4, 1), (1, 4), ()])
def test_A_log_shape(shape):
    args = replace(make_args(), "A_log", shape=shape)
    with pytest.raises(ValueError, match=r"^A_log: expected shape \(4,\)"):
        validate_prefill(**args)


@pytest.mark.parametrize("shape", [(4, 64), (4 * 64,), (128, 4), (1, 4, 128), (5, 128)])
def test_dt_bias_shape(shape):
    args = replace(make_args(), "dt_bias", shape=shape)
    with pytest.raises(ValueError, match=r"^dt_bias: expected shape \(4, 128\)"):
        validate_prefill(**args)


@pytest.mark.parametrize("name", ["initial_state", "final_state"])
@pytest.mark.parametrize("shape", [(3, 4, 128, 128), (2, 3, 128, 128), (2, 4, 128, 64),
                                   (2, 4, 128 * 128), (1, 2, 4, 128, 128)])
def test_state_shape_dense(name, shape):
    args = replace(make_args(initial="float32", final="float32"), name, shape=shape)
    with pytest.raises(ValueError, match=rf"^{name}: expected shape \(2, 4, 128, 128\)"):
        validate_prefill(**args)


@pytest.mark.parametrize("name", ["initial_state", "final_state"])
def test_state_shape_varlen_uses_n_sequences(name):
    # With cu_seqlens of 4 entries there are N=3 sequences, not B=1.
    args = replace(make_args(cu=4, initial="bfloat16", final="bfloat16"), name,
                   shape=(1, 4, 128, 128))
    with pytest.raises(ValueError, match=rf"^{name}: expected shape \(3, 4, 128, 128\)"):
        validate_prefill(**args)


def test_cu_seqlens_with_batch_above_one():
    args = make_args(B=2)
    args["cu_seqlens"] = desc("cu_seqlens", (3,), "int32")
    with pytest.raises(ValueError, match=r"^cu_seqlens: .*B == 1.*got B = 2"):
        validate_prefill(**args)


@pytest.mark.parametrize("shape,match", [((3, 1), "1-D"), ((1, 3), "1-D"), ((), "1-D"),
                                         ((1,), "at least 2"), ((0,), "at least 2")])
def test_cu_seqlens_shape(shape, match):
    args = replace(make_args(cu=3), "cu_seqlens", shape=shape)
    with pytest.raises(ValueError, match=rf"^cu_seqlens: .*{match}"):
        validate_prefill(**args)


# --------------------------------------------------------------------------------------------
# Layout

# q, k, v, g and beta may be strided views (their rules: tests/cpu/test_engine_contracts.py)
NON_CONTIGUOUS = {
    "out": ((2, 64, 4, 128), (32768, 512, 128, -1)),
    "A_log": ((4,), (2,)),
    "dt_bias": ((4, 128), (1, 4)),
    "initial_state": ((2, 4, 128, 128), (65536, 16384, 1, 128)),  # [N,H,K,V] seen as [N,H,V,K]
    "final_state": ((2, 4, 128, 128), (65536, 16384, 1, 128)),
    "cu_seqlens": ((3,), (2,)),
}


@pytest.mark.parametrize("name", sorted(NON_CONTIGUOUS))
def test_not_contiguous(name):
    shape, strides = NON_CONTIGUOUS[name]
    args = make_args(B=1 if name in ("beta", "cu_seqlens") else 2, initial="float32",
                     final="float32", cu=3 if name == "cu_seqlens" else None)
    args = replace(args, name, shape=shape, strides=strides)
    with pytest.raises(ValueError, match=f"^{name}: must be contiguous.*nothing is copied"):
        validate_prefill(**args)


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "out", "initial_state", "final_state", "dt_bias"])
@pytest.mark.parametrize("offset", [2, 4, 8])
def test_misaligned_16(name, offset):
    args = full_args()
    args = replace(args, name, ptr=args[name].ptr + offset)
    with pytest.raises(ValueError, match=f"^{name}: data pointer .* not 16-byte aligned.*16-byte"):
        validate_prefill(**args)


@pytest.mark.parametrize("name,dtype,align,offset", [
    ("beta", "bfloat16", 2, 1), ("A_log", "float32", 4, 2), ("cu_seqlens", "int32", 4, 2),
    ("cu_seqlens", "int64", 8, 4), ("cu_seqlens", "int64", 8, 1)])
def test_misaligned_small(name, dtype, align, offset):
    args = replace(full_args(), "cu_seqlens", dtype=dtype) if name == "cu_seqlens" else full_args()
    args = replace(args, name, ptr=args[name].ptr + offset)
    with pytest.raises(ValueError, match=f"^{name}: data pointer .* not {align}-byte aligned"):
        validate_prefill(**args)


def test_alignment_table_is_a_parameter():
    # A manifest may declare other alignments; the wall checks the table it is given.
    args = full_args()
    args = replace(args, "q", ptr=args["q"].ptr + 8)
    table = {**ALIGNMENT, "q": {"bfloat16": 8}}
    validate_prefill(**args, alignment=table)
    with pytest.raises(ValueError, match="^q: data pointer .* not 16-byte aligned"):
        validate_prefill(**args)


# --------------------------------------------------------------------------------------------
# Scalar values and cp

@pytest.mark.parametrize("lb", [0.0, 0.5, -5.000001, -6, -0.0, math.nan, math.inf, -math.inf])
def test_lower_bound_out_of_range(lb):
    with pytest.raises(ValueError, match="^lower_bound: expected a finite value in"):
        validate_prefill(**{**make_args(), "lower_bound": lb})


@pytest.mark.parametrize("lb", ["-1", True, [-1.0]])
def test_lower_bound_not_a_number(lb):
    with pytest.raises(TypeError, match="^lower_bound: expected a float"):
        validate_prefill(**{**make_args(), "lower_bound": lb})


@pytest.mark.parametrize("scale", [0.0, -0.1, -1, math.nan, math.inf])
def test_scale_bad_value(scale):
    with pytest.raises(ValueError, match="^scale: expected a finite positive float"):
        validate_prefill(**{**make_args(), "scale": scale})


@pytest.mark.parametrize("scale", [1e39, 3.5e38, 1e-50, 1e-40, 2.0 ** -127, pytest.param(10 ** 400, id="int-1e400")])
def test_scale_not_a_float32_normal(scale):
    # 1e39 and 3.5e38 round to inf in float32, 1e-50 to 0, 1e-40 and 2**-127 are subnormal.
    with pytest.raises(ValueError, match="^scale: expected a finite positive float that is a normal float32"):
        validate_prefill(**{**make_args(), "scale": scale})


@pytest.mark.parametrize("scale", [3.4e38, 2.0 ** -126, 1e-37, 1e30])
def test_scale_float32_normal_extremes_pass(scale):
    assert validate_prefill(**{**make_args(), "scale": scale}).scale == scale


def test_lower_bound_none_is_the_default_bound():
    assert validate_prefill(**{**make_args(), "lower_bound": None}).lower_bound == -5.0


@pytest.mark.parametrize("lb", [-1e-50, -1e-40, -(2.0 ** -127), pytest.param(-(10 ** 400), id="int-minus-1e400")])
def test_lower_bound_not_a_float32_normal(lb):
    with pytest.raises(ValueError, match="^lower_bound: expected a finite value in"):
        validate_prefill(**{**make_args(), "lower_bound": lb})


def test_as_float32_matches_numpy():
    np = pytest.importorskip("numpy")
    import warnings

    values = [0.1, 1e39, -1e39, 3.4028235e38, 3.40282356e38, 3.4028236e38, 1e-50, 1e-40,
              2.0 ** -126, 2.0 ** -149, 2.0 ** -150, 1.0 + 2.0 ** -24, math.inf, -0.0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns on overflow to inf
        for x in values:
            assert as_float32(x) == float(np.float32(x)), x


@pytest.mark.parametrize("scale", ["0.1", True, (0.1,)])
def test_scale_not_a_number(scale):
    with pytest.raises(TypeError, match="^scale: expected a float or None"):
        validate_prefill(**{**make_args(), "scale": scale})


@pytest.mark.parametrize("cp", [True, False, 0, -1, 1.0, "ON", "force", None])
def test_validate_rejects_bad_cp(cp):
    with pytest.raises(ValueError, match="^cp: "):
        validate_prefill(**{**make_args(), "cp": cp})


@pytest.mark.parametrize("cp,expected", [("off", "off"), ("auto", "auto"), ("on", "on"),
                                         (1, 1), (8, 8)])
def test_parse_cp_valid(cp, expected):
    got = parse_cp(cp)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("cp,suggestion", [(True, '"on"'), (False, '"off"')])
def test_parse_cp_bool_suggests_string(cp, suggestion):
    with pytest.raises(ValueError, match=f"^cp: .*{suggestion}"):
        parse_cp(cp)


@pytest.mark.parametrize("cp", [0, -1, -8, 1.0, 2.5, math.nan, "", "On", "true", "1", None,
                                [1], b"on"])
def test_parse_cp_invalid(cp):
    with pytest.raises(ValueError, match="^cp: "):
        parse_cp(cp)


def test_parse_cp_numpy_int():
    np = pytest.importorskip("numpy")
    assert parse_cp(np.int64(3)) == 3 and type(parse_cp(np.int64(3))) is int
    with pytest.raises(ValueError, match="^cp: "):
        parse_cp(np.bool_(True))


# --------------------------------------------------------------------------------------------
# Aliasing

@pytest.mark.parametrize("output", ["out", "final_state"])
@pytest.mark.parametrize("inp", ["q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state",
                                 "cu_seqlens"])
def test_output_aliases_input(output, inp):
    args = full_args()
    args = replace(args, output, ptr=args[inp].ptr)
    with pytest.raises(ValueError, match=f"^{output}: memory overlaps {inp}"):
        validate_prefill(**args)


def test_out_partially_overlaps_v():
    args = make_args()
    args = replace(args, "out", ptr=args["v"].ptr + args["v"].nbytes - 256)
    with pytest.raises(ValueError, match="^out: memory overlaps v"):
        validate_prefill(**args)


def test_out_adjacent_to_v_is_fine():
    args = make_args()
    args = replace(args, "out", ptr=args["v"].ptr + args["v"].nbytes)
    validate_prefill(**args)


def test_final_state_overlaps_out():
    args = make_args(final="float32")
    args = replace(args, "final_state", ptr=args["out"].ptr + 1024)
    with pytest.raises(ValueError, match="^final_state: memory overlaps out"):
        validate_prefill(**args)


def test_in_place_state_update_is_rejected():
    args = make_args(initial="float32", final="float32")
    args = replace(args, "final_state", ptr=args["initial_state"].ptr)
    with pytest.raises(ValueError, match="^final_state: memory overlaps initial_state"):
        validate_prefill(**args)


# --------------------------------------------------------------------------------------------
# Error order: the most basic problem is reported first

def test_order_device_before_dtype():
    args = replace(make_args(), "k", device="cpu", device_id=-1, dtype="float32",
                   shape=(1, 2, 3))
    with pytest.raises(TypeError, match="^k: expected a CUDA device tensor"):
        validate_prefill(**args)


def test_order_dtype_before_shape():
    args = replace(make_args(), "g", dtype="float32", shape=(1, 2, 3))
    with pytest.raises(TypeError, match="^g: expected dtype bfloat16"):
        validate_prefill(**args)


def test_order_shape_before_layout():
    args = replace(make_args(), "v", shape=(2, 64, 4, 64), strides=(1, 1, 1, 1))
    with pytest.raises(ValueError, match="^v: only K=V=128"):
        validate_prefill(**args)


def test_order_layout_before_values():
    args = replace(make_args(), "q", ptr=make_args()["q"].ptr + 2)
    args["lower_bound"] = 1.0
    with pytest.raises(ValueError, match="^q: data pointer"):
        validate_prefill(**args)


def test_order_values_before_aliasing():
    args = make_args()
    args = replace(args, "out", ptr=args["q"].ptr)
    args["scale"] = -1.0
    with pytest.raises(ValueError, match="^scale: "):
        validate_prefill(**args)


# --------------------------------------------------------------------------------------------
# Host cu_seqlens values

@pytest.mark.parametrize("values,T", [([0, 64], 64), ([0, 32, 32, 64], 64), ([0, 0], 0),
                                      ([0, 0, 0], 0), ([0, 1, 17, 100], 100), ((0, 64), 64)])
def test_cu_values_valid(values, T):
    check_cu_seqlens_values(values, T)


@pytest.mark.parametrize("values,T,match", [
    ([1, 64], 64, "entry 0 must be 0"),
    ([0, 80], 64, r"index 1\) must equal .*T = 64, got 80"),
    ([0, 32, 16, 64], 64, "entry 2 = 16 < entry 1 = 32"),
    ([0, 48, 32, 16, 64], 64, "entry 2 = 32"),
    ([0, 32, 48], 64, r"index 2\) .* got 48"),
    ([0], 0, "at least 2"),
    ([], 0, "at least 2"),
])
def test_cu_values_invalid(values, T, match):
    with pytest.raises(ValueError, match=f"^cu_seqlens: .*{match}"):
        check_cu_seqlens_values(values, T)


@pytest.mark.parametrize("values", [[0, 32.0, 64], [0, True, 64], [0, "32", 64]])
def test_cu_values_must_be_ints(values):
    with pytest.raises(TypeError, match="^cu_seqlens: entry 1"):
        check_cu_seqlens_values(values, 64)


def test_cu_values_numpy():
    np = pytest.importorskip("numpy")
    check_cu_seqlens_values(np.array([0, 32, 32, 64], dtype=np.int32), 64)
    with pytest.raises(ValueError, match="^cu_seqlens: .*entry 2"):
        check_cu_seqlens_values(np.array([0, 32, 16, 64], dtype=np.int64), 64)


# --------------------------------------------------------------------------------------------
# The module stays framework-free

def test_validation_module_imports_no_framework():
    """intake/validation.py with what it imports of the package (library/constants.py, spec/),
    but without the package's __init__ (whose other modules need cuda.core), imports no framework,
    so the wall can run and be tested anywhere. The package is stood in for by an empty module with
    the package's path, so validation's relative imports resolve to the real files. Only what the import
    itself brings in counts: site hooks may load packages at interpreter start (cuda-bindings 12.9
    installs a .pth that imports its module redirector)."""
    import subprocess
    import sys
    from pathlib import Path

    import kda_aot.intake.validation as mod

    package_dir = str(Path(mod.__file__).parents[1])
    code = ("import importlib, sys, types; "
            "pkg = types.ModuleType('kda_aot'); "
            f"pkg.__path__ = [{package_dir!r}]; "
            "sys.modules['kda_aot'] = pkg; "
            "before = set(sys.modules); "
            "importlib.import_module('kda_aot.intake.validation'); "
            "bad = sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
            "('torch', 'cuda', 'numpy', 'cupy', 'jax')); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


# --------------------------------------------------------------------------------------------
# Host lengths: seq_lens= and cu_seqlens_cpu=

@pytest.mark.parametrize("seq_lens,n_seq,T", [([64], 1, 64), ((0, 32, 32), 3, 64), ([0, 0], 2, 0)])
def test_seq_lens_valid(seq_lens, n_seq, T):
    got = check_seq_lens(seq_lens, n_seq, T)
    assert got == tuple(seq_lens) and all(type(x) is int for x in got)


def test_seq_lens_numpy_and_torch():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    assert check_seq_lens(np.array([3, 5], dtype=np.int32), 2, 8) == (3, 5)
    assert check_seq_lens(torch.tensor([3, 5]), 2, 8) == (3, 5)
    assert check_seq_lens([np.int64(3), 5], 2, 8) == (3, 5)


@pytest.mark.parametrize("seq_lens,exc,match", [
    ([32, 32.0], TypeError, "entry 1 must be an int"),
    ([True, 63], TypeError, "entry 0 is a bool"),
    ([32, "32"], TypeError, "entry 1 must be an int"),
    ("64", TypeError, "expected a list"),
    (64, TypeError, "expected a list"),
    ([64, 0], ValueError, "expected 1 lengths"),
    ([], ValueError, "expected 1 lengths"),
    ([-1], ValueError, "entry 0 must be >= 0"),
    ([63], ValueError, "sum to 63, but there are T = 64"),
])
def test_seq_lens_invalid(seq_lens, exc, match):
    with pytest.raises(exc, match=f"^seq_lens: .*{match}"):
        check_seq_lens(seq_lens, 1, 64)


def test_seq_lens_numpy_floats_refused():
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match="^seq_lens: entry 0 must be an int"):
        check_seq_lens(np.array([64.0]), 1, 64)
    with pytest.raises(ValueError, match="^seq_lens: expected a 1-D sequence"):
        check_seq_lens(np.array([[64]]), 1, 64)


def test_cu_seqlens_host_valid():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    for values in ([0, 3, 3, 8], (0, 3, 3, 8), np.array([0, 3, 3, 8], dtype=np.int64),
                   torch.tensor([0, 3, 3, 8], dtype=torch.int32)):
        got = check_cu_seqlens_host(values, 3, 8)
        assert got == (3, 0, 5) and all(type(x) is int for x in got)


@pytest.mark.parametrize("values,exc,match", [
    ([0, 3.0, 8], TypeError, "entry 1 must be an int"),
    ([0, True, 8], TypeError, "entry 1 is a bool"),
    ("038", TypeError, "expected a list"),
    ([0, 8], ValueError, "expected 3 entries"),
    ([0, 3, 5, 8], ValueError, "expected 3 entries"),
    ([1, 3, 8], ValueError, "entry 0 must be 0"),
    ([0, 5, 3], ValueError, "entry 2 = 3 < entry 1 = 5"),
    ([0, 3, 9], ValueError, "must equal the total token count T = 8"),
])
def test_cu_seqlens_host_invalid(values, exc, match):
    with pytest.raises(exc, match=f"^cu_seqlens_cpu: .*{match}"):
        check_cu_seqlens_host(values, 2, 8)


def test_cu_seqlens_host_refuses_device_arrays():
    class OnDevice:  # a DLPack producer in CUDA memory (kDLCUDA == 2)
        def __iter__(self):
            raise AssertionError("must not be read")

        def __dlpack_device__(self):
            return (2, 0)

    with pytest.raises(TypeError, match="^cu_seqlens_cpu: must be in host memory"):
        check_cu_seqlens_host(OnDevice(), 1, 8)
