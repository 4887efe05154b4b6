"""DLPack intake: any framework's tensor becomes a plain, framework-free description.

Everything after intake (validation, planning, launching) works on `TensorDesc` only, so the
runtime never imports torch, and the validation wall can be unit-tested on a machine without a
GPU by building descriptions by hand.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

from cuda.core.utils import StridedMemoryView

from . import dtypes

# DLPack device type of CUDA device memory (kDLCUDA). Host, pinned and managed memory are refused:
# the kernels read through TMA, which needs device global memory.
_CUDA = "cuda"


@dataclasses.dataclass(frozen=True)
class TensorDesc:
    """What the launcher needs to know about one tensor argument."""

    name: str
    ptr: int
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]  # in elements
    dtype: str  # numpy-style name: "bfloat16", "float32", "int32", "int64", ...
    device: str  # "cuda" or "cpu" (anything not device memory is "cpu" here)
    device_id: int
    # The producer marked the memory read-only (DLPack 1.0 flag DLPACK_FLAG_BITMASK_READ_ONLY):
    # the wall refuses it as an output. Compared like the other fields: a read-only and a
    # writable view of the same memory are different arguments.
    readonly: bool = False
    owner: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return dtypes.itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def is_contiguous(self) -> bool:
        """Row-major contiguity; size-1 and empty modes may carry any stride (as in PyTorch)."""
        if self.numel == 0:
            return True
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True


def _contiguous_strides(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def describe(obj: Any, name: str, stream: int = -1) -> TensorDesc:
    """Read `obj` through DLPack without copying, synchronising the host or converting it.

    `stream` is the DLPack consumer stream: the stream the kernels will read `obj` on (1 for the
    legacy default stream), on which the producer orders its pending writes of `obj`; -1 asks for
    no ordering. Raises TypeError naming the argument when `obj` does not speak DLPack.
    """
    if isinstance(obj, TensorDesc):
        return obj
    if type(obj).__module__.startswith("torch"):
        if not _TORCH_DTYPES:
            _init_torch_dtypes()
        return _describe_torch(obj, name)
    return describe_dlpack(obj, name, stream)


def describe_dlpack(obj: Any, name: str, stream: int = -1) -> TensorDesc:
    """The general path: any DLPack producer, read through cuda.core's StridedMemoryView."""
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"{name}: expected a DLPack tensor (torch, CuPy, JAX, ...), got {type(obj).__name__}")
    try:
        # cuda.core passes stream_ptr to a device producer's __dlpack__(stream=...) and None to a
        # host producer's (whatever stream_ptr is). JAX refuses -1 for device arrays: the call
        # path passes its own stream (frameworks.consumer_stream).
        view = StridedMemoryView.from_dlpack(obj, stream_ptr=stream)
    except Exception as exc:  # the producer refused (e.g. an unsupported dtype)
        if type(obj).__module__ == "numpy":
            # NumPy refuses to export bfloat16 (ml_dtypes) through DLPack, with a message about
            # NumPy's dtypes that says nothing about what to pass instead.
            raise TypeError(f"{name}: a NumPy array is host memory, which the kernels cannot read, and nothing "
                            "is copied to the device: pass a device array (a torch CUDA tensor, a CuPy array or "
                            f"a JAX array on the GPU). NumPy's DLPack export also refused its dtype "
                            f"{getattr(obj, 'dtype', '?')}: {exc}") from exc
        raise TypeError(f"{name}: could not be read through DLPack: {exc}") from exc
    try:
        # The view converts the DLPack dtype code lazily, here; a code numpy has no name for
        # (float8_*, ...) raises then.
        dtype = str(view.dtype)
    except Exception as exc:
        raise TypeError(f"{name}: dtype not supported ({exc}); expected one of "
                        f"{dtypes.supported_list()} (nothing is cast)") from exc
    _check_known_dtype(dtype, name)
    shape = tuple(int(s) for s in view.shape)
    strides = view.strides
    strides = _contiguous_strides(shape) if strides is None else tuple(int(s) for s in strides)
    on_device = bool(view.is_device_accessible) and view.device_id >= 0 and not _is_host_visible(obj)
    return TensorDesc(
        name=name,
        ptr=int(view.ptr),
        shape=shape,
        strides=strides,
        dtype=dtype,
        device=_CUDA if on_device else "cpu",
        device_id=int(view.device_id) if on_device else -1,
        # cuda.core before 0.5 has no `readonly`; such producers cannot say so either way.
        readonly=bool(getattr(view, "readonly", False)),
        owner=obj,
    )


def _describe_torch(t: Any, name: str) -> TensorDesc:
    """The same description read from torch's own attributes: a DLPack export costs about 12 us
    per tensor, which for twelve tensors per call is more than a short prefill's GPU time."""
    import torch  # already imported: `t` is a torch object

    if not isinstance(t, torch.Tensor):
        return describe_dlpack(t, name)
    _check_no_lazy_bits(t, name)
    dtype = _TORCH_DTYPES.get(t.dtype)
    if dtype is None:
        _check_known_dtype(str(t.dtype).removeprefix("torch."), name)
    on_device = t.is_cuda
    # Filling __dict__ directly skips the frozen dataclass's per-field object.__setattr__: the
    # result is the same value-compared, hashable description.
    desc = object.__new__(TensorDesc)
    desc.__dict__.update(name=name, ptr=t.data_ptr(), shape=tuple(t.shape), strides=t.stride(), dtype=dtype,
                         device=_CUDA if on_device else "cpu", device_id=t.get_device() if on_device else -1,
                         readonly=False, owner=t)
    return desc


_TORCH_DTYPES: dict = {}


def _init_torch_dtypes() -> None:
    import torch

    for name in dtypes.KNOWN_ITEMSIZE:
        if hasattr(torch, name):
            _TORCH_DTYPES[getattr(torch, name)] = name


def _check_known_dtype(dtype: str, name: str) -> None:
    if not dtypes.is_known(dtype):
        raise TypeError(f"{name}: dtype {dtype} is not supported; expected one of "
                        f"{dtypes.supported_list()} (nothing is cast)")


def _check_no_lazy_bits(t: Any, name: str) -> None:
    """A torch negative or conjugate view shares memory holding the un-negated (un-conjugated)
    values and applies the sign lazily; the kernels read memory, so they would see the wrong
    numbers. DLPack refuses to export such views too."""
    if t.is_neg():
        raise ValueError(f"{name}: a torch negative view (is_neg()): its memory holds the "
                         "un-negated values; call .resolve_neg() first (nothing is copied here)")
    if t.is_conj():
        raise ValueError(f"{name}: a torch conjugate view (is_conj()): its memory holds the "
                         "un-conjugated values; call .resolve_conj() first (nothing is copied here)")


def _is_host_visible(obj: Any) -> bool:
    """True for pinned/managed host memory, which DLPack reports as device-accessible."""
    try:
        device_type, _ = obj.__dlpack_device__()
    except Exception:
        return False
    # kDLCUDA == 2; kDLCUDAHost == 3 and kDLCUDAManaged == 13 are refused.
    return int(device_type) != 2


def describe_optional(obj: Optional[Any], name: str) -> Optional[TensorDesc]:
    return None if obj is None else describe(obj, name)
