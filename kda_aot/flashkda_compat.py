"""FlashKDA's Python API on kda_aot's kernels: `fwd`, `get_workspace_size`, and the operator
`torch.ops.kda_aot.flashkda_fwd`.

    from kda_aot import flashkda_compat as flash_kda
    flash_kda.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound,
                  initial_state=None, final_state=None, cu_seqlens=None)

`fwd` takes upstream FlashKDA's arguments in its order, and the vLLM fork's extras as keywords
(`workspace`, `use_vsplit`, `segment_ids`, `checkpoint_state`, `checkpoint_offsets`). Like
FlashKDA it writes `out` and, when given, `final_state` in place and returns None. The call is
kda_aot.prefill with gate="safe", beta logits and cp="off": FlashKDA's configuration and its
serial recurrence, so the results are
FlashKDA's bits (tests/gpu/test_flashkda_compat.py). `cp="auto"` is an extra keyword for callers
who prefer kda-aot's context-parallel split of long sequences, which agrees with FlashKDA within
the CP error bound instead (docs/numerics.md).

Arguments, as FlashKDA defines them: q, k, v, g bf16 [B, T, H, 128]; beta bf16 logits [B, T, H];
`scale` a float; A_log fp32 [H]; dt_bias fp32 [H, 128] (kda-aot also takes [H*128]); lower_bound
in [-5, 0); initial_state / final_state [N, H, 128 (V), 128 (K)] bf16 or fp32, one dtype per call;
cu_seqlens [N + 1] int64 (int32 too, as the fork takes), with B = 1. `workspace`: uint8 device
scratch of at least the call's need; `get_workspace_size(T, H, N)` for the largest T (tokens in
all) and N (sequences) a caller will pass serves every smaller call. Without it the workspace comes
from torch's caching allocator, as FlashKDA's fwd allocates one.

q, k, v, g and beta may be strided views (token and head strides of 16-byte multiples, the B * T
tokens one run of rows; docs/api.md, "Strided inputs"): the kernels read them in place, nothing is
copied.

`segment_ids`, the fork's contract: int32 [M] on the device, the sequences (indices into
cu_seqlens, or into the batch of a dense input) to run. Their `out` rows, final states and
checkpoints equal those of the call without the list, bit for bit; every other sequence's `out`
rows and final state are left untouched, and an empty list writes nothing. An entry outside
[0, N) is skipped and a repeated one runs once (docs/state_pool.md, "Listed sequences").
`use_vsplit`: the fork's choice between two K2 kernels of identical output; kda-aot chooses its
own K2 split (the results are the same bits either way), so it is checked to be a bool and has no
other effect.

Checkpoints at given offsets, the fork's contract: `checkpoint_offsets` [N] or [N, K] (K 1 or 2) on
the device, of cu_seqlens' dtype in the fork (int32 and int64 are both taken), and
`checkpoint_state` [N, H, 128, 128] ([N, K, H, 128, 128] for [N, K] offsets), fp32 in the fork.
Checkpoint (n, k) is the state of sequence n after its first checkpoint_offsets[n, k] tokens,
written when that is a positive multiple of 16 below the sequence's length and left untouched
otherwise (docs/state_pool.md). One state dtype per call: checkpoint_state's dtype equals
initial_state's / final_state's when they are given. One without the other raises ValueError.

The operator has the vLLM fork's op schema order (workspace after out), so a positional call of
the fork's `torch.ops._flashkda_C.fwd` maps one to one; it declares out, workspace, final_state and
checkpoint_state as written, for torch.compile.
"""

from typing import Optional

import torch

from . import _torch_ops
from . import api
from .library.constants import CHUNK
from .plan.workspace import workspace_layout, cp_layout


def get_workspace_size(T_total: int, H: int, N: int = 1, *, cp: str = "off", sm_count: Optional[int] = None) -> int:
    """Bytes of `workspace` that serve every fwd call of at most T_total tokens in all, at most N
    sequences (dense [B, T] counts B*T tokens and B sequences) and H heads.

    The need of one call is a function of its sizes that only grows with T, N and H
    (kda_aot.workspace_size gives it exactly): tables of N + 1 entries and, per head, one slot per
    16-token tile, of which N sequences of T tokens in all have at most ceil(T / 16) + N. With
    cp="off" (fwd's default) that is the whole need. With cp="auto" or "on", a call of N'
    sequences is split only when N' <= P = max(1, sm_count // H) (the planner's rule, cp_plan.py:
    fewer slots than sequences never pays), into at most N' + P segments, each needing the same
    tables and an fp32 [128, 128] scratch of three states per head: at most 6 * sm_count * 64 KiB
    more (50 MiB on 132 SMs). `sm_count` is the SM count of the device the calls run on (default: torch's current
    device). A buffer sized for cp="auto" also serves cp="off" calls. Checkpoints at given offsets
    add a table of at most two int32 pairs per sequence, and `segment_ids` two int32 per sequence;
    both are included here.
    """
    for name, value in (("T_total", T_total), ("H", H), ("N", N)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
    tiles = -(-T_total // CHUNK) + N
    # the layouts grow with the checkpoint table (K <= 2) and the sequences' own tables that CP
    # builds beside the segment tables for checkpoints (docs/state_pool.md): sized with both
    serial = workspace_layout(H, tiles, N, checkpoint_entries=2 * N, listed=N).nbytes
    if cp == "off":
        return serial
    if cp not in ("auto", "on"):
        raise ValueError(f"cp: expected 'off', 'auto' or 'on', got {cp!r}")
    if sm_count is None:
        from .library.streams import sm_count as device_sms

        sm_count = device_sms(torch.cuda.current_device())
    if isinstance(sm_count, bool) or not isinstance(sm_count, int) or sm_count < 1:
        raise ValueError(f"sm_count: expected an int >= 1, got {sm_count!r}")
    if H == 0 or N == 0:
        return serial
    slots = max(1, sm_count // H)
    segments = min(N, slots) + slots  # a call of N' <= min(N, P) sequences splits into <= N' + P
    return max(serial, cp_layout(H, -(-T_total // CHUNK) + segments, N, segments, sequence_tables=True,
                                 checkpoint_entries=2 * N, listed=N).nbytes)


def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float,
        out: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float,
        initial_state: Optional[torch.Tensor] = None, final_state: Optional[torch.Tensor] = None,
        cu_seqlens: Optional[torch.Tensor] = None, *, workspace: Optional[torch.Tensor] = None,
        checkpoint_state: Optional[torch.Tensor] = None, checkpoint_offsets: Optional[torch.Tensor] = None,
        cp: str = "off", use_vsplit: bool = False, segment_ids: Optional[torch.Tensor] = None) -> None:
    """FlashKDA's forward (module docstring): writes out, final_state and checkpoint_state in place,
    returns None."""
    _check_extras(out, checkpoint_state, checkpoint_offsets, use_vsplit)
    # api.prefill looked up per call: CPU tests stand a reference in for the kernels
    api.prefill(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, lower_bound=float(lower_bound), scale=float(scale),
                initial_state=initial_state, output_final_state=final_state is not None, final_state=final_state,
                out=out, cu_seqlens=cu_seqlens, workspace=workspace, cp=cp, checkpoint_offsets=checkpoint_offsets,
                checkpoint_state=checkpoint_state, segment_ids=segment_ids)


def _check_extras(out, checkpoint_state, checkpoint_offsets, use_vsplit=False) -> None:
    """What fwd refuses before prefill's wall (also at trace time, in the operator's fake)."""
    if not isinstance(use_vsplit, bool):
        raise TypeError(f"use_vsplit: expected a bool, got {type(use_vsplit).__name__}")
    if checkpoint_state is not None and checkpoint_offsets is None:
        raise ValueError("checkpoint_state: given without checkpoint_offsets (the tokens after which each "
                         "checkpoint is taken)")
    if checkpoint_offsets is not None and checkpoint_state is None:
        raise ValueError("checkpoint_offsets: needs checkpoint_state, the [N, (K,) H, 128, 128] buffer the "
                         "checkpoints are written into")
    if out is None:
        raise TypeError("out: FlashKDA's fwd writes the output into `out`; pass a bf16 [B, T, H, 128] buffer")


# checkpoint_state is a trailing optional written argument: _torch_ops.bump_written_versions below
# keeps torch releases whose version bump indexes the arguments as passed from failing when it is
# left out.
@torch.library.custom_op("kda_aot::flashkda_fwd", mutates_args=("out", "workspace", "final_state", "checkpoint_state"),
                         tags=_torch_ops.TAGS)
def _flashkda_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     scale: float, out: torch.Tensor, workspace: Optional[torch.Tensor], A_log: torch.Tensor,
                     dt_bias: torch.Tensor, lower_bound: float, initial_state: Optional[torch.Tensor] = None,
                     final_state: Optional[torch.Tensor] = None, cu_seqlens: Optional[torch.Tensor] = None,
                     checkpoint_state: Optional[torch.Tensor] = None,
                     checkpoint_offsets: Optional[torch.Tensor] = None, cp: str = "off", use_vsplit: bool = False,
                     segment_ids: Optional[torch.Tensor] = None) -> None:
    fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
        workspace=workspace, checkpoint_state=checkpoint_state, checkpoint_offsets=checkpoint_offsets, cp=cp,
        use_vsplit=use_vsplit, segment_ids=segment_ids)


@_flashkda_fwd_op.register_fake
def _flashkda_fwd_fake(q, k, v, g, beta, scale, out, workspace, A_log, dt_bias, lower_bound, initial_state=None,
                       final_state=None, cu_seqlens=None, checkpoint_state=None, checkpoint_offsets=None, cp="off",
                       use_vsplit=False, segment_ids=None):
    # the same refusals at trace time as at run time, so a compiled graph cannot defer them
    _check_extras(out, checkpoint_state, checkpoint_offsets, use_vsplit)
    return None


_torch_ops.bump_written_versions(_flashkda_fwd_op)

FLASHKDA_FWD = torch.ops.kda_aot.flashkda_fwd.default

__all__ = ["fwd", "get_workspace_size", "FLASHKDA_FWD"]
