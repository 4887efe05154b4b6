"""Prefill's tensor arguments, declared once: name, dtypes with the alignment the kernels assume
for each, role, and the rules that single an argument out. The validation wall, the per-call
pointer vector (program.INPUTS), the intake order (intake/arguments.py TENSOR_ARGS) and the call plan's
overlap spans all derive their lists from this table (tests/cpu/test_one_source.py ties the
signatures to it).

Alignment (bytes, per dtype) is the largest any kernel declares for the pointer it receives
(build_kernels/registry.py); the build writes the same table to the manifest as `arg_alignment`
and a CPU test keeps the two equal. Bulk (TMA) copies need 16 bytes; beta is read as bf16 pairs,
A_log per element, dt_bias in 16-byte vectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Tuple

BF16, FP32, I32, I64 = "bfloat16", "float32", "int32", "int64"
_STATE = {BF16: 16, FP32: 16}  # every state-shaped tensor: bf16 or fp32, 16-byte rows


@dataclass(frozen=True)
class TensorArg:
    name: str
    align: Mapping[str, int]  # dtype -> bytes the kernels assume; its keys are the accepted dtypes
    role: str  # "read", "written" (in place), or "read-written" (the state pool: read and written where it is read)
    required: bool = False
    state: bool = False  # shares the call's one state dtype (the kernels keep a single state format)
    strided: bool = False  # read in place as a strided view (every other tensor must be contiguous)

    @property
    def dtypes(self) -> Tuple[str, ...]:
        return tuple(self.align)


# In the order of the per-call pointer vector (program.INPUTS, then workspace and stream).
ARGS: Tuple[TensorArg, ...] = (
    TensorArg("q", {BF16: 16}, "read", required=True, strided=True),
    TensorArg("k", {BF16: 16}, "read", required=True, strided=True),
    TensorArg("v", {BF16: 16}, "read", required=True, strided=True),
    TensorArg("g", {BF16: 16, FP32: 16}, "read", required=True, strided=True),  # fp32 only with gate="log_decay"
    TensorArg("beta", {BF16: 2, FP32: 4}, "read", required=True, strided=True),
    TensorArg("A_log", {FP32: 4}, "read"),
    TensorArg("dt_bias", {FP32: 16}, "read"),
    TensorArg("initial_state", _STATE, "read", state=True),
    TensorArg("cu_seqlens", {I32: 4, I64: 8}, "read"),
    TensorArg("out", {BF16: 16}, "written"),
    TensorArg("final_state", _STATE, "written", state=True),
    TensorArg("state_pool", _STATE, "read-written", state=True),
    TensorArg("state_indices", {I32: 4}, "read"),
    TensorArg("checkpoints", _STATE, "written", state=True),
    TensorArg("checkpoint_index", {I32: 4}, "written"),
    TensorArg("checkpoint_state", _STATE, "written", state=True),
    TensorArg("checkpoint_offsets", {I32: 4, I64: 8}, "read"),
    TensorArg("checkpoint_slots", {I32: 4}, "read"),
    TensorArg("segment_ids", {I32: 4}, "read"),  # the sequences the call runs (docs/state_pool.md)
)

NAMES: Tuple[str, ...] = tuple(a.name for a in ARGS)
REQUIRED: Tuple[str, ...] = tuple(a.name for a in ARGS if a.required)
OPTIONAL: Tuple[str, ...] = tuple(a.name for a in ARGS if not a.required)
READ: Tuple[str, ...] = tuple(a.name for a in ARGS if a.role == "read")
# Written in place. The state pool is read too, but only where it is written: it may overlap
# nothing else, which the outputs' overlap check gives.
WRITTEN: Tuple[str, ...] = tuple(a.name for a in ARGS if a.role != "read")
STATES: Tuple[str, ...] = tuple(a.name for a in ARGS if a.state)
STRIDED: Tuple[str, ...] = tuple(a.name for a in ARGS if a.strided)
DTYPES: Dict[str, Tuple[str, ...]] = {a.name: a.dtypes for a in ARGS}
ALIGNMENT: Dict[str, Dict[str, int]] = {a.name: dict(a.align) for a in ARGS}
