"""Shared fixtures: GPU tests skip cleanly where there is no usable Hopper GPU."""

import functools
import os
import sys

import pytest

# The shared helpers (gold_cases, recording, state_buffers, torch_stand_ins, cp_twins, ...) sit beside
# this file; the tests in tests/cpu, tests/gpu and tests/build import them by name.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# JAX takes 75% of the GPU's memory when it first uses it unless told otherwise; the JAX tests share
# the device with torch and the library (tests/test_frameworks_*.py).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _hypothesis_storage_in_the_environment():
    """Hypothesis keeps its example database and caches in ./.hypothesis, and the test scripts run
    from /tmp (to import the installed package): they go inside the interpreter's environment
    (the venv running the tests) instead, unless HYPOTHESIS_STORAGE_DIRECTORY names a place."""
    try:
        from hypothesis.configuration import set_hypothesis_home_dir
    except ImportError:  # no hypothesis: tests/cpu/test_wall_properties.py skips
        return
    set_hypothesis_home_dir(os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY")
                            or os.path.join(sys.prefix, ".hypothesis"))


_hypothesis_storage_in_the_environment()


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
    from kda_aot.library.loader import KdaError, get_library

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


@pytest.fixture(scope="session")
def gpu_approx():
    """The kernels' PTX approximations and tensor-core products for the GPU reference's `approx=`."""
    from kda_aot.library.loader import get_library
    from kda_aot.reference import KernelApprox

    return KernelApprox(get_library())


@pytest.fixture
def no_cuda_driver():
    """Skips where a CUDA driver is installed: for the tests of what a machine without one sees."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("libcuda.so.1 loads here: a driver is installed")
    except OSError:
        pass
    if ctypes.util.find_library("cuda"):
        pytest.skip("a libcuda is known to ldconfig here")
