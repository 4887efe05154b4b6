"""What running the preparation beside the recurrence could save, measured with the shipped kernels
(device diagnostic for the "K1 off the critical path" lever, docs/speed_limits.md).

    python3 ci/overlap_probe.py [--shape H LEN [LEN ...]] ... [--iters 50]

A prefill's program launches its kernels one after another on one stream. This probe runs the same
program split in two at the kernel after K1 (`k1_prepare*`): the head (tables, K1) on one stream
and the next kernel (pre_scan in a CP call, K2 in a serial one) on a second, concurrently, then
the rest after both. Every call of a problem computes the same values, so once a first whole call
has filled the workspace, the kernel beside K1 reads the previous call's finished K1 output: the
split run computes what the whole program does (checked bitwise), while its timing shows how the
two kernels share the SMs when resident together. That is the best case of any design that
prepares tiles ahead of the recurrence (ready flags, a persistent kernel) before its own
synchronisation costs, and the co-residency cost it cannot avoid.

Per shape it prints, in CUDA-event us per call (median of --iters): the whole program; the head
alone and the kernel beside it alone; both concurrently (each stream's own span and the wall);
and the split call end to end. The concurrent runs come twice: K1 launched first, as the program
orders them (its CTAs fill every SM, and the next kernel's wait for room), and the next kernel
launched first (its CTAs take their SMs, and K1's fill what room is left beside them), the order
a design would need in which the recurrence waits on per-tile flags that a K1 launched after it
sets. Needs torch and a Hopper GPU.
"""

import argparse
import statistics

import torch

import kda_aot
from kda_aot import api
from kda_aot.tools import bench
from kda_aot.intake import arguments
from kda_aot.plan.program import N_INPUTS, SLOT, STEP_DTYPE, pack_inputs


def problem(H, lens):
    x, cu, out, final = bench.make_case(H, list(lens))
    kw = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"], output_final_state=True,
              cu_seqlens=cu, cp="auto")
    ws = torch.empty(kda_aot.workspace_size(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw), dtype=torch.uint8,
                     device="cuda")

    def whole():
        return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], out=out, final_state=final, workspace=ws,
                               **kw)

    api.empty_cache()
    whole()
    torch.cuda.synchronize()
    (plan,) = api._PLANS.values()  # the one plan whole() built
    named = dict(x, cu_seqlens=cu, out=out, final_state=final, workspace=ws)
    ptrs = [0 if named.get(n) is None else named[n].data_ptr() for n in arguments.TENSOR_ARGS]
    return whole, plan.launch.program, ptrs, out, final


def runner(program, ptrs, first, last):
    """Launch steps [first, last) of `program` on a given stream, in one native call: a sub-range of
    the steps is a pointer into the same step array (each step names its own argument slots)."""
    steps_ptr = program._steps_arr.ctypes.data + first * STEP_DTYPE.itemsize

    def run(stream):
        if first == last:
            return
        inputs = list(ptrs) + [0]
        inputs[SLOT["stream"]] = stream.cuda_stream
        code = program.lib.run(program.device_id, steps_ptr, last - first, program._slots_ptr, program._n_slots,
                               pack_inputs(inputs), N_INPUTS)
        if code:
            program.lib.raise_run_error(code, program.names[first:last])
    return run


def median_us(fn, iters):
    """CUDA-event us of fn(), which returns its (start, end) event pairs to read, median of iters."""
    fn()
    torch.cuda.synchronize()
    rows = []
    for _ in range(iters):
        pairs = fn()
        torch.cuda.synchronize()
        rows.append([a.elapsed_time(b) * 1e3 for a, b in pairs])
    return [statistics.median(col) for col in zip(*rows)]


def probe(H, lens, iters):
    whole, program, ptrs, out, final = problem(H, lens)
    names = program.names
    k1 = next(i for i, n in enumerate(names) if n.startswith("k1_prepare"))
    head, beside, tail = runner(program, ptrs, 0, k1 + 1), runner(program, ptrs, k1 + 1, k1 + 2), \
        runner(program, ptrs, k1 + 2, len(names))
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731

    def timed(stream, fn):
        a, b = ev(), ev()
        a.record(stream)
        fn(stream)
        b.record(stream)
        return a, b

    def whole_call():
        return [timed(main, lambda s: whole())]

    def alone():
        return [timed(main, head), timed(main, beside)]

    def split(with_tail, beside_first=False):
        def call():
            start, joined, end = ev(), ev(), ev()
            start.record(main)
            side.wait_event(start)
            if beside_first:  # the next kernel's CTAs are dispatched first, K1's fill the room beside them
                b = timed(side, beside)
                h = timed(main, head)
            else:
                h = timed(main, head)
                b = timed(side, beside)
            joined.record(side)
            main.wait_event(joined)
            if with_tail:
                tail(main)
            end.record(main)
            return [h, b, (start, end)]
        return call

    ref_out, ref_final = out.clone(), final.clone()
    t_whole, = median_us(whole_call, iters)
    t_head, t_beside = median_us(alone, iters)
    c_head, c_beside, c_wall = median_us(split(False), iters)
    _, _, t_split = median_us(split(True), iters)
    r_head, r_beside, r_wall = median_us(split(False, beside_first=True), iters)
    _, _, r_split = median_us(split(True, beside_first=True), iters)
    same = torch.equal(out, ref_out) and torch.equal(final, ref_final)
    print(f"## H={H} {list(lens)}: {' > '.join(names)}")
    print(f"| whole program | {t_whole:.1f} us |")
    print(f"| head (tables, K1) alone / {names[k1 + 1]} alone | {t_head:.1f} / {t_beside:.1f} us |")
    print(f"| concurrently: head / beside / wall | {c_head:.1f} / {c_beside:.1f} / {c_wall:.1f} us |")
    print(f"| split call end to end (head beside the next kernel, then the rest) | {t_split:.1f} us |")
    print(f"| saved against the whole program | {t_whole - t_split:.1f} us |")
    print(f"| next kernel launched first, concurrently: head / beside / wall | {r_head:.1f} / {r_beside:.1f} / "
          f"{r_wall:.1f} us |")
    print(f"| next kernel launched first, split call end to end | {r_split:.1f} us |")
    print(f"| split call's output and final state bitwise equal to the whole program's | {same} |")
    if not same:
        raise SystemExit("the split call computed something else: the probe's premise does not hold")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python3 ci/overlap_probe.py", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs="+", action="append", metavar="INT",
                        help="H, then the packed sequences' lengths (repeatable; default: the CP and serial "
                             "rows of the speed targets)")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    shapes = args.shape or [[4, 16384], [8, 8192], [12, 32768], [48, 8192], [64, 8192]]
    for shape in shapes:
        if len(shape) < 2:
            parser.error("--shape takes the heads and at least one sequence length, e.g. --shape 4 8192")
    with torch.inference_mode():
        for H, *lens in shapes:
            probe(H, lens, args.iters)
