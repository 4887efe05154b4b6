"""KDA prefill as a PyTorch operator: `torch.ops.kda_aot.prefill` and `prefill_out`.

    import kda_aot.torch            # registers the ops (plain `import kda_aot` never imports torch)
    o, final = kda_aot.torch.prefill(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, ...)
    o, final = kda_aot.torch.chunk_kda(q, k, v, g, beta, ...)   # FLA's chunk_kda, drop-in

Why an operator and not just the Python function: torch.compile treats a registered operator as
one opaque node (no graph break, no tracing into ctypes), its fake implementation gives shapes
without running anything, and functionalization knows exactly which arguments are written.

Two ops (and a third for the state pool), because an operator cannot return None and an operator
that writes into arguments cannot also return them (docs/torch.md has the full schemas):

    kda_aot::prefill(q, k, v, g, beta, A_log, dt_bias, float lower_bound=-5., float? scale=None,
        Tensor? initial_state=None, bool output_final_state=False, Tensor? cu_seqlens=None,
        Tensor? cu_seqlens_cpu=None, SymInt[]? seq_lens=None, str cp="auto") -> (Tensor, Tensor)
      returns (o, final_state); final_state is a 0-element tensor (state dtype) when
      output_final_state is False. `prefill` below turns that into None.

    kda_aot::prefill_out(q, k, v, g, beta, A_log, dt_bias, Tensor(a!) out, Tensor(b!)? final_state=None,
        Tensor(c!)? workspace=None, lower_bound, scale, initial_state, cu_seqlens, cu_seqlens_cpu,
        seq_lens, cp) -> ()
      writes o into `out` and, when given, the final state into `final_state`; `workspace` is
      scratch the kernels write.

    kda_aot::prefill_pool(q, k, v, g, beta, A_log, dt_bias, Tensor(a!) state_pool, Tensor state_indices,
        lower_bound, scale, cu_seqlens, cu_seqlens_cpu, seq_lens, cp) -> Tensor
      returns o; reads and writes the state pool in place (docs/state_pool.md).

Both run `kda_aot.prefill` on torch's current stream, so they work inside CUDA graph capture
as the plain call does. They have no autograd formula: a forward with inputs that require grad
works, backward raises.
"""

from typing import List, Optional, Tuple

import torch  # absolute: the top-level torch, not this module

from .abi_constants import D
from . import api


# Inductor must hand the kernels the strides eager code would (contiguous inputs), never a
# layout of its own choosing: the validation wall refuses non-contiguous tensors.
_TAGS = (torch.Tag.needs_exact_strides,) if hasattr(torch.Tag, "needs_exact_strides") else (
    torch.Tag.needs_fixed_stride_order,)


def _state_dtype(initial_state: Optional[torch.Tensor]) -> torch.dtype:
    """The final state's dtype when prefill allocates it: initial_state's, else fp32 (api rule)."""
    return torch.float32 if initial_state is None else initial_state.dtype


def _num_sequences(q: torch.Tensor, cu_seqlens: Optional[torch.Tensor]):
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


# ---------------------------------------------------------------------------------------------
# kda_aot::prefill (functional: allocates its outputs)

@torch.library.custom_op("kda_aot::prefill", mutates_args=(), tags=_TAGS)
def _prefill_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float = -5.0,
                scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
                output_final_state: bool = False, cu_seqlens: Optional[torch.Tensor] = None,
                cu_seqlens_cpu: Optional[torch.Tensor] = None, seq_lens: Optional[List[int]] = None,
                cp: str = "auto", numerics: str = "flashkda") -> Tuple[torch.Tensor, torch.Tensor]:
    # api.prefill is looked up on every call (not bound at import) so CPU tests can stand in a
    # reference for the kernels and run torch.library.opcheck without a GPU.
    o, final = api.prefill(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, scale=scale,
                           initial_state=initial_state, output_final_state=output_final_state,
                           cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, seq_lens=seq_lens, cp=cp,
                           numerics=numerics)
    if final is None:
        final = q.new_empty((0,), dtype=_state_dtype(initial_state))
    return o, final


@_prefill_op.register_fake
def _prefill_fake(q, k, v, g, beta, A_log, dt_bias, lower_bound=-5.0, scale=None, initial_state=None,
                  output_final_state=False, cu_seqlens=None, cu_seqlens_cpu=None, seq_lens=None, cp="auto",
                  numerics="flashkda"):
    o = q.new_empty(q.shape)
    dtype = _state_dtype(initial_state)
    if not output_final_state:
        return o, q.new_empty((0,), dtype=dtype)
    return o, q.new_empty((_num_sequences(q, cu_seqlens), q.shape[2], D, D), dtype=dtype)


# ---------------------------------------------------------------------------------------------
# kda_aot::prefill_out (writes into caller buffers)

@torch.library.custom_op("kda_aot::prefill_out", mutates_args=("out", "final_state", "workspace"), tags=_TAGS)
def _prefill_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    A_log: torch.Tensor, dt_bias: torch.Tensor, out: torch.Tensor,
                    final_state: Optional[torch.Tensor], workspace: Optional[torch.Tensor],
                    lower_bound: float = -5.0, scale: Optional[float] = None,
                    initial_state: Optional[torch.Tensor] = None, cu_seqlens: Optional[torch.Tensor] = None,
                    cu_seqlens_cpu: Optional[torch.Tensor] = None, seq_lens: Optional[List[int]] = None,
                    cp: str = "auto", numerics: str = "flashkda") -> None:
    api.prefill(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, scale=scale,
                initial_state=initial_state, output_final_state=final_state is not None, cu_seqlens=cu_seqlens,
                cu_seqlens_cpu=cu_seqlens_cpu, seq_lens=seq_lens, cp=cp, out=out, final_state=final_state,
                workspace=workspace, numerics=numerics)


@_prefill_out_op.register_fake
def _prefill_out_fake(q, k, v, g, beta, A_log, dt_bias, out, final_state, workspace, lower_bound=-5.0,
                      scale=None, initial_state=None, cu_seqlens=None, cu_seqlens_cpu=None, seq_lens=None, cp="auto",
                      numerics="flashkda"):
    return None


# ---------------------------------------------------------------------------------------------
# kda_aot::prefill_pool (reads and writes a state pool in place, docs/state_pool.md)

@torch.library.custom_op("kda_aot::prefill_pool", mutates_args=("state_pool",), tags=_TAGS)
def _prefill_pool_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     A_log: torch.Tensor, dt_bias: torch.Tensor, state_pool: torch.Tensor,
                     state_indices: torch.Tensor, lower_bound: float = -5.0, scale: Optional[float] = None,
                     cu_seqlens: Optional[torch.Tensor] = None, cu_seqlens_cpu: Optional[torch.Tensor] = None,
                     seq_lens: Optional[List[int]] = None, cp: str = "auto") -> torch.Tensor:
    o, _ = api.prefill(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, scale=scale,
                       cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, seq_lens=seq_lens, cp=cp,
                       state_pool=state_pool, state_indices=state_indices)
    return o


@_prefill_pool_op.register_fake
def _prefill_pool_fake(q, k, v, g, beta, A_log, dt_bias, state_pool, state_indices, lower_bound=-5.0, scale=None,
                       cu_seqlens=None, cu_seqlens_cpu=None, seq_lens=None, cp="auto"):
    return q.new_empty(q.shape)


PREFILL = torch.ops.kda_aot.prefill.default
PREFILL_OUT = torch.ops.kda_aot.prefill_out.default
PREFILL_POOL = torch.ops.kda_aot.prefill_pool.default


# ---------------------------------------------------------------------------------------------
# the Python face: kda_aot.prefill's signature, through the ops

def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *, A_log: torch.Tensor, dt_bias: torch.Tensor,
            lower_bound: float = -5.0, scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
            output_final_state: bool = False, cu_seqlens: Optional[torch.Tensor] = None, cu_seqlens_cpu: Optional[torch.Tensor] = None,
            seq_lens: Optional[List[int]] = None, cp: str = "auto", out: Optional[torch.Tensor] = None,
            final_state: Optional[torch.Tensor] = None, workspace: Optional[torch.Tensor] = None, state_pool: Optional[torch.Tensor] = None,
            state_indices: Optional[torch.Tensor] = None, numerics: str = "flashkda") -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """kda_aot.prefill through the torch ops: returns (o, final_state or None).

    Same arguments and checks as kda_aot.prefill (README, kda_aot/api.py), less `stream=` (the op
    runs on torch's current stream: use `with torch.cuda.stream(s)`), `validate=` (reading
    cu_seqlens back is a sync, out of place in a graph) and the test-only `value_split` and
    integer `cp`. `cu_seqlens_cpu` may be a CPU tensor, a list or a numpy array. With none of
    out=, final_state=, workspace= it calls kda_aot::prefill, else kda_aot::prefill_out, allocating
    whichever output the caller did not give.
    """
    if final_state is not None and not output_final_state:
        raise ValueError("final_state: a buffer was given but output_final_state=False")
    hint = _host_tensor(cu_seqlens_cpu)
    if state_pool is not None or state_indices is not None:
        # kda_aot::prefill_pool: the pool is the only written argument besides the returned o
        for name, value in (("initial_state", initial_state), ("output_final_state", output_final_state or None),
                            ("out", out), ("final_state", final_state), ("workspace", workspace)):
            if value is not None:
                raise ValueError(f"state_pool: kda_aot.torch.prefill takes no {name} with a state pool "
                                 "(kda_aot.prefill documents the pool; call it directly for out= / workspace=)")
        if state_pool is None or state_indices is None:
            raise ValueError("state_indices: state_pool and state_indices go together")
        if numerics != "flashkda":
            raise NotImplementedError("numerics: 'accurate' with state_pool is not built; use numerics='flashkda'")
        return PREFILL_POOL(q, k, v, g, beta, A_log, dt_bias, state_pool, state_indices, lower_bound, scale,
                            cu_seqlens, hint, seq_lens, cp), None
    if out is None and final_state is None and workspace is None:
        o, final = PREFILL(q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, initial_state, output_final_state,
                           cu_seqlens, hint, seq_lens, cp, numerics)
        return o, (final if output_final_state else None)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if output_final_state and final_state is None:
        final_state = q.new_empty((_num_sequences(q, cu_seqlens), q.shape[2], D, D), dtype=_state_dtype(initial_state))
    PREFILL_OUT(q, k, v, g, beta, A_log, dt_bias, out, final_state, workspace, lower_bound, scale, initial_state,
                cu_seqlens, hint, seq_lens, cp, numerics)
    return out, final_state


def _host_tensor(values):
    """The op takes the host copy of cu_seqlens as a CPU tensor; lists and arrays become one."""
    if values is None or isinstance(values, torch.Tensor):
        return values
    hint = torch.as_tensor(values)
    if hint.is_floating_point() or hint.is_complex() or hint.dtype == torch.bool:
        raise TypeError(f"cu_seqlens_cpu: expected integer entries, got dtype {hint.dtype}")
    return hint


from .fla_compat import chunk_kda  # noqa: E402  (uses the ops above)

__all__ = ["prefill", "chunk_kda", "PREFILL", "PREFILL_OUT", "PREFILL_POOL"]
