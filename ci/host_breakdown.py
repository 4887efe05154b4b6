"""Where the host time of one eager call goes, piece by piece (device diagnostic; a small call unless --shape).

    python3 ci/host_breakdown.py [--engines] [--shape H LEN [LEN ...]]

Times, per call, the intake (signature, pointers, plan lookup, pointer checks), one torch
allocation, the native launch of the whole program, and whole calls, each in batches queued
behind a sleep kernel so that nothing waits for the GPU. Needs torch and a Hopper GPU.

--shape times the same pieces on H heads and packed sequences of the given lengths (default H=1, one
sequence of 16 tokens), with cp="auto": H=4 8192, for example, breaks down a CP call, whose program
launches five kernels where a serial one launches two.

--engines times the engine-facing paths against kda_aot.prefill on the same problem and buffers,
each call with fresh tensor objects (views of the same memory, made before the timing, as an
engine hands new tensors every step): kda_aot.flashkda_compat.fwd (FlashKDA's call),
kda_aot.torch.chunk_kda, and fla.ops.kda.chunk_kda through FLA's backend registry (when fla is
installed), all under torch.inference_mode().
"""

import argparse
import itertools

import torch

import kda_aot
from kda_aot import api
from kda_aot.tools import bench
from kda_aot.intake import arguments
from kda_aot.plan.program import pack_inputs


def per_call(fn, gpu=True):
    return bench.host_us(fn, busy=gpu)


def main(H: int = 1, lens=(16,)):
    x, cu, out, final = bench.make_case(H, list(lens))
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
    tensors = tuple(named.get(name) for name in arguments.TENSOR_ARGS)  # prefill's argument order
    key, plan = next(iter(api._PLANS.items()))  # the plan given() built, under prefill's own key
    ptrs = [0 if t is None else t.data_ptr() for t in tensors] + [torch._C._cuda_getCurrentRawStream(0)]
    packed = pack_inputs(ptrs)
    n = sum(t is not None for t in tensors)
    rows = [
        (f"torch_intake: signature and pointers ({len(tensors)} arguments, {n} given)",
         per_call(lambda: arguments.torch_intake(torch.Tensor, tensors), gpu=False)),
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


def engine_rows(H: int = 4, lens=(256, 64), sets: int = 1024):
    """(name, us) of kda_aot.prefill and the engine paths over it, FlashKDA's form, fp32 states."""
    import kda_aot.torch as kt
    from kda_aot import flashkda_compat as fk

    x, cu32, _, _ = bench.make_case(H, list(lens))
    cu = cu32.long()
    N, T = len(lens), sum(lens)
    h0 = x["initial_state"].float()
    out = torch.empty(1, T, H, 128, dtype=torch.bfloat16, device="cuda")
    final = torch.empty(N, H, 128, 128, dtype=torch.float32, device="cuda")
    ws = torch.empty(fk.get_workspace_size(T, H, N), dtype=torch.uint8, device="cuda")
    names = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")
    base = [x[n] for n in names] + [h0, cu, out, final, ws]
    # fresh tensor objects for every call, made outside the timed loop
    fresh = itertools.cycle([[t.view(t.shape) for t in base] for _ in range(sets)])
    scale = 128 ** -0.5

    def prefill_given():
        q, k, v, g, beta, A_log, dt_bias, h0, cu, out, final, ws = next(fresh)
        return kda_aot.prefill(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, lower_bound=-5.0, scale=scale,
                               initial_state=h0, output_final_state=True, final_state=final, out=out, cu_seqlens=cu,
                               workspace=ws, cp="off")

    def prefill_alloc():
        q, k, v, g, beta, A_log, dt_bias, h0, cu, *_ = next(fresh)
        return kda_aot.prefill(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, lower_bound=-5.0, scale=scale,
                               initial_state=h0, output_final_state=True, cu_seqlens=cu)

    def compat_fwd():
        q, k, v, g, beta, A_log, dt_bias, h0, cu, out, final, ws = next(fresh)
        fk.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, -5.0, h0, final, cu, workspace=ws)

    flags = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 safe_gate=True, lower_bound=-5.0, state_v_first=True)

    def chunk_kda(fn):
        def call():
            q, k, v, g, beta, A_log, dt_bias, h0, cu, *_ = next(fresh)
            return fn(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                      A_log=A_log, dt_bias=dt_bias, **flags)
        return call

    rows = [("kda_aot.prefill, all buffers given (cp='off')", prefill_given),
            ("kda_aot.flashkda_compat.fwd, same buffers", compat_fwd),
            ("kda_aot.prefill, outputs + workspace allocated", prefill_alloc),
            ("kda_aot.torch.chunk_kda (outputs allocated)", chunk_kda(kt.chunk_kda))]
    from kda_aot import fla_backend

    if fla_backend.BACKEND is not None:
        from fla.ops.kda import chunk_kda as fla_chunk_kda

        with torch.inference_mode():  # the row must time kda-aot's backend, not a fallback
            ok, why = fla_backend.verify(*base[:5], scale=scale, initial_state=h0, output_final_state=True,
                                         cu_seqlens=cu, A_log=x["A_log"], dt_bias=x["dt_bias"], **flags)
        if not ok:
            raise SystemExit(f"the FLA backend declines the timed call: {why}")
        rows.append(("fla.ops.kda.chunk_kda -> kda-aot backend (outputs allocated)", chunk_kda(fla_chunk_kda)))
    else:
        print("fla is not installed: no FLA backend row")
    with torch.inference_mode():
        return [(name, per_call(fn)) for name, fn in rows]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python3 ci/host_breakdown.py", description=__doc__.splitlines()[0])
    parser.add_argument("--engines", action="store_true", help="the engine-facing paths against kda_aot.prefill")
    parser.add_argument("--shape", type=int, nargs="+", metavar="INT", default=[1, 16],
                        help="H, then the packed sequences' lengths: --shape 4 8192 (default: 1 16)")
    args = parser.parse_args()
    if len(args.shape) < 2:
        parser.error("--shape takes the heads and at least one sequence length, e.g. --shape 4 8192")
    if args.engines:
        for name, us in engine_rows():
            print(f"| {name} | {us:.2f} us |")
    else:
        main(args.shape[0], args.shape[1:])
