"""State I/O by slot and checkpoint positions, shared by both K2 kernels (k2_recurrence.py,
k2_regstate.py), the CP merge (cp_merge.py) and the checkpoint index table (checkpoint_index.py);
docs/state_pool.md.

A state pool is [n_pool, H, 128, 128] with any slot stride: sequence n uses slot state_index[n]
(or n when no index table is given). A slot outside [0, n_pool) means "no state": the entry state
is 0 and nothing is written, which is how a negative index (vLLM's PAD_SLOT_ID) is honoured and
how an out-of-range one stays memory-safe without any host check.

Checkpoints: with C the checkpoint interval (a multiple of the 16-token tile), the state of
sequence n after j*C tokens (j >= 1, j*C <= its length) sits at global token p = start_n + j*C.
Two such positions are at least C apart (two of one sequence differ by a multiple of C; for
sequences n < m, p_n <= start_m < p_m - C + 1), so slot p // C - 1 is unique and lies in
[0, T // C): the layout needs no host knowledge of the lengths.

Checkpoints at given offsets: sequence n's checkpoint k is the state after its first off[n, k]
tokens, written to destination slot dst[n, k] (a [N, K] buffer entry or a state pool slot) when
off[n, k] is a positive multiple of 16 smaller than the sequence's length. The checkpoint table
kernel (checkpoint_table.py) cleans the caller's offsets and slots into (off or -1, dst) pairs on
the device, so K2 only compares the end of each full tile with at most two offsets.
"""

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from .ptx_ops import ldg_b32
from .tile_ops import D


@cute.jit
def pool_slot(seq: Int32, idx_ptr: Int64, n_pool: Int32, state_ptr: Int64):
    """The pool slot of sequence `seq` (< 0: none), or -1 when `seq` < 0, the state pointer is null,
    or the slot lies outside [0, n_pool). Uniform over the CTA; emitted inline."""
    slot = Int32(-1)
    if state_ptr != Int64(0):
        if seq >= 0:
            slot = seq
            if idx_ptr != Int64(0):
                slot = ldg_b32(idx_ptr + Int64(seq) * 4)
            if slot >= n_pool:
                slot = Int32(-1)
            if slot < 0:
                slot = Int32(-1)
    return slot


@cute.jit
def k2_state_slots(n: Int32, ntiles: Int32, mSlot: Optional[cute.Tensor], idx_ptr: Optional[Int64],
                   n_pool: Optional[Int32], init_ptr: Optional[Int64], final_ptr: Optional[Int64],
                   has_final: cutlass.Constexpr[bool], final_slots: cutlass.Constexpr[bool],
                   ext: cutlass.Constexpr[bool]):
    """(busy, slot, in_slot) of a K2 CTA on sequence (or CP segment) n of ntiles tiles: the final
    state's slot (< 0: none), the entry state's slot, and busy > 0 when the CTA has anything to do.

    A CTA with no tile and no final state to write has nothing to do. It must not even read its
    entry state: the CP runtime leaves the carries of its padding segments (empty, final_slot -1)
    uninitialised. busy is uniform over the CTA, so the ring's barriers (set up under it) are used
    by all of its threads or by none. final_slots (CP): n is a segment; only a sequence's last
    segment has a slot (the sequence index, -1 otherwise) and writes final_state[slot] directly.
    ext (docs/state_pool.md): the state row of sequence `slot` is state_index[slot] (or `slot`
    without an index), -1 when there is none or no final pointer."""
    busy = ntiles
    slot = n
    if cutlass.const_expr(has_final):
        if cutlass.const_expr(final_slots):
            slot = mSlot[n]
        if cutlass.const_expr(ext):
            slot = pool_slot(slot, idx_ptr, n_pool, final_ptr)
        if slot >= 0:
            busy = Int32(1)
    in_slot = n
    if cutlass.const_expr(ext and not final_slots):
        in_slot = pool_slot(n, idx_ptr, n_pool, init_ptr)
    return busy, slot, in_slot


@cute.jit
def checkpoint_targets(ck_ptr: Int64, ck_tab: Int64, ck_k: Int32, seq: Int32):
    """Checkpoints at given offsets (docs/state_pool.md): (off0, dst0, off1, dst1), sequence seq's
    cleaned offsets (-1: none) and destination slots from the checkpoint table (checkpoint_table.py:
    int32 [N, K, 2]); K = ck_k <= 2, 0 when the call has none (or counts every C tokens)."""
    off0 = Int32(-1)
    dst0 = Int32(0)
    off1 = Int32(-1)
    dst1 = Int32(0)
    if ck_ptr != Int64(0):
        if ck_k > 0:
            row = ck_tab + Int64(seq) * Int64(ck_k) * 8
            off0 = ldg_b32(row)
            dst0 = ldg_b32(row + 4)
            if ck_k > 1:
                off1 = ldg_b32(row + 8)
                dst1 = ldg_b32(row + 12)
    return off0, dst0, off1, dst1


@cute.jit
def checkpoint_target(ck_ptr: Int64, ck_every: Int32, ck_base: Int32, start: Int32, m: Int32, targets: tuple,
                      ck_stride: Int64, H64: Int64, h64: Int64):
    """Element offset in the checkpoint destination of the state after the tile that starts at token
    `start` with `m` valid rows, or -1. Only a full tile can end at a checkpoint. Every C tokens
    (ck_every > 0): the tile's end lies a multiple of C past its sequence's start ck_base, slot
    end // C - 1 of [T // C, H, 128, 128]. At given offsets (ck_every == 0, `targets` from
    checkpoint_targets): the tile ends off_k tokens into its sequence, destination slot dst_k at
    ck_stride elements per slot (a checkpoint buffer entry, or a state pool slot)."""
    dst = Int64(-1)
    if ck_ptr != Int64(0):
        if m == 16:
            end = start + 16
            if ck_every > 0:
                if (end - ck_base) % ck_every == 0:
                    dst = (Int64(end // ck_every - 1) * H64 + h64) * Int64(D * D)
            else:
                off0, dst0, off1, dst1 = targets
                rel = end - ck_base
                if rel == off0:
                    dst = Int64(dst0) * ck_stride + h64 * Int64(D * D)
                if rel == off1:
                    dst = Int64(dst1) * ck_stride + h64 * Int64(D * D)
    return dst


@cute.jit
def _ends_a_full_tile(off: Int32, d: Int32, full: Int32) -> Int32:
    """1 when a given offset (cleaned: -1 for none) is the end of one of the CTA's full tiles, d
    tokens past its first token (`full` full tiles), else 0."""
    hit = Int32(0)
    if off >= 0:
        if d > 0:
            if d % 16 == 0:
                if d // 16 <= full:
                    hit = Int32(1)
    return hit


@cute.jit
def checkpoint_runs(ck_ptr: Int64, ck_every: Int32, ck_base: Int32, tok0: Int32, tok_end: Int32, targets: tuple):
    """The checkpoints of a CTA's tiles [tok0, tok_end) as runs, for a tile loop that stores a state
    only between runs (regstate_step.mma_warpgroups): (n_ck, first, step, k_first), checkpoint r <
    n_ck after the tile that ends run r, i.e. after tiles [0, first + r * step), and, at given
    offsets, k_first the index of the target the first one is (the other one the second). The same
    checkpoints as checkpoint_target tests tile by tile: only a full tile ends at one; every C tokens
    (ck_every = C > 0, a multiple of 16) the tile ends a multiple of C past ck_base; at given offsets
    (`targets` from checkpoint_targets) it ends off_k tokens past ck_base, and where both offsets are
    the same tile only the second target is written."""
    n_ck = Int32(0)
    first = Int32(0)
    step = Int32(0)
    k_first = Int32(0)
    rel0 = tok0 - ck_base  # tokens of the sequence before the CTA's first tile (a CP segment's offset)
    full = (tok_end - tok0) // 16  # full tiles; only the last can be partial
    if ck_ptr != Int64(0):
        if rel0 % 16 == 0:
            if ck_every > 0:
                # the first tile end strictly past tok0 that lies a multiple of C past ck_base
                u = (ck_every - rel0 % ck_every) % ck_every
                if u == 0:
                    u = ck_every
                first = u // 16
                step = ck_every // 16
                if first <= full:
                    n_ck = (full - first) // step + 1
            else:
                off0, _, off1, _ = targets
                d0 = off0 - rel0  # tokens of the CTA's tiles through target 0 (offset -1: none)
                d1 = off1 - rel0
                c0 = d0 // 16
                c1 = d1 // 16
                v0 = _ends_a_full_tile(off0, d0, full)
                v1 = _ends_a_full_tile(off1, d1, full)
                n_ck = v0 + v1
                if n_ck == 2:
                    if c0 == c1:  # one tile: only target 1 is written, as checkpoint_target does
                        n_ck = Int32(1)
                        v0 = Int32(0)
                first = c0
                if v0 == 0:
                    first = c1
                    k_first = Int32(1)
                if n_ck == 2:
                    first = cutlass.min(c0, c1)
                    step = cutlass.max(c0, c1) - first
                    if c1 < c0:
                        k_first = Int32(1)
    return n_ck, first, step, k_first


@cute.jit
def checkpoint_run_target(ck_every: Int32, r: Int32, k_first: Int32, tiles: Int32, tok0: Int32, targets: tuple,
                          ck_stride: Int64, H64: Int64, h64: Int64):
    """Element offset in the checkpoint destination of checkpoint r of checkpoint_runs, the state
    after the CTA's first `tiles` tiles: the slots of checkpoint_target."""
    dst = Int64(0)
    if ck_every > 0:
        dst = (Int64((tok0 + 16 * tiles) // ck_every - 1) * H64 + h64) * Int64(D * D)
    else:
        _, dst0, _, dst1 = targets
        slot = dst0
        if (r ^ k_first) != 0:  # r-th checkpoint in tile order is target 1
            slot = dst1
        dst = Int64(slot) * ck_stride + h64 * Int64(D * D)
    return dst


@cute.jit
def sequence_start_of(tok0: Int32, ck_ptr: Int64, mSeqStart: cute.Tensor, n_real: Int32):
    """(start, index) of the sequence holding token tok0: seq_start[n] for the largest n < n_real
    with seq_start[n] <= tok0 (a CP segment's own sequence; later empty sequences start after it).
    Only searched when checkpoints are written (ck_ptr non-null; else (tok0, 0)); a bit-descent
    binary search, about log2(n_real) loads."""
    base = tok0
    pos = Int32(0)
    if ck_ptr != Int64(0):
        for b in cutlass.range_constexpr(30, -1, -1):
            cand = pos + Int32(1 << b)
            if cand < n_real:
                if mSeqStart[cand] <= tok0:
                    pos = cand
        base = mSeqStart[pos]
    return base, pos


def checkpoint_origin(cfg, seq, n, p):
    """(ck_base, ck_targets) of a K2 CTA, both K2 kernels' start of their checkpoint stores: the
    token their checkpoints count from (the CTA's own start, or its sequence's for a segment of a
    CP call) and, with state I/O by slot (cfg.ext), the sequence's checkpoint targets
    (checkpoint_targets; None without). Plain Python, run while the kernel is traced, so its
    branches are compile-time like the kernel's own (cfg: the kernel's config, seq: its span, n: its
    sequence, p: its parameters)."""
    ck_base, ck_seq = seq.tok0, n
    if cfg.ext and cfg.segmented:
        ck_base, ck_seq = sequence_start_of(seq.tok0, p.ck_ptr, p.mSeqStart, p.n_real)
    return ck_base, (checkpoint_targets(p.ck_ptr, p.ck_tab, p.ck_k, ck_seq) if cfg.ext else None)
