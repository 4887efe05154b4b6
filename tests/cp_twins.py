"""CPU twins of the device-built CP and sequence tables, and the host tables of a CP plan in the
kernels' format: what the tests compare the kernels' tables with (docs/kernel_abi.md).

- `segment_tables`, `last_segments`, `final_slots`, `non_last_segments`: the tables of a host
  `CPPlan` (kda_aot/plan/cp_plan.py) as the segmented kernels read them.
- `clamp_cu`, `device_seq_tables`, `dispatch_key`, `is_dispatch_order`: exact twins of the
  seq_tables kernels (seq_tables_int32/int64 and their seq_order).
- `device_segment_tables` (with `dense_cu` for dense input): the exact twin of cp_seg_tables.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from kda_aot.library.constants import CHUNK
from kda_aot.plan.cp_plan import INT32_MAX, CPPlan


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------------------------------------
# tables for the kernels

def segment_tables(plan: CPPlan) -> Tuple[List[int], List[int]]:
    """(seg_start_tokens [n_seg+1], seg_tile_prefix [n_seg+1]): the int32 `seq_start` and
    `tile_prefix` tables of segmented K2, with segments in place of sequences."""
    starts = list(plan.seg_token_start)
    prefix = list(plan.seg_cu)
    if starts[-1] > INT32_MAX or prefix[-1] > INT32_MAX:
        raise OverflowError(f"segment tables: {starts[-1]} tokens / {prefix[-1]} tiles do not fit int32")
    return starts, prefix


def last_segments(plan: CPPlan) -> List[int]:
    """Segment holding each sequence's final state (gather final_state[n] from it)."""
    return [first + n - 1 for first, n in plan.per_seq]


def final_slots(plan: CPPlan) -> List[int]:
    """Per segment, the sequence whose final state it writes (its last segment), or -1."""
    slots = [-1] * plan.n_segments
    for n, seg in enumerate(last_segments(plan)):
        slots[seg] = n
    return slots


def non_last_segments(plan: CPPlan, longest_first: bool = False) -> List[int]:
    """Segments pre_scan must process (all but each sequence's last), ascending, or longest
    first (ties by index) for the launch order of docs/algorithm.md §4.3."""
    segs = [first + i for first, n in plan.per_seq for i in range(n - 1)]
    if longest_first:
        tiles = plan.segment_tiles
        segs.sort(key=lambda s: (-tiles[s], s))
    return segs


# ------------------------------------------------------------------------------------------------
# tables built on the device (exact twins of the kernels seq_tables and cp_seg_tables)

def clamp_cu(cu: Sequence[int], t_total: int) -> List[int]:
    """c[i] = min(t_total, max(0, max_{j <= i} cu[j])): what the device makes of ANY cu_seqlens
    content. Non-decreasing, inside [0, t_total]; the identity on a valid cu_seqlens."""
    out, run = [], 0
    for v in cu:
        run = max(run, min(t_total, max(0, int(v))))  # 0 is the identity: clamped values are >= 0
        out.append(run)
    return out


def device_seq_tables(cu: Sequence[int], t_total: int,
                      listed: Optional[Sequence[int]] = None) -> Tuple[List[int], List[int]]:
    """(seq_start, tile_prefix) [N+1] as seq_tables_int32/int64 write them (docs/kernel_abi.md):
    the clamped starts and the prefix sum of ceil(len / 16). Tokens outside [c[0], c[N]) belong to
    no sequence; tile_prefix[N] <= ceil(t_total / 16) + N - 1. `listed` (the flags of
    listed_flags; seq_tables_listed_*): an unlisted sequence counts no tile."""
    c = clamp_cu(cu, t_total)
    prefix = [0]
    for n, (a, b) in enumerate(zip(c, c[1:])):
        prefix.append(prefix[-1] + (_ceil_div(b - a, CHUNK) if listed is None or listed[n] else 0))
    return c, prefix


def listed_flags(segment_ids: Sequence[int], n_seq: int) -> List[int]:
    """Twin of listed_sequences.mark_listed: 1 for every sequence the list names, entries outside
    [0, n_seq) skipped, repeats idempotent."""
    flags = [0] * n_seq
    for x in segment_ids:
        if 0 <= int(x) < n_seq:
            flags[int(x)] = 1
    return flags


def listed_slots(flags: Sequence[int], state_indices: Optional[Sequence[int]] = None) -> List[int]:
    """seq_tables_listed_*'s listed_slot: state_indices[n] (or n) for a listed sequence, else -1."""
    return [(n if state_indices is None else int(state_indices[n])) if f else -1 for n, f in enumerate(flags)]


def dispatch_key(tiles: int) -> int:
    """Twin of seq_tables.length_bucket: K2's dispatch-order key of a sequence of `tiles` tiles
    (0 for the longest; exact below 4 tiles, then four keys per octave, one key from 2^16 tiles)."""
    f = tiles if tiles < 4 else 4 * (tiles.bit_length() - 1) + ((tiles >> (tiles.bit_length() - 3)) & 3)
    return 63 - min(f, 63)


def is_dispatch_order(order: Sequence[int], tile_prefix: Sequence[int]) -> bool:
    """Whether `order` is what the varlen tables kernel may write as seq_order: a permutation of the
    sequences with non-decreasing dispatch_key (longest first; ties in any order)."""
    n = len(tile_prefix) - 1
    if sorted(order) != list(range(n)):
        return False
    keys = [dispatch_key(tile_prefix[i + 1] - tile_prefix[i]) for i in order]
    return all(a <= b for a, b in zip(keys, keys[1:]))


def dense_cu(n_seq: int, seq_len: int) -> List[int]:
    """The cu_seqlens a dense [B, T] input stands for: the dense kernel variants compute the
    twin of device_segment_tables(dense_cu(B, T), B * T, ...)."""
    return [n * seq_len for n in range(n_seq + 1)]


def device_segment_tables(cu: Sequence[int], t_total: int, seg_len: int, max_count: int, min_tiles: int,
                          max_segments: int, listed: Optional[Sequence[int]] = None) -> Tuple[List[int], ...]:
    """Exact twin of the cp_seg_tables kernels: (seg_start [S+1], seg_prefix [S+1], scan_seg [S],
    seg_first [N], seg_count [N], final_slot [S]) for S = max_segments, from cu_seqlens of any
    content (clamped as device_seq_tables does).

    Sequence n of t_n tiles gets c_n = max(1, min(ceil(t_n / L), max_count, t_n // min_tiles))
    segments (an empty one gets one empty segment), sized by split_sizes, in sequence order from
    seg_first[n] = sum_{m<n} c_m. Entry s of seg_start / seg_prefix is where segment s starts
    (token, global tile); the end of s is entry s + 1. Segments from sum c_n up to S are padding:
    they start (and end) at (c[N], total tiles), so they are empty and write no final state.
    scan_seg lists the non-last segments in ascending order, then -1; final_slot[s] is the
    sequence whose last segment s is, else -1.

    If sum c_n > S (a seg_len too short for S; device_plan's choice never allows it), segments
    from S on are dropped: entry S is where segment S would start, seg_first[n] = min(first, S),
    seg_count[n] counts only the kept segments, and a sequence whose last segment was dropped
    writes no final state. Nothing is written past S or N entries. seg_len and min_tiles below 1
    count as 1 (no division by zero whatever the scalars).

    `listed` (the flags; cp_seg_tables_listed_*): an unlisted sequence has no tile and one empty
    segment at its start, which ends the segment before it; its seg_count is 0 and that segment
    has no final slot."""
    c, prefix = device_seq_tables(cu, t_total, listed)
    N, S = len(c) - 1, max_segments
    L, per_tiles = max(1, seg_len), max(1, min_tiles)
    seg_start, seg_prefix = [c[N]] * (S + 1), [prefix[N]] * (S + 1)
    scan_seg, final_slot = [-1] * S, [-1] * S
    seg_first, seg_count = [], []
    first = 0
    for n in range(N):
        tiles = prefix[n + 1] - prefix[n]
        count = max(1, min(_ceil_div(tiles, L), max_count, tiles // per_tiles))
        seg_first.append(min(first, S))
        seg_count.append(max(0, min(count, S - first)) if listed is None or listed[n] else 0)
        base, extra = divmod(tiles, count)
        for i in range(min(count, S + 1 - first)):
            s = first + i
            local = i * base + min(i, extra)  # split_sizes: the first `extra` parts are one longer
            seg_start[s] = c[n] + CHUNK * local
            seg_prefix[s] = prefix[n] + local
            if s == S:  # only the end of segment S - 1
                break
            if i == count - 1:
                final_slot[s] = n if listed is None or listed[n] else -1
            else:
                scan_seg[first - n + i] = s
        first += count
    return seg_start, seg_prefix, scan_seg, seg_first, seg_count, final_slot
