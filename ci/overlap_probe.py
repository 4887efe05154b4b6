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
from kda_aot import api, bench
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


def ready_program(program, ready_slot):
    """The same steps with K1 and the serial register-state K2 swapped for their ready-flag twins
    (build_kernels/registry.py, _ready_flags; measurement-only kernels): each twin takes the
    original's arguments and `ready` before the stream."""
    from kda_aot.plan.program import Program
    twin = Program(program.lib, program.device_id)
    for name, (kernel, first, count) in zip(program.names, program._steps):
        slots = list(program._slots[first:first + count])
        if name == "k1_prepare" or name.startswith("k2_regstate_inout_"):
            name = name + "_ready" if name != "k1_prepare" else "k1_prepare_ready"
            slots = slots[:-1] + [ready_slot] + slots[-1:]
        k = twin.lib.kernel(name)
        twin._steps.append((k.index, len(twin._slots), len(slots)))
        twin._slots.extend(slots)
        twin.names.append(name)
    return twin.finish()


def ready_probe(H, lens, iters, priority):
    """K1 beside the recurrence for real: tables, then the ready-flag K2 launched first on a second
    stream (`priority`) and the ready-flag K1 on the call's stream; the K2 waits for each tile's
    flag. Checked bitwise against the whole program; timed against the same steps in order."""
    whole, program, ptrs, out, final = problem(H, lens)
    names = program.names
    if not any(n.startswith("k2_regstate_inout_") for n in names):
        print(f"## H={H} {list(lens)}: {' > '.join(names)}: no serial register-state K2 with states, skipped")
        return
    ws_index = arguments.TENSOR_ARGS.index("workspace")
    plan_bytes = next(iter(api._PLANS.values())).launch.workspace_bytes
    cap_heads = H * (sum(lens) // 16 + len(lens) + 16)  # a bound on H * the tile capacity
    flag_off = (plan_bytes + 255) // 256 * 256
    ws2 = torch.empty(flag_off + 4 * cap_heads, dtype=torch.uint8, device="cuda")
    flags = ws2[flag_off:]
    ptrs2 = list(ptrs)
    ptrs2[ws_index] = ws2.data_ptr()
    twin = ready_program(program, (SLOT["workspace"], flag_off))
    k1 = twin.names.index("k1_prepare_ready")
    k2 = next(i for i, n in enumerate(twin.names) if n.endswith("_ready") and n.startswith("k2_"))
    assert k1 + 1 == k2 == len(twin.names) - 1, twin.names
    head, k1_only, k2_only = runner(twin, ptrs2, 0, k1), runner(twin, ptrs2, k1, k1 + 1), runner(twin, ptrs2, k2, k2 + 1)
    in_order = runner(program, ptrs, 0, len(names))
    main, side = torch.cuda.current_stream(), torch.cuda.Stream(priority=priority)
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731

    def ordered():
        a, b = ev(), ev()
        a.record(main)
        in_order(main)
        b.record(main)
        return [(a, b)]

    def beside():
        a, fork, joined, b = ev(), ev(), ev(), ev()
        a.record(main)
        flags.view(torch.int32).zero_()
        head(main)
        fork.record(main)
        side.wait_event(fork)
        k2_only(side)  # the recurrence's CTAs first: one per SM; K1's fill the room beside them
        k1_only(main)
        joined.record(side)
        main.wait_event(joined)
        b.record(main)
        return [(a, b)]

    ref_out, ref_final = out.clone(), final.clone()
    out.fill_(float("nan"))
    final.fill_(float("nan"))
    t_ordered, = median_us(ordered, iters)
    out.fill_(float("nan"))
    final.fill_(float("nan"))
    t_beside, = median_us(beside, iters)
    torch.cuda.synchronize()
    same = torch.equal(out, ref_out) and torch.equal(final, ref_final)
    print(f"## ready flags, H={H} {list(lens)}, side-stream priority {priority}: {' > '.join(twin.names)}")
    print(f"| the whole program in order / K1 beside K2 through ready flags | {t_ordered:.1f} / {t_beside:.1f} us |")
    print(f"| output and final state bitwise equal to the whole program's | {same} |")
    if not same:
        raise SystemExit("the ready-flag call computed something else")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python3 ci/overlap_probe.py", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs="+", action="append", metavar="INT",
                        help="H, then the packed sequences' lengths (repeatable; default: the CP and serial "
                             "rows of the speed targets)")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--ready", action="store_true",
                        help="run the measurement-only ready-flag K1 and K2 (serial shapes; a library built with "
                             "KDA_KERNEL_LATTICE=all)")
    args = parser.parse_args()
    shapes = args.shape or [[4, 16384], [8, 8192], [12, 32768], [48, 8192], [64, 8192]]
    for shape in shapes:
        if len(shape) < 2:
            parser.error("--shape takes the heads and at least one sequence length, e.g. --shape 4 8192")
    with torch.inference_mode():
        for H, *lens in shapes:
            if args.ready:
                for priority in (0, -1):
                    ready_probe(H, lens, args.iters, priority)
            else:
                probe(H, lens, args.iters)
