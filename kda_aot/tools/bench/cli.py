"""Benchmark: kda_aot.prefill against the memory floor and, when importable, the Hopper peers: FLA's
chunk_kda, FlashKDA (`flash_kda`, built from its public source; its output is checked bit for bit
against ours where it computes the stable-inverse recipe, flashkda_has_stable_inverse) and cuDNN's
Hopper KDA engine (through flashinfer's cuDNN path).

    python -m kda_aot.bench [--suite peers|serial|cp|large|all] [--gates model random long correlated]
                            [--gate-forms safe softplus log_decay] [--iters 100] [--warmup 20]
                            [--json FILE [--json-append]] [--md FILE] [--accurate] [--no-accuracy]
                            [--value-split S ...] [--k2-kernel k2|regstate ...]

Method (docs/benchmarks.md): each shape runs on the input classes of kda_aot/references/input_classes.py named
by --gates ("model": A_log and dt_bias as FLA's KimiDeltaAttention initialises them, long memory;
"random": N(0, 1) gates that forget within tens of tokens; "long": g ~ N(-8, 1); "correlated":
model's gates with nearly parallel keys, k = c + 0.05 N(0, 1) per head, and beta logits 6, the hard
case for the intra-chunk solve), in each gate form of --gate-forms ("safe": the bounded sigmoid
gate; "softplus"; "log_decay": the safe gate's log-decays given as an fp32 g), bf16 initial and
final state, median of `iters` CUDA-event timings after `warmup` calls. The memory floor is the
bytes prefill must move (q, k, v, g, out, beta, states) over the device-to-device copy bandwidth
measured in the same run. Accuracy: relative RMSE of the output and final state against the
float64 gold (kda_aot.reference.gold_prefill), computed on every row unless --no-accuracy, for
kda-aot and for each peer that runs on the row. Needs torch and a Hopper GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from .cases import GATE_CLASSES, GATE_FORMS, SUITES, class_cases, shape_key
from .costs import checkpoint_cost, contract_cost, state_io_cost, sweep_cp
from .measure import host_cost_rows, measure
from .report import cell_text, run_meta, write_json, write_png
from .timing import copy_bandwidth
from ...plan import planner


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kda_aot.bench", description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--suite", choices=tuple(SUITES), default="peers")
    parser.add_argument("--gates", nargs="+", choices=GATE_CLASSES, default=["model", "random"],
                        help="input classes of kda_aot/references/input_classes.py, each shape runs on each "
                             "(correlated: nearly parallel keys, large beta, model's gates)")
    parser.add_argument("--gate-forms", nargs="+", choices=GATE_FORMS, default=["safe", "softplus", "log_decay"],
                        help="gate forms of kda_aot.prefill; forms other than safe time kda-aot, FLA and cuDNN only")
    parser.add_argument("--shapes", nargs="+", default=None, metavar="H:LENS",
                        help="only these rows of the suite, e.g. 4:16384 64:uneven6 8:6000+2192 (the table's names)")
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--value-split", type=int, nargs="*", default=None,
                        help="also time these forced K2 value splits (1, 2, 4)")
    parser.add_argument("--k2-kernel", nargs="*", default=None, choices=planner.K2_KERNELS,
                        help="also time the kernels mode with each of these K2 implementations forced "
                             "(KDA_K2_KERNEL; the planner's pick is in the other columns)")
    parser.add_argument("--accurate", action="store_true",
                        help='also time numerics="accurate" (kernels mode) and its ratio to the default "flashkda"')
    parser.add_argument("--no-accuracy", action="store_true",
                        help="skip the float64 gold and the error columns (by default every row gets them, for "
                             "kda-aot and each peer that runs on it)")
    parser.add_argument("--md", help="write the table as markdown to this file")
    parser.add_argument("--json", help="write the run as JSON to this file (after every row)")
    parser.add_argument("--json-append", action="store_true",
                        help="keep the rows already in --json (another run on the same machine) and add these")
    parser.add_argument("--png", help="draw kda-aot's modes against the peers present (needs matplotlib)")
    parser.add_argument("--no-fla", action="store_true", help="skip FLA even when it is importable (Triton autotuning is slow)")
    parser.add_argument("--no-cudnn", action="store_true", help="skip cuDNN's engine even when it is importable")
    parser.add_argument("--sweep-cp", action="store_true",
                        help="time forced CP segment counts x value splits on the CP suite (planner tuning)")
    parser.add_argument("--checkpoint-cost", action="store_true",
                        help="time checkpoint_every=64 against no checkpoints (H=64 [8192], serial and CP H=8)")
    parser.add_argument("--state-io-cost", action="store_true",
                        help="time the serial K2 with its state I/O fixed at compile time against k2_ext, which reads "
                             "the state pointers at run time (KDA_K2_EXT=1), per state dtype, on the strided rows")
    parser.add_argument("--contract-cost", action="store_true",
                        help="time checkpoints at two given offsets per sequence (buffer and pool slots) against none "
                             "(H=64 [8192]), strided against contiguous inputs on three rows, and the host cost of "
                             "prefill, flashkda_compat.fwd and FLA's chunk_kda entry with the same buffers")
    args = parser.parse_args(argv)
    # Checked before anything is imported or allocated: a machine that cannot run the benchmark
    # gets one line and exit status 2, not a traceback (kda_aot/cli_checks.py).
    from ..cli_checks import cannot_run, gpu_problem, torch_problem

    problem = torch_problem() or gpu_problem()
    if problem:
        return cannot_run("python -m kda_aot.bench", problem)
    import torch

    import kda_aot

    if "k2" in (args.k2_kernel or []):
        from ...library.loader import MEASUREMENT_BUILD, get_library

        missing = get_library().missing_variants()
        if missing:
            return cannot_run("python -m kda_aot.bench", f"--k2-kernel k2 forces the mma.sync K2, which this "
                              f"library holds only at VB=32 (it lacks {len(missing)} measurement-only kernels, "
                              f"{missing[0]} among them). {MEASUREMENT_BUILD}")
    if args.sweep_cp:
        return sweep_cp(args)
    if args.checkpoint_cost:
        return checkpoint_cost(args)
    if args.contract_cost:
        return contract_cost(args)
    if args.state_io_cost:
        return state_io_cost(args)
    cases = []
    for case in SUITES[args.suite]:
        if case not in cases:  # "all" lists the two shapes the suites share once
            cases.append(case)
    if args.shapes:
        cases = [(H, lens) for H, lens in cases if f"{H}:{shape_key(lens)}" in set(args.shapes)]
    bw = copy_bandwidth()
    meta = run_meta(args, bw)
    print(f"kda-aot {kda_aot.__version__} on {meta['machine']}, copy bandwidth {bw / 1e12:.2f} TB/s, "
          f"median of {args.iters} CUDA-event timings around single calls after {args.warmup} warm-ups", flush=True)
    print("modes: kernels = identical tensors with host lengths and given outputs (kernel time only); eager = device "
          "cu_seqlens only, fresh inputs and outputs every call; eager+seq_lens = the same with the host hint; "
          "graph = the eager call replayed from a CUDA graph. host us = the caller's thread per call.", flush=True)
    for note in meta["notes"]:
        print("note: " + note, flush=True)
    splits = args.value_split or []
    header = (["H", "sequences", "gates", "gate", "g dtype", "floor ms", "kernels ms", "eager ms", "eager+seq_lens ms",
               "graph ms", "plan"]
              + [f"serial split {s} ms" for s in splits] + [f"kernels ms, K2={k}" for k in args.k2_kernel or []]
              + (["accurate kernels ms", "accurate / flashkda"] if args.accurate else [])
              + ["FLA ms", "FlashKDA ms (this run)", "FlashKDA bitwise", "graph vs FlashKDA",
                 "FlashKDA ms (published, same H200 kind)", "cuDNN graph ms", "cuDNN eager ms", "cuDNN host us",
                 "cuDNN note", "error kda-aot", "error cuDNN", "error FLA", "error FlashKDA",
                 "host us eager / +seq_lens / given buffers"])
    rows = []
    if args.json and args.json_append and os.path.exists(args.json):
        with open(args.json) as f:
            before = json.load(f)
        if isinstance(before, list):  # the first format: a list of rows
            before = {"rows": before}
        rows = [[r.get(c) for c in header] for r in before.get("rows", [])]
        meta["notes"] += [n for n in before.get("notes", []) if n not in meta["notes"]]
        if before.get("host_cost_records"):  # the entry points' records, added by hand (ci/bench_tables.py)
            meta["host_cost_records"] = before["host_cost_records"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for H, lens in cases:
        for cls in args.gates:
            for form, x, cu, out, final in class_cases(H, lens, cls, args.gate_forms):
                t0 = time.perf_counter()
                row = measure(args, H, lens, cls, form, x, cu, out, final, bw, sms, splits)
                rows.append([row.get(c) for c in header])
                print("  " + " | ".join(cell_text(c) for c in rows[-1]) + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
                if args.json:
                    write_json(header, rows, args.json, meta)
                x = cu = out = final = None  # free this case's tensors before the next one
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table += ["| " + " | ".join(cell_text(c) for c in row) + " |" for row in rows]
    host = host_cost_rows()
    meta["host_cost"] = host
    table += ["", "| host us per call (fresh tensors) | value |", "|---|---|"]
    table += [f"| {label} | {us:.1f} |" for label, us in host]
    print("\n".join(table))
    if args.md:
        with open(args.md, "w") as f:
            f.write("\n".join(table) + "\n")
    if args.json:
        write_json(header, rows, args.json, meta)
    if args.png:
        print(write_png(header, rows, args.png))
    return 0
