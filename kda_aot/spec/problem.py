"""The problem a prefill call poses, once its arguments have passed the validation wall, and the
parsing of the values that the wall and the planner (`kda_aot.plan_prefill`) both take: the cp
mode and host integer sequences.

The wall (kda_aot/intake/validation.py) builds a `Problem`; the planner and launcher
(kda_aot/plan/) read one. Neither imports the other.
"""

from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass
from typing import Iterable, Optional, Tuple, Union

from .gate_forms import Form

CpMode = Union[str, int]
_CP_MODES = ("off", "auto", "on")


@dataclass(frozen=True)
class Problem:
    """What the planner and launcher need, once the arguments have passed validation."""

    B: int
    T: int
    H: int
    N: int  # number of sequences: B, or len(cu_seqlens) - 1
    varlen: bool
    cu_dtype: Optional[str]  # "int32" / "int64" / None
    state_dtype: Optional[str]  # "bfloat16" / "float32" / None (docs/algorithm.md §1.4 state dtype rule)
    has_initial: bool
    has_final: bool
    scale: float
    lower_bound: Optional[float]  # None for the gate forms without one (softplus, log_decay)
    device_id: int
    cp: CpMode = "off"  # parse_cp(cp): "off" | "auto" | "on" | segments per sequence
    # State pool by slot index (docs/state_pool.md): states are rows of state_pool [n_pool, H, 128,
    # 128] with a slot stride of slot_stride elements, selected per sequence by state_indices.
    pooled: bool = False
    n_pool: int = 0
    slot_stride: int = 0
    # Checkpoint states every checkpoint_every tokens (0: none) into n_checkpoints = B*T // C slots.
    checkpoint_every: int = 0
    n_checkpoints: int = 0
    numerics: str = "flashkda"  # parse_numerics(numerics): "flashkda" | "accurate" (docs/numerics.md)
    form: Form = Form()  # the gate and beta forms (kda_aot/spec/gate_forms.py)
    # Element strides of the strided inputs, normalised (size-1 dims carry their contiguous value):
    # (q_t, q_h, k_t, k_h, v_t, v_h, g_t, g_h, beta_t); () means every input is contiguous.
    strides: Tuple[int, ...] = ()
    # Checkpoints at given offsets (docs/state_pool.md): K per sequence (0: none), where they go
    # ("buffer": checkpoint_state, "pool": state_pool at checkpoint_slots) and the offsets' dtype.
    checkpoint_k: int = 0
    checkpoint_into: Optional[str] = None
    checkpoint_offsets_dtype: Optional[str] = None
    # Listed sequences (segment_ids, docs/state_pool.md): the call runs the sequences its int32 [M]
    # list names and leaves every other one untouched; n_listed = M.
    listed: bool = False
    n_listed: int = 0


def parse_cp(cp, name: str = "cp") -> CpMode:
    """"off" | "auto" | "on" | segments per sequence (int >= 1); anything else is a ValueError
    naming the argument (`name`: "cp" for prefill, "mode" for plan_prefill)."""
    if cp is True or cp is False:
        suggestion = '"on"' if cp else '"off"'
        raise ValueError(f"{name}: booleans are ambiguous, got {cp!r}; pass {suggestion} instead")
    if isinstance(cp, str):
        if cp in _CP_MODES:
            return cp
        raise ValueError(f"{name}: expected \"off\", \"auto\", \"on\" or an int >= 1, got {cp!r}")
    if isinstance(cp, numbers.Integral) and not isinstance(cp, bool):
        if int(cp) >= 1:
            return int(cp)
        raise ValueError(f"{name}: a segment count per sequence must be >= 1, got {int(cp)}")
    raise ValueError(f"{name}: expected \"off\", \"auto\", \"on\" or an int >= 1, "
                     f"got {cp!r} ({type(cp).__name__})")


def int_entries(values: Iterable, name: str, error: type = TypeError) -> list:
    """Each entry of a host sequence as an int (operator.index, so numpy integers pass); a bool or a
    non-integer entry raises `error` naming the argument and the entry (cu_seqlens, seq_lens)."""
    out = []
    for i, x in enumerate(values):
        if isinstance(x, bool):
            raise error(f"{name}: entry {i} is a bool ({x!r}), expected an int")
        try:
            out.append(int(operator.index(x)))
        except TypeError:
            raise error(f"{name}: entry {i} must be an int, got {x!r} ({type(x).__name__})") from None
    return out
