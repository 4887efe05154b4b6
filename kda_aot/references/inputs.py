"""Random inputs for the references and the error metric they are judged by, over an array backend
`xp` (backend_torch or backend_numpy), bound by kda_aot.reference and reference_np.py."""

from __future__ import annotations

import itertools
from typing import Optional, Sequence, Tuple, Union

from ..library.constants import D


def rel_rmse(xp, a, b) -> float:
    """||a - b||_2 / (||b||_2 + 1e-8) in float64, b the reference (§5.1 err_ratio)."""
    a, b = xp.f64(a), xp.f64(b)
    return float(xp.norm(a - b) / (xp.norm(b) + 1e-8))


def make_inputs(xp, shape: Union[Tuple[int, int], Sequence[int]], H: int, seed: int, device="cpu",
                state: Optional[str] = None, g_mean: float = 0.0, lower_bound: float = -5.0) -> dict:
    """Realistic random inputs as keyword arguments of the references.

    `shape`: a tuple (B, T) gives dense inputs; a list of sequence lengths gives packed varlen
    inputs (B = 1, int32 cu_seqlens). q, k, v, g and beta logits ~ N(0, 1) in bf16 (FK/CL test
    practice, §5.2); A_log, dt_bias ~ U(0, 1) fp32; lower_bound -5; initial_state ~ 0.1 N(0, 1)
    in `state` dtype ("bf16" | "fp32") or None. Drawn on the CPU from `seed` by the backend's
    generator (torch's and NumPy's draw different values), then moved to `device` (torch), so the
    values do not depend on the device.

    Long-memory classes (docs/numerics.md): `g_mean` shifts the gates to N(g_mean, 1) (-8: weak
    decay through the gate's sigmoid), `lower_bound` -0.05 decays weakly whatever g is.
    """
    if isinstance(shape, tuple):
        B, T = shape
        n, cu = B, None
    else:
        lens = [int(x) for x in shape]
        B, T, n = 1, sum(lens), len(lens)
        cu = xp.index_array(list(itertools.accumulate(lens, initial=0)), xp.I32)
    randn, rand = xp.random(seed)

    def bf16(x):
        return xp.cast(x, xp.BF16)

    out = dict(
        q=bf16(randn(B, T, H, D)), k=bf16(randn(B, T, H, D)),
        v=bf16(randn(B, T, H, D)), g=bf16(randn(B, T, H, D) + g_mean),
        beta=bf16(randn(B, T, H)),
        A_log=rand(H), dt_bias=rand(H, D), lower_bound=float(lower_bound), scale=D ** -0.5,
        initial_state=None, cu_seqlens=cu,
    )
    if state is not None:
        dtypes = {"bf16": xp.BF16, "fp32": xp.F32}
        if state not in dtypes:
            raise ValueError(f"state must be None, 'bf16' or 'fp32', got {state!r}")
        out["initial_state"] = xp.cast(randn(n, H, D, D) * 0.1, dtypes[state])
    return {key: xp.to_device(val, device) for key, val in out.items()}
