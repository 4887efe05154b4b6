"""The main job on a default problem: run KDA prefill and check what can be promised about it.

    python -m kda_aot.demo [--heads H] [--seq-lens LEN [LEN ...]]

Documented flag values (ci/demo_flags.sh runs each and reports pass/fail): no flags (H=4,
sequences 300 17 1024), --heads 1, --heads 2, --seq-lens 4096, --seq-lens 64 64. Inputs are
make_inputs' of reference.py (GPU) or reference_np.py (CPU): q, k, v, g, beta logits ~ N(0,1)
bf16, bf16 initial state, seed 0.

On a Hopper GPU it checks three things:
  1. prefill with cp="off" bit for bit against the GPU reference: reference.chunked_prefill
     (mode="emulate") run by torch on the GPU with the kernels' own PTX approximations and
     tensor-core products (docs/algorithm.md, "Rounding recipe");
  2. the call as an engine makes it (cp="auto"): the same bits when it runs serially; within 4e-3
     relative RMSE of the serial result when it splits the sequences (context parallelism
     reassociates the state products, docs/algorithm.md "Context parallelism");
  3. both against the float64 per-token gold, within 1.5x the recipe's own error measured by the
     CPU emulation on the same inputs.
Without a usable GPU it says why and runs the CPU reference (the emulation) against the gold, in
NumPy (reference_np.py): no torch needed. The GPU checks need torch (the GPU reference is torch's).
"""

from __future__ import annotations

import argparse
import sys
import time

from .tools.cli_checks import cannot_run, gpu_problem, library_problem, torch_problem

PROG = "python -m kda_aot.demo"
# Check 2: what CP may differ from serial, the bound of tests/gpu/test_cp.py (CP carries the state
# across segment boundaries through fp32 products instead of the serial bf16 chain).
CP_VS_SERIAL = 4e-3
# Check 3: the kernels implement the recipe, so their error against the exact gold is the recipe's
# error on these inputs (5.6e-3 to 6.1e-3 on the output, 4.7e-3 to 5.2e-3 on the state for the
# documented flags), give or take the few ulps where the GPU's ex2/tanh/rsqrt approximations
# differ from the CPU's exact functions. 1.5x leaves room for that and for CP, and still catches
# any defect that moves the error by half the recipe's own; smaller defects fail check 1.
RECIPE_FACTOR = 1.5
# Absolute floor for the degenerate case of a zero recipe error (empty sequences only).
RECIPE_FLOOR = 1e-5
# CPU path: the emulation against the gold on N(0,1) inputs. A fixed constant because there is
# nothing independent to measure against here: the recipe's measured error on these inputs is at
# most 6.1e-3 (see above) and a broken emulation (a rounding at the wrong point, a wrong gate) is
# off by 1e-1 or more, so 1e-2 separates the two with margin on both sides.
CPU_RECIPE_BOUND = 1e-2


def _line(name: str, value: float, bound: float) -> bool:
    ok = value < bound
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: {value:.3e} (bound {bound:.3e})")
    return ok


def _bits(name: str, got, want) -> bool:
    import torch

    ok = got.shape == want.shape and torch.equal(got, want)
    detail = "bit for bit" if ok else "differs"
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: {detail}")
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=4, help="number of heads H (default 4)")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[300, 17, 1024],
                        help="lengths of the packed sequences (default 300 17 1024)")
    args = parser.parse_args(argv)
    if args.heads < 1 or any(n < 0 for n in args.seq_lens):
        parser.error("--heads must be >= 1 and --seq-lens >= 0")
    import kda_aot

    H, lens = args.heads, args.seq_lens
    no_torch = torch_problem()
    if no_torch:  # torch is only needed for the GPU checks: is there a GPU to check?
        reason = library_problem()
        if not reason:
            info = kda_aot.info()
            if info.get("devices"):  # the GPU reference is torch's
                return cannot_run(PROG, f"{no_torch}; the GPU checks need it")
            reason = f"the kernel library sees no device ({info.get('device_error', 'unknown reason')})"
    else:
        reason = gpu_problem()
    print(f"kda-aot {kda_aot.__version__}: KDA prefill, H={H}, packed sequences {lens}, bf16 states")
    if reason:
        return _cpu_reference(reason, lens, H)
    from kda_aot import reference

    x = reference.make_inputs(lens, H, seed=0, device="cpu", state="bf16")
    gold_o, gold_s = reference.gold_prefill(**x)
    emu_o, emu_s = reference.chunked_prefill(**x, mode="emulate")
    recipe_o, recipe_s = reference.rel_rmse(emu_o, gold_o), reference.rel_rmse(emu_s, gold_s)
    return _gpu_checks(kda_aot, reference, x, lens, H, gold_o, gold_s, recipe_o, recipe_s)


def _cpu_reference(reason: str, lens, H: int) -> int:
    """No GPU here: the NumPy emulation of the recipe against the NumPy float64 gold."""
    from kda_aot.references import reference_np

    x = reference_np.make_inputs(lens, H, seed=0, state="bf16")
    t0 = time.perf_counter()
    gold_o, gold_s = reference_np.gold_prefill(**x)
    t_gold = time.perf_counter() - t0
    t0 = time.perf_counter()
    emu_o, emu_s = reference_np.chunked_prefill(**x, mode="emulate")
    t_emu = time.perf_counter() - t0
    print(f"no GPU run: {reason}.")
    print(f"Running the CPU reference instead (NumPy: the chunked algorithm with emulated bf16/fp16 "
          f"rounding, {t_emu:.1f} s) against the float64 gold ({t_gold:.1f} s):")
    ok = _line("output, relative RMSE vs gold", reference_np.rel_rmse(emu_o, gold_o), CPU_RECIPE_BOUND)
    ok &= _line("final state, relative RMSE vs gold", reference_np.rel_rmse(emu_s, gold_s), CPU_RECIPE_BOUND)
    print("PASS (CPU reference only; no kernel ran)" if ok else "FAIL")
    return 0 if ok else 1


def _gpu_checks(kda_aot, reference, x_cpu, lens, H, gold_o, gold_s, recipe_o, recipe_s) -> int:
    import torch

    from kda_aot.library.loader import get_library

    x = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in x_cpu.items()}
    kw = {k: x[k] for k in ("A_log", "dt_bias", "lower_bound", "scale", "initial_state", "cu_seqlens")}

    def run(cp):
        return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=True,
                               seq_lens=lens, cp=cp, **kw)

    o_ser, s_ser = run("off")
    run("auto")  # warm-up: the first call of a shape builds its plan
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    o, s = run("auto")
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    plan = kda_aot.plan_prefill(lens, H, sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
    print(f"kda_aot.prefill on {torch.cuda.get_device_name()}: {elapsed * 1e3:.2f} ms; plan: {plan.reason}")
    ref_o, ref_s = reference.chunked_prefill(**x, mode="emulate", approx=reference.KernelApprox(get_library()))

    print("1. serial call (cp='off') against the GPU reference (the recipe with the kernels' approximations):")
    ok = _bits("output", o_ser, ref_o)
    ok &= _bits("final state", s_ser, ref_s)
    print("2. the default call (cp='auto') against the serial call:")
    if torch.equal(o, o_ser) and torch.equal(s, s_ser):
        print("  ok   output and final state bit for bit")
    elif plan.trivial:
        print("  FAIL the plan is serial, yet the results differ from cp='off'")
        ok = False
    else:
        ok &= _line("output, relative RMSE (context parallel)", reference.rel_rmse(o, o_ser), CP_VS_SERIAL)
        ok &= _line("final state, relative RMSE (context parallel)", reference.rel_rmse(s, s_ser), CP_VS_SERIAL)
    bound_o = RECIPE_FACTOR * recipe_o + RECIPE_FLOOR
    bound_s = RECIPE_FACTOR * recipe_s + RECIPE_FLOOR
    print(f"3. against the float64 gold (bound {RECIPE_FACTOR}x the recipe's own error on these inputs, "
          f"measured by the CPU emulation: output {recipe_o:.3e}, state {recipe_s:.3e}):")
    for label, (got_o, got_s) in (("cp='off'", (o_ser, s_ser)), ("cp='auto'", (o, s))):
        ok &= _line(f"{label} output, relative RMSE", reference.rel_rmse(got_o.cpu(), gold_o), bound_o)
        ok &= _line(f"{label} final state, relative RMSE", reference.rel_rmse(got_s.cpu(), gold_s), bound_s)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
