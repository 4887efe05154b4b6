"""The Python examples of the README and of docs/frameworks.md (CuPy, JAX), run as they are written
(each in a fresh interpreter), on the GPU.

A block passes when it runs without error, kda_aot's kernels actually ran (every program run is
counted), and the arrays it leaves under the README's names are device arrays holding finite,
non-zero values. Blocks needing a framework that is not installed skip, naming it."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The README shows torch and the FLA drop-in; docs/frameworks.md the CuPy and JAX callers.
EXAMPLE_FILES = ("README.md", "docs/frameworks.md")
BLOCKS = [block for name in EXAMPLE_FILES
          for block in re.findall(r"^```python\n(.*?)^```", (REPO / name).read_text(), re.S | re.M)]
# The README's names for results: each block must leave at least one of them.
RESULTS = ("o", "o2", "s", "s2", "ht", "final_state")

# Counts the kernel-sequence runs (each is one kda_run of the whole call) before the block runs.
PROLOGUE = """
import kda_aot.plan.program as _kda_program
_RUNS = []
_kda_run = _kda_program.Program.run
def _counting_run(self, inputs):
    _RUNS.append(1)
    return _kda_run(self, inputs)
_kda_program.Program.run = _counting_run
"""

# After the block: every result, read through DLPack by torch (installed wherever GPU tests run).
EPILOGUE = """
import json as _json, torch as _torch
_report = {}
for _name in %r:
    _x = globals().get(_name)
    if _x is None:
        continue
    _t = _torch.from_dlpack(_x)
    _torch.cuda.synchronize()
    _f = _t.float()
    _report[_name] = dict(device=_t.device.type, finite=bool(_torch.isfinite(_f).all()),
                          nonzero=bool(_f.abs().sum() > 0))
print("README-REPORT " + _json.dumps(dict(runs=len(_RUNS), results=_report)))
""" % (RESULTS,)


def _modules(block):
    """Top-level modules the block imports (`import a, b.c` and `from a import ...` lines)."""
    names = set()
    for line in re.findall(r"^import ([\w., ]+)$", block, re.M):
        names |= {part.split()[0].split(".")[0] for part in line.split(",")}  # "numpy as np" -> numpy
    names |= set(re.findall(r"^from (\w+)", block, re.M))
    return names


def test_readme_has_an_example_for_each_framework():
    """The README keeps the torch call and the FLA drop-in; the examples together cover torch,
    CuPy and JAX (CPU test)."""
    readme = "\n".join(re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M))
    assert "kda_aot.prefill(" in readme and "kt.chunk_kda(" in readme
    imports = set().union(*(_modules(b) for b in BLOCKS))
    assert {"torch", "cupy", "jax"} <= imports, imports


@pytest.mark.gpu
@pytest.mark.timeout(400)
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs_on_the_device(index):
    block = BLOCKS[index]
    for module in _modules(block) & {"cupy", "jax", "ml_dtypes"}:
        pytest.importorskip(module)
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = subprocess.run([sys.executable, "-c", PROLOGUE + block + EPILOGUE], capture_output=True, text=True,
                          cwd="/tmp", env=env, timeout=360)
    assert proc.returncode == 0, f"example block {index} failed:\n{block}\n{proc.stderr[-4000:]}"
    line = [x for x in proc.stdout.splitlines() if x.startswith("README-REPORT ")][-1]
    report = json.loads(line.split(" ", 1)[1])
    assert report["runs"] >= 1, "the block never ran kda_aot's kernels"
    assert report["results"], f"the block left none of {RESULTS}"
    for name, r in report["results"].items():
        assert r == dict(device="cuda", finite=True, nonzero=True), (name, r)
