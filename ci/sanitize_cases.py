"""The prefill calls that ci/sanitize.sh runs under each compute-sanitizer tool.

    python3 ci/sanitize_cases.py [CASE ...]     (all cases when none is named)

Each case prints a marker line before it runs, so the sanitizer's reports can be attributed to
the case that produced them. Problems are small: racecheck and initcheck slow kernels down by
orders of magnitude. The mma-* cases force the mma.sync K2 at VB=64 and 128, measurement-only
kernels: against a library of the shipped lattice they print `=== skip` and the summary lists them
as skipped (the measurement wheel, KDA_KERNEL_LATTICE=all bash ci/build_wheels.sh cu12, runs them).
"""

import sys

import torch

import kda_aot
from kda_aot import reference
from kda_aot.errors import KernelNotBuiltError
from kda_aot.tools.bench import forced_k2_kernel


def run(lens, H, state, cp="off", dense=None, **kw):
    x = reference.make_inputs(dense if dense is not None else lens, H, seed=1, device="cuda", state=state)
    result = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                             lower_bound=x["lower_bound"], initial_state=x["initial_state"],
                             output_final_state=state is not None, cu_seqlens=x["cu_seqlens"], cp=cp, **kw)
    torch.cuda.synchronize()
    return result


def run_pool(lens, H, dtype, cp="off", **kw):
    """State pool (docs/state_pool.md): slots read and written in place, one index negative."""
    x = reference.make_inputs(lens, H, seed=1, device="cuda")
    pool = torch.randn(len(lens) + 2, H, 128, 128, device="cuda").to(dtype)
    idx = torch.tensor([len(lens) + 1 - n for n in range(len(lens) - 1)] + [-1], dtype=torch.int32, device="cuda")
    result = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                             lower_bound=x["lower_bound"], cu_seqlens=x["cu_seqlens"], cp=cp, state_pool=pool,
                             state_indices=idx, **kw)
    torch.cuda.synchronize()
    return result


def _ids(values):
    return torch.tensor(values, dtype=torch.int32, device="cuda")


def run_form(lens, H, gate, beta_form="logits", g_scale=1.0, g_fp32=False, beta_fp32=False, **kw):
    """The general K1 (docs/gate_forms.md): g scaled by g_scale so that, with softplus and A = 16,
    most tiles are wide (their products formed element by element) and some are not."""
    x = reference.make_inputs(lens, H, seed=1, device="cuda", state="fp32")
    g = x["g"].float() * g_scale
    A_log, dt_bias, lb = x["A_log"], x["dt_bias"], None
    if gate == "softplus":
        A_log = torch.full_like(A_log, 2.77)
    elif gate == "log_decay":
        g, A_log, dt_bias = -g.abs(), None, None
    else:
        lb = -5.0
    beta = torch.sigmoid(x["beta"].float()) if beta_form == "probs" else x["beta"].float()
    result = kda_aot.prefill(x["q"], x["k"], x["v"], g.to(torch.float32 if g_fp32 else torch.bfloat16),
                             beta.to(torch.float32 if beta_fp32 else torch.bfloat16), A_log=A_log, dt_bias=dt_bias,
                             lower_bound=lb, gate=gate, beta_form=beta_form, initial_state=x["initial_state"],
                             output_final_state=True, cu_seqlens=x["cu_seqlens"], **kw)
    torch.cuda.synchronize()
    return result


def run_strided(lens, H, state, cp="off", **kw):
    """q, k, v, g column slices of one packed [T, 4*H*128] projection, beta a column slice of it
    too (token stride 4*H*128 + 8): views read in place."""
    x = reference.make_inputs(lens, H, seed=1, device="cuda", state=state)
    T, HD = sum(lens), H * 128
    proj = torch.empty(T, 4 * HD + 8, dtype=torch.bfloat16, device="cuda")
    for i, name in enumerate(("q", "k", "v", "g")):
        proj[:, i * HD:(i + 1) * HD] = x[name].reshape(T, HD)
    proj[:, 4 * HD:4 * HD + H] = x["beta"].reshape(T, H)
    views = [proj[:, i * HD:(i + 1) * HD].unflatten(1, (H, 128)).unsqueeze(0) for i in range(4)]
    views.append(proj[:, 4 * HD:4 * HD + H].unsqueeze(0))
    result = kda_aot.prefill(*views, A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=x["lower_bound"],
                             initial_state=x["initial_state"], output_final_state=state is not None,
                             cu_seqlens=x["cu_seqlens"], cp=cp, **kw)
    torch.cuda.synchronize()
    return result


def with_k2_kernel(kind, case):
    """Runs case with KDA_K2_KERNEL=kind (k2 | regstate): the planner picks the register-state K2 at
    VB=64 and 128 (planner.k2_kernel), so the mma.sync K2 at those blocks runs only when forced."""
    def forced():
        with forced_k2_kernel(kind):
            case()
    return forced


CASES = {
    "serial-nostate": lambda: run([300, 17], 2, None),
    "serial-bf16": lambda: run([300, 17], 2, "bf16"),
    "serial-fp32": lambda: run([300, 17], 2, "fp32"),
    "dense-fp32": lambda: run(None, 2, "fp32", dense=(2, 100)),
    "varlen-empty-and-1-token": lambda: run([0, 1, 40, 0, 1], 2, "bf16"),
    # K2's longest-first dispatch order over several length buckets (seq_tables.longest_first_order)
    "varlen-longest-first": lambda: run([17, 300, 0, 1300, 45, 700, 300], 3, "fp32"),
    # small serial problems pick the register-state K2 at VB=64, small CP ones VB=32 (the mma.sync
    # K2); these force VB=128 and VB=64 (docs/k2_regstate.md), serial, segmented and state pool
    "serial-vb128": lambda: run([300, 17], 2, "bf16", value_split=1),
    "serial-vb64": lambda: run([300, 17], 2, "fp32", value_split=2),
    "cp-vb128": lambda: run([1200, 300], 2, "fp32", cp=4, value_split=1),
    "cp-vb64": lambda: run([1200], 2, "bf16", cp=4, value_split=2),
    "pool-serial-vb64": lambda: run_pool([300, 17, 64], 2, torch.bfloat16, value_split=2),
    "pool-cp-vb64": lambda: run_pool([1200, 300], 2, torch.float32, cp=4, value_split=2),
    "checkpoints-cp-vb128": lambda: run([1200, 300], 2, "bf16", cp=4, checkpoint_every=32, value_split=1),
    # the mma.sync K2 at VB=64 and 128 (their own launch hints and operand schedules,
    # docs/k2_schedule.md)
    "mma-serial-vb32": lambda: run([300, 17], 2, "bf16", value_split=4),
    "mma-serial-vb128": with_k2_kernel("k2", lambda: run([300, 17], 2, "bf16", value_split=1)),
    "mma-serial-vb64": with_k2_kernel("k2", lambda: run([300, 17], 2, "fp32", value_split=2)),
    "mma-cp-vb128": with_k2_kernel("k2", lambda: run([1200, 300], 2, "fp32", cp=4, value_split=1)),
    "mma-cp-vb64": with_k2_kernel("k2", lambda: run([1200], 2, "bf16", cp=4, value_split=2)),
    "mma-pool-serial-vb64": with_k2_kernel("k2", lambda: run_pool([300, 17, 64], 2, torch.bfloat16, value_split=2)),
    # the register-state K2's producer warpgroup at VB=128 (setmaxnreg), with both state dtypes
    "pool-serial-vb128": lambda: run_pool([300, 17, 64], 2, torch.float32, value_split=1),
    "cp-on": lambda: run([1200], 2, "fp32", cp="on"),
    "cp-2": lambda: run([1200], 2, "bf16", cp=2),
    "cp-4": lambda: run([1200, 300], 2, None, cp=4),
    "cp-8": lambda: run([1200], 2, "fp32", cp=8),
    "accurate-serial-fp32": lambda: run([300, 17], 2, "fp32", numerics="accurate"),
    # N*H >= the SM count: no value split, the VB=128 accurate kernel (its register-state twin; forced
    # to k2, the mma.sync K2 whose MMA warps take turns at the copies, docs/k2_producer.md)
    "accurate-vb128": lambda: run([40, 17, 33], 48, "fp32", numerics="accurate"),
    "mma-accurate-vb128": with_k2_kernel("k2", lambda: run([40, 17, 33], 48, "fp32", numerics="accurate")),
    "mma-accurate-vb64": with_k2_kernel("k2", lambda: run([300, 17], 2, "bf16", numerics="accurate",
                                                          value_split=2)),
    "accurate-cp-bf16": lambda: run([1200, 300], 2, "bf16", cp=4, numerics="accurate"),
    "pool-serial-bf16": lambda: run_pool([300, 17, 64], 2, torch.bfloat16),
    "pool-cp-fp32": lambda: run_pool([1200, 300], 2, torch.float32, cp=4),
    "checkpoints-serial": lambda: run([300, 17, 130], 2, "fp32", checkpoint_every=64),
    "checkpoints-cp": lambda: run([1200, 300], 2, "bf16", cp=4, checkpoint_every=32),
    # checkpoints at given offsets [N, 2] (written, past the end, negative)
    "checkpoint-offsets-cp": lambda: run([1200, 300], 2, "fp32", cp=4, checkpoint_offsets=torch.tensor(
        [[1104, 5000], [-1, 288]], dtype=torch.int64, device="cuda"),
        checkpoint_state=torch.empty(2, 2, 2, 128, 128, device="cuda")),
    "strided-serial": lambda: run_strided([300, 17], 2, "fp32"),
    "strided-accurate-cp": lambda: run_strided([1200, 300], 2, "bf16", cp=4, numerics="accurate"),
    # the general K1: fast tiles only, then mostly wide tiles, both numerics, fp32 g and beta
    "form-sigmoid-fast": lambda: run_form([300, 17], 2, "sigmoid", "probs"),
    "form-softplus-wide": lambda: run_form([300, 17], 2, "softplus", g_scale=12.0),
    "form-logdecay-wide-acc": lambda: run_form([300, 17], 2, "log_decay", "probs", g_scale=40.0, g_fp32=True,
                                               beta_fp32=True, numerics="accurate"),
    "form-softplus-wide-cp": lambda: run_form([1200], 2, "softplus", g_scale=12.0, cp=4),
    # segment_ids (docs/state_pool.md, "Listed sequences"): entries out of range and repeated,
    # serial and CP, with a pool, checkpoints every C and at given offsets; an empty list
    "listed-serial": lambda: run([300, 17, 0, 130], 2, "fp32", segment_ids=_ids([2, 0, 0, -1, 9])),
    "listed-dense": lambda: run(None, 2, "bf16", dense=(3, 100), segment_ids=_ids([2])),
    "listed-empty": lambda: run([300, 17], 2, "bf16", segment_ids=_ids([])),
    "listed-cp-checkpoints": lambda: run([1200, 300, 64], 2, "bf16", cp=4, checkpoint_every=32,
                                         segment_ids=_ids([0, 2, 2147483647])),
    "listed-pool-serial": lambda: run_pool([300, 17, 64], 2, torch.bfloat16, segment_ids=_ids([1, 2])),
    "listed-pool-cp-offsets": lambda: run_pool([1200, 300], 2, torch.float32, cp=4, segment_ids=_ids([1]),
                                               checkpoint_offsets=torch.tensor([[1104, 64], [256, -1]],
                                                                               dtype=torch.int32, device="cuda"),
                                               checkpoint_slots=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32,
                                                                             device="cuda")),
}


def main(names):
    for name in names or CASES:
        print(f"=== case {name}", flush=True)
        try:
            CASES[name]()
        except KernelNotBuiltError as exc:  # an mma-* case against a library of the shipped lattice
            print(f"=== skip {name}: needs the measurement build (KDA_KERNEL_LATTICE=all bash ci/build_wheels.sh "
                  f"cu12): {str(exc).split(', which', 1)[0]}", flush=True)
            continue
        print(f"=== done {name}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
