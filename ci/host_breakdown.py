"""Where the host time of one small eager call goes, piece by piece (device diagnostic).

    python3 ci/host_breakdown.py

Times, per call, the intake (signature, pointers, plan lookup, pointer checks), one torch
allocation, the native launch of the whole program, and whole calls, each in batches queued
behind a sleep kernel so that nothing waits for the GPU. Needs torch and a Hopper GPU.
"""

import torch

import kda_aot
from kda_aot import api, bench
from kda_aot.program import pack_inputs


def per_call(fn, gpu=True):
    return bench.host_us(fn, busy=gpu)


def main():
    x, cu, out, final = bench.make_case(1, [16])
    ws = torch.empty(kda_aot.workspace_size(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                                            dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                                            output_final_state=True, cu_seqlens=cu), dtype=torch.uint8, device="cuda")
    args = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"], output_final_state=True,
                cu_seqlens=cu)

    def given():
        return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], out=out, final_state=final, workspace=ws,
                               **args)

    def alloc():
        return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], **args)

    def dense_alloc():
        return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"])

    given()
    named = dict(x, cu_seqlens=cu, out=out, final_state=final, workspace=ws)
    tensors = tuple(named.get(name) for name in api._TENSOR_ARGS)  # prefill's argument order
    key, plan = next(iter(api._PLANS.items()))  # the plan given() built, under prefill's own key
    ptrs = [0 if t is None else t.data_ptr() for t in tensors] + [torch._C._cuda_getCurrentRawStream(0)]
    packed = pack_inputs(ptrs)
    n = sum(t is not None for t in tensors)
    rows = [
        (f"_torch_intake: signature and pointers ({len(tensors)} arguments, {n} given)",
         per_call(lambda: api._torch_intake(torch.Tensor, tensors), gpu=False)),
        (f"data_ptr x{n}", per_call(lambda: [0 if t is None else t.data_ptr() for t in tensors], gpu=False)),
        ("plan lookup (hash key)", per_call(lambda: api._PLANS.get(key), gpu=False)),
        ("check_pointers", per_call(lambda: plan.check_pointers(ptrs), gpu=False)),
        ("raw current stream", per_call(lambda: torch._C._cuda_getCurrentRawStream(0), gpu=False)),
        ("q.new_empty(out shape)", per_call(lambda: x["q"].new_empty(plan.out_shape), gpu=False)),
        ("pack_inputs", per_call(lambda: pack_inputs(ptrs), gpu=False)),
        (f"program.run ({len(plan.launch.program.names)} launches, one native call)",
         per_call(lambda: plan.launch.program.run(packed))),
        ("program.run, GPU idle (no sleep kernel queued)", per_call(lambda: plan.launch.program.run(packed), gpu=False)),
        ("prefill, varlen, all buffers given", per_call(given)),
        ("prefill, varlen, outputs + workspace allocated", per_call(alloc)),
        ("prefill, dense, no state, allocated", per_call(dense_alloc)),
    ]
    for name, us in rows:
        print(f"| {name} | {us:.2f} us |")


if __name__ == "__main__":
    main()
