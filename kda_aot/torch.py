"""KDA prefill for PyTorch: the operators, FLA's chunk_kda, FlashKDA's fwd, and FLA's backend registry.

    import kda_aot.torch            # registers the ops (plain `import kda_aot` never imports torch)
    o, final = kda_aot.torch.prefill(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, ...)
    o, final = kda_aot.torch.chunk_kda(q, k, v, g, beta, ...)   # FLA's chunk_kda, drop-in

Importing this module registers:
  - torch.ops.kda_aot.prefill / prefill_out / prefill_pool (kda_aot/_torch_ops.py), with
    `prefill` their Python face (kda_aot.prefill's arguments);
  - torch.ops.kda_aot.flashkda_fwd, FlashKDA's fwd as an operator (kda_aot/flashkda_compat.py;
    `kda_aot.flashkda_compat.fwd` is FlashKDA's Python call);
  - kda-aot as a backend of FLA's `fla.ops.kda.chunk_kda` when fla is installed
    (kda_aot/fla_backend.py; FLA_KDA_AOT=0 turns it off). Without fla nothing is imported or
    registered there.
"""

# The torch releases this module is tested with (README.md, "Install"): the H200 machine's
# 2.11.0+cu130, which the GPU scripts use (docs/bench/h200.json records it), and the 2.13.0 that
# ci/venv.sh pins for the CPU tests.
TESTED_TORCH = "2.11.0+cu130 (the GPU tests and the benchmark, on an H200) and 2.13.0 (the CPU tests)"

try:
    import torch as _torch  # noqa: F401  (the top-level torch: this file is kda_aot.torch)
except ImportError as _exc:
    # Without this, the first line a user reads is a bare "No module named 'torch'" from deep inside.
    raise ImportError(
        f"kda_aot.torch needs PyTorch, which is not importable here ({_exc}). It is tested with torch "
        f"{TESTED_TORCH}; install a CUDA build of torch. Plain `import kda_aot` works without torch, "
        "and kda_aot.prefill also takes CuPy and JAX arrays (docs/frameworks.md)."
    ) from _exc

from ._torch_ops import PREFILL, PREFILL_OUT, PREFILL_POOL, prefill
from .fla_compat import chunk_kda
from .flashkda_compat import FLASHKDA_FWD
from . import fla_backend as _fla_backend

_fla_backend.register_if_installed()

__all__ = ["prefill", "chunk_kda", "PREFILL", "PREFILL_OUT", "PREFILL_POOL", "FLASHKDA_FWD"]
