"""The prefill calls that ci/sanitize.sh runs under each compute-sanitizer tool.

    python3 ci/sanitize_cases.py [CASE ...]     (all cases when none is named)

Each case prints a marker line before it runs, so the sanitizer's reports can be attributed to
the case that produced them. Problems are small: racecheck and initcheck slow kernels down by
orders of magnitude.
"""

import sys

import torch

import kda_aot
from kda_aot import reference


def run(lens, H, state, cp="off", dense=None):
    x = reference.make_inputs(dense if dense is not None else lens, H, seed=1, device="cuda", state=state)
    o, s = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                           lower_bound=x["lower_bound"], initial_state=x["initial_state"],
                           output_final_state=state is not None, cu_seqlens=x["cu_seqlens"], cp=cp)
    torch.cuda.synchronize()
    return o, s


CASES = {
    "serial-nostate": lambda: run([300, 17], 2, None),
    "serial-bf16": lambda: run([300, 17], 2, "bf16"),
    "serial-fp32": lambda: run([300, 17], 2, "fp32"),
    "dense-fp32": lambda: run(None, 2, "fp32", dense=(2, 100)),
    "varlen-empty-and-1-token": lambda: run([0, 1, 40, 0, 1], 2, "bf16"),
    "cp-on": lambda: run([1200], 2, "fp32", cp="on"),
    "cp-2": lambda: run([1200], 2, "bf16", cp=2),
    "cp-4": lambda: run([1200, 300], 2, None, cp=4),
    "cp-8": lambda: run([1200], 2, "fp32", cp=8),
}


def main(names):
    for name in names or CASES:
        print(f"=== case {name}", flush=True)
        CASES[name]()
        print(f"=== done {name}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
