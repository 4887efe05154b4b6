"""kda-aot: Kimi Delta Attention prefill for NVIDIA Hopper, from ahead-of-time compiled kernels.

    o, final_state = kda_aot.prefill(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, ...)

Inputs are any DLPack tensors on a CUDA device (PyTorch, CuPy, JAX). No compiler, JIT or CuTe
DSL is needed at run time: the kernels ship compiled in kda_aot/_lib.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("kda-aot")  # single source: pyproject.toml
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

from .api import info, prefill  # noqa: E402
from .loader import CudaError, KdaError, LibraryNotFoundError  # noqa: E402

__all__ = ["prefill", "info", "CudaError", "KdaError", "LibraryNotFoundError", "__version__"]
