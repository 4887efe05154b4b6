"""What one rank computes in a cross-GPU context-parallel prefill (docs/distributed.md): pure Python.

The ranks of a process group hold contiguous token slices of one packed batch (B = 1), in rank
order: rank r holds tokens [token_offset_r, token_offset_r + T_r) and token_offset_{r+1} =
token_offset_r + T_r. From the global sequence lengths and its own slice, a rank knows without
communicating:

- its *head*: the piece of a sequence that began on an earlier rank (tokens [0, head_len) of the
  slice); it needs the entry state that the earlier ranks' carries give;
- its *rest*: the pieces of the sequences that begin on it (tokens [head_len, T) of the slice,
  sequence ids rest_first .. rest_first + len(rest_lens) - 1); they start from their own initial
  states, exactly as the single-GPU prefill does;
- its *carry kind*, what it contributes to the state of the sequence in progress at the end of
  its slice, as a function of that sequence's state at the start of the slice:
    "reset"    the sequence began on this rank: the state is its exit state (from its initial
               state), whatever came before;
    "transfer" the slice lies inside one sequence: S_end = S_start M + B (pre_scan's transfer);
    "identity" the slice is empty: the state passes through;
    "end"      the slice ends on a sequence boundary: nothing continues (sent as a reset to 0,
               which no later rank uses).

Ownership: a sequence's final state is returned by the rank holding its last token. A sequence of
length 0 at position p belongs to the rank whose slice contains token p, and at the end of the
batch (p = total) to the last rank.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence, Tuple

from ..library.constants import CHUNK
KINDS = ("reset", "transfer", "identity", "end")


@dataclasses.dataclass(frozen=True)
class RankWork:
    token_offset: int
    t_local: int
    head_seq: int  # -1 when the slice has no head
    head_len: int
    head_ends: bool  # the head's sequence ends on this slice
    rest_first: int  # first sequence id that begins on this slice (meaningful when rest_lens)
    rest_lens: Tuple[int, ...]  # local lengths of the sequences that begin here (the last may continue)
    tail_continues: bool  # the last rest sequence goes on past the slice
    kind: str

    @property
    def has_head(self) -> bool:
        return self.head_seq >= 0

    @property
    def final_first(self) -> int:
        """First sequence id whose final state this rank returns."""
        return self.head_seq if self.head_ends else self.rest_first

    @property
    def final_count(self) -> int:
        """How many final states this rank returns (ids final_first .. final_first + count - 1)."""
        return int(self.head_ends) + len(self.rest_lens) - int(self.tail_continues)


def _check_int(name: str, value, minimum: int) -> int:
    if type(value) is not int or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return value


def plan_rank(seq_lens: Sequence[int], token_offset: int, t_local: int, rank: int, world_size: int) -> RankWork:
    """The local work of `rank` (of `world_size`) holding tokens [token_offset, token_offset + t_local)
    of the batch whose sequences have lengths `seq_lens` (ints >= 0)."""
    lens = [_check_int(f"seq_lens[{i}]", x, 0) for i, x in enumerate(seq_lens)]
    _check_int("world_size", world_size, 1)
    if type(rank) is not int or not 0 <= rank < world_size:
        raise ValueError(f"rank: expected an int in [0, {world_size}), got {rank!r}")
    total = sum(lens)
    _check_int("token_offset", token_offset, 0)
    _check_int("t_local", t_local, 0)
    if token_offset + t_local > total:
        raise ValueError(f"token_offset: the slice [{token_offset}, {token_offset + t_local}) ends past the batch's "
                         f"{total} tokens")
    if rank == world_size - 1 and token_offset + t_local != total:
        raise ValueError(f"token_offset: the last rank's slice must end at the batch's end ({total} tokens), it ends "
                         f"at {token_offset + t_local}")
    if rank == 0 and token_offset != 0:
        raise ValueError(f"token_offset: rank 0's slice must start at 0, got {token_offset}")
    end = token_offset + t_local
    starts = [0]
    for x in lens:
        starts.append(starts[-1] + x)

    head_seq, head_len, head_ends = -1, 0, False
    rest_first, rest = len(lens), []
    for n, x in enumerate(lens):
        a, b = starts[n], starts[n + 1]
        if a < token_offset < b and t_local > 0:
            head_seq, head_len, head_ends = n, min(b, end) - token_offset, b <= end
        elif token_offset <= a < end or (a == total and rank == world_size - 1):
            if not rest:
                rest_first = n
            rest.append(min(b, end) - a)
    tail_continues = bool(rest) and starts[rest_first + len(rest)] > end
    if t_local == 0:
        kind = "identity"
    elif head_seq >= 0 and not head_ends:
        kind = "transfer"
    elif tail_continues:
        kind = "reset"
    else:
        kind = "end"
    return RankWork(token_offset, t_local, head_seq, head_len, head_ends, rest_first, tuple(rest), tail_continues,
                    kind)


def transfer_segments(t_local: int, n_heads: int, sm_count: int, min_tiles: int = 32) -> Tuple[int, int]:
    """(segments, tiles per segment) for the pre_scan of a slice that lies inside one sequence: as
    many equal tile-aligned segments as fill the SMs once (SMs // H, as the intracard planner's P),
    each at least `min_tiles` tiles; the last may be shorter. Every segment is non-empty."""
    tiles = -(-t_local // CHUNK)
    if tiles == 0:
        return 0, 0
    want = max(1, min(sm_count // max(1, n_heads), tiles // min_tiles))
    per = -(-tiles // want)
    return -(-tiles // per), per


def segment_starts(t_local: int, per_tiles: int, n_seg: int) -> Tuple[int, ...]:
    """Token starts of the segments, then t_local: n_seg + 1 entries (a cu_seqlens of the slice)."""
    return tuple(min(i * per_tiles * CHUNK, t_local) for i in range(n_seg)) + (t_local,)
