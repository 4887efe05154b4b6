"""Kernels load only on the devices calls run on (a GPU this build cannot use is never touched),
and a call on another GPU than the current one leaves the current device alone and gives the same
bits. The two-GPU tests run on a machine with two Hopper GPUs and skip elsewhere."""

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
torch = pytest.importorskip("torch")


def _call(x, device=None):
    import kda_aot

    if device is not None:
        x = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in x.items()}
    o, ht = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                            lower_bound=x["lower_bound"], initial_state=x["initial_state"], output_final_state=True,
                            cu_seqlens=x["cu_seqlens"])
    return o, ht


_FRESH_PROCESS = r"""
import json, torch, kda_aot
from kda_aot import reference
from kda_aot.library.loader import get_library
x = reference.make_inputs([300, 1000], 4, seed=3, device="cuda")
kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                cu_seqlens=x["cu_seqlens"], cp="off")
torch.cuda.synchronize()
lib = get_library()
print(json.dumps({n: sorted(k._devices) for n, k in lib.kernels.items() if k._devices}))
"""


def test_a_call_loads_only_its_kernels_on_its_device():
    import json

    out = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded, "no kernel was loaded by a prefill call"
    assert all(devices == [0] for devices in loaded.values()), loaded
    assert len(loaded) < 10, f"a serial call loaded more kernels than it launches: {sorted(loaded)}"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_call_on_second_gpu_keeps_current_device_and_bits():
    from kda_aot import reference
    from kda_aot.library.loader import get_library

    if torch.cuda.get_device_capability(1)[0] != 9:
        pytest.skip("the second GPU is not sm_90")
    x = reference.make_inputs([3000, 17, 1200], 8, seed=4, device="cuda:0", state="fp32")
    torch.cuda.set_device(0)
    want = _call(x)
    torch.cuda.synchronize(0)
    on_second = {k: (v.to("cuda:1") if hasattr(v, "to") else v) for k, v in x.items()}
    with torch.cuda.device(0):
        got = _call(on_second)
        assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    assert got[0].device.index == 1 and got[1].device.index == 1
    assert torch.equal(got[0].cpu(), want[0].cpu()) and torch.equal(got[1].cpu(), want[1].cpu())
    loaded = {n: k._devices for n, k in get_library().kernels.items() if 1 in k._devices}
    assert loaded, "no kernel was loaded on device 1"
