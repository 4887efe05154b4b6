"""Callers that are not torch, on the CPU: the DLPack export kda_aot hands JAX its outputs with
(exercised here on host memory, whose struct and ownership rules are the same), the DLPack stream
numbers, and JAX's refusals (tracers, immutable outputs), with JAX on the CPU where installed."""

import gc

import numpy as np
import pytest

import kda_aot
from kda_aot.intake import frameworks
from kda_aot.intake.dlpack_export import KDL_CPU, KDL_CUDA, DLPackExport, live_exports
from kda_aot.intake.tensors import describe


def _export(a, **kw):
    return DLPackExport(a.ctypes.data, a.shape, str(a.dtype), (KDL_CPU, 0), a, **kw)


def test_export_round_trip_and_the_deleter_runs_when_the_consumer_lets_go():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) * 1.5
    released = []
    before = live_exports()
    b = np.from_dlpack(_export(a, on_release=released.append))
    assert b.shape == (2, 3, 4) and b.dtype == np.float32 and b.ctypes.data == a.ctypes.data
    np.testing.assert_array_equal(b, a)
    assert live_exports() == before + 1 and released == []
    del b
    gc.collect()
    assert live_exports() == before and len(released) == 1 and released[0] is a


def test_an_unconsumed_capsule_frees_itself():
    a = np.ones(5, dtype=np.int32)
    released = []
    capsule = _export(a, on_release=released.append).__dlpack__()
    del capsule
    gc.collect()
    assert len(released) == 1


def test_an_export_is_taken_once():
    a = np.ones(3, dtype=np.float32)
    e = _export(a)
    b = np.from_dlpack(e)
    with pytest.raises(BufferError, match="already taken"):
        np.from_dlpack(e)
    del b


def test_read_only_export_is_versioned_and_read_only():
    a = np.ones((2, 2), dtype=np.float32)
    b = np.from_dlpack(_export(a, readonly=True))
    assert not b.flags.writeable
    assert describe(_export(a, readonly=True), "out").readonly is True
    assert describe(_export(a), "out").readonly is False
    with pytest.raises(BufferError, match="read-only export needs"):
        _export(a, readonly=True).__dlpack__()  # unversioned: cannot say read-only


def test_copy_and_other_devices_are_refused():
    a = np.ones(3, dtype=np.float32)
    with pytest.raises(BufferError, match="copy=True"):
        _export(a).__dlpack__(copy=True)
    with pytest.raises(BufferError, match="no copy"):
        _export(a).__dlpack__(dl_device=(KDL_CUDA, 0))


def test_bfloat16_export_is_read_as_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)
    d = describe(_export(a), "x")
    assert d.dtype == "bfloat16" and d.shape == (6,) and d.ptr == a.ctypes.data


def test_consumer_streams_follow_the_dlpack_numbers():
    # DLPack: 1 is the legacy default stream, 0 is not allowed, -1 asks for no ordering.
    assert frameworks.consumer_stream(0) == 1
    assert frameworks.consumer_stream(None) == -1
    assert frameworks.consumer_stream(0x7F00DEAD) == 0x7F00DEAD


def test_ready_is_asked_for_device_exports_with_a_stream_only():
    a = np.ones(3, dtype=np.float32)
    asked = []
    cpu = _export(a, ready=asked.append)
    del cpu  # never taken
    dev = DLPackExport(a.ctypes.data, a.shape, "float32", (KDL_CUDA, 0), a, ready=asked.append)
    capsule = dev.__dlpack__(stream=0x1234)
    assert asked == [0x1234]
    none = DLPackExport(a.ctypes.data, a.shape, "float32", (KDL_CUDA, 0), a, ready=asked.append)
    capsule2 = none.__dlpack__(stream=-1)
    assert asked == [0x1234]
    del capsule, capsule2
    gc.collect()


# ---------------------------------------------------------------------------------------------
# JAX (on the CPU here; tests/gpu/test_frameworks.py runs it on the device)

def _jax_inputs(jax, T=32, H=2):
    """Arrays on JAX's CPU device (also where JAX sees a GPU)."""
    jnp, cpu = jax.numpy, jax.devices("cpu")[0]
    rng = np.random.default_rng(0)

    def put(a, dtype):
        return jax.device_put(jnp.asarray(a, dtype=dtype), cpu)

    def bf(*shape):
        return put(rng.standard_normal(shape, dtype=np.float32), jnp.bfloat16)

    return dict(q=bf(1, T, H, 128), k=bf(1, T, H, 128), v=bf(1, T, H, 128), g=bf(1, T, H, 128), beta=bf(1, T, H),
                A_log=put(np.ones(H), jnp.float32), dt_bias=put(np.ones((H, 128)), jnp.float32))


def _call(x, **kw):
    return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"], **kw)


def test_jax_tracer_is_refused_naming_it():
    jax = pytest.importorskip("jax")
    x = _jax_inputs(jax)

    def traced(q):
        return _call({**x, "q": q})[0]

    with pytest.raises(TypeError, match=r"^q: a JAX tracer .*kda_aot\.jax\.prefill.*outside jit"):
        jax.jit(traced)(x["q"])

    def traced_state(g):
        return _call({**x, "g": g})[0]

    with pytest.raises(TypeError, match=r"^g: a JAX tracer"):
        jax.jit(traced_state)(x["g"])


@pytest.mark.parametrize("name", ["out", "final_state", "workspace"])
def test_jax_array_as_output_is_refused_naming_it(name):
    jax = pytest.importorskip("jax")
    x = _jax_inputs(jax)
    buf = jax.device_put(jax.numpy.zeros((1, 32, 2, 128), jax.numpy.bfloat16), jax.devices("cpu")[0])
    with pytest.raises(TypeError, match=rf"^{name}: a JAX array is immutable"):
        _call(x, output_final_state=True, **{name: buf})


def test_jax_cpu_arrays_are_refused_naming_q():
    jax = pytest.importorskip("jax")
    x = _jax_inputs(jax)
    with pytest.raises(TypeError, match=r"^q: "):
        _call(x)
