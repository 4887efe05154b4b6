"""The Python part of kda_aot.prefill's per-call host cost, on any machine (no GPU): a warm call of
a cached plan with the plan lookup, the pointer checks and the native launch stubbed, so what is
timed is the intake, the options record, the key and the launch's bookkeeping, the code a
restructuring of the call path changes. Torch CPU tensors stand in for the caller's.

    PYTHONPATH=<checkout A> python3 ci/host_path_cpu.py A
    PYTHONPATH=<checkout B> python3 ci/host_path_cpu.py B

Run the two checkouts alternately, twice each, on one quiet machine: the difference is what a
change adds to every call (docs/call_path.md); the device's own figure is `python -m
kda_aot.bench_op` on a Hopper machine.
"""

import sys
import timeit
import types

import torch

from kda_aot import api
from kda_aot.intake import arguments


class _Program:
    def run(self, packed):
        pass


class _Plan:
    """What _launch reads of a plan, for a varlen call whose buffers are all given."""

    def __init__(self):
        self.problem = types.SimpleNamespace(device_id=0, state_dtype="bfloat16")
        self.launch = types.SimpleNamespace(program=_Program())
        self.alloc_checkpoints = self.alloc_checkpoint_index = self.alloc_final = False
        self.workspace_given, self.workspace_bytes = True, 0
        self.out_shape = (1, 16, 1, 128)

    def check_pointers(self, ptrs):
        pass


class _Plans(dict):
    """Every key finds the plan, after hashing it as the real lookup does."""

    def get(self, key, default=None):
        hash(key)
        return PLAN


PLAN = _Plan()


def main() -> int:
    label = sys.argv[1] if len(sys.argv) > 1 else "this checkout"
    api._PLANS = _Plans()
    arguments.call_stream = lambda torch, stream, device_id, default=None: 0  # no CUDA stream here
    api.pack_inputs = lambda ptrs: None
    q = torch.zeros(1, 16, 1, 128, dtype=torch.bfloat16)
    x = dict(q=q, k=q.clone(), v=q.clone(), g=q.clone(), beta=torch.zeros(1, 16, 1, dtype=torch.bfloat16))
    state = torch.zeros(1, 1, 128, 128, dtype=torch.bfloat16)
    args = dict(A_log=torch.zeros(1), dt_bias=torch.zeros(128), initial_state=state, output_final_state=True,
                cu_seqlens=torch.tensor([0, 16], dtype=torch.int32), out=q.clone(), final_state=state.clone(),
                workspace=torch.zeros(256, dtype=torch.uint8))

    def call():
        return api.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], **args)

    call()
    runs = [min(timeit.repeat(call, number=5000, repeat=7)) / 5000 * 1e6 for _ in range(3)]
    print(f"{label}: us per call, Python path (plan and launch stubbed): " + " ".join(f"{r:.2f}" for r in runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
