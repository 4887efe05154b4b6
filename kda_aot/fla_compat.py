"""`chunk_kda`: FLA's `fla.ops.kda.chunk_kda` call, answered by kda_aot's kernels.

Import it as `kda_aot.torch.chunk_kda`. It takes FLA's arguments (fla-core 0.6.0) and returns what
FLA returns, (o, final_state or None). FLA's flags select kda_aot.prefill's gate and beta forms
(`fla_forms`, the one place that mapping is written; the FLA backend, fla_backend.py, uses it too):

    use_gate_in_kernel=True, lower_bound given   gate="safe" when -5 <= lower_bound < 0 and both A_log
                                                 and dt_bias are given, else gate="sigmoid" (FLA then
                                                 computes lower_bound * sigmoid(...) whatever safe_gate says)
    use_gate_in_kernel=True, lower_bound None    gate="softplus" (FLA requires A_log)
    use_gate_in_kernel=False                     gate="log_decay": g is the log-decay as given, bf16 or
                                                 fp32; A_log, dt_bias, lower_bound are not used, as in FLA
    use_beta_sigmoid_in_kernel=True / False      beta_form="logits" (allow_neg_eigval passed on) / "probs"

q and k are always L2-normalised in the kernels: use_qk_l2norm_in_kernel=False raises
NotImplementedError naming it, as do GVA, return_intermediate_states and cp_context. Values FLA
itself refuses raise FLA's ValueError (safe_gate without a lower bound in [-5, 0), no A_log for
the softplus gate, allow_neg_eigval without the beta sigmoid, a chunk_size other than 32 or 64).
"""

import math
import warnings
from typing import Any, Optional, Tuple

import torch

from .library.constants import D
from .spec.gate_forms import Form
from . import _torch_ops as _ops
from . import api

_BF16 = torch.bfloat16
_GATE_DTYPES = {"log_decay": (torch.bfloat16, torch.float32)}  # every other gate form takes bf16 g
_BETA_DTYPES = (torch.bfloat16, torch.float32)
_STATE_DTYPES = (torch.float32, torch.bfloat16)
PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # A_log, dt_bias: fp32, or widened exactly
# Keyword arguments FLA's chunk_kda reads from **kwargs (transpose_state_layout: deprecated).
KNOWN_KWARGS = frozenset(("A_log", "dt_bias", "chunk_size", "transpose_state_layout"))


def fla_forms(*, use_qk_l2norm_in_kernel: bool, use_gate_in_kernel: bool, use_beta_sigmoid_in_kernel: bool,
              allow_neg_eigval: bool, safe_gate: bool, lower_bound: Optional[float], A_log: Any, dt_bias: Any,
              return_intermediate_states: bool = False, cp_context: Any = None) -> Tuple[str, str, Any, Any, Any]:
    """FLA's flags as kda_aot.prefill's (gate, beta_form, A_log, dt_bias, lower_bound).

    Raises NotImplementedError naming what kda_aot does not compute, and FLA's own ValueError for
    what FLA refuses, so a caller sees the same error from either.
    """
    if not use_qk_l2norm_in_kernel:
        raise NotImplementedError("use_qk_l2norm_in_kernel=False: the kernels always L2-normalise q and k; "
                                  "use fla's chunk_kda to pass them as they are")
    if return_intermediate_states:
        raise NotImplementedError("return_intermediate_states=True: the kernels keep chunk states on chip and "
                                  "do not return them")
    if cp_context is not None:
        raise NotImplementedError("cp_context: multi-device context parallelism is not supported (kda_aot splits "
                                  "long sequences on one device by itself, cp='auto')")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    beta_form = "logits" if use_beta_sigmoid_in_kernel else "probs"
    if not use_gate_in_kernel:
        return "log_decay", beta_form, None, None, None
    if safe_gate:
        if lower_bound is None:
            raise ValueError("`lower_bound` must be specified when `safe_gate=True` and `use_gate_in_kernel=True`.")
        if not -5 <= lower_bound < 0:
            raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
    if lower_bound is None:
        if A_log is None:
            raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True` and `lower_bound` is not set.")
        return "softplus", beta_form, A_log, dt_bias, None
    lower_bound = float(lower_bound)
    if not (math.isfinite(lower_bound) and lower_bound < 0):
        raise NotImplementedError(f"lower_bound: {lower_bound} is not supported; the bounded gate "
                                  "lower_bound * sigmoid(...) needs a finite lower_bound < 0")
    if A_log is not None and dt_bias is not None and lower_bound >= -5:
        return "safe", beta_form, A_log, dt_bias, lower_bound
    return "sigmoid", beta_form, A_log, dt_bias, lower_bound


def check_tensors(q, k, v, g, beta, initial_state, gate: str) -> None:
    """What FLA accepts and the kernels do not (converting would change the numerics): dtypes,
    head dims, GVA. Shapes and devices are the validation wall's (it names the argument)."""
    qs, vs = q.shape, v.shape
    # one test for the calls kda_aot computes (dtypes are singletons): the verifier runs it per call
    if (q.dtype is _BF16 and k.dtype is _BF16 and v.dtype is _BF16 and beta.dtype in _BETA_DTYPES
            and (g.dtype is _BF16 or (gate == "log_decay" and g.dtype is torch.float32))
            and len(qs) == 4 and len(vs) == 4 and qs[3] == D and vs[3] == D and vs[2] == qs[2]
            and (initial_state is None or initial_state.dtype in _STATE_DTYPES)):
        return
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != _BF16:
            raise NotImplementedError(f"{name}: dtype {t.dtype} is not supported; kda_aot takes bfloat16 "
                                      "(it casts nothing that would round)")
    if g.dtype not in _GATE_DTYPES.get(gate, (_BF16,)):
        allowed = "bfloat16 or float32" if gate == "log_decay" else "bfloat16 with use_gate_in_kernel=True"
        raise NotImplementedError(f"g: dtype {g.dtype} is not supported; kda_aot takes {allowed}")
    if beta.dtype not in _BETA_DTYPES:
        raise NotImplementedError(f"beta: dtype {beta.dtype} is not supported; bfloat16 or float32")
    for name, t in (("q", q), ("v", v)):
        if t.dim() == 4 and t.shape[3] != D:
            raise NotImplementedError(f"{name}: head dim {t.shape[3]} is not supported; only K = V = 128")
    if v.dim() == 4 and q.dim() == 4 and v.shape[2] != q.shape[2]:
        raise NotImplementedError(f"v: {v.shape[2]} value heads but q has {q.shape[2]} heads; grouped value "
                                  "attention (GVA, HV != H) is not supported")
    if initial_state is not None and initial_state.dtype not in _STATE_DTYPES:
        raise NotImplementedError(f"initial_state: dtype {initial_state.dtype} is not supported; fp32 or bf16")


def _dense(t):
    """t itself when contiguous (no dispatcher call), else FLA's own contiguous copy."""
    return t if t is None or t.is_contiguous() else t.contiguous()


def _fp32(t, name: str):
    """A gate parameter in fp32: a bf16 or fp16 one (a model cast to half precision) is widened,
    which is exact, as FLA's gate kernels read it; any other dtype would round, and is refused."""
    if t is None or t.dtype == torch.float32:
        return _dense(t)
    if t.dtype not in PARAM_DTYPES:
        raise NotImplementedError(f"{name}: dtype {t.dtype} is not supported; fp32 (bf16 and fp16 are widened)")
    return t.float().contiguous()


def chunk_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: Optional[float] = None,
              initial_state: Optional[torch.Tensor] = None, output_final_state: bool = False,
              use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
              use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False, safe_gate: bool = False,
              lower_bound: Optional[float] = None, disable_recompute: bool = False,
              return_intermediate_states: bool = False, state_v_first: bool = False,
              cu_seqlens: Optional[torch.Tensor] = None, cu_seqlens_cpu: Optional[torch.Tensor] = None, cp_context: Any = None,
              use_graph: bool = False, max_num_seqs: Optional[int] = None,
              **kwargs: Any) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """FLA's chunk_kda (forward) on kda_aot's kernels: returns (o [B, T, H, 128] bf16, final_state).

    Supported: bf16 q, k, v with K = V = 128 and as many value heads as q heads; g bf16 (fp32 too
    for use_gate_in_kernel=False); beta bf16 or fp32, logits or probabilities; every combination of
    use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate and lower_bound that
    FLA accepts (module docstring), with use_qk_l2norm_in_kernel=True; `A_log` [H] and `dt_bias`
    [H*128] or [H, 128] as keyword arguments (fp32; bf16 and fp16 ones are widened, which is exact);
    `scale` (default 128**-0.5); dense [B, T] input or packed input with `cu_seqlens` (int32 or
    int64, on the device) and the optional host copy `cu_seqlens_cpu`, the planner's hint, which
    must match.

    States: `initial_state` fp32 (FLA's requirement) or bf16; the final state comes back in the
    initial state's dtype, fp32 when there is none, as FLA's does. Numerics: FlashKDA's
    configuration (gate="safe", bf16 logits beta, no allow_neg_eigval) runs FlashKDA's recipe
    (numerics="flashkda": bf16 state between chunks, so an fp32 state round-trips through bf16,
    and FlashKDA's bits on serial plans); every other form runs numerics="accurate" (fp32 state),
    whose error against float64 docs/numerics.md gives per input class beside FLA's, correlated
    keys included. Not bit for bit FLA's in either case.

    Layout: `state_v_first=True` ([N, H, V, K]) is the kernels' own layout and costs nothing.
    The default False ([N, H, K, V]) transposes: one copy of the initial state in and one of the
    final state out. The deprecated `transpose_state_layout=` is accepted as FLA accepts it.

    Like FLA, non-contiguous inputs are made contiguous (a copy); contiguous ones are used in
    place. Accepted and ignored, because they change nothing here: `disable_recompute` (backward
    only), `chunk_size` (32 or 64, FLA's tiling), `use_graph` (every call is CUDA-graph
    capturable). `max_num_seqs`, when given, must equal the number of sequences, as FLA requires.
    NotImplementedError: use_qk_l2norm_in_kernel=False, `return_intermediate_states`,
    `cp_context`, dtypes other than the above, other head dims, GVA, unknown keyword arguments.

    Forward only. Under torch.no_grad() / inference_mode() it calls kda_aot.prefill directly (the
    eager serving path, no dispatcher in between); with grad enabled, or while torch.compile
    traces it, it goes through the kda_aot::prefill operator, whose backward raises.
    """
    return run(True, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
               use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
               return_intermediate_states, state_v_first, cu_seqlens, cu_seqlens_cpu, cp_context, max_num_seqs, kwargs)


def run(check, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound, return_intermediate_states,
        state_v_first, cu_seqlens, cu_seqlens_cpu, cp_context, max_num_seqs, kwargs):
    """chunk_kda's body, its arguments in FLA's order (positional: this is the per-call path).
    `check`: False from the FLA backend, whose verifier has just run check_tensors on the same
    arguments (the validation wall still checks every tensor)."""
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
        warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.", DeprecationWarning,
                      stacklevel=3)  # the caller of chunk_kda
        state_v_first = kwargs.pop("transpose_state_layout")
    gate, beta_form, A_log, dt_bias, lb = fla_forms(
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        safe_gate=safe_gate, lower_bound=lower_bound, A_log=kwargs.pop("A_log", None),
        dt_bias=kwargs.pop("dt_bias", None), return_intermediate_states=return_intermediate_states,
        cp_context=cp_context)
    chunk_size = kwargs.pop("chunk_size", 64)
    if chunk_size not in (32, 64):
        raise ValueError(f"`chunk_size` must be either 32 or 64 for KDA, got {chunk_size}.")
    if kwargs:
        raise NotImplementedError(f"{', '.join(sorted(kwargs))}: not an option kda_aot's chunk_kda supports")
    if check:
        check_tensors(q, k, v, g, beta, initial_state, gate)
    if max_num_seqs is not None and cu_seqlens is not None and max_num_seqs != cu_seqlens.shape[0] - 1:
        raise ValueError(f"max_num_seqs: cu_seqlens holds {cu_seqlens.shape[0] - 1} sequences, "
                         f"max_num_seqs is {max_num_seqs}")
    if initial_state is not None:
        # [N, H, K, V] -> the kernels' [N, H, V, K]: .contiguous() copies the transposed view
        initial_state = _dense(initial_state) if state_v_first else initial_state.transpose(-1, -2).contiguous()
    args = (_dense(q), _dense(k), _dense(v), _dense(g), _dense(beta))
    A_log, dt_bias = _fp32(A_log, "A_log"), _fp32(dt_bias, "dt_bias")
    # FlashKDA's configuration keeps FlashKDA's recipe (its bits); every other form is held to FLA's
    # own error, which numerics="accurate" meets (fp32 state, docs/gate_forms.md) and the bf16-state
    # recipe misses by 1.2-1.8x
    form = Form(gate, beta_form, bool(allow_neg_eigval), g.dtype == torch.float32, beta.dtype == torch.float32)
    numerics = "flashkda" if form.flashkda else "accurate"
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        o, final = _ops.prefill(*args, A_log=A_log, dt_bias=dt_bias, lower_bound=lb, scale=scale,
                                initial_state=initial_state, output_final_state=bool(output_final_state),
                                cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, gate=gate,
                                beta_form=beta_form, allow_neg_eigval=bool(allow_neg_eigval), numerics=numerics)
    else:
        # api.prefill looked up per call: CPU tests stand a reference in for the kernels
        o, final = api.prefill(*args, A_log=A_log, dt_bias=dt_bias, lower_bound=lb, scale=scale,
                               initial_state=initial_state, output_final_state=bool(output_final_state),
                               cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, gate=gate,
                               beta_form=beta_form, allow_neg_eigval=bool(allow_neg_eigval), numerics=numerics)
    if final is not None and not state_v_first:
        final = final.transpose(-1, -2).contiguous()
    return o, final
