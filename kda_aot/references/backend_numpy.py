"""The NumPy array backend of the references (kda_aot/references/chunked.py): backend_torch.py's
operations as NumPy computes them, with bf16 from ml_dtypes (round-to-nearest-even), so that the
CPU tests and the demo's CPU path run the references without torch. `like` (a device in torch) is
accepted and unused: NumPy arrays live on the host.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32, F64, I32, I64 = np.float32, np.float64, np.int32, np.int64
BF16 = np.dtype(ml_dtypes.bfloat16)

# Same names and positional arguments as torch's
from numpy import (broadcast_to, concatenate, empty_like, exp, exp2, full_like, logaddexp,  # noqa: E402,F401
                   nextafter, sqrt, stack, swapaxes, tanh, tile, tril, where, zeros_like)
from numpy.linalg import norm  # noqa: E402,F401


def cast(x, dtype, like=None):
    return np.asarray(x).astype(dtype)


def f64(x):
    return np.asarray(x, F64)


def f32(x):
    return np.asarray(x, F32)


def bf(x):
    """bf(x) of docs/algorithm.md §2.4: fp32 -> bf16 (RNE) -> fp32."""
    return np.asarray(x, F32).astype(BF16).astype(F32)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def rsqrt(x):
    """The exact fp32 stand-in for rsqrt.approx."""
    return F32(1.0) / np.sqrt(x)


def scalar(x: float, dtype, like=None):
    return np.asarray(x, dtype)


def zeros(shape, dtype, like=None):
    return np.zeros(shape, dtype)


def empty(shape, dtype, like=None):
    return np.empty(shape, dtype)


def arange(n: int, like=None):
    return np.arange(n)


def eye(n: int, dtype, like=None):
    return np.eye(n, dtype=dtype)


def copy(x):
    return x.copy()


def int_list(x):
    """A 1-D integer array (or sequence) as a list of ints; None for any other rank."""
    x = np.asarray(x)
    return [int(c) for c in x.tolist()] if x.ndim == 1 else None


def add_outer_(s, a, b):
    """s[x] += a[x] b[x]^T in place for every row x."""
    s += a[:, :, None] * b[:, None, :]


def unit_lower_inverse(a):
    """a^-1 for unit lower triangular [..., n, n] a."""
    return np.linalg.inv(a)


def random(seed: int):
    """(randn, rand): fp32 N(0, 1) and U(0, 1) draws of the given size from `seed` (NumPy's
    generator: not the values backend_torch.random draws)."""
    rng = np.random.default_rng(seed)
    return (lambda *size: rng.standard_normal(size, dtype=F32)), (lambda *size: rng.random(size, dtype=F32))


def index_array(values, dtype):
    return np.asarray(values, dtype)


def to_device(x, device):
    return x
