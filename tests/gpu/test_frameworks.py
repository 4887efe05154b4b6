"""CuPy and JAX callers on the device (docs/frameworks.md), against the torch path on the same data.

Every call gets fresh arrays copied from the host copy of the torch inputs; results must equal the
torch path's bit for bit (the same kernels on the same bits). Each framework skips cleanly where it
is not installed or does not see the GPU.
"""

import gc
import struct
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
torch = pytest.importorskip("torch")

LENS, H = [300, 17, 0, 1000], 4


def _host(t):
    """A torch tensor's bits as a numpy array (bf16 through ml_dtypes)."""
    import ml_dtypes

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _torch_case(seed):
    import kda_aot
    from kda_aot import reference

    x = reference.make_inputs(LENS, H, seed=seed, device="cuda", state="fp32")
    o, s = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                           lower_bound=x["lower_bound"], initial_state=x["initial_state"], output_final_state=True,
                           cu_seqlens=x["cu_seqlens"])
    torch.cuda.synchronize()
    host = {k: _host(v) for k, v in x.items() if torch.is_tensor(v)}
    return host, x["lower_bound"], _host(o), _host(s)


def _call(x, lower_bound, **kw):
    import kda_aot

    return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                           lower_bound=lower_bound, initial_state=x["initial_state"], output_final_state=True,
                           cu_seqlens=x["cu_seqlens"], **kw)


def _same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return (a.shape == b.shape and str(a.dtype) == str(b.dtype) and a.itemsize == b.itemsize
            and a.tobytes() == b.tobytes())


@pytest.fixture
def launches(monkeypatch):
    """The stream handle of every program run (the last of kda_run's packed pointers)."""
    from kda_aot.plan import program

    seen, run = [], program.Program.run

    def spy(self, inputs):
        seen.append(struct.unpack("<Q", inputs[-8:])[0])
        return run(self, inputs)

    monkeypatch.setattr(program.Program, "run", spy)
    return seen


# ---------------------------------------------------------------------------------------------
# CuPy

@pytest.fixture(scope="module")
def cupy():
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"cupy cannot use the GPU: {exc}")
    return cupy


def test_cupy_in_cupy_out_on_cupys_current_stream(cupy, launches):
    """Fresh CuPy arrays each call, on a non-default CuPy stream made current, queued behind a
    long kernel on that stream: prefill runs on that stream without waiting, returns CuPy arrays,
    and equals the torch path bit for bit."""
    for seed in (1, 2):
        host, lb, want_o, want_s = _torch_case(seed)
        staged = {k: cupy.asarray(v) for k, v in host.items()}
        # CuPy loads its copy kernel's module on first use, which may wait for the whole context
        # (the sleep below included): copy once before it, so the check below is about prefill
        {k: v.copy() for k, v in staged.items()}
        cupy.cuda.get_current_stream().synchronize()
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
                torch.cuda._sleep(int(2e8))  # ~0.1 s of GPU time on CuPy's stream
            x = {k: v.copy() for k, v in staged.items()}  # fresh arrays, written on the stream after the sleep
            o, s = _call(x, lb)
            assert not stream.done, "prefill waited for the GPU (a host sync)"
        assert launches[-1] == stream.ptr
        stream.synchronize()
        assert isinstance(o, cupy.ndarray) and isinstance(s, cupy.ndarray)
        assert _same_bits(cupy.asnumpy(o), want_o) and _same_bits(cupy.asnumpy(s), want_s)


def test_cupy_out_in_place_and_explicit_stream(cupy, launches):
    host, lb, want_o, want_s = _torch_case(3)
    x = {k: cupy.asarray(v) for k, v in host.items()}
    out = cupy.asarray(np.full(want_o.shape, np.nan, dtype=np.float32).astype(want_o.dtype))  # poisoned
    fs = cupy.full(want_s.shape, np.nan, dtype=np.float32)
    side = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.get_current_stream().synchronize()
    o, s = _call(x, lb, out=out, final_state=fs, stream=side)
    assert launches[-1] == side.ptr and o is out and s is fs
    side.synchronize()
    assert _same_bits(cupy.asnumpy(out), want_o) and _same_bits(cupy.asnumpy(fs), want_s)
    # outputs allocated by CuPy on the explicit stream (not CuPy's current one)
    o, s = _call(x, lb, stream=side)
    assert launches[-1] == side.ptr and isinstance(o, cupy.ndarray)
    side.synchronize()
    assert _same_bits(cupy.asnumpy(o), want_o) and _same_bits(cupy.asnumpy(s), want_s)


def test_cupy_arena_keeps_one_workspace_per_stream(cupy):
    """Callers without torch get their workspace from the arena, one buffer per (device, stream):
    two CuPy streams used in turn each keep theirs, and both give the torch path's bits."""
    from kda_aot.plan.workspace import ARENA

    host, lb, want_o, want_s = _torch_case(4)
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    results = []
    for _ in range(2):
        for st in streams:
            with st:
                x = {k: cupy.asarray(v) for k, v in host.items()}
                results.append((st, _call(x, lb)))
    keys = {key for key in ARENA._buffers}
    assert {(0, st.ptr) for st in streams} <= keys
    for st, (o, s) in results:
        st.synchronize()
        assert _same_bits(cupy.asnumpy(o), want_o) and _same_bits(cupy.asnumpy(s), want_s)


def test_cupy_streams_destroyed_before_the_arena_is_freed(cupy):
    """Arena buffers of CuPy streams that no longer exist are freed safely (they used to be freed
    on their own, destroyed, stream: a crash), and a new stream works after them."""
    import kda_aot

    host, lb, want_o, want_s = _torch_case(12)
    for _ in range(3):
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            _call({k: cupy.asarray(v) for k, v in host.items()}, lb)
        stream.synchronize()
        del stream
        gc.collect()
    kda_aot.empty_cache()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        o, s = _call({k: cupy.asarray(v) for k, v in host.items()}, lb)
    stream.synchronize()
    assert _same_bits(cupy.asnumpy(o), want_o) and _same_bits(cupy.asnumpy(s), want_s)
    kda_aot.empty_cache()


# ---------------------------------------------------------------------------------------------
# read-only outputs (a DLPack 1.0 producer's flag)

@pytest.mark.parametrize("name", ["out", "final_state"])
def test_read_only_output_is_refused_and_left_untouched(name):
    from kda_aot import reference
    from kda_aot.intake.dlpack_export import KDL_CUDA, DLPackExport

    x = reference.make_inputs(LENS, H, seed=5, device="cuda", state="fp32")
    n = len(LENS)
    buffers = dict(out=torch.full_like(x["q"], float("nan")),
                   final_state=torch.full((n, H, 128, 128), float("nan"), device="cuda"))
    target = buffers[name]
    dtype = "bfloat16" if target.dtype == torch.bfloat16 else "float32"
    ro = DLPackExport(target.data_ptr(), tuple(target.shape), dtype, (KDL_CUDA, target.get_device()), target,
                      readonly=True)
    args = dict(buffers, **{name: ro})
    with pytest.raises(ValueError, match=rf"^{name}: the producer marked this tensor read-only"):
        _call(x, x["lower_bound"], **args)
    torch.cuda.synchronize()
    assert torch.isnan(target.float()).all()  # nothing was written


# ---------------------------------------------------------------------------------------------
# JAX

@pytest.fixture(scope="module")
def jax():
    jax = pytest.importorskip("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as exc:
        pytest.skip(f"JAX sees no GPU: {exc}")
    if not gpus:
        pytest.skip("JAX sees no GPU")
    return jax


def _jax_inputs(jax, host):
    return {k: jax.device_put(v, jax.devices("gpu")[0]) for k, v in host.items()}


def test_jax_in_jax_out_equals_the_torch_path(jax, launches):
    from kda_aot.intake import dlpack_export
    from kda_aot.intake.stream_check import stream_device

    streams = []
    for seed in (6, 7):
        host, lb, want_o, want_s = _torch_case(seed)
        x = _jax_inputs(jax, host)  # fresh arrays every call
        o, s = _call(x, lb)
        assert isinstance(o, jax.Array) and isinstance(s, jax.Array)
        assert o.dtype == jax.numpy.bfloat16 and s.dtype == jax.numpy.float32
        streams.append(launches[-1])
        # A JAX computation on the outputs is ordered after the kernels (DLPack import on JAX's stream).
        total = float(jax.jit(lambda a: a.astype(jax.numpy.float32).sum())(o))
        want = want_o.astype(np.float64)
        assert abs(total - want.sum()) <= 1e-4 * np.abs(want).sum()
        assert _same_bits(np.asarray(o), want_o) and _same_bits(np.asarray(s), want_s)
    assert dlpack_export.live_exports() >= 2  # o and s of the last call are still JAX's
    # One of JAX's own streams (a real stream of the device, not torch's), the same for every call.
    assert streams[0] == streams[1] and streams[0] not in (0, torch.cuda.current_stream().cuda_stream)
    assert stream_device(streams[0]) == 0


def test_jax_outputs_ordered_after_a_slow_stream(jax, monkeypatch):
    """The outputs are poisoned and the stream kept busy before the kernels run: a JAX read that
    did not wait for them would see the poison."""
    from cuda.bindings import driver

    from kda_aot.intake import frameworks

    init = frameworks._DeviceOutput.__init__

    def poisoned(self, shape, dtype, device_id, handle):
        init(self, shape, dtype, device_id, handle)
        nbytes = int(np.prod(shape)) * (4 if dtype == "float32" else 2)
        (err,) = driver.cuMemsetD16Async(self.ptr, 0x7FFF, nbytes // 2, driver.CUstream(handle))
        assert err == driver.CUresult.CUDA_SUCCESS
        with torch.cuda.stream(torch.cuda.ExternalStream(handle)):
            torch.cuda._sleep(int(2e8))

    monkeypatch.setattr(frameworks._DeviceOutput, "__init__", poisoned)
    host, lb, want_o, want_s = _torch_case(8)
    x = _jax_inputs(jax, host)
    o, s = _call(x, lb)
    finite = bool(jax.numpy.isfinite(o.astype(jax.numpy.float32)).all() & jax.numpy.isfinite(s).all())
    assert finite
    assert _same_bits(np.asarray(o), want_o) and _same_bits(np.asarray(s), want_s)


def test_jax_outputs_are_freed_after_jax_lets_go(jax):
    import kda_aot
    from kda_aot.intake import dlpack_export, pending

    host, lb, _, _ = _torch_case(9)
    kda_aot.empty_cache()
    gc.collect()
    base = dlpack_export.live_exports()
    o, s = _call(_jax_inputs(jax, host), lb)
    assert dlpack_export.live_exports() == base + 2
    assert pending.pending_count() >= 1  # the inputs, held until the kernels finish
    del o, s
    gc.collect()
    jax.effects_barrier()
    deadline = time.monotonic() + 10
    while dlpack_export.live_exports() > base and time.monotonic() < deadline:
        time.sleep(0.01)  # JAX may run the DLPack deleter on one of its threads, a moment later
    assert dlpack_export.live_exports() == base
    kda_aot.empty_cache()  # waits for the kernels, frees what JAX let go of
    assert pending.pending_count() == 0


def test_jax_under_jit_is_refused_naming_the_traced_argument(jax):
    host, lb, _, _ = _torch_case(10)
    x = _jax_inputs(jax, host)

    def f(q):
        return _call({**x, "q": q}, lb)[0]

    with pytest.raises(TypeError, match=r"^q: a JAX tracer"):
        jax.jit(f)(x["q"])


def test_jax_workspace_size_reads_jax_arrays(jax):
    import kda_aot

    host, lb, _, _ = _torch_case(11)
    x = _jax_inputs(jax, host)

    def size(a):
        return kda_aot.workspace_size(a["q"], a["k"], a["v"], a["g"], a["beta"], A_log=a["A_log"],
                                      dt_bias=a["dt_bias"], lower_bound=lb, initial_state=a["initial_state"],
                                      output_final_state=True, cu_seqlens=a["cu_seqlens"])

    views = {k: torch.from_dlpack(v) for k, v in x.items()}  # the same memory, read by torch
    assert size(x) == size(views) > 0
