"""kda_aot.jax on the CPU: the trace-time checks (the validation wall on the traced shapes and dtypes,
errors naming the argument), the arguments it does not take, the refusal of a JAX without a CUDA
device and of a platform other than CUDA, and the JAX version it needs. Runs where JAX's CPU
wheel is installed (ci/test.sh installs it) and skips, saying so, elsewhere; the calls themselves
run on the device (tests/gpu/test_jax_jit.py)."""

import importlib
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (ci/test.sh installs its CPU wheel)")
jnp = jax.numpy
kj = pytest.importorskip("kda_aot.jax")

T, H = 32, 2


def _cuda_in_jax() -> bool:
    try:
        return bool(jax.local_devices(backend="cuda"))
    except Exception:  # noqa: BLE001
        return False


def bf(*shape):
    return jnp.zeros(shape, jnp.bfloat16)


def _args(**over):
    args = dict(q=bf(1, T, H, 128), k=bf(1, T, H, 128), v=bf(1, T, H, 128), g=bf(1, T, H, 128), beta=bf(1, T, H),
                A_log=jnp.zeros(H), dt_bias=jnp.zeros((H, 128)))
    args.update(over)
    return args


def _trace(**over):
    """Trace kda_aot.jax.prefill inside jax.jit (make_jaxpr traces without compiling or running)."""
    args = _args(**over)
    static = {n: a for n, a in args.items() if n == "seq_lens" or isinstance(a, (str, bool, int, float))}
    arrays = {n: a for n, a in args.items() if n not in static}

    def f(arrays):
        rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v", "g", "beta")}
        return kj.prefill(arrays["q"], arrays["k"], arrays["v"], arrays["g"], arrays["beta"], **rest, **static)

    return jax.make_jaxpr(f)(arrays)


@pytest.mark.parametrize("over, error, match", [
    (dict(k=bf(1, T, H, 64)), ValueError, r"^k: expected shape \(1, 32, 2, 128\) like q"),
    (dict(beta=jnp.zeros((1, T, H), jnp.float16)), TypeError, r"^beta: expected dtype bfloat16 or float32"),
    (dict(q=jnp.zeros((1, T, H, 128), jnp.float32)), TypeError, r"^q: expected dtype bfloat16"),
    (dict(g=bf(1, T, H)), ValueError, r"^g: expected shape"),
    (dict(A_log=jnp.zeros(H + 1)), ValueError, r"^A_log: expected shape \(2,\) \[H\]"),
    (dict(gate="nope"), ValueError, r"^gate: expected one of"),
    (dict(gate="log_decay"), ValueError, r"^A_log: "),
    (dict(numerics="fast"), ValueError, r"^numerics: expected"),
    (dict(cp="sometimes"), ValueError, r"^cp: "),
    (dict(lower_bound=-7.0), ValueError, r"^lower_bound: expected a finite value in \[-5, 0\)"),
    (dict(initial_state=jnp.zeros((2, H, 128, 128))), ValueError, r"^initial_state: expected shape \(1, 2, 128, 128\)"),
    (dict(cu_seqlens=jnp.array([[0, 32]], jnp.int32)), ValueError, r"^cu_seqlens: expected a 1-D tensor"),
    (dict(cu_seqlens=jnp.array([0, 32], jnp.float32)), TypeError, r"^cu_seqlens: expected dtype int32 or int64"),
    (dict(seq_lens=[T]), ValueError, r"^seq_lens: a hint for packed input"),
    (dict(cu_seqlens=jnp.array([0, 10, 32], jnp.int32), seq_lens=[10, 20]), ValueError, r"^seq_lens: the lengths sum"),
    (dict(state_pool=jnp.zeros((4, H, 128, 128)), state_indices=jnp.zeros((1,), jnp.int32), output_final_state=True),
     ValueError, r"^state_pool: cannot be combined with output_final_state"),
    (dict(state_indices=jnp.zeros((1,), jnp.int32)), ValueError, r"^state_indices: given without state_pool"),
    (dict(beta=[0.0] * T), TypeError, r"^beta: expected a JAX array, got list"),
    (dict(A_log=jnp.zeros(H, jnp.complex64)), TypeError, r"^A_log: dtype complex64 is not supported"),
])
def test_trace_time_checks_name_the_argument(over, error, match):
    with pytest.raises(error, match=match):
        _trace(**over)


@pytest.mark.parametrize("name", ["out", "final_state", "workspace", "stream", "validate", "cu_seqlens_cpu",
                                  "checkpoint_every", "checkpoint_offsets", "value_split"])
def test_arguments_it_does_not_take_are_refused_naming_them(name):
    a = list(_args().values())
    with pytest.raises(TypeError, match=rf"^{name}: not taken by kda_aot\.jax\.prefill \("):
        kj.prefill(*a[:5], A_log=a[5], dt_bias=a[6], **{name: None})
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'nonsense'"):
        kj.prefill(*a[:5], A_log=a[5], dt_bias=a[6], nonsense=1)


def test_a_traced_scalar_option_is_refused_naming_it():
    def f(q, lb):
        a = _args(q=q)
        return kj.prefill(a["q"], a["k"], a["v"], a["g"], a["beta"], A_log=a["A_log"], dt_bias=a["dt_bias"],
                          lower_bound=lb)

    with pytest.raises(TypeError, match=r"^lower_bound: "):
        jax.make_jaxpr(f)(bf(1, T, H, 128), -1.0)


def test_a_jax_without_cuda_is_refused_clearly():
    if _cuda_in_jax():
        pytest.skip("JAX has a CUDA device here: the calls run (tests/gpu/test_jax_jit.py)")
    with pytest.raises(RuntimeError, match=r"^kda_aot\.jax\.prefill runs on CUDA devices only .*devices: cpu"):
        _trace()
    a = _args()
    with pytest.raises(RuntimeError, match=r"CUDA devices only"):  # inside jax.jit too
        jax.jit(lambda q: kj.prefill(q, a["k"], a["v"], a["g"], a["beta"], A_log=a["A_log"],
                                     dt_bias=a["dt_bias"])[0])(a["q"])


@pytest.mark.parametrize("platform", ["cpu", "ROCM", "Host", None])
def test_registration_refuses_a_platform_other_than_cuda(platform):
    with pytest.raises(ValueError, match=r"^platform: kda_aot's XLA FFI target runs on CUDA only"):
        kj._register(platform)


def test_an_older_jax_is_refused_naming_the_versions(monkeypatch):
    monkeypatch.setattr(jax, "__version__", "0.4.30")
    monkeypatch.delitem(sys.modules, "kda_aot.jax")
    with pytest.raises(ImportError, match=r"kda_aot\.jax needs JAX 0\.5 or newer .*this is JAX 0\.4\.30"):
        importlib.import_module("kda_aot.jax")


def test_numpy_arrays_take_jaxs_dtype():
    """A NumPy cu_seqlens becomes the int32 JAX array the custom call receives (int64 without
    jax_enable_x64): the plan is made for what XLA will pass."""
    if jax.config.jax_enable_x64:
        pytest.skip("jax_enable_x64 keeps int64")
    assert kj._aval(kj._array(np.array([0, 32]), "cu_seqlens"), "cu_seqlens") == ((2,), "int32")
