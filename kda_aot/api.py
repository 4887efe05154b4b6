"""Public functions: `prefill`, `workspace_size`, `empty_cache` and `info`.

`prefill` is the validation wall's only door, in four steps (docs/call_path.md): intake
(intake/arguments.py reads the tensors and the stream), the host hints (the same module), the wall
and the plan (the first call of a problem shape runs the whole wall, intake/validation.py, and
builds a CallPlan, plan/call_plan.py; later calls of that shape find it by key and repeat the
pointer checks), and the launch (allocate what the caller did not pass and run the whole kernel
sequence with one native call). Nothing is read back to the host unless the caller asks
(`validate="host"`), so a call never synchronises and can be captured into a CUDA graph
(docs/call_path.md).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, NamedTuple, Optional, Sequence, Tuple, Union

from ._version import __version__
from .intake import arguments, frameworks, pending
from .intake.by_name import reads_by_name
from .intake.tensors import TensorDesc
from .intake.validation import ALIGNMENT, check_call, extent_bytes, hint_lengths
from .library import streams
from .library.constants import D
from .library.loader import CudaError, KdaError, get_library, library_dir
from .plan import call_plan
from .plan.call_plan import CallPlan, UnsafePointers
from .plan.program import SLOT, pack_inputs
from .plan.workspace import ARENA
from .spec.call_options import PLANNED, CallOptions


class Checkpoints(NamedTuple):
    """The checkpoint states of a prefill with checkpoint_every=C (docs/state_pool.md).

    states: [B*T // C, H, 128, 128] in the state dtype; slot s holds the state of sequence
    index[s, 0] after its first index[s, 1] tokens. index: int32 [B*T // C, 2], (-1, -1) for a
    slot that holds no checkpoint (its states entry is then not written)."""

    states: Any
    index: Any


# CallPlans by key (shapes, dtypes, devices, scalars, options; never a pointer or a caller's object).
_PLANS: dict = {}
_PLANS_LOCK = threading.Lock()
_PLANS_MAX = 512


def _prefill(tensors: tuple, planned: tuple, stream, output_final_state, validate, seq_lens, cu_seqlens_cpu,
             state_indices_cpu) -> Tuple[Any, ...]:
    """prefill's work: `tensors` in TENSOR_ARGS order and `planned`, the options in PLANNED order."""
    torch, sig, ptrs, descs, handle, hint = arguments.intake(
        tensors, stream, output_final_state, validate, seq_lens, cu_seqlens_cpu, state_indices_cpu)
    plan = _plan_for(tensors, sig, ptrs, descs, CallOptions.of(planned, hint))
    return _launch(plan, torch, tensors, ptrs, handle, stream, output_final_state)


@reads_by_name(_prefill, arguments.TENSOR_ARGS, PLANNED, "stream", "output_final_state", "validate", "seq_lens",
               "cu_seqlens_cpu", "state_indices_cpu")
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
            checkpoint_slots: Any = None, segment_ids: Any = None) -> Tuple[Any, ...]:
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

    Listed sequences (docs/state_pool.md): `segment_ids` int32 [M] on the device runs the
    recurrence over the listed sequences only. Their outputs, final states and checkpoints are
    those of the call without the list, bit for bit; every other sequence's `out` rows, final
    state (or pool slot) and checkpoints are left untouched, and an empty list writes nothing.
    The work follows the listed sequences' tokens. Entries are never read on the host: the device
    skips an entry outside [0, N) and runs a repeated one once; validate="host" refuses both.
    """
    # The body is compiled from the names of the decorator's groups (intake/by_name.py): it calls
    # _prefill with this call's tensors and plan-shaping options as tuples in the tables' order.


# ---------------------------------------------------------------------------------------------
# plans

def _plan_for(tensors, sig, ptrs, descs, options: CallOptions) -> CallPlan:
    """The call's plan: the cached one of its key, else the whole wall and a new plan (raises naming
    the argument); then the pointer checks of this call's addresses."""
    try:
        key = (sig, options.key())
        plan = _PLANS.get(key)
    except TypeError:  # an unhashable option: let the wall name it
        key, plan = None, None
    if plan is None:
        descs = descs or arguments.describe_all(tensors)
        plan = _build_plan(descs, options)
        if key is not None:
            _remember(key, plan)
    try:
        plan.check_pointers(ptrs)
    except UnsafePointers:
        descs = descs or arguments.describe_all(tensors)
        _build_plan(descs, options)  # raises, naming it
        if descs[-1] is not None:  # the wall does not know the workspace: it overlaps something
            raise ValueError("workspace: overlaps an input or output of the call; pass a separate buffer")
        raise KdaError("internal error: a pointer check failed that the validation wall accepts")
    return plan


def _build_plan(descs, options: CallOptions) -> CallPlan:
    """The whole wall on this call's descriptions (intake/validation.check_call), then the plan
    (raises naming the argument)."""
    problem, lengths = check_call(descs, options)
    return _plan(descs, problem, lengths, options.value_split)


def _plan(descs, problem, lengths, value_split) -> CallPlan:
    """The plan of a problem the wall accepted, on its device (the first use of a device reads its
    architecture and SM count)."""
    t = dict(zip(arguments.TENSOR_ARGS, descs))
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
# launch and allocation

# the pointer slots _launch fills, read once here rather than by name on every call
_OUT, _FINAL_STATE, _WORKSPACE, _CHECKPOINTS, _CHECKPOINT_INDEX = (
    SLOT[n] for n in ("out", "final_state", "workspace", "checkpoints", "checkpoint_index"))


def _launch(plan: CallPlan, torch, tensors, ptrs, handle, stream, output_final_state) -> Tuple[Any, ...]:
    """Allocate what the caller did not pass, complete the pointer vector, run the plan's program
    (one native call) and hand the outputs back in the caller's framework."""
    problem = plan.problem
    q = tensors[0]
    handle = arguments.call_stream(torch, stream, problem.device_id) if torch is not None else handle
    o, fs, ws_obj, ck, ck_index = _allocate(torch, q, plan, tensors[_OUT], tensors[_FINAL_STATE],
                                            tensors[_WORKSPACE], handle, stream, tensors[_CHECKPOINTS],
                                            tensors[_CHECKPOINT_INDEX])
    if torch is not None:
        ptrs[_OUT] = o.data_ptr()
        if fs is not None:
            ptrs[_FINAL_STATE] = fs.data_ptr()
        if ws_obj is not None:
            ptrs[_WORKSPACE] = ws_obj.data_ptr()
        if ck is not None:
            ptrs[_CHECKPOINTS] = ck.data_ptr()
            ptrs[_CHECKPOINT_INDEX] = ck_index.data_ptr()
    else:
        ptrs[_OUT] = frameworks.data_ptr(o, "out")
        if fs is not None:
            ptrs[_FINAL_STATE] = frameworks.data_ptr(fs, "final_state")
        if ck is not None:
            ptrs[_CHECKPOINTS] = frameworks.data_ptr(ck, "checkpoints")
            ptrs[_CHECKPOINT_INDEX] = frameworks.data_ptr(ck_index, "checkpoint_index")
    ptrs.append(handle)
    program = plan.launch.program
    if torch is None and not plan.workspace_given and plan.workspace_bytes:
        with ARENA.lease(problem.device_id, handle, plan.workspace_bytes) as base:
            ptrs[_WORKSPACE] = base
            program.run(pack_inputs(ptrs))
    else:
        program.run(pack_inputs(ptrs))
    if torch is None:
        o, fs, ck, ck_index = frameworks.deliver(q, tensors, (o, fs, ck, ck_index), problem.device_id, handle)
    if ck is not None:
        return o, (fs if output_final_state else None), Checkpoints(ck, ck_index)
    return o, (fs if output_final_state else None)


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

def _workspace_size(tensors: tuple, planned: tuple, stream, seq_lens, cu_seqlens_cpu, state_pool,
                    output_final_state) -> int:
    """workspace_size's work, on prefill's groups; the workspace is not described (it does not
    change the size)."""
    tensors = tensors[:-1] + (None,)
    q = tensors[0]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(q, torch.Tensor):
        descs = arguments.describe_all(tensors)
    else:  # DLPack reads need a consumer stream (JAX refuses -1)
        descs = arguments.describe_all(tensors, frameworks.consumer_stream(arguments.intake_stream(q, stream)))
    arguments.check_pool_options(state_pool, output_final_state)
    return _build_plan(descs, CallOptions.of(planned, arguments.hint_key(seq_lens, cu_seqlens_cpu))).workspace_bytes


@reads_by_name(_workspace_size, arguments.TENSOR_ARGS, PLANNED, "stream", "seq_lens", "cu_seqlens_cpu", "state_pool",
               "output_final_state", unused=("validate", "state_indices_cpu"))
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
                   checkpoint_state: Any = None, checkpoint_slots: Any = None, segment_ids: Any = None) -> int:
    """Bytes of `workspace=` that prefill needs for these arguments (validated as prefill would).
    `stream`, `workspace`, `validate` and `state_indices_cpu` are accepted so that prefill's own
    keyword arguments can be passed unchanged; they do not change the size (nor does `numerics`, which is checked)."""
    # The body is compiled from the names of the decorator's groups (intake/by_name.py), as prefill's.


def workspace_size_for(T: int, H: int, *, N: int = 1, varlen: bool = False, cu_dtype: str = "int32",
                       seq_lens: Optional[Sequence[int]] = None, cp: Union[str, int] = "auto", sm_count: int = 132,
                       has_initial: bool = False, has_final: bool = False,
                       checkpoint_every: Optional[int] = None, checkpoint_k: int = 0, listed: bool = False) -> int:
    """Bytes of workspace for a problem given by its shapes: dense [N, T] (varlen=False) or packed T
    tokens in N sequences (varlen=True, optional host `seq_lens`), H heads, on `sm_count` SMs.
    `checkpoint_k`: checkpoints at given offsets per sequence (0, 1 or 2; checkpoint_offsets' K);
    `listed`: a call with `segment_ids` (of any length)."""
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
                      checkpoint_offsets_dtype="int32" if checkpoint_k else None, listed=bool(listed))
    if varlen:
        lengths = hint_lengths(arguments.hint_key(seq_lens, None), N, T)
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
