"""Shared fixtures: GPU tests skip cleanly where there is no usable Hopper GPU."""

import functools
import os

import pytest

# JAX takes 75% of the GPU's memory when it first uses it unless told otherwise; the JAX tests share
# the device with torch and the library (tests/test_frameworks_*.py).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


@functools.lru_cache(maxsize=None)
def gpu_unavailable_reason():
    """None when a CUDA device of compute capability 9.x is usable by both torch and kda_aot."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    major, _ = torch.cuda.get_device_capability()
    if major != 9:
        return f"kernels are built for sm_90a; this device is sm_{major}x"
    from kda_aot.loader import KdaError, get_library

    try:
        if get_library().device_count() == 0:
            return "kda_aot library sees no device"
    except (KdaError, OSError) as exc:
        return f"kda_aot library unusable: {exc}"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            reason = gpu_unavailable_reason()
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))


class GpuApprox:
    """The PTX approximations the kernels use (ex2.approx.ftz, tanh.approx, rsqrt.approx.ftz),
    run by the library's approx_* test kernels, for the GPU reference (reference.py `approx=`)."""

    def __init__(self, lib):
        self.lib = lib

    def _apply(self, name, x):
        import torch

        x32 = x.float().contiguous()
        y = torch.empty_like(x32)
        if x32.numel():
            self.lib.kernel(name)(x32.data_ptr(), y.data_ptr(), x32.numel(), torch.cuda.current_stream().cuda_stream)
        return y

    def ex2(self, x):
        return self._apply("approx_ex2", x)

    def tanh(self, x):
        return self._apply("approx_tanh", x)

    def rsqrt(self, x):
        return self._apply("approx_rsqrt", x)

    def mm(self, a, b):
        """acc32(a @ b) on tensor cores (fp32 accumulate), like the kernels' mma.sync, for operands
        that are exactly bf16 (or else fp16) values; falls back to fp64 accumulation."""
        import torch

        def exact_in(t, dt):
            return torch.equal(t.to(dt).float(), t.float())

        dt = torch.bfloat16 if exact_in(a, torch.bfloat16) and exact_in(b, torch.bfloat16) else torch.float16
        shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a3 = a.to(dt).expand(*shape, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
        b3 = b.to(dt).expand(*shape, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
        try:
            out = torch.bmm(a3, b3, out_dtype=torch.float32)
        except (TypeError, RuntimeError):
            return (a.double() @ b.double()).float()
        return out.reshape(*shape, a.shape[-2], b.shape[-1])


@pytest.fixture(scope="session")
def gpu_approx():
    from kda_aot.loader import get_library

    return GpuApprox(get_library())
