"""Is a stream handle a CUDA stream of the tensors' device?

A raw int handle reaches the kernels unchecked otherwise: a stale or foreign handle, or a stream
of another device, fails inside the launch (or worse, runs on the wrong device's queue). The
logic takes the device query as a parameter so it is tested on a machine without a GPU;
`stream_device` is the real query, through cuda.bindings.
"""

from __future__ import annotations

import operator
from typing import Callable

# Handles that name a stream without being a pointer: the legacy default stream (0 and
# CU_STREAM_LEGACY = 0x1) and the per-thread default stream (CU_STREAM_PER_THREAD = 0x2). They
# always exist and mean "this stream of the current device", which the launcher sets to q's.
DEFAULT_STREAMS = (0, 1, 2)
_MAX_HANDLE = 2 ** 64 - 1  # a CUstream is a pointer

StreamQuery = Callable[[int], int]


def check_stream_handle(handle: int, device_id: int, query: StreamQuery) -> None:
    """Raise naming `stream` unless `handle` is a valid stream of device `device_id`.

    `query(handle)` returns the ordinal of the device the stream belongs to, or raises when the
    handle is not a stream; it is not called for the default streams.
    """
    if isinstance(handle, bool):
        raise TypeError(f"stream: expected an integer stream handle, got the bool {handle!r}")
    try:
        h = operator.index(handle)
    except TypeError:
        raise TypeError(f"stream: expected an integer stream handle, got {type(handle).__name__}") from None
    if h < 0 or h > _MAX_HANDLE:
        raise ValueError(f"stream: handle {h} is not a CUDA stream (a handle is a 64-bit pointer, "
                         f"0 <= handle <= 2**64-1)")
    if h in DEFAULT_STREAMS:
        return
    try:
        owner = query(h)
        owner = operator.index(owner)
    except Exception as exc:  # the driver's refusal, whatever the binding raises it as
        raise ValueError(f"stream: handle {h:#x} is not a valid CUDA stream ({exc})") from exc
    if owner != device_id:
        raise ValueError(f"stream: handle {h:#x} belongs to cuda:{owner}, but q is on "
                         f"cuda:{device_id}; pass a stream of q's device")


def stream_device(handle: int) -> int:
    """The real query: the ordinal of the device stream `handle` belongs to, or RuntimeError.

    cuStreamGetDevice (CUDA 12.8) where the binding and driver have it, else the stream's
    context made current for a moment (cuStreamGetCtx, cuCtxGetDevice). A freed handle is
    usually reported as CUDA_ERROR_INVALID_HANDLE / CONTEXT_IS_DESTROYED; the driver cannot
    promise to catch every garbage pointer.
    """
    from cuda.bindings import driver

    if not _mapped(handle):
        # The driver dereferences a stream handle without checking it: a garbage pointer such as
        # 0xdeadbeef faults inside cuStreamGetDevice (seen on the H200). An address that is not
        # mapped in this process cannot be a stream; a mapped non-stream can still fault there.
        raise RuntimeError("not an address in this process (a CUstream points to driver memory)")
    stream = driver.CUstream(handle)
    get_device = getattr(driver, "cuStreamGetDevice", None)
    if get_device is not None:
        try:
            err, device = get_device(stream)
        except RuntimeError as exc:  # the binding has it, the installed driver does not
            if "not found" not in str(exc):
                raise
        else:
            _raise_for(driver, err, "cuStreamGetDevice")
            return int(device)
    err, ctx = driver.cuStreamGetCtx(stream)
    _raise_for(driver, err, "cuStreamGetCtx")
    (err,) = driver.cuCtxPushCurrent(ctx)
    _raise_for(driver, err, "cuCtxPushCurrent")
    try:
        err, device = driver.cuCtxGetDevice()
        _raise_for(driver, err, "cuCtxGetDevice")
        return int(device)
    finally:
        driver.cuCtxPopCurrent()


def _raise_for(driver, err, what: str) -> None:
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err.name if hasattr(err, 'name') else err}")


def _mapped(address: int, nbytes: int = 64) -> bool:
    """Whether [address, address + nbytes) lies in mapped pages of this process (Linux mincore,
    which fails with ENOMEM on an unmapped page and reads nothing)."""
    import ctypes
    import mmap

    libc = _libc()
    if libc is None:
        return True  # cannot tell: leave it to the driver
    page = mmap.PAGESIZE
    start = address - address % page
    length = address + nbytes - start
    vec = (ctypes.c_ubyte * (-(-length // page)))()
    return libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) == 0


_LIBC = []


def _libc():
    if not _LIBC:
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            libc.mincore.restype = ctypes.c_int
        except (OSError, AttributeError):
            libc = None
        _LIBC.append(libc)
    return _LIBC[0]
