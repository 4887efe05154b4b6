"""One row of the benchmark: every mode of kda-aot and every peer present on one problem, and the
host-cost rows under the table.
"""

from __future__ import annotations

from .cases import errors, floor_bytes, gate_kwargs, gold_of, make_case, shape_key
from .report import FLASHKDA_MS
from .runners import (capture, cudnn_runner, eager_runner, fla_runner, flashkda_runner, flashkda_stable,
                      forced_k2_kernel, graph_runner)
from .timing import host_us, host_us_each, time_ms


def measure(args, H, lens, cls, form, x, cu, out, final, bw, sms, splits) -> dict:
    """One row: kda-aot's modes, then the peers, each with its error against the float64 gold.

    The gold (cases.gold_of) is computed on every row, of every class and gate form, unless
    --no-accuracy: then no error column is filled. With it, kda-aot's error is filled on every
    row and each peer's wherever that peer runs (FlashKDA on the safe gate, cuDNN's engine on the
    forms it serves, FLA unless --no-fla); on the correlated class these are the columns that
    tell the recipes apart."""
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
            row["FlashKDA bitwise"] = "yes" if fk[1] else ("NO" if flashkda_stable() else "no: earlier recipe")
            if gold is not None:  # its buffers hold its result of the bitwise check
                row["error FlashKDA"] = errors(fk[2], gold)
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
