"""The Python examples of the README and of docs/frameworks.md (CuPy, JAX), run as they are written
(each in a fresh interpreter), on the GPU.

A block passes when it runs without error, kda_aot's kernels actually ran (every program run is
counted; a kda_aot.jax block runs them from XLA's handler instead), and the arrays it leaves under
the README's names are device arrays holding finite, non-zero values. Blocks needing a framework that is not installed skip, naming it."""

import json
import os
import subprocess
import sys

import pytest

from readme_snippets import BLOCKS, block_modules

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


@pytest.mark.gpu
@pytest.mark.timeout(400)
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs_on_the_device(index):
    block = BLOCKS[index]
    for module in block_modules(block) & {"cupy", "jax", "ml_dtypes"}:
        pytest.importorskip(module)
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = subprocess.run([sys.executable, "-c", PROLOGUE + block + EPILOGUE], capture_output=True, text=True,
                          cwd="/tmp", env=env, timeout=360)
    assert proc.returncode == 0, f"example block {index} failed:\n{block}\n{proc.stderr[-4000:]}"
    line = [x for x in proc.stdout.splitlines() if x.startswith("README-REPORT ")][-1]
    report = json.loads(line.split(" ", 1)[1])
    # kda_aot.jax runs its kernels from XLA's handler, outside kda_aot's Python: its results show them
    assert report["runs"] >= 1 or "kda_aot.jax.prefill(" in block, "the block never ran kda_aot's kernels"
    assert report["results"], f"the block left none of {RESULTS}"
    for name, r in report["results"].items():
        assert r == dict(device="cuda", finite=True, nonzero=True), (name, r)
