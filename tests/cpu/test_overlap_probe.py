"""ci/overlap_probe.py launches a program in pieces (a sub-range of its steps on each stream): the
pieces, run in order, launch exactly what the whole program launches, with the same argument values
(recorded, no GPU). The probe's own check on the device compares the results bitwise."""

import importlib.util
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the probe is a torch script; the CPU run without torch has nothing to load

from kda_aot import api  # noqa: E402
from kda_aot.intake import arguments  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # the sibling helpers below, when run on its own
from test_state_pool import rec  # noqa: E402,F401  (rec: the recording fixture)

REPO = Path(__file__).resolve().parents[2]


def _probe():
    spec = importlib.util.spec_from_file_location("overlap_probe", REPO / "ci" / "overlap_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("H, lens, beside", [(4, [8192], "cp_pre_scan"), (64, [8192], "k2_")])
def test_pieces_launch_the_whole_program(rec, H, lens, beside):
    import recording

    x = dict(recording.problem_args(H=H, lens=lens, state="float32"),
             workspace=recording.device_buffer("workspace", (1 << 30,), "uint8"))  # never dereferenced
    recording.call(x, cp="auto", stream=7)
    whole = [(launch.name, launch.args) for launch in rec.last]
    (plan,) = api._PLANS.values()
    program = plan.launch.program
    ptrs = [rec.inputs[-1][name] for name in arguments.TENSOR_ARGS]
    k1 = next(i for i, name in enumerate(program.names) if name.startswith("k1_prepare"))
    assert program.names[k1 + 1].startswith(beside)
    probe = _probe()
    stream = types.SimpleNamespace(cuda_stream=7)
    pieces = []
    for first, last in ((0, k1 + 1), (k1 + 1, k1 + 2), (k1 + 2, len(program.names))):
        before = len(rec.calls)
        probe.runner(program, ptrs, first, last)(stream)
        if first < last:
            pieces += [(launch.name, launch.args) for launch in rec.calls[-1]]
        else:
            assert len(rec.calls) == before  # an empty piece launches nothing
    assert pieces == whole
