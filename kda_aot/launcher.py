"""Runs a validated problem: sequence tables -> K1 -> K2, all on the caller's stream.

Inputs arrive as TensorDescs that passed the validation wall; this module only marshals pointers
and sizes (the kernels' C ABI checks nothing, docs/kernel_abi.md) and launches.
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from . import planner
from .loader import KernelLibrary
from .tensors import TensorDesc
from .validation import Problem
from .workspace import ARENA, workspace_layout

LOG2E = 1.4426950408889634


def gate_constant(lower_bound: float) -> float:
    """c = f32(lb * LOG2E): the product is formed in double and rounded once (spec 2.4 P2)."""
    return float(np.float32(lower_bound * LOG2E))


def run_sequence_tables(lib: KernelLibrary, problem: Problem, cu: Optional[TensorDesc],
                        ptrs: Dict[str, int], stream: int) -> None:
    if problem.varlen:
        lib.kernel(f"seq_tables_{problem.cu_dtype}")(cu.ptr, ptrs["seq_start"], ptrs["tile_prefix"], problem.N, stream)
    else:
        lib.kernel("seq_tables_dense")(ptrs["seq_start"], ptrs["tile_prefix"], problem.N, problem.T, stream)


def run_serial(lib: KernelLibrary, problem: Problem, t: Dict[str, Optional[TensorDesc]], stream: int,
               sm_count: int, value_split: Optional[int] = None) -> planner.SerialPlan:
    """Launch the serial path. `t` maps argument names to descriptors (out/final_state resolved)."""
    plan = planner.plan_serial(T=problem.T, N=problem.N, H=problem.H, varlen=problem.varlen,
                               has_initial=problem.has_initial, has_final=problem.has_final,
                               state_dtype=problem.state_dtype, sm_count=sm_count,
                               value_split_override=value_split)
    if problem.N == 0 or problem.H == 0:
        return plan  # empty work: nothing to launch (spec 1.4)
    t_total = problem.B * problem.T
    layout = workspace_layout(problem.H, plan.tile_capacity, problem.N)
    base = ARENA.get(problem.device_id, stream, layout.nbytes)
    p = layout.pointers(base)
    lib.set_device(problem.device_id)
    run_sequence_tables(lib, problem, t.get("cu_seqlens"), p, stream)
    ws = (p["qd"], p["kd"], p["kr"], p["gt"], p["inv"], p["mqk"], p["bsig"])
    sizes = (t_total, problem.N, problem.H, plan.tile_capacity)
    if plan.tile_capacity > 0:
        k1 = lib.kernel("k1_prepare")
        k1(t["q"].ptr, t["k"].ptr, t["g"].ptr, t["beta"].ptr, t["A_log"].ptr, t["dt_bias"].ptr,
           p["seq_start"], p["tile_prefix"], *ws, *sizes, problem.scale, gate_constant(problem.lower_bound), stream)
    k2 = planner.select_variant(lib.kernels.values(), "k2_recurrence", plan.k2_constants)
    initial = t.get("initial_state")
    final = t.get("final_state")
    k2(t["v"].ptr, t["out"].ptr, *ws, p["seq_start"], p["tile_prefix"],
       initial.ptr if initial is not None else 0, final.ptr if final is not None else 0, *sizes, stream)
    return plan


def serial_available(lib: KernelLibrary) -> bool:
    return lib.has("k1_prepare") and any(k.entry == "k2_recurrence" for k in lib.kernels.values())


def memory_floor_bytes(problem: Problem) -> int:
    """Bytes prefill must move at least: q, k, v, g, out (bf16), beta, gate params and states."""
    tokens = problem.B * problem.T
    per_token = problem.H * (5 * 128 * 2 + 2)
    state_bytes = problem.N * problem.H * 128 * 128 * (4 if problem.state_dtype == "float32" else 2)
    states = state_bytes * (int(problem.has_initial) + int(problem.has_final))
    return tokens * per_token + states + problem.H * 129 * 4

