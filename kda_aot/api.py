"""Public functions: `prefill`, `workspace_size`, `empty_cache` and `info`.

`prefill` is the validation wall's only door. The first call of a problem shape runs the whole
wall (validation.py) and builds a CallPlan (call_plan.py); later calls of that shape read their
pointers, repeat the pointer checks, allocate what the caller did not pass and launch the whole
kernel sequence with one native call. Nothing is read back to the host unless the caller asks
(`validate="host"`), so a call never synchronises and can be captured into a CUDA graph
(docs/call_path.md).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import __version__
from .plan import call_plan
from .intake import frameworks, pending
from .spec import prefill_args
from .library import streams
from .library.abi_constants import D
from .plan.call_plan import CallPlan, UnsafePointers
from .library.loader import CudaError, KdaError, get_library, library_dir
from .plan.program import SLOT, pack_inputs
from .intake.tensors import TensorDesc, describe
from .intake.stream_check import check_stream_handle, stream_device
from .intake.validation import (ALIGNMENT, _host_entries, check_cu_seqlens_host, check_cu_seqlens_values, check_seq_lens,
                         extent_bytes, int_entries, validate_prefill)
from .plan.workspace import ARENA


class Checkpoints(NamedTuple):
    """The checkpoint states of a prefill with checkpoint_every=C (docs/state_pool.md).

    states: [B*T // C, H, 128, 128] in the state dtype; slot s holds the state of sequence
    index[s, 0] after its first index[s, 1] tokens. index: int32 [B*T // C, 2], (-1, -1) for a
    slot that holds no checkpoint (its states entry is then not written)."""

    states: Any
    index: Any

_TENSOR_ARGS = prefill_args.NAMES + ("workspace",)  # the order of `tensors` in prefill and workspace_size
_VALIDATE_MODES = ("device", "host")

# CallPlans by key (shapes, dtypes, devices, scalars, options; never a pointer or a caller's object).
_PLANS: dict = {}
_PLANS_LOCK = threading.Lock()
_PLANS_MAX = 512


def prefill(q: Any, k: Any, v: Any, g: Any, beta: Any, *, A_log: Any = None, dt_bias: Any = None,
            lower_bound: Optional[float] = None,
            scale: Optional[float] = None, initial_state: Any = None, output_final_state: bool = False,
            cu_seqlens: Any = None, cp: Union[str, int] = "auto", out: Any = None, final_state: Any = None,
            stream: Any = None, seq_lens: Optional[Sequence[int]] = None, cu_seqlens_cpu: Any = None,
            workspace: Any = None, validate: str = "device", value_split: Optional[int] = None,
            state_pool: Any = None, state_indices: Any = None, checkpoint_every: Optional[int] = None,
            checkpoints: Any = None, checkpoint_index: Any = None, state_indices_cpu: Any = None,
            numerics: str = "flashkda", gate: str = "safe", beta_form: str = "logits",
            allow_neg_eigval: bool = False, checkpoint_offsets: Any = None, checkpoint_state: Any = None,
            checkpoint_slots: Any = None) -> Tuple[Any, ...]:
    """KDA prefill (docs/api.md): returns (o, final_state or None), and a third element,
    Checkpoints(states, index), when checkpoint_every is given.

    q, k, v, g: bf16 [B, T, H, 128]; beta: bf16 logits [B, T, H]; A_log fp32 [H]; dt_bias fp32
    [H, 128] (or [H*128]); initial_state / final_state: [N, H, 128 (V), 128 (K)] bf16 or fp32.
    q, k, v, g and beta may be strided views, read in place (docs/api.md, "Strided inputs"): token
    and head strides of 16-byte multiples (beta: any token stride, adjacent heads), the B * T tokens
    one run of rows; every other tensor is contiguous.
    `gate` (docs/gate_forms.md): "safe" (default, FlashKDA's lower_bound * sigmoid(exp(A_log) *
    (g + dt_bias)) with lower_bound in [-5, 0), None meaning -5), "sigmoid" (the same formula for
    any negative bound, A_log and dt_bias optional), "softplus" (-exp(A_log) * softplus(g +
    dt_bias), no lower bound) or "log_decay" (g is the caller's log-decay, bf16 or fp32; no A_log,
    dt_bias or lower bound). `beta_form`: "logits" (sigmoid inside; 2 sigmoid with
    allow_neg_eigval=True) or "probs" (used as given); beta bf16 or fp32.
    Packed varlen: B == 1 and cu_seqlens int32/int64 [N + 1] on the device; its values are not read
    on the host (the kernels clamp bad ones, docs/kernel_abi.md) unless validate="host", which
    copies them back (a synchronisation) and checks them. `seq_lens` (host lengths) or
    `cu_seqlens_cpu` (a host copy of cu_seqlens, FLA's name) are optional hints for the CP
    planner; they must match cu_seqlens. `out`, `final_state` and `workspace` (a device buffer of
    at least kda_aot.workspace_size(...) bytes, 256-byte aligned) are used in place when given,
    else allocated: with torch's caching allocator on the call's stream for torch tensors.
    `stream`: a CUDA stream (handle, `__cuda_stream__` object or torch stream); default: torch's
    current stream for torch callers, CuPy's current stream for CuPy callers, JAX's stream for
    external ready events for JAX callers (whose outputs come back as JAX arrays,
    docs/frameworks.md), else the legacy default stream. `cp`: "auto" splits long
    sequences when that pays, "off" never, "on" always (NotSplittableError when it cannot), an int
    forces up to that many segments per sequence (tests). `value_split` forces the K2 value-column
    split (1, 2 or 4; tests and benchmarks). `numerics`: "flashkda" (default) computes FlashKDA's
    rounding recipe bit for bit (bf16 state between chunks); "accurate" keeps the state, the CP
    carries and the solve's residual in fp32 and rounds each gated operand once (docs/numerics.md:
    errors and costs measured).

    State pool (docs/state_pool.md): `state_pool` [S, H, 128, 128] bf16 or fp32 (slots may be
    padded apart) and `state_indices` int32 [N] on the device: sequence n starts from
    state_pool[state_indices[n]] and its final state is written back there, in place. A negative
    index (or one >= S) starts from zero and writes nothing. Replaces initial_state / final_state /
    output_final_state. Repeated non-negative indices are refused by validate="host" or when a host
    copy is given (`state_indices_cpu`, checked on every call, no sync; it must match), and are
    undefined otherwise. `checkpoint_every=C` (a multiple of 16) also returns the state after every C tokens
    of each sequence: Checkpoints(states [B*T // C, H, 128, 128], index int32 [B*T // C, 2]);
    `checkpoints` / `checkpoint_index` are used in place when given.

    Checkpoints at given offsets (docs/state_pool.md): `checkpoint_offsets` int32 or int64 [N] or
    [N, K] (K 1 or 2) on the device; checkpoint (n, k) is the state of sequence n after its first
    checkpoint_offsets[n, k] tokens, written when that is a positive multiple of 16 below the
    sequence's length (else nothing is written; the values are never read on the host). It goes
    into `checkpoint_state` [N, H, 128, 128] ([N, K, H, 128, 128] for [N, K] offsets), in the
    call's state dtype, or, with a state pool, into state_pool[checkpoint_slots[n, k]]
    (`checkpoint_slots` int32 like the offsets; a slot outside the pool writes nothing). Exactly
    one of checkpoint_state / checkpoint_slots; not with checkpoint_every. The return value is
    unchanged.
    """
    if final_state is not None and not output_final_state:
        raise ValueError("final_state: a buffer was given but output_final_state=False")
    if state_pool is not None and output_final_state:
        raise ValueError("state_pool: cannot be combined with output_final_state; the final states are written "
                         "back into the pool at state_indices")
    if validate not in _VALIDATE_MODES:
        raise ValueError(f"validate: expected 'device' or 'host', got {validate!r}")
    tensors = (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, out, final_state, state_pool,
               state_indices, checkpoints, checkpoint_index, checkpoint_state, checkpoint_offsets, checkpoint_slots,
               workspace)
    torch = sys.modules.get("torch")
    intake = None if torch is None else _torch_intake(torch.Tensor, tensors)
    handle = None
    if intake is not None:
        sig, ptrs = intake
        descs = None
    else:
        torch = None
        handle = _intake_stream(q, stream)
        descs = _describe_all(tensors, frameworks.consumer_stream(handle))
        sig = tuple(None if d is None else (d.shape, d.strides, d.dtype, d.device, d.device_id,
                                            getattr(d, "readonly", False)) for d in descs)
        ptrs = [0 if d is None else d.ptr for d in descs]
    hint = _hint_key(seq_lens, cu_seqlens_cpu)
    if state_indices_cpu is not None:
        _check_indices_hint(state_indices_cpu, state_indices, state_pool)
    if validate == "host":
        hint = _read_back_hint(torch, tensors, hint, stream, handle)
        if state_indices is not None and state_pool is not None:
            _read_back_indices(torch, state_indices, state_pool, stream)
    # a torch tensor's signature holds its contiguity only: the pool's slot stride joins the key
    pool_stride = state_pool.stride() if intake is not None and state_pool is not None else None
    form = (gate, beta_form, allow_neg_eigval)
    options = (type(lower_bound), lower_bound, type(scale), scale, bool(output_final_state), type(cp), cp,
               hint, value_split, type(checkpoint_every), checkpoint_every, pool_stride, type(numerics), numerics,
               tuple(type(x) for x in form), form)
    try:
        key = (sig, options)
        plan = _PLANS.get(key)
    except TypeError:  # an unhashable option: let the wall name it
        key, plan = None, None
    if plan is None:
        descs = descs or _describe_all(tensors)
        plan = _build_plan(descs, lower_bound, scale, output_final_state, cp, hint, value_split, checkpoint_every,
                           numerics, form)
        if key is not None:
            _remember(key, plan)
    try:
        plan.check_pointers(ptrs)
    except UnsafePointers:
        descs = descs or _describe_all(tensors)
        _build_plan(descs, lower_bound, scale, output_final_state, cp, hint, value_split,
                    checkpoint_every, numerics, form)  # raises, naming it
        if descs[-1] is not None:  # the wall does not know the workspace: it overlaps something
            raise ValueError("workspace: overlaps an input or output of the call; pass a separate buffer")
        raise KdaError("internal error: a pointer check failed that the validation wall accepts")

    problem = plan.problem
    handle = _stream(torch, stream, problem.device_id) if torch is not None else handle
    outputs = _allocate(torch, q, plan, out, final_state, workspace, handle, stream, checkpoints, checkpoint_index)
    o, fs, ws_obj, ck, ck_index = outputs
    if torch is not None:
        ptrs[SLOT["out"]] = o.data_ptr()
        if fs is not None:
            ptrs[SLOT["final_state"]] = fs.data_ptr()
        if ws_obj is not None:
            ptrs[SLOT["workspace"]] = ws_obj.data_ptr()
        if ck is not None:
            ptrs[SLOT["checkpoints"]] = ck.data_ptr()
            ptrs[SLOT["checkpoint_index"]] = ck_index.data_ptr()
    else:
        ptrs[SLOT["out"]] = frameworks.data_ptr(o, "out")
        if fs is not None:
            ptrs[SLOT["final_state"]] = frameworks.data_ptr(fs, "final_state")
        if ck is not None:
            ptrs[SLOT["checkpoints"]] = frameworks.data_ptr(ck, "checkpoints")
            ptrs[SLOT["checkpoint_index"]] = frameworks.data_ptr(ck_index, "checkpoint_index")
    ptrs.append(handle)
    program = plan.launch.program
    if torch is None and not plan.workspace_given and plan.workspace_bytes:
        with ARENA.lease(problem.device_id, handle, plan.workspace_bytes) as base:
            ptrs[SLOT["workspace"]] = base
            program.run(pack_inputs(ptrs))
    else:
        program.run(pack_inputs(ptrs))
    if torch is None:
        o, fs, ck, ck_index = frameworks.deliver(q, tensors, (o, fs, ck, ck_index), problem.device_id, handle)
    if ck is not None:
        return o, (fs if output_final_state else None), Checkpoints(ck, ck_index)
    return o, (fs if output_final_state else None)


# ---------------------------------------------------------------------------------------------
# intake

def _describe_all(tensors, stream: int = -1) -> list:
    """Every argument's DLPack description (None for an absent one), in _TENSOR_ARGS order;
    `stream` is the DLPack consumer stream (tensors.describe)."""
    descs = []
    for name, t in zip(_TENSOR_ARGS, tensors):
        if t is not None:
            frameworks.check_argument(t, name)
        descs.append(None if t is None else describe(t, name, stream))
    return descs


def _intake_stream(q, stream) -> Optional[int]:
    """The call's stream for a caller that is not torch, known before the DLPack reads (they order
    the producers' writes before it); None when q is not device memory (the wall refuses it)."""
    frameworks.check_argument(q, "q")
    device_id = frameworks.cuda_device(q)
    if device_id is None:
        return None
    return _stream(None, stream, device_id, frameworks.default_stream(q, device_id))


def _torch_intake(Tensor, tensors):
    """(signature, pointers) of torch tensors in one pass, or None when an argument is not a torch
    tensor (the DLPack intake then reads every argument). The signature is everything the wall
    checks of a tensor except its address: dtype, shape, layout (True for a contiguous tensor, else
    its strides: strided views plan with their strides), device, and the neg bit (a neg view's
    memory holds the un-negated values). Flat, with None for an absent argument: each attribute
    read costs a few hundred nanoseconds on a serving host, nested tuples more, so the strides are
    read only for a tensor that is not contiguous."""
    sig, ptrs = [], []
    for t in tensors:
        if t is None:
            sig.append(None)
            ptrs.append(0)
        elif not isinstance(t, Tensor):
            return None
        else:
            sig += (t.dtype, t.shape, t.is_contiguous() or t.stride(), t.get_device(), t.is_neg())
            ptrs.append(t.data_ptr())
    return tuple(sig), ptrs


def _hint_key(seq_lens, cu_seqlens_cpu):
    """The host hint as a hashable key: ("lens", ...) or ("cu", ...), or None. Its values are
    checked against the problem when a plan is built; every entry must be a Python int here so
    that 1.0 or True can never hit a plan built for 1."""
    if seq_lens is not None and cu_seqlens_cpu is not None:
        raise ValueError("seq_lens: pass either seq_lens or cu_seqlens_cpu, not both")
    if seq_lens is not None:
        return ("lens", _int_tuple(_host_entries(seq_lens, "seq_lens"), "seq_lens"))
    if cu_seqlens_cpu is not None:
        return ("cu", _int_tuple(_host_entries(cu_seqlens_cpu, "cu_seqlens_cpu"), "cu_seqlens_cpu"))
    return None


def _int_tuple(items: list, name: str) -> tuple:
    """The entries (a list from validation._host_entries) as a tuple of Python ints: as they are
    when they already are (the common case, one type check each), else through int_entries, which
    takes numpy integers and refuses bools and floats naming the entry."""
    for item in items:
        if type(item) is not int:
            return tuple(int_entries(items, name))
    return tuple(items)


def _hint_lengths(hint, N: int, T: int) -> Optional[Tuple[int, ...]]:
    if hint is None:
        return None
    kind, values = hint
    return check_seq_lens(values, N, T) if kind == "lens" else check_cu_seqlens_host(values, N, T)


def _read_back_hint(torch, tensors, hint, stream, handle):
    """validate="host": copy cu_seqlens back (a synchronisation), check it, and plan with it.
    `handle`: the call's stream when the caller is not torch (None: q is not device memory)."""
    cu_obj, q_obj = tensors[SLOT["cu_seqlens"]], tensors[0]
    if cu_obj is None:
        return hint
    cu = describe(cu_obj, "cu_seqlens", frameworks.consumer_stream(handle))
    if cu.device != "cuda" or len(cu.shape) != 1 or cu.dtype not in ("int32", "int64"):
        return hint  # the wall refuses it, naming it
    q = describe(q_obj, "q", frameworks.consumer_stream(handle))
    if torch is not None or handle is None:
        handle = _stream(torch, stream, cu.device_id)
    if streams.is_capturing(handle):
        raise RuntimeError("validate: 'host' reads cu_seqlens back, which cannot happen while the stream is being "
                           "captured into a CUDA graph; use validate='device' there")
    values = read_device_array(cu, handle).tolist()
    T = q.shape[1] if len(q.shape) == 4 else 0
    check_cu_seqlens_values(values, T)
    read = ("cu", tuple(int(x) for x in values))
    if hint is not None and _hint_lengths(hint, len(values) - 1, T) != _hint_lengths(read, len(values) - 1, T):
        raise ValueError(f"{'seq_lens' if hint[0] == 'lens' else 'cu_seqlens_cpu'}: does not match cu_seqlens "
                         "read back from the device")
    return read


def _read_back_indices(torch, state_indices, state_pool, stream) -> None:
    """validate="host" with a state pool: copy state_indices back (a synchronisation) and refuse
    an index past the pool or a slot used by two sequences (their reads and writes would race)."""
    idx = describe(state_indices, "state_indices")
    pool = describe(state_pool, "state_pool")
    if idx.device != "cuda" or len(idx.shape) != 1 or idx.dtype != "int32" or len(pool.shape) != 4:
        return  # the wall refuses it, naming it
    handle = _stream(torch, stream, idx.device_id)
    if streams.is_capturing(handle):
        raise RuntimeError("validate: 'host' reads state_indices back, which cannot happen while the stream is "
                           "being captured into a CUDA graph; use validate='device' there")
    check_state_indices_host(read_device_array(idx, handle).tolist(), pool.shape[0])


def _check_indices_hint(values, state_indices, state_pool) -> None:
    """state_indices_cpu: the caller's host copy of state_indices, checked like a read-back one
    (no synchronisation; like seq_lens, it must match the device tensor)."""
    if state_pool is None or state_indices is None:
        raise ValueError("state_indices_cpu: a host copy of state_indices, given without state_pool / state_indices")
    entries = _host_entries(values, "state_indices_cpu")
    n = _leading_dim(state_indices, "state_indices")
    if len(entries) != n:
        raise ValueError(f"state_indices_cpu: expected {n} entries like state_indices, got {len(entries)}")
    check_state_indices_host(entries, _leading_dim(state_pool, "state_pool"))


def _leading_dim(obj, name: str) -> int:
    shape = getattr(obj, "shape", None)  # torch, CuPy, JAX, TensorDesc; else its DLPack description
    if shape is None:
        shape = describe(obj, name).shape
    if len(shape) < 1:
        raise ValueError(f"{name}: expected at least one dimension, got shape {tuple(shape)}")
    return int(shape[0])


def check_state_indices_host(values: Sequence[int], n_slots: int) -> None:
    """Host copy of state_indices: each entry < n_slots, no non-negative slot twice (negative
    entries are PAD_SLOT_ID-style "no state" and may repeat)."""
    seen = {}
    for i, x in enumerate(int_entries(values, "state_indices")):
        if x >= n_slots:
            raise ValueError(f"state_indices: entry {i} = {x} is past the pool's {n_slots} slots")
        if x >= 0:
            if x in seen:
                raise ValueError(f"state_indices: slot {x} appears at entries {seen[x]} and {i}; every sequence "
                                 "needs its own slot (two sequences on one slot would race in place)")
            seen[x] = i


def read_device_array(desc: TensorDesc, stream: int) -> np.ndarray:
    """Copy a small device array to the host, ordered after the work already on `stream`."""
    from cuda.bindings import driver

    host = np.empty(desc.shape, dtype=np.dtype(desc.dtype))
    if host.nbytes:
        (err,) = driver.cuMemcpyDtoHAsync(host.ctypes.data, desc.ptr, host.nbytes, driver.CUstream(stream))
        if err == driver.CUresult.CUDA_SUCCESS:
            (err,) = driver.cuStreamSynchronize(driver.CUstream(stream))
        if err != driver.CUresult.CUDA_SUCCESS:
            raise KdaError(f"{desc.name}: reading it back to the host failed: {err}")
    return host


# ---------------------------------------------------------------------------------------------
# plans

def _build_plan(descs, lower_bound, scale, output_final_state, cp, hint, value_split,
                checkpoint_every=None, numerics="flashkda", form=("safe", "logits", False)) -> CallPlan:
    """The whole wall on this call's descriptions, then the plan (raises naming the argument)."""
    t = dict(zip(_TENSOR_ARGS, descs))
    problem = validate_prefill(**{name: t[name] for name in prefill_args.NAMES}, lower_bound=lower_bound,
                               scale=scale, cp=cp, checkpoint_every=checkpoint_every, numerics=numerics,
                               gate=form[0], beta_form=form[1], allow_neg_eigval=form[2])
    if problem.checkpoint_every and problem.state_dtype is None:
        import dataclasses

        problem = dataclasses.replace(problem, state_dtype="float32")  # checkpoints default to fp32 like final states
    if output_final_state and not problem.has_final:
        # One state dtype per call (the kernels keep a single state format): the allocated final
        # state follows initial_state's dtype, fp32 when there is none.
        import dataclasses

        problem = dataclasses.replace(problem, has_final=True, state_dtype=problem.state_dtype or "float32")
    if hint is not None and not problem.varlen:
        raise ValueError(f"{'seq_lens' if hint[0] == 'lens' else 'cu_seqlens_cpu'}: a hint for packed input; "
                         "dense [B, T] input has no cu_seqlens")
    lengths = _hint_lengths(hint, problem.N, problem.T) if problem.varlen else (problem.T,) * problem.B
    if value_split is not None and value_split not in (1, 2, 4):
        raise ValueError(f"value_split: expected 1, 2 or 4, got {value_split!r}")
    lib = get_library()
    streams.check_architecture(problem.device_id)
    sms = streams.sm_count(problem.device_id) if problem.N and problem.H else 1
    given = {name: d is not None for name, d in t.items()}
    nbytes = {name: (extent_bytes(d) if d is not None else 0) for name, d in t.items()}
    alignment = {name: ALIGNMENT[name][d.dtype] for name, d in t.items() if d is not None and name in ALIGNMENT}
    plan = call_plan.build(lib, problem, lengths=lengths, sm_count=sms, value_split=value_split, given=given,
                           nbytes=nbytes, alignment=alignment)
    _check_workspace(t["workspace"], plan, problem)
    return plan


def _check_workspace(ws: Optional[TensorDesc], plan: CallPlan, problem) -> None:
    if ws is None:
        return
    if ws.device != "cuda" or ws.device_id != problem.device_id:
        raise TypeError(f"workspace: expected a device buffer on cuda:{problem.device_id}, got a {ws.device} "
                        f"buffer{'' if ws.device != 'cuda' else f' on cuda:{ws.device_id}'}")
    if not ws.is_contiguous():
        raise ValueError("workspace: must be contiguous")
    if ws.nbytes < plan.workspace_bytes:
        raise ValueError(f"workspace: this call needs {plan.workspace_bytes} bytes (kda_aot.workspace_size), "
                         f"the buffer has {ws.nbytes}")
    if ws.ptr % call_plan.WORKSPACE_ALIGN:
        raise ValueError(f"workspace: data pointer {ws.ptr:#x} is not {call_plan.WORKSPACE_ALIGN}-byte aligned")


def _remember(key, plan: CallPlan) -> None:
    with _PLANS_LOCK:
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.pop(next(iter(_PLANS)), None)
        _PLANS[key] = plan


# ---------------------------------------------------------------------------------------------
# streams and allocation

def _stream(torch, stream, device_id: int, default: Optional[int] = None) -> int:
    if stream is None and torch is not None:
        return torch._C._cuda_getCurrentRawStream(device_id)  # 0.3 us; torch.cuda.current_stream() is 4
    handle = default if stream is None and default is not None else streams.stream_handle(stream, device_id)
    if (handle, device_id) not in _KNOWN_STREAMS:
        # A raw handle would reach the launch unchecked: ask the driver once per (handle, device).
        # A handle destroyed and reused by a new stream keeps its entry: it is then valid again.
        check_stream_handle(handle, device_id, stream_device)
        if len(_KNOWN_STREAMS) >= 1024:
            _KNOWN_STREAMS.clear()
        _KNOWN_STREAMS.add((handle, device_id))
    return handle


_KNOWN_STREAMS: set = set()


def _allocate(torch, q, plan: CallPlan, out, final_state, workspace, handle: int, stream, checkpoints=None,
              checkpoint_index=None):
    """The outputs and workspace the caller did not pass. With torch they come from its caching
    allocator, which ties a block to the current stream: when the call runs on another stream,
    each block records that stream too, so it is not reused before this call's kernels finish."""
    new = []
    if plan.alloc_checkpoints:
        dtype = plan.problem.state_dtype
        checkpoints = (q.new_empty(plan.checkpoint_shape, dtype=getattr(torch, dtype)) if torch is not None
                       else frameworks.empty(q, plan.checkpoint_shape, dtype, plan.problem.device_id, handle))
        new.append(checkpoints)
    if plan.alloc_checkpoint_index:
        shape = (plan.problem.n_checkpoints, 2)
        checkpoint_index = (q.new_empty(shape, dtype=torch.int32) if torch is not None
                            else frameworks.empty(q, shape, "int32", plan.problem.device_id, handle))
        new.append(checkpoint_index)
    if out is None:
        out = q.new_empty(plan.out_shape) if torch is not None else frameworks.empty(
            q, plan.out_shape, "bfloat16", plan.problem.device_id, handle)
        new.append(out)
    if plan.alloc_final:
        if torch is not None:
            final_state = q.new_empty(plan.final_shape, dtype=getattr(torch, plan.final_dtype))
        else:
            final_state = frameworks.empty(q, plan.final_shape, plan.final_dtype, plan.problem.device_id, handle)
        new.append(final_state)
    ws = None
    if torch is not None and workspace is None and plan.workspace_bytes:
        ws = q.new_empty((plan.workspace_bytes,), dtype=torch.uint8)
        new.append(ws)
    if torch is not None and stream is not None and new:
        if handle != torch._C._cuda_getCurrentRawStream(plan.problem.device_id):
            side = torch.cuda.ExternalStream(handle, device=q.device)
            for t in new:
                t.record_stream(side)
    return out, final_state, ws, checkpoints, checkpoint_index




# ---------------------------------------------------------------------------------------------
# workspace queries, caches, info

def workspace_size(q: Any, k: Any, v: Any, g: Any, beta: Any, *, A_log: Any = None, dt_bias: Any = None,
                   lower_bound: Optional[float] = None,
                   scale: Optional[float] = None, initial_state: Any = None, output_final_state: bool = False,
                   cu_seqlens: Any = None, cp: Union[str, int] = "auto", out: Any = None, final_state: Any = None,
                   seq_lens: Optional[Sequence[int]] = None, cu_seqlens_cpu: Any = None,
                   value_split: Optional[int] = None, stream: Any = None, workspace: Any = None,
                   validate: str = "device", state_pool: Any = None, state_indices: Any = None,
                   checkpoint_every: Optional[int] = None, checkpoints: Any = None, checkpoint_index: Any = None,
                   state_indices_cpu: Any = None, numerics: str = "flashkda", gate: str = "safe",
                   beta_form: str = "logits", allow_neg_eigval: bool = False, checkpoint_offsets: Any = None,
                   checkpoint_state: Any = None, checkpoint_slots: Any = None) -> int:
    """Bytes of `workspace=` that prefill needs for these arguments (validated as prefill would).
    `stream`, `workspace`, `validate` and `state_indices_cpu` are accepted so that prefill's own
    keyword arguments can be passed unchanged; they do not change the size (nor does `numerics`, which is checked)."""
    tensors = (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, out, final_state, state_pool,
               state_indices, checkpoints, checkpoint_index, checkpoint_state, checkpoint_offsets, checkpoint_slots,
               None)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(q, torch.Tensor):
        descs = _describe_all(tensors)
    else:  # DLPack reads need a consumer stream (JAX refuses -1)
        descs = _describe_all(tensors, frameworks.consumer_stream(_intake_stream(q, stream)))
    hint = _hint_key(seq_lens, cu_seqlens_cpu)
    if state_pool is not None and output_final_state:
        raise ValueError("state_pool: cannot be combined with output_final_state; the final states are written "
                         "back into the pool at state_indices")
    return _build_plan(descs, lower_bound, scale, output_final_state, cp, hint, value_split,
                       checkpoint_every, numerics, (gate, beta_form, allow_neg_eigval)).workspace_bytes


def workspace_size_for(T: int, H: int, *, N: int = 1, varlen: bool = False, cu_dtype: str = "int32",
                       seq_lens: Optional[Sequence[int]] = None, cp: Union[str, int] = "auto", sm_count: int = 132,
                       has_initial: bool = False, has_final: bool = False,
                       checkpoint_every: Optional[int] = None, checkpoint_k: int = 0) -> int:
    """Bytes of workspace for a problem given by its shapes: dense [N, T] (varlen=False) or packed T
    tokens in N sequences (varlen=True, optional host `seq_lens`), H heads, on `sm_count` SMs.
    `checkpoint_k`: checkpoints at given offsets per sequence (0, 1 or 2; checkpoint_offsets' K)."""
    from .plan import launcher
    from .intake.validation import check_checkpoint_every
    from .spec.problem import Problem, parse_cp

    for name, value in (("T", T), ("H", H), ("N", N), ("sm_count", sm_count)):
        if type(value) is not int or value < (1 if name in ("H", "sm_count") else 0):
            raise ValueError(f"{name}: expected a non-negative int{' >= 1' if name in ('H', 'sm_count') else ''}, "
                             f"got {value!r}")
    if checkpoint_k not in (0, 1, 2) or type(checkpoint_k) is not int:
        raise ValueError(f"checkpoint_k: expected 0, 1 or 2 (checkpoints at given offsets per sequence), "
                         f"got {checkpoint_k!r}")
    if checkpoint_k and checkpoint_every is not None:
        raise ValueError("checkpoint_k: cannot be combined with checkpoint_every")
    B = 1 if varlen else N
    every = check_checkpoint_every(checkpoint_every)
    problem = Problem(B=B, T=T, H=H, N=N, varlen=varlen, cu_dtype=cu_dtype if varlen else None,
                      state_dtype="float32" if (has_initial or has_final) else None, has_initial=has_initial,
                      has_final=has_final, scale=D ** -0.5, lower_bound=-5.0, device_id=0, cp=parse_cp(cp),
                      checkpoint_every=every, n_checkpoints=(B * T) // every if every else 0,
                      checkpoint_k=checkpoint_k, checkpoint_into="buffer" if checkpoint_k else None,
                      checkpoint_offsets_dtype="int32" if checkpoint_k else None)
    if varlen:
        lengths = _hint_lengths(_hint_key(seq_lens, None), N, T)
    else:
        lengths = (T,) * N
    return launcher.workspace_bytes(problem, call_plan.segmentation(problem, lengths, sm_count))


def empty_cache() -> None:
    """Free every workspace this process holds (waiting for the work queued on it first), release
    what JAX calls still hold (their inputs, outputs JAX let go of), and forget the prepared plans.
    Torch callers' workspaces are torch's: torch.cuda.empty_cache() frees those."""
    ARENA.release()
    pending.drain()
    with _PLANS_LOCK:
        _PLANS.clear()


def info(full: bool = False) -> dict:
    """What is installed and whether it can run, as a small dict.

    Always: version; then either library=None and error (why the library did not load), or
    library (its path), flavour (CUDA flavour, cu12 or cu13), dsl_version, git_revision,
    kernel_count and devices (visible CUDA devices), with device_error saying why when there are
    none. full=True adds library_dir, manifest (the whole build record) and kernels (the names).
    """
    # The manifest alone is some 40 kernel records: printing info() must stay readable, so the
    # record is only returned on request.
    result = {"version": __version__}
    try:
        lib = get_library()
    except (KdaError, OSError) as exc:
        result.update(library=None, error=str(exc))
        if full:
            result["library_dir"] = str(library_dir())
        return result
    manifest = lib.manifest
    result.update(library=str(lib.path), flavour=manifest.get("cuda_flavour"),
                  dsl_version=manifest.get("dsl_version"), git_revision=manifest.get("git_revision"),
                  kernel_count=len(lib.kernels))
    try:
        result["devices"] = lib.device_count()
    except CudaError as exc:
        import ctypes
        import ctypes.util

        result["devices"] = 0
        # The runtime dlopens libcuda.so.1 (the name the driver installs), so loading that name is
        # the test; find_library also sees a libcuda.so that only ldconfig knows.
        try:
            ctypes.CDLL("libcuda.so.1")
            driver_present = True
        except OSError:
            driver_present = ctypes.util.find_library("cuda") is not None
        # CUDA's static runtime answers error 35 (cudaErrorInsufficientDriver) both for an old
        # driver and for no driver at all; only the absence of libcuda tells the two apart. The
        # CUDA error stays in the text: scripts match its number (ci/check_wheel.sh).
        result["device_error"] = (f"no NVIDIA driver found (libcuda.so.1 cannot be loaded); {exc}"
                                  if not driver_present else str(exc))
    if full:
        result.update(library_dir=str(library_dir()), manifest=manifest, kernels=sorted(lib.kernels))
    return result
