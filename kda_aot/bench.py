"""Benchmark: kda_aot.prefill against the memory floor and, when importable, the Hopper peers: FLA's
chunk_kda, FlashKDA (`flash_kda`, built from its public source; its output is checked bit for bit
against ours where it computes the stable-inverse recipe, flashkda_has_stable_inverse) and cuDNN's
Hopper KDA engine (through flashinfer's cuDNN path).

    python -m kda_aot.bench [--suite peers|serial|cp|large|all] [--gates model random long]
                            [--gate-forms safe softplus log_decay] [--iters 100] [--warmup 20]
                            [--json FILE [--json-append]] [--md FILE] [--accurate] [--no-accuracy]
                            [--value-split S ...] [--k2-kernel k2|regstate ...]

Method (docs/benchmarks.md): each shape runs on the input classes of kda_aot/references/input_classes.py named
by --gates ("model": A_log and dt_bias as FLA's KimiDeltaAttention initialises them, long memory;
"random": N(0, 1) gates that forget within tens of tokens; "long": g ~ N(-8, 1)), in each gate form
of --gate-forms ("safe": the bounded sigmoid gate; "softplus"; "log_decay": the safe gate's
log-decays given as an fp32 g), bf16 initial and final state, median of `iters` CUDA-event timings
after `warmup` calls. The memory floor is the bytes prefill must move (q, k, v, g, out, beta,
states) over the device-to-device copy bandwidth measured in the same run. Accuracy: relative RMSE
of the output and final state against the float64 gold (kda_aot.reference.gold_prefill). Needs
torch and a Hopper GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
import time
from typing import Callable, List, Optional, Sequence

from .plan import planner

SERIAL_SUITE = [(H, lens) for H in (64, 96) for lens in ([8192], [1300, 547, 2048, 963, 271, 3063], [1024] * 8)]
CP_SUITE = [(H, lens) for H in (4, 8) for lens in ([8192], [8192, 2048], [16384])]
# The two large rows of the speed issue (about 0.64 ms of memory floor each).
LARGE_SUITE = [(32, [4096] * 16), (64, [32768])]
UNEVEN6 = [1300, 547, 2048, 963, 271, 3063]
# Hopper peers: the shapes where the cuDNN engine's truncated warm-up pays most and least.
PEERS_SUITE = [(4, [16384]), (8, [8192]), (8, [6000, 2192]), (12, [32768]), (48, [8192]), (64, [8192]),
               (64, UNEVEN6)]
SUITES = {"peers": PEERS_SUITE, "serial": SERIAL_SUITE, "cp": CP_SUITE, "large": LARGE_SUITE,
          "all": PEERS_SUITE + SERIAL_SUITE + CP_SUITE + LARGE_SUITE}
GATE_CLASSES = ("model", "random", "long")  # --gates: the classes of input_classes that model a layer's gates
GATE_FORMS = ("safe", "sigmoid", "softplus", "log_decay")
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


def floor_bytes(H: int, lens: Sequence[int], g_bytes: int = 2) -> int:
    """Bytes prefill must move: q, k, v, out (bf16), g (`g_bytes` each), beta, both states (bf16)."""
    T, N = sum(lens), len(lens)
    return T * H * (4 * 128 * 2 + 128 * g_bytes + 2) + 2 * N * H * 128 * 128 * 2


def to_device(arrays: dict, cache: Optional[dict] = None, state: str = "bf16") -> dict:
    """input_classes' NumPy arrays as CUDA tensors: q, k, v, beta bf16, g bf16 or fp32 (its
    g_dtype), A_log, dt_bias fp32, initial_state in `state` ("bf16" or "fp32"); the values of the
    bf16 ones are bf16-exact, so nothing is rounded. `cache` (id of a NumPy array -> tensor) shares the tensors of arrays that several
    gate forms of one draw have in common. Non-array entries (gate, lower_bound...) pass through."""
    import numpy as np
    import torch

    cache = {} if cache is None else cache
    dtypes = dict(q=torch.bfloat16, k=torch.bfloat16, v=torch.bfloat16, beta=torch.bfloat16,
                  g=torch.float32 if arrays.get("g_dtype") == "fp32" else torch.bfloat16,
                  A_log=torch.float32, dt_bias=torch.float32,
                  initial_state={"bf16": torch.bfloat16, "fp32": torch.float32}[state])
    out = {}
    for name, value in arrays.items():
        if not isinstance(value, np.ndarray):
            out[name] = value
            continue
        key = (id(value), dtypes[name])
        if key not in cache:
            cache[key] = (value, torch.from_numpy(value).to("cuda").to(dtypes[name]))  # the array is kept alive
        out[name] = cache[key][1]
    return out


def class_cases(H: int, lens: List[int], cls: str, forms: Sequence[str], seed: int = 0):
    """Yield (form, x, cu, out, final) for each gate form of one draw of class `cls`: the same
    q, k, v, beta, gate input and bf16 initial state in every form (input_classes.regate)."""
    import torch

    from .references import input_classes

    base = input_classes.make_class_inputs(cls, 1, sum(lens), H, gate="safe", seed=seed, state="bf16",
                                           n_states=len(lens))
    cu = torch.from_numpy(input_classes.cu_seqlens(lens)).to("cuda")
    cache = {}
    for form in forms:
        x = to_device(input_classes.regate(base, form, seed=seed) if form != "safe" else base, cache)
        out = torch.empty(1, sum(lens), H, 128, device="cuda", dtype=torch.bfloat16)
        final = torch.empty(len(lens), H, 128, 128, device="cuda", dtype=torch.bfloat16)
        yield form, x, cu, out, final


def gate_kwargs(x) -> dict:
    """The gate arguments of kda_aot.prefill for a class case (absent on make_case's: safe gate)."""
    return dict(A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=x.get("lower_bound", -5.0),
                gate=x.get("gate", "safe"))


def fla_runner(x, cu, H):
    """FLA's chunk_kda in the gate form of `x` (FlashKDA's flags for the safe gate; the mapping of
    docs/frameworks.md for the others), or None when FLA is absent. Returns run() -> (o, state)."""
    try:
        from fla.ops.kda import chunk_kda
    except Exception:
        return None

    h0 = x["initial_state"].float()  # FLA keeps an fp32 state
    form = x.get("gate", "safe")
    cu64 = cu.long()
    if form == "log_decay":
        gate = dict(use_gate_in_kernel=False, safe_gate=False, lower_bound=None, A_log=None, dt_bias=None)
    else:
        gate = dict(use_gate_in_kernel=True, safe_gate=form == "safe", lower_bound=x.get("lower_bound", -5.0),
                    A_log=x["A_log"], dt_bias=x["dt_bias"].reshape(-1))

    def run():
        return chunk_kda(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], initial_state=h0,
                         output_final_state=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                         cu_seqlens=cu64, state_v_first=True, **gate)
    try:
        run()
    except Exception as exc:  # an FLA version with other argument names
        print(f"  (fla chunk_kda not comparable here: {exc})", file=sys.stderr)
        return None
    return run


def cudnn_runner(x, cu):
    """cuDNN's Hopper KDA engine (kda_hopper_cuda) through flashinfer.cudnn.cudnn_recurrent_kda,
    the function behind flashinfer.recurrent_kda(backend="cudnn"), called with output= and
    output_state= so that it neither allocates nor overwrites the initial state (the facade copies
    the final state into initial_state on every call). Returns (run, out, final, None), or
    (None, None, None, why) when it cannot run this case."""
    try:
        from flashinfer.cudnn import cudnn_recurrent_kda
    except Exception as exc:
        return None, None, None, f"flashinfer's cuDNN path is not importable ({type(exc).__name__}: {exc})"
    import torch

    form = x.get("gate", "safe")
    if form not in ("safe", "sigmoid", "log_decay"):
        # Its in-kernel gate is the bounded sigmoid one; a None bound means -5 there, not softplus.
        return None, None, None, f"gate={form!r}: the engine's in-kernel gate is the bounded sigmoid gate only"
    T, H = x["q"].shape[1], x["q"].shape[2]
    out = torch.empty(1, T, H, 128, dtype=torch.bfloat16, device="cuda")
    final = torch.empty_like(x["initial_state"])
    in_kernel = form != "log_decay"

    def run():
        return cudnn_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"] if in_kernel else None,
                                   dt_bias=x["dt_bias"] if in_kernel else None, initial_state=x["initial_state"],
                                   output_final_state=True, use_qk_l2norm_in_kernel=True,
                                   use_gate_in_kernel=in_kernel, lower_bound=x.get("lower_bound", -5.0) if in_kernel
                                   else None, cu_seqlens=cu, beta_is_logit=True, output=out, output_state=final)
    try:
        t0 = time.perf_counter()
        run()  # the first call builds the graph and compiles the kernel with NVRTC
        torch.cuda.synchronize()
        print(f"  (cuDNN engine: first call {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    except Exception as exc:
        return None, None, None, f"the engine declined ({type(exc).__name__}: {str(exc)[:300]})"
    return run, out, final, None


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


# The stable recipe measures about 2e-2 on flashkda_has_stable_inverse's input, the Neumann one 0.3
# and more, or non-finite values.
NEUMANN_ERROR = 0.1
FLASHKDA_EARLIER_RECIPE = ("this FlashKDA build computes its earlier recipe (the fp16 Neumann inverse): its bits "
                           "differ from kda-aot's stable-inverse recipe by design")


@functools.lru_cache(maxsize=1)
def _flashkda_stable() -> bool:
    """flashkda_has_stable_inverse of the installed FlashKDA, asked once per process."""
    import flash_kda

    return flashkda_has_stable_inverse(flash_kda.fwd)


def flashkda_has_stable_inverse(fwd) -> bool:
    """Whether a FlashKDA `fwd` computes the stable intra-chunk inverse that kda-aot's default recipe
    is bitwise equal to (docs/numerics.md, "Bitwise equality with FlashKDA"), told by behaviour:
    on one key repeated over 512 tokens with a large beta (input_classes.repeated_key_case) its
    output is finite and within NEUMANN_ERROR of the float64 gold. Builds from before September
    2026 (the July source among them) form the inverse by the fp16 Neumann product and fail it."""
    import torch

    from . import reference
    from .references import input_classes

    x = input_classes.repeated_key_case(T=512, H=2)
    dev = {n: torch.from_numpy(x[n]).cuda().to(torch.bfloat16) for n in ("q", "k", "v", "g", "beta")}
    A_log, dt_bias = torch.from_numpy(x["A_log"]).cuda(), torch.from_numpy(x["dt_bias"]).cuda()
    out = torch.empty_like(dev["v"])
    fwd(dev["q"], dev["k"], dev["v"], dev["g"], dev["beta"], 128 ** -0.5, out, A_log, dt_bias, x["lower_bound"])
    o64, _ = reference.gold_prefill(dev["q"], dev["k"], dev["v"], dev["g"], dev["beta"], A_log, dt_bias,
                                    x["lower_bound"])
    return bool(torch.isfinite(out.float()).all()) and reference.rel_rmse(out, o64) < NEUMANN_ERROR


def eager_runner(x, cu, lens, n_sets: int = 4, hint: bool = False):
    """A serving loop's call: device cu_seqlens (and `seq_lens` when `hint`), outputs allocated by
    prefill, inputs cycling through `n_sets` copies so every call sees new pointers."""
    import torch

    import kda_aot

    sets = [{k: (t.clone() if torch.is_tensor(t) else t) for k, t in x.items()} for _ in range(n_sets)]
    cus = [cu.clone() for _ in range(n_sets)]
    state = {"i": 0}

    def run():
        i = state["i"] = (state["i"] + 1) % n_sets
        y = sets[i]
        return kda_aot.prefill(y["q"], y["k"], y["v"], y["g"], y["beta"], **gate_kwargs(y),
                               initial_state=y["initial_state"], output_final_state=True, cu_seqlens=cus[i],
                               seq_lens=list(lens) if hint else None)
    return run


def capture(call):
    """`call` captured once into a CUDA graph (after a warm-up on a side stream, so plans and
    caches are built outside the capture); returns the graph's replay."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def graph_runner(x, cu):
    """The eager call (device cu_seqlens only) captured once into a CUDA graph, replayed."""
    import kda_aot

    return capture(lambda: kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], **gate_kwargs(x),
                                           initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu))


def gold_of(x, cu):
    """The float64 gold (output, final state) of a class case."""
    from . import reference

    g = gate_kwargs(x)
    return reference.gold_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], g["A_log"], g["dt_bias"], g["lower_bound"],
                                  None, x["initial_state"], cu, gate=g["gate"])


def errors(result, gold):
    """[output, final state] relative RMSE of `result` against `gold`."""
    from . import reference

    return [reference.rel_rmse(result[0], gold[0]), reference.rel_rmse(result[1], gold[1])]


@contextlib.contextmanager
def forced_env(name: str, value: str):
    """The environment variable `name` set to `value` for the calls planned inside, the caller's
    value (or none) again after. The launcher reads its measurement switches (KDA_K2_KERNEL,
    launcher.k2_kernel_name; KDA_K2_EXT, launcher._forced_k2_ext) when a call is planned and plans
    are cached per problem, so the cache is emptied on entry and exit."""
    from kda_aot import api

    before = os.environ.get(name)
    os.environ[name] = value
    api._PLANS.clear()
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before
        api._PLANS.clear()


def forced_k2_kernel(kind: str):
    """KDA_K2_KERNEL=kind (one of planner.K2_KERNELS) for the calls planned inside."""
    return forced_env("KDA_K2_KERNEL", kind)


def host_us(fn, calls: int = 100, repeats: int = 7, busy: bool = True) -> float:
    """Host time per call, median of `repeats` batches of `calls`. With `busy`, each batch is
    queued behind a long sleep kernel, so no call waits for the device: what the caller's thread
    spends in prefill. Batches are short: a call queues up to 5 launches, and a full launch queue
    (about a thousand entries) would block the host. kda_aot.bench_op and ci/host_breakdown.py use
    it too; rows that are compared with each other go through host_us_each."""
    return host_us_each([fn], calls, repeats, busy)[0]


def host_us_each(fns: Sequence[Callable], calls: int = 100, repeats: int = 7, busy: bool = True) -> List[float]:
    """host_us of each of `fns`, their batches interleaved: batch r of every function runs before
    batch r + 1 of any. A machine whose speed drifts during the measurement (a freshly started one
    measured the same intake step at 17.6 us in its first minute and 8.7 us a few seconds later)
    then shifts every row alike, instead of inflating the rows timed first."""
    import time

    import torch

    for fn in fns:
        fn()
    torch.cuda.synchronize()
    samples: List[List[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, row in zip(fns, samples):
            if busy:
                torch.cuda._sleep(int(5e8))
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            row.append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
    return [statistics.median(row) for row in samples]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kda_aot.bench", description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--suite", choices=tuple(SUITES), default="peers")
    parser.add_argument("--gates", nargs="+", choices=GATE_CLASSES, default=["model", "random"],
                        help="input classes of kda_aot/references/input_classes.py, each shape runs on each")
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
    parser.add_argument("--no-accuracy", action="store_true", help="skip the float64 gold and the error columns")
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
    from .cli_checks import cannot_run, gpu_problem, torch_problem

    problem = torch_problem() or gpu_problem()
    if problem:
        return cannot_run("python -m kda_aot.bench", problem)
    import torch

    import kda_aot

    if "k2" in (args.k2_kernel or []):
        from .library.loader import MEASUREMENT_BUILD, get_library

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
                 "cuDNN note", "error kda-aot", "error cuDNN", "error FLA", "host us eager / +seq_lens / given buffers"])
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
                print("  " + " | ".join(_fmt(c) for c in rows[-1]) + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
                if args.json:
                    write_json(header, rows, args.json, meta)
                x = cu = out = final = None  # free this case's tensors before the next one
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
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


def measure(args, H, lens, cls, form, x, cu, out, final, bw, sms, splits) -> dict:
    """One row: kda-aot's modes, then the peers, then the errors against the float64 gold."""
    import torch

    import kda_aot

    safe = form == "safe"
    key = shape_key(lens)
    call = lambda split=None, cp="auto", numerics="flashkda": kda_aot.prefill(
        x["q"], x["k"], x["v"], x["g"], x["beta"], **gate_kwargs(x), initial_state=x["initial_state"],
        output_final_state=True, cu_seqlens=cu, seq_lens=lens, out=out, final_state=final, cp=cp,
        value_split=split, numerics=numerics)
    row = {"H": H, "sequences": key, "gates": cls, "gate": form, "g dtype": str(x["g"].dtype).replace("torch.", ""),
           "floor ms": floor_bytes(H, lens, x["g"].element_size()) / bw * 1e3}
    row["kernels ms"] = time_ms(call, args.iters, args.warmup)
    row["eager ms"] = time_ms(eager_runner(x, cu, lens), args.iters, args.warmup)
    if safe:
        row["eager+seq_lens ms"] = time_ms(eager_runner(x, cu, lens, hint=True), args.iters, args.warmup)
    row["graph ms"] = time_ms(graph_runner(x, cu), args.iters, args.warmup)
    plan = kda_aot.plan_prefill(lens, H, sm_count=sms)
    row["plan"] = "serial" if plan.trivial else f"{plan.n_segments} segments (max {plan.max_segment_tiles} tiles)"
    for s in splits:
        row[f"serial split {s} ms"] = time_ms(lambda s=s: call(s, "off"), args.iters, args.warmup)
    for kind in args.k2_kernel or []:
        with forced_k2_kernel(kind):
            row[f"kernels ms, K2={kind}"] = time_ms(call, args.iters, args.warmup)
    if args.accurate:
        row["accurate kernels ms"] = time_ms(lambda: call(numerics="accurate"), args.iters, args.warmup)
        row["accurate / flashkda"] = row["accurate kernels ms"] / row["kernels ms"]
    gold = None if args.no_accuracy else gold_of(x, cu)
    call()  # `out` and `final` now hold our result on these inputs
    if gold is not None:
        row["error kda-aot"] = errors((out, final), gold)
    fla = None if args.no_fla else fla_runner(x, cu, H)
    if fla:
        row["FLA ms"] = time_ms(fla, args.iters, args.warmup)
        if gold is not None:
            row["error FLA"] = errors(fla(), gold)
    if safe:
        fk = flashkda_runner(x, cu, H, (out, final))
        if fk:
            row["FlashKDA ms (this run)"] = time_ms(fk[0], args.iters, args.warmup)
            row["FlashKDA bitwise"] = "yes" if fk[1] else ("NO" if _flashkda_stable() else "no: earlier recipe")
            row["graph vs FlashKDA"] = f"{row['FlashKDA ms (this run)'] / row['graph ms']:.2f}x"
        if cls == "random":  # FlashKDA's published times are on N(0, 1) inputs
            row["FlashKDA ms (published, same H200 kind)"] = FLASHKDA_MS.get((H, key))
        row["host us eager / +seq_lens / given buffers"] = " / ".join(
            f"{us:.1f}" for us in host_us_each((eager_runner(x, cu, lens), eager_runner(x, cu, lens, hint=True), call)))
    if not args.no_cudnn:
        run, c_out, c_final, why = cudnn_runner(x, cu)
        if run is None:
            row["cuDNN note"] = why
        else:
            if gold is not None:
                run()
                row["error cuDNN"] = errors((c_out, c_final), gold)
            row["cuDNN eager ms"] = time_ms(run, args.iters, args.warmup)
            row["cuDNN host us"] = host_us(run, calls=20)
            try:  # last: a capture that fails must not disturb the measurements above
                row["cuDNN graph ms"] = time_ms(capture(run), args.iters, args.warmup)
            except Exception as exc:
                torch.cuda.synchronize()
                row["cuDNN note"] = f"no CUDA-graph capture ({type(exc).__name__}: {str(exc)[:200]}); eager only"
    return row


def run_meta(args, bw) -> dict:
    """What the JSON says about the run: machine, date, versions, the peers present and why not."""
    import datetime
    import importlib.metadata as md

    import torch

    import kda_aot

    def version(dist):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    peers = {name: version(dist) for name, dist in (("FLA", "fla-core"), ("flashinfer", "flashinfer-python"),
                                                     ("cudnn-frontend", "nvidia-cudnn-frontend"))}
    notes = []
    try:
        import flash_kda  # noqa: F401
        peers["FlashKDA"] = version("flash_kda") or "present"
        if not _flashkda_stable():
            peers["FlashKDA"] += " (earlier recipe: fp16 Neumann inverse)"
            notes.append(FLASHKDA_EARLIER_RECIPE + "; its times still compare")
    except Exception:
        peers["FlashKDA"] = None
    if peers["FlashKDA"] is None:
        notes.append("FlashKDA is not importable: its this-run column is empty (the published times are shown)")
    if peers["FLA"] is None or args.no_fla:
        notes.append("FLA is not importable or was skipped: its column is empty")
    if args.no_cudnn:
        notes.append("cuDNN's engine was skipped (--no-cudnn)")
    elif peers["flashinfer"] is None or peers["cudnn-frontend"] is None:
        notes.append("flashinfer-python or nvidia-cudnn-frontend is not installed: the cuDNN columns are empty")
    return {"format": 2, "machine": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
            "kda_aot": kda_aot.__version__, "torch": torch.__version__, "copy_bandwidth_TBps": bw / 1e12,
            "iters": args.iters, "warmup": args.warmup, "suite": args.suite, "peers": peers, "notes": notes}


def write_json(header, rows, path: str, meta: Optional[dict] = None) -> None:
    """The run as one object: `meta` (run_meta's keys) and "rows", one object per row keyed by
    the table's column names (None where a peer is absent); ci/bench_tables.py renders it."""
    with open(path, "w") as f:
        json.dump(dict(meta or {}, rows=[dict(zip(header, row)) for row in rows]), f, indent=1)


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
    extra = [i for i, name in enumerate(header) if name in ("gates", "gate")]
    labels = [" ".join([f"H={row[0]} {row[1]}"] + [str(row[i]) for i in extra]) for row in rows]
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


def host_cost_rows(n_sets: int = 64) -> list:
    """Host cost of small calls (T=16, H=1; H=4 [8192] for CP), fresh tensors cycling through
    `n_sets` sets as a serving loop would: [(label, us per call), ...]."""
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
    paths = (("serial, dense, outputs allocated", looping(small, varlen=False)),
             ("serial, varlen cu_seqlens only, outputs allocated", looping(small)),
             ("serial, varlen, out= final_state= workspace= given", looping(small, given=True)),
             ("CP auto H=4 [8192], cu_seqlens only, outputs allocated", looping(cp)),
             ("CP auto H=4 [8192], buffers given", looping(cp, given=True)))
    return [[label, us] for (label, _), us in zip(paths, host_us_each([fn for _, fn in paths]))]


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


STRIDED_ROWS = [(4, [16384]), (64, [8192]), (64, UNEVEN6)]


def packed_views(x: dict, T: int, H: int, extra: int = 64):
    """q, k, v, g as column slices of one [1, T, 4 H 128 + extra] projection and beta as a column
    slice of a [1, T, H + extra] one (token strides past the packed ones), holding x's values."""
    import torch

    proj = torch.empty(1, T, 4 * H * 128 + extra, device="cuda", dtype=torch.bfloat16)
    views = {}
    for i, name in enumerate(("q", "k", "v", "g")):
        views[name] = proj[:, :, i * H * 128:(i + 1) * H * 128].unflatten(2, (H, 128))
        views[name].copy_(x[name])
    wide = torch.empty(1, T, H + extra, device="cuda", dtype=torch.bfloat16)
    views["beta"] = wide[:, :, :H]
    views["beta"].copy_(x["beta"])
    return views


def contract_cost(args) -> int:
    """What the engine contracts cost (docs/state_pool.md, docs/design.md, docs/benchmarks.md "Host
    cost"): checkpoints at offsets, strided inputs, and the host cost of the compatible entry points."""
    import torch

    import kda_aot

    print(f"median of {args.iters} CUDA-event timings, given outputs and workspace, bf16 inputs, fp32 states")
    H, lens = 64, [8192]
    x, cu, out, _ = make_case(H, lens)
    N, T = len(lens), sum(lens)
    final = torch.empty(N, H, 128, 128, device="cuda", dtype=torch.float32)
    init = x["initial_state"].float()
    offsets = torch.tensor([[4096, 8000 // 16 * 16]] * N, device="cuda", dtype=torch.int32)
    ck = torch.empty(N, 2, H, 128, 128, device="cuda", dtype=torch.float32)
    pool = torch.zeros(4 * N, H, 128, 128, device="cuda", dtype=torch.float32)
    idx = torch.arange(N, device="cuda", dtype=torch.int32)
    slots = (N + torch.arange(2 * N, device="cuda", dtype=torch.int32)).view(N, 2)
    common = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=cu, seq_lens=lens, out=out)
    plain = dict(common, initial_state=init, output_final_state=True, final_state=final)
    calls = {"no checkpoints": lambda: kda_aot.prefill(*(x[n] for n in "qkvg"), x["beta"], **plain),
             "K=2 into checkpoint_state": lambda: kda_aot.prefill(
                 *(x[n] for n in "qkvg"), x["beta"], **plain, checkpoint_offsets=offsets, checkpoint_state=ck),
             "pool, no checkpoints": lambda: kda_aot.prefill(
                 *(x[n] for n in "qkvg"), x["beta"], **common, state_pool=pool, state_indices=idx),
             "pool, K=2 into pool slots": lambda: kda_aot.prefill(
                 *(x[n] for n in "qkvg"), x["beta"], **common, state_pool=pool, state_indices=idx,
                 checkpoint_offsets=offsets, checkpoint_slots=slots)}
    times = {label: time_ms(fn, args.iters, args.warmup) for label, fn in calls.items()}
    base, pool_base = times["no checkpoints"], times["pool, no checkpoints"]
    for label, ms in times.items():
        ref = pool_base if label.startswith("pool") else base
        print(f"  checkpoints H={H} {shape_key(lens)}: {label}: {ms:.3f} ms ({(ms / ref - 1) * 100:+.1f} %)",
              flush=True)
    x = out = final = ck = pool = None
    for H, lens in STRIDED_ROWS:
        x, cu, out, final = make_case(H, lens)
        views = packed_views(x, sum(lens), H)
        kw = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"], output_final_state=True,
                  cu_seqlens=cu, seq_lens=lens, out=out, final_state=final)
        packed = time_ms(lambda: kda_aot.prefill(*(x[n] for n in "qkvg"), x["beta"], **kw), args.iters, args.warmup)
        strided = time_ms(lambda: kda_aot.prefill(*(views[n] for n in "qkvg"), views["beta"], **kw), args.iters,
                          args.warmup)
        print(f"  strided H={H} {shape_key(lens)}: contiguous {packed:.3f} ms, column slices of one projection "
              f"{strided:.3f} ms ({(strided / packed - 1) * 100:+.1f} %)", flush=True)
    listed_cost(args)
    for label, us in entry_host_costs():
        print(f"  host {label}: {us:.1f} us per call", flush=True)
    return 0


LISTED_ROW = (32, [1024] * 16)  # H, lengths: a batch whose sequences a step lists some of


def listed_cost(args) -> None:
    """GPU time of a call with segment_ids (docs/state_pool.md, "Listed sequences") against the
    same call without one: its work should follow the listed sequences' tokens."""
    import torch

    import kda_aot

    H, lens = LISTED_ROW
    x, cu, out, final = make_case(H, lens)
    kw = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"], output_final_state=True,
              cu_seqlens=cu, out=out, final_state=final)
    full = time_ms(lambda: kda_aot.prefill(*(x[n] for n in "qkvg"), x["beta"], **kw), args.iters, args.warmup)
    print(f"  segment_ids H={H} {shape_key(lens)}: no list {full:.3f} ms", flush=True)
    for m in (len(lens), len(lens) // 2, 1, 0):
        ids = torch.arange(m, device="cuda", dtype=torch.int32)
        ms = time_ms(lambda: kda_aot.prefill(*(x[n] for n in "qkvg"), x["beta"], segment_ids=ids, **kw), args.iters,
                     args.warmup)
        print(f"  segment_ids H={H} {shape_key(lens)}: {m} of {len(lens)} listed {ms:.3f} ms "
              f"({ms / full * 100:.0f} % of no list)", flush=True)


def state_io_cost(args) -> int:
    """The serial K2 variant whose state I/O is fixed at compile time against k2_ext, which takes
    the same states as run-time pointers (null where absent): GPU time and whether the outputs
    agree bit for bit, per state dtype, FlashKDA's recipe."""
    import torch

    import kda_aot

    print(f"median of {args.iters} CUDA-event timings, given outputs, bf16 inputs (make_case)")
    for H, lens in STRIDED_ROWS:
        x, cu, out, _ = make_case(H, lens)
        N = len(lens)
        for label, dtype in (("no state", None), ("fp32 states", torch.float32), ("bf16 states", torch.bfloat16)):
            kw = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=cu, seq_lens=lens)
            final = None
            if dtype is not None:
                final = torch.empty(N, H, 128, 128, device="cuda", dtype=dtype)
                kw.update(initial_state=x["initial_state"].to(dtype), output_final_state=True, final_state=final)
            results = {}
            for path in ("compile-time", "k2_ext"):
                o = torch.full_like(out, float("nan"))
                if final is not None:
                    final.fill_(float("nan"))
                call = lambda: kda_aot.prefill(*(x[n] for n in "qkvg"), x["beta"], out=o, **kw)  # noqa: E731
                with (forced_env("KDA_K2_EXT", "1") if path == "k2_ext" else contextlib.nullcontext()):
                    ms = time_ms(call, args.iters, args.warmup)
                    call()
                    torch.cuda.synchronize()
                results[path] = (ms, o.clone(), None if final is None else final.clone())
            (a, oa, fa), (b, ob, fb) = results["compile-time"], results["k2_ext"]
            same = torch.equal(oa.view(torch.int16), ob.view(torch.int16)) and (
                fa is None or torch.equal(fa, fb))
            print(f"  H={H} {shape_key(lens)} {label}: compile-time state I/O {a:.3f} ms, k2_ext {b:.3f} ms "
                  f"({(b / a - 1) * 100:+.1f} %), outputs {'bitwise equal' if same else 'DIFFER'}", flush=True)
    return 0


def entry_host_costs(n_sets: int = 64) -> list:
    """Host us per eager call (fresh tensors cycling through n_sets sets, given out, final state
    and workspace; T=16, H=1, FlashKDA's configuration) of kda_aot.prefill,
    kda_aot.flashkda_compat.fwd and, when fla is installed, fla.ops.kda.chunk_kda through the
    registered backend (which allocates its outputs, so kda_aot.torch.chunk_kda is listed too)."""
    import torch

    import kda_aot
    import kda_aot.torch as kt
    from kda_aot import flashkda_compat

    H, lens = 1, [16]
    pool = []
    for i in range(n_sets):
        x, cu, o, f = make_case(H, lens, seed=i)
        f = f.float()
        ws = torch.empty(flashkda_compat.get_workspace_size(16, H, 1), dtype=torch.uint8, device="cuda")
        pool.append((x, cu, o, f, ws, x["initial_state"].float()))
    it = {"i": 0}

    def nxt():
        it["i"] = (it["i"] + 1) % n_sets
        return pool[it["i"]]

    def prefill():
        x, cu, o, f, ws, s0 = nxt()
        return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                               lower_bound=-5.0, scale=128 ** -0.5, initial_state=s0, output_final_state=True,
                               cu_seqlens=cu, out=o, final_state=f, workspace=ws)

    def compat():
        x, cu, o, f, ws, s0 = nxt()
        return flashkda_compat.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], 128 ** -0.5, o, x["A_log"],
                                   x["dt_bias"], -5.0, s0, f, cu, workspace=ws)

    ids = torch.zeros(1, dtype=torch.int32, device="cuda")

    def compat_listed():
        x, cu, o, f, ws, s0 = nxt()
        return flashkda_compat.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], 128 ** -0.5, o, x["A_log"],
                                   x["dt_bias"], -5.0, s0, f, cu, workspace=ws, segment_ids=ids)

    def torch_chunk():
        x, cu, o, f, ws, s0 = nxt()
        return kt.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=s0, output_final_state=True,
                            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0,
                            A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=cu, state_v_first=True)

    paths = [("kda_aot.prefill, buffers given", prefill),
             ("kda_aot.flashkda_compat.fwd, buffers given", compat),
             ("kda_aot.flashkda_compat.fwd, buffers given, segment_ids", compat_listed),
             ("kda_aot.torch.chunk_kda (outputs allocated)", torch_chunk)]
    try:
        from fla.ops.kda import chunk_kda as fla_chunk_kda
    except ImportError:
        fla_chunk_kda = None
    if fla_chunk_kda is not None:
        def fla():
            x, cu, o, f, ws, s0 = nxt()
            return fla_chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=s0,
                                 output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                 safe_gate=True, lower_bound=-5.0, A_log=x["A_log"], dt_bias=x["dt_bias"],
                                 cu_seqlens=cu, state_v_first=True)
        paths.append(("fla.ops.kda.chunk_kda via the kda-aot backend (outputs allocated)", fla))
    with torch.inference_mode():
        return list(zip((label for label, _ in paths), host_us_each([fn for _, fn in paths])))


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
