"""Bitwise equality with FlashKDA itself, where a build of it is importable (`flash_kda`).

The rest of the suite checks the FlashKDA recipe against our emulation of it (reference.py); this
file checks it against FlashKDA's own kernels, the yardstick users compare with, where the installed
build computes the stable-inverse recipe (tests/flashkda_recipe.py tells; an earlier build skips,
saying so). FlashKDA is not a
dependency: build it from its public source on the GPU machine to run these (docs/benchmarks.md
says how the benchmark uses it). Serial calls only (cp="off"): intracard CP is our own algorithm
and is bounded against float64 instead (tests/gpu/test_cp_long_memory.py).
"""

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

torch = pytest.importorskip("torch")
flash_kda = pytest.importorskip("flash_kda", reason="FlashKDA is not installed (build it from its public source)")


@pytest.fixture(autouse=True, scope="module")
def _stable_recipe():
    from flashkda_recipe import require_stable_inverse

    require_stable_inverse(flash_kda.fwd)

CASES = [
    # (shape: (B, T) dense or a list of lengths, H, state dtype, lower bound, gate mean)
    ((1, 4096), 4, "bf16", -5.0, 0.0),
    ((2, 1000), 8, "fp32", -5.0, 0.0),
    ([1300, 547, 2048, 963, 271, 3063], 16, "bf16", -5.0, 0.0),
    ([17, 1, 300, 16, 33], 2, "fp32", -5.0, 0.0),
    ([8192], 2, "fp32", -5.0, -8.0),   # long memory: the bf16 state carried across 512 tiles
    ([2048, 2048], 4, None, -0.05, 0.0),
]


def _poisoned_like(t):
    return torch.full_like(t, float("nan"))


@pytest.mark.parametrize("shape,H,state,lb,g_mean", CASES, ids=lambda c: str(c).replace(" ", ""))
def test_bitwise_equal_to_flashkda(shape, H, state, lb, g_mean):
    import kda_aot
    from kda_aot import reference

    x = reference.make_inputs(shape, H, seed=11, device="cuda", state=state, g_mean=g_mean, lower_bound=lb)
    B, T = x["q"].shape[:2]
    cu = x["cu_seqlens"]
    n = B if cu is None else cu.numel() - 1
    state_dtype = torch.float32 if state == "fp32" else torch.bfloat16
    h0 = x["initial_state"]

    ours_out = _poisoned_like(x["v"])
    ours_final = torch.full((n, H, 128, 128), float("nan"), dtype=state_dtype, device="cuda")
    kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                    lower_bound=lb, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                    out=ours_out, final_state=ours_final, cp="off")

    # FlashKDA's varlen mode wants [1, T, ...] with int64 cu_seqlens; its dense mode [B, T, ...].
    fk_out = _poisoned_like(x["v"])
    fk_final = torch.full_like(ours_final, float("nan"))
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], 128 ** -0.5, fk_out, x["A_log"], x["dt_bias"], lb,
                  initial_state=h0, final_state=fk_final, cu_seqlens=None if cu is None else cu.long())
    torch.cuda.synchronize()

    assert not torch.isnan(ours_out).any() and not torch.isnan(ours_final).any(), "a poisoned element was not written"
    same_out = ours_out.view(torch.int16) == fk_out.view(torch.int16)
    assert bool(same_out.all()), (f"output differs from FlashKDA in {int((~same_out).sum())} of {same_out.numel()} "
                                  f"elements (largest |diff| {float((ours_out.float() - fk_out.float()).abs().max()):.3e})")
    bits = torch.int16 if state_dtype == torch.bfloat16 else torch.int32
    same_final = ours_final.view(bits) == fk_final.view(bits)
    assert bool(same_final.all()), f"final state differs from FlashKDA in {int((~same_final).sum())} elements"
