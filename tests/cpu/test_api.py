"""The public API on a machine without a GPU: arguments are refused before anything runs."""

import numpy as np
import pytest

import kda_aot


def _inputs(B=1, T=32, H=2):
    """Host arrays (NumPy: no torch needed). fp32 rather than bf16, which NumPy cannot export
    through DLPack: every call here is refused before dtypes matter, naming the argument."""
    rng = np.random.default_rng(0)
    f32 = np.float32
    return dict(q=rng.standard_normal((B, T, H, 128), f32), k=rng.standard_normal((B, T, H, 128), f32),
                v=rng.standard_normal((B, T, H, 128), f32), g=rng.standard_normal((B, T, H, 128), f32),
                beta=rng.standard_normal((B, T, H), f32), A_log=rng.random(H, f32), dt_bias=rng.random((H, 128), f32))


def test_cpu_tensors_are_refused_naming_q():
    x = _inputs()
    with pytest.raises(TypeError, match=r"^q: "):
        kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"])


def test_final_state_buffer_requires_output_final_state():
    x = _inputs()
    with pytest.raises(ValueError, match=r"^final_state: "):
        kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                        final_state=np.empty((1, 2, 128, 128), np.float32))


def test_numpy_bf16_says_to_pass_a_device_array():
    """A NumPy bfloat16 array (ml_dtypes), which NumPy cannot export through DLPack: the error names
    the argument and what to pass instead, not NumPy's list of exportable dtypes."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = _inputs()
    q = x["q"].astype(ml_dtypes.bfloat16)
    with pytest.raises(TypeError, match=r"^q: a NumPy array is host memory.*pass a device array"):
        kda_aot.prefill(q, x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"])


def test_non_tensor_is_refused():
    x = _inputs()
    with pytest.raises(TypeError, match=r"^v: expected a DLPack tensor"):
        kda_aot.prefill(x["q"], x["k"], [1, 2, 3], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"])


def test_runtime_imports_without_torch_or_dsl():
    import subprocess
    import sys

    code = ("import sys, kda_aot; kda_aot.info(); "
            "bad = [m for m in ('torch', 'cutlass', 'build_kernels') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_unhashable_argument_reaches_the_wall_not_the_cache():
    """An unhashable cp cannot key the validation cache: it must still get the wall's own error
    (here the first one, q on the CPU), never a bare 'unhashable type'."""
    x = _inputs()
    with pytest.raises(TypeError, match=r"^q: "):
        kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"], cp=[2])
