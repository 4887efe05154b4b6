"""Against FLA's chunk_kda (Triton) with FlashKDA's flags, where fla is installed (docs/algorithm.md §5.3 item 3).

FLA keeps an fp32 state and computes in its own order, so agreement is at bf16-recipe level.
docs/algorithm.md §5.3 hopes for 5e-3, but FlashKDA's recipe (ours) and FLA differ by 5.6e-3 on every shape
measured (FlashKDA's published comparison), and so do we (H200, H=4 [4096]: output 5.6e-3, final state 4.2e-3): the
bound is 7e-3. FLA's Triton autotuning makes the first call of each shape slow (minutes). The
measured numbers are appended to $OUT/fla_compare.txt when OUT is set.
"""

import pytest
from reports import append_report

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
torch = pytest.importorskip("torch")


@pytest.mark.parametrize("lens,H", [([4096], 4), ([1300, 547, 2048, 963, 271, 3063], 2)])
def test_close_to_fla_chunk_kda(lens, H, monkeypatch):
    fla_kda = pytest.importorskip("fla.ops.kda")
    monkeypatch.setenv("FLA_KDA_AOT", "0")  # FLA's own kernels, whatever backends are registered
    monkeypatch.setenv("FLA_FLASH_KDA", "0")
    import kda_aot
    from kda_aot import reference

    x = reference.make_inputs(lens, H, seed=13, device="cuda", state="fp32")
    o, s = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                           lower_bound=x["lower_bound"], initial_state=x["initial_state"], output_final_state=True,
                           cu_seqlens=x["cu_seqlens"], cp="off")
    fo, fs = fla_kda.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                               output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                               use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=x["lower_bound"],
                               state_v_first=True, cu_seqlens=x["cu_seqlens"].long(), A_log=x["A_log"],
                               dt_bias=x["dt_bias"].reshape(-1))
    err_o, err_s = reference.rel_rmse(o, fo), reference.rel_rmse(s, fs)
    append_report("fla_compare.txt", f"H={H} lens={lens}: output rel RMSE {err_o:.3e}, final state {err_s:.3e}\n")
    assert err_o < 7e-3 and err_s < 7e-3, (err_o, err_s)
