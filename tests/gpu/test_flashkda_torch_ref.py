"""The default recipe bit for bit against FlashKDA's own public torch reference of its stable-inverse
recipe (September 2026): `torch_ref` in tests/torch_ref.py of FlashKDA's source (the vLLM fork's
copy carries the same recipe). That file is not part of this repository: point
KDA_FLASHKDA_TORCH_REF at a copy of it to run these tests (it compiles a small CUDA extension with
torch.utils.cpp_extension, so nvcc and ninja must be there). Fixed-length, packed and state cases,
and correlated keys, where the recipe's inverse matters.
"""

import importlib.util
import os

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]
torch = pytest.importorskip("torch")

from kda_aot.references import input_classes as ic  # noqa: E402

D = 128


@pytest.fixture(scope="module")
def torch_ref():
    path = os.environ.get("KDA_FLASHKDA_TORCH_REF")
    if not path:
        pytest.skip("KDA_FLASHKDA_TORCH_REF is not set: FlashKDA's tests/torch_ref.py is not part of this repository")
    spec = importlib.util.spec_from_file_location("flashkda_torch_ref", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "inv_fwd_subst_16"):
        pytest.fail(f"{path} has no inv_fwd_subst_16: it is the July reference (the fp16 Neumann inverse), "
                    "not the stable-inverse recipe")
    return module.torch_ref


def _inputs(cls, lens, H, seed, state, **kw):
    """Inputs of one class, packed when `lens` has more than one sequence, on the GPU."""
    T = sum(lens)
    x = ic.make_class_inputs(cls, 1, T, H, seed=seed, state=state, n_states=len(lens), **kw)
    bf = torch.bfloat16
    dev = {n: torch.from_numpy(np.ascontiguousarray(x[n])).cuda().to(bf) for n in ("q", "k", "v", "g", "beta")}
    dev["A_log"] = torch.from_numpy(x["A_log"]).cuda()
    dev["dt_bias"] = torch.from_numpy(x["dt_bias"]).cuda()
    init = x["initial_state"]
    if init is not None:
        init = torch.from_numpy(init).cuda()
        init = init.to(bf) if state == "bf16" else init
    cu = None if len(lens) == 1 else torch.tensor([0] + list(lens), device="cuda").cumsum(0).to(torch.int32)
    return dev, init, cu


CASES = [  # (class, lengths, H, seed, state dtype, class keywords)
    ("random", [300], 3, 0, None, {}),
    ("model", [1, 63, 200, 16, 17], 2, 1, "bf16", {}),
    ("model", [513, 40], 4, 2, "fp32", {}),
    ("long", [1000], 2, 3, "fp32", {}),
    ("correlated_weak", [400], 2, 4, "fp32", dict(eps=0.0, beta_logit=6.0)),
    ("correlated_weak", [250, 150], 2, 5, "bf16", dict(eps=0.05, beta_logit=6.0)),
    ("correlated", [400], 2, 6, "fp32", dict(eps=0.0, beta_logit=8.0)),
]


@pytest.mark.parametrize("cls, lens, H, seed, state, kw", CASES, ids=[f"{c[0]}-{len(c[1])}-{c[4]}" for c in CASES])
def test_prefill_is_flashkdas_torch_reference_bit_for_bit(torch_ref, cls, lens, H, seed, state, kw):
    import kda_aot

    x, init, cu = _inputs(cls, lens, H, seed, state, **kw)
    N = len(lens)
    o, s = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                           lower_bound=-5.0, initial_state=init, output_final_state=True, cu_seqlens=cu, cp="off")
    ref_o = torch.full_like(x["q"], float("nan"))
    state_dtype = torch.float32 if init is None else init.dtype
    ref_s = torch.full((N, H, D, D), float("nan"), dtype=state_dtype, device="cuda")
    torch_ref(x["q"], x["k"], x["v"], x["g"], x["beta"], D ** -0.5, ref_o, x["A_log"], x["dt_bias"], -5.0,
              initial_state=init, final_state=ref_s, cu_seqlens=None if cu is None else cu.long())
    torch.cuda.synchronize()
    assert torch.equal(o, ref_o), f"output differs in {(o != ref_o).sum().item()} of {o.numel()} values"
    s = s.to(state_dtype)
    assert torch.equal(s, ref_s), f"final state differs in {(s != ref_s).sum().item()} values"
