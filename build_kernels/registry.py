"""Every kernel variant the build knows, in one table, and which of them ship (shipped_variants).

A variant is one exported symbol: a host entry (the `@cute.jit __call__` of a kernel class,
configured from the variant's constants) compiled with fixed compile-time constants. Its argument list is declared here once, as data, and serves both wings:
the build turns it into fake arguments for `cute.compile`, and the manifest carries it to the
runtime, which turns it into ctypes values. Every kernel takes raw device pointers, integer
scalars and the stream last, so the C ABI is the same flat shape for all of them.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

from . import shared_constants as ABI_CONSTANTS

# Argument kinds: "ptr" (device pointer, with element dtype and the alignment the kernel assumes),
# "i32", "i64", "f32" (scalars), "stream".
_SCALARS = ("i32", "i64", "f32")


@dataclasses.dataclass(frozen=True)
class Arg:
    name: str
    kind: str
    dtype: str = ""  # element type of a pointer: bfloat16, float16, float32, int32, int64, uint8
    align: int = 0  # bytes the kernel assumes for a pointer; the runtime checks it before a launch

    def to_json(self) -> Dict[str, object]:
        out: Dict[str, object] = {"name": self.name, "kind": self.kind}
        if self.kind == "ptr":
            out.update(dtype=self.dtype, align=self.align)
        return out


def ptr(name: str, dtype: str, align: int = 16) -> Arg:
    return Arg(name, "ptr", dtype, align)


def scalar(name: str, kind: str) -> Arg:
    assert kind in _SCALARS, kind
    return Arg(name, kind)


STREAM = Arg("stream", "stream")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One exported kernel entry."""

    name: str  # unique, used as the export prefix and by the runtime to find the kernel
    module: str  # module under build_kernels.kernels holding the host entry
    entry: str  # the module's attribute of that name: the kernel class whose __call__ is the host entry
    args: Tuple[Arg, ...]
    constants: Tuple[Tuple[str, object], ...] = ()  # the kernel class's keyword arguments, baked in

    def to_json(self) -> Dict[str, object]:
        return {
            "name": self.name,
            "entry": self.entry,
            "args": [a.to_json() for a in self.args],
            "constants": {k: v for k, v in self.constants},
        }


# K2's dispatch order: the sequences longest first, written by the varlen tables kernel (null: the
# sequence order, for dense inputs and CP segments). docs/dispatch_order.md.
SEQ_ORDER = ptr("seq_order", "int32", 4)
# The list of sequences a call runs (segment_ids), the per-sequence flags the first table kernel
# makes of it, and the list's length (kernels/common/listed_sequences.py).
SEGMENT_IDS, LISTED, N_LISTED = ptr("segment_ids", "int32", 4), ptr("listed", "int32", 4), scalar("n_listed", "i32")


def _seq_tables() -> List[Variant]:
    """Sequence tables (docs/kernel_abi.md) from cu_seqlens of either integer type, clamped to
    [0, t_total] so any content is safe (and, varlen, K2's longest-first dispatch order), or dense."""
    tables = (ptr("seq_start", "int32", 4), ptr("tile_prefix", "int32", 4), scalar("n_seq", "i32"))
    variants = [
        Variant(f"seq_tables_{cu}", "seq_tables", "seq_tables_varlen",
                (ptr("cu_seqlens", cu, 8 if cu == "int64" else 4),) + tables[:2] + (SEQ_ORDER,) + tables[2:]
                + (scalar("t_total", "i32"), STREAM))
        for cu in ("int32", "int64")
    ]
    variants.append(Variant("seq_tables_dense", "seq_tables", "seq_tables_dense",
                            tables + (scalar("seq_len", "i32"), STREAM)))
    # a call that runs its listed sequences only (segment_ids; kernels/common/listed_sequences.py): the
    # tables over the listed sequences, their flags and state slots; dense reads no cu_seqlens
    for cu in ("int32", "int64", "dense"):
        variants.append(Variant(
            f"seq_tables_listed_{cu}", "seq_tables", "seq_tables_listed",
            (ptr("cu_seqlens", "int32" if cu == "dense" else cu, 8 if cu == "int64" else 4), SEGMENT_IDS,
             ptr("state_indices", "int32", 4), LISTED, ptr("listed_slot", "int32", 4)) + tables[:2]
            + (SEQ_ORDER, tables[2], N_LISTED, scalar("t_total", "i32"), STREAM),
            constants=(("dense", cu == "dense"),)))
    return variants


WORKSPACE_ARGS = (
    ptr("ws_qd", "uint8"), ptr("ws_kd", "uint8"), ptr("ws_kr", "uint8"), ptr("ws_gt", "float32"),
    ptr("ws_inv", "bfloat16"), ptr("ws_mqk", "bfloat16"), ptr("ws_bsig", "bfloat16"),
)
SEQ_ARGS = (ptr("seq_start", "int32", 4), ptr("tile_prefix", "int32", 4))
SIZE_ARGS = (scalar("t_total", "i32"), scalar("n_seq", "i32"), scalar("n_heads", "i32"), scalar("cap", "i32"))
# The inputs' token and head strides in elements (docs/kernel_abi.md): q, k, g, v are read in place
# as rows of 128 contiguous values at t * stride_t + h * stride_h, beta at t * beta_stride_t + h.
K1_STRIDES = tuple(scalar(f"{x}_stride_{d}", "i64") for x in ("q", "k", "g") for d in ("t", "h")) + (
    scalar("beta_stride_t", "i64"),)
V_STRIDES = (scalar("v_stride_t", "i64"), scalar("v_stride_h", "i64"))


def _k1() -> List[Variant]:
    args = (ptr("q", "bfloat16"), ptr("k", "bfloat16"), ptr("g", "bfloat16"), ptr("beta", "bfloat16", 2),
            ptr("a_log", "float32", 4), ptr("dt_bias", "float32", 16)) + SEQ_ARGS + WORKSPACE_ARGS + SIZE_ARGS + (
            K1_STRIDES + (scalar("scale", "f32"), scalar("gate_c", "f32"), STREAM))
    return [Variant("k1_prepare", "k1_prepare", "k1_prepare", args,
                    constants=(("accurate", False), ("gate_form", 0), ("beta_form", 0), ("g_fp32", False),
                               ("strided", False)))]


# The general K1 (docs/gate_forms.md): every gate and beta form that is not FlashKDA's configuration,
# from the one table of forms and codes (shared_constants.GATE_CODES, BETA_CODES, K1X_GATE_TAGS).
# Names k1x_<gate tag>_<beta>_<beta dtype>[_acc] (kda_aot/spec/gate_forms.k1_kernel spells the same).
_GATE_CODE = dict(ABI_CONSTANTS.GATE_CODES)
K1X_GATES = {tag: (_GATE_CODE[gate], g_dtype) for tag, gate, g_dtype in ABI_CONSTANTS.K1X_GATE_TAGS}
K1X_BETAS = dict(ABI_CONSTANTS.BETA_CODES)


def _k1_general(accurate: bool) -> List[Variant]:
    base = _k1()[0]
    variants = []
    for gate, (gate_code, g_dtype) in K1X_GATES.items():
        for beta, beta_code in K1X_BETAS.items():
            for beta_dtype, tag in (("bfloat16", "bf16"), ("float32", "f32")):
                args = tuple(ptr("g", g_dtype) if a.name == "g" else
                             ptr("beta", beta_dtype, 2 if beta_dtype == "bfloat16" else 4) if a.name == "beta" else a
                             for a in base.args)
                variants.append(dataclasses.replace(
                    base, name=f"k1x_{gate}_{beta}_{tag}{_acc(accurate)}", args=args,
                    constants=(("accurate", accurate), ("gate_form", gate_code), ("beta_form", beta_code),
                               ("g_fp32", g_dtype == "float32"), ("strided", False))))
    return variants


def _k1_accurate() -> List[Variant]:
    """K1' of numerics="accurate" (docs/numerics.md): the same arguments and workspace, the gated
    operands Qd, Kd, Ki, Kr each rounded once to bf16 from fp32 decay factors."""
    base = _k1()[0]
    return [dataclasses.replace(base, name="k1_prepare_acc", constants=(("accurate", True),) + base.constants[1:])]


def _k1_strided() -> List[Variant]:
    """The strided twin of every K1 (<name>_strided): q, k, g and beta read at their stride
    arguments. The K1s above read contiguous inputs at one row offset (token * H + head) and leave
    the strides unread: the per-tensor stride products cost the contiguous path 0.9-2.6 % of K1
    (docs/api.md, "Strided inputs"). The launcher picks the twin when any of the four is a strided view."""
    return [dataclasses.replace(v, name=f"{v.name}_strided",
                                constants=tuple((k, True if k == "strided" else c) for k, c in v.constants))
            for v in _k1() + _k1_accurate() + _k1_general(False) + _k1_general(True)]


# (has_initial, has_final) pairs; the state dtype matters only when one of them is present.
STATE_IO = ((False, False), (True, False), (False, True), (True, True))
VALUE_BLOCKS = ABI_CONSTANTS.VALUE_BLOCKS  # value rows of the state per K2 CTA (the value-column split)


# numerics="accurate" (docs/numerics.md) is a compile-time variant of K2, segmented K2 and pre_scan:
# its kernels carry the suffix "_acc" and the constant accurate=True; every other kernel serves both modes.
NUMERICS = ("flashkda", "accurate")


def _acc(accurate: bool) -> str:
    return "_acc" if accurate else ""


def k2_name(has_initial: bool, has_final: bool, state_fp32: bool, value_block: int, accurate: bool = False) -> str:
    io = {(False, False): "nostate", (True, False): "in", (False, True): "out", (True, True): "inout"}
    dtype = "" if not (has_initial or has_final) else ("_f32" if state_fp32 else "_bf16")
    return f"k2_{io[(has_initial, has_final)]}{dtype}_vb{value_block}{_acc(accurate)}"


def _k2(accurate: bool = False) -> List[Variant]:
    variants = []
    for has_initial, has_final in STATE_IO:
        for state_fp32 in ((False, True) if (has_initial or has_final) else (False,)):
            sdt = "float32" if state_fp32 else "bfloat16"
            for vb in VALUE_BLOCKS:
                args = (ptr("v", "bfloat16"), ptr("out", "bfloat16")) + WORKSPACE_ARGS + SEQ_ARGS + (
                        SEQ_ORDER, ptr("initial_state", sdt), ptr("final_state", sdt)) + SIZE_ARGS + V_STRIDES + (
                        STREAM,)
                variants.append(Variant(
                    k2_name(has_initial, has_final, state_fp32, vb, accurate), "k2_recurrence", "k2_recurrence", args,
                    constants=(("has_initial", has_initial), ("has_final", has_final),
                               ("state_fp32", state_fp32), ("value_block", vb), ("accurate", accurate),
                               ("ablation", 0))))
    return variants


def _k2_segments(accurate: bool = False) -> List[Variant]:
    """Segmented K2 of a CP call: fp32 carries in, each sequence's last segment writes final_state
    (bf16 or fp32) at final_slot[segment]. A CP call without a final state uses k2_in_f32_*."""
    variants = []
    for name, dtype in (("bf16", "bfloat16"), ("f32", "float32")):
        for vb in VALUE_BLOCKS:
            # The segment tables stand where the sequence tables stand in K2, under their own names
            # (the host entry's parameter names: tests/build/test_ptx.py compares them).
            args = (ptr("v", "bfloat16"), ptr("out", "bfloat16")) + WORKSPACE_ARGS + (
                    ptr("seg_start", "int32", 4), ptr("seg_prefix", "int32", 4), ptr("carries", "float32"),
                    ptr("final_state", dtype), ptr("final_slot", "int32", 4), scalar("t_total", "i32"),
                    scalar("n_seg", "i32"), scalar("n_heads", "i32"), scalar("cap", "i32")) + V_STRIDES + (STREAM,)
            variants.append(Variant(f"k2_segments_{name}_vb{vb}{_acc(accurate)}", "k2_recurrence", "k2_segments", args,
                                    constants=(("final_fp32", dtype == "float32"), ("value_block", vb),
                                               ("accurate", accurate))))
    return variants


def _approx() -> List[Variant]:
    """The PTX approximations of docs/algorithm.md §2.4 for the torch reference, kda_aot/reference.py (x in,
    y out, n elements)."""
    args = (ptr("x", "float32", 4), ptr("y", "float32", 4), scalar("n", "i32"), STREAM)
    return [Variant(f"approx_{name}", "approx_math", "approx_math", args, constants=(("op", op),))
            for op, name in enumerate(("ex2", "tanh", "rsqrt"))]


def _cp_merge() -> List[Variant]:
    """CP merge (docs/algorithm.md §4.4): carries from m_seg, b_seg and the initial state; fp32 [n_seg, H, 128, 128]."""
    variants = []
    for name, has_initial, state_fp32 in (("nostate", False, True), ("bf16", True, False), ("f32", True, True)):
        args = (ptr("m_seg", "float32"), ptr("b_seg", "float32"),
                ptr("initial_state", "float32" if state_fp32 else "bfloat16"), ptr("carries", "float32"),
                ptr("seg_first", "int32", 4), ptr("seg_count", "int32", 4),
                scalar("n_seq", "i32"), scalar("n_heads", "i32"), STREAM)
        variants.append(Variant(f"cp_merge_{name}", "cp_merge", "cp_merge", args,
                                constants=(("has_initial", has_initial), ("state_fp32", state_fp32))))
    return variants


def _cp_pre_scan(accurate: bool = False) -> List[Variant]:
    """CP pre_scan (docs/algorithm.md §4.3): per non-last segment and head, B_j and M_j as fp32 [n_seg, H, 128, 128]."""
    args = (ptr("v", "bfloat16"), ptr("ws_kd", "uint8"), ptr("ws_kr", "uint8"), ptr("ws_gt", "float32"),
            ptr("ws_inv", "bfloat16"), ptr("ws_bsig", "bfloat16"), ptr("seq_start", "int32", 4),
            ptr("tile_prefix", "int32", 4), ptr("scan_seg", "int32", 4), ptr("b_seg", "float32"),
            ptr("m_seg", "float32"), scalar("n_scan", "i32"), scalar("n_heads", "i32"), scalar("cap", "i32")) + (
            V_STRIDES + (STREAM,))
    return [Variant(f"cp_pre_scan_vb{vb}{_acc(accurate)}", "cp_pre_scan", "cp_pre_scan", args,
                    constants=(("value_block", vb), ("accurate", accurate)))
            for vb in VALUE_BLOCKS]


def _cp_seg_tables() -> List[Variant]:
    """CP segment tables built on the device from cu_seqlens (any content) or the dense shape
    (docs/kernel_abi.md; twin: tests/cp_twins.py device_segment_tables). One CTA."""
    tables = (ptr("seg_start", "int32", 4), ptr("seg_prefix", "int32", 4), ptr("scan_seg", "int32", 4),
              ptr("seg_first", "int32", 4), ptr("seg_count", "int32", 4), ptr("final_slot", "int32", 4))
    sizes = tuple(scalar(name, "i32") for name in
                  ("n_seq", "t_total", "seg_len", "max_count", "min_tiles", "max_segments")) + (STREAM,)
    variants = [
        Variant(f"cp_seg_tables_{cu}", "cp_seg_tables", "cp_seg_tables_varlen",
                (ptr("cu_seqlens", cu, 8 if cu == "int64" else 4),) + tables + sizes)
        for cu in ("int32", "int64")
    ]
    variants.append(Variant("cp_seg_tables_dense", "cp_seg_tables", "cp_seg_tables_dense", tables + sizes))
    # the listed sequences only (segment_ids; kernels/common/listed_sequences.py); dense reads no cu_seqlens
    for cu in ("int32", "int64", "dense"):
        variants.append(Variant(
            f"cp_seg_tables_listed_{cu}", "cp_seg_tables", "cp_seg_tables_listed",
            (ptr("cu_seqlens", "int32" if cu == "dense" else cu, 8 if cu == "int64" else 4), SEGMENT_IDS, LISTED)
            + tables + sizes[:1] + (N_LISTED,) + sizes[1:],
            constants=(("dense", cu == "dense"),)))
    return variants


def _k2_ext() -> List[Variant]:
    """K2 with state I/O by slot (the state pool) and checkpoints (docs/state_pool.md), serial and
    segmented: one host entry, k2_ext. Optional pointers may be null (no entry read, no final
    write, identity slots, no checkpoints); the state dtype is that of the final state and the
    checkpoints (the entry of the segmented variant reads the fp32 carries)."""
    variants = []
    for segments in (False, True):
        for name, dtype in (("bf16", "bfloat16"), ("f32", "float32")):
            fp32 = dtype == "float32"
            for vb in VALUE_BLOCKS:
                args = (ptr("v", "bfloat16"), ptr("out", "bfloat16")) + WORKSPACE_ARGS + SEQ_ARGS + (
                        SEQ_ORDER, ptr("initial_state", "float32" if segments else dtype), ptr("final_state", dtype),
                        ptr("final_slot", "int32", 4), ptr("state_index", "int32", 4), ptr("checkpoints", dtype),
                        ptr("real_seq_start", "int32", 4), scalar("slot_stride", "i64"), scalar("n_pool", "i32"),
                        scalar("checkpoint_every", "i32"), scalar("n_real", "i32"),
                        ptr("checkpoint_table", "int32", 4), scalar("checkpoint_k", "i32"),
                        scalar("checkpoint_stride", "i64")) + SIZE_ARGS + V_STRIDES + (STREAM,)
                variants.append(Variant(
                    f"k2_ext_{'segments_' if segments else ''}{name}_vb{vb}", "k2_recurrence", "k2_ext", args,
                    constants=(("segments", segments), ("state_fp32", fp32 or segments), ("final_fp32", fp32),
                               ("value_block", vb))))
    return variants


def _cp_merge_pool() -> List[Variant]:
    """CP merge whose initial states are slots of a state pool (docs/state_pool.md)."""
    variants = []
    for name, dtype in (("bf16", "bfloat16"), ("f32", "float32")):
        args = (ptr("m_seg", "float32"), ptr("b_seg", "float32"), ptr("state_pool", dtype), ptr("carries", "float32"),
                ptr("seg_first", "int32", 4), ptr("seg_count", "int32", 4), ptr("state_index", "int32", 4),
                scalar("slot_stride", "i64"), scalar("n_pool", "i32"), scalar("n_seq", "i32"),
                scalar("n_heads", "i32"), STREAM)
        variants.append(Variant(f"cp_merge_pool_{name}", "cp_merge", "cp_merge_pool", args,
                                constants=(("state_fp32", dtype == "float32"),)))
    return variants


def _checkpoint_index() -> List[Variant]:
    """The checkpoint index table from the sequence tables (docs/state_pool.md)."""
    args = (ptr("seq_start", "int32", 4), ptr("checkpoint_index", "int32", 4), scalar("n_seq", "i32"),
            scalar("n_slots", "i32"), scalar("checkpoint_every", "i32"), STREAM)
    listed = args[:1] + (LISTED,) + args[1:]  # the call's listed sequences only
    return [Variant("checkpoint_index", "checkpoint_index", "checkpoint_index", args),
            Variant("checkpoint_index_listed", "checkpoint_index", "checkpoint_index_listed", listed)]


def _checkpoint_table() -> List[Variant]:
    """The checkpoint table of checkpoints at given offsets (docs/state_pool.md), from offsets of
    either integer type."""
    return [Variant(f"checkpoint_table_{it}", "checkpoint_table", "checkpoint_table",
                    (ptr("checkpoint_offsets", it, 8 if it == "int64" else 4), ptr("checkpoint_slots", "int32", 4),
                     ptr("seq_start", "int32", 4), ptr("checkpoint_table", "int32", 4), scalar("n_seq", "i32"),
                     scalar("checkpoint_k", "i32"), scalar("n_dest", "i32"), STREAM))
            for it in ("int32", "int64")]


def _k2_ablation() -> List[Variant]:
    """Measurement-only: numerics="accurate" K2 with part of its recipe (levels 1-3 of
    recurrence_common.py), for the H=64 [8192] benchmark shape's variant (bf16 states, VB=64), so
    that ci/numerics_table.py can time what each step of the recipe costs (docs/numerics.md). The
    runtime never selects them: it asks for ablation=0, the constant every other K2 variant has."""
    base = next(v for v in _k2(True) if v.name == k2_name(True, True, False, 64, True))
    constants = tuple(c for c in base.constants if c[0] != "ablation")
    return [dataclasses.replace(base, name=f"{base.name}_l{level}", constants=constants + (("ablation", level),))
            for level in (1, 2, 3)]


def _k2_regstate() -> List[Variant]:
    """K2 with the state in registers and Q1 / Q5 as warpgroup MMAs (docs/k2_regstate.md), a twin of
    every serial, segmented and state-pool K2 variant of FlashKDA's recipe at VB=64 and 128 with its
    arguments (VB=64 with a producer warp, VB=128 with a producer warpgroup:
    k2_regstate.RegstateConfig.producer_warps), then of every serial and segmented numerics="accurate" K2 variant
    (constant accurate=True; the accurate recipe has no state-pool K2). The planner picks the twin
    wherever there is one (planner.k2_kernel, launcher.k2_kernel_name): FlashKDA's was measured faster
    than the mma.sync K2 on every shape."""
    entries = {"k2_recurrence": "k2_regstate", "k2_segments": "k2_regstate_segments", "k2_ext": "k2_regstate_ext"}
    out = []
    # the accurate twins appended after FlashKDA's so that the kernel indices of those are unchanged
    for v in _k2() + _k2_segments() + _k2_ext() + _k2(True) + _k2_segments(True):
        vb = dict(v.constants)["value_block"]
        base = tuple(c for c in v.constants if c[0] != "ablation")
        if vb in ABI_CONSTANTS.REGSTATE_VALUE_BLOCKS:
            out.append(dataclasses.replace(v, name=ABI_CONSTANTS.regstate_name(v.name), module="k2_regstate",
                                           entry=entries[v.entry], constants=base))
    return out


# Every variant (the build compiles these, or the shipped lattice of them: shipped_variants). The
# runtime finds each kernel by name in the library's own
# manifest and the ABI hash sorts them by name (kda_aot/library/abi_hash.py), so this order is only the
# order of the build's log and of the library's tables.
FAMILIES = {
    # device-built tables
    "seq_tables": _seq_tables, "cp_seg_tables": _cp_seg_tables, "checkpoint_index": _checkpoint_index,
    "checkpoint_table": _checkpoint_table,
    # K1: FlashKDA's configuration, then every other gate and beta form; each with its accurate twin,
    # and all of them again for strided inputs
    "k1": _k1, "k1_accurate": _k1_accurate,
    "k1_general": lambda: _k1_general(False), "k1_general_accurate": lambda: _k1_general(True),
    "k1_strided": _k1_strided,
    # K2: the mma.sync kernel (serial, CP segments, state I/O by slot) and its register-state twins
    "k2": _k2, "k2_accurate": lambda: _k2(True), "k2_segments": _k2_segments,
    "k2_segments_accurate": lambda: _k2_segments(True), "k2_ext": _k2_ext, "k2_regstate": _k2_regstate,
    # context parallelism
    "cp_pre_scan": _cp_pre_scan, "cp_pre_scan_accurate": lambda: _cp_pre_scan(True), "cp_merge": _cp_merge,
    "cp_merge_pool": _cp_merge_pool,
    # the PTX approximations for the public torch reference; the accurate recipe's ablations (measurement only)
    "approx": _approx, "k2_ablation": _k2_ablation,
}


# What ships: the build compiles the shipped lattice by default (KDA_KERNEL_LATTICE=all, or
# python -m build_kernels --lattice all, compiles every variant: docs/build.md), and a library is
# accepted when it holds every shipped kernel and nothing outside all_variants()
# (kda_aot/library/identity.py). A variant is measurement-only when the planner launches it for
# no public argument:
# - k2_ablation: the accurate recipe cut short (levels 1-3), timed by ci/numerics_table.py only;
#   the runtime asks for ablation=0.
# - the mma.sync K2 (MMA_K2_FAMILIES) at a value block where its register-state twin exists
#   (shared_constants.REGSTATE_VALUE_BLOCKS: every serial, segmented and state-pool variant of both
#   recipes has a twin there, _k2_regstate): the planner picks the twin (planner.k2_kernel), which
#   was measured faster on every shape (docs/k2_regstate.md); the mma.sync kernel runs there only
#   when KDA_K2_KERNEL=k2 forces it (measurement, and the GPU tests comparing the twins byte for
#   byte). At VB=32 (value_split=4, a public argument) the mma.sync K2 is the only K2 and ships.
# Everything else ships: the tables, K1, the register-state K2, CP's kernels (pre_scan has only the
# mma.sync form, at every value block), and approx_*, which the public torch reference calls.
LATTICES = ("shipped", "all")
MEASUREMENT_FAMILIES = frozenset({"k2_ablation"})
MMA_K2_FAMILIES = frozenset({"k2", "k2_accurate", "k2_segments", "k2_segments_accurate", "k2_ext"})


def shipped(family: str, variant: Variant) -> bool:
    """Whether `variant` of FAMILIES[family] is in the shipped lattice (the rule above)."""
    if family in MEASUREMENT_FAMILIES:
        return False
    if family in MMA_K2_FAMILIES:
        return dict(variant.constants)["value_block"] not in ABI_CONSTANTS.REGSTATE_VALUE_BLOCKS
    return True


def families() -> List[Tuple[str, Variant]]:
    """(family, variant) for every variant, in the build's order."""
    pairs = [(family, v) for family, make in FAMILIES.items() for v in make()]
    names = [v.name for _, v in pairs]
    assert len(names) == len(set(names)), "variant names must be unique"
    return pairs


def all_variants() -> List[Variant]:
    """Every variant, shipped and measurement-only (what ptx_check and the build tests read)."""
    return [v for _, v in families()]


def shipped_variants() -> List[Variant]:
    """The shipped lattice, in the build's order: what the planner can launch."""
    return [v for family, v in families() if shipped(family, v)]


def lattice(name: str) -> List[Variant]:
    """The variants of lattice `name` (one of LATTICES)."""
    if name not in LATTICES:
        raise ValueError(f"kernel lattice: expected one of {LATTICES}, got {name!r}")
    return all_variants() if name == "all" else shipped_variants()
