"""The validation wall: every check that runs before any launch (spec section 1.4).

Pure Python over `TensorDesc`; this module never imports torch or cuda, so it runs (and is
tested) on a machine without a GPU. Nothing is ever copied, cast or made contiguous: a tensor
that does not fit is refused with an error whose message starts with the argument's name.

Checks run in phases, so the first error reported is the most basic one:
kinds (tensor / number), which arguments go together -> device, writable outputs -> dtype ->
shape -> layout (strides of q, k, v, g, beta; contiguity of the rest; alignment) -> values
(scalars, cp, numerics) -> aliasing of the outputs.

q, k, v, g and beta may be strided views (docs/api.md, "Strided inputs"): their strides are
normalised into `Problem.strides`, which the launcher hands to the kernels and plans are keyed by.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import struct
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, Tuple

from ..library.constants import LOG2E, D  # head dim: K = V = 128 only
from ..spec import prefill_args
from ..spec.call_options import CallOptions
from ..spec.gate_forms import BETA_FORMS, GATES, Form, needs, resolve_lower_bound
from ..spec.problem import CpMode, Problem, int_entries, parse_cp  # noqa: F401 (the wall's names)

if TYPE_CHECKING:  # kda_aot.intake.tensors imports cuda.core; this module stays importable without it
    from .tensors import TensorDesc

DEFAULT_SCALE = D ** -0.5
LOWER_BOUND_MIN = -5.0  # lower_bound must lie in [LOWER_BOUND_MIN, 0)


# --------------------------------------------------------------------------------------------
# Argument tables: derived from prefill_args.ARGS, the one declaration of prefill's tensors

_REQUIRED = prefill_args.REQUIRED
_OPTIONAL = prefill_args.OPTIONAL
_INPUTS = prefill_args.READ
_OUTPUTS = prefill_args.WRITTEN
_STATES = prefill_args.STATES  # one state dtype per call
_STRIDED = prefill_args.STRIDED  # read in place as strided views (the pool keeps its slot stride)

_BF16, _FP32, _I32, _I64 = prefill_args.BF16, prefill_args.FP32, prefill_args.I32, prefill_args.I64
_DTYPES: Dict[str, Tuple[str, ...]] = prefill_args.DTYPES

# Bytes each pointer must be aligned to, per argument and dtype (prefill_args says where the
# figures come from; the manifest's `arg_alignment` must equal it).
Alignment = Mapping[str, Mapping[str, int]]
ALIGNMENT: Alignment = prefill_args.ALIGNMENT

Tensors = Dict[str, Optional["TensorDesc"]]


# --------------------------------------------------------------------------------------------
# Entry point

def validate_prefill(*, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, initial_state,
                     final_state, cu_seqlens, out, cp, alignment: Optional[Alignment] = None, state_pool=None,
                     state_indices=None, checkpoint_every=None, checkpoints=None,
                     checkpoint_index=None, numerics: str = "flashkda", gate: str = "safe",
                     beta_form: str = "logits", allow_neg_eigval: bool = False, checkpoint_state=None,
                     checkpoint_offsets=None, checkpoint_slots=None, segment_ids=None) -> Problem:
    """Check every argument of a prefill call; return the Problem or raise naming the argument.

    `alignment`: bytes per argument and dtype (a manifest's `arg_alignment`); default ALIGNMENT.
    """
    t: Tensors = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, out=out,
                      initial_state=initial_state, final_state=final_state, cu_seqlens=cu_seqlens,
                      state_pool=state_pool, state_indices=state_indices, checkpoints=checkpoints,
                      checkpoint_index=checkpoint_index, checkpoint_state=checkpoint_state,
                      checkpoint_offsets=checkpoint_offsets, checkpoint_slots=checkpoint_slots,
                      segment_ids=segment_ids)
    gate, beta_form, neg_eigval = parse_form(gate, beta_form, allow_neg_eigval)
    _check_kinds(t)
    _check_form_arguments(t, gate, lower_bound)
    _check_scalar_kinds(lower_bound=lower_bound, scale=scale)
    every = check_checkpoint_every(checkpoint_every)
    _check_state_options(t, every)
    given = {name: d for name, d in t.items() if d is not None}
    _check_devices(given)
    _check_writable(given)
    _check_dtypes(given)
    _check_form_dtypes(t, gate)
    _check_state_dtypes_match(t)
    B, T, H, N = _check_shapes(t)
    n_checkpoints = (B * T) // every if every else 0
    _check_state_io_shapes(t, N, H, n_checkpoints)
    checkpoint_k = _check_checkpoint_shapes(t, N, H)
    n_listed = _check_segment_ids_shape(segment_ids)
    strides = _check_strides(t)
    _check_contiguous({name: d for name, d in given.items() if name != "state_pool" and name not in _STRIDED})
    _check_alignment(given, ALIGNMENT if alignment is None else alignment)
    lb = _check_lower_bound(gate, lower_bound)
    sc = _check_scale(scale)
    cp_mode = parse_cp(cp)
    numerics = parse_numerics(numerics)
    if numerics == "accurate" and (state_pool is not None or checkpoint_every or checkpoint_offsets is not None):
        # the pool/checkpoint kernels (k2_ext, cp_merge_pool) are built with FlashKDA's recipe only
        raise NotImplementedError("numerics: 'accurate' with state_pool, checkpoint_every or checkpoint_offsets "
                                  "is not built; use numerics='flashkda' or initial_state/final_state")
    if numerics == "accurate" and segment_ids is not None:
        # a listed call keeps unlisted states untouched through K2's state I/O by slot (k2_ext),
        # built with FlashKDA's recipe only
        raise NotImplementedError("segment_ids: not built with numerics='accurate'; use numerics='flashkda'")
    _check_no_alias(t)
    return Problem(
        B=B, T=T, H=H, N=N,
        varlen=cu_seqlens is not None,
        cu_dtype=None if cu_seqlens is None else cu_seqlens.dtype,
        state_dtype=_state_dtype(*(t[name] for name in _STATES)),
        has_initial=initial_state is not None,
        has_final=final_state is not None,
        scale=sc, lower_bound=lb, device_id=q.device_id, cp=cp_mode, numerics=numerics,
        form=Form(gate, beta_form, neg_eigval, g.dtype == _FP32, beta.dtype == _FP32),
        pooled=state_pool is not None,
        n_pool=state_pool.shape[0] if state_pool is not None else 0,
        slot_stride=pool_slot_stride(state_pool) if state_pool is not None else 0,
        checkpoint_every=every, n_checkpoints=n_checkpoints,
        strides=strides,
        checkpoint_k=checkpoint_k,
        checkpoint_into=None if not checkpoint_k else ("buffer" if checkpoint_state is not None else "pool"),
        checkpoint_offsets_dtype=None if checkpoint_offsets is None else checkpoint_offsets.dtype,
        listed=segment_ids is not None, n_listed=n_listed,
    )


def check_call(descs: Sequence[Optional["TensorDesc"]], options: CallOptions) -> Tuple[Problem, Optional[Tuple[int, ...]]]:
    """The whole wall on one call: (problem, host lengths or None), or an error naming the argument.

    `descs`: the descriptions of prefill's tensors in prefill_args order (a trailing workspace
    description is ignored: the plan checks it). Reads descriptions only, so it needs no GPU
    (kda_aot.jax runs it while JAX traces). Besides validate_prefill's checks it settles what the
    options add to the problem: the state dtype of checkpoints and of an allocated final state, the
    host lengths (checked against the problem) and the forced value split."""
    problem = validate_prefill(**dict(zip(prefill_args.NAMES, descs)), lower_bound=options.lower_bound,
                               scale=options.scale, cp=options.cp, checkpoint_every=options.checkpoint_every,
                               numerics=options.numerics, gate=options.gate, beta_form=options.beta_form,
                               allow_neg_eigval=options.allow_neg_eigval)
    if problem.checkpoint_every and problem.state_dtype is None:
        problem = dataclasses.replace(problem, state_dtype=_FP32)  # checkpoints default to fp32 like final states
    if options.output_final_state and not problem.has_final:
        # One state dtype per call (the kernels keep a single state format): the allocated final
        # state follows initial_state's dtype, fp32 when there is none.
        problem = dataclasses.replace(problem, has_final=True, state_dtype=problem.state_dtype or _FP32)
    hint = options.hint
    if hint is not None and not problem.varlen:
        raise ValueError(f"{'seq_lens' if hint[0] == 'lens' else 'cu_seqlens_cpu'}: a hint for packed input; "
                         "dense [B, T] input has no cu_seqlens")
    lengths = hint_lengths(hint, problem.N, problem.T) if problem.varlen else (problem.T,) * problem.B
    if options.value_split is not None and options.value_split not in (1, 2, 4):
        raise ValueError(f"value_split: expected 1, 2 or 4, got {options.value_split!r}")
    return problem, lengths


def hint_lengths(hint, N: int, T: int) -> Optional[Tuple[int, ...]]:
    """The sequence lengths a host hint (CallOptions.hint) gives, checked against N sequences of T
    tokens in all; None without a hint."""
    if hint is None:
        return None
    kind, values = hint
    return check_seq_lens(values, N, T) if kind == "lens" else check_cu_seqlens_host(values, N, T)


def _check_segment_ids_shape(segment_ids: Optional[TensorDesc]) -> int:
    """segment_ids: int32 [M] (M >= 0) on the call's device; its values are not read here (the
    device skips entries outside [0, N); validate="host" refuses them). Returns M (0 without)."""
    if segment_ids is None:
        return 0
    if len(segment_ids.shape) != 1:
        raise ValueError(f"segment_ids: expected int32 [M] (the indices of the sequences to run), got shape "
                         f"{tuple(segment_ids.shape)}")
    return int(segment_ids.shape[0])


def _state_dtype(*states: Optional[TensorDesc]) -> Optional[str]:
    """Spec rule: fp32 if either state is fp32, bf16 if states are given and all bf16, else None."""
    dtypes = {d.dtype for d in states if d is not None}
    if not dtypes:
        return None
    return _FP32 if _FP32 in dtypes else _BF16


# --------------------------------------------------------------------------------------------
# State pool and checkpoints (docs/state_pool.md)

def check_checkpoint_every(every) -> int:
    """checkpoint_every: None (no checkpoints, 0) or an int >= 16 that is a multiple of 16 (a
    checkpoint falls on a 16-token tile boundary of its sequence)."""
    if every is None:
        return 0
    if isinstance(every, bool) or not isinstance(every, numbers.Integral):
        raise TypeError(f"checkpoint_every: expected an int (a multiple of 16) or None, got {every!r} "
                        f"({type(every).__name__})")
    every = int(every)
    if every < 16 or every % 16:
        raise ValueError(f"checkpoint_every: expected a positive multiple of 16 (checkpoints fall on 16-token "
                         f"tile boundaries), got {every}")
    return every


def _check_state_options(t: Tensors, every: int) -> None:
    """Which state arguments go together: the pool replaces initial_state / final_state, its
    indices come with it, checkpoint buffers need checkpoint_every."""
    if t["state_pool"] is not None:
        for name in ("initial_state", "final_state"):
            if t[name] is not None:
                raise ValueError(f"state_pool: cannot be combined with {name}; the pool is read and written in "
                                 "place (pass either state_pool + state_indices or initial_state / final_state)")
        if t["state_indices"] is None:
            raise ValueError("state_indices: required with state_pool (int32 [N] slot per sequence on the device)")
    elif t["state_indices"] is not None:
        raise ValueError("state_indices: given without state_pool")
    if not every:
        for name in ("checkpoints", "checkpoint_index"):
            if t[name] is not None:
                raise ValueError(f"{name}: a checkpoint buffer was given but checkpoint_every is None")
    _check_offset_checkpoint_options(t, every)


def _check_offset_checkpoint_options(t: Tensors, every: int) -> None:
    """Checkpoints at given offsets: checkpoint_offsets with exactly one destination, either
    checkpoint_state (a buffer) or checkpoint_slots (slots of the state pool)."""
    offsets, state, slots = t["checkpoint_offsets"], t["checkpoint_state"], t["checkpoint_slots"]
    if offsets is None:
        for name in ("checkpoint_state", "checkpoint_slots"):
            if t[name] is not None:
                raise ValueError(f"{name}: given without checkpoint_offsets (the tokens after which each "
                                 "checkpoint is taken)")
        return
    if state is None and slots is None:
        raise ValueError("checkpoint_offsets: needs a destination, checkpoint_state (a [N, (K,) H, 128, 128] "
                         "buffer) or checkpoint_slots (state_pool slots)")
    if state is not None and slots is not None:
        raise ValueError("checkpoint_offsets: takes one destination, checkpoint_state or checkpoint_slots, "
                         "not both")
    if slots is not None and t["state_pool"] is None:
        raise ValueError("checkpoint_slots: requires state_pool (checkpoint (n, k) is written into "
                         "state_pool[checkpoint_slots[n, k]])")
    if every:
        raise ValueError("checkpoint_offsets: cannot be combined with checkpoint_every; pass one way of "
                         "taking checkpoints")


def pool_slot_stride(pool: TensorDesc) -> int:
    """Elements between two slots of the pool (a single slot: the dense stride)."""
    H = pool.shape[1] if len(pool.shape) == 4 else 0
    return pool.strides[0] if pool.shape[0] > 1 else H * D * D


def _check_state_io_shapes(t: Tensors, N: int, H: int, n_checkpoints: int) -> None:
    pool = t["state_pool"]
    if pool is not None:
        if len(pool.shape) != 4 or tuple(pool.shape[1:]) != (H, D, D):
            raise ValueError(f"state_pool: expected shape [S, {H}, 128, 128] (slots, H, V, K), got {tuple(pool.shape)}")
        if pool.shape[0] < 1:
            raise ValueError("state_pool: needs at least one slot, got shape " + str(tuple(pool.shape)))
        if H and tuple(pool.strides[1:]) != (D * D, D, 1):
            raise ValueError(f"state_pool: each slot must be contiguous (strides (*, {D * D}, {D}, 1)), got strides "
                             f"{tuple(pool.strides)}; nothing is copied")
        stride = pool_slot_stride(pool)
        if H and stride < H * D * D:
            raise ValueError(f"state_pool: slot stride {stride} is smaller than a slot ({H * D * D} elements); "
                             "slots must not overlap")
        if (stride * pool.itemsize) % 16:
            raise ValueError(f"state_pool: slot stride {stride} elements is not a multiple of 16 bytes; every slot "
                             "must be 16-byte aligned like the pool's data pointer")
    if t["state_indices"] is not None:
        _expect_shape("state_indices", t["state_indices"], (N,), "[N], one slot per sequence")
    if t["checkpoints"] is not None:
        _expect_shape("checkpoints", t["checkpoints"], (n_checkpoints, H, D, D),
                      "[B*T // checkpoint_every, H, 128, 128]")
    if t["checkpoint_index"] is not None:
        _expect_shape("checkpoint_index", t["checkpoint_index"], (n_checkpoints, 2),
                      "[B*T // checkpoint_every, 2] (sequence, tokens)")


def _check_checkpoint_shapes(t: Tensors, N: int, H: int) -> int:
    """checkpoint_offsets [N] or [N, K] (K in {1, 2}), checkpoint_slots like it, checkpoint_state
    [N, H, 128, 128] for [N] offsets or [N, K, H, 128, 128] for [N, K]. Returns K (0: none)."""
    offsets = t["checkpoint_offsets"]
    if offsets is None:
        return 0
    shape = tuple(offsets.shape)
    if len(shape) not in (1, 2) or shape[0] != N or (len(shape) == 2 and shape[1] not in (1, 2)):
        raise ValueError(f"checkpoint_offsets: expected shape ({N},) [N] or ({N}, K) [N, K] with K 1 or 2 "
                         f"(N = {N} sequences), got {shape}")
    K = shape[1] if len(shape) == 2 else 1
    if t["checkpoint_slots"] is not None:
        _expect_shape("checkpoint_slots", t["checkpoint_slots"], shape, "like checkpoint_offsets")
    if t["checkpoint_state"] is not None:
        want, what = ((N, H, D, D), "[N, H, 128, 128] for [N] offsets") if len(shape) == 1 else (
            (N, K, H, D, D), "[N, K, H, 128, 128] for [N, K] offsets")
        _expect_shape("checkpoint_state", t["checkpoint_state"], want, what)
    return K


# --------------------------------------------------------------------------------------------
# Phase 1: kinds

_DESC_FIELDS = ("ptr", "shape", "strides", "dtype", "device", "device_id", "readonly", "numel",
                "nbytes", "is_contiguous")


def _is_desc(x) -> bool:
    """A TensorDesc, recognised by its fields (a raw torch/CuPy tensor lacks ptr and device_id)."""
    return all(hasattr(x, f) for f in _DESC_FIELDS)


def _check_kinds(t: Tensors) -> None:
    for name in _REQUIRED + _OPTIONAL:
        desc = t[name]
        if desc is None:
            if name in _REQUIRED:
                raise TypeError(f"{name}: a tensor is required, got None")
            continue
        if not _is_desc(desc):
            raise TypeError(f"{name}: expected a TensorDesc (see kda_aot.intake.tensors.describe), "
                            f"got {type(desc).__name__}")


def parse_form(gate, beta_form, allow_neg_eigval) -> Tuple[str, str, bool]:
    """The gate and beta form options (kda_aot/spec/gate_forms.py), each checked by name."""
    if type(gate) is not str or gate not in GATES:
        raise ValueError(f"gate: expected one of {', '.join(map(repr, GATES))}, got {gate!r}")
    if type(beta_form) is not str or beta_form not in BETA_FORMS:
        raise ValueError(f"beta_form: expected one of {', '.join(map(repr, BETA_FORMS))}, got {beta_form!r}")
    if not isinstance(allow_neg_eigval, bool):
        raise TypeError(f"allow_neg_eigval: expected a bool, got {type(allow_neg_eigval).__name__}")
    if allow_neg_eigval and beta_form != "logits":
        raise ValueError("allow_neg_eigval: b = 2 sigmoid(beta) needs beta_form='logits'; with "
                         "beta_form='probs' beta is used as given (scale it yourself)")
    return gate, beta_form, allow_neg_eigval


def _check_form_arguments(t: Tensors, gate: str, lower_bound) -> None:
    """A_log, dt_bias and lower_bound as the gate form needs them (gate_forms.needs)."""
    rules = dict(zip(("A_log", "dt_bias", "lower_bound"), needs(gate)))
    for name in ("A_log", "dt_bias"):
        if rules[name] == "required" and t[name] is None:
            raise TypeError(f"{name}: a tensor is required with gate={gate!r}, got None")
        if rules[name] == "absent" and t[name] is not None:
            raise ValueError(f"{name}: must be None with gate={gate!r} (g is the caller's log-decay)")
    if rules["lower_bound"] == "absent" and lower_bound is not None:
        raise ValueError(f"lower_bound: must be None with gate={gate!r}, which has no lower bound; got "
                         f"{lower_bound!r}")


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_scalar_kinds(*, lower_bound, scale) -> None:
    if lower_bound is not None and not _is_real(lower_bound):
        raise TypeError(f"lower_bound: expected a float or None, got {type(lower_bound).__name__}")
    if scale is not None and not _is_real(scale):
        raise TypeError(f"scale: expected a float or None, got {type(scale).__name__}")


# --------------------------------------------------------------------------------------------
# Phase 2: device

def _check_devices(given: Dict[str, TensorDesc]) -> None:
    for name, d in given.items():
        if d.device != "cuda":
            raise TypeError(f"{name}: expected a CUDA device tensor, got a {d.device} tensor "
                            "(host, pinned and managed memory are refused; nothing is copied)")
    want = given["q"].device_id
    for name, d in given.items():
        if d.device_id != want:
            raise ValueError(f"{name}: on cuda:{d.device_id}, but q is on cuda:{want}; "
                             "all tensors must be on the same device")


def _check_writable(given: Dict[str, TensorDesc]) -> None:
    """Outputs are written in place: a buffer its producer marked read-only is refused."""
    for name in _OUTPUTS:
        d = given.get(name)
        if d is not None and d.readonly:
            raise ValueError(f"{name}: the producer marked this tensor read-only (DLPack read-only "
                             "flag); outputs are written in place, pass a writable buffer")


# --------------------------------------------------------------------------------------------
# Phase 3: dtype

def _check_dtypes(given: Dict[str, TensorDesc]) -> None:
    for name, d in given.items():
        allowed = _DTYPES[name]
        if d.dtype not in allowed:
            raise TypeError(f"{name}: expected dtype {' or '.join(allowed)}, got {d.dtype} "
                            "(nothing is cast)")


def _check_form_dtypes(t: Tensors, gate: str) -> None:
    """An fp32 g is a precomputed log-decay; the in-kernel gates read bf16 projections."""
    if gate != "log_decay" and t["g"].dtype == _FP32:
        raise TypeError(f"g: expected dtype bfloat16 with gate={gate!r}, got float32 (float32 only with "
                        "gate='log_decay'; nothing is cast)")


def _check_state_dtypes_match(t: Tensors) -> None:
    initial, final = t["initial_state"], t["final_state"]
    if initial is not None and final is not None and initial.dtype != final.dtype:
        raise ValueError(f"final_state: dtype {final.dtype} differs from initial_state dtype "
                         f"{initial.dtype}; both states must have the same dtype")
    given = [(name, t[name]) for name in _STATES if t.get(name) is not None]
    for name, d in given[1:]:
        ref_name, ref = given[0]
        if d.dtype != ref.dtype:
            raise ValueError(f"{name}: dtype {d.dtype} differs from {ref_name} dtype {ref.dtype}; "
                             "the kernels keep one state dtype per call")


# --------------------------------------------------------------------------------------------
# Phase 4: shape

def _check_shapes(t: Tensors) -> Tuple[int, int, int, int]:
    """Return (B, T, H, N)."""
    q = t["q"]
    _check_q_shape(q)
    B, T, H, _ = q.shape
    _check_k_shape(t["k"], q.shape)
    _check_v_shape(t["v"], q.shape)
    for name in ("g", "out"):
        if t[name] is not None:
            _expect_shape(name, t[name], q.shape, "like q")
    _expect_shape("beta", t["beta"], (B, T, H), "[B, T, H]")
    _check_gate_params(t["A_log"], t["dt_bias"], H)  # when given
    N = B if t["cu_seqlens"] is None else _check_cu_seqlens_shape(t["cu_seqlens"], B)
    for name in ("initial_state", "final_state"):
        if t[name] is not None:
            _expect_shape(name, t[name], (N, H, D, D), "[N, H, 128, 128]")
    return B, T, H, N


def _expect_shape(name: str, d: TensorDesc, want: Tuple[int, ...], what: str) -> None:
    if tuple(d.shape) != tuple(want):
        raise ValueError(f"{name}: expected shape {tuple(want)} {what}, got {tuple(d.shape)}")


def _check_q_shape(q: TensorDesc) -> None:
    if len(q.shape) != 4:
        raise ValueError(f"q: expected a 4-D tensor [B, T, H, 128], got shape {tuple(q.shape)}")
    if q.shape[3] != D:
        raise ValueError(f"q: only K=V=128 is supported, got head dim {q.shape[3]} "
                         f"(shape {tuple(q.shape)})")


def _check_k_shape(k: TensorDesc, qshape: Tuple[int, ...]) -> None:
    if tuple(k.shape) != tuple(qshape):
        note = " (only K=V=128 is supported)" if len(k.shape) == 4 and k.shape[3] != D else ""
        raise ValueError(f"k: expected shape {tuple(qshape)} like q, got {tuple(k.shape)}{note}")


def _check_v_shape(v: TensorDesc, qshape: Tuple[int, ...]) -> None:
    if len(v.shape) == 4 and v.shape[3] != D:
        raise ValueError(f"v: only K=V=128 is supported, got value dim {v.shape[3]} "
                         f"(shape {tuple(v.shape)})")
    if len(v.shape) == 4 and tuple(v.shape[:2]) == tuple(qshape[:2]) and v.shape[2] != qshape[2]:
        raise NotImplementedError(f"v: {v.shape[2]} value heads but q has {qshape[2]} heads; "
                                  "grouped value attention (GVA, HV != H) is not supported")
    _expect_shape("v", v, qshape, "like q")


def _check_gate_params(A_log: Optional[TensorDesc], dt_bias: Optional[TensorDesc], H: int) -> None:
    if A_log is not None:
        _expect_shape("A_log", A_log, (H,), "[H]")
    if dt_bias is not None and tuple(dt_bias.shape) not in ((H, D), (H * D,)):
        raise ValueError(f"dt_bias: expected shape {(H, D)} [H, 128] or {(H * D,)} [H*128], "
                         f"got {tuple(dt_bias.shape)}")


def _check_cu_seqlens_shape(cu: TensorDesc, B: int) -> int:
    """Return N = len(cu_seqlens) - 1."""
    if len(cu.shape) != 1:
        raise ValueError(f"cu_seqlens: expected a 1-D tensor [N+1], got shape {tuple(cu.shape)}")
    if cu.shape[0] < 2:
        raise ValueError(f"cu_seqlens: expected at least 2 entries [N+1], got {cu.shape[0]}")
    if B != 1:
        raise ValueError(f"cu_seqlens: packed varlen input needs B == 1 (tokens packed along T), "
                         f"got B = {B}")
    return cu.shape[0] - 1


# --------------------------------------------------------------------------------------------
# Phase 5: layout

def _check_strides(t: Tensors) -> Tuple[int, ...]:
    """The strided inputs' normalised strides in elements, (q_t, q_h, k_t, k_h, v_t, v_h, g_t, g_h,
    beta_t), or raise naming the argument (docs/api.md, "Strided inputs")."""
    out = []
    for name in ("q", "k", "v", "g"):
        out += _row_strides(name, t[name], head_dim=True)
    out.append(_row_strides("beta", t["beta"], head_dim=False)[0])
    return tuple(out)


def _row_strides(name: str, d: TensorDesc, *, head_dim: bool) -> Tuple[int, int]:
    """(token stride, head stride) of a [B, T, H, 128] (head_dim) or [B, T, H] view whose B * T
    tokens are one run of rows. Size-1 dims carry no stride (normalised to the contiguous value; a
    size-1 T takes the batch stride, the distance between its B tokens); an empty view is
    contiguous."""
    B, T, H = d.shape[:3]
    inner = D if head_dim else 1  # contiguous head stride
    sb, st, sh = d.strides[:3]
    if d.numel == 0:
        return H * inner, inner
    if head_dim and d.strides[3] != 1:
        raise ValueError(f"{name}: the last (head dim) stride must be 1, got strides {tuple(d.strides)}; "
                         "nothing is copied")
    if H == 1:
        sh = inner
    if T == 1:
        st = sb if B > 1 else H * inner
    for what, value in (("batch", sb if B > 1 else 0), ("token", st), ("head", sh)):
        if value < 0:
            raise ValueError(f"{name}: negative {what} stride {value} is not supported (strides "
                             f"{tuple(d.strides)}); nothing is copied")
    if not head_dim:
        if sh != 1:
            raise ValueError(f"{name}: head stride {sh} must be 1 (strides {tuple(d.strides)}); the heads of a "
                             "token are read as one run, nothing is copied")
    else:
        unit = 16 // d.itemsize  # 16-byte rows: 8 bf16 or 4 fp32 elements
        for what, value in (("token", st), ("head", sh)):
            if value % unit:
                raise ValueError(f"{name}: {what} stride {value} is not a multiple of {unit} elements "
                                 f"(16-byte rows); nothing is copied")
    if B > 1 and sb != T * st:
        raise ValueError(f"{name}: batch stride {sb} is not T * token stride ({T} * {st} = {T * st}); the "
                         "B * T tokens must be one run of rows, nothing is copied")
    return st, sh


def _check_contiguous(given: Dict[str, TensorDesc]) -> None:
    for name, d in given.items():
        if not d.is_contiguous():
            raise ValueError(f"{name}: must be contiguous (shape {tuple(d.shape)}, strides "
                             f"{tuple(d.strides)}); nothing is copied, pass a contiguous tensor")


def _check_alignment(given: Dict[str, TensorDesc], alignment: Alignment) -> None:
    for name, d in given.items():
        align = alignment[name][d.dtype]  # dtypes were checked: the entry exists
        if d.numel > 0 and d.ptr % align != 0:
            why = ("the kernels access it with 16-byte (bulk or vector) loads and stores"
                   if align == 16 else f"the kernels read it in {align}-byte units")
            raise ValueError(f"{name}: data pointer {d.ptr:#x} is not {align}-byte aligned; "
                             f"{why} (nothing is copied)")


# --------------------------------------------------------------------------------------------
# Phase 6: values

_FLT_MIN = 2.0 ** -126  # smallest normal float32


def as_float32(x: float) -> float:
    """x rounded to float32 (round to nearest even, as numpy.float32 does; inf past the range).
    struct's 'f' format is the same C conversion, without importing numpy here."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:  # struct refuses what rounds past FLT_MAX; numpy gives inf
        return math.copysign(math.inf, x)


def _is_f32_normal(x: float) -> bool:
    """The kernels take the scalars as float32 and flush subnormals to zero (.ftz), so a value
    is usable only if it rounds to a finite, normal float32."""
    y = as_float32(x)
    return math.isfinite(y) and abs(y) >= _FLT_MIN


def _check_lower_bound(gate: str, lower_bound) -> Optional[float]:
    """gate="safe": in [-5, 0) (FlashKDA's range, which keeps its chunk factors in fp32's range);
    gate="sigmoid": any finite negative value; None means -5 for both and is the only value of the
    other forms (_check_form_arguments). Always a normal float32: the kernels take it as one."""
    resolved = resolve_lower_bound(gate, lower_bound)
    if resolved is None:
        return None
    lb = _to_float(resolved)
    low = LOWER_BOUND_MIN if needs(gate)[2] == "safe" else -math.inf
    if not math.isfinite(lb) or not (low <= lb < 0.0) or not _is_f32_normal(lb) or not math.isfinite(
            as_float32(lb * LOG2E)):
        where = f"in [{LOWER_BOUND_MIN:g}, 0)" if low > -math.inf else "below 0"
        hint = " (gate='sigmoid' takes any negative bound)" if gate == "safe" else ""
        raise ValueError(f"lower_bound: expected a finite value {where} that is a normal float32 "
                         f"(|x| >= {_FLT_MIN:.3g}) with gate={gate!r}{hint}, got {lower_bound!r}")
    return lb


def _check_scale(scale) -> float:
    if scale is None:
        return DEFAULT_SCALE
    sc = _to_float(scale)
    if not math.isfinite(sc) or sc <= 0.0 or not _is_f32_normal(sc):
        raise ValueError(f"scale: expected a finite positive float that is a normal float32 "
                         f"(between {_FLT_MIN:.3g} and 3.4e38; or None for 128**-0.5), got {scale!r}")
    return sc


def _to_float(x) -> float:
    """float(x) of a Real; an int beyond float's range (where float() raises OverflowError) is
    an infinity, which the range checks then refuse with the argument's usual message."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


NUMERICS = ("flashkda", "accurate")


def parse_numerics(numerics) -> str:
    """"flashkda" (FlashKDA's rounding recipe, bit for bit) | "accurate" (fp32 where the recipe's bf16
    roundings cost accuracy, docs/numerics.md); anything else is a ValueError naming the argument."""
    if type(numerics) is str and numerics in NUMERICS:
        return numerics
    raise ValueError(f"numerics: expected \"flashkda\" or \"accurate\", got {numerics!r}"
                     + ("" if isinstance(numerics, str) else f" ({type(numerics).__name__})"))


def check_cu_seqlens_values(values: Sequence[int], T: int, name: str = "cu_seqlens") -> None:
    """Host copy of cu_seqlens: cu[0] == 0, non-decreasing, cu[-1] == T (empty sequences allowed).
    `name`: the argument the values came from, which every message starts with."""
    cu = int_entries(values, name)
    if len(cu) < 2:
        raise ValueError(f"{name}: expected at least 2 entries [N+1], got {len(cu)}")
    if cu[0] != 0:
        raise ValueError(f"{name}: entry 0 must be 0, got {cu[0]}")
    for i in range(1, len(cu)):
        if cu[i] < cu[i - 1]:
            raise ValueError(f"{name}: must be non-decreasing, but entry {i} = {cu[i]} "
                             f"< entry {i - 1} = {cu[i - 1]}")
    if cu[-1] != T:
        raise ValueError(f"{name}: last entry (index {len(cu) - 1}) must equal the total "
                         f"token count T = {T}, got {cu[-1]}")


def check_seq_lens(seq_lens: Any, n_seq: int, T: int) -> Tuple[int, ...]:
    """The caller's host copy of the sequence lengths (`seq_lens=`): one int >= 0 per sequence
    (n_seq of them, from cu_seqlens' shape), summing to T. Returns them as a tuple of ints.

    Entries are taken with operator.index only: a float, bool or string length is refused rather
    than truncated, since a wrong host length would plan (and split) the wrong tokens."""
    lengths = int_entries(_host_entries(seq_lens, "seq_lens"), "seq_lens")
    if len(lengths) != n_seq:
        raise ValueError(f"seq_lens: expected {n_seq} lengths (one per sequence, as cu_seqlens "
                         f"has {n_seq + 1} entries), got {len(lengths)}")
    for i, n in enumerate(lengths):
        if n < 0:
            raise ValueError(f"seq_lens: entry {i} must be >= 0, got {n}")
    if sum(lengths) != T:
        raise ValueError(f"seq_lens: the lengths sum to {sum(lengths)}, but there are T = {T} tokens")
    return tuple(lengths)


def check_cu_seqlens_host(values: Any, n_seq: int, T: int) -> Tuple[int, ...]:
    """A host copy of cu_seqlens (`cu_seqlens_cpu=`, FLA's name): a list, tuple, numpy array or
    CPU torch tensor of n_seq + 1 ints, starting at 0, non-decreasing, ending at T. Returns the
    sequence lengths."""
    name = "cu_seqlens_cpu"
    cu = int_entries(_host_entries(values, name), name)
    if len(cu) != n_seq + 1:
        raise ValueError(f"{name}: expected {n_seq + 1} entries like cu_seqlens, got {len(cu)}")
    check_cu_seqlens_values(cu, T, name)
    return tuple(b - a for a, b in zip(cu[:-1], cu[1:]))


_KDL_HOST = (1, 3)  # DLPack device types of host memory: kDLCPU, kDLCUDAHost (pinned)


def _host_entries(values: Any, name: str) -> list:
    """The entries of a 1-D host sequence as a list, without importing any framework: a device
    array is refused (reading it would be a hidden device-to-host sync), a string is not a
    sequence of lengths, and arrays are read through tolist() (one call instead of a Python-level
    walk over 0-d elements)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name}: expected a list, tuple or 1-D host array of ints, "
                        f"got {type(values).__name__}")
    if hasattr(values, "__dlpack_device__"):
        device_type = int(values.__dlpack_device__()[0])
        if device_type not in _KDL_HOST:
            raise TypeError(f"{name}: must be in host memory (a list, tuple, numpy array or CPU "
                            f"tensor), got an array on DLPack device type {device_type}")
    ndim = getattr(values, "ndim", 1)
    if ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence, got {ndim} dimensions")
    return values.tolist() if hasattr(values, "tolist") else list(values)


# --------------------------------------------------------------------------------------------
# Phase 7: aliasing (outputs are written in place)

def extent_bytes(d: TensorDesc) -> int:
    """Bytes from the data pointer to the end of the last element (nbytes for a contiguous
    tensor; a strided view or a state pool with a padded slot stride spans more than its
    elements). Strides are non-negative here (the layout checks ran before); a size-1 dim's
    stride is never stepped over, whatever it is."""
    if d.numel == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(d.shape, d.strides)) + 1) * d.itemsize


def _overlaps(a: TensorDesc, b: TensorDesc) -> bool:
    na, nb = extent_bytes(a), extent_bytes(b)
    if na == 0 or nb == 0:
        return False
    return a.ptr < b.ptr + nb and b.ptr < a.ptr + na


def _check_no_alias(t: Tensors) -> None:
    for out_name in _OUTPUTS:
        o = t.get(out_name)
        if o is None:
            continue
        for in_name in _INPUTS:
            i = t.get(in_name)
            if i is not None and _overlaps(o, i):
                raise ValueError(f"{out_name}: memory overlaps {in_name}; outputs are written in "
                                 "place while inputs are still read, pass a separate buffer")
    for i, later in enumerate(_OUTPUTS):
        for earlier in _OUTPUTS[:i]:
            a, b = t.get(later), t.get(earlier)
            if a is not None and b is not None and _overlaps(a, b):
                raise ValueError(f"{later}: memory overlaps {earlier}; pass separate buffers")
