"""The workspace: its layout (pure arithmetic) and the arena used by callers without torch.

The layout is docs/kernel_abi.md's table: one region per workspace quantity, each 256-byte
aligned, sized from (heads, tile capacity, sequences, segments). Where the memory comes from is the
call path's choice (docs/call_path.md): the caller's `workspace=`, torch's caching allocator on the
call's stream, or, for other frameworks, the bounded arena below.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Dict, Tuple

# The alignment and the bytes per (head, tile) slot of each region, in layout order, are part of
# the kernel ABI: declared once in build_kernels/shared_constants.py, generated into _abi.py.
from ..library.constants import SLOT_BYTES, STATE_BYTES
from ..library.constants import WORKSPACE_ALIGN as ALIGN


def _round_up(x: int, a: int = ALIGN) -> int:
    return (x + a - 1) // a * a


@dataclasses.dataclass(frozen=True)
class WorkspaceLayout:
    regions: Dict[str, Tuple[int, int]]  # name -> (offset, nbytes)
    nbytes: int

    def pointers(self, base: int) -> Dict[str, int]:
        return {name: base + off for name, (off, _) in self.regions.items()}


def workspace_layout(n_heads: int, tile_capacity: int, n_seq: int, checkpoint_entries: int = 0,
                     listed: int = 0) -> WorkspaceLayout:
    """Regions for the sequence tables (int32 [N+1] each), K2's dispatch order (int32 [N]) and the
    per-(head, tile) quantities; with `checkpoint_entries` = N * K > 0 (checkpoints at given
    offsets, docs/state_pool.md) also the checkpoint table, int32 [N * K, 2], at the end; with
    `listed` = N > 0 (segment_ids) then the listed flags and state slots, int32 [N] each."""
    regions: Dict[str, Tuple[int, int]] = {}
    offset = 0
    table = 4 * (n_seq + 1)
    extra = [("checkpoint_table", 8 * checkpoint_entries)] if checkpoint_entries else []
    if listed:
        extra += [("listed", 4 * listed), ("listed_slot", 4 * listed)]
    for name, nbytes in [("seq_start", table), ("tile_prefix", table), ("seq_order", 4 * n_seq)] + [
            (name, n_heads * tile_capacity * per_slot) for name, per_slot in SLOT_BYTES] + extra:
        regions[name] = (offset, nbytes)
        offset = _round_up(offset + nbytes)
    return WorkspaceLayout(regions, offset)


def cp_layout(n_heads: int, tile_capacity: int, n_seq: int, max_segments: int,
              sequence_tables: bool = False, checkpoint_entries: int = 0, listed: int = 0) -> WorkspaceLayout:
    """A CP call's workspace: K1's regions with the segment tables in place of the sequence tables
    (`seq_start` / `tile_prefix` sized for `max_segments`), the other segment tables the device
    builds (cp_seg_tables), then the fp32 scratch of docs/algorithm.md §4.7 for every possible segment.
    `sequence_tables`: also the sequences' own tables (`real_seq_start` / `real_tile_prefix`,
    [n_seq + 1] each), which checkpoints need (docs/state_pool.md); `checkpoint_entries`: as in
    workspace_layout; `listed` = n_seq > 0 (segment_ids): the listed flags, int32 [n_seq]."""
    base = workspace_layout(n_heads, tile_capacity, max_segments, checkpoint_entries)
    regions, offset = dict(base.regions), base.nbytes
    scratch = max_segments * n_heads * STATE_BYTES
    extra = (("real_seq_start", 4 * (n_seq + 1)), ("real_tile_prefix", 4 * (n_seq + 1))) if sequence_tables else ()
    for name, nbytes in (("scan_seg", 4 * max_segments), ("seg_first", 4 * n_seq), ("seg_count", 4 * n_seq),
                         ("final_slot", 4 * max_segments), ("b_seg", scratch), ("m_seg", scratch),
                         ("carries", scratch)) + extra + ((("listed", 4 * listed),) if listed else ()):
        regions[name] = (offset, nbytes)
        offset = _round_up(offset + nbytes)
    return WorkspaceLayout(regions, offset)


class CaptureAllocationError(RuntimeError):
    """A workspace would have to be allocated while the stream is being captured into a graph."""


class WorkspaceArena:
    """Device buffers for callers whose framework has no allocator we can use (CuPy, JAX, raw
    DLPack): one grow-only buffer per (device, stream handle), at most MAX_BUFFERS of them.

    `lease` holds the arena's lock from handing out the pointer until the call's launches are
    queued, so two threads sharing a stream never interleave their use of a buffer and a buffer is
    never freed while a launch that uses it is still being issued. Torch callers never come here:
    their workspace comes from torch's caching allocator, which is stream-ordered and graph-aware
    (docs/call_path.md).

    A stream handle is only an address: a stream destroyed with work still queued can be followed
    by a new stream at the same address (CuPy callers who make a stream per request). So each
    buffer carries an event recorded after its last use, and the next lease makes its stream wait
    on it (a device-side wait, about 2 us of host time per call; skipped while the stream is being
    captured into a graph). Buffers are freed only after a device synchronisation (eviction,
    `release`), on the legacy default stream, never on the stream they were used on, which may be
    gone by then (freeing on a destroyed stream crashes the process).
    """

    MAX_BUFFERS = 8

    def __init__(self):
        self._buffers: Dict[Tuple[int, int], _Slot] = {}
        self._lock = threading.RLock()

    def lease(self, device_id: int, stream_handle: int, nbytes: int):
        """A context manager yielding the base pointer of at least `nbytes` bytes."""
        return _Lease(self, device_id, stream_handle, nbytes)

    def _get(self, device_id: int, stream_handle: int, nbytes: int, capturing: bool) -> "_Slot":
        from cuda.bindings import driver

        key = (device_id, stream_handle)
        slot = self._buffers.get(key)
        if slot is not None and slot.recorded and not capturing:
            # After the buffer's last use, whichever stream (this one, or a destroyed one that had
            # this handle) it was on.
            _check(driver.cuStreamWaitEvent(driver.CUstream(stream_handle), slot.event, 0), "cuStreamWaitEvent")
        if slot is not None and slot.buffer.size >= nbytes:
            return slot
        if capturing:
            raise CaptureAllocationError(
                f"workspace: this call needs {nbytes} bytes of workspace on a stream that is being captured into a "
                "CUDA graph, and allocating during a capture is not allowed; pass workspace= (a device buffer of "
                "kda_aot.workspace_size(...) bytes), or make one eager call of this shape on this stream first")
        from cuda.core import LEGACY_DEFAULT_STREAM, Device, Stream

        device = Device(device_id)
        device.set_current()
        stream = LEGACY_DEFAULT_STREAM if stream_handle in (0, 1) else Stream.from_handle(stream_handle)
        if slot is None and len(self._buffers) >= self.MAX_BUFFERS:
            self._evict_oldest()
        # Grow by at least 1.5x so a slowly increasing T does not reallocate every call.
        size = max(_round_up(nbytes, 1 << 20), int(slot.buffer.size * 1.5) if slot is not None else 0)
        new = device.allocate(size, stream=stream)
        if hasattr(new, "set_deallocation_stream"):  # cuda.core >= 1.2: never free on a stream that may be gone
            new.set_deallocation_stream(LEGACY_DEFAULT_STREAM)
        if slot is not None:
            slot.buffer.close(stream)  # ordered after its last use by the wait above
        else:
            err, event = driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
            _check((err,), "cuEventCreate")
            slot = _Slot(new, event)
        slot.buffer = new
        self._buffers.pop(key, None)
        self._buffers[key] = slot  # newest last: eviction takes the oldest
        return slot

    def _evict_oldest(self) -> None:
        key = next(iter(self._buffers))
        _free_after_sync(key[0], [self._buffers.pop(key)])

    def release(self) -> None:
        """Free every buffer, after the work queued on their devices has finished."""
        with self._lock:
            for device_id in {d for d, _ in self._buffers}:
                _free_after_sync(device_id, [slot for (d, _), slot in self._buffers.items() if d == device_id])
            self._buffers.clear()

    def nbytes(self) -> int:
        return sum(slot.buffer.size for slot in self._buffers.values())


class _Slot:
    """One arena buffer and the event recorded after its last use."""

    __slots__ = ("buffer", "event", "recorded")

    def __init__(self, buffer, event):
        self.buffer, self.event, self.recorded = buffer, event, False


def _check(result, what: str) -> None:
    from cuda.bindings import driver

    if result[0] != driver.CUresult.CUDA_SUCCESS:
        from ..library.loader import CudaError

        raise CudaError(f"workspace arena: {what} failed: {result[0]}")


def _free_after_sync(device_id: int, slots) -> None:
    """Wait for everything on the device (the buffers' streams may be gone), then free the buffers
    on the legacy default stream and destroy their events."""
    from cuda.bindings import driver
    from cuda.core import LEGACY_DEFAULT_STREAM, Device

    device = Device(device_id)
    device.set_current()
    device.sync()
    for slot in slots:
        slot.buffer.close(LEGACY_DEFAULT_STREAM)
        driver.cuEventDestroy(slot.event)


class _Lease:
    def __init__(self, arena: WorkspaceArena, device_id: int, stream_handle: int, nbytes: int):
        self.arena, self.args = arena, (device_id, stream_handle, nbytes)
        self.slot = None
        self.capturing = False

    def __enter__(self) -> int:
        from ..library.streams import is_capturing

        self.arena._lock.acquire()
        try:
            self.capturing = is_capturing(self.args[1])
            self.slot = self.arena._get(*self.args, self.capturing)
            return int(self.slot.buffer.handle)
        except BaseException:
            self.arena._lock.release()
            raise

    def __exit__(self, *exc) -> None:
        try:
            if not self.capturing:
                from cuda.bindings import driver

                _check(driver.cuEventRecord(self.slot.event, driver.CUstream(self.args[1])), "cuEventRecord")
                self.slot.recorded = True
        finally:
            self.arena._lock.release()


ARENA = WorkspaceArena()
