"""Benchmark: kda_aot.prefill against the memory floor and, when importable, FLA's chunk_kda and
FlashKDA (`flash_kda`, built from its public source; its output is checked bit for bit against ours).

    python -m kda_aot.bench [--suite serial|cp|large|all] [--iters 100] [--warmup 20] [--md FILE] [--accurate]
                            [--value-split S ...] [--k2-kernel k2|regstate ...]

Method (docs/benchmarks.md; inputs of docs/algorithm.md §5.2): random inputs (q, k, v, g, beta ~ N(0,1) bf16, A_log and
dt_bias ~ U(0,1), lower_bound -5), bf16 initial and final state, median of `iters` CUDA-event
timings after `warmup` calls. The memory floor is the bytes prefill must move (q, k, v, g, out,
beta, states) over the device-to-device copy bandwidth measured in the same run. Needs torch and a
Hopper GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from typing import Callable, List, Sequence

from . import planner

SERIAL_SUITE = [(H, lens) for H in (64, 96) for lens in ([8192], [1300, 547, 2048, 963, 271, 3063], [1024] * 8)]
CP_SUITE = [(H, lens) for H in (4, 8) for lens in ([8192], [8192, 2048], [16384])]
# The two large rows of the speed issue (about 0.64 ms of memory floor each).
LARGE_SUITE = [(32, [4096] * 16), (64, [32768])]
# FlashKDA on the same kind of H200 (FlashKDA's published times, docs/benchmarks.md), for the table's last column.
FLASHKDA_MS = {(64, "8192"): 1.214, (64, "uneven6"): 0.991, (64, "8x1024"): 0.790,
               (96, "8192"): 1.417, (96, "uneven6"): 1.367, (96, "8x1024"): 1.173,
               (4, "8192"): 0.816, (4, "8192+2048"): 0.821, (4, "16384"): 1.603,
               (8, "8192"): 0.846, (8, "8192+2048"): 0.856, (8, "16384"): 1.628,
               (32, "16x4096"): 3.013, (64, "32768"): 4.743}


def shape_key(lens: Sequence[int]) -> str:
    if len(set(lens)) == 1 and len(lens) > 1:
        return f"{len(lens)}x{lens[0]}"
    if len(lens) == 6:
        return "uneven6"
    return "+".join(map(str, lens))


def time_ms(fn: Callable[[], object], iters: int, warmup: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 20, 5)
    return 2 * nbytes / (ms * 1e-3)


def make_case(H: int, lens: List[int], seed: int = 0):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    T, N = sum(lens), len(lens)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    rnd = lambda *shape: torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)
    x = dict(q=rnd(1, T, H, 128), k=rnd(1, T, H, 128), v=rnd(1, T, H, 128), g=rnd(1, T, H, 128),
             beta=rnd(1, T, H),
             A_log=torch.rand(H, generator=gen, device="cuda"),
             dt_bias=torch.rand(H, 128, generator=gen, device="cuda"),
             initial_state=rnd(N, H, 128, 128))
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    out = torch.empty(1, T, H, 128, **bf)
    final = torch.empty(N, H, 128, 128, **bf)
    return x, cu, out, final


def floor_bytes(H: int, lens: Sequence[int]) -> int:
    T, N = sum(lens), len(lens)
    return T * H * (5 * 128 * 2 + 2) + 2 * N * H * 128 * 128 * 2


def fla_runner(x, cu, H):
    """FLA's chunk_kda with the flags FlashKDA compares against, or None when FLA is absent."""
    try:
        from fla.ops.kda import chunk_kda
    except Exception:
        return None

    h0 = x["initial_state"].float()  # FLA keeps an fp32 state
    dt = x["dt_bias"].reshape(-1)
    cu64 = cu.long()

    def run():
        return chunk_kda(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], A_log=x["A_log"], dt_bias=dt,
                         initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                         use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
                         lower_bound=-5.0, cu_seqlens=cu64, state_v_first=True)
    try:
        run()
    except Exception as exc:  # an FLA version with other argument names
        print(f"  (fla chunk_kda not comparable here: {exc})", file=sys.stderr)
        return None
    return run


def flashkda_runner(x, cu, H, ours):
    """FlashKDA's own forward (the `flash_kda` package, when a build of it is importable) on the
    same inputs, called as its users call it: device int64 cu_seqlens, bf16 states. Returns
    (run, bitwise) where `bitwise` says whether its output and final state equal `ours` (our
    (out, final_state) on these inputs) bit for bit, the correctness contract; None without FlashKDA."""
    try:
        import flash_kda
    except Exception:
        return None
    import torch

    T = x["q"].shape[1]
    out = torch.empty(1, T, H, 128, dtype=torch.bfloat16, device="cuda")
    final = torch.empty_like(x["initial_state"])
    cu64 = cu.long()

    def run():
        flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], 128 ** -0.5, out, x["A_log"], x["dt_bias"], -5.0,
                      initial_state=x["initial_state"], final_state=final, cu_seqlens=cu64)
    try:
        out.fill_(float("nan"))
        final.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
    except Exception as exc:  # a FlashKDA version with another signature
        print(f"  (flash_kda.fwd not comparable here: {exc})", file=sys.stderr)
        return None
    bitwise = bool(torch.equal(out.view(torch.int16), ours[0].view(torch.int16))
                   and torch.equal(final.view(torch.int16), ours[1].view(torch.int16)))
    return run, bitwise


def eager_runner(x, cu, lens, n_sets: int = 4, hint: bool = False):
    """A serving loop's call: device cu_seqlens (and `seq_lens` when `hint`), outputs allocated by
    prefill, inputs cycling through `n_sets` copies so every call sees new pointers."""
    import kda_aot

    sets = [{k: t.clone() for k, t in x.items()} for _ in range(n_sets)]
    cus = [cu.clone() for _ in range(n_sets)]
    state = {"i": 0}

    def run():
        i = state["i"] = (state["i"] + 1) % n_sets
        y = sets[i]
        return kda_aot.prefill(y["q"], y["k"], y["v"], y["g"], y["beta"], A_log=y["A_log"], dt_bias=y["dt_bias"],
                               initial_state=y["initial_state"], output_final_state=True, cu_seqlens=cus[i],
                               seq_lens=list(lens) if hint else None)
    return run


def graph_runner(x, cu):
    """The eager call (device cu_seqlens only) captured once into a CUDA graph, replayed."""
    import torch

    import kda_aot

    def call():
        return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                               initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm-up: the plan is built outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


@contextlib.contextmanager
def forced_k2_kernel(kind: str):
    """KDA_K2_KERNEL=kind (launcher.k2_kernel_name) for the calls planned inside, the caller's value
    (or none) again after; plans are cached per problem, so the cache is emptied on entry and exit."""
    from kda_aot import api

    before = os.environ.get("KDA_K2_KERNEL")
    os.environ["KDA_K2_KERNEL"] = kind
    api._PLANS.clear()
    try:
        yield
    finally:
        if before is None:
            del os.environ["KDA_K2_KERNEL"]
        else:
            os.environ["KDA_K2_KERNEL"] = before
        api._PLANS.clear()


def host_us(fn, calls: int = 100, repeats: int = 7, busy: bool = True) -> float:
    """Host time per call, median of `repeats` batches of `calls`. With `busy`, each batch is
    queued behind a long sleep kernel, so no call waits for the device: what the caller's thread
    spends in prefill. Batches are short: a call queues up to 5 launches, and a full launch queue
    (about a thousand entries) would block the host. kda_aot.bench_op and ci/host_breakdown.py use
    it too."""
    import time

    import torch

    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        if busy:
            torch.cuda._sleep(int(5e8))
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kda_aot.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("serial", "cp", "large", "all"), default="serial")
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--value-split", type=int, nargs="*", default=None,
                        help="also time these forced K2 value splits (1, 2, 4)")
    parser.add_argument("--k2-kernel", nargs="*", default=None, choices=planner.K2_KERNELS,
                        help="also time the kernels mode with each of these K2 implementations forced "
                             "(KDA_K2_KERNEL; the planner's pick is in the other columns)")
    parser.add_argument("--accurate", action="store_true",
                        help='also time numerics="accurate" (kernels mode) and its ratio to the default "flashkda"')
    parser.add_argument("--md", help="write the table as markdown to this file")
    parser.add_argument("--json", help="write the rows as JSON to this file")
    parser.add_argument("--png", help="draw kda-aot's modes against the peers present (needs matplotlib)")
    parser.add_argument("--no-fla", action="store_true", help="skip FLA even when it is importable (Triton autotuning is slow)")
    parser.add_argument("--sweep-cp", action="store_true",
                        help="time forced CP segment counts x value splits on the CP suite (planner tuning)")
    parser.add_argument("--checkpoint-cost", action="store_true",
                        help="time checkpoint_every=64 against no checkpoints (H=64 [8192], serial and CP H=8)")
    args = parser.parse_args(argv)
    # Checked before anything is imported or allocated: a machine that cannot run the benchmark
    # gets one line and exit status 2, not a traceback (kda_aot/cli_checks.py).
    from .cli_checks import cannot_run, gpu_problem, torch_problem

    problem = torch_problem() or gpu_problem()
    if problem:
        return cannot_run("python -m kda_aot.bench", problem)
    import torch

    import kda_aot

    cases = {"serial": SERIAL_SUITE, "cp": CP_SUITE, "large": LARGE_SUITE,
             "all": SERIAL_SUITE + CP_SUITE + LARGE_SUITE}[args.suite]
    if args.sweep_cp:
        return sweep_cp(args)
    if args.checkpoint_cost:
        return checkpoint_cost(args)
    bw = copy_bandwidth()
    print(f"kda-aot {kda_aot.__version__} on {torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s, "
          f"median of {args.iters} CUDA-event timings around single calls after {args.warmup} warm-ups", flush=True)
    print("modes: kernels = identical tensors with host lengths and given outputs (kernel time only); eager = device "
          "cu_seqlens only, fresh inputs and outputs every call; eager+seq_lens = the same with the host hint; "
          "graph = the eager call replayed from a CUDA graph. host us = the caller's thread per call.", flush=True)
    splits = args.value_split or []
    header = (["H", "sequences", "floor ms", "kernels ms", "eager ms", "eager+seq_lens ms", "graph ms", "plan"]
              + [f"serial split {s} ms" for s in splits] + [f"kernels ms, K2={k}" for k in args.k2_kernel or []]
              + (["accurate kernels ms", "accurate / flashkda"] if args.accurate else [])
              + ["FLA ms", "FlashKDA ms (this run)", "FlashKDA bitwise", "graph vs FlashKDA",
                 "FlashKDA ms (published, same H200 kind)", "host us eager / +seq_lens / given buffers"])
    rows = []
    for H, lens in cases:
        x, cu, out, final = make_case(H, lens)
        call = lambda split=None, cp="auto", numerics="flashkda": kda_aot.prefill(
            x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
            initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu, seq_lens=lens,
            out=out, final_state=final, cp=cp, value_split=split, numerics=numerics)
        kernels_ms = time_ms(call, args.iters, args.warmup)
        eager, hinted = eager_runner(x, cu, lens), eager_runner(x, cu, lens, hint=True)
        eager_ms = time_ms(eager, args.iters, args.warmup)
        hinted_ms = time_ms(hinted, args.iters, args.warmup)
        replay = graph_runner(x, cu)
        graph_ms = time_ms(replay, args.iters, args.warmup)
        host = (host_us(eager), host_us(hinted), host_us(call))
        plan = kda_aot.plan_prefill(lens, H, sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
        plan_text = "serial" if plan.trivial else f"{plan.n_segments} segments (max {plan.max_segment_tiles} tiles)"
        split_ms = [time_ms(lambda s=s: call(s, "off"), args.iters, args.warmup) for s in splits]
        for kind in args.k2_kernel or []:
            with forced_k2_kernel(kind):
                split_ms.append(time_ms(call, args.iters, args.warmup))
        if args.accurate:
            acc_ms = time_ms(lambda: call(numerics="accurate"), args.iters, args.warmup)
            split_ms += [acc_ms, acc_ms / kernels_ms]
        fla = None if args.no_fla else fla_runner(x, cu, H)
        fla_ms = time_ms(fla, args.iters, args.warmup) if fla else None
        call()  # `out` and `final` now hold our result on these inputs, for FlashKDA's bitwise check
        fk = flashkda_runner(x, cu, H, (out, final))
        fk_ms = time_ms(fk[0], args.iters, args.warmup) if fk else None
        fk_cells = [fk_ms, ("yes" if fk[1] else "NO") if fk else None,
                    f"{fk_ms / graph_ms:.2f}x" if fk else None]
        key = shape_key(lens)
        row = [H, key, floor_bytes(H, lens) / bw * 1e3, kernels_ms, eager_ms, hinted_ms, graph_ms, plan_text,
               *split_ms, fla_ms, *fk_cells, FLASHKDA_MS.get((H, key)), " / ".join(f"{h:.1f}" for h in host)]
        rows.append(row)
        print("  " + " | ".join(_fmt(c) for c in row), flush=True)
        x = cu = out = final = eager = hinted = replay = fla = fk = None  # free this shape's tensors before the next one
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    table += ["", host_cost_table()]
    print("\n".join(table))
    if args.md:
        with open(args.md, "w") as f:
            f.write("\n".join(table) + "\n")
    if args.json:
        write_json(header, rows, args.json)
    if args.png:
        print(write_png(header, rows, args.png))
    return 0


def write_json(header, rows, path: str) -> None:
    """One object per shape, keyed by the table's column names (None where a peer is absent)."""
    import json

    with open(path, "w") as f:
        json.dump([dict(zip(header, row)) for row in rows], f, indent=1)


def write_png(header, rows, path: str) -> str:
    """A bar chart per shape of every column that holds times in ms (kda-aot's modes and the peers
    present); returns the line to print. matplotlib is optional: without it, say so."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"--png: matplotlib is not installed, no chart written to {path}"
    columns = [i for i, name in enumerate(header) if " ms" in name and name != "floor ms"
               and any(isinstance(row[i], float) for row in rows)]
    labels = [f"H={row[0]} {row[1]}" for row in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4))
    width = 0.8 / max(1, len(columns))
    for j, i in enumerate(columns):
        values = [row[i] if isinstance(row[i], float) else 0.0 for row in rows]
        ax.bar([k + j * width for k in range(len(rows))], values, width, label=header[i])
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(rows))], labels, rotation=30, ha="right")
    ax.set_ylabel("ms per call (median, CUDA events)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"chart written to {path}"


def host_cost_table(n_sets: int = 64) -> str:
    """Host cost of small calls (T=16, H=1; H=4 [8192] for CP), fresh tensors cycling through
    `n_sets` sets as a serving loop would: the issue's budget lines."""
    import torch

    import kda_aot

    def sets(H, lens, n):
        out = []
        for _ in range(n):
            x, cu, o, f = make_case(H, lens)
            out.append((x, cu, o, f, torch.empty(kda_aot.workspace_size(
                x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu), dtype=torch.uint8,
                device="cuda")))
        return out

    def looping(pool, given=False, varlen=True):
        it = {"i": 0}

        def run():
            it["i"] = (it["i"] + 1) % len(pool)
            x, cu, o, f, ws = pool[it["i"]]
            buffers = dict(out=o, final_state=f, workspace=ws) if given else {}
            return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                                   initial_state=x["initial_state"], output_final_state=True,
                                   cu_seqlens=cu if varlen else None, **buffers)
        return run

    small, cp = sets(1, [16], n_sets), sets(4, [8192], 8)
    lines = ["| host us per call (fresh tensors) | value |", "|---|---|"]
    for label, fn in (("serial, dense, outputs allocated", looping(small, varlen=False)),
                      ("serial, varlen cu_seqlens only, outputs allocated", looping(small)),
                      ("serial, varlen, out= final_state= workspace= given", looping(small, given=True)),
                      ("CP auto H=4 [8192], cu_seqlens only, outputs allocated", looping(cp)),
                      ("CP auto H=4 [8192], buffers given", looping(cp, given=True))):
        lines.append(f"| {label} | {host_us(fn):.1f} |")
    return "\n".join(lines)


CHECKPOINT_CASES = [(64, [8192], "off"), (8, [8192], "auto")]


def checkpoint_cost(args, every: int = 64) -> int:
    """What checkpoint_every adds (docs/state_pool.md): the same call with given buffers, with and
    without checkpoints (fresh checkpoint buffers are given too, so only kernel time differs)."""
    import torch

    import kda_aot

    print(f"checkpoint_every={every}: median of {args.iters} CUDA-event timings, given outputs, bf16 states")
    for H, lens, cp in CHECKPOINT_CASES:
        x, cu, out, final = make_case(H, lens)
        T = sum(lens)
        ck = torch.empty(T // every, H, 128, 128, device="cuda", dtype=torch.bfloat16)
        ix = torch.empty(T // every, 2, device="cuda", dtype=torch.int32)

        def call(checkpoints):
            extra = dict(checkpoint_every=every, checkpoints=ck, checkpoint_index=ix) if checkpoints else {}
            return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                                   dt_bias=x["dt_bias"], initial_state=x["initial_state"], output_final_state=True,
                                   cu_seqlens=cu, seq_lens=lens, out=out, final_state=final, cp=cp, **extra)
        base = time_ms(lambda: call(False), args.iters, args.warmup)
        with_ck = time_ms(lambda: call(True), args.iters, args.warmup)
        written = ck.numel() * ck.element_size()
        print(f"  H={H} {shape_key(lens)} cp={cp}: {base:.3f} ms -> {with_ck:.3f} ms with checkpoints "
              f"(+{(with_ck / base - 1) * 100:.1f} %, {T // every} checkpoints, {written / 2**20:.0f} MiB written)",
              flush=True)
    return 0


def sweep_cp(args) -> int:
    """Median ms of forced CP plans (segments per sequence x K2 value split) on the CP suite."""
    import kda_aot

    segments, splits = (8, 16, 32, 64), (1, 2, 4)
    print("| H | sequences | serial | auto | " + " | ".join(f"s{n}/v{v}" for n in segments for v in splits) + " |")
    for H, lens in CP_SUITE:
        x, cu, out, final = make_case(H, lens)

        def call(cp, split=None):
            return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                                   initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu,
                                   seq_lens=lens, out=out, final_state=final, cp=cp, value_split=split)
        row = [time_ms(lambda: call("off"), args.iters, args.warmup), time_ms(lambda: call("auto"), args.iters, args.warmup)]
        row += [time_ms(lambda n=n, v=v: call(n, v), args.iters, args.warmup) for n in segments for v in splits]
        print(f"| {H} | {shape_key(lens)} | " + " | ".join(f"{c:.3f}" for c in row) + " |", flush=True)
    return 0


def _fmt(c) -> str:
    if c is None:
        return "-"
    if isinstance(c, float):
        return f"{c:.3f}"
    return str(c)


if __name__ == "__main__":
    sys.exit(main())
