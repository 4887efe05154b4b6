"""The kernel sequence of a validated problem, as a Program (program.py).

serial: sequence tables -> K1 -> K2.
CP (docs/algorithm.md §4): segment tables -> K1 over the segments -> pre_scan -> merge -> segmented K2, whose
last segments write the final states.

Everything here depends only on the problem's shapes and options, never on a pointer: a call
supplies its pointers when it runs the program. The sequence and segment tables are built on the
device from `cu_seqlens` (seq_tables, cp_seg_tables), so no call reads anything back to the
host, and every grid is sized by a bound the host knows; CTAs past the real work exit at once.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import NamedTuple, Optional

import numpy as np

from . import planner
from ..errors import KernelNotBuiltError
from ..library.constants import LOG2E, kernel
from ..spec.gate_forms import k1_kernel
from ..library.loader import MEASUREMENT_BUILD, KernelLibrary
from .program import NULL, STREAM, Program, Ref, ws
from ..spec.problem import Problem
from .workspace import cp_layout, workspace_layout

WS_REGIONS = ("qd", "kd", "kr", "gt", "inv", "mqk", "bsig")


def gate_constant(lower_bound: float) -> float:
    """c = f32(lb * LOG2E): the product is formed in double and rounded once (docs/algorithm.md §2.4 P2)."""
    return float(np.float32(lower_bound * LOG2E))


class Segmentation(NamedTuple):
    """How cp_seg_tables cuts the sequences (tests/cp_twins.py device_segment_tables is its twin):
    c_n = max(1, min(ceil(tiles_n / seg_len), max_count, tiles_n // min_tiles)) segments for
    sequence n, at most max_segments in all (the grids' bound)."""

    seg_len: int
    max_count: int
    min_tiles: int
    max_segments: int


@dataclasses.dataclass(frozen=True)
class Launch:
    """A call's program and the workspace bytes it needs."""

    program: Program
    workspace_bytes: int
    kind: str  # "serial", "cp" or "empty"


def _workspace_args(off) -> dict:
    return {f"ws_{name}": ws(off[name]) for name in WS_REGIONS}


def input_strides(problem: Problem) -> dict:
    """The token and head strides (elements) at which the kernels read q, k, g, v and beta in place
    (validation normalises them; an empty Problem.strides means contiguous inputs)."""
    H, D = problem.H, planner.D
    values = problem.strides or (H * D, D) * 4 + (H,)
    names = ("q_stride_t", "q_stride_h", "k_stride_t", "k_stride_h", "v_stride_t", "v_stride_h", "g_stride_t",
             "g_stride_h", "beta_stride_t")
    return dict(zip(names, values))


def _v_strides(problem: Problem) -> dict:
    s = input_strides(problem)
    return dict(v_stride_t=s["v_stride_t"], v_stride_h=s["v_stride_h"])


def _k1_strides(problem: Problem) -> dict:
    return {name: value for name, value in input_strides(problem).items() if not name.startswith("v_")}


def contiguous_k1_strides(H: int) -> dict:
    """K1's stride arguments for contiguous q, k, g [T, H, 128] and beta [T, H]."""
    strides = {f"{x}_stride_{d}": (H * planner.D if d == "t" else planner.D) for x in "qkg" for d in "th"}
    strides["beta_stride_t"] = H
    return strides


def k1_reads_strided(problem: Problem) -> bool:
    """Whether K1 must read q, k, g or beta at strides other than contiguous [T, H, 128] / [T, H]:
    then its strided twin runs (build_kernels/registry.py, _k1_strided); contiguous inputs keep
    the K1 with one row offset for all three loads (docs/api.md, "Strided inputs")."""
    return _k1_strides(problem) != contiguous_k1_strides(problem.H)


def _sequence_tables(prog: Program, problem: Problem, off, n_seq: int, order: bool = True,
                     listed: bool = False) -> None:
    """The sequence tables; varlen also K2's longest-first dispatch order (`order`: in off["seq_order"]).
    `listed` (a call with segment_ids, serial): the tables over the listed sequences, with the
    listed flags and K2's state slots (seq_tables.SeqTablesListed; the order dense too)."""
    tables = dict(seq_start=ws(off["seq_start"]), tile_prefix=ws(off["tile_prefix"]), n_seq=n_seq, stream=STREAM)
    if listed:
        prog.add(kernel("seq_tables_listed", _cu_dtypes(problem), dense=not problem.varlen), dict(
            tables, cu_seqlens=Ref("cu_seqlens") if problem.varlen else NULL, segment_ids=Ref("segment_ids"),
            state_indices=Ref("state_indices") if problem.pooled else NULL, listed=ws(off["listed"]),
            listed_slot=ws(off["listed_slot"]), seq_order=ws(off["seq_order"]) if order else NULL,
            n_listed=problem.n_listed, t_total=problem.B * problem.T if problem.varlen else problem.T))
    elif problem.varlen:
        prog.add(kernel("seq_tables_varlen", _cu_dtypes(problem)), dict(tables, cu_seqlens=Ref("cu_seqlens"),
                                                        seq_order=ws(off["seq_order"]) if order else NULL,
                                                        t_total=problem.B * problem.T))
    else:
        prog.add(kernel("seq_tables_dense"), dict(tables, seq_len=problem.T))


def _k1(prog: Program, problem: Problem, off, n_seq: int, cap: int) -> None:
    # The K1 of the call's gate and beta form (gate_forms.k1_kernel): FlashKDA's K1 for its
    # configuration, the general K1 otherwise; numerics="accurate" has its own of each (the gated
    # operands rounded once, docs/numerics.md), and each has a strided twin for strided views. The
    # general K1 reads A_log and dt_bias only when their pointers are not null (docs/gate_forms.md).
    lb = problem.lower_bound
    prog.add(k1_kernel(problem.form, problem.numerics == "accurate", k1_reads_strided(problem)), dict(
        q=Ref("q"), k=Ref("k"), g=Ref("g"), beta=Ref("beta"), a_log=Ref("A_log"), dt_bias=Ref("dt_bias"),
        seq_start=ws(off["seq_start"]), tile_prefix=ws(off["tile_prefix"]), **_workspace_args(off),
        t_total=problem.B * problem.T, n_seq=n_seq, n_heads=problem.H, cap=cap, scale=problem.scale,
        gate_c=0.0 if lb is None else gate_constant(lb), **_k1_strides(problem), stream=STREAM))


def _checkpoint_entries(problem: Problem) -> int:
    """N * K entries of the checkpoint table (checkpoints at given offsets), 0 without."""
    return problem.N * problem.checkpoint_k


def serial_layout(problem: Problem):
    # the same capacity plan_serial gives K1 and K2 (varlen inputs have B == 1)
    return workspace_layout(problem.H, planner.tile_capacity(problem.T, problem.N, problem.varlen), problem.N,
                            _checkpoint_entries(problem), listed=problem.N if problem.listed else 0)


def cp_tile_capacity(problem: Problem, seg: Segmentation) -> int:
    return max(1, planner.tile_capacity(problem.B * problem.T, seg.max_segments, True))


def cp_problem_layout(problem: Problem, seg: Segmentation):
    return cp_layout(problem.H, cp_tile_capacity(problem, seg), problem.N, seg.max_segments,
                     sequence_tables=_checkpoints(problem), checkpoint_entries=_checkpoint_entries(problem),
                     listed=problem.N if problem.listed else 0)


def _index_only(problem: Problem) -> bool:
    """No head to compute, but a checkpoint index table to write (H == 0 with T // C slots)."""
    return problem.N > 0 and problem.H == 0 and problem.n_checkpoints > 0


def workspace_bytes(problem: Problem, seg: Optional[Segmentation]) -> int:
    """Bytes of workspace the call needs (0 for empty work)."""
    if _index_only(problem):
        return serial_layout(problem).nbytes
    if problem.N == 0 or problem.H == 0:
        return 0
    if seg is None:
        return serial_layout(problem).nbytes
    return cp_problem_layout(problem, seg).nbytes


def _seq_order(problem: Problem, off):
    """K2's dispatch order: the tables kernel's longest-first order (varlen, and a listed call's,
    whose unlisted sequences have no tile), or null (dense: equal lengths, the sequence order is as
    good)."""
    return ws(off["seq_order"]) if problem.varlen or problem.listed else NULL


def _checkpoints(problem: Problem) -> bool:
    """Checkpoints every C tokens or at given offsets (docs/state_pool.md)."""
    return problem.checkpoint_every > 0 or problem.checkpoint_k > 0


def uses_k2_ext(problem: Problem) -> bool:
    """State I/O by slot or checkpoints: K2 through its k2_ext entry (docs/state_pool.md)."""
    return problem.pooled or _checkpoints(problem)


def _forced_k2_ext(problem: Problem) -> bool:
    """KDA_K2_EXT=1 sends every serial call of FlashKDA's recipe through k2_ext too, for
    measurement: k2_ext reads its state pointers at run time where the k2_recurrence variants fix
    the state I/O at compile time (python -m kda_aot.bench --state-io-cost). Read when a call is
    planned."""
    forced = os.environ.get("KDA_K2_EXT", "0")
    if forced not in ("0", "1"):
        raise ValueError(f"KDA_K2_EXT: expected 0 or 1, got {forced!r}")
    return forced == "1" and problem.numerics == "flashkda"


def _checkpoint_index(prog: Program, problem: Problem, seq_start: Ref, off) -> None:
    """The checkpoint index table (every C tokens) or the checkpoint table (given offsets), from the
    (clamped) sequence tables: every entry on every call."""
    if problem.checkpoint_k and problem.N:
        pool = problem.checkpoint_into == "pool"
        prog.add(kernel("checkpoint_table", {"checkpoint_offsets": problem.checkpoint_offsets_dtype}), dict(
            checkpoint_offsets=Ref("checkpoint_offsets"), checkpoint_slots=Ref("checkpoint_slots") if pool else NULL,
            seq_start=seq_start, checkpoint_table=ws(off["checkpoint_table"]), n_seq=problem.N,
            checkpoint_k=problem.checkpoint_k, n_dest=problem.n_pool if pool else problem.N * problem.checkpoint_k,
            stream=STREAM))
    if problem.n_checkpoints:
        # a listed call: an unlisted sequence's slots are holes (the flags of the call's table kernel)
        listed = dict(listed=ws(off["listed"])) if problem.listed else {}
        prog.add(kernel("checkpoint_index_listed" if problem.listed else "checkpoint_index"), dict(
            seq_start=seq_start, checkpoint_index=Ref("checkpoint_index"), n_seq=problem.N,
            n_slots=problem.n_checkpoints, checkpoint_every=problem.checkpoint_every, stream=STREAM, **listed))


def _k2_ext_args(problem: Problem, initial: Optional[Ref], off, listed_slots: bool = False) -> dict:
    """k2_ext's state arguments: the pool (slots state_indices[n], its slot stride), or the plain
    states as a pool with slot n and a dense stride, and the checkpoints: every C tokens into
    `checkpoints`, or at given offsets into `checkpoint_state` [N, K] entries or pool slots.
    `listed_slots` (a serial listed call): the slots of the listed table kernel instead, the
    same but -1 for an unlisted sequence."""
    if problem.pooled:
        initial = Ref("state_pool") if initial is None else initial
        final, index, stride, n_pool = Ref("state_pool"), Ref("state_indices"), problem.slot_stride, problem.n_pool
    else:
        if initial is None and problem.has_initial:
            initial = Ref("initial_state")
        final = Ref("final_state") if problem.has_final else NULL
        index, stride, n_pool = NULL, problem.H * planner.D * planner.D, problem.N
    every, k = problem.checkpoint_every, problem.checkpoint_k
    state_elems = problem.H * planner.D * planner.D  # one [H, 128, 128] state
    if every:
        checkpoints, ck_stride = Ref("checkpoints"), state_elems
    elif k:
        into_pool = problem.checkpoint_into == "pool"
        checkpoints = Ref("state_pool") if into_pool else Ref("checkpoint_state")
        ck_stride = problem.slot_stride if into_pool else state_elems
    else:
        checkpoints, ck_stride = NULL, 0
    if listed_slots:
        index = ws(off["listed_slot"])
    return dict(initial_state=initial, final_state=final, state_index=index, slot_stride=stride, n_pool=n_pool,
                checkpoints=checkpoints, checkpoint_every=every, n_real=problem.N,
                checkpoint_table=ws(off["checkpoint_table"]) if k else NULL, checkpoint_k=k,
                checkpoint_stride=ck_stride)


def _ext_dtype(problem: Problem) -> str:
    return "f32" if (problem.state_dtype or "float32") == "float32" else "bf16"


def _ext_constants(problem: Problem, vb: int, segments: bool) -> dict:
    """k2_ext's constants (build_kernels/registry.py _k2_ext): the state dtype is the final state's and
    the checkpoints'; a segmented one reads the fp32 carries."""
    fp32 = _ext_dtype(problem) == "f32"
    return dict(segments=segments, state_fp32=fp32 or segments, final_fp32=fp32, value_block=vb)


def _cu_dtypes(problem: Problem) -> dict:
    """The dtype of cu_seqlens, which picks a varlen tables kernel (none for dense input)."""
    return {"cu_seqlens": problem.cu_dtype} if problem.varlen else {}


# Each mma.sync K2 entry's register-state twin (build_kernels/kernels/k2_regstate.py: the same
# arguments and bits, its constants those of the mma.sync variant without `ablation`).
REGSTATE_ENTRIES = {"k2_recurrence": "k2_regstate", "k2_segments": "k2_regstate_segments", "k2_ext": "k2_regstate_ext"}


def k2_kernel_name(lib: KernelLibrary, entry: str, **constants) -> str:
    """The kernel that runs the mma.sync K2 of `entry` with `constants` (constants.kernel): its
    register-state twin where planner.k2_kernel picks one and the library has it, else the mma.sync
    variant. KDA_K2_KERNEL=k2|regstate forces one, for measurement; it is read when a call is
    planned. A kernel the library lacks (a measurement-only one: the mma.sync K2 where a twin
    exists, an ablation) is a KernelNotBuiltError that says how to build a library with it."""
    k2_name = kernel(entry, **constants)
    forced = os.environ.get("KDA_K2_KERNEL")
    if forced and forced not in planner.K2_KERNELS:
        raise ValueError(f"KDA_K2_KERNEL: expected one of {planner.K2_KERNELS} or unset, got {forced!r}")
    kind = forced or planner.k2_kernel(constants["value_block"])
    if kind != "k2" and not constants.get("ablation"):  # an ablation (measurement only) has no twin
        try:
            twin = kernel(REGSTATE_ENTRIES[entry], **{c: v for c, v in constants.items() if c != "ablation"})
        except LookupError:  # no twin at this value block (VB=32)
            twin = None
        if twin in lib.kernels:
            return twin
    if k2_name not in lib.kernels:
        why = f"KDA_K2_KERNEL={forced} forces the mma.sync K2 {k2_name}" if forced == "k2" else \
            f"K2 {k2_name} is asked for"
        where = getattr(lib, "path", None)
        raise KernelNotBuiltError(
            f"{why}, which the kernel library{f' {where}' if where else ''} does not hold: it is a "
            f"measurement-only kernel, not in the shipped lattice. {MEASUREMENT_BUILD}"
            + (", or unset KDA_K2_KERNEL" if forced == "k2" else ""))
    return k2_name


def serial_launch(lib: KernelLibrary, problem: Problem, sm_count: int, value_split: Optional[int] = None) -> Launch:
    plan = planner.plan_serial(T=problem.T, N=problem.N, H=problem.H, varlen=problem.varlen,
                               has_initial=problem.has_initial, has_final=problem.has_final,
                               state_dtype=problem.state_dtype, sm_count=sm_count,
                               value_split_override=value_split, numerics=problem.numerics)
    prog = Program(lib, problem.device_id)
    if _index_only(problem):
        layout = serial_layout(problem)
        off = layout.pointers(0)
        # no K2 reads a dispatch order here: the tables kernel skips its sort (null seq_order)
        _sequence_tables(prog, problem, off, problem.N, order=False, listed=problem.listed)
        _checkpoint_index(prog, problem, ws(off["seq_start"]), off)
        return Launch(prog.finish(), layout.nbytes, "serial")
    if problem.N == 0 or problem.H == 0:
        return Launch(prog.finish(), 0, "empty")  # nothing to compute or write (docs/algorithm.md §1.4)
    cap = plan.tile_capacity
    layout = serial_layout(problem)
    off = layout.pointers(0)
    _sequence_tables(prog, problem, off, problem.N, listed=problem.listed)
    _checkpoint_index(prog, problem, ws(off["seq_start"]), off)
    if cap > 0:
        _k1(prog, problem, off, problem.N, cap)
    vb = plan.k2_constants["value_block"]
    # A serial listed call takes k2_ext too: an unlisted sequence's state slot is -1 and it has no
    # tile, so its CTA exits without touching its states (docs/state_pool.md, "Listed sequences").
    if uses_k2_ext(problem) or problem.listed or _forced_k2_ext(problem):
        prog.add(k2_kernel_name(lib, "k2_ext", **_ext_constants(problem, vb, segments=False)), dict(
            v=Ref("v"), out=Ref("out"), **_workspace_args(off), seq_start=ws(off["seq_start"]),
            tile_prefix=ws(off["tile_prefix"]), seq_order=_seq_order(problem, off), final_slot=NULL,
            real_seq_start=ws(off["seq_start"]),
            **_k2_ext_args(problem, None, off, listed_slots=problem.listed), t_total=problem.B * problem.T,
            n_seq=problem.N, n_heads=problem.H, cap=cap, **_v_strides(problem), stream=STREAM))
        return Launch(prog.finish(), layout.nbytes, "serial")
    prog.add(k2_kernel_name(lib, "k2_recurrence", **plan.k2_constants), dict(
        v=Ref("v"), out=Ref("out"), **_workspace_args(off), seq_start=ws(off["seq_start"]),
        tile_prefix=ws(off["tile_prefix"]), seq_order=_seq_order(problem, off),
        initial_state=Ref("initial_state") if problem.has_initial else NULL,
        final_state=Ref("final_state") if problem.has_final else NULL,
        t_total=problem.B * problem.T, n_seq=problem.N, n_heads=problem.H, cap=cap, **_v_strides(problem),
        stream=STREAM))
    return Launch(prog.finish(), layout.nbytes, "serial")


@functools.lru_cache(maxsize=None)
def cp_available(lib: KernelLibrary) -> bool:
    return all(any(k.entry == e for k in lib.kernels.values())
               for e in ("cp_seg_tables_varlen", "cp_seg_tables_dense", "cp_pre_scan", "cp_merge", "k2_segments",
                         "k2_recurrence"))


def cp_launch(lib: KernelLibrary, problem: Problem, seg: Segmentation, sm_count: int,
              value_split: Optional[int] = None) -> Launch:
    """The CP sequence for up to `seg.max_segments` segments, cut on the device."""
    H, N, S = problem.H, problem.N, seg.max_segments
    scan_split, split = (value_split, value_split) if value_split else \
        planner.cp_splits(S, N, H, sm_count, problem.numerics)
    vb = planner.D // split
    accurate = problem.numerics == "accurate"
    t_total = problem.B * problem.T
    cap = cp_tile_capacity(problem, seg)
    layout = cp_problem_layout(problem, seg)
    off = layout.pointers(0)
    prog = Program(lib, problem.device_id)
    tables = dict(seg_start=ws(off["seq_start"]), seg_prefix=ws(off["tile_prefix"]), scan_seg=ws(off["scan_seg"]),
                  seg_first=ws(off["seg_first"]), seg_count=ws(off["seg_count"]), final_slot=ws(off["final_slot"]),
                  n_seq=N, seg_len=seg.seg_len, max_count=seg.max_count, min_tiles=seg.min_tiles, max_segments=S,
                  stream=STREAM)
    if problem.listed:  # the listed sequences only, cut as without a list (cp_seg_tables.CpSegTablesListed)
        prog.add(kernel("cp_seg_tables_listed", _cu_dtypes(problem), dense=not problem.varlen), dict(
            tables, cu_seqlens=Ref("cu_seqlens") if problem.varlen else NULL, segment_ids=Ref("segment_ids"),
            listed=ws(off["listed"]), n_listed=problem.n_listed, t_total=t_total if problem.varlen else problem.T))
    elif problem.varlen:
        prog.add(kernel("cp_seg_tables_varlen", _cu_dtypes(problem)), dict(tables, cu_seqlens=Ref("cu_seqlens"),
                                                                            t_total=t_total))
    else:
        prog.add(kernel("cp_seg_tables_dense"), dict(tables, t_total=problem.T))  # dense: tokens per sequence
    if _checkpoints(problem):
        # the sequences' own tables: the index tables and the segments' checkpoint positions count
        # tokens from where each sequence starts
        _sequence_tables(prog, problem, dict(seq_start=off["real_seq_start"], tile_prefix=off["real_tile_prefix"]),
                         N, order=False)
        _checkpoint_index(prog, problem, ws(off["real_seq_start"]), off)
    _k1(prog, problem, off, S, cap)
    seg_tables = dict(seq_start=ws(off["seq_start"]), tile_prefix=ws(off["tile_prefix"]))
    n_scan = S - N  # a bound on the non-last segments; scan_seg marks the unused entries -1
    if n_scan > 0:
        prog.add(kernel("cp_pre_scan", value_block=planner.D // scan_split, accurate=accurate), dict(
            v=Ref("v"), ws_kd=ws(off["kd"]), ws_kr=ws(off["kr"]), ws_gt=ws(off["gt"]), ws_inv=ws(off["inv"]),
            ws_bsig=ws(off["bsig"]), **seg_tables, scan_seg=ws(off["scan_seg"]), b_seg=ws(off["b_seg"]),
            m_seg=ws(off["m_seg"]), n_scan=n_scan, n_heads=H, cap=cap, **_v_strides(problem), stream=STREAM))
    if problem.pooled:
        prog.add(kernel("cp_merge_pool", state_fp32=_ext_dtype(problem) == "f32"), dict(
            m_seg=ws(off["m_seg"]), b_seg=ws(off["b_seg"]), state_pool=Ref("state_pool"), carries=ws(off["carries"]),
            seg_first=ws(off["seg_first"]), seg_count=ws(off["seg_count"]), state_index=Ref("state_indices"),
            slot_stride=problem.slot_stride, n_pool=problem.n_pool, n_seq=N, n_heads=H, stream=STREAM))
    else:
        # without an initial state the merge starts from zero (its variant's state pointer is unread)
        prog.add(kernel("cp_merge", has_initial=problem.has_initial,
                        state_fp32=not problem.has_initial or problem.state_dtype == "float32"), dict(
            m_seg=ws(off["m_seg"]), b_seg=ws(off["b_seg"]),
            initial_state=Ref("initial_state") if problem.has_initial else NULL, carries=ws(off["carries"]),
            seg_first=ws(off["seg_first"]), seg_count=ws(off["seg_count"]), n_seq=N, n_heads=H, stream=STREAM))
    # Segments start from their carries (fp32, rounded to bf16 on entry exactly as serial K2 rounds
    # an fp32 initial state; kept in fp32 with numerics="accurate"); each sequence's last segment
    # writes its final state.
    sizes = dict(t_total=t_total, n_seq=S, n_heads=H, cap=cap, **_v_strides(problem), stream=STREAM)
    common = dict(v=Ref("v"), out=Ref("out"), **_workspace_args(off), **seg_tables)
    if uses_k2_ext(problem):
        real = off["real_seq_start"] if _checkpoints(problem) else off["seq_start"]
        prog.add(k2_kernel_name(lib, "k2_ext", **_ext_constants(problem, vb, segments=True)), dict(
            common, seq_order=NULL, final_slot=ws(off["final_slot"]), real_seq_start=ws(real),
            **_k2_ext_args(problem, ws(off["carries"]), off), **sizes))
    elif not problem.has_final:
        prog.add(k2_kernel_name(lib, "k2_recurrence", has_initial=True, has_final=False, state_fp32=True,
                                value_block=vb, accurate=accurate, ablation=0), dict(
            common, seq_order=NULL, initial_state=ws(off["carries"]), final_state=NULL, **sizes))
    else:
        prog.add(k2_kernel_name(lib, "k2_segments", final_fp32=problem.state_dtype == "float32", value_block=vb,
                                accurate=accurate), dict(
            v=Ref("v"), out=Ref("out"), **_workspace_args(off), seg_start=ws(off["seq_start"]),
            seg_prefix=ws(off["tile_prefix"]), carries=ws(off["carries"]), final_state=Ref("final_state"),
            final_slot=ws(off["final_slot"]), t_total=t_total, n_seg=S, n_heads=H, cap=cap, **_v_strides(problem),
            stream=STREAM))
    return Launch(prog.finish(), layout.nbytes, "cp")
