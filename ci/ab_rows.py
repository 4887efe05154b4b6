"""One side of an A/B of two builds (ci/ab_wheels.sh): the peers suite's rows through the installed
kda_aot, kernels mode and graph replay (ms, median of CUDA events), each kernel's device time
(torch.profiler, us per call) and a hash of the bits (output and final state), as JSON.

    python3 ci/ab_rows.py OUT.json [--classes model random] [--iters 200] [--numerics accurate]

Uses only what every build since the benchmark's input classes has (the benchmark's class_cases,
time_ms, graph_runner: kda_aot.tools.bench, or kda_aot.bench in builds before the tools moved), so
an older wheel runs it too. Kernel names are the build's own entry
symbols, which differ between builds whose kernels moved into classes; their order of launch does not.
"""

import argparse
import collections
import hashlib
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--classes", nargs="+", default=["model"])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--numerics", default="flashkda", choices=["flashkda", "accurate"])
    args = parser.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile

    import kda_aot
    try:
        from kda_aot.tools import bench
    except ImportError:  # a build before the measurement tools moved into kda_aot/tools/
        from kda_aot import bench

    res = {"kda_aot": kda_aot.__file__, "rows": {}}
    for H, lens in bench.PEERS_SUITE:
        for cls in args.classes:
            for _, x, cu, out, final in bench.class_cases(H, lens, cls, ["safe"]):
                def call():
                    return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], **bench.gate_kwargs(x),
                                           initial_state=x["initial_state"], output_final_state=True,
                                           cu_seqlens=cu, seq_lens=lens, out=out, final_state=final,
                                           numerics=args.numerics)
                # graph replay: the benchmark's eager call captured, or (accurate) this call captured
                graph = bench.graph_runner(x, cu) if args.numerics == "flashkda" else bench.capture(call)
                row = {"kernels ms": bench.time_ms(call, args.iters, 30), "graph ms": bench.time_ms(graph, args.iters, 30)}
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(20):
                        call()
                    torch.cuda.synchronize()
                per_kernel = collections.OrderedDict()
                for evt in prof.events():
                    if evt.device_type.name == "CUDA":
                        t = getattr(evt, "device_time_total", None)
                        per_kernel[evt.name[:80]] = per_kernel.get(evt.name[:80], 0.0) + (
                            t if t is not None else evt.cuda_time_total) / 20
                row["kernel us"] = per_kernel
                out.fill_(float("nan"))
                final.fill_(float("nan"))  # poisoned: the hash is of this call's bits
                call()
                torch.cuda.synchronize()
                row["bits"] = hashlib.sha256(out.view(torch.int16).cpu().numpy().tobytes()
                                             + final.view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16]
                key = f"{H}:{bench.shape_key(lens)}:{cls}" + ("" if args.numerics == "flashkda" else ":accurate")
                res["rows"][key] = row
                print(key, f"kernels {row['kernels ms']:.4f} graph {row['graph ms']:.4f} bits {row['bits']} "
                      + " ".join(f"{us:.1f}" for us in per_kernel.values()), flush=True)
                x = out = final = None
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
