"""kda-aot: Kimi Delta Attention prefill for NVIDIA Hopper, from ahead-of-time compiled kernels.

    o, final_state = kda_aot.prefill(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, ...)

Inputs are any DLPack tensors on a CUDA device (PyTorch, CuPy, JAX). No compiler, JIT or CuTe
DSL is needed at run time: the kernels ship compiled in kda_aot/_lib.
"""


def _version() -> str:
    """The version from this package's own metadata (pyproject.toml in a source tree, else the
    installed distribution: kda-aot, kda-aot-cu12 or kda-aot-cu13), never from the build
    manifest, which the loader checks against it (identity.py)."""
    from .library.identity import package_version

    return package_version()


__version__ = _version()

from .api import Checkpoints, empty_cache, info, prefill, workspace_size, workspace_size_for  # noqa: E402
from .plan.cp_plan import CPPlan, NotSplittableError, plan_prefill  # noqa: E402
from .library.loader import CudaError, KdaError, LibraryNotFoundError  # noqa: E402

__all__ = ["prefill", "Checkpoints", "workspace_size", "workspace_size_for", "empty_cache", "info", "plan_prefill", "CPPlan", "NotSplittableError", "CudaError", "KdaError", "LibraryNotFoundError", "__version__"]
