"""The library's XLA FFI handler (kda_xla_prefill, build_kernels/shim/kda_xla.c) driven with hand-built
call frames (tests/xla_ffi.py), no XLA and no GPU: what it tells XLA at registration, and each
refusal before anything is launched. A program of no steps launches nothing, so the whole path of
a valid call runs here too. tests/gpu/test_jax_jit.py runs it under XLA on the device."""

import ctypes as C

import numpy as np
import pytest

import xla_ffi as ffi

from kda_aot.library.constants import WORKSPACE_ALIGN
from kda_aot.plan.program import N_INPUTS, SLOT


@pytest.fixture(scope="module")
def handler():
    from kda_aot.library.loader import KdaError, get_library

    try:
        lib = get_library()
    except (KdaError, OSError) as exc:
        pytest.skip(f"no kernel library: {exc}")
    return C.cast(lib.xla_handler(), ffi.HANDLER)


def _attrs(steps=(), slots=(), buffers=(SLOT["q"],), align=(15,), names="q"):
    return dict(steps=np.array(steps, np.int32).reshape(-1), slots=np.array(slots, np.int64).reshape(-1),
                inputs=np.array([N_INPUTS, SLOT["workspace"], WORKSPACE_ALIGN, SLOT["stream"]], np.int32),
                buffers=np.array(buffers, np.int32), align=np.array(align, np.int64), names=names)


def test_registration_reads_api_0_1_and_command_buffer_compatible(handler):
    frame, meta = ffi.metadata_frame()  # XLA's query passes no API table
    assert handler(C.byref(frame)) is None
    assert (meta.api_version.major, meta.api_version.minor, meta.traits) == (0, 1, 1)


def test_a_frame_older_than_api_0_1_is_refused_naming_the_jax_versions(handler):
    api = ffi.FakeApi()
    frame = ffi.frame(api, [(0x1000, (4,))], [], _attrs(), struct_size=ffi.FRAME_SIZE - 8)
    assert handler(C.byref(frame)) == 0x1234
    (code, message), = api.errors
    assert code == 9 and "XLA FFI API 0.1" in message and "JAX 0.5 or newer" in message


def test_attributes_that_are_not_prefills_are_refused(handler):
    api = ffi.FakeApi()
    attrs = _attrs()
    del attrs["steps"]
    assert handler(C.byref(ffi.frame(api, [(0x1000, (4,))], [], attrs))) == 0x1234
    (code, message), = api.errors
    assert code == 3 and "not kda_aot.jax.prefill's" in message
    api = ffi.FakeApi()  # one alignment per buffer, operands and results together
    assert handler(C.byref(ffi.frame(api, [(0x1000, (4,))], [(0x2000, (4,))], _attrs()))) == 0x1234
    assert "not kda_aot.jax.prefill's" in api.errors[0][1]


def test_a_misaligned_buffer_is_refused_naming_it(handler):
    api = ffi.FakeApi()
    frame = ffi.frame(api, [(0x1000, (4,)), (0x2008, (2, 3))], [],
                      _attrs(buffers=(SLOT["q"], SLOT["k"]), align=(15, 15), names="q,k"))
    assert handler(C.byref(frame)) == 0x1234
    (code, message), = api.errors
    assert code == 3 and message.startswith("kda_aot.jax: k: data pointer 0x2008 is not 16-byte aligned")
    api = ffi.FakeApi()  # an empty buffer's address is never read
    frame = ffi.frame(api, [(0x1000, (4,)), (0x2008, (0, 3))], [],
                      _attrs(buffers=(SLOT["q"], SLOT["k"]), align=(15, 15), names="q,k"))
    assert handler(C.byref(frame)) is None and api.errors == []


def test_a_valid_call_gets_xlas_stream_and_launches_its_program(handler):
    """No steps: the whole path runs (attributes, pointers, the workspace's alignment, the stream)
    and returns success without a launch."""
    api = ffi.FakeApi()
    frame = ffi.frame(api, [(0x1000, (4,))], [(0x3010, (WORKSPACE_ALIGN + 64,))],
                      _attrs(buffers=(SLOT["q"], SLOT["workspace"]), align=(15, 0), names="q,workspace"))
    assert handler(C.byref(frame)) is None and api.errors == []


def test_a_bad_program_is_refused_before_any_launch(handler):
    api = ffi.FakeApi()
    frame = ffi.frame(api, [(0x1000, (4,))], [], _attrs(steps=[[-1, 0, 0, 0]]))
    assert handler(C.byref(frame)) == 0x1234
    (code, message), = api.errors
    assert code == 13 and "kernel ?: CUDA error 1 (cudaErrorInvalidValue" in message
    api = ffi.FakeApi()  # a slot that names no input
    frame = ffi.frame(api, [(0x1000, (4,))], [], _attrs(steps=[[0, 0, 1, 0]], slots=[[N_INPUTS, 0]]))
    assert handler(C.byref(frame)) == 0x1234
    assert "CUDA error 1" in api.errors[0][1]
