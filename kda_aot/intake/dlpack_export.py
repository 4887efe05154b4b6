"""DLPack export of memory kda_aot owns or views: a DLManagedTensor built with ctypes.

Used to hand outputs to frameworks that cannot give us a writable buffer (JAX arrays are immutable;
docs/frameworks.md): kda_aot allocates the memory, the kernels write it, and the consumer takes it
over through its own `from_dlpack`. The ownership story, which the C structs encode:

* `DLPackExport(...)` holds `owner` (whatever keeps the memory valid: a cuda.core Buffer, a numpy
  array, another framework's array) until a consumer takes the export over with `__dlpack__`.
  An export can be taken once; the Python object then holds nothing.
* The capsule's DLManagedTensor carries a key to a module table entry holding `owner` and the
  ctypes structs. The consumer calls the DLManagedTensor's deleter when it no longer needs the
  memory (for JAX: when the array is deleted and its last use on the device has finished); the
  deleter removes the entry and calls `on_release(owner)`. A capsule that was never consumed calls
  the deleter itself when it is garbage collected (the DLPack rule for the producer).
* The deleter may run on any thread (JAX calls it from its own worker threads), so `on_release`
  must not make CUDA calls: kda_aot's release only queues the memory for freeing (pending.py).

`stream` follows the DLPack protocol: the consumer names the stream it will use the memory on;
when that is not the stream the memory was written on, `ready(stream)` makes it wait (an event).
"""

from __future__ import annotations

import ctypes
import itertools
import sys
import threading
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

# DLDeviceType codes and DLDataType codes of dlpack.h.
KDL_CPU, KDL_CUDA = 1, 2
_DTYPES = {"float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16), "int32": (0, 32), "int64": (0, 64),
           "uint8": (1, 8)}
FLAG_READ_ONLY = 1 << 0  # DLPACK_FLAG_BITMASK_READ_ONLY (DLPack 1.0)
DLPACK_VERSION = (1, 0)  # the versioned struct's layout is the same for every 1.x

_LEGACY_NAME, _LEGACY_USED = b"dltensor", b"used_dltensor"
_VERSIONED_NAME, _VERSIONED_USED = b"dltensor_versioned", b"used_dltensor_versioned"


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


# key -> (struct, shape array, strides array, owner, on_release): everything the C side points to.
_LIVE: Dict[int, tuple] = {}
_LIVE_LOCK = threading.Lock()
_KEYS = itertools.count(1)


def _release(key: int) -> None:
    if sys.is_finalizing():  # a consumer tearing down at exit: the process frees everything
        return
    with _LIVE_LOCK:
        entry = _LIVE.pop(key, None)
    if entry is not None and entry[4] is not None:
        entry[4](entry[3])


def _legacy_deleter(address: int) -> None:
    try:
        _release(_DLManagedTensor.from_address(address).manager_ctx)
    except Exception:  # noqa: BLE001 - called from C: an exception cannot propagate
        pass


def _versioned_deleter(address: int) -> None:
    try:
        _release(_DLManagedTensorVersioned.from_address(address).manager_ctx)
    except Exception:  # noqa: BLE001
        pass


_LEGACY_DELETER = _DELETER(_legacy_deleter)
_VERSIONED_DELETER = _DELETER(_versioned_deleter)

# Function objects of our own (pythonapi[name] makes a new one; pythonapi.name is one shared by the
# process): jax.ffi.pycapsule sets other argtypes on the shared PyCapsule_New, which broke every
# export made after it (seen on the H200 once kda_aot.jax had registered its target).
_capsule_new = ctypes.pythonapi["PyCapsule_New"]
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_is_valid = ctypes.pythonapi["PyCapsule_IsValid"]
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi["PyCapsule_GetPointer"]
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _capsule_destructor(capsule: int) -> None:
    """A capsule still carrying its original name was never consumed: free it here."""
    try:
        if _capsule_is_valid(capsule, _LEGACY_NAME):
            _legacy_deleter(_capsule_pointer(capsule, _LEGACY_NAME))
        elif _capsule_is_valid(capsule, _VERSIONED_NAME):
            _versioned_deleter(_capsule_pointer(capsule, _VERSIONED_NAME))
    except Exception:  # noqa: BLE001
        pass


_CAPSULE_DESTRUCTOR_FN = _CAPSULE_DESTRUCTOR(_capsule_destructor)


class DLPackExport:
    """One DLPack producer of the contiguous row-major array at `ptr` (see the module note)."""

    def __init__(self, ptr: int, shape: Sequence[int], dtype: str, device: Tuple[int, int], owner: Any, *,
                 readonly: bool = False, on_release: Optional[Callable[[Any], None]] = None,
                 ready: Optional[Callable[[int], None]] = None):
        if dtype not in _DTYPES:
            raise TypeError(f"dtype {dtype} cannot be exported (expected one of {sorted(_DTYPES)})")
        self.ptr, self.shape, self.dtype = int(ptr), tuple(int(s) for s in shape), dtype
        self.device = (int(device[0]), int(device[1]))
        self.readonly = readonly
        self._owner, self._on_release, self._ready = owner, on_release, ready
        self._taken = False

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self.device

    def __dlpack__(self, *, stream: Any = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None):
        if self._taken:
            raise BufferError("this kda_aot export was already taken by a consumer")
        if dl_device is not None and tuple(int(x) for x in dl_device) != self.device:
            raise BufferError(f"the memory is on DLPack device {self.device}; no copy to {tuple(dl_device)} is made")
        if copy:
            raise BufferError("copy=True: kda_aot exports its memory as it is, never a copy")
        versioned = max_version is not None and tuple(max_version) >= (1, 0)
        if self.readonly and not versioned:
            # An unversioned DLManagedTensor cannot say read-only: refuse rather than hand out
            # memory the consumer would believe writable.
            raise BufferError("a read-only export needs a consumer that speaks DLPack >= 1.0 (max_version)")
        if stream is not None and stream != -1 and self.device[0] == KDL_CUDA and self._ready is not None:
            self._ready(int(stream))
        capsule = self._capsule(versioned)
        self._taken = True
        self._owner = self._on_release = self._ready = None
        return capsule

    def _capsule(self, versioned: bool):
        ndim = len(self.shape)
        shape = (ctypes.c_int64 * max(ndim, 1))(*self.shape)
        strides_list, acc = [], 1
        for size in reversed(self.shape):
            strides_list.append(acc)
            acc *= max(size, 1)
        strides = (ctypes.c_int64 * max(ndim, 1))(*reversed(strides_list))
        code, bits = _DTYPES[self.dtype]
        tensor = _DLTensor(data=self.ptr, device=_DLDevice(*self.device), ndim=ndim,
                           dtype=_DLDataType(code, bits, 1), shape=shape, strides=strides, byte_offset=0)
        key = next(_KEYS)
        if versioned:
            managed = _DLManagedTensorVersioned(version=_DLPackVersion(*DLPACK_VERSION), manager_ctx=key,
                                                deleter=_VERSIONED_DELETER,
                                                flags=FLAG_READ_ONLY if self.readonly else 0, dl_tensor=tensor)
            name = _VERSIONED_NAME
        else:
            managed = _DLManagedTensor(dl_tensor=tensor, manager_ctx=key, deleter=_LEGACY_DELETER)
            name = _LEGACY_NAME
        with _LIVE_LOCK:
            _LIVE[key] = (managed, shape, strides, self._owner, self._on_release)
        return _capsule_new(ctypes.addressof(managed), name, ctypes.cast(_CAPSULE_DESTRUCTOR_FN, ctypes.c_void_p))


def live_exports() -> int:
    """How many exports a consumer still holds (tests: the deleter ran when this drops)."""
    with _LIVE_LOCK:
        return len(_LIVE)
