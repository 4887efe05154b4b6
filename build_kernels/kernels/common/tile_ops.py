"""Constants and tile helpers shared by every kernel (spec notation: C = CHUNK, K = V = D)."""

import enum

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass.cute.nvgpu import cpasync

from ... import shared_constants as ABI_CONSTANTS
from .ptx_ops import f32x2_to_bf16x2, fma_rn_ftz, mul_rn_ftz, tanh_approx, u32_as_f32

# From build_kernels/shared_constants.py, the one place they are declared (the manifest records them).
CHUNK = ABI_CONSTANTS.CHUNK  # tokens per tile (docs/algorithm.md §2.3); the 16x16 inverse and the gate range argument rely on it
D = ABI_CONSTANTS.D  # head dimension, K = V = 128


def await_previous_grid():
    """Programmatic dependent launch (every kernel of a prefill is launched with use_pdl=True).

    The launch of a kernel overlaps the tail of the kernel before it in the stream: its CTAs may
    start once every CTA of that kernel has exited, before the grid's completion and memory flush
    are processed; griddepcontrol.wait then blocks until that kernel has completed and its memory
    is visible. Every CTA calls this before its first global access and before any early exit, so
    each kernel completes only after its predecessor did, and ordering stays transitive along the
    chain.

    No kernel calls griddepcontrol.launch_dependents early: measured on the H200, triggering at
    CTA start let the next kernels' CTAs sit resident in griddepcontrol.wait beside the running
    ones, and serial H=64 T=8192 went from 0.78 to 1.71 ms (docs/cp_tuning.md). A late trigger
    (K2 and pre_scan after their tile loop, the merge in its last step) was slower too: H=8 [8192]
    CP 0.155 -> 0.186 ms, segmented K2 launched beside the merge (docs/what_we_tried.md).
    """
    cute.arch.griddepcontrol_wait()


def raw_tile_layout():
    """(16, 128) -> element offset of the raw 4 KiB tile image (docs/kernel_abi.md, docs/algorithm.md §4.8).

    8x8 core matrices of 128 bytes; core matrix (mi, ki) starts at element 64*(mi + 2*ki), rows of
    8 elements inside it. Call inside a @cute.jit / @cute.kernel context.
    """
    return cute.make_layout(((8, 2), (8, D // 8)), stride=((8, 64), (1, 128)))


# ---------------------------------------------------------------------------------------------
# Tile-level helpers shared by the kernels (compositions of ptx_ops wrappers and DSL copies; the
# inline PTX itself lives in ptx_ops.py only).
# ---------------------------------------------------------------------------------------------

LOG2E = ABI_CONSTANTS.LOG2E  # f32(LOG2E) is what spec P2 multiplies A_log by


def sync_named(barrier: enum.IntEnum, threads: int) -> None:
    """bar.sync on one of a kernel's named barriers (its module's IntEnum, ids 1-15) for `threads`
    threads. Id 0 stays the anonymous CTA sync (cute.arch.barrier()) of the shared helpers (ring
    set-up, block scans), so a kernel's named points never share a hardware barrier with them."""
    assert 1 <= int(barrier) <= 15, barrier
    cute.arch.barrier(barrier_id=int(barrier), number_of_threads=threads)


def m_seg_column(row, col):
    """Where m_seg keeps element (row, col) of M_j inside its row: col ^ 8 (row & 3) (docs/kernel_abi.md).

    pre_scan writes M this way so that the merge can load a whole M with one contiguous bulk copy
    (no row padding) and still read its B fragments (rows k0 + q and k0 + q + 4, column n0 + g)
    without bank conflicts: lane (g, q) hits bank ((n0 ^ 8 q) + g) mod 32, 32 distinct banks.
    Here, not in either kernel, because both the writer (pre_scan) and the reader (merge) use it."""
    return col ^ (8 * (row & 3))


def sigmoid_tanh(x) -> Float32:
    """sigma~(x) = fma(tanh.approx(0.5 x), 0.5, 0.5) (docs/algorithm.md §2.4, FlashKDA's fast sigmoid, ftz forms)."""
    return fma_rn_ftz(tanh_approx(mul_rn_ftz(x, Float32(0.5))), Float32(0.5), Float32(0.5))


def bf16x2_to_f32x2(x):
    """(low, high) bf16 halves of a packed word as exact fp32 values."""
    x = Uint32(x)
    return u32_as_f32(x << Uint32(16)), u32_as_f32(x & Uint32(0xFFFF0000))


def bsig_residue_slot0(n_heads, cap) -> Int64:
    """The first slot of the bsig region's residue plane (docs/kernel_abi.md): the region holds
    n_heads * cap slots of sigma(beta), then as many of its residue bf(sigma - bf(sigma)), which
    numerics="accurate" writes (K1') and adds back (K2, pre_scan)."""
    return Int64(n_heads) * Int64(cap)


def round_bf16(x) -> Float32:
    """bf(x) as an fp32 value (RNE)."""
    return u32_as_f32(f32x2_to_bf16x2(Float32(0.0), x))


# --- non-tensor bulk copies of DSL tensors (cp.async.bulk through cute.copy) -----------------------------------------------------
# 4.8.1 does NOT elect a lane inside cute.copy for these atoms (checked on the DSL 4.8.1 PTX; docs/build.md): the caller
# decides who issues. One issue per copy: wrap in exactly one elect_one, or give each lane its own
# copy. Both tensors are flat byte ranges: 16-B aligned, size a multiple of 16.

def bulk_g2s_tensor(gsrc, sdst, mbar) -> None:
    """Issue one G2S bulk copy of a tensor completing on mbar (the caller has armed mbar with its
    bytes). ptx_ops.bulk_g2s is the raw-address form."""
    cute.copy(cute.make_copy_atom(cpasync.CopyBulkG2SOp(), gsrc.element_type), gsrc, sdst, mbar_ptr=mbar)


def bulk_s2g_tensor(ssrc, gdst) -> None:
    """Issue one S2G bulk copy into the calling thread's open bulk group."""
    cute.copy(cute.make_copy_atom(cpasync.CopyBulkS2GOp(), ssrc.element_type), ssrc, gdst)


def bulk_s2g_elected(pairs) -> None:
    """One elected lane of the calling warp issues every (smem, gmem) copy, commits and waits until
    the sources have been read (bulk groups are per thread, so issue and wait share one lane).
    Writers must have run fence_proxy('async.shared') and a barrier with this warp before."""
    with cute.arch.elect_one():
        for ssrc, gdst in pairs:
            bulk_s2g_tensor(ssrc, gdst)
        cute.arch.cp_async_bulk_commit_group()
        cute.arch.cp_async_bulk_wait_group(0, read=True)


# --- the single-CTA table kernels (seq_tables, cp_seg_tables) ---------------------------------

def clamp_token(value, t_total: Int32) -> Int32:
    """min(t_total, max(0, value)) of a cu_seqlens entry of either width, computed in 64 bits so
    an int64 entry past 2^31 cannot wrap into range (t_total >= 0)."""
    v = Int64(value)
    v = cutlass.max(v, Int64(0))
    v = cutlass.min(v, Int64(t_total))
    return Int32(v)


def tile_count(length: Int32) -> Int32:
    """ceil(length / 16) of a clamped length in [0, 2^31 - 1], rounded up in 64 bits (no wrap)."""
    return Int32((Int64(length) + (CHUNK - 1)) // CHUNK)


@cute.jit
def block_scan(x: Int32, carry: Int32, lane: Int32, warp: Int32, s_warp: cute.Tensor,
               use_max: cutlass.Constexpr[bool], warps: cutlass.Constexpr[int]):
    """Scan of one Int32 per thread in thread order, continuing from `carry` (the result of the
    blocks before): (exclusive, inclusive, block total) with op = max (use_max) or +.

    Warp scans with shuffles, the warp results through s_warp [warps] in shared memory. With max,
    every value must be >= 0 (0 is then the identity the lanes past the table contribute). The
    caller syncs the CTA before s_warp is written again (the next call)."""
    for offset in cutlass.range_constexpr(5):
        y = cute.arch.shuffle_sync_up(x, 1 << offset)
        if lane >= (1 << offset):
            x = cutlass.max(x, y) if cutlass.const_expr(use_max) else x + y
    below = cute.arch.shuffle_sync_up(x, 1)  # the warp's inclusive scan at lane - 1
    if lane == 31:
        s_warp[warp] = x
    cute.arch.barrier()
    before = carry
    total = carry
    for w in cutlass.range_constexpr(warps):
        s = s_warp[w]
        if cutlass.const_expr(use_max):
            if w < warp:
                before = cutlass.max(before, s)
            total = cutlass.max(total, s)
        else:
            if w < warp:
                before = before + s
            total = total + s
    excl = before
    if lane > 0:
        excl = cutlass.max(before, below) if cutlass.const_expr(use_max) else before + below
    incl = cutlass.max(before, x) if cutlass.const_expr(use_max) else before + x
    return excl, incl, total
