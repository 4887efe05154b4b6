"""kda-aot as a backend of FLA's `fla.ops.kda.chunk_kda` (fla-core 0.6.0's backend registry).

`import kda_aot.torch` calls `register_if_installed()`: when fla is importable, it imports FLA's
registry (`fla.backends`) and `fla.ops.kda.chunk`, and registers `KdaAotBackend` for `chunk_kda`,
the way FLA registers its FlashKDA backend. Then FLA's own entry points (`fla.ops.kda.chunk_kda`,
`fla.layers.KimiDeltaAttention`, `fla.models.KDAForCausalLM`) run kda-aot's kernels for every call
the verifier accepts and FLA's Triton kernels for the rest. Without fla nothing is imported and
nothing fails; plain `import kda_aot` never imports this module (nor torch, nor fla).

What the verifier (`verify`) accepts is exactly what kda_aot.torch.chunk_kda computes:
autograd off (torch.no_grad / torch.inference_mode, as FLA's FlashKDA backend requires: there is
no backward), CUDA tensors on a compute-capability 9.x device that the library runs on, bf16 q,
k, v with K = V = 128 and as many value heads as q heads (no GVA), g bf16 (or fp32 for
use_gate_in_kernel=False), beta bf16 or fp32, use_qk_l2norm_in_kernel=True, every combination of
the gate and beta flags that fla_compat.fla_forms maps, no cp_context, no
return_intermediate_states, no keyword argument FLA's chunk_kda does not read. Everything else is
declined, with the reason FLA logs, and FLA runs its own kernels.

Priority 2, ahead of FlashKDA's backend (3; lower runs first). Every call FlashKDA's verifier
accepts on sm_90 is one this verifier accepts too (FlashKDA's configuration is gate="safe",
beta logits), and there kda-aot's serial plans return FlashKDA's bits and are faster on the H200
(docs/benchmarks.md; most on long sequences with few heads, where kda-aot also splits sequences
across SMs, within the context-parallel error bound instead of bitwise). Importing kda_aot.torch is the opt-in. FlashKDA keeps every device that is not
sm_90, which this verifier declines. `FLA_KDA_AOT=0` disables this backend (FLA's convention, read
on every call like `FLA_FLASH_KDA`), which hands those calls back to FlashKDA or FLA's Triton path.
"""

import importlib.util
import warnings
from typing import Any, Optional, Tuple

import torch

from .library.constants import D
from .fla_compat import KNOWN_KWARGS, PARAM_DTYPES, check_tensors, fla_forms, run

ENV_VAR = "FLA_KDA_AOT"
BACKEND_TYPE = "kda_aot"
PRIORITY = 2
FLASH_KDA_PRIORITY = 3  # fla/ops/kda/backends/flash_kda.py in fla-core 0.6.0

# The registered backend class (a subclass of FLA's BaseBackend), once register_if_installed succeeded.
BACKEND: Optional[type] = None


def register_if_installed() -> bool:
    """Register KdaAotBackend with FLA's chunk_kda when fla is installed; True when registered.

    fla absent: False, nothing imported. fla installed but failing to import (or too old to have
    the backend registry): a RuntimeWarning naming the error, and False.
    """
    global BACKEND
    if BACKEND is not None:
        return True
    if importlib.util.find_spec("fla") is None:
        return False
    try:
        from fla.backends import BaseBackend, register
        from fla.ops.kda.chunk import chunk_kda as fla_chunk_kda
    except Exception as exc:  # noqa: BLE001 - a broken fla must not break `import kda_aot.torch`
        warnings.warn(f"kda_aot.torch: fla is installed but importing its backend registry failed "
                      f"({type(exc).__name__}: {exc}); kda-aot is not registered as an FLA backend",
                      RuntimeWarning, stacklevel=3)
        return False
    cls = _backend_class(BaseBackend)
    register(fla_chunk_kda)(cls)
    BACKEND = cls
    return True


def _backend_class(BaseBackend: type) -> type:
    """KdaAotBackend, built on the installed fla's BaseBackend (which is only importable with fla)."""

    class KdaAotBackend(BaseBackend):
        """kda-aot's CuTe DSL kernels, compiled ahead of time (kda_aot/fla_backend.py says what it
        accepts and why it runs before FlashKDA). Inference only; disable with FLA_KDA_AOT=0."""

        backend_type = BACKEND_TYPE
        package_name = "kda_aot"
        env_var = ENV_VAR
        default_enable = True
        priority = PRIORITY

        def chunk_kda_verifier(self, *args, **kwargs) -> Tuple[bool, Optional[str]]:
            return verify(*args, **kwargs)

        def chunk_kda(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                      use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                      allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
                      return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                      cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
            # kda_aot.torch.chunk_kda without its dtype checks: FLA calls this right after the verifier
            return run(False, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                       use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
                       return_intermediate_states, state_v_first, cu_seqlens, cu_seqlens_cpu, cp_context,
                       max_num_seqs, kwargs)

    return KdaAotBackend


# ---------------------------------------------------------------------------------------------
# the verifier

_MISSING = object()
_DEVICES: dict = {}  # CUDA device index -> None (kda-aot runs there) or the reason it does not


def device_refusal(t) -> Optional[str]:
    """None when `t` is on a CUDA device kda-aot's kernels run on, else why not (cached per device:
    the capability and the library do not change within a process)."""
    if not t.is_cuda:
        return f"kda-aot runs on CUDA tensors, got q on {t.device}"
    index = t.get_device()
    reason = _DEVICES.get(index, _MISSING)
    if reason is _MISSING:
        reason = _DEVICES[index] = _probe(index)
    return reason


def _probe(index: int) -> Optional[str]:
    major, minor = torch.cuda.get_device_capability(index)
    if major != 9:
        return f"kda-aot's kernels are built for sm_90a; cuda:{index} is sm_{major}{minor}"
    from .library.loader import KdaError, get_library

    try:
        get_library()
    except (KdaError, OSError) as exc:
        return f"kda-aot's library does not load: {exc}"
    return None


def verify(q: Any, k: Any, v: Any, g: Any, beta: Any, scale: Optional[float] = None, initial_state: Any = None,
           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
           use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False, safe_gate: bool = False,
           lower_bound: Optional[float] = None, disable_recompute: bool = False,
           return_intermediate_states: bool = False, state_v_first: bool = False, cu_seqlens: Any = None,
           cu_seqlens_cpu: Any = None, cp_context: Any = None, use_graph: bool = False,
           max_num_seqs: Optional[int] = None, **kwargs: Any) -> Tuple[bool, Optional[str]]:
    """(True, None) when kda_aot.torch.chunk_kda computes this chunk_kda call, else (False, reason).

    FLA's signature, so FLA's dispatcher passes its arguments as the caller gave them."""
    if torch.is_grad_enabled():
        return False, "kda-aot has no backward: it runs under torch.no_grad() or torch.inference_mode() only"
    if not KNOWN_KWARGS.issuperset(kwargs):
        unknown = sorted(set(kwargs) - KNOWN_KWARGS)
        return False, f"{', '.join(unknown)}: not an option kda-aot's chunk_kda supports"
    if "chunk_size" in kwargs and kwargs["chunk_size"] not in (32, 64):
        return False, "chunk_size: must be 32 or 64"
    try:
        gate, _, A_log, dt_bias, _ = fla_forms(
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
            use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
            safe_gate=safe_gate, lower_bound=lower_bound, A_log=kwargs.get("A_log"), dt_bias=kwargs.get("dt_bias"),
            return_intermediate_states=return_intermediate_states, cp_context=cp_context)
        if q.dim() != 4:
            return False, f"q: expected [B, T, H, K], got {q.dim()} dimensions"
        check_tensors(q, k, v, g, beta, initial_state, gate)
    except (NotImplementedError, ValueError) as exc:
        return False, str(exc)
    H = q.shape[2]
    if A_log is not None and (A_log.shape != (H,) or A_log.dtype not in PARAM_DTYPES):
        return False, f"A_log: kda-aot takes [H] fp32, bf16 or fp16, got {tuple(A_log.shape)} {A_log.dtype}"
    if dt_bias is not None and (dt_bias.shape not in ((H * D,), (H, D)) or dt_bias.dtype not in PARAM_DTYPES):
        return False, (f"dt_bias: kda-aot takes [H*128] or [H, 128] fp32, bf16 or fp16, got {tuple(dt_bias.shape)} "
                       f"{dt_bias.dtype}")
    if max_num_seqs is not None and cu_seqlens is not None and max_num_seqs != cu_seqlens.shape[0] - 1:
        return False, "max_num_seqs: does not match cu_seqlens"
    reason = device_refusal(q)
    return (reason is None), reason
