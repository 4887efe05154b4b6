"""What a call of one problem shape needs, decided once: the validated problem, the kernel program,
the output and workspace sizes, and the pointer checks every call still makes.

A `CallPlan` is built on the first call of a shape from the full validation wall and cached under
a key of shapes, strides, dtypes, devices, scalars and options: never a pointer and never a
caller's object, so the cache holds no caller memory alive. A later call of the same key only
reads its pointers and runs `check_pointers`, the part of the wall that depends on addresses
(alignment, overlap); on any failure the call re-runs the full wall, so the error it raises is
the one the wall would have raised first (docs/call_path.md).
"""

from __future__ import annotations

import dataclasses
import functools
from functools import reduce
from operator import itemgetter, or_
from typing import Optional, Sequence, Tuple

from . import cp_plan, launcher
from ..spec import prefill_args
from ..library.constants import D, WORKSPACE_ALIGN
from .launcher import Launch, Segmentation
from .program import SLOT
from ..spec.problem import Problem



class UnsafePointers(Exception):
    """Raised by check_pointers: the call must go through the full wall, which names the argument."""


@dataclasses.dataclass(frozen=True)
class CallPlan:
    problem: Problem
    launch: Launch
    out_shape: Tuple[int, ...]
    final_shape: Optional[Tuple[int, ...]]  # None without a final state
    final_dtype: Optional[str]
    alloc_final: bool  # the call allocates the final state (output_final_state without a buffer)
    # (input slot, alignment mask) for every non-empty tensor the caller passed
    align: Tuple[Tuple[int, int], ...]
    # (slot, nbytes) of every caller-given buffer that is written (out, final_state, checkpoint
    # buffers, the pool, workspace), and of every tensor they must not overlap; nbytes spans a
    # strided view from its pointer to the end of its last element
    written: Tuple[Tuple[int, int], ...]
    read: Tuple[Tuple[int, int], ...]
    workspace_given: bool
    # checkpoints (docs/state_pool.md): shape of the states, and whether the call allocates them
    # and the index table (checkpoint_every without checkpoints= / checkpoint_index=)
    checkpoint_shape: Optional[Tuple[int, ...]] = None
    alloc_checkpoints: bool = False
    alloc_checkpoint_index: bool = False

    @property
    def workspace_bytes(self) -> int:
        return self.launch.workspace_bytes

    def check_pointers(self, ptrs: Sequence[int]) -> None:
        """Alignment, then overlaps of the caller-given outputs and workspace with everything else;
        plain integer arithmetic in a few C-level passes (a per-pointer Python loop costs several
        microseconds per call on a serving host)."""
        for getter, mask in self._align_groups:
            if reduce(or_, getter(ptrs)) & mask:
                raise UnsafePointers
        if self.written:
            # Sweep the spans in address order: a span overlaps an earlier one iff it starts before
            # the largest end seen so far. Inputs may overlap each other (q may be k); a written
            # span may overlap nothing, and nothing may start inside a written span.
            spans = sorted([(ptrs[s], n, True) for s, n in self.written] + [(ptrs[s], n, False) for s, n in self.read])
            end_any = end_written = 0
            for start, n, written in spans:
                if start < (end_any if written else end_written):
                    raise UnsafePointers
                end = start + n
                if end > end_any:
                    end_any = end
                if written and end > end_written:
                    end_written = end

    @functools.cached_property
    def _align_groups(self):
        """(itemgetter over the slots, mask) per alignment; a one-slot getter returns an int, so
        every getter returns a tuple for reduce."""
        groups: dict = {}
        for slot, mask in self.align:
            groups.setdefault(mask, []).append(slot)
        out = []
        for mask, slots in groups.items():
            getter = itemgetter(*slots) if len(slots) > 1 else (lambda p, s=slots[0]: (p[s],))
            out.append((getter, mask))
        return tuple(out)


def segmentation(problem: Problem, lengths: Optional[Tuple[int, ...]], sm_count: int) -> Optional[Segmentation]:
    """The CP cut for this call, or None for the serial path.

    With host lengths (dense inputs, or a `seq_lens` / `cu_seqlens_cpu` hint) the host planner
    decides, and the device builds exactly its tables. With device `cu_seqlens` only, the host
    chooses a segment length from T, N, H and the SM count that bounds the segment count for any
    lengths (cp_plan.device_plan), and the device cuts each sequence.
    """
    if problem.cp == "off" or problem.N == 0 or problem.H == 0:
        return None
    if lengths is not None:
        plan = cp_plan.plan_prefill(lengths, problem.H, sm_count=sm_count, mode=problem.cp)
        if plan.trivial:
            return None
        return Segmentation(plan.seg_len, plan.max_count, plan.min_tiles, plan.n_segments)
    found = cp_plan.device_plan(problem.B * problem.T, problem.N, problem.H, sm_count, problem.cp)
    return None if found is None else Segmentation(*found)


def build(lib, problem: Problem, *, lengths: Optional[Tuple[int, ...]], sm_count: int,
          value_split: Optional[int], given: dict, nbytes: dict, alignment: dict) -> CallPlan:
    """`given`: argument name -> bool (passed by the caller); `nbytes`: size of each given tensor;
    `alignment`: the bytes each pointer argument must be aligned to (validation's table)."""
    seg = segmentation(problem, lengths, sm_count)
    if seg is not None and not launcher.cp_available(lib):
        if problem.cp == "auto":
            seg = None
        else:
            raise NotImplementedError("cp: this build has no context-parallel kernels (see kda_aot.info())")
    if seg is None:
        launch = launcher.serial_launch(lib, problem, sm_count, value_split)
    else:
        launch = launcher.cp_launch(lib, problem, seg, sm_count, value_split)
    nbytes = dict(nbytes, workspace=launch.workspace_bytes if given.get("workspace") else 0)
    align = [(SLOT[name], alignment[name] - 1) for name, g in given.items()
             if g and name != "workspace" and nbytes[name] > 0 and alignment.get(name, 1) > 1]
    if given.get("workspace"):
        align.append((SLOT["workspace"], WORKSPACE_ALIGN - 1))
    written = [(SLOT[n], nbytes[n]) for n in prefill_args.WRITTEN + ("workspace",) if given.get(n) and nbytes[n] > 0]
    read = [(SLOT[n], nbytes[n]) for n in prefill_args.READ if given.get(n) and nbytes[n] > 0]
    has_final = problem.has_final
    return CallPlan(
        problem=problem, launch=launch, out_shape=(problem.B, problem.T, problem.H, D),
        final_shape=(problem.N, problem.H, D, D) if has_final else None,
        final_dtype=problem.state_dtype if has_final else None,
        alloc_final=has_final and not given.get("final_state"),
        checkpoint_shape=(problem.n_checkpoints, problem.H, D, D) if problem.checkpoint_every else None,
        alloc_checkpoints=bool(problem.checkpoint_every) and not given.get("checkpoints"),
        alloc_checkpoint_index=bool(problem.checkpoint_every) and not given.get("checkpoint_index"),
        align=tuple(align), written=tuple(written), read=tuple(read),
        workspace_given=bool(given.get("workspace")))
