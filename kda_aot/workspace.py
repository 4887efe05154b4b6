"""The workspace: its layout (pure arithmetic) and a grow-only arena per (device, stream).

The layout is docs/kernel_abi.md's table: one region per workspace quantity, each 256-byte
aligned, sized from (heads, tile capacity, sequences). The arena hands out one allocation per
(device, stream) and only ever grows it, so steady-state calls allocate nothing. Reuse across calls
is safe because every producer and consumer of the workspace is ordered on that one stream
(spec 6.13); callers on several streams get separate arenas.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Dict, Tuple

ALIGN = 256
TILE_IMAGE_BYTES = 16 * 128 * 2  # one raw 16x128 bf16 tile image

# bytes per (head, tile) slot of each region, in the order they are laid out
SLOT_BYTES = (
    ("qd", TILE_IMAGE_BYTES),
    ("kd", TILE_IMAGE_BYTES),
    ("kr", TILE_IMAGE_BYTES),
    ("gt", 128 * 4),
    ("inv", 16 * 16 * 2),
    ("mqk", 16 * 16 * 2),
    ("bsig", 16 * 2),
)


def _round_up(x: int, a: int = ALIGN) -> int:
    return (x + a - 1) // a * a


@dataclasses.dataclass(frozen=True)
class WorkspaceLayout:
    regions: Dict[str, Tuple[int, int]]  # name -> (offset, nbytes)
    nbytes: int

    def pointers(self, base: int) -> Dict[str, int]:
        return {name: base + off for name, (off, _) in self.regions.items()}


def workspace_layout(n_heads: int, tile_capacity: int, n_seq: int) -> WorkspaceLayout:
    """Regions for the sequence tables (int32 [N+1] each) and the per-(head, tile) quantities."""
    regions: Dict[str, Tuple[int, int]] = {}
    offset = 0
    table = 4 * (n_seq + 1)
    for name, nbytes in [("seq_start", table), ("tile_prefix", table)] + [
            (name, n_heads * tile_capacity * per_slot) for name, per_slot in SLOT_BYTES]:
        regions[name] = (offset, nbytes)
        offset = _round_up(offset + nbytes)
    return WorkspaceLayout(regions, offset)


class WorkspaceArena:
    """Grow-only device buffers keyed by (device, stream handle)."""

    def __init__(self):
        self._buffers: Dict[Tuple[int, int], object] = {}
        self._lock = threading.Lock()

    def get(self, device_id: int, stream_handle: int, nbytes: int) -> int:
        """Base pointer of at least `nbytes` bytes, valid for work ordered on that stream."""
        key = (device_id, stream_handle)
        with self._lock:
            buf = self._buffers.get(key)
            if buf is not None and buf.size >= nbytes:
                return int(buf.handle)
            from cuda.core import LEGACY_DEFAULT_STREAM, Device, Stream

            device = Device(device_id)
            device.set_current()
            stream = LEGACY_DEFAULT_STREAM if stream_handle == 0 else Stream.from_handle(stream_handle)
            # Grow by at least 1.5x so a slowly increasing T does not reallocate every call.
            size = max(_round_up(nbytes, 1 << 20), int(buf.size * 1.5) if buf is not None else 0)
            new = device.allocate(size, stream=stream)
            if buf is not None:
                buf.close(stream)  # stream-ordered free: earlier work on this stream finishes first
            self._buffers[key] = new
            return int(new.handle)

    def base(self, device_id: int, stream_handle: int) -> int:
        """The current buffer's address for (device, stream), 0 when there is none."""
        buf = self._buffers.get((device_id, stream_handle))
        return int(buf.handle) if buf is not None else 0

    def release(self) -> None:
        """Free every buffer (tests and long-lived processes that change shape once)."""
        with self._lock:
            for buf in self._buffers.values():
                buf.close()
            self._buffers.clear()

    def nbytes(self) -> int:
        return sum(b.size for b in self._buffers.values())


ARENA = WorkspaceArena()
