"""`chunk_kda`: FLA's `fla.ops.kda.chunk_kda` call, answered by kda_aot's kernels.

Import it as `kda_aot.torch.chunk_kda` (this module needs torch and the ops of kda_aot/torch.py).

It takes FLA's arguments (fla-core 0.6.0) and returns what FLA returns, (o, final_state or
None), for the one configuration our kernels compute: FlashKDA's. Those are FLA's flags
use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel and safe_gate all True,
with lower_bound in [-5, 0): the kernels L2-normalise q and k, form the gate
lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) and take beta as logits (kda_aot/reference.py,
gold_prefill, is that computation in float64). Any other setting raises NotImplementedError
naming the option, so nothing is silently computed differently.
"""

import warnings
from typing import Any, Optional, Tuple

import torch

from .abi_constants import D

_REQUIRED_FLAGS = ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "safe_gate")
_BF16_INPUTS = ("q", "k", "v", "g", "beta")


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

    Supported: bf16 q, k, v, g and beta logits with K = V = 128 and as many value heads as q heads;
    the four flags above True, `lower_bound` in [-5, 0); `A_log` [H] and `dt_bias` [H*128] or
    [H, 128] as keyword arguments (fp32; bf16 ones are widened, which is exact; None means FLA's
    "no A_log" / "no bias", i.e. zeros); `scale` (default 128**-0.5); dense [B, T] input or packed
    input with `cu_seqlens` (int32 or int64, on the device) and the optional host copy
    `cu_seqlens_cpu`, which is used as the planner's hint and must match.

    States: `initial_state` fp32 (FLA's requirement) or bf16; the final state comes back in the
    initial state's dtype, fp32 when there is none, as FLA's does. Inside, the kernels keep the
    state in bf16 between chunks (FlashKDA's recipe), so an fp32 state round-trips through bf16;
    FLA keeps it in fp32. The outputs agree with FLA at bf16-recipe level (relative RMSE about
    6e-3, tests/test_torch_op_gpu.py), not bit for bit.

    Layout: `state_v_first=True` ([N, H, V, K]) is the kernels' own layout and costs nothing.
    The default False ([N, H, K, V]) transposes: one copy of the initial state in and one of the
    final state out (N * H * 128 * 128 elements each, i.e. 64 KiB per (sequence, head) in fp32).
    The deprecated `transpose_state_layout=` is accepted as FLA accepts it.

    Like FLA, non-contiguous inputs are made contiguous (a copy). Accepted and ignored, because
    they change nothing here: `disable_recompute` (backward only), `chunk_size` (32 or 64, FLA's
    tiling), `use_graph` (every call is CUDA-graph capturable). `max_num_seqs`, when given, must
    equal the number of sequences, as FLA requires. Not supported (NotImplementedError): any of the
    four flags False, `allow_neg_eigval`, `return_intermediate_states`, `cp_context`, dtypes other
    than the above, other head dims, unknown keyword arguments. Forward only: there is no
    backward, and autograd raises if asked for one.
    """
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
        warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.", DeprecationWarning,
                      stacklevel=2)
        state_v_first = kwargs.pop("transpose_state_layout")
    flags = dict(use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
                 use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, safe_gate=safe_gate)
    _check_configuration(flags, allow_neg_eigval=allow_neg_eigval,
                         return_intermediate_states=return_intermediate_states, cp_context=cp_context)
    A_log, dt_bias = kwargs.pop("A_log", None), kwargs.pop("dt_bias", None)
    chunk_size = kwargs.pop("chunk_size", 64)
    if chunk_size not in (32, 64):
        raise ValueError(f"`chunk_size` must be either 32 or 64 for KDA, got {chunk_size}.")
    if kwargs:
        raise NotImplementedError(f"{', '.join(sorted(kwargs))}: not an option kda_aot's chunk_kda supports")
    if lower_bound is None:
        raise ValueError("`lower_bound` must be specified when `safe_gate=True` and `use_gate_in_kernel=True`.")
    if not -5 <= lower_bound < 0:
        raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
    _check_tensors(q, k, v, g, beta, initial_state)
    if max_num_seqs is not None and cu_seqlens is not None and max_num_seqs != cu_seqlens.shape[0] - 1:
        raise ValueError(f"max_num_seqs: cu_seqlens holds {cu_seqlens.shape[0] - 1} sequences, "
                         f"max_num_seqs is {max_num_seqs}")

    H = q.shape[2]
    A_log = q.new_zeros((H,), dtype=torch.float32) if A_log is None else A_log.float()
    dt_bias = q.new_zeros((H * D,), dtype=torch.float32) if dt_bias is None else dt_bias.float()
    if initial_state is not None:
        # [N, H, K, V] -> the kernels' [N, H, V, K]: .contiguous() copies the transposed view
        initial_state = initial_state.contiguous() if state_v_first else initial_state.transpose(-1, -2).contiguous()
    o, final = _ops.prefill(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(),
                            A_log=A_log.contiguous(), dt_bias=dt_bias.contiguous(), lower_bound=float(lower_bound),
                            scale=scale, initial_state=initial_state, output_final_state=bool(output_final_state),
                            cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)
    if final is not None and not state_v_first:
        final = final.transpose(-1, -2).contiguous()
    return o, final


def _check_configuration(flags, *, allow_neg_eigval, return_intermediate_states, cp_context) -> None:
    for name in _REQUIRED_FLAGS:
        if not flags[name]:
            raise NotImplementedError(
                f"{name}=False: kda_aot computes only FlashKDA's configuration ({'=True, '.join(_REQUIRED_FLAGS)}"
                "=True, lower_bound in [-5, 0)); use fla's chunk_kda for this one")
    if allow_neg_eigval:
        raise NotImplementedError("allow_neg_eigval=True: beta in [0, 2) is not supported (beta = sigmoid(logits))")
    if return_intermediate_states:
        raise NotImplementedError("return_intermediate_states=True: the kernels keep chunk states on chip and "
                                  "do not return them")
    if cp_context is not None:
        raise NotImplementedError("cp_context: multi-device context parallelism is not supported (kda_aot splits "
                                  "long sequences on one device by itself, cp='auto')")


def _check_tensors(q, k, v, g, beta, initial_state) -> None:
    """FLA accepts these; the kernels do not, and converting would change the numerics."""
    for name, t in zip(_BF16_INPUTS, (q, k, v, g, beta)):
        if isinstance(t, torch.Tensor) and t.dtype != torch.bfloat16:
            raise NotImplementedError(f"{name}: dtype {t.dtype} is not supported; kda_aot takes bfloat16 "
                                      "(it casts nothing that would round)")
    for name, t in (("q", q), ("v", v)):
        if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[3] != D:
            raise NotImplementedError(f"{name}: head dim {t.shape[3]} is not supported; only K = V = 128")
    if isinstance(v, torch.Tensor) and isinstance(q, torch.Tensor) and v.dim() == 4 and q.dim() == 4 \
            and v.shape[2] != q.shape[2]:
        raise NotImplementedError(f"v: {v.shape[2]} value heads but q has {q.shape[2]} heads; grouped value "
                                  "attention (GVA, HV != H) is not supported")
    if initial_state is not None and initial_state.dtype not in (torch.float32, torch.bfloat16):
        raise NotImplementedError(f"initial_state: dtype {initial_state.dtype} is not supported; fp32 or bf16")


# At the end: kda_aot.torch imports this module at its own end, and either may be imported first.
from . import torch as _ops  # noqa: E402
