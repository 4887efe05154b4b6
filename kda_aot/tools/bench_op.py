"""Host cost of a call through the torch op against the direct kda_aot.prefill call.

    python -m kda_aot.bench_op [--calls 200] [--rounds 5] [--no-compile]

What it measures: microseconds of the caller's thread per call, with the GPU kept busy by a long
sleep kernel queued first (bench.host_us's method), so no call waits for the device. Every call
gets fresh tensors (cycling through sets, as a serving loop would), on a small problem (H=1,
T=16, packed with device cu_seqlens, bf16 initial and final state) where the host cost is all
there is. The difference between a row and the "direct" row is what that path adds: the
dispatcher for the op rows, the argument mapping (and the state transposes' launches) for
chunk_kda, the guards of the compiled function. Needs torch and a Hopper GPU.
"""

import argparse


def _host_us_each(fns, calls: int, rounds: int) -> list:
    from .bench import host_us_each

    return host_us_each(fns, calls, rounds)


def _cycling(sets, call):
    it = {"i": 0}

    def run():
        it["i"] = (it["i"] + 1) % len(sets)
        return call(sets[it["i"]])
    return run


def measure(calls: int = 200, rounds: int = 5, n_sets: int = 16, H: int = 1, lens=(16,), compile: bool = True):
    """[(label, host us per call)] for the direct call and each torch path."""
    import torch

    import kda_aot
    import kda_aot.torch as kt
    from .bench import make_case

    sets = []
    for i in range(n_sets):
        x, cu, out, final = make_case(H, list(lens), seed=i)
        ws = torch.empty(kda_aot.workspace_size(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                                                dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                                                output_final_state=True, cu_seqlens=cu), dtype=torch.uint8,
                         device="cuda")
        x.update(cu=cu, cu64=cu.long(), out=out, final=final, ws=ws, h0_kv=x["initial_state"].float().transpose(-1, -2)
                 .contiguous(), dt_flat=x["dt_bias"].reshape(-1))
        sets.append(x)

    def args(x):
        return x["q"], x["k"], x["v"], x["g"], x["beta"]

    def direct(x):
        return kda_aot.prefill(*args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                               output_final_state=True, cu_seqlens=x["cu"])

    def op(x):
        return kt.PREFILL(*args(x), x["A_log"], x["dt_bias"], -5.0, None, x["initial_state"], True, x["cu"])

    def wrapper(x):
        return kt.prefill(*args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                          output_final_state=True, cu_seqlens=x["cu"])

    def direct_given(x):
        return kda_aot.prefill(*args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                               output_final_state=True, cu_seqlens=x["cu"], out=x["out"], final_state=x["final"],
                               workspace=x["ws"])

    def op_given(x):
        return kt.PREFILL_OUT(*args(x), x["A_log"], x["dt_bias"], x["out"], x["final"], x["ws"], -5.0, None,
                              x["initial_state"], x["cu"])

    flags = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 safe_gate=True, lower_bound=-5.0)

    def fla_v_first(x):
        return kt.chunk_kda(*args(x), initial_state=x["initial_state"], output_final_state=True, state_v_first=True,
                            cu_seqlens=x["cu64"], A_log=x["A_log"], dt_bias=x["dt_flat"], **flags)

    def fla_k_first(x):
        return kt.chunk_kda(*args(x), initial_state=x["h0_kv"], output_final_state=True, cu_seqlens=x["cu64"],
                            A_log=x["A_log"], dt_bias=x["dt_flat"], **flags)

    paths = [("direct kda_aot.prefill (outputs allocated)", direct),
             ("torch.ops.kda_aot.prefill.default", op),
             ("kda_aot.torch.prefill (wrapper over the op)", wrapper),
             ("direct kda_aot.prefill, out= final_state= workspace= given", direct_given),
             ("torch.ops.kda_aot.prefill_out.default, same buffers", op_given),
             ("kda_aot.torch.chunk_kda, state_v_first=True", fla_v_first),
             ("kda_aot.torch.chunk_kda, [K, V] fp32 state (two transposes)", fla_k_first)]
    if compile:
        compiled = torch.compile(wrapper, fullgraph=True)
        paths.append(("torch.compile(fullgraph=True) of the wrapper", compiled))
    times = _host_us_each([_cycling(sets, fn) for _, fn in paths], calls, rounds)
    return list(zip((label for label, _ in paths), times))


def table(rows) -> str:
    base = rows[0][1]
    lines = ["| path | host us per call | vs direct |", "|---|---|---|"]
    lines += [f"| {label} | {us:.1f} | {us - base:+.1f} |" for label, us in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kda_aot.bench_op", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile row (compiling takes a while)")
    args = parser.parse_args(argv)
    # One line and exit status 2 where it cannot run, not a traceback (cli_checks.py).
    from .cli_checks import cannot_run, gpu_problem, torch_problem

    problem = torch_problem() or gpu_problem()
    if problem:
        return cannot_run("python -m kda_aot.bench_op", problem)
    print(table(measure(args.calls, args.rounds, compile=not args.no_compile)))
    return 0
