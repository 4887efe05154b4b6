"""What differs between the frameworks of callers that are not torch: CuPy, JAX, any DLPack producer.

The framework is q's, read from the module of its type; nothing is imported that the caller has not
imported already (a CuPy caller has imported cupy, a JAX caller jax). docs/frameworks.md has the
design; in short:

* Stream: `stream=` when given; else CuPy's current stream for CuPy callers, one of JAX's streams
  for external ready events (streams JAX keeps for work it did not issue; taken once per device)
  for JAX callers, the legacy default stream for anyone else.
* Intake: every device argument is read through DLPack with that stream as the consumer stream, so
  the producer orders its pending writes before our kernels (an event wait on the device when the
  streams differ; nothing when they are the same). The DLPack protocol's stream numbers: 1 is the
  legacy default stream (0 is not allowed), -1 asks for no ordering (used only for host memory,
  which the wall refuses anyway).
* Outputs not passed: CuPy arrays from CuPy's pool on the call's stream; for JAX, memory kda_aot
  allocates (cuda.core, stream-ordered on the call's stream) and hands to JAX through DLPack
  (dlpack_export.py), freed after JAX lets go of it (pending.py).
* JAX arrays are immutable, so a JAX array as out=, final_state= or workspace= is refused naming
  it, and so is a JAX tracer anywhere (prefill is an eager call; kda_aot.jax.prefill is the one for jax.jit).
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

import numpy as np

from . import pending
from .dlpack_export import KDL_CUDA, DLPackExport
from .tensors import TensorDesc, describe

CUPY, JAX, OTHER = "cupy", "jax", "dlpack"
_OUTPUTS = ("out", "final_state", "workspace")


def framework(obj: Any) -> str:
    root = type(obj).__module__.split(".")[0]
    if root == "cupy":
        return CUPY
    if root in ("jax", "jaxlib"):
        return JAX
    return OTHER


def check_argument(obj: Any, name: str) -> None:
    """Refuse what no DLPack read can make right: JAX tracers, JAX arrays as outputs."""
    if framework(obj) != JAX:
        return
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(obj, jax.core.Tracer):
        raise TypeError(f"{name}: a JAX tracer (inside jax.jit, vmap, grad, ...): kda_aot.prefill runs eagerly on "
                        "concrete device arrays; inside jit call kda_aot.jax.prefill, an XLA custom call, or call "
                        "kda_aot.prefill outside jit (docs/frameworks.md)")
    if name in _OUTPUTS:
        raise TypeError(f"{name}: a JAX array is immutable and kda_aot writes {name} in place; leave {name} out "
                        "(kda_aot then allocates it and returns a new JAX array)")


def cuda_device(obj: Any) -> Optional[int]:
    """The CUDA device ordinal of a DLPack producer's memory, or None when it is not device memory."""
    if isinstance(obj, TensorDesc):  # a description built by hand (tests, tools)
        return obj.device_id if obj.device == "cuda" else None
    try:
        device_type, device_id = obj.__dlpack_device__()
    except Exception:  # noqa: BLE001 - not a producer, or a broken one: the intake names it
        return None
    return int(device_id) if int(device_type) == KDL_CUDA else None


def default_stream(q: Any, device_id: int) -> Optional[int]:
    """The stream a call without `stream=` runs on for q's framework; None: the generic default."""
    kind = framework(q)
    if kind == CUPY:
        return int(sys.modules["cupy"].cuda.get_current_stream(device_id).ptr)
    if kind == JAX:
        handle = _JAX_STREAMS.get(device_id)
        if handle is None:
            # JAX hands these out from a pool, round robin: take one per device, once, so that
            # every JAX call on a device is queued on the same stream, in call order.
            try:
                handle = int(next(iter(q.devices())).get_stream_for_external_ready_events())
            except Exception:  # noqa: BLE001 - a backend without one (UNIMPLEMENTED): legacy default
                handle = 0
            _JAX_STREAMS[device_id] = handle
        return handle
    return None


_JAX_STREAMS: dict = {}  # device ordinal -> the stream JAX callers run on


def consumer_stream(handle: Optional[int]) -> int:
    """The DLPack `stream` argument for our stream `handle` (None: no device memory, no ordering)."""
    if handle is None:
        return -1
    return 1 if handle == 0 else handle


def empty(q: Any, shape: Tuple[int, ...], dtype: str, device_id: int, handle: int) -> Any:
    """An uninitialised output for q's framework, on the call's stream."""
    kind = framework(q)
    if kind == CUPY:
        cupy = sys.modules["cupy"]
        np_dtype = np.dtype(dtype) if dtype in ("float32", "int32") else _ml_bf16()
        with cupy.cuda.Device(device_id):
            if handle in (0, int(cupy.cuda.get_current_stream(device_id).ptr)):
                return cupy.empty(shape, dtype=np_dtype)
            # Allocated on the call's stream, so CuPy's stream-ordered pool never hands this memory
            # to other work before the kernels that write it have finished.
            with cupy.cuda.ExternalStream(handle, device_id):
                return cupy.empty(shape, dtype=np_dtype)
    if kind == JAX:
        return _DeviceOutput(shape, dtype, device_id, handle)
    raise TypeError(f"out: inputs from {type(q).__module__.split('.')[0]} cannot be allocated here; pass out= "
                    "(and final_state=)")


def data_ptr(obj: Any, name: str) -> int:
    if isinstance(obj, _DeviceOutput):
        return obj.ptr
    return describe(obj, name).ptr


def deliver(q: Any, tensors: tuple, outputs: tuple, device_id: int, handle: int) -> tuple:
    """After the launches: JAX callers get their outputs as JAX arrays, and their inputs are held
    until the kernels finish; others get what was allocated or passed, unchanged."""
    pending.poll()
    if framework(q) != JAX:
        return outputs
    event = pending.record(device_id, handle)
    held = tuple(t for t in tensors if t is not None)
    pending.after(event, lambda: held)  # the closure holds the inputs until the event completes
    from jax import dlpack as jax_dlpack

    return tuple(x.to_jax(jax_dlpack, event) if isinstance(x, _DeviceOutput) else x for x in outputs)


class _DeviceOutput:
    """An output kda_aot allocated for a JAX caller: memory from the device's stream-ordered pool,
    allocated on the call's stream, written by the kernels, then handed to JAX through DLPack."""

    def __init__(self, shape, dtype: str, device_id: int, handle: int):
        from cuda.core import LEGACY_DEFAULT_STREAM, Device, Stream

        device = Device(device_id)
        device.set_current()
        stream = LEGACY_DEFAULT_STREAM if handle in (0, 1) else Stream.from_handle(handle)
        nbytes = int(np.prod(shape, dtype=np.int64)) * (4 if dtype in ("float32", "int32") else 2)
        self.buffer = device.allocate(max(nbytes, 1), stream=stream)
        self.ptr = int(self.buffer.handle)
        self.shape, self.dtype, self.device_id, self.handle = tuple(shape), dtype, device_id, handle

    def to_jax(self, jax_dlpack, event):
        buffer = self.buffer

        def ready(consumer: int) -> None:
            if consumer_stream(consumer) != consumer_stream(self.handle):
                pending.make_wait(consumer, event)

        def on_release(owner) -> None:
            # Called by JAX's deleter, maybe on one of its threads: no CUDA call here. The memory is
            # freed at the next poll once the kernels that wrote it are done (JAX's own uses have
            # finished when it calls the deleter).
            pending.after(event, lambda: _free(owner, self.device_id))

        export = DLPackExport(self.ptr, self.shape, self.dtype, (KDL_CUDA, self.device_id), buffer,
                              on_release=on_release, ready=ready)
        self.buffer = None
        return jax_dlpack.from_dlpack(export)


def _free(buffer, device_id: int) -> None:
    """Free an exported output once its kernels are done and JAX let go of it: any stream will do
    then; the legacy default stream always exists (the call's stream may not, by now)."""
    from cuda.core import LEGACY_DEFAULT_STREAM, Device

    Device(device_id).set_current()
    buffer.close(LEGACY_DEFAULT_STREAM)


def _ml_bf16():
    import ml_dtypes

    return ml_dtypes.bfloat16
