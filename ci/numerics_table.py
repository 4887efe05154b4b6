"""numerics="flashkda" | "accurate" on the GPU: error against float64 beside FLA's chunk_kda, and time.

    python3 ci/numerics_table.py [--out DIR] [--lengths 2048 8192 32768] [--class-lengths 8192] [--no-fla] [--no-cudnn]
                                 [--iters 30] [--skip-timing] [--skip-ablation] [--skip-classes]
                                 [--skip-correlated] [--skip-lengths] [--correlated-length 1024]

Writes DIR/numerics_table.md (and .json) as it goes, so a run cut short keeps what it measured:
1. time per call of both modes (kernels mode of kda_aot.bench: given outputs, host lengths,
   cp="auto", median of CUDA events) on the benchmark shapes;
2. relative RMSE of output and final state against float64 per input class of
   kda_aot/references/input_classes.py (random, model, long, heavy, logdecay) and gate form (safe, softplus,
   log_decay with an fp32 g), H=2, one sequence, fp32 initial state, serial and cp="on", both
   modes, FLA and cuDNN's Hopper engine beside them; then against reference.gold_prefill (float64, per token, on
   the GPU) for H=2, one sequence of each length, fp32 initial state, per input class (short
   memory, long memory g ~ N(-8, 1), weak decay lower_bound=-0.05), serial and cp="on", both
   modes; then FLA 0.6.0 chunk_kda (fp32 state, FlashKDA's flags) on the same inputs, when
   importable (Triton autotunes on its first call: it runs last);
2b. the correlated-key classes (input_classes "correlated" and "correlated_weak": nearly parallel
   keys with a large beta, the hard case of the intra-chunk solve) over CORRELATED_CASES and the
   gate forms safe, softplus and log_decay, T=1024, H=2, fp32 initial state, both modes, serial and
   cp="on", FLA and cuDNN's engine beside them, and the repeated-key reproducer (16,384 tokens,
   a zero initial state): whether every value is finite, and the error;
3. what each step of the accurate recipe costs and buys: the ablation kernels (registry's
   k2_ablation: levels 1-3 of recurrence_common.py) timed on H=64 [8192] and measured on the
   long-memory and weak-decay inputs at T=8192 (bf16 initial state, value split 2: the variant
   they exist for), beside both modes.
docs/numerics.md and the README's accuracy table hold the figures of the last run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

CLASSES = {"short memory": (0.0, -5.0), "long memory": (-8.0, -5.0), "weak decay": (0.0, -0.05)}
TIMING = [(64, [8192]), (64, [1300, 547, 2048, 963, 271, 3063]), (64, [1024] * 8), (96, [8192]),
          (96, [1300, 547, 2048, 963, 271, 3063]), (96, [1024] * 8), (4, [8192]), (4, [16384])]
SPLITS = (1, 2, 4)  # K2 value splits timed per mode on the serial rows (the split rule was tuned on flashkda)
MODES = ("flashkda", "accurate")
# (input class, gate form) of the per-class accuracy table: every form for the classes that model a
# layer's gates, the outlier and log-decay classes in the form they exist for.
CLASS_FORMS = [(c, f) for c in ("random", "model", "long") for f in ("safe", "softplus", "log_decay")] + [
    ("heavy", "safe"), ("logdecay", "log_decay")]
# (class, eps, beta logit) of the correlated-key table: repeated keys (eps 0) to eps 0.5, beta logits 2 and 6
CORRELATED_CASES = [("correlated_weak", 0.0, 6.0), ("correlated_weak", 0.05, 6.0), ("correlated_weak", 0.2, 6.0),
                    ("correlated_weak", 0.0, 2.0), ("correlated", 0.0, 6.0), ("correlated", 0.2, 6.0),
                    ("correlated", 0.0, 2.0), ("correlated", 0.5, 2.0)]
CORRELATED_FORMS = ("safe", "softplus", "log_decay")


class Report:
    def __init__(self, out_dir: str):
        self.md_path = os.path.join(out_dir, "numerics_table.md")
        self.json_path = os.path.join(out_dir, "numerics_table.json")
        self.timing, self.accuracy, self.ablation, self.classes, self.correlated = [], [], [], [], []

    def write(self):
        lines = ["## time per call (ms, median of CUDA events; bf16 states unless fp32 is named)", "",
                 "| H | sequences | plan | flashkda | accurate | accurate / flashkda | accurate, fp32 states |",
                 "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['H']} | {r['shape']} | {r['plan']} | {r['flashkda']:.3f} | {r['accurate']:.3f} | "
                  f"{r['accurate'] / r['flashkda']:.3f} | {r['accurate_fp32']:.3f} |" for r in self.timing]
        split_rows = [r for r in self.timing if f"accurate split {SPLITS[0]}" in r]
        if split_rows:
            lines += ["", "## forced K2 value splits (serial rows; ms)", "",
                      "| H | sequences | " + " | ".join(f"{m} split {s}" for m in MODES for s in SPLITS)
                      + " | best accurate / best flashkda |", "|---|---|" + "---|" * (len(MODES) * len(SPLITS) + 1)]
            for r in split_rows:
                best = {m: min(r[f"{m} split {s}"] for s in SPLITS) for m in MODES}
                lines.append(f"| {r['H']} | {r['shape']} | " + " | ".join(
                    f"{r[f'{m} split {s}']:.3f}" for m in MODES for s in SPLITS)
                    + f" | {best['accurate'] / best['flashkda']:.3f} |")
        if self.classes:
            lines += ["", "## relative RMSE against float64 per input class and gate form, output / final state "
                      "(H=2, one sequence, fp32 h0)", "",
                      "| input class | gate | T | flashkda serial | flashkda cp=on | accurate serial | accurate cp=on "
                      "| FLA chunk_kda | cuDNN engine |", "|---|---|---|---|---|---|---|---|---|"]
            for r in self.classes:
                lines.append(f"| {r['class']} | {r['gate']} | {r['T']} | " + _error_cells(r) + " |")
        if self.correlated:
            lines += ["", "## correlated keys: relative RMSE against float64, output / final state (H=2, one "
                      "sequence; fp32 h0, zero in the repeated-key row)", "",
                      "| input class | eps | beta logit | gate | T | flashkda serial | flashkda cp=on | accurate serial "
                      "| accurate cp=on | FLA chunk_kda | cuDNN engine | all finite |", "|---" * 12 + "|"]
            for r in self.correlated:
                lines.append(f"| {r['class']} | {r['eps']} | {r['beta_logit']} | {r['gate']} | {r['T']} | "
                             + _error_cells(r) + f" | {'yes' if r['finite'] else 'NO'} |")
        lines += ["", "## relative RMSE against float64, output / final state (H=2, one sequence, fp32 h0)", "",
                  "| input class | T | flashkda serial | flashkda cp=on | accurate serial | accurate cp=on | FLA chunk_kda |",
                  "|---|---|---|---|---|---|---|"]
        for r in self.accuracy:
            cells = [_pair(r.get(k)) for k in ("flashkda/off", "flashkda/on", "accurate/off", "accurate/on", "fla")]
            lines.append(f"| {r['class']} | {r['T']} | " + " | ".join(cells) + " |")
        if self.ablation:
            lines += ["", "## each step of the accurate recipe (K2 of H=64 [8192], bf16 states; error: H=2 [8192], "
                      "bf16 h0, serial)", "",
                      "| recipe | H=64 [8192] ms | long memory o / ht | weak decay o / ht |", "|---|---|---|---|"]
            lines += [f"| {r['recipe']} | {r['ms']:.3f} | {_pair(r.get('long memory'))} | {_pair(r.get('weak decay'))} |"
                      for r in self.ablation]
            other = sorted({k for r in self.ablation for k in r if k not in ("recipe", "ms", "long memory", "weak decay")})
            if other:
                lines += ["", "## the same recipes at other lengths (H=2, bf16 h0, serial), output / final state", "",
                          "| recipe | " + " | ".join(other) + " |", "|---|" + "---|" * len(other)]
                lines += [f"| {r['recipe']} | " + " | ".join(_pair(r.get(k)) for k in other) + " |" for r in self.ablation]
        text = "\n".join(lines) + "\n"
        with open(self.md_path, "w") as f:
            f.write(text)
        with open(self.json_path, "w") as f:
            json.dump({"timing": self.timing, "accuracy": self.accuracy, "ablation": self.ablation,
                       "classes": self.classes, "correlated": self.correlated}, f, indent=1)
        return text


def _pair(p) -> str:
    return "-" if p is None else f"{p[0]:.2e} / {p[1]:.2e}"


def _error_cells(r) -> str:
    """Both modes serial and CP, FLA and cuDNN's engine: a class row's error cells."""
    return " | ".join(_pair(r.get(k)) for k in ("flashkda/off", "flashkda/on", "accurate/off", "accurate/on", "fla",
                                                "cudnn"))


def timing(report: Report, iters: int, warmup: int) -> None:
    import torch

    import kda_aot
    from kda_aot.tools import bench

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for H, lens in TIMING:
        x, cu, out, final = bench.make_case(H, lens)
        h0_32, final_32 = x["initial_state"].float(), final.float()

        def call(numerics, h0=x["initial_state"], fs=final):
            return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                                   initial_state=h0, output_final_state=True, cu_seqlens=cu, seq_lens=lens, out=out,
                                   final_state=fs, numerics=numerics)
        row = {"H": H, "shape": bench.shape_key(lens)}
        plan = kda_aot.plan_prefill(lens, H, sm_count=sms)
        row["plan"] = "serial" if plan.trivial else f"CP {plan.n_segments} segments"
        for mode in MODES:
            row[mode] = bench.time_ms(lambda: call(mode), iters, warmup)
        row["accurate_fp32"] = bench.time_ms(lambda: call("accurate", h0_32, final_32), iters, warmup)
        if plan.trivial:
            for mode in MODES:
                for s in SPLITS:
                    row[f"{mode} split {s}"] = bench.time_ms(lambda: kda_aot.prefill(
                        x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                        initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu, seq_lens=lens,
                        out=out, final_state=final, numerics=mode, cp="off", value_split=s), iters, warmup)
        report.timing.append(row)
        report.write()
        print(row, flush=True)
        x = cu = out = final = h0_32 = final_32 = None  # free this shape before the next
        torch.cuda.empty_cache()


# With numerics="accurate" every row runs K1' (the gated operands rounded once, docs/numerics.md).
RECIPES = [("flashkda", "flashkda", None), ("K1' + A1: fp32 state", "accurate", 1),
           ("K1' + A1 + A2 + A5: u unrounded, one output rounding", "accurate", 2),
           ("accurate (K1', A1-A3 and A5: U rounded once)", "accurate", None),
           ("the same with U as hi + lo in Q4 and Q5 (A4, the tile step before U was rounded once)", "accurate", 3)]


def fla_errors(x, gold):
    """FLA's chunk_kda (fp32 state, FlashKDA's flags) on reference.make_inputs' inputs: relative
    RMSE of output and final state against the float64 gold; None when FLA is not importable."""
    import torch

    from kda_aot import reference
    try:
        from fla.ops.kda import chunk_kda
    except Exception as exc:
        print(f"FLA not importable: {exc}", flush=True)
        return None
    o, s = chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"].float(),
                     output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                     use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=x["lower_bound"],
                     state_v_first=True, cu_seqlens=x["cu_seqlens"].long(), A_log=x["A_log"],
                     dt_bias=x["dt_bias"].reshape(-1))
    torch.cuda.synchronize()
    return reference.rel_rmse(o, gold[0]), reference.rel_rmse(s, gold[1])


def ablation(report: Report, iters: int, warmup: int, lengths=(8192,), fla: bool = False) -> None:
    import kda_aot
    from kda_aot.tools import bench
    from kda_aot.library.loader import MEASUREMENT_BUILD, get_library
    from kda_aot.plan import planner
    from kda_aot import reference

    missing = [name for name in get_library().missing_variants() if name.endswith(("_l1", "_l2", "_l3"))]
    if missing:  # the ablations are measurement-only: a library of the shipped lattice has none
        print(f"ablation skipped: the library lacks {', '.join(missing)}. {MEASUREMENT_BUILD}", flush=True)
        return
    plan_serial = planner.plan_serial
    level = {"value": None}

    def with_level(**kw):  # the runtime asks for ablation=0 (the full recipe); levels 1-3 are measurement-only
        plan = plan_serial(**kw)
        if level["value"] is None:
            return plan
        return dataclasses.replace(plan, k2_constants=dict(plan.k2_constants, ablation=level["value"]))

    planner.plan_serial = with_level
    x, cu, out, final = bench.make_case(64, [8192])
    inputs = {}
    for cls in ("long memory", "weak decay"):
        g_mean, lb = CLASSES[cls]
        for T in lengths:
            y = reference.make_inputs([T], 2, seed=7, device="cuda", state="bf16", g_mean=g_mean, lower_bound=lb)
            inputs[cls if T == 8192 else f"{cls} {T}"] = (y, reference.gold_prefill(**y))
    try:
        for recipe, mode, lvl in RECIPES:
            level["value"] = lvl
            kda_aot.empty_cache()  # plans are cached by shape, not by the patched constant
            row = {"recipe": recipe, "ms": bench.time_ms(lambda: kda_aot.prefill(
                x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu, seq_lens=[8192], out=out,
                final_state=final, numerics=mode, cp="off", value_split=2), iters, warmup)}
            for cls, (y, gold) in inputs.items():
                o, s = kda_aot.prefill(y["q"], y["k"], y["v"], y["g"], y["beta"], A_log=y["A_log"],
                                       dt_bias=y["dt_bias"], lower_bound=y["lower_bound"],
                                       initial_state=y["initial_state"], output_final_state=True,
                                       cu_seqlens=y["cu_seqlens"], cp="off", value_split=2, numerics=mode)
                row[cls] = (reference.rel_rmse(o, gold[0]), reference.rel_rmse(s, gold[1]))
            report.ablation.append(row)
            report.write()
            print(row, flush=True)
    finally:
        planner.plan_serial = plan_serial
        kda_aot.empty_cache()
    if fla:  # the same inputs through FLA (its final state stays fp32: no bf16 rounding on exit)
        row = {"recipe": "FLA chunk_kda (fp32 state out)", "ms": float("nan")}
        for cls, (y, gold) in inputs.items():
            pair = fla_errors(y, gold)
            if pair is None:
                return
            row[cls] = pair
        report.ablation.append(row)
        report.write()
        print(row, flush=True)


def accuracy(report: Report, lengths, fla: bool) -> None:
    import torch

    import kda_aot
    from kda_aot import reference

    cases = []
    for cls, (g_mean, lb) in CLASSES.items():
        for T in lengths:
            x = reference.make_inputs([T], 2, seed=7, device="cuda", state="fp32", g_mean=g_mean, lower_bound=lb)
            t0 = time.perf_counter()
            gold = reference.gold_prefill(**x)
            torch.cuda.synchronize()
            row = {"class": cls, "T": T, "gold_s": time.perf_counter() - t0}
            for mode in MODES:
                for cp in ("off", "on"):
                    o, s = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                                           dt_bias=x["dt_bias"], lower_bound=lb, initial_state=x["initial_state"],
                                           output_final_state=True, cu_seqlens=x["cu_seqlens"], seq_lens=[T], cp=cp,
                                           numerics=mode)
                    row[f"{mode}/{cp}"] = (reference.rel_rmse(o, gold[0]), reference.rel_rmse(s, gold[1]))
            report.accuracy.append(row)
            cases.append((row, x, gold))
            report.write()
            print(row, flush=True)
    if not fla:
        return
    for row, x, gold in cases:
        t0 = time.perf_counter()
        row["fla"] = fla_errors(x, gold)
        if row["fla"] is None:
            return
        report.write()
        print(row["class"], row["T"], "FLA", row["fla"], f"({time.perf_counter() - t0:.1f} s)", flush=True)


def class_accuracy(report: Report, lengths, fla: bool, cudnn: bool = True) -> None:
    """Error against float64 per (input class, gate form) of CLASS_FORMS, both modes, serial and
    cp="on", then cuDNN's Hopper engine (where it computes the form and flashinfer is importable)
    and FLA on the same inputs (last: Triton autotunes on its first call)."""
    import torch

    import kda_aot
    from kda_aot.tools import bench
    from kda_aot.references import input_classes

    cases = []
    for cls, form in CLASS_FORMS:
        for T in lengths:
            x = bench.to_device(input_classes.make_class_inputs(cls, 1, T, 2, gate=form, seed=7, state="fp32"),
                                state="fp32")
            cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
            gold = bench.gold_of(x, cu)
            row = {"class": cls, "gate": form, "T": T}
            for mode in MODES:
                for cp in ("off", "on"):
                    o, s = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], **bench.gate_kwargs(x),
                                           initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu,
                                           seq_lens=[T], cp=cp, numerics=mode)
                    row[f"{mode}/{cp}"] = bench.errors((o, s), gold)
            report.classes.append(row)
            cases.append((row, x, cu, gold))
            report.write()
            print(row, flush=True)
    peer_errors(report, cases, fla, cudnn)


def correlated_accuracy(report: Report, T: int, fla: bool, cudnn: bool = True, repeated_T: int = 16384) -> None:
    """Error against float64 on the correlated-key classes (CORRELATED_CASES x CORRELATED_FORMS at
    length T, and the repeated-key reproducer), both modes, serial and cp="on", then cuDNN's engine
    and FLA on the same inputs."""
    import numpy as np
    import torch

    import kda_aot
    from kda_aot.tools import bench
    from kda_aot.references import input_classes

    cases = []
    draws = [(cls, eps, logit, form, input_classes.make_class_inputs(
        cls, 1, T, 2, gate=form, seed=7, state="fp32", eps=eps, beta_logit=logit))
        for cls, eps, logit in CORRELATED_CASES for form in CORRELATED_FORMS]
    rep = input_classes.repeated_key_case(repeated_T)
    rep["initial_state"] = np.zeros((1, 2, 128, 128), np.float32)  # a zero state: the peers' runners take one
    draws.append(("correlated_weak", 0.0, 8.0, "safe", rep))
    for cls, eps, logit, form, arrays in draws:
        n = arrays["q"].shape[1]
        x = bench.to_device(arrays, state="fp32")
        cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
        gold = bench.gold_of(x, cu)
        row = {"class": cls, "eps": eps, "beta_logit": logit, "gate": form, "T": n, "finite": True}
        for mode in MODES:
            for cp in ("off", "on"):
                o, s = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], **bench.gate_kwargs(x),
                                       initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu,
                                       seq_lens=[n], cp=cp, numerics=mode)
                row["finite"] &= bool(torch.isfinite(o.float()).all() and torch.isfinite(s.float()).all())
                row[f"{mode}/{cp}"] = bench.errors((o, s), gold)
        report.correlated.append(row)
        cases.append((row, x, cu, gold))
        report.write()
        print(row, flush=True)
    peer_errors(report, cases, fla, cudnn)


def peer_errors(report: Report, cases, fla: bool, cudnn: bool) -> None:
    """cuDNN's Hopper engine (where its in-kernel gate is the case's form and flashinfer is
    importable), then FLA (last: Triton autotunes on its first call), on each case's inputs:
    cases are (row, x, cu, gold); the errors go into the rows."""
    from kda_aot.tools import bench

    for peer, wanted in (("cudnn", cudnn), ("fla", fla)):
        for row, x, cu, gold in cases if wanted else ():
            if peer == "cudnn":
                run, c_out, c_final, why = bench.cudnn_runner(x, cu)
                if run is None:
                    row["cudnn note"] = why
                    continue
                run()
                row["cudnn"] = bench.errors((c_out, c_final), gold)
            else:
                run = bench.fla_runner(x, cu, 2)
                if run is None:  # not importable, or this gate form not comparable (fla_runner said why)
                    continue
                row["fla"] = bench.errors(run(), gold)
            report.write()
            print(row["class"], row["gate"], row["T"], peer, row[peer], flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--lengths", type=int, nargs="*", default=[2048, 8192, 32768])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-fla", action="store_true")
    parser.add_argument("--no-cudnn", action="store_true", help="skip cuDNN's engine in the per-class table")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--skip-ablation", action="store_true")
    parser.add_argument("--skip-classes", action="store_true", help="skip the per-class, per-gate-form accuracy table")
    parser.add_argument("--class-lengths", type=int, nargs="*", default=[8192],
                        help="lengths of the per-class accuracy rows (H=2, one sequence)")
    parser.add_argument("--skip-correlated", action="store_true", help="skip the correlated-key table")
    parser.add_argument("--skip-lengths", action="store_true", help="skip the per-length table of the three classes")
    parser.add_argument("--correlated-length", type=int, default=1024, help="T of the correlated-key rows")
    parser.add_argument("--ablation-lengths", type=int, nargs="*", default=[8192],
                        help="lengths of the ablation's error rows (H=2, one sequence)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    report = Report(args.out)
    if not args.skip_timing:
        timing(report, args.iters, args.warmup)
    if not args.skip_ablation:
        ablation(report, args.iters, args.warmup, args.ablation_lengths, not args.no_fla)
    if not args.skip_classes:
        class_accuracy(report, args.class_lengths, not args.no_fla, not args.no_cudnn)
    if not args.skip_correlated:
        correlated_accuracy(report, args.correlated_length, not args.no_fla, not args.no_cudnn)
    if not args.skip_lengths:
        accuracy(report, args.lengths, not args.no_fla)
    print(report.write())
    return 0


if __name__ == "__main__":
    sys.exit(main())
