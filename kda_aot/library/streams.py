"""Streams and device facts, read through cuda.core / cuda.bindings (never through a framework).

A caller's stream may be an int handle, an object speaking the `__cuda_stream__` protocol
(cuda.core, CuPy), or a torch.cuda.Stream. With no stream, a torch caller gets torch's current
stream (torch is then already imported by the caller, so nothing new is imported) and anyone else
the legacy default stream, as CUDA libraries do.
"""

from __future__ import annotations

import functools
import sys
from typing import Any


def stream_handle(stream: Any, device_id: int) -> int:
    """The cudaStream_t of `stream` as an int."""
    if stream is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return int(torch.cuda.current_stream(device_id).cuda_stream)
        return 0
    if isinstance(stream, bool):
        raise TypeError("stream: expected a CUDA stream or its integer handle, got a bool")
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        _, handle = stream.__cuda_stream__()
        return int(handle)
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        return int(stream.cuda_stream)
    raise TypeError(f"stream: expected a CUDA stream or its integer handle, got {type(stream).__name__}")


@functools.lru_cache(maxsize=None)
def sm_count(device_id: int) -> int:
    from cuda.core import Device

    return int(Device(device_id).properties.multiprocessor_count)


@functools.lru_cache(maxsize=None)
def compute_capability(device_id: int) -> tuple:
    from cuda.core import Device

    cc = Device(device_id).compute_capability
    return (int(cc.major), int(cc.minor))


def check_architecture(device_id: int) -> None:
    """Refuse a device the kernels were not compiled for (sm_90a: Hopper), naming q's device, before
    anything is launched there. Where the capability cannot be read, the launch reports the problem."""
    try:
        major, minor = compute_capability(device_id)
    except Exception:  # noqa: BLE001 - a courtesy check: never fail a call because it could not run
        return
    if major != 9:
        from .loader import KdaError

        raise KdaError(f"q: on cuda:{device_id}, a GPU of compute capability {major}.{minor}; this build's "
                       "kernels are compiled for sm_90a (Hopper: H100, H200, H20) only")


def is_capturing(handle: int) -> bool:
    """True while `handle` is being captured into a CUDA graph (no host syncs allowed then)."""
    from cuda.bindings import driver

    err, status = driver.cuStreamIsCapturing(driver.CUstream(handle))
    if err != driver.CUresult.CUDA_SUCCESS:
        return False
    return status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
