"""Cross-GPU context parallelism on real ranks: correctness against single-GPU prefill
and timings, for `torchrun --nproc-per-node N` (NCCL, one GPU per rank) or a one-GPU smoke run
(gloo, every rank on cuda:0). ci/distributed_run.sh is the wrapper with the timeouts.

    torchrun --nproc-per-node 2 ci/distributed_run.py [--backend nccl] [--out DIR]
    torchrun --nproc-per-node 2 ci/distributed_run.py --backend gloo --same-device --heads 8 --iters 3

Per shape (H in --heads; one sequence of --tokens tokens split evenly; a varlen batch of three
sequences, the middle one spanning the two-rank boundary) and state (none, bf16, fp32 initial state; final states always):
  correctness on rank 0: the distributed output and final states, gathered, against
    kda_aot.prefill(cp="off") of the whole batch on rank 0's GPU: rank 0's rows and the final states
    of sequences that begin and end on rank 0 bit for bit; everything as close to the float64 gold
    (reference.gold_prefill on rank 0's GPU; --no-gold skips it) as serial is: the CP bound of
    tests/gpu/test_cp_long_memory.py, 1.1 x serial's relative RMSE + 2e-4. Inputs keep state over
    thousands of tokens (g ~ N(-8, 1)), so a wrong carry shows;
  the distributed calls of the check run every local piece with cp="off";
  timings (fp32 states, cp="auto"; median of --iters, CUDA events, ms): one GPU (whole batch on rank
    0), the distributed call (slowest rank per iteration), the exchange alone, and the one-GPU pieces
    the cost model of docs/distributed.md adds up (a slice's serial prefill, its transfer), with
    the model's prediction.
Rank 0 prints a table and writes $OUT/distributed_run.json (or --out).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (never cuMulticastCreate)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SLACK, FLOOR = 1.1, 2e-4


def _args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    p.add_argument("--same-device", action="store_true", help="every rank on cuda:0 (one-GPU smoke run)")
    p.add_argument("--heads", type=int, nargs="+", default=[8, 64])
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--states", nargs="+", default=["none", "bf16", "fp32"], choices=("none", "bf16", "fp32"))
    p.add_argument("--no-gold", dest="gold", action="store_false", help="skip the float64 bound (smoke runs)")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timeout", type=int, default=540, help="seconds this rank may run (SIGALRM)")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/kda-gpu-out"))
    return p.parse_args()


def _inputs(lens, H, state, device, seed=0):
    """The whole batch, identical on every rank (drawn on the device from the seed)."""
    T, N = sum(lens), len(lens)
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    bf = torch.bfloat16
    x = dict(q=randn(1, T, H, 128).to(bf), k=randn(1, T, H, 128).to(bf), v=randn(1, T, H, 128).to(bf),
             g=(randn(1, T, H, 128) - 8.0).to(bf), beta=randn(1, T, H).to(bf),
             A_log=torch.rand(H, generator=gen, device=device), dt_bias=torch.rand(H, 128, generator=gen, device=device))
    dt = {"none": None, "bf16": bf, "fp32": torch.float32}[state]
    x["initial_state"] = None if dt is None else (0.1 * randn(N, H, 128, 128)).to(dt)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    x["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32, device=device)
    return x


def _gather(t, world, backend):
    """all_gather of equal-shaped tensors, through the host for gloo."""
    src = t if backend == "nccl" else t.cpu()
    parts = [torch.empty_like(src) for _ in range(world)]
    dist.all_gather(parts, src)
    return [p.to(t.device) for p in parts]


def _median_ms(fn, iters, warmup, world, backend, device):
    """Median over iterations of the slowest rank's CUDA-event time of fn() (ms)."""
    times = []
    for i in range(warmup + iters):
        dist.barrier()
        torch.cuda.synchronize(device)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= warmup:
            times.append(a.elapsed_time(b))
    t = torch.tensor(times, dtype=torch.float64, device=device if backend == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return statistics.median(t.tolist())


def _median_local(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    args = _args()
    signal.signal(signal.SIGALRM, lambda *_: (print(f"rank timed out after {args.timeout} s", flush=True),
                                             os._exit(124)))
    signal.alarm(args.timeout)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", 0 if args.same_device else local)
    torch.cuda.set_device(device)
    if "MASTER_ADDR" not in os.environ:  # a plain `python ci/distributed_run.py`: one rank
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    dist.init_process_group(args.backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=180))
    import kda_aot
    import kda_aot.distributed as kd
    from kda_aot import reference

    T = args.tokens
    if T % world:
        raise SystemExit(f"--tokens {T} must split evenly over {world} ranks")
    t_loc = T // world
    shapes = {"one": [T], "varlen": [T // 3, T - 2 * (T // 3) + T // 6, T // 3 - T // 6]}
    rows, checks = [], []
    for H in args.heads:
        for shape, lens in shapes.items():
            for state in args.states:
                x = _inputs(lens, H, state, device)
                off = rank * t_loc
                part = {n: x[n][:, off:off + t_loc].contiguous() for n in ("q", "k", "v", "g", "beta")}
                kw = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                          output_final_state=True, token_offset=off, seq_lens=lens)
                res = kd.prefill(**part, **kw, cp="off")  # serial locally: rank 0 is then serial's bits
                # gather the outputs and the final states (padded to N rows, with their ids) to every rank
                N = len(lens)
                fs = torch.zeros(N, H, 128, 128, dtype=torch.float32, device=device)
                ids = torch.full((N,), -1, dtype=torch.int64, device=device)
                for i, n in enumerate(res.final_seqs):
                    fs[i] = res.final_state[i].float()
                    ids[i] = n
                o_all = torch.cat(_gather(res.o, world, args.backend), dim=1)
                fs_all, ids_all = _gather(fs, world, args.backend), _gather(ids, world, args.backend)
                if rank == 0:
                    serial = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                                             dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                                             output_final_state=True, cu_seqlens=x["cu_seqlens"], seq_lens=lens,
                                             cp="off")
                    finals = torch.zeros(N, H, 128, 128, dtype=torch.float32, device=device)
                    seen = []
                    for f, idx in zip(fs_all, ids_all):
                        for i, n in enumerate(idx.tolist()):
                            if n >= 0:
                                finals[n] = f[i]
                                seen.append(n)
                    starts = [sum(lens[:n]) for n in range(N)]
                    ends_on_0 = [n for n in range(N) if starts[n] + lens[n] <= t_loc]
                    c = dict(H=H, shape=shape, lens=lens, state=state, world=world,
                             every_final_once=sorted(seen) == list(range(N)),
                             no_nan=not (torch.isnan(o_all).any() or torch.isnan(finals).any()).item(),
                             rank0_rows_bitwise=torch.equal(o_all[:, :t_loc], serial[0][:, :t_loc]),
                             rank0_finals_bitwise=all(torch.equal(finals[n], serial[1][n].float()) for n in ends_on_0),
                             out_vs_serial=reference.rel_rmse(o_all, serial[0]),
                             final_vs_serial=reference.rel_rmse(finals, serial[1].float()))
                    c["ok"] = (c["every_final_once"] and c["no_nan"] and c["rank0_rows_bitwise"]
                               and c["rank0_finals_bitwise"])
                    if args.gold:
                        gold = reference.gold_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"],
                                                      x["dt_bias"], -5.0, initial_state=x["initial_state"],
                                                      cu_seqlens=x["cu_seqlens"])
                        c.update(out_serial_vs_gold=reference.rel_rmse(serial[0], gold[0]),
                                 out_dist_vs_gold=reference.rel_rmse(o_all, gold[0]),
                                 final_serial_vs_gold=reference.rel_rmse(serial[1], gold[1]),
                                 final_dist_vs_gold=reference.rel_rmse(finals, gold[1]))
                        c["ok"] = c["ok"] and all(c[f"{w}_dist_vs_gold"] <= SLACK * c[f"{w}_serial_vs_gold"] + FLOOR
                                                  for w in ("out", "final"))
                        del gold
                    checks.append(c)
                    print(f"check H={H} {shape} state={state}: {'ok' if c['ok'] else 'FAILED'} "
                          f"vs serial: out {c['out_vs_serial']:.2e} final {c['final_vs_serial']:.2e}; "
                          + (f"vs gold: out {c['out_dist_vs_gold']:.2e} (serial {c['out_serial_vs_gold']:.2e}) "
                             f"final {c['final_dist_vs_gold']:.2e} (serial {c['final_serial_vs_gold']:.2e}); "
                             if args.gold else "")
                          + f"rank0 bitwise {c['rank0_rows_bitwise']}/{c['rank0_finals_bitwise']}", flush=True)
                if state != "fp32":
                    continue
                # timings, fp32 states
                r = dict(H=H, shape=shape, lens=lens, world=world, backend=args.backend)
                r["distributed_ms"] = _median_ms(lambda: kd.prefill(**part, **kw, cp="auto"), args.iters,
                                                 args.warmup, world, args.backend, device)
                payload = torch.randn(kd.payload_floats(H), device=device)
                r["exchange_ms"] = _median_ms(lambda: kd.exchange(payload), args.iters, args.warmup, world,
                                              args.backend, device)
                dist.barrier()
                if rank == 0:
                    whole = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                                 output_final_state=True, cu_seqlens=x["cu_seqlens"], seq_lens=lens)
                    r["one_gpu_auto_ms"] = _median_local(
                        lambda: kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], cp="auto", **whole),
                        args.iters, args.warmup)
                    sl = {n: x[n][:, :t_loc].contiguous() for n in ("q", "k", "v", "g", "beta")}
                    s0 = torch.zeros(1, H, 128, 128, device=device)
                    cu1 = torch.tensor([0, t_loc], dtype=torch.int32, device=device)
                    r["slice_serial_ms"] = _median_local(  # what a head piece costs: one sequence from a state
                        lambda: kda_aot.prefill(**sl, A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=s0,
                                                output_final_state=True, cu_seqlens=cu1, seq_lens=[t_loc], cp="auto"),
                        args.iters, args.warmup)
                    r["slice_transfer_ms"] = _median_local(
                        lambda: kd.slice_transfer(**sl, A_log=x["A_log"], dt_bias=x["dt_bias"]), args.iters,
                        args.warmup)
                    # docs/distributed.md: before the exchange the slowest of rank 0's own work and a middle
                    # rank's transfer; after it the head piece (one slice from its entry state)
                    pre = r["slice_serial_ms"] if world <= 2 else max(r["slice_serial_ms"], r["slice_transfer_ms"])
                    r["predicted_ms"] = pre + r["exchange_ms"] + (r["slice_serial_ms"] if world > 1 else 0.0)
                    rows.append(r)
                dist.barrier()
                del x, part, res
                torch.cuda.empty_cache()
    if rank == 0:
        print(f"\n{world} rank(s), backend {args.backend}, {T} tokens, median of {args.iters} (ms)")
        print("| H | batch | one GPU auto | distributed | predicted | exchange | slice serial | slice transfer |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['H']} | {r['shape']} {r['lens']} | {r['one_gpu_auto_ms']:.3f} | {r['distributed_ms']:.3f} | "
                  f"{r['predicted_ms']:.3f} | {r['exchange_ms']:.3f} | {r['slice_serial_ms']:.3f} | "
                  f"{r['slice_transfer_ms']:.3f} |")
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "distributed_run.json"), "w") as f:
            json.dump(dict(world=world, backend=args.backend, tokens=T, iters=args.iters, checks=checks, timings=rows,
                           device=torch.cuda.get_device_name(device), when=time.strftime("%Y-%m-%d %H:%M:%S")), f,
                      indent=1)
        failed = [c for c in checks if not c["ok"]]
        print(f"\ncorrectness: {len(checks) - len(failed)} of {len(checks)} passed")
    else:
        failed = []
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
