"""The calls the benchmark times: kda-aot's eager and graph modes, and the peers when importable
(FLA's chunk_kda, FlashKDA built from its public source, cuDNN's Hopper engine through flashinfer).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time

from .cases import gate_kwargs


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
    (run, bitwise, (out, final)) where `bitwise` says whether its output and final state equal
    `ours` (our (out, final_state) on these inputs) bit for bit, the correctness contract, and
    out, final are the buffers run() writes (its result, for the error column); None without FlashKDA."""
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
    return run, bitwise, (out, final)


# The stable recipe measures about 2e-2 on flashkda_has_stable_inverse's input, the Neumann one 0.3
# and more, or non-finite values.
NEUMANN_ERROR = 0.1


FLASHKDA_EARLIER_RECIPE = ("this FlashKDA build computes its earlier recipe (the fp16 Neumann inverse): its bits "
                           "differ from kda-aot's stable-inverse recipe by design")


@functools.lru_cache(maxsize=1)
def flashkda_stable() -> bool:
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

    from ... import reference
    from ...references import input_classes

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
