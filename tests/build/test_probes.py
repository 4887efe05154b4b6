"""The CUDA probes of ci/probes/ still compile for sm_90a, and the K2 step probes do not spill.

The probes run only on the GPU machine (ci/probes/run.sh); what can go stale here is their source.
A step probe that spilled would time local-memory traffic instead of the chain it claims to time.
Needs nvcc (skipped without it); compile-only, about a second per probe.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBES = sorted((REPO / "ci" / "probes").glob("*.cu"))
NVCC = shutil.which("nvcc")
STEP_PROBES = {"k2_chain_floor", "k2_wgmma_chain"}  # timed kernels: every one must fit in registers

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed (the probes build on the GPU machine)")


def test_the_step_probes_exist():
    assert STEP_PROBES <= {p.stem for p in PROBES}


@pytest.mark.parametrize("probe", PROBES, ids=[p.stem for p in PROBES])
def test_probe_compiles_for_sm90a(probe, tmp_path):
    done = subprocess.run([NVCC, "-gencode", "arch=compute_90a,code=sm_90a", "-O3", "-cubin", "-Xptxas", "-v",
                           "-o", str(tmp_path / "probe.cubin"), str(probe)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    if probe.stem in STEP_PROBES:
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", done.stderr)]
        assert spills and not any(spills), f"{probe.name} spills: {done.stderr[-4000:]}"
        assert "serialized" not in done.stderr, f"ptxas serialized a wgmma in {probe.name}: {done.stderr[-4000:]}"
