"""KDA prefill inside jax.jit: an XLA FFI custom call into the prebuilt library (docs/frameworks.md).

    import kda_aot.jax                 # imports JAX (plain `import kda_aot` never does)
    o, final_state = jax.jit(lambda q, k, v, g, beta: kda_aot.jax.prefill(
        q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, output_final_state=True))(q, k, v, g, beta)

While JAX traces, `prefill` checks the arguments' shapes, dtypes and forms with kda_aot.prefill's
validation wall (errors name the argument), plans the call for those shapes and binds one
`jax.ffi.ffi_call` whose attributes carry the whole kernel program. At run time XLA calls the
library's handler (build_kernels/shim/kda_xla.c), which patches the call's buffer addresses and
XLA's stream into the program and launches it, with no Python in the way and nothing read back to
the host; the handler is command-buffer compatible, so XLA may capture it into CUDA graphs.

Outputs are new arrays: `(o, final_state)` (final_state None unless output_final_state), or
`(o, state_pool)` with a state pool, where the returned pool aliases the argument
(input_output_aliases): donate the pool (`jax.jit(..., donate_argnums=...)`) and XLA updates it in
place, else XLA copies it first. The workspace is an extra result of the custom call, so XLA's
buffer assignment provides it. Forward only: differentiating through it raises, naming the
missing backward.
"""

from __future__ import annotations

import ctypes
import functools
import re
import threading
from typing import Any, NamedTuple, Optional, Sequence, Tuple, Union

import jax  # absolute: the top-level jax
import numpy as np

from . import api
from .intake import arguments, dtypes
from .intake.tensors import TensorDesc
from .intake.validation import check_call
from .library import streams
from .library.constants import WORKSPACE_ALIGN
from .library.loader import get_library
from .plan.program import N_INPUTS, SLOT
from .spec import prefill_args
from .spec.call_options import CallOptions

# The first JAX with jax.ffi (ffi_call with input_output_aliases, register_ffi_target, pycapsule),
# whose XLA speaks FFI API 0.1, the version the handler declares; later XLAs accept 0.1 handlers.
JAX_MIN = (0, 5)
SUPPORTED = "JAX 0.5 or newer with its CUDA plugin (jax[cuda12] or jax[cuda13])"


def _jax_version() -> Tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", jax.__version__)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


if _jax_version() < JAX_MIN or not hasattr(jax, "ffi"):
    raise ImportError(f"kda_aot.jax needs {SUPPORTED}; this is JAX {jax.__version__}")

# Arguments of kda_aot.prefill that kda_aot.jax.prefill does not take, and why.
_NOT_TAKEN = {
    **dict.fromkeys(("out", "final_state", "workspace"), "JAX arrays are immutable: the outputs are returned as "
                    "new arrays and the workspace is XLA's"),
    "stream": "XLA runs the call on its own stream",
    "validate": "reading cu_seqlens back to the host cannot happen inside jit",
    **dict.fromkeys(("cu_seqlens_cpu", "state_indices_cpu"), "pass host lengths as seq_lens (static Python "
                    "ints) instead"),
    "value_split": "it is a measurement option of kda_aot.prefill",
    **dict.fromkeys(("checkpoint_every", "checkpoints", "checkpoint_index", "checkpoint_offsets",
                     "checkpoint_state", "checkpoint_slots"), "checkpoints are taken by kda_aot.prefill (eager)"),
    "segment_ids": "it leaves the unlisted sequences' rows of caller-owned outputs untouched, and JAX outputs are "
                   "new arrays; call kda_aot.prefill (eager) with out= and final_state=",
}

# The custom call's operands, in this order (each only when given).
_OPERANDS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens", "state_pool",
             "state_indices")
_ALIGN = prefill_args.ALIGNMENT


def prefill(q: Any, k: Any, v: Any, g: Any, beta: Any, *, A_log: Any = None, dt_bias: Any = None,
            lower_bound: Optional[float] = None, scale: Optional[float] = None, initial_state: Any = None,
            output_final_state: bool = False, cu_seqlens: Any = None, seq_lens: Optional[Sequence[int]] = None,
            cp: Union[str, int] = "auto", numerics: str = "flashkda", gate: str = "safe",
            beta_form: str = "logits", allow_neg_eigval: bool = False, state_pool: Any = None,
            state_indices: Any = None, **not_taken: Any) -> Tuple[Any, Any]:
    """KDA prefill as an XLA custom call: usable inside jax.jit (and eagerly).

    The arguments are kda_aot.prefill's (docs/api.md) as JAX arrays on a CUDA device: q, k, v, g
    bf16 [B, T, H, 128]; beta [B, T, H]; A_log fp32 [H]; dt_bias fp32 [H, 128] or [H*128];
    initial_state [N, H, 128, 128] bf16 or fp32; cu_seqlens int32 (int64 with jax_enable_x64)
    [N + 1], read on the device only; `seq_lens` optional static host lengths for the CP planner;
    the gate and beta forms, numerics and cp as kda_aot.prefill takes them. Scalars and options
    are static Python values.

    Returns (o, final_state): o bf16 [B, T, H, 128], final_state [N, H, 128, 128] (initial_state's
    dtype, else fp32) or None unless output_final_state. With `state_pool` [S, H, 128, 128] and
    `state_indices` int32 [N] (docs/state_pool.md) it returns (o, state_pool'), the pool with each
    sequence's final state written to its slot; the result aliases the argument, so a donated pool
    is updated in place. Not differentiable (forward only)."""
    for name in not_taken:
        why = _NOT_TAKEN.get(name)
        raise TypeError(f"{name}: not taken by kda_aot.jax.prefill ({why})" if why else
                        f"prefill() got an unexpected keyword argument {name!r}")
    arrays = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state,
                  cu_seqlens=cu_seqlens, state_pool=state_pool, state_indices=state_indices)
    given = tuple(name for name in _OPERANDS if arrays[name] is not None)
    for name in given:
        arrays[name] = _array(arrays[name], name)
    signature = tuple((name,) + _aval(arrays[name], name) for name in given)
    options = CallOptions(lower_bound=lower_bound, scale=scale, output_final_state=output_final_state, cp=cp,
                          numerics=numerics, gate=gate, beta_form=beta_form, allow_neg_eigval=allow_neg_eigval,
                          hint=arguments.hint_key(seq_lens, None))
    try:
        key = (signature, options.key())
        hash(key)
    except TypeError:  # an unhashable option: the wall names it
        key = None
    call = _prepared(key) if key is not None else _prepare(signature, options)
    if call is None:  # nothing to compute (no sequence or no head): empty outputs
        o, final = _empty_outputs(signature, options)
        return (o, arrays["state_pool"]) if state_pool is not None else (o, final)
    results = call.run(*(arrays[name] for name in given))
    o = results[0]
    if state_pool is not None:
        return o, results[1]
    return o, (results[1] if output_final_state else None)


# ---------------------------------------------------------------------------------------------
# trace time: the wall, the plan, the custom call

def _array(x: Any, name: str) -> Any:
    """A JAX array or tracer as it is; another array (NumPy) as the JAX array the custom call will
    receive (JAX's dtype: int64 becomes int32 without jax_enable_x64)."""
    if isinstance(x, jax.Array):
        return x
    if getattr(x, "shape", None) is None or getattr(x, "dtype", None) is None:
        raise TypeError(f"{name}: expected a JAX array, got {type(x).__name__}")
    return jax.numpy.asarray(x)


def _aval(x: Any, name: str) -> Tuple[Tuple[int, ...], str]:
    """(shape, dtype name) of an array argument."""
    shape, dtype = x.shape, x.dtype
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(f"{name}: a symbolic shape {tuple(shape)}; kda_aot.jax.prefill plans for concrete "
                        "shapes") from None
    dtype = str(np.dtype(dtype))
    if not dtypes.is_known(dtype):
        raise TypeError(f"{name}: dtype {dtype} is not supported; expected one of {dtypes.supported_list()} "
                        "(nothing is cast)")
    return shape, dtype


def _descriptions(signature, device_id: int) -> list:
    """The wall's descriptions of the arguments: their shapes and dtypes, packed row-major (as XLA
    lays them out for the custom call), and distinct addresses that every alignment divides (the
    buffers' own addresses are checked by the handler)."""
    found = {}
    for index, (name, shape, dtype) in enumerate(signature):
        strides, acc = [], 1
        for size in reversed(shape):
            strides.append(acc)
            acc *= max(size, 1)
        found[name] = TensorDesc(name=name, ptr=(index + 1) << 40, shape=shape, strides=tuple(reversed(strides)),
                                 dtype=dtype, device="cuda", device_id=device_id)
    return [found.get(name) for name in arguments.TENSOR_ARGS]


def _cuda_devices() -> Tuple[int, ...]:
    """The CUDA ordinals of JAX's local CUDA devices (none without JAX's CUDA plugin)."""
    try:
        devices = jax.local_devices(backend="cuda")
    except Exception:  # noqa: BLE001 - no CUDA backend in this JAX (its error type varies by release)
        return ()
    return tuple(int(d.local_hardware_id if d.local_hardware_id is not None else d.id) for d in devices)


def _require_cuda(devices) -> None:
    if not devices:
        try:
            backends = sorted({d.platform for d in jax.devices()})
        except Exception:  # noqa: BLE001
            backends = []
        raise RuntimeError(f"kda_aot.jax.prefill runs on CUDA devices only (the library holds sm_90a code), and "
                           f"JAX has none here (devices: {', '.join(backends) or 'none'}); it needs {SUPPORTED} "
                           "and a Hopper GPU")


class _Call(NamedTuple):
    """A planned custom call: what ffi_call binds for one key."""

    run: Any  # the jax.custom_vjp function of the operands


@functools.lru_cache(maxsize=256)
def _prepared(key) -> Optional[_Call]:
    signature, (options, _) = key
    return _prepare(signature, options)


def _prepare(signature, options: CallOptions) -> Optional[_Call]:
    names = [name for name, _, _ in signature]
    devices = _cuda_devices()
    hopper = [d for d in devices if _is_hopper(d)]
    device_id = (hopper or devices or (0,))[0]
    descs = _descriptions(signature, device_id)
    t = dict(zip(arguments.TENSOR_ARGS, descs))
    arguments.check_pool_options(t["state_pool"], options.output_final_state)
    problem, lengths = check_call(descs, options)
    _require_cuda(devices)
    plan = api._plan(descs, problem, lengths, None)  # refuses a device that is not Hopper, naming it
    program = plan.launch.program
    if not program.names:
        return None
    lib = get_library()
    for other in hopper:  # XLA runs the executable on whichever device it is placed on
        lib.ensure_loaded(program.names, other)
    steps, slots = program.tables()

    pooled = t["state_pool"] is not None
    results = [("out", plan.out_shape, "bfloat16")]
    if plan.final_shape is not None and not pooled:
        results.append(("final_state", plan.final_shape, plan.final_dtype))
    if pooled:
        results.append(("state_pool", t["state_pool"].shape, t["state_pool"].dtype))
    # XLA's buffers are aligned to less than the workspace needs: one alignment more, and the
    # handler starts the workspace at the first aligned byte.
    results.append(("workspace", (plan.workspace_bytes + WORKSPACE_ALIGN,), "uint8"))

    buffers, align = [], []
    for name in names:  # the pool's slot is filled by its result, the same buffer (aliased)
        buffers.append(-1 if name == "state_pool" else SLOT[name])
        align.append(_ALIGN[name][t[name].dtype] - 1)
    for name, _, dtype in results:
        buffers.append(SLOT[name])
        align.append(0 if name == "workspace" else _ALIGN[name][dtype] - 1)
    attributes = dict(
        steps=steps, slots=slots,
        inputs=np.array([N_INPUTS, SLOT["workspace"], WORKSPACE_ALIGN, SLOT["stream"]], np.int32),
        buffers=np.array(buffers, np.int32), align=np.array(align, np.int64),
        names=",".join(names + [name for name, _, _ in results]))
    call = jax.ffi.ffi_call(
        _register(), [jax.ShapeDtypeStruct(shape, np.dtype(_dtype(dtype))) for _, shape, dtype in results],
        input_output_aliases={names.index("state_pool"): 1} if pooled else None, vmap_method="sequential")

    @jax.custom_vjp
    def run(*operands):
        return tuple(call(*operands, **attributes)[:-1])  # the workspace stays inside

    def run_fwd(*operands):
        return run(*operands), None

    def run_bwd(_, cotangents):
        raise NotImplementedError("kda_aot.jax.prefill has no backward: kda-aot computes the KDA prefill forward "
                                  "only (no gradient kernels exist); differentiate around it, for example with "
                                  "jax.lax.stop_gradient on its inputs")

    run.defvjp(run_fwd, run_bwd)
    return _Call(run)


def _is_hopper(device_id: int) -> bool:
    try:
        return streams.compute_capability(device_id)[0] == 9
    except Exception:  # noqa: BLE001 - unreadable: the plan's architecture check names the device
        return False


def _dtype(name: str):
    if name == "bfloat16":
        return jax.numpy.bfloat16
    return np.dtype(name)


def _empty_outputs(signature, options):
    """The outputs of a call with nothing to compute (no sequence or no head), as the wall shaped
    them: every one is empty."""
    t = {name: (shape, dtype) for name, shape, dtype in signature}
    B, T, H, _ = t["q"][0]
    o = jax.numpy.zeros((B, T, H, 128), jax.numpy.bfloat16)
    if not options.output_final_state:
        return o, None
    N = t["cu_seqlens"][0][0] - 1 if "cu_seqlens" in t else B
    dtype = t["initial_state"][1] if "initial_state" in t else "float32"
    return o, jax.numpy.zeros((N, H, 128, 128), _dtype(dtype))


# ---------------------------------------------------------------------------------------------
# the FFI target

_REGISTERED: set = set()
_REGISTER_LOCK = threading.Lock()


def _register(platform: str = "CUDA") -> str:
    """Register the library's handler with JAX's XLA once (for `platform`, CUDA only) and return the
    target's name. The name carries the library's ABI hash, so an executable compiled against
    another build of the kernels (a persistent compilation cache) finds no target rather than the
    wrong kernels."""
    if not isinstance(platform, str) or platform.upper() != "CUDA":
        raise ValueError(f"platform: kda_aot's XLA FFI target runs on CUDA only (the library holds sm_90a "
                         f"machine code and launches with CUDA), got {platform!r}")
    lib = get_library()
    name = "kda_aot_prefill_" + str(lib.manifest.get("abi_hash", ""))[:16]
    with _REGISTER_LOCK:
        if name not in _REGISTERED:
            jax.ffi.register_ffi_target(name, _capsule(lib.xla_handler()), platform="CUDA", api_version=1)
            _REGISTERED.add(name)
    return name


def _capsule(function) -> Any:
    """A PyCapsule of a ctypes function pointer, as jax.ffi.pycapsule makes it, through a function
    object of our own: jax.ffi.pycapsule sets the argtypes of the process's shared
    ctypes.pythonapi.PyCapsule_New, which other code (kda_aot's DLPack export among it) also calls."""
    new = ctypes.pythonapi["PyCapsule_New"]
    new.restype = ctypes.py_object
    new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    return new(ctypes.cast(function, ctypes.c_void_p), None, None)


__all__ = ["prefill", "JAX_MIN", "SUPPORTED"]
