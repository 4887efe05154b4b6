"""Releases that must wait for the device: "drop these references / free this memory once the work
queued on a stream so far has finished", without ever blocking the host.

Used for JAX callers (docs/frameworks.md): JAX's allocator does not order its reuse of a deleted
array's memory after work on our stream, so the call's input arrays are held until its kernels have
finished, and memory that JAX hands back through the DLPack deleter is freed once the kernels that
wrote it are done. Each call records one CUDA event after its launches; `poll` (run at the start of
every non-torch call) releases what completed, asking the driver with a non-blocking query;
`drain` (kda_aot.empty_cache) waits for everything and releases it all.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Tuple

_LOCK = threading.Lock()
# (event or None, action): event None means "ready now" (an action queued from a DLPack deleter
# whose memory's own event already completed is still run here, never on the deleter's thread).
_QUEUE: List[Tuple[Any, Callable[[], None]]] = []


def record(device_id: int, stream_handle: int):
    """A cuda.core Event recorded on `stream_handle` after the work queued so far."""
    from cuda.core import LEGACY_DEFAULT_STREAM, Device, Stream

    device = Device(device_id)
    device.set_current()
    stream = LEGACY_DEFAULT_STREAM if stream_handle in (0, 1) else Stream.from_handle(stream_handle)
    return stream.record()


def make_wait(consumer_handle: int, event) -> None:
    """Order the consumer's stream after `event` (the DLPack producer's duty)."""
    from cuda.bindings import driver

    (err,) = driver.cuStreamWaitEvent(driver.CUstream(consumer_handle), driver.CUevent(int(event.handle)), 0)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise BufferError(f"could not order stream {consumer_handle:#x} after kda_aot's kernels: {err}")


def after(event, action: Callable[[], None]) -> None:
    """Run `action` (no CUDA calls in it) once `event` has completed; None: at the next poll."""
    with _LOCK:
        _QUEUE.append((event, action))


def poll() -> None:
    """Run the actions whose events completed; never waits."""
    if not _QUEUE:
        return
    with _LOCK:
        done = [item for item in _QUEUE if _is_done(item[0])]
        for item in done:
            _QUEUE.remove(item)
    for _, action in done:
        action()


def drain() -> None:
    """Wait for every event and run every action (empty_cache)."""
    with _LOCK:
        items = list(_QUEUE)
        _QUEUE.clear()
    for event, action in items:
        if event is not None:
            event.sync()
        action()


def pending_count() -> int:
    return len(_QUEUE)


def _is_done(event: Optional[Any]) -> bool:
    return event is None or bool(event.is_done)
