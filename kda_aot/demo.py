"""The main job on a default problem: run prefill and check it against the float64 reference.

    python -m kda_aot.demo [--heads 4] [--seq-lens 300 17 1024] [--device-only]

On a machine without a usable GPU it says so and runs the CPU reference instead (the chunked
algorithm with emulated bf16/fp16 rounding against the float64 per-token gold). Needs torch.
"""

from __future__ import annotations

import argparse
import sys
import time


def _gpu_reason(kda_aot) -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    if torch.cuda.get_device_capability()[0] != 9:
        return "the kernels are built for Hopper (sm_90a)"
    info = kda_aot.info()
    if info.get("library") is None:
        return info.get("error", "library not found")
    if not info.get("devices"):
        return info.get("device_error", "library sees no device")
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kda_aot.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[300, 17, 1024])
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("the demo needs torch (pip install torch)")
        return 2
    import kda_aot
    from kda_aot import reference

    H, lens = args.heads, args.seq_lens
    print(f"kda-aot {kda_aot.__version__}: KDA prefill, H={H}, packed sequences {lens}, bf16 states")
    reason = _gpu_reason(kda_aot)
    device = "cpu" if reason else "cuda"
    x = reference.make_inputs(lens, H, seed=0, device=device, state="bf16")
    t0 = time.perf_counter()
    gold_o, gold_s = reference.gold_prefill(**{k: (v.cpu() if hasattr(v, "cpu") else v) for k, v in x.items()})
    t_gold = time.perf_counter() - t0
    if reason:
        print(f"no GPU run: {reason}. Running the CPU reference instead.")
        t0 = time.perf_counter()
        o, s = reference.chunked_prefill(**x, mode="emulate")
        what, elapsed = "CPU chunked reference (emulated rounding)", time.perf_counter() - t0
    else:
        kw = {k: v for k, v in x.items() if k not in ("q", "k", "v", "g", "beta")}
        run = lambda: kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=True,
                                      seq_lens=lens, **kw)
        run()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        o, s = run()
        torch.cuda.synchronize()
        what, elapsed = f"kda_aot.prefill on {torch.cuda.get_device_name()}", time.perf_counter() - t0
    err_o = reference.rel_rmse(o.cpu(), gold_o)
    err_s = reference.rel_rmse(s.cpu(), gold_s)
    print(f"{what}: {elapsed * 1e3:.2f} ms (float64 gold on CPU: {t_gold:.1f} s)")
    # Acceptance bounds of kda_spec.md 5.3: output 6e-3 for packed batches, final state 5e-3.
    print(f"relative RMSE vs float64 gold: output {err_o:.2e} (bound 6e-3), final state {err_s:.2e} (bound 5e-3)")
    ok = err_o < 6e-3 and err_s < 5e-3
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
