"""The affine transfer of a token slice that lies inside one sequence, from the compiled kernels.

For cross-GPU context parallelism (docs/distributed.md) a rank whose slice is the middle of a
sequence sends its transfer: S_end = S_start M + B (docs/algorithm.md §4.2), with B the slice's
state from S = 0 and M the product of its tiles' A_c. The intracard CP kernels already compute
both, per segment: this module drives them over the slice cut into `n_seg` tile-aligned
segments, treated as the sequences of a packed batch:

    seq_tables_int32 (the segments' cu_seqlens) -> k1_prepare -> cp_pre_scan over every segment

pre_scan is handed a `scan_seg` of all segments 0 .. n_seg - 1 (the intracard call scans only the
non-last ones: its last segments start from their carries instead). The caller combines the
segments' (M_i, B_i) in order (kda_aot.distributed).

The Program's pointer slots keep their names but carry this module's buffers (docs/call_path.md
describes the slots):
    cu_seqlens  int32 [2 n_seg + 1]: the segments' token starts and the slice's length, then
                scan_seg = 0 .. n_seg - 1
    out         fp32 [2, n_seg, H, 128, 128]: b_seg, then m_seg (column-swizzled, docs/kernel_abi.md)
    workspace   K1's workspace for n_seg sequences (workspace.workspace_layout)
Everything depends on shapes only, so a program is built once per (H, T, n_seg, device) and shared.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from . import planner
from ..library.constants import D, kernel
from .launcher import WS_REGIONS, contiguous_k1_strides, gate_constant
from ..library.loader import KernelLibrary
from .program import NULL, STREAM, Program, Ref, ws
from .workspace import workspace_layout
from ..spec.gate_forms import FLASHKDA, k1_kernel

STATE_FLOATS = D * D


class TransferProgram(NamedTuple):
    program: Program
    workspace_bytes: int
    out_floats: int  # fp32 elements of the `out` buffer: 2 * n_seg * H * 128 * 128
    table_ints: int  # int32 entries of the `cu_seqlens` buffer: 2 * n_seg + 1


@functools.lru_cache(maxsize=64)
def transfer_program(lib: KernelLibrary, device_id: int, n_heads: int, t_local: int, n_seg: int, scale: float,
                     lower_bound: float, sm_count: int) -> TransferProgram:
    H, S = n_heads, n_seg
    if S < 1 or t_local < 1:
        raise ValueError(f"n_seg: a transfer needs tokens and at least one segment, got T={t_local}, n_seg={S}")
    cap = planner.tile_capacity(t_local, S, True)
    layout = workspace_layout(H, cap, S)
    off = layout.pointers(0)
    tables = dict(seq_start=ws(off["seq_start"]), tile_prefix=ws(off["tile_prefix"]))
    prog = Program(lib, device_id)
    contiguous = contiguous_k1_strides(H)  # the transferred q, k, g, beta are packed [t_local, H, 128] / [t_local, H]
    prog.add(kernel("seq_tables_varlen", {"cu_seqlens": "int32"}), dict(
        tables, cu_seqlens=Ref("cu_seqlens"), seq_order=NULL, n_seq=S, t_total=t_local, stream=STREAM))
    prog.add(k1_kernel(FLASHKDA, accurate=False), dict(
        q=Ref("q"), k=Ref("k"), g=Ref("g"), beta=Ref("beta"), a_log=Ref("A_log"), dt_bias=Ref("dt_bias"), **tables,
        **{f"ws_{name}": ws(off[name]) for name in WS_REGIONS}, t_total=t_local, n_seq=S, n_heads=H, cap=cap,
        scale=scale, gate_c=gate_constant(lower_bound), **contiguous, stream=STREAM))
    vb = D // planner.value_split(S, H, sm_count)
    per_state = S * H * STATE_FLOATS * 4
    prog.add(kernel("cp_pre_scan", value_block=vb, accurate=False), dict(
        v=Ref("v"), ws_kd=ws(off["kd"]), ws_kr=ws(off["kr"]), ws_gt=ws(off["gt"]), ws_inv=ws(off["inv"]),
        ws_bsig=ws(off["bsig"]), **tables, scan_seg=Ref("cu_seqlens", 4 * (S + 1)), b_seg=Ref("out", 0),
        m_seg=Ref("out", per_state), n_scan=S, n_heads=H, cap=cap, v_stride_t=H * D, v_stride_h=D, stream=STREAM))
    return TransferProgram(prog.finish(), layout.nbytes, 2 * S * H * STATE_FLOATS, 2 * S + 1)
