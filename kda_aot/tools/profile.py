"""Where one prefill call's time goes: host overhead and per-kernel device time.

    python -m kda_aot.profile --heads 4 --seq-lens 8192 --cp auto [--iters 50]

Prints the host time per call (Python validation, planning and launches, measured with the GPU
kept busy so no call waits), the CUDA-event time per call, and the device time of each kernel
(torch.profiler). Needs torch and a Hopper GPU.
"""

from __future__ import annotations

import argparse
import collections
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kda_aot.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[8192])
    parser.add_argument("--cp", default="auto")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--numerics", default="flashkda", choices=("flashkda", "accurate"))
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="also print the N Python functions with the most host time (cProfile)")
    args = parser.parse_args(argv)
    # One line and exit status 2 where it cannot run, not a traceback (cli_checks.py).
    from .cli_checks import cannot_run, gpu_problem, torch_problem

    problem = torch_problem() or gpu_problem()
    if problem:
        return cannot_run("python -m kda_aot.profile", problem)
    import torch
    from torch.profiler import ProfilerActivity, profile

    import kda_aot
    from . import bench

    cp = int(args.cp) if args.cp.isdigit() else args.cp
    x, cu, out, final = bench.make_case(args.heads, args.seq_lens)
    lens = args.seq_lens

    def call():
        return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                               initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu,
                               seq_lens=lens, out=out, final_state=final, cp=cp,
                               numerics=args.numerics)

    plan = kda_aot.plan_prefill(lens, args.heads, sm_count=torch.cuda.get_device_properties(0).multi_processor_count,
                                mode=cp)
    print(f"H={args.heads} seq_lens={lens} cp={cp!r} numerics={args.numerics}: {plan.reason}")
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    # Host cost: queue calls behind a long sleep kernel so none of them waits for the GPU.
    torch.cuda._sleep(int(2e9))
    t0 = time.perf_counter()
    for _ in range(args.iters):
        call()
    host_us = (time.perf_counter() - t0) / args.iters * 1e6
    torch.cuda.synchronize()
    if args.cprofile:
        _host_breakdown(call, args.iters, args.cprofile)
    gpu_ms = bench.time_ms(call, args.iters, 10)
    print(f"host {host_us:.1f} us/call, CUDA events {gpu_ms * 1e3:.1f} us/call")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.iters):
            call()
        torch.cuda.synchronize()
    per_kernel = collections.defaultdict(float)
    for evt in prof.events():
        if evt.device_type.name == "CUDA":
            per_kernel[evt.name[:90]] += evt.device_time_total if hasattr(evt, "device_time_total") else evt.cuda_time_total
    total = sum(per_kernel.values()) / args.iters
    print(f"device time {total:.1f} us/call:")
    for name, us in sorted(per_kernel.items(), key=lambda kv: -kv[1]):
        print(f"  {us / args.iters:8.1f} us  {name}")
    return 0


def _host_breakdown(call, iters: int, top: int) -> None:
    """cProfile of `iters` calls queued behind a sleep kernel (host time only)."""
    import cProfile
    import pstats

    import torch

    torch.cuda._sleep(int(2e9))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        call()
    prof.disable()
    torch.cuda.synchronize()
    print(f"host time by function over {iters} calls (cProfile adds its own overhead):")
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)
