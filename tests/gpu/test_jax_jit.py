"""kda_aot.jax.prefill under jax.jit (the XLA FFI custom call, build_kernels/shim/kda_xla.c), against
the eager DLPack call kda_aot.prefill on the same JAX arrays: the same plan runs the same kernels, so
every result must be equal bit for bit. Also: a jitted two-layer toy model, the state pool through
donation, XLA's command buffers (CUDA graphs) around the custom call, the refusal of a gradient,
and the host cost per call (printed; ci/jax_host_cost.py measures it in full).

Skips cleanly without a Hopper GPU (the `gpu` mark), without JAX, or when JAX sees no CUDA device.
"""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def jax():
    jax = pytest.importorskip("jax")
    try:
        devices = jax.local_devices(backend="cuda")
    except Exception as exc:  # noqa: BLE001 - no CUDA plugin: its error type varies by release
        pytest.skip(f"JAX sees no CUDA device: {exc}")
    if not devices:
        pytest.skip("JAX sees no CUDA device")
    return jax


@pytest.fixture(scope="module")
def kj(jax):
    import kda_aot.jax

    return kda_aot.jax


# ---------------------------------------------------------------------------------------------
# inputs (NumPy on the host, then JAX arrays on the GPU)

FORMS = {
    # name: (gate, beta form, options, g dtype, beta dtype)
    "safe": ("safe", "logits", {}, "bf16", "bf16"),
    "sigmoid-probs-fp32": ("sigmoid", "probs", {"lower_bound": -2.0}, "bf16", "fp32"),
    "softplus-neg-eigval": ("softplus", "logits", {"allow_neg_eigval": True}, "bf16", "bf16"),
    "log-decay-bf16": ("log_decay", "logits", {}, "bf16", "bf16"),
    "log-decay-fp32": ("log_decay", "probs", {}, "fp32", "fp32"),
}


def _inputs(jax, shape, H, seed, form="safe", state=None):
    """Arrays for one call: `shape` (B, T) dense, or a list of lengths packed with cu_seqlens.
    Returns (positional arrays, keyword arguments)."""
    import ml_dtypes

    gate, beta_form, options, g_dtype, beta_dtype = FORMS[form]
    rng = np.random.default_rng(seed)
    if isinstance(shape, tuple):
        (B, T), cu = shape, None
    else:
        B, T, cu = 1, sum(shape), np.cumsum([0] + list(shape)).astype(np.int32)
    N = B if cu is None else len(cu) - 1
    dev = jax.local_devices(backend="cuda")[0]
    bf16, fp32 = ml_dtypes.bfloat16, np.float32

    def put(a, dtype):  # "bf16" or a NumPy dtype
        a = np.asarray(a, np.float32)
        return jax.device_put(a.astype(bf16) if dtype == "bf16" else a.astype(dtype), dev)

    def normal(*size):
        return rng.standard_normal(size, dtype=np.float32)

    q, k, v = (put(normal(B, T, H, 128), "bf16") for _ in range(3))
    g = -0.5 * np.abs(normal(B, T, H, 128)) if gate == "log_decay" else normal(B, T, H, 128)
    g = put(g, "bf16" if g_dtype == "bf16" else fp32)
    beta = rng.uniform(size=(B, T, H)).astype(np.float32) if beta_form == "probs" else normal(B, T, H)
    beta = put(beta, "bf16" if beta_dtype == "bf16" else fp32)
    kw = dict(options, gate=gate, beta_form=beta_form)
    if gate != "log_decay":
        kw["A_log"] = put(rng.uniform(size=H), fp32)
        kw["dt_bias"] = put(rng.uniform(size=(H, 128)), fp32)
    if cu is not None:
        kw["cu_seqlens"] = jax.device_put(cu, dev)
    if state is not None:
        kw["initial_state"] = put(0.1 * normal(N, H, 128, 128), "bf16" if state == "bf16" else fp32)
    return (q, k, v, g, beta), kw


def _bits(x):
    a = np.asarray(x)
    return a.dtype.str, a.shape, a.tobytes()


def _eager(args, kw, **more):
    """The eager DLPack call on the same JAX arrays."""
    import kda_aot

    return kda_aot.prefill(*args, **kw, **more)


def _split(kw):
    """(arrays, static options) of a call's keyword arguments."""
    arrays = {n: a for n, a in kw.items() if hasattr(a, "shape")}
    return arrays, {n: a for n, a in kw.items() if n not in arrays}


def _jitted(jax, kj, kw, **more):
    """jax.jit of kda_aot.jax.prefill: f(args, arrays), the options static (closed over)."""
    static = _split(kw)[1]

    @jax.jit
    def f(args, arrays):
        return kj.prefill(*args, **arrays, **static, **more)

    return f


# ---------------------------------------------------------------------------------------------
# bit equality with the eager call

@pytest.mark.parametrize("cp", ["off", "on"])
@pytest.mark.parametrize("form", list(FORMS))
def test_jit_equals_the_eager_call_in_every_gate_form(jax, kj, form, cp):
    args, kw = _inputs(jax, (1, 2048), 4, seed=11, form=form, state="fp32")
    o, s = _jitted(jax, kj, kw, output_final_state=True, cp=cp)(args, _split(kw)[0])
    want_o, want_s = _eager(args, kw, output_final_state=True, cp=cp)
    assert o.dtype == jax.numpy.bfloat16 and s.dtype == jax.numpy.float32
    assert _bits(o) == _bits(want_o) and _bits(s) == _bits(want_s)


@pytest.mark.parametrize("cp", ["off", "on"])
def test_jit_varlen_through_a_cu_seqlens_array(jax, kj, cp):
    args, kw = _inputs(jax, [1500, 17, 0, 1000, 300], 4, seed=12, state="bf16")
    f = _jitted(jax, kj, kw, output_final_state=True, cp=cp)
    o, s = f(args, _split(kw)[0])
    want_o, want_s = _eager(args, kw, output_final_state=True, cp=cp)
    assert s.dtype == jax.numpy.bfloat16
    assert _bits(o) == _bits(want_o) and _bits(s) == _bits(want_s)
    # other lengths in the same shapes: the compiled call reads cu_seqlens on the device
    cu = jax.device_put(np.array([0, 17, 1000, 1017, 2517, 2817], np.int32), kw["cu_seqlens"].devices().pop())
    kw2 = dict(kw, cu_seqlens=cu)
    o2, s2 = f(args, _split(kw2)[0])
    want_o2, want_s2 = _eager(args, kw2, output_final_state=True, cp=cp)
    assert _bits(o2) == _bits(want_o2) and _bits(s2) == _bits(want_s2)
    assert f._cache_size() == 1  # one trace, one executable for both


def test_jit_accurate_numerics_and_no_final_state(jax, kj):
    args, kw = _inputs(jax, (2, 700), 2, seed=13)
    o, s = _jitted(jax, kj, kw, numerics="accurate")(args, _split(kw)[0])
    want_o, _ = _eager(args, kw, numerics="accurate")
    assert s is None and _bits(o) == _bits(want_o)


def test_eager_kda_aot_jax_prefill_equals_the_dlpack_call(jax, kj):
    """Outside jit the custom call runs eagerly too (JAX compiles the one primitive)."""
    args, kw = _inputs(jax, [300, 200], 2, seed=14, state="fp32")
    o, s = kj.prefill(*args, **kw, output_final_state=True)
    want_o, want_s = _eager(args, kw, output_final_state=True)
    assert _bits(o) == _bits(want_o) and _bits(s) == _bits(want_s)


# ---------------------------------------------------------------------------------------------
# a jitted two-layer toy KDA model

def test_a_jitted_two_layer_toy_model(jax, kj):
    """Projections, two KDA layers and residuals in one jitted function: each layer's prefill,
    given the jitted model's own intermediate q, k, v, g, beta, equals the eager call's bits."""
    jnp = jax.numpy
    T, H, D = 512, 2, 256
    rng = np.random.default_rng(15)
    dev = jax.local_devices(backend="cuda")[0]

    def w(*shape):
        return jax.device_put(rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[0]), dev)

    layers = [dict(wq=w(D, H * 128), wk=w(D, H * 128), wv=w(D, H * 128), wg=w(D, H * 128), wb=w(D, H),
                   wo=w(H * 128, D), A_log=jax.device_put(rng.uniform(size=H).astype(np.float32), dev),
                   dt_bias=jax.device_put(rng.uniform(size=(H, 128)).astype(np.float32), dev)) for _ in range(2)]
    x = jax.device_put(rng.standard_normal((1, T, D), dtype=np.float32), dev)

    def heads(a):
        return a.astype(jnp.bfloat16).reshape(1, T, H, 128)

    @jax.jit
    def model(x, layers):
        seen = []
        for p in layers:
            q, k, v, g = (heads(x @ p[n]) for n in ("wq", "wk", "wv", "wg"))
            beta = (x @ p["wb"]).astype(jnp.bfloat16)
            o, s = kj.prefill(q, k, v, g, beta, A_log=p["A_log"], dt_bias=p["dt_bias"], output_final_state=True)
            seen.append(((q, k, v, g, beta), o, s))
            x = x + o.reshape(1, T, H * 128).astype(jnp.float32) @ p["wo"]
        return x, seen

    y, seen = model(x, layers)
    assert bool(jnp.isfinite(y).all())
    for p, (args, o, s) in zip(layers, seen):
        want_o, want_s = _eager(args, dict(A_log=p["A_log"], dt_bias=p["dt_bias"]), output_final_state=True)
        assert _bits(o) == _bits(want_o) and _bits(s) == _bits(want_s)


# ---------------------------------------------------------------------------------------------
# the state pool through donation

def test_jit_state_pool_is_donated_and_written_at_the_slots(jax, kj):
    torch = pytest.importorskip("torch")
    import kda_aot

    args, kw = _inputs(jax, [300, 700, 64], 2, seed=16)
    rng = np.random.default_rng(16)
    pool_host = (0.1 * rng.standard_normal((6, 2, 128, 128))).astype(np.float32)
    idx_host = np.array([4, -1, 1], np.int32)  # -1: starts from zero, writes nothing
    dev = args[0].devices().pop()

    def step(args, arrays, pool, idx):
        return kj.prefill(*args, **arrays, state_pool=pool, state_indices=idx)

    step = jax.jit(step, donate_argnums=(2,))
    arrays = _split(kw)[0]
    pool = jax.device_put(pool_host, dev)
    o, new_pool = step(args, arrays, pool, jax.device_put(idx_host, dev))
    assert pool.is_deleted()  # donated: XLA wrote the slots in place of the argument's buffer

    # the eager call on torch tensors writes a torch pool in place: the same kernels
    t = {n: torch.from_dlpack(a) for n, a in arrays.items()}
    t_args = [torch.from_dlpack(a) for a in args]
    t_pool = torch.tensor(pool_host, device="cuda")
    want_o, _ = kda_aot.prefill(*t_args, **t, gate=kw["gate"], beta_form=kw["beta_form"], state_pool=t_pool,
                                state_indices=torch.tensor(idx_host, device="cuda"))
    torch.cuda.synchronize()
    assert np.asarray(o).tobytes() == want_o.view(torch.int16).cpu().numpy().tobytes()
    assert np.asarray(new_pool).tobytes() == t_pool.cpu().numpy().tobytes()
    untouched = [0, 2, 3, 5]
    assert np.asarray(new_pool)[untouched].tobytes() == pool_host[untouched].tobytes()


# ---------------------------------------------------------------------------------------------
# forward only

def test_grad_raises_naming_the_missing_backward(jax, kj):
    args, kw = _inputs(jax, (1, 64), 1, seed=17)

    def loss(q):
        o, _ = kj.prefill(q, *args[1:], **kw)
        return o.astype(jax.numpy.float32).sum()

    with pytest.raises(NotImplementedError, match="no backward"):
        jax.grad(loss)(args[0])
    # stop_gradient around it leaves the rest differentiable
    grad = jax.grad(lambda q: loss(jax.lax.stop_gradient(q)) + (q.astype(jax.numpy.float32) ** 2).sum())(args[0])
    assert grad.shape == args[0].shape


# ---------------------------------------------------------------------------------------------
# XLA command buffers (CUDA graphs)

COMMAND_BUFFER_FLAGS = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"

_COMMAND_BUFFER_SCRIPT = """
import sys
import numpy as np
import jax, jax.numpy as jnp
import ml_dtypes
import kda_aot, kda_aot.jax as kj

rng = np.random.default_rng(18)
dev = jax.local_devices(backend="cuda")[0]
def put(a, dtype):
    return jax.device_put(a.astype(dtype), dev)
T, H = 1024, 2
make = lambda: [put(rng.standard_normal((1, T, H, 128), dtype=np.float32), ml_dtypes.bfloat16) for _ in range(4)]
beta = put(rng.standard_normal((1, T, H), dtype=np.float32), ml_dtypes.bfloat16)
A_log, dt_bias = put(rng.uniform(size=H), np.float32), put(rng.uniform(size=(H, 128)), np.float32)
cu = jax.device_put(np.array([0, 300, 1024], np.int32), dev)

@jax.jit
def f(q, k, v, g, beta, A_log, dt_bias, cu):
    o, s = kj.prefill(q * 2, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu, output_final_state=True)
    o2, s2 = kj.prefill(o, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu, initial_state=s,
                        output_final_state=True)
    return o2 + o, s2

q, k, v, g = make()
text = f.lower(q, k, v, g, beta, A_log, dt_bias, cu).compile().as_text()
target = kj._register()
print("command buffer:", "command_buffer" in text, "target:", target in text)
for _ in range(3):  # replays with new inputs: the graph is updated with new buffer addresses
    q, k, v, g = make()
    got = f(q, k, v, g, beta, A_log, dt_bias, cu)
    o, s = kda_aot.prefill(q * 2, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu, output_final_state=True)
    o2, s2 = kda_aot.prefill(o, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu, initial_state=s,
                             output_final_state=True)
    want = (jax.jit(lambda a, b: a + b)(o2, o), s2)
    same = all(np.asarray(a).tobytes() == np.asarray(b).tobytes() for a, b in zip(got, want))
    print("same bits:", same)
    if not same:
        sys.exit(1)
sys.exit(0)
"""


def test_command_buffers_capture_the_custom_call(jax, kj, tmp_path):
    """XLA_FLAGS asks XLA to put fusions and custom calls into command buffers (CUDA graphs),
    even a graph of one command; the handler declares itself command-buffer compatible, so the
    compiled module (its HLO, or the dump of its thunks where XLA forms command buffers from
    thunks) holds a command buffer, and replaying it with new inputs gives the eager bits. A
    subprocess: XLA reads XLA_FLAGS when its backend starts."""
    flags = f"{COMMAND_BUFFER_FLAGS} --xla_dump_to={tmp_path}"
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flags).strip())
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(_COMMAND_BUFFER_SCRIPT)], env=env,
                         capture_output=True, text=True, timeout=240)
    print(run.stdout, run.stderr[-3000:])
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "target: True" in run.stdout and "same bits: True" in run.stdout
    dumped = [p.name for p in tmp_path.rglob("*") if p.is_file() and "command_buffer" in p.read_text(errors="ignore")]
    print("dump files that name a command buffer:", dumped[:10])
    assert "command buffer: True" in run.stdout or dumped, "XLA formed no command buffer"


# ---------------------------------------------------------------------------------------------
# host cost (printed; the full measurement is ci/jax_host_cost.py)

def test_host_cost_per_call_is_printed(jax, kj):
    args, kw = _inputs(jax, (1, 64), 1, seed=19)
    f, arrays = _jitted(jax, kj, kw), _split(kw)[0]
    f(args, arrays)[0].block_until_ready()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(100):
            o, _ = f(args, arrays)
        times.append((time.perf_counter() - t0) / 100)
        o.block_until_ready()
    print(f"jitted kda_aot.jax.prefill: {min(times) * 1e6:.1f} us per call (T=64, H=1)")
    assert min(times) < 1e-3  # a millisecond would mean a synchronisation or a retrace per call
