"""Runs a validated problem: sequence tables -> K1 -> K2, all on the caller's stream.

Inputs arrive as TensorDescs that passed the validation wall; this module only marshals pointers
and sizes (the kernels' C ABI checks nothing, docs/kernel_abi.md) and launches.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, Optional

import numpy as np

from . import cp_plan, planner
from .loader import KdaError, KernelLibrary
from .tensors import TensorDesc
from .validation import Problem
from .workspace import ARENA, WorkspaceLayout, workspace_layout

LOG2E = 1.4426950408889634


def gate_constant(lower_bound: float) -> float:
    """c = f32(lb * LOG2E): the product is formed in double and rounded once (spec 2.4 P2)."""
    return float(np.float32(lower_bound * LOG2E))


class Program:
    """The launches of one call, arguments boxed once, replayable for an identical call.

    A steady-state caller (same tensors, shapes and stream) replays the program: the host cost is
    then the kernel launches alone, which matters when the GPU work is a few hundred microseconds.
    A program holds workspace pointers, so it is valid only while the arena keeps its buffer.
    """

    def __init__(self, lib: KernelLibrary, device_id: int, stream: int):
        self.lib, self.device_id, self.stream = lib, device_id, stream
        self.steps: list = []
        self.arena_base = 0

    def kernel(self, name: str):
        return self.add_call(self.lib.kernel(name))

    def add_call(self, kernel):
        return lambda *values: self.steps.append((kernel, kernel.prepare(*values)))

    def upload(self, blob: np.ndarray, dst: int) -> None:
        self.steps.append((_upload, (blob, dst, self.stream)))

    def valid(self) -> bool:
        return ARENA.base(self.device_id, self.stream) == self.arena_base

    def run(self) -> None:
        self.lib.set_device(self.device_id)
        if not any(fn is _upload for fn, _ in self.steps):
            _forget_upload(self.stream)  # this call's workspace may overlap uploaded CP tables
        for fn, args in self.steps:
            if fn is _upload:
                _upload(*args)
            else:
                fn.launch(args)


def record_sequence_tables(prog: Program, problem: Problem, cu: Optional[TensorDesc], ptrs: Dict[str, int]) -> None:
    if problem.varlen:
        prog.kernel(f"seq_tables_{problem.cu_dtype}")(cu.ptr, ptrs["seq_start"], ptrs["tile_prefix"], problem.N,
                                                      prog.stream)
    else:
        prog.kernel("seq_tables_dense")(ptrs["seq_start"], ptrs["tile_prefix"], problem.N, problem.T, prog.stream)


def serial_program(lib: KernelLibrary, problem: Problem, t: Dict[str, Optional[TensorDesc]], stream: int,
                   sm_count: int, value_split: Optional[int] = None) -> Program:
    """The serial path's launches. `t` maps argument names to descriptors (outputs resolved)."""
    plan = planner.plan_serial(T=problem.T, N=problem.N, H=problem.H, varlen=problem.varlen,
                               has_initial=problem.has_initial, has_final=problem.has_final,
                               state_dtype=problem.state_dtype, sm_count=sm_count,
                               value_split_override=value_split)
    prog = Program(lib, problem.device_id, stream)
    if problem.N == 0 or problem.H == 0:
        return prog  # empty work: nothing to launch (spec 1.4)
    t_total = problem.B * problem.T
    layout = workspace_layout(problem.H, plan.tile_capacity, problem.N)
    prog.arena_base = base = ARENA.get(problem.device_id, stream, layout.nbytes)
    p = layout.pointers(base)
    record_sequence_tables(prog, problem, t.get("cu_seqlens"), p)
    ws = (p["qd"], p["kd"], p["kr"], p["gt"], p["inv"], p["mqk"], p["bsig"])
    sizes = (t_total, problem.N, problem.H, plan.tile_capacity)
    if plan.tile_capacity > 0:
        prog.kernel("k1_prepare")(t["q"].ptr, t["k"].ptr, t["g"].ptr, t["beta"].ptr, t["A_log"].ptr, t["dt_bias"].ptr,
           p["seq_start"], p["tile_prefix"], *ws, *sizes, problem.scale, gate_constant(problem.lower_bound), stream)
    initial = t.get("initial_state")
    final = t.get("final_state")
    prog.add_call(k2_variant(lib, plan.k2_constants))(
        t["v"].ptr, t["out"].ptr, *ws, p["seq_start"], p["tile_prefix"],
        initial.ptr if initial is not None else 0, final.ptr if final is not None else 0, *sizes, stream)
    return prog


_VARIANTS: Dict[tuple, object] = {}


def k2_variant(lib: KernelLibrary, constants: Dict[str, object]):
    """The K2 kernel for these constants (looked up once per library and constants)."""
    key = (id(lib), tuple(sorted(constants.items())))
    kernel = _VARIANTS.get(key)
    if kernel is None:
        kernel = _VARIANTS[key] = planner.select_variant(lib.kernels.values(), "k2_recurrence", constants)
    return kernel


@functools.lru_cache(maxsize=None)
def serial_available(lib: KernelLibrary) -> bool:
    return lib.has("k1_prepare") and any(k.entry == "k2_recurrence" for k in lib.kernels.values())


# ---------------------------------------------------------------------------------------------
# Intracard context parallelism (spec 4): K1 once -> pre_scan -> merge -> segmented K2, whose last
# segments write the final states.

STATE_BYTES = 128 * 128 * 4  # one fp32 [V, K] state


@functools.lru_cache(maxsize=None)
def cp_available(lib: KernelLibrary) -> bool:
    return all(any(k.entry == e for k in lib.kernels.values())
               for e in ("cp_pre_scan", "cp_merge", "k2_segments", "k2_recurrence"))


@dataclasses.dataclass(frozen=True)
class CPLaunch:
    """Everything a CP call derives from (plan, heads, tile capacity), computed once per shape."""

    blob: np.ndarray  # the int32 tables, uploaded as one copy
    table_offsets: Dict[str, int]  # byte offset of each table inside the blob
    layout: WorkspaceLayout
    n_scan: int


@functools.lru_cache(maxsize=64)
def cp_launch(plan: cp_plan.CPPlan, n_heads: int, tile_cap: int) -> CPLaunch:
    seg_start, seg_prefix = cp_plan.segment_tables(plan)
    scan = cp_plan.non_last_segments(plan, longest_first=True)
    tables = {
        "seg_start": seg_start, "seg_prefix": seg_prefix, "scan_seg": scan or [0],
        "seg_first": [f for f, _ in plan.per_seq], "seg_count": [c for _, c in plan.per_seq],
        "final_slot": cp_plan.final_slots(plan),
    }
    offsets, at = {}, 0
    for name, values in tables.items():
        offsets[name] = at
        at += 4 * len(values)
    blob = np.concatenate([np.asarray(v, np.int32) for v in tables.values()])
    blob.setflags(write=False)
    # K1's workspace for the segment tables, then the CP scratch (spec 4.7).
    base = workspace_layout(n_heads, tile_cap, plan.n_segments)
    regions, offset = dict(base.regions), base.nbytes
    scratch = plan.n_segments * n_heads * STATE_BYTES
    for name, nbytes in [("tables", blob.nbytes)] + [(n, scratch) for n in ("b_seg", "m_seg", "carries")]:
        regions[name] = (offset, nbytes)
        offset = -(-(offset + nbytes) // 256) * 256
    return CPLaunch(blob, offsets, WorkspaceLayout(regions, offset), len(scan))


# The last segment tables uploaded per stream, with their destination. The host copy stays alive
# (a copy captured into a CUDA graph reads its source at every replay), and an identical upload
# to the same place is skipped: nothing but a CP call writes that region, and every serial call
# forgets the record (its workspace may overlap the region).
_UPLOADS: Dict[int, tuple] = {}


def _forget_upload(stream: int) -> None:
    _UPLOADS.pop(stream, None)


def _upload(blob: np.ndarray, dst: int, stream: int) -> None:
    from cuda.bindings import driver

    from .streams import is_capturing

    last = _UPLOADS.get(stream)
    if last is not None and last[0] == dst and last[1] is blob and not is_capturing(stream):
        return
    _UPLOADS[stream] = (dst, blob)
    (err,) = driver.cuMemcpyHtoDAsync(dst, blob.ctypes.data, blob.nbytes, driver.CUstream(stream))
    if err != driver.CUresult.CUDA_SUCCESS:
        raise KdaError(f"uploading the CP segment tables failed: {err}")


def cp_program(lib: KernelLibrary, problem: Problem, t: Dict[str, Optional[TensorDesc]], stream: int,
               plan: cp_plan.CPPlan, sm_count: int, value_split: Optional[int] = None) -> Program:
    """The CP sequence's launches for a non-trivial plan."""
    prog = Program(lib, problem.device_id, stream)
    H, n_seg, N = problem.H, plan.n_segments, problem.N
    split = value_split or planner.value_split(n_seg, H, sm_count)
    vb = planner.D // split
    tile_cap = max(1, planner.tile_capacity(problem.B * problem.T, n_seg, True))
    launch = cp_launch(plan, H, tile_cap)
    prog.arena_base = base = ARENA.get(problem.device_id, stream, launch.layout.nbytes)
    p = launch.layout.pointers(base)
    offsets = {name: p["tables"] + off for name, off in launch.table_offsets.items()}
    prog.upload(launch.blob, p["tables"])
    ws = (p["qd"], p["kd"], p["kr"], p["gt"], p["inv"], p["mqk"], p["bsig"])
    t_total = problem.B * problem.T
    seg_tables = (offsets["seg_start"], offsets["seg_prefix"])
    prog.kernel("k1_prepare")(t["q"].ptr, t["k"].ptr, t["g"].ptr, t["beta"].ptr, t["A_log"].ptr, t["dt_bias"].ptr,
                              *seg_tables, *ws, t_total, n_seg, H, tile_cap, problem.scale,
                             gate_constant(problem.lower_bound), stream)
    n_scan = launch.n_scan
    if n_scan:
        prog.kernel(f"cp_pre_scan_vb{vb}")(t["v"].ptr, p["kd"], p["kr"], p["gt"], p["inv"], p["bsig"], *seg_tables,
                                          offsets["scan_seg"], p["b_seg"], p["m_seg"], n_scan, H, tile_cap, stream)
    initial = t.get("initial_state")
    merge = "nostate" if initial is None else ("f32" if problem.state_dtype == "float32" else "bf16")
    prog.kernel(f"cp_merge_{merge}")(p["m_seg"], p["b_seg"], initial.ptr if initial is not None else 0, p["carries"],
                                    offsets["seg_first"], offsets["seg_count"], N, H, stream)
    # Segments start from their carries (fp32, rounded to bf16 on entry exactly as serial K2 rounds
    # an fp32 initial state); each sequence's last segment writes its final state.
    final = t.get("final_state")
    sizes = (t_total, n_seg, H, tile_cap, stream)
    if final is None:
        k2 = k2_variant(lib, {"has_initial": True, "has_final": False, "state_fp32": True, "value_block": vb})
        prog.add_call(k2)(t["v"].ptr, t["out"].ptr, *ws, *seg_tables, p["carries"], 0, *sizes)
    else:
        dtype = "f32" if problem.state_dtype == "float32" else "bf16"
        prog.kernel(f"k2_segments_{dtype}_vb{vb}")(t["v"].ptr, t["out"].ptr, *ws, *seg_tables, p["carries"], final.ptr,
                                                   offsets["final_slot"], *sizes)
    return prog
