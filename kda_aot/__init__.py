"""kda-aot: Kimi Delta Attention prefill for NVIDIA Hopper, from ahead-of-time compiled kernels.

    o, final_state = kda_aot.prefill(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, ...)

Inputs are any DLPack tensors on a CUDA device (PyTorch, CuPy, JAX). No compiler, JIT or CuTe
DSL is needed at run time: the kernels ship compiled in kda_aot/_lib.
"""

from ._version import __version__
from .api import Checkpoints, empty_cache, info, prefill, workspace_size, workspace_size_for
from .plan.cp_plan import CPPlan, NotSplittableError, plan_prefill
from .library.loader import CudaError, KdaError, LibraryNotFoundError

__all__ = ["prefill", "Checkpoints", "workspace_size", "workspace_size_for", "empty_cache", "info", "plan_prefill", "CPPlan", "NotSplittableError", "CudaError", "KdaError", "LibraryNotFoundError", "__version__"]
