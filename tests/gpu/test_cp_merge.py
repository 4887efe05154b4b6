"""The CP merge kernel (docs/algorithm.md §4.4) on the GPU against float64 torch computations of the same recurrence.

carry[first] = initial_state[n] widened to fp32 (0 without one); carry[first + i + 1] =
carry[first + i] @ m_seg[first + i] + b_seg[first + i]. The kernel multiplies on TF32 tensor cores
(operands rounded with cvt.rna.tf32.f32, fp32 accumulation), so it is held to:
  * rel RMSE < 1e-3 against the exact float64 recurrence (TF32 unit roundoff is 2^-11);
  * rel RMSE < 2e-5 per step against a float64 step from the kernel's own previous carry with both
    operands rounded to TF32 the same way (what remains is fp32 accumulation order only);
  * every carry slot overwritten (poisoned with NaN before the launch), the first carry exact, and,
    without an initial state, carry[first + 1] == b_seg[first] exactly (docs/algorithm.md §4.6, item 2);
  * bitwise determinism over 5 runs.
"""

import zlib

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

D = 128
VARIANTS = {"cp_merge_nostate": (False, None), "cp_merge_bf16": (True, "bfloat16"),
            "cp_merge_f32": (True, "float32")}


def _tf32(x):
    """Round fp32 -> tf32, to nearest with ties away from zero (cvt.rna), as fp32."""
    import torch

    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    bits = ((bits + 0x1000) & 0xFFFFE000) & 0xFFFFFFFF
    bits = torch.where(bits >= 2**31, bits - 2**32, bits)
    return bits.to(torch.int32).view(torch.float32)


def _problem(counts, n_heads, state_dtype, seed, gap=0):
    """Segments of sequence n at seg_first[n] .. + counts[n], laid out in a shuffled sequence order,
    with `gap` unused slots after each sequence."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    n_seq = len(counts)
    order = torch.randperm(n_seq, generator=gen).tolist()
    first = [0] * n_seq
    at = 0
    for n in order:
        first[n] = at
        at += counts[n] + gap
    n_seg = at
    # M = decaying diagonal + small noise: spectral radius < 1, carries stay O(1)
    diag = 0.3 + 0.6 * torch.rand(n_seg, n_heads, D, generator=gen)
    m = torch.diag_embed(diag) + 0.01 * torch.randn(n_seg, n_heads, D, D, generator=gen)
    b = torch.randn(n_seg, n_heads, D, D, generator=gen)
    init = None
    if state_dtype is not None:
        init = torch.randn(n_seq, n_heads, D, D, generator=gen).to(getattr(torch, state_dtype))
    return dict(m=m.float(), b=b.float(), init=init, first=first, counts=list(counts), n_seg=n_seg)


def _reference(p, n_heads):
    """Exact float64 recurrence on the inputs as given (bf16 states widened exactly)."""
    import torch

    out = torch.zeros(p["n_seg"], n_heads, D, D, dtype=torch.float64)
    m64, b64 = p["m"].double(), p["b"].double()
    for n, (f, c) in enumerate(zip(p["first"], p["counts"])):
        carry = p["init"][n].double() if p["init"] is not None else torch.zeros(n_heads, D, D, dtype=torch.float64)
        out[f] = carry
        for i in range(c - 1):
            carry = carry @ m64[f + i] + b64[f + i]
            out[f + i + 1] = carry
    return out


def _launch(name, p, n_heads, carries):
    import torch

    from kda_aot.library.loader import get_library
    from kda_aot.reference import m_seg_swizzle

    dev = carries.device
    m = m_seg_swizzle(p["m"].to(dev))  # the kernel reads m_seg column-swizzled
    b = p["b"].to(dev)
    init = p["init"].to(dev) if p["init"] is not None else None
    first = torch.tensor(p["first"], dtype=torch.int32, device=dev)
    count = torch.tensor(p["counts"], dtype=torch.int32, device=dev)
    get_library().kernel(name)(m.data_ptr(), b.data_ptr(), init.data_ptr() if init is not None else 0,
                               carries.data_ptr(), first.data_ptr(), count.data_ptr(), len(p["counts"]), n_heads,
                               torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()


def _rel_rmse(got, want):
    return float(((got - want).pow(2).mean() / want.pow(2).mean().clamp_min(1e-300)).sqrt())


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("counts,n_heads", [([1, 2, 5, 16], 4), ([16], 4), ([5, 1, 2, 16, 3], 3), ([2, 7], 1)])
def test_cp_merge_matches_float64(name, counts, n_heads):
    import torch

    has_initial, state_dtype = VARIANTS[name]
    p = _problem(counts, n_heads, state_dtype, seed=zlib.crc32(repr((name, counts, n_heads)).encode()))
    carries = torch.full((p["n_seg"], n_heads, D, D), float("nan"), dtype=torch.float32, device="cuda")
    _launch(name, p, n_heads, carries)
    got = carries.cpu()
    assert torch.isfinite(got).all(), "some carry slots were not written"

    want = _reference(p, n_heads)
    for n, (f, c) in enumerate(zip(p["first"], p["counts"])):
        # first carry: the widened initial state (or zeros), exactly
        if has_initial:
            assert torch.equal(got[f], p["init"][n].float()), f"seq {n}: first carry is not the initial state"
        else:
            assert torch.equal(got[f], torch.zeros_like(got[f])), f"seq {n}: first carry is not zero"
            if c >= 2:  # 0 @ M + B == B exactly (docs/algorithm.md §4.6, item 2)
                assert torch.equal(got[f + 1], p["b"][f]), f"seq {n}: carry[first + 1] != b_seg[first]"
        for i in range(1, c):
            s = f + i
            err = _rel_rmse(got[s].double(), want[s])
            assert err < 1e-3, f"seq {n} segment {i}/{c}: rel RMSE {err:.3g} vs float64"
            # one step from the kernel's own previous carry, TF32 operands emulated
            step = _tf32(got[s - 1]).double() @ _tf32(p["m"][s - 1]).double() + p["b"][s - 1].double()
            err_step = _rel_rmse(got[s].double(), step)
            assert err_step < 2e-5, f"seq {n} segment {i}/{c}: rel RMSE {err_step:.3g} vs TF32-emulated step"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_cp_merge_is_deterministic(name):
    import torch

    n_heads = 4
    has_initial, state_dtype = VARIANTS[name]
    p = _problem([1, 2, 5, 16], n_heads, state_dtype, seed=7)
    runs = []
    for _ in range(5):
        carries = torch.full((p["n_seg"], n_heads, D, D), float("nan"), dtype=torch.float32, device="cuda")
        _launch(name, p, n_heads, carries)
        runs.append(carries.view(torch.int32).cpu().numpy())
    for r in runs[1:]:
        np.testing.assert_array_equal(r, runs[0])


def test_cp_merge_leaves_other_slots_alone():
    """A sequence writes only its own segments' carries: slots between sequences keep their poison."""
    import torch

    n_heads = 2
    p = _problem([3, 1, 4], n_heads, "float32", seed=11, gap=2)
    carries = torch.full((p["n_seg"], n_heads, D, D), float("nan"), dtype=torch.float32, device="cuda")
    _launch("cp_merge_f32", p, n_heads, carries)
    got = carries.cpu()
    owned = set()
    for f, c in zip(p["first"], p["counts"]):
        owned.update(range(f, f + c))
    assert len(owned) < p["n_seg"]
    want = _reference(p, n_heads)
    for s in range(p["n_seg"]):
        if s in owned:
            assert torch.isfinite(got[s]).all(), f"slot {s} not written"
            assert _rel_rmse(got[s].double(), want[s]) < 1e-3
        else:
            assert torch.isnan(got[s]).all(), f"slot {s} belongs to no sequence but was written"
