"""The benchmark's problems: the suites, each input class on the device, the float64 gold and the
error measure (docs/benchmarks.md, "Method").
"""

from __future__ import annotations

from typing import List, Optional, Sequence


SERIAL_SUITE = [(H, lens) for H in (64, 96) for lens in ([8192], [1300, 547, 2048, 963, 271, 3063], [1024] * 8)]


CP_SUITE = [(H, lens) for H in (4, 8) for lens in ([8192], [8192, 2048], [16384])]


# The two large rows of the speed issue (about 0.64 ms of memory floor each).
LARGE_SUITE = [(32, [4096] * 16), (64, [32768])]


UNEVEN6 = [1300, 547, 2048, 963, 271, 3063]


# Hopper peers: the shapes where the cuDNN engine's truncated warm-up pays most and least.
PEERS_SUITE = [(4, [16384]), (8, [8192]), (8, [6000, 2192]), (12, [32768]), (48, [8192]), (64, [8192]),
               (64, UNEVEN6)]


SUITES = {"peers": PEERS_SUITE, "serial": SERIAL_SUITE, "cp": CP_SUITE, "large": LARGE_SUITE,
          "all": PEERS_SUITE + SERIAL_SUITE + CP_SUITE + LARGE_SUITE}


# --gates: the classes of input_classes the benchmark runs on. "model", "random" and "long" model a
# layer's gates; "correlated" keeps model's gates with nearly parallel keys and a large beta, the
# hard case for the intra-chunk solve, where the error columns matter most.
GATE_CLASSES = ("model", "random", "long", "correlated")


GATE_FORMS = ("safe", "sigmoid", "softplus", "log_decay")


def shape_key(lens: Sequence[int]) -> str:
    if len(set(lens)) == 1 and len(lens) > 1:
        return f"{len(lens)}x{lens[0]}"
    if len(lens) == 6:
        return "uneven6"
    return "+".join(map(str, lens))


def make_case(H: int, lens: List[int], seed: int = 0):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    T, N = sum(lens), len(lens)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    rnd = lambda *shape: torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)
    x = dict(q=rnd(1, T, H, 128), k=rnd(1, T, H, 128), v=rnd(1, T, H, 128), g=rnd(1, T, H, 128),
             beta=rnd(1, T, H),
             A_log=torch.rand(H, generator=gen, device="cuda"),
             dt_bias=torch.rand(H, 128, generator=gen, device="cuda"),
             initial_state=rnd(N, H, 128, 128))
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    out = torch.empty(1, T, H, 128, **bf)
    final = torch.empty(N, H, 128, 128, **bf)
    return x, cu, out, final


def floor_bytes(H: int, lens: Sequence[int], g_bytes: int = 2) -> int:
    """Bytes prefill must move: q, k, v, out (bf16), g (`g_bytes` each), beta, both states (bf16)."""
    T, N = sum(lens), len(lens)
    return T * H * (4 * 128 * 2 + 128 * g_bytes + 2) + 2 * N * H * 128 * 128 * 2


def to_device(arrays: dict, cache: Optional[dict] = None, state: str = "bf16") -> dict:
    """input_classes' NumPy arrays as CUDA tensors: q, k, v, beta bf16, g bf16 or fp32 (its
    g_dtype), A_log, dt_bias fp32, initial_state in `state` ("bf16" or "fp32"); the values of the
    bf16 ones are bf16-exact, so nothing is rounded. `cache` (id of a NumPy array -> tensor) shares the tensors of arrays that several
    gate forms of one draw have in common. Non-array entries (gate, lower_bound...) pass through."""
    import numpy as np
    import torch

    cache = {} if cache is None else cache
    dtypes = dict(q=torch.bfloat16, k=torch.bfloat16, v=torch.bfloat16, beta=torch.bfloat16,
                  g=torch.float32 if arrays.get("g_dtype") == "fp32" else torch.bfloat16,
                  A_log=torch.float32, dt_bias=torch.float32,
                  initial_state={"bf16": torch.bfloat16, "fp32": torch.float32}[state])
    out = {}
    for name, value in arrays.items():
        if not isinstance(value, np.ndarray):
            out[name] = value
            continue
        key = (id(value), dtypes[name])
        if key not in cache:
            cache[key] = (value, torch.from_numpy(value).to("cuda").to(dtypes[name]))  # the array is kept alive
        out[name] = cache[key][1]
    return out


def class_cases(H: int, lens: List[int], cls: str, forms: Sequence[str], seed: int = 0):
    """Yield (form, x, cu, out, final) for each gate form of one draw of class `cls`: the same
    q, k, v, beta, gate input and bf16 initial state in every form (input_classes.regate)."""
    import torch

    from ...references import input_classes

    base = input_classes.make_class_inputs(cls, 1, sum(lens), H, gate="safe", seed=seed, state="bf16",
                                           n_states=len(lens))
    cu = torch.from_numpy(input_classes.cu_seqlens(lens)).to("cuda")
    cache = {}
    for form in forms:
        x = to_device(input_classes.regate(base, form, seed=seed) if form != "safe" else base, cache)
        out = torch.empty(1, sum(lens), H, 128, device="cuda", dtype=torch.bfloat16)
        final = torch.empty(len(lens), H, 128, 128, device="cuda", dtype=torch.bfloat16)
        yield form, x, cu, out, final


def gate_kwargs(x) -> dict:
    """The gate arguments of kda_aot.prefill for a class case (absent on make_case's: safe gate)."""
    return dict(A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=x.get("lower_bound", -5.0),
                gate=x.get("gate", "safe"))


def gold_of(x, cu):
    """The float64 gold (output, final state) of a class case."""
    from ... import reference

    g = gate_kwargs(x)
    return reference.gold_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], g["A_log"], g["dt_bias"], g["lower_bound"],
                                  None, x["initial_state"], cu, gate=g["gate"])


def errors(result, gold):
    """[output, final state] relative RMSE of `result` against `gold`. The benchmark computes the
    gold (gold_of) on every row, whatever its class and gate form, unless --no-accuracy; each
    implementation timed on the row then gets its error column (measure.measure)."""
    from ... import reference

    return [reference.rel_rmse(result[0], gold[0]), reference.rel_rmse(result[1], gold[1])]


CHECKPOINT_CASES = [(64, [8192], "off"), (8, [8192], "auto")]


STRIDED_ROWS = [(4, [16384]), (64, [8192]), (64, UNEVEN6)]


def packed_views(x: dict, T: int, H: int, extra: int = 64):
    """q, k, v, g as column slices of one [1, T, 4 H 128 + extra] projection and beta as a column
    slice of a [1, T, H + extra] one (token strides past the packed ones), holding x's values."""
    import torch

    proj = torch.empty(1, T, 4 * H * 128 + extra, device="cuda", dtype=torch.bfloat16)
    views = {}
    for i, name in enumerate(("q", "k", "v", "g")):
        views[name] = proj[:, :, i * H * 128:(i + 1) * H * 128].unflatten(2, (H, 128))
        views[name].copy_(x[name])
    wide = torch.empty(1, T, H + extra, device="cuda", dtype=torch.bfloat16)
    views["beta"] = wide[:, :, :H]
    views["beta"].copy_(x["beta"])
    return views


LISTED_ROW = (32, [1024] * 16)  # H, lengths: a batch whose sequences a step lists some of
