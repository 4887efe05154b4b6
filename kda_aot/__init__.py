"""kda-aot: Kimi Delta Attention prefill for NVIDIA Hopper, from ahead-of-time compiled kernels.

    o, final_state = kda_aot.prefill(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, ...)

Inputs are any DLPack tensors on a CUDA device (PyTorch, CuPy, JAX). No compiler, JIT or CuTe
DSL is needed at run time: the kernels ship compiled in kda_aot/_lib.
"""


def _version() -> str:
    """The version (single source: pyproject.toml), which the build manifest records beside the
    library. The prebuilt wheels are named per CUDA flavour (kda-aot-cu12, kda-aot-cu13; a source
    install is kda-aot: docs/wheels.md), so the manifest is read first, then the distributions."""
    import json
    from importlib import metadata
    from pathlib import Path

    try:
        return json.loads((Path(__file__).parent / "_lib" / "manifest.json").read_text())["package_version"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for name in ("kda-aot", "kda-aot-cu12", "kda-aot-cu13"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return "0+unknown"  # a source tree that was never installed


__version__ = _version()

from .api import empty_cache, info, prefill, workspace_size, workspace_size_for  # noqa: E402
from .cp_plan import CPPlan, NotSplittableError, plan_prefill  # noqa: E402
from .loader import CudaError, KdaError, LibraryNotFoundError  # noqa: E402

__all__ = ["prefill", "workspace_size", "workspace_size_for", "empty_cache", "info", "plan_prefill", "CPPlan", "NotSplittableError", "CudaError", "KdaError", "LibraryNotFoundError", "__version__"]
