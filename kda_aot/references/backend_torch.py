"""The torch array backend of the references (kda_aot/references/chunked.py): the few array
operations whose spelling differs between torch and NumPy, each as torch computes it.

Every name here has a twin in backend_numpy.py; the algorithm calls them through the module
(`xp.exp2(x)`), and uses Python operators, indexing and `.reshape` directly (both libraries agree
on those). Devices: `like` names the tensor whose device a new tensor goes to.
"""

from __future__ import annotations

import torch

F32, F64, BF16, I32, I64 = torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64

# Same names and positional arguments as NumPy's
from torch import (broadcast_to, exp, exp2, full_like, logaddexp, nextafter, sigmoid, sqrt,  # noqa: E402,F401
                   stack, swapaxes, tanh, tile, tril, where, zeros_like, empty_like)
from torch import cat as concatenate  # noqa: E402,F401
from torch.linalg import vector_norm as norm  # noqa: E402,F401


def cast(x, dtype, like=None):
    """x as `dtype`, on `like`'s device when given (the inputs are cast once, where they are)."""
    return x.to(dtype=dtype) if like is None else x.to(device=like.device, dtype=dtype)


def f64(x):
    """A tensor widened to float64; a Python number as it is (its arithmetic already is fp64)."""
    return x.double() if torch.is_tensor(x) else x


def f32(x):
    return x.float()


def bf(x):
    """bf(x) of docs/algorithm.md §2.4: fp32 -> bf16 round-to-nearest-even, kept in fp32."""
    return x.float().to(torch.bfloat16).float()


def rsqrt(x):
    """The exact fp32 stand-in for rsqrt.approx (the CPU cannot run the PTX approximation)."""
    return 1.0 / torch.sqrt(x)


def scalar(x: float, dtype, like):
    return torch.tensor(x, dtype=dtype, device=like.device)


def zeros(shape, dtype, like):
    return torch.zeros(shape, dtype=dtype, device=like.device)


def empty(shape, dtype, like):
    return torch.empty(shape, dtype=dtype, device=like.device)


def arange(n: int, like):
    return torch.arange(n, device=like.device)


def eye(n: int, dtype, like):
    return torch.eye(n, dtype=dtype, device=like.device)


def copy(x):
    return x.clone()


def int_list(x):
    """A 1-D integer tensor as a list of ints; None for any other rank."""
    return x.tolist() if x.dim() == 1 else None


def add_outer_(s, a, b):
    """s[x] += a[x] b[x]^T in place for every row x: one batched product of inner size 1."""
    s.baddbmm_(a[:, :, None], b[:, None, :])


def unit_lower_inverse(a):
    """a^-1 for unit lower triangular [..., n, n] a, by a triangular solve in a's dtype."""
    eye_ = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    return torch.linalg.solve_triangular(a, eye_.expand_as(a), upper=False, unitriangular=True)


def random(seed: int):
    """(randn, rand): fp32 N(0, 1) and U(0, 1) draws of the given size, on the CPU from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    return (lambda *size: torch.randn(*size, generator=gen)), (lambda *size: torch.rand(*size, generator=gen))


def index_array(values, dtype):
    return torch.tensor(values, dtype=dtype)


def to_device(x, device):
    return x.to(device) if torch.is_tensor(x) else x
