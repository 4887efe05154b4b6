"""Shared by the GPU tests of states, pools and checkpoints (tests/gpu/test_state_pool.py,
tests/gpu/test_checkpoint_offsets.py, tests/gpu/test_vllm_step.py): the reference's inputs without an initial
state, a prefill with their gate parameters, a padded state pool, and poison to tell written memory
from untouched."""

import torch


def inputs(shape, H, seed):
    """reference.make_inputs on the GPU (lengths or a dense (B, T)), without an initial state."""
    from kda_aot import reference

    x = reference.make_inputs(shape, H, seed=seed, device="cuda")
    x.pop("initial_state", None)
    return x


def prefill(x, **kw):
    """kda_aot.prefill of x's q, k, v, g, beta with its gate parameters and cu_seqlens."""
    import kda_aot

    args = {k: x[k] for k in ("A_log", "dt_bias", "lower_bound", "cu_seqlens") if k in x}
    return kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], **args, **kw)


def poison(t):
    """NaN (fp32) or the 0x7fff bf16 NaN pattern everywhere."""
    if t.dtype == torch.bfloat16:
        t.view(torch.int16).fill_(0x7FFF)
    else:
        t.fill_(float("nan"))
    return t


def same_bits(a, b):
    return torch.equal(a.contiguous().view(torch.int8), b.contiguous().view(torch.int8))


def is_poison(t):
    """Every byte of t is still poison()'s."""
    return same_bits(t, poison(torch.empty_like(t)))


def pool(S, H, dtype, pad, seed):
    """A pool [S, H, 128, 128] with `pad` poisoned elements between slots; returns (pool view, storage)."""
    D = 128
    slot = H * D * D
    storage = poison(torch.empty(S * (slot + pad), dtype=dtype, device="cuda"))
    view = storage.as_strided((S, H, D, D), (slot + pad, D * D, D, 1))
    gen = torch.Generator(device="cuda").manual_seed(seed)
    view.copy_((0.1 * torch.randn((S, H, D, D), generator=gen, device="cuda")).to(dtype))
    return view, storage
