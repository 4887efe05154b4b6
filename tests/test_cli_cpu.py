"""The command-line tools (demo, bench, profile) where they cannot run: one line, exit status 2.

Each tool runs in a subprocess of this interpreter. "No torch" is made by setting
sys.modules["torch"] = None before runpy starts the module, which makes every `import torch`
raise ImportError exactly as a missing torch does, without uninstalling anything.
"""

import os
import subprocess
import sys

import pytest

TOOLS = ("kda_aot.demo", "kda_aot.bench", "kda_aot.profile")


def _run(module, *args, block_torch=False, env=None):
    prelude = "import sys; sys.modules['torch'] = None; " if block_torch else ""
    code = (f"{prelude}import runpy; sys.argv = [{module!r}] + {list(args)!r}; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    if not block_torch:
        code = "import sys; " + code
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                          env={**os.environ, **(env or {})}, timeout=600)


def _one_clear_line(result, expected):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "cannot run here" in lines[0] and expected in lines[0], lines[0]


@pytest.mark.parametrize("module", ("kda_aot.bench", "kda_aot.profile"))
def test_without_torch(module):
    _one_clear_line(_run(module, block_torch=True), "torch is not importable")


def test_demo_without_torch():
    """The demo needs torch only for its GPU checks: without a GPU it runs the NumPy reference and
    passes; with one, it says in one line that the GPU checks need torch."""
    import kda_aot

    result = _run("kda_aot.demo", "--heads", "1", "--seq-lens", "40", "17", block_torch=True)
    if kda_aot.info().get("devices"):
        _one_clear_line(result, "the GPU checks need it")
        return
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no GPU run: " in result.stdout and "Running the CPU reference instead (NumPy" in result.stdout
    assert result.stdout.strip().endswith("PASS (CPU reference only; no kernel ran)")


@pytest.mark.parametrize("module", ("kda_aot.bench", "kda_aot.profile"))
def test_without_library(module):
    pytest.importorskip("torch")
    result = _run(module, env={"KDA_AOT_LIB_DIR": "/nonexistent-kda-aot-lib"})
    _one_clear_line(result, "the kernel library did not load")


def _has_cuda():
    torch = pytest.importorskip("torch")
    return torch.cuda.is_available()


@pytest.mark.parametrize("module", ("kda_aot.bench", "kda_aot.profile"))
def test_without_gpu(module):
    if _has_cuda():
        pytest.skip("a CUDA device is visible here")
    _one_clear_line(_run(module), "no CUDA device visible")


def test_demo_without_gpu_runs_the_cpu_reference():
    """No GPU is not a failure for the demo: it says so, runs the CPU reference and passes."""
    if _has_cuda():
        pytest.skip("a CUDA device is visible here")
    result = _run("kda_aot.demo", "--heads", "1", "--seq-lens", "40", "17")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no GPU run: no CUDA device visible" in result.stdout
    assert "Running the CPU reference instead" in result.stdout
    assert result.stdout.strip().endswith("PASS (CPU reference only; no kernel ran)")
