"""The benchmark's cost modes, each against its baseline in one run: checkpoints (--checkpoint-cost),
the engine contracts (--contract-cost: given checkpoint offsets, strided inputs, segment_ids and
the entry points' host cost), state I/O fixed at compile time (--state-io-cost), and forced CP
plans (--sweep-cp).
"""

from __future__ import annotations

import contextlib

from .cases import CHECKPOINT_CASES, CP_SUITE, LISTED_ROW, STRIDED_ROWS, make_case, packed_views, shape_key
from .runners import forced_env
from .timing import host_us_each, time_ms


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
