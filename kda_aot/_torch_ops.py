"""The torch operators `kda_aot::prefill`, `prefill_out` and `prefill_pool`, and their Python face.

kda_aot/torch.py is the public module (`import kda_aot.torch`); this one holds the operators so
that the compatibility layers built on them (fla_compat.py, flashkda_compat.py, fla_backend.py)
import it without importing kda_aot.torch, which imports them: no import cycle.

Why an operator and not just the Python function: torch.compile treats a registered operator as
one opaque node (no graph break, no tracing into ctypes), its fake implementation gives shapes
without running anything, and functionalization knows exactly which arguments are written.

Three ops, because an operator cannot return None and an operator that writes into arguments
cannot also return them. Their schemas are generated (op_schema) from OPS, each operator's
argument order, over the one declaration of prefill's tensors (spec/prefill_args.py) and options
(spec/call_options.py); docs/torch.md has them in full:

    kda_aot::prefill(q, k, v, g, beta, Tensor? A_log, Tensor? dt_bias, float? lower_bound=None,
        float? scale=None, Tensor? initial_state=None, bool output_final_state=False,
        Tensor? cu_seqlens=None, Tensor? cu_seqlens_cpu=None, SymInt[]? seq_lens=None, str cp="auto",
        str numerics="flashkda", str gate="safe", str beta_form="logits", bool allow_neg_eigval=False)
        -> (Tensor, Tensor)
      returns (o, final_state); final_state is a 0-element tensor (state dtype) when
      output_final_state is False. `prefill` below turns that into None.

    kda_aot::prefill_out(q, k, v, g, beta, A_log, dt_bias, Tensor(a!) out, Tensor(b!)? final_state,
        Tensor(c!)? workspace, lower_bound, scale, initial_state, cu_seqlens, cu_seqlens_cpu, seq_lens,
        cp, numerics, gate, beta_form, allow_neg_eigval, Tensor? checkpoint_offsets=None,
        Tensor(d!)? checkpoint_state=None, Tensor? segment_ids=None) -> ()
      writes o into `out` and, when given, the final state into `final_state` and the checkpoints
      at checkpoint_offsets into `checkpoint_state`; `workspace` is scratch the kernels write;
      `segment_ids`: only the listed sequences are computed and written (docs/state_pool.md).

    kda_aot::prefill_pool(q, k, v, g, beta, A_log, dt_bias, Tensor(a!) state_pool, Tensor state_indices,
        lower_bound, scale, cu_seqlens, cu_seqlens_cpu, seq_lens, cp, gate, beta_form, allow_neg_eigval,
        Tensor? checkpoint_offsets=None, Tensor(b!)? checkpoint_state=None, Tensor? checkpoint_slots=None,
        Tensor? segment_ids=None) -> Tensor
      returns o; reads and writes the state pool in place (docs/state_pool.md), and writes the
      checkpoints at checkpoint_offsets into checkpoint_state or into the pool at checkpoint_slots.

The gate and beta forms (`gate`, `beta_form`, `allow_neg_eigval`, and `lower_bound` None meaning
the form's default) are kda_aot.prefill's, passed through unchanged; the new arguments come last
so that positional callers of the earlier schemas keep working. All three run `kda_aot.prefill` on
torch's current stream, so they work inside CUDA graph capture as the plain call does. They have
no autograd formula: a forward with inputs that require grad works, backward raises.

Strided q, k, v, g and beta reach the kernels as they are (TAGS: exact strides, never a copy).
"""

from typing import List, NamedTuple, Optional, Tuple

import torch  # absolute: the top-level torch

from .library.constants import D
from .spec import prefill_args
from .spec.call_options import DEFAULTS, SCHEMA_TYPES
from . import api


# Inductor must hand the kernels the strides eager code would, never a layout of its own choosing.
TAGS = (torch.Tag.needs_exact_strides,) if hasattr(torch.Tag, "needs_exact_strides") else (
    torch.Tag.needs_fixed_stride_order,)


def bump_written_versions(op_def, *, force: bool = False) -> None:
    """Make the op's in-place version bump skip written arguments the call left at their default.

    The dispatcher hands a Python kernel its arguments without the trailing ones that equal their
    defaults. torch releases whose custom_op version bump (the ADInplaceOrView kernel) indexes the
    arguments as passed raise IndexError when a trailing optional written argument (final_state,
    checkpoint_state) is left out; later releases fill the defaults in first. On a release of the
    first kind (or with `force`), the op gets a kernel that bumps the written tensors it was given
    and redispatches, as the later releases' kernel does."""
    if not force and _version_bump_fills_defaults():
        return
    op = op_def._opoverload
    written = [(i, a.name, a.kwarg_only) for i, a in enumerate(op._schema.arguments)
               if a.alias_info is not None and a.alias_info.is_write]
    after = torch._C._after_ADInplaceOrView_keyset

    def kernel(keyset, *args, **kwargs):
        for i, name, kwarg_only in written:
            value = kwargs.get(name) if kwarg_only or i >= len(args) else args[i]
            if isinstance(value, torch.Tensor):
                torch.autograd.graph.increment_version(value)
        with torch._C._AutoDispatchBelowADInplaceOrView():
            return op.redispatch(keyset & after, *args, **kwargs)

    op_def._lib.impl(op_def._name, kernel, "ADInplaceOrView", with_keyset=True, allow_override=True)


def _version_bump_fills_defaults() -> bool:
    import inspect

    from torch._library import custom_ops

    try:
        return "fill_defaults" in inspect.getsource(custom_ops.CustomOpDef)
    except (OSError, TypeError):  # no source: assume the older kernel
        return False


def state_dtype(initial_state: Optional[torch.Tensor], checkpoint_state: Optional[torch.Tensor] = None) -> torch.dtype:
    """The final state's dtype when prefill allocates it: the call's other state's (initial_state,
    checkpoint_state), else fp32 (api rule: one state dtype per call)."""
    given = initial_state if initial_state is not None else checkpoint_state
    return torch.float32 if given is None else given.dtype


def num_sequences(q: torch.Tensor, cu_seqlens: Optional[torch.Tensor]):
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


# ---------------------------------------------------------------------------------------------
# the operators' schemas, from the one declaration of prefill's tensors (spec/prefill_args: which
# are required, which written) and of its options (spec/call_options: types and defaults)

class OpArgs(NamedTuple):
    args: Tuple[str, ...]  # in schema order; positional callers rely on it, so new arguments go last
    required: Tuple[str, ...]  # tensors this operator cannot do without, besides prefill's required ones
    returns: str


OPS = {
    # functional: allocates its outputs; final_state is a 0-element tensor when not asked for
    "prefill": OpArgs(("q", "k", "v", "g", "beta", "A_log", "dt_bias", "lower_bound", "scale", "initial_state",
                       "output_final_state", "cu_seqlens", "cu_seqlens_cpu", "seq_lens", "cp", "numerics", "gate",
                       "beta_form", "allow_neg_eigval"), (), "(Tensor, Tensor)"),
    # writes into the caller's buffers (the final state when one is given)
    "prefill_out": OpArgs(("q", "k", "v", "g", "beta", "A_log", "dt_bias", "out", "final_state", "workspace",
                           "lower_bound", "scale", "initial_state", "cu_seqlens", "cu_seqlens_cpu", "seq_lens",
                           "cp", "numerics", "gate", "beta_form", "allow_neg_eigval", "checkpoint_offsets",
                           "checkpoint_state", "segment_ids"), ("out",), "()"),
    # reads and writes a state pool in place, returns o
    "prefill_pool": OpArgs(("q", "k", "v", "g", "beta", "A_log", "dt_bias", "state_pool", "state_indices",
                            "lower_bound", "scale", "cu_seqlens", "cu_seqlens_cpu", "seq_lens", "cp", "gate",
                            "beta_form", "allow_neg_eigval", "checkpoint_offsets", "checkpoint_state",
                            "checkpoint_slots", "segment_ids"), ("state_pool", "state_indices"), "Tensor"),
}
_TENSORS = {a.name: a for a in prefill_args.ARGS}


def _written(name: str) -> bool:
    return name == "workspace" or _TENSORS[name].role != "read"  # the workspace is scratch the kernels write


def _literal(value) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _first_defaulted(args) -> int:
    """Where an operator's defaulted arguments begin: at its first option (a schema's defaulted
    arguments are its last ones; the dispatcher leaves trailing defaults out of its call)."""
    return next(i for i, name in enumerate(args) if name in SCHEMA_TYPES)


def op_schema(op: str) -> str:
    """The operator's schema: a tensor is optional unless required, written ones carry an alias
    (named a<position>, as torch names those it infers), and every argument from the first option
    on has a default (the option's, None for a tensor)."""
    spec, parts = OPS[op], []
    first_defaulted = _first_defaulted(spec.args)
    for i, name in enumerate(spec.args):
        if name in SCHEMA_TYPES:
            parts.append(f"{SCHEMA_TYPES[name]} {name}={_literal(DEFAULTS[name])}")
            continue
        required = name in spec.required or (name in _TENSORS and _TENSORS[name].required)
        alias = f"(a{i}!)" if _written(name) else ""
        parts.append(f"Tensor{alias}{'' if required else '?'} {name}{'=None' if i >= first_defaulted else ''}")
    return f"({', '.join(parts)}) -> {spec.returns}"


def _binder(op: str):
    """Names the operator's arguments as the dispatcher passes them (positionally, less the trailing
    ones left at their defaults), defaults filled: kda_aot.prefill's keywords."""
    args = OPS[op].args
    defaults = {name: DEFAULTS.get(name) for name in args[_first_defaulted(args):]}

    def bind(values, kwargs) -> dict:
        named = dict(defaults)
        named.update(zip(args, values))
        named.update(kwargs)
        return named
    return bind


def _define(op: str, impl, fake):
    mutates = tuple(name for name in OPS[op].args if name not in SCHEMA_TYPES and _written(name))
    op_def = torch.library.custom_op(f"kda_aot::{op}", impl, mutates_args=mutates, schema=op_schema(op), tags=TAGS)
    op_def.register_fake(fake)
    if mutates:
        bump_written_versions(op_def)
    return getattr(torch.ops.kda_aot, op).default


# api.prefill is looked up on every call (not bound at import) so CPU tests can stand in a
# reference for the kernels and run torch.library.opcheck without a GPU.

_bind_prefill = _binder("prefill")


def _prefill_impl(*args, **kwargs):
    named = _bind_prefill(args, kwargs)
    o, final = api.prefill(**named)
    if final is None:
        final = named["q"].new_empty((0,), dtype=state_dtype(named["initial_state"]))
    return o, final


def _prefill_fake(*args, **kwargs):
    named = _bind_prefill(args, kwargs)
    q = named["q"]
    o = q.new_empty(q.shape)  # bf16 like q whatever the gate's and beta's dtypes
    dtype = state_dtype(named["initial_state"])
    if not named["output_final_state"]:
        return o, q.new_empty((0,), dtype=dtype)
    return o, q.new_empty((num_sequences(q, named["cu_seqlens"]), q.shape[2], D, D), dtype=dtype)


_bind_out = _binder("prefill_out")


def _prefill_out_impl(*args, **kwargs):
    named = _bind_out(args, kwargs)
    api.prefill(**named, output_final_state=named["final_state"] is not None)


def _prefill_out_fake(*args, **kwargs):
    return None


_bind_pool = _binder("prefill_pool")


def _prefill_pool_impl(*args, **kwargs):
    o, _ = api.prefill(**_bind_pool(args, kwargs))
    return o


def _prefill_pool_fake(*args, **kwargs):
    q = _bind_pool(args, kwargs)["q"]
    return q.new_empty(q.shape)


PREFILL = _define("prefill", _prefill_impl, _prefill_fake)
PREFILL_OUT = _define("prefill_out", _prefill_out_impl, _prefill_out_fake)
PREFILL_POOL = _define("prefill_pool", _prefill_pool_impl, _prefill_pool_fake)


# ---------------------------------------------------------------------------------------------
# the Python face: kda_aot.prefill's signature, through the ops

def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
            A_log: Optional[torch.Tensor] = None, dt_bias: Optional[torch.Tensor] = None,
            lower_bound: Optional[float] = None, scale: Optional[float] = None,
            initial_state: Optional[torch.Tensor] = None, output_final_state: bool = False,
            cu_seqlens: Optional[torch.Tensor] = None, cu_seqlens_cpu: Optional[torch.Tensor] = None,
            seq_lens: Optional[List[int]] = None, cp: str = "auto", out: Optional[torch.Tensor] = None,
            final_state: Optional[torch.Tensor] = None, workspace: Optional[torch.Tensor] = None,
            state_pool: Optional[torch.Tensor] = None, state_indices: Optional[torch.Tensor] = None,
            numerics: str = "flashkda", gate: str = "safe", beta_form: str = "logits",
            allow_neg_eigval: bool = False, checkpoint_offsets: Optional[torch.Tensor] = None,
            checkpoint_state: Optional[torch.Tensor] = None, checkpoint_slots: Optional[torch.Tensor] = None,
            segment_ids: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """kda_aot.prefill through the torch ops: returns (o, final_state or None).

    Same arguments and checks as kda_aot.prefill (README, kda_aot/api.py), gate and beta forms
    included, less `stream=` (the op runs on torch's current stream: use `with
    torch.cuda.stream(s)`), `validate=` (reading cu_seqlens back is a sync, out of place in a
    graph) and the test-only `value_split` and integer `cp`. `cu_seqlens_cpu` may be a CPU tensor,
    a list or a numpy array. With none of out=, final_state=, workspace= it calls
    kda_aot::prefill, else kda_aot::prefill_out, allocating whichever output the caller did not give.
    Checkpoints at given offsets (`checkpoint_offsets` with `checkpoint_state`, or with a state pool
    `checkpoint_slots`) go through kda_aot::prefill_out, or kda_aot::prefill_pool with a pool, and so
    do calls with `segment_ids` (the listed sequences only: an unlisted sequence's rows of an `out`
    this function allocates are left unwritten).
    """
    if final_state is not None and not output_final_state:
        raise ValueError("final_state: a buffer was given but output_final_state=False")
    hint = host_tensor(cu_seqlens_cpu)
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
        # positional, in the schema's order (OPS): keywords cost the dispatcher about 2 us a call
        return PREFILL_POOL(q, k, v, g, beta, A_log, dt_bias, state_pool, state_indices, lower_bound, scale,
                            cu_seqlens, hint, seq_lens, cp, gate, beta_form, allow_neg_eigval, checkpoint_offsets,
                            checkpoint_state, checkpoint_slots, segment_ids), None
    if checkpoint_slots is not None:
        raise ValueError("checkpoint_slots: requires state_pool (checkpoint (n, k) is written into "
                         "state_pool[checkpoint_slots[n, k]])")
    if out is None and final_state is None and workspace is None and checkpoint_offsets is None and \
            checkpoint_state is None and segment_ids is None:
        o, final = PREFILL(q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, initial_state, output_final_state,
                           cu_seqlens, hint, seq_lens, cp, numerics, gate, beta_form, allow_neg_eigval)
        return o, (final if output_final_state else None)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if output_final_state and final_state is None:
        final_state = q.new_empty((num_sequences(q, cu_seqlens), q.shape[2], D, D),
                                  dtype=state_dtype(initial_state, checkpoint_state))
    PREFILL_OUT(q, k, v, g, beta, A_log, dt_bias, out, final_state, workspace, lower_bound, scale, initial_state,
                cu_seqlens, hint, seq_lens, cp, numerics, gate, beta_form, allow_neg_eigval, checkpoint_offsets,
                checkpoint_state, segment_ids)
    return out, final_state


def host_tensor(values):
    """The op takes the host copy of cu_seqlens as a CPU tensor; lists and arrays become one."""
    if values is None or isinstance(values, torch.Tensor):
        return values
    hint = torch.as_tensor(values)
    if hint.is_floating_point() or hint.is_complex() or hint.dtype == torch.bool:
        raise TypeError(f"cu_seqlens_cpu: expected integer entries, got dtype {hint.dtype}")
    return hint
