"""NumPy references for KDA prefill: the float64 gold and the chunked algorithm, without torch.

kda_aot/references/chunked.py's algorithm (docs/algorithm.md §2) on NumPy arrays
(backend_numpy.py), so that the CPU tests and the demo's CPU path need no torch:

* `gold_prefill`: the per-token delta-rule recurrence in float64 with exact functions.
* `chunked_prefill(mode="exact")`: the CHUNK=16 algebra in float64, no rounding (equals the gold
  to ~1e-10).
* `chunked_prefill(mode="emulate")`: the same code with the rounding recipe (bf16 through
  ml_dtypes, round-to-nearest-even) at the recipe's points, with exact fp32 functions for the
  kernels' PTX approximations: a ~1-2 bf16-ulp emulation of the kernels, not a bitwise one
  (kda_aot.reference with the GPU's approximations is the bitwise reference). NumPy's fp32 exp2
  and tanh differ from torch's by an ulp here and there, so the two emulations agree to that.
* `chunked_prefill(mode="accurate")`: numerics="accurate" (docs/numerics.md).

Arrays follow the low-level API: token-major [B, T, H, 128] (bf16 as ml_dtypes.bfloat16), beta
logits [B, T, H], V-first states [N, H, V, K], optional packed int `cu_seqlens` (then B = 1).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

from ..library.constants import CHUNK, LOG2E, D  # noqa: F401  (public: the tests read them here)
from . import backend_numpy, chunked, inputs
from .backend_numpy import BF16, F32, F64  # noqa: F401
from .chunked import bind
from .rounding import L2_EPS  # noqa: F401

gold_prefill = bind(backend_numpy, chunked.gold_prefill)
chunked_prefill = bind(backend_numpy, chunked.chunked_prefill)
gate_log_decay = bind(backend_numpy, chunked.gate_log_decay)
beta_strength = bind(backend_numpy, chunked.beta_strength)
rel_rmse = bind(backend_numpy, inputs.rel_rmse)


def make_inputs(shape: Union[Tuple[int, int], Sequence[int]], H: int, seed: int,
                state: Optional[str] = None) -> dict:
    """Random inputs as keyword arguments of the references: a tuple (B, T) gives dense inputs, a
    list of lengths packed ones (B = 1, int32 cu_seqlens). q, k, v, g, beta logits ~ N(0, 1) in
    bf16; A_log, dt_bias ~ U(0, 1) fp32; lower_bound -5; initial_state ~ 0.1 N(0, 1) in `state`
    ("bf16" | "fp32") or None. NumPy's generator: not the same values as reference.make_inputs."""
    return inputs.make_inputs(backend_numpy, shape, H, seed, state=state)
