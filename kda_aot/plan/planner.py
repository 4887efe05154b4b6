"""Pure-Python planning: tile capacity, the K2 value-column split and kernel variant choice.

Nothing here touches the GPU; every decision depends only on the validated problem and the SM
count, so it is unit-tested on the CPU.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Tuple

from ..library.constants import CHUNK, REGSTATE_VALUE_BLOCKS, D, VALUE_BLOCKS

# K2 value blocks per (sequence, head), one per block size the library ships: 1, 2 or 4 CTAs of
# 128, 64 or 32 value rows each.
VALUE_SPLITS = tuple(D // vb for vb in VALUE_BLOCKS)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tile_capacity(T: int, N: int, varlen: bool) -> int:
    """Workspace slots per head: exact for dense inputs, an upper bound for packed ones.

    A packed batch of N sequences and T tokens has at most ceil(T/16) + N tiles (each sequence
    adds at most one partial tile); the exact count lives on the device (tile_prefix[N]).
    """
    if N == 0 or T == 0:
        return 0
    return ceil_div(T, CHUNK) + N if varlen else N * ceil_div(T, CHUNK)


# The splits a serial call chooses from (either recipe): VB=128 and 64, where the register-state K2
# runs (k2_kernel). VB=32 has only the mma.sync K2, and on the H200 it lost to the register-state
# kernel at VB=64 or 128 on all nine single-sequence shapes measured, H=4 to 128
# (docs/k2_regstate.md). CP's pre_scan, which has only the mma.sync form, keeps all three (cp_splits).
REGSTATE_SPLITS = (1, 2)


def value_split(n_seq: int, n_heads: int, sm_count: int, splits: Tuple[int, ...] = VALUE_SPLITS) -> int:
    """How many CTAs share one (sequence, head) in K2, each owning 128/split value rows.

    Rows of the state evolve independently, so a split costs only re-reading the workspace tile
    from L2. When the (sequence, head) pairs already give every SM a CTA, no split (more CTAs per
    SM then only share its tensor cores). Otherwise the split minimises the waves of whole-head
    work per SM, ceil(N*H*s / SMs) / s, over `splits`, ties going to the smaller split. With the
    mma.sync K2 alone this picked the fastest split for all six serial benchmark shapes on the H200
    (docs/value_split.md); serial calls now choose from REGSTATE_SPLITS.
    """
    work = n_seq * n_heads
    if work >= sm_count:
        return 1
    return min(splits, key=lambda s: (ceil_div(work * s, sm_count) / s, s))


def k2_splits(numerics: str) -> Tuple[int, ...]:
    """The value splits K2 chooses from: REGSTATE_SPLITS, where the register-state K2 runs. Both
    recipes have it (numerics="accurate" its own twins, k2_regstate.py), so both choose alike."""
    return REGSTATE_SPLITS


def cp_splits(n_segments: int, n_seq: int, n_heads: int, sm_count: int, numerics: str = "flashkda") -> Tuple[int, int]:
    """(pre_scan's value split, the segmented K2's) for a CP call of up to `n_segments` segments.

    Each kernel gets the wave rule over its own grid: pre_scan runs the non-last segments only
    (n_segments - n_seq, a bound) and has only the mma.sync form, so it chooses from all of
    VALUE_SPLITS; K2 runs every segment and chooses from REGSTATE_SPLITS as a serial call does. Measured
    on the H200 (docs/cp_tuning.md, "Per-kernel value splits"), this picked the fastest split of each
    kernel on all eight CP shapes timed. numerics="accurate" follows the same rule (its pre_scan and
    segmented K2 have the same forms)."""
    k2 = value_split(n_segments, n_heads, sm_count, k2_splits(numerics))
    return value_split(max(n_segments - n_seq, 1), n_heads, sm_count), k2


# K2 kernels, one name per implementation of the same recurrence and rounding (bit for bit equal):
# "k2" keeps the state in shared memory and multiplies with mma.sync (k2_recurrence.py);
# "regstate" keeps it in registers and multiplies with warpgroup MMAs (k2_regstate.py; VB=64 and
# 128, both recipes).
K2_KERNELS = ("k2", "regstate")
# On the H200 (docs/k2_regstate.md) regstate beat k2 on every shape measured at VB=64 and, with its
# producer warpgroup, at VB=128 (15 serial shapes from 4 to 512 (sequence, head) pairs, the CP rows),
# so it runs at every value block it is built at (REGSTATE_VALUE_BLOCKS, from the build).


def k2_kernel(value_block: int) -> str:
    """Which K2 implementation runs at `value_block`: the register-state kernel where it exists,
    k2 elsewhere (one of K2_KERNELS; the launcher falls back to k2 where the library has no
    register-state twin: VB=32)."""
    return "regstate" if value_block in REGSTATE_VALUE_BLOCKS else "k2"


@dataclasses.dataclass(frozen=True)
class SerialPlan:
    tile_capacity: int
    value_split: int
    k2_constants: Mapping[str, object]
    reason: str


def plan_serial(*, T: int, N: int, H: int, varlen: bool, has_initial: bool, has_final: bool,
                state_dtype: Optional[str], sm_count: int, value_split_override: Optional[int] = None,
                numerics: str = "flashkda") -> SerialPlan:
    split = value_split_override or value_split(N, H, sm_count, k2_splits(numerics))
    if split not in VALUE_SPLITS:
        raise ValueError(f"value_split: expected one of {VALUE_SPLITS}, got {split}")
    constants = {
        "has_initial": has_initial,
        "has_final": has_final,
        "state_fp32": state_dtype == "float32" and (has_initial or has_final),
        "value_block": D // split,
        "accurate": numerics == "accurate",  # docs/numerics.md: a compile-time variant of K2
        "ablation": 0,  # the full recipe (other levels are measurement-only kernels, registry._k2_ablation)
    }
    return SerialPlan(tile_capacity(T, N, varlen), split, constants,
                      f"{N * H} (sequence, head) pairs x {split} value blocks on {sm_count} SMs")
