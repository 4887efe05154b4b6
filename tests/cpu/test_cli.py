"""The command-line tools (demo, bench, bench_op, profile) where they cannot run: one line, exit status 2.

Each tool runs in a subprocess of this interpreter. "No torch" is made by setting
sys.modules["torch"] = None before runpy starts the module, which makes every `import torch`
raise ImportError exactly as a missing torch does, without uninstalling anything.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = ("kda_aot.demo", "kda_aot.bench", "kda_aot.bench_op", "kda_aot.profile")
# The tools that need torch and a GPU for everything they do.
GPU_TOOLS = ("kda_aot.bench", "kda_aot.bench_op", "kda_aot.profile")


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


@pytest.mark.parametrize("module", GPU_TOOLS)
def test_without_torch(module):
    _one_clear_line(_run(module, block_torch=True), "torch is not importable")


def test_the_torch_hint_names_the_pinned_install():
    """A bare `pip install torch` fetches an unpinned multi-GB CUDA build (ci/venv.sh pins one):
    the hint must name the pinned release, not that command."""
    line = _run("kda_aot.bench", block_torch=True).stderr
    assert "torch==2.13.0" in line and "pip install torch" not in line, line


def test_package_main_prints_info_and_the_commands():
    """`python -m kda_aot` works without torch or a GPU: info()'s keys, then every tool."""
    import kda_aot

    result = _run("kda_aot", block_torch=True)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.startswith("kda_aot.info():"), out
    for key, value in kda_aot.info().items():
        if key != "devices":  # the subprocess counts the devices itself; the key must be there
            assert f"  {key} " in out and str(value) in out, (key, out)
        assert f"  {key} " in out, (key, out)
    for tool in TOOLS:
        assert f"python -m {tool} " in out, (tool, out)


def test_package_main_says_whether_it_can_run_here():
    """After info(), one plain line: "can run here: ..." or "cannot run here: <why>"; without a
    device it names what still runs (the demo's CPU reference)."""
    import kda_aot

    lines = _run("kda_aot", block_torch=True).stdout.splitlines()
    verdicts = [line for line in lines if line.startswith(("can run here: ", "cannot run here: "))]
    assert len(verdicts) == 1, lines
    info = kda_aot.info()
    if info.get("library") is None or not info.get("devices"):
        assert verdicts[0].startswith("cannot run here: ") and "python -m kda_aot.demo" in verdicts[0], verdicts


def test_package_main_verdicts(monkeypatch):
    """The verdict for each kind of machine, on made-up info() results and capabilities."""
    from kda_aot import __main__ as main
    from kda_aot.library import streams

    assert main.verdict({"library": None, "error": "no libkda"}) == (
        "cannot run here: the kernel library did not load (no libkda)")
    assert "no NVIDIA driver" in main.verdict({"library": "x", "devices": 0, "device_error": "no NVIDIA driver found"})
    monkeypatch.setattr(streams, "compute_capability", lambda i: (8, 0) if i == 0 else (9, 0))
    assert main.verdict({"library": "x", "devices": 1}).startswith("cannot run here: no Hopper GPU (cuda:0 is sm_80)")
    assert main.verdict({"library": "x", "devices": 2}) == "can run here: on cuda:1 (Hopper, sm_90)"


def test_kda_aot_torch_without_torch_says_what_it_needs():
    """`import kda_aot.torch` without torch: an ImportError that names kda_aot.torch, the tested
    torch releases and that plain `import kda_aot` works, not a bare "No module named 'torch'"."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import kda_aot\n"  # works without torch
            "try:\n    import kda_aot.torch\nexcept ImportError as exc:\n    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert result.returncode == 0, result.stderr
    message = result.stdout
    assert message.startswith("kda_aot.torch needs PyTorch"), message
    assert "2.13.0" in message and "import kda_aot" in message, message


def test_package_main_refuses_arguments():
    result = _run("kda_aot", "--bogus", block_torch=True)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "takes no arguments" in result.stderr and "--bogus" in result.stderr


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


@pytest.mark.parametrize("module", GPU_TOOLS)
def test_without_library(module):
    pytest.importorskip("torch")
    result = _run(module, env={"KDA_AOT_LIB_DIR": "/nonexistent-kda-aot-lib"})
    _one_clear_line(result, "the kernel library did not load")


def _has_cuda():
    torch = pytest.importorskip("torch")
    return torch.cuda.is_available()


@pytest.mark.parametrize("module", GPU_TOOLS)
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


def test_no_driver_error_says_what_to_act_on(no_cuda_driver):
    """Without libcuda, CUDA's error 35 ("driver version is insufficient") reads like an old driver;
    the message starts with the real cause and ends with the one action for both readings."""
    import kda_aot

    error = kda_aot.info()["device_error"]
    assert error.startswith("no NVIDIA driver found"), error
    assert "CUDA error 35" in error and error.endswith("R580 or newer for cu13"), error
    assert "install or upgrade the NVIDIA driver" in error, error


def _fingerprint(repo):
    """ci/venv.sh's fingerprint of a checkout, computed by the script itself."""
    script = Path(__file__).resolve().parents[2] / "ci" / "venv.sh"
    cmd = f'REPO={repo}; PY={sys.executable}; source {script}; _tree_fingerprint'
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True).stdout.strip()


def test_the_reinstall_fingerprint_follows_the_tree(tmp_path):
    """ci/venv.sh skips `pip install .` when the fingerprint is unchanged: it must change with a
    tracked file's content, a new untracked file and a deleted one, and not with an ignored file."""
    if not shutil.which("git"):
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    (repo / ".gitignore").write_text("ignored/\n")
    (repo / "a.py").write_text("A = 1\n")
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    seen = [_fingerprint(repo)]
    assert len(seen[0]) == 40
    (repo / "ignored").mkdir()
    (repo / "ignored" / "b.py").write_text("B = 2\n")
    assert _fingerprint(repo) == seen[0], "an ignored file changed the fingerprint"
    (repo / "a.py").write_text("A = 2\n")
    seen.append(_fingerprint(repo))
    (repo / "new.py").write_text("N = 1\n")
    seen.append(_fingerprint(repo))
    (repo / "a.py").unlink()
    seen.append(_fingerprint(repo))
    assert len(set(seen)) == len(seen), seen
    assert _fingerprint(tmp_path) == "", "outside a git checkout the fingerprint must be empty (always install)"
