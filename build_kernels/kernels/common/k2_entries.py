"""The host entries of K2's modes, shared by both K2 kernels (k2_recurrence.py, the mma.sync K2, and
k2_regstate.py, the register-state K2): each mode's `@cute.jit __call__` with the registry's
arguments of that mode (build_kernels/registry.py: _k2, _k2_segments, _k2_ext), and the spelling of
the kernel's PTX symbol. A K2 kernel class supplies `config` (its config dataclass) and
`_launch(params, n_seq, n_heads, stream)`; a mode class is an entry below with the kernel class
after it, e.g. `class K2Serial(SerialEntry, K2Recurrence)`, and an `__init__` that builds the config.
"""

import dataclasses

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Int32, Int64

from .recurrence_common import k2_params


class K2Entry:
    """What every K2 mode class shares beside its host entry."""

    def __str__(self):
        """What the kernel's PTX symbol spells for this object: the mode and the constants that are
        not the config's defaults (the DSL spells a kernel method's symbol from its object)."""
        cfg = self.config
        return "_".join([type(self).__name__] + [f"{f.name}{getattr(cfg, f.name)}" for f in dataclasses.fields(cfg)
                                                 if getattr(cfg, f.name) != f.default])


class SerialEntry(K2Entry):
    """Serial K2: a sequence per CTA, its state I/O as the constants say (registry entries
    k2_recurrence and k2_regstate)."""

    @cute.jit
    def __call__(self, v: cute.Pointer, out: cute.Pointer, ws_qd: cute.Pointer, ws_kd: cute.Pointer,
                 ws_kr: cute.Pointer, ws_gt: cute.Pointer, ws_inv: cute.Pointer, ws_mqk: cute.Pointer,
                 ws_bsig: cute.Pointer, seq_start: cute.Pointer, tile_prefix: cute.Pointer, seq_order: cute.Pointer,
                 initial_state: cute.Pointer, final_state: cute.Pointer, t_total: Int32, n_seq: Int32,
                 n_heads: Int32, cap: Int32, v_stride_t: Int64, v_stride_h: Int64, stream: cuda.CUstream):
        """K2 host entry: out [T_total, H, 128] bf16, v read in place at token / head strides v_stride_t /
        v_stride_h (elements; 16-byte aligned rows of 128), workspace regions (docs/kernel_abi.md), sequence
        tables [n_seq + 1] int32, seq_order [n_seq] int32 (the dispatch order; null: sequence order),
        states [n_seq, H, 128, 128] (V x K). t_total is not needed by the
        kernel (every access is bounded by seq_start)."""
        self._launch(k2_params(self.config, v, out, (ws_qd, ws_kd, ws_kr, ws_gt, ws_inv, ws_mqk, ws_bsig),
                               seq_start, tile_prefix, n_seq, n_heads, cap, v_stride_t, v_stride_h, initial_state,
                               final_state, seq_order=seq_order),
                     n_seq, n_heads, stream)


class SegmentsEntry(K2Entry):
    """Segmented K2 of a CP call (registry entries k2_segments and k2_regstate_segments;
    docs/algorithm.md §4.5)."""

    @cute.jit
    def __call__(self, v: cute.Pointer, out: cute.Pointer, ws_qd: cute.Pointer, ws_kd: cute.Pointer,
                 ws_kr: cute.Pointer, ws_gt: cute.Pointer, ws_inv: cute.Pointer, ws_mqk: cute.Pointer,
                 ws_bsig: cute.Pointer, seg_start: cute.Pointer, seg_prefix: cute.Pointer,
                 carries: cute.Pointer, final_state: cute.Pointer, final_slot: cute.Pointer, t_total: Int32,
                 n_seg: Int32, n_heads: Int32, cap: Int32, v_stride_t: Int64, v_stride_h: Int64,
                 stream: cuda.CUstream):
        """K2 with segments in place of sequences, entry states from the merge's fp32 carries
        [n_seg, H, 128, 128], and the exit state of segment j written to final_state[final_slot[j]]
        (bf16 or fp32 [n_seq, H, 128, 128]) when final_slot[j] >= 0, i.e. only by each sequence's
        last segment: no scratch and no gather kernel."""
        self._launch(k2_params(self.config, v, out, (ws_qd, ws_kd, ws_kr, ws_gt, ws_inv, ws_mqk, ws_bsig),
                               seg_start, seg_prefix, n_seg, n_heads, cap, v_stride_t, v_stride_h, carries, final_state,
                               final_slot=final_slot),
                     n_seg, n_heads, stream)


class ExtEntry(K2Entry):
    """K2 with state I/O by slot and checkpoints (registry entries k2_ext and k2_regstate_ext;
    docs/state_pool.md), serial (segments=False) or segmented (segments=True: entry states from the
    fp32 carries, the final state of sequence final_slot[j] written by its last segment j)."""

    @cute.jit
    def __call__(self, v: cute.Pointer, out: cute.Pointer, ws_qd: cute.Pointer, ws_kd: cute.Pointer,
                 ws_kr: cute.Pointer, ws_gt: cute.Pointer, ws_inv: cute.Pointer, ws_mqk: cute.Pointer,
                 ws_bsig: cute.Pointer, seq_start: cute.Pointer, tile_prefix: cute.Pointer, seq_order: cute.Pointer,
                 initial_state: cute.Pointer, final_state: cute.Pointer, final_slot: cute.Pointer,
                 state_index: cute.Pointer, checkpoints: cute.Pointer, real_seq_start: cute.Pointer,
                 slot_stride: Int64, n_pool: Int32, checkpoint_every: Int32, n_real: Int32,
                 checkpoint_table: cute.Pointer, checkpoint_k: Int32, checkpoint_stride: Int64, t_total: Int32,
                 n_seq: Int32, n_heads: Int32, cap: Int32, v_stride_t: Int64, v_stride_h: Int64,
                 stream: cuda.CUstream):
        """States are rows of a pool [n_pool slots, H, 128, 128] with slot stride `slot_stride` elements:
        sequence n reads and writes slot state_index[n] (slot n when state_index is null); a slot
        outside [0, n_pool) is neither read (entry 0) nor written. A null initial_state / final_state
        means no entry read / no final write. checkpoints (null: none) is the checkpoint destination.
        checkpoint_every = C > 0: [T // C, H, 128, 128] receives, for every full tile ending at token e
        with (e - start of its sequence) % C == 0, the state at slot e // C - 1. checkpoint_every = 0
        and checkpoint_k = K in {1, 2}: checkpoint_table int32 [n_real, K, 2] (checkpoint_table.py)
        gives each sequence's cleaned offsets and destination slots, checkpoint_stride the elements
        per destination slot. real_seq_start [n_real + 1] (the sequence tables) tells a segment where
        its sequence starts and which it is. v is read at token / head strides v_stride_t / v_stride_h.
        seq_order [n_seq] (null: sequence order) is the dispatch order of the serial call's sequences."""
        self._launch(k2_params(self.config, v, out, (ws_qd, ws_kd, ws_kr, ws_gt, ws_inv, ws_mqk, ws_bsig),
                               seq_start, tile_prefix, n_seq, n_heads, cap, v_stride_t, v_stride_h, initial_state,
                               final_state, final_slot=final_slot, seq_order=seq_order, state_index=state_index,
                               slot_stride=slot_stride, n_pool=n_pool, checkpoints=checkpoints,
                               checkpoint_every=checkpoint_every, real_seq_start=real_seq_start, n_real=n_real,
                               checkpoint_table=checkpoint_table, checkpoint_k=checkpoint_k,
                               checkpoint_stride=checkpoint_stride),
                     n_seq, n_heads, stream)
