"""kda_aot.flashkda_compat on the kernels: bit for bit against kda_aot.prefill (FlashKDA's form,
serial) on fixed, varlen, batched and state cases; one workspace sized by get_workspace_size for
the maxima serving smaller calls with prefix-slice outputs, as vLLM's prefill does; the operator
eager and under torch.compile; and, where a build of FlashKDA is importable (`flash_kda`), bit for
bit against FlashKDA's own fwd on the same cases. FlashKDA's own suite (its tests/test_fwd_full.py)
runs against this module from FlashKDA's source, outside this repository.
"""

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
torch = pytest.importorskip("torch")

D = 128

CASES = {
    # name: (shape: (B, T) dense or a list of lengths, H, state dtype, has initial, has final)
    "fixed-no-state": ((1, 4096), 4, None, False, False),
    "fixed-in-out-bf16": ((1, 1000), 8, "bf16", True, True),
    "fixed-out-only-fp32": ((1, 97), 2, "fp32", False, True),
    "batched-in-out-fp32": ((4, 256), 4, "fp32", True, True),
    "batched-in-only-bf16": ((2, 1024), 1, "bf16", True, False),
    "varlen-in-out-bf16": ([1300, 547, 2048, 963, 271, 3063], 4, "bf16", True, True),
    "varlen-in-out-fp32": ([17, 33, 65, 1, 16], 2, "fp32", True, True),
    "varlen-out-only-fp32": ([4, 8, 12], 96, "fp32", False, True),
    "long-memory": ([8192], 2, "fp32", True, True),
}


def _case(name, seed=0):
    from kda_aot import reference

    shape, H, state, has_in, has_out = CASES[name]
    x = reference.make_inputs(shape, H, seed=seed, device="cuda", state=state or "fp32",
                              g_mean=-8.0 if name == "long-memory" else 0.0)
    cu = None if x["cu_seqlens"] is None else x["cu_seqlens"].long()  # FlashKDA's int64
    N = x["q"].shape[0] if cu is None else cu.numel() - 1
    dtype = torch.bfloat16 if state == "bf16" else torch.float32
    h0 = x["initial_state"].to(dtype) if has_in else None
    final = torch.full((N, H, D, D), float("nan"), dtype=dtype, device="cuda") if has_out else None
    return x, cu, h0, final


def _args(x):
    return x["q"], x["k"], x["v"], x["g"], x["beta"]


def _bits_equal(a, b):
    if a is None or b is None:
        return a is None and b is None
    view = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[a.dtype]
    return a.dtype == b.dtype and bool((a.view(view) == b.view(view)).all())


@pytest.mark.parametrize("name", list(CASES))
def test_fwd_equals_prefill_bitwise(name):
    import kda_aot
    from kda_aot import flashkda_compat as fk

    x, cu, h0, final = _case(name)
    out = torch.full_like(x["q"], float("nan"))
    assert fk.fwd(*_args(x), D ** -0.5, out, x["A_log"], x["dt_bias"], -5.0, initial_state=h0, final_state=final,
                  cu_seqlens=cu) is None
    want_o, want_s = kda_aot.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=-5.0,
                                     scale=D ** -0.5, initial_state=h0, output_final_state=final is not None,
                                     final_state=None if final is None else torch.empty_like(final), cu_seqlens=cu,
                                     cp="off")
    assert not torch.isnan(out).any(), "out was not written everywhere"
    assert _bits_equal(out, want_o) and _bits_equal(final, want_s)


def test_one_workspace_for_the_maxima_serves_smaller_calls_with_prefix_slices():
    """vLLM's prefill step: out and final_state are prefix slices of buffers sized for the
    scheduler's maxima, and the workspace comes from get_workspace_size(max tokens, H, max seqs)."""
    import kda_aot
    from kda_aot import flashkda_compat as fk
    from kda_aot import reference

    T_max, H, N_max = 8192, 8, 16
    ws = torch.empty(fk.get_workspace_size(T_max, H, N_max), dtype=torch.uint8, device="cuda")
    out_buf = torch.empty(1, T_max, H, D, dtype=torch.bfloat16, device="cuda")
    final_buf = torch.empty(N_max, H, D, D, dtype=torch.bfloat16, device="cuda")
    for seed, lens in enumerate(([8192 - 15 * 16] + [16] * 15, [3000, 17, 1], [8192], [5] * 16, [1000])):
        x = reference.make_inputs(lens, H, seed=seed, device="cuda", state="bf16")
        T, N = sum(lens), len(lens)
        cu = x["cu_seqlens"].long()
        out, final = out_buf[:, :T], final_buf[:N]
        assert kda_aot.workspace_size(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=cu,
                                      initial_state=x["initial_state"], output_final_state=True, cp="off") <= ws.numel()
        fk.fwd(*_args(x), D ** -0.5, out, x["A_log"], x["dt_bias"], -5.0, initial_state=x["initial_state"],
               final_state=final, cu_seqlens=cu, workspace=ws)
        want_o, want_s = kda_aot.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"],
                                         initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu,
                                         cp="off")
        assert _bits_equal(out.contiguous(), want_o) and _bits_equal(final.contiguous(), want_s), lens


def test_cp_workspace_bound_serves_split_calls():
    import kda_aot
    from kda_aot import flashkda_compat as fk
    from kda_aot import reference
    from kda_aot.library.streams import sm_count

    H = 2
    ws = torch.empty(fk.get_workspace_size(32768, H, 4, cp="auto"), dtype=torch.uint8, device="cuda")
    for lens in ([32768], [16384, 16384], [20000, 100, 7, 1]):
        x = reference.make_inputs(lens, H, seed=3, device="cuda", state="fp32")
        cu = x["cu_seqlens"].long()
        need = kda_aot.workspace_size(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=cu,
                                      initial_state=x["initial_state"], output_final_state=True, cp="auto")
        assert need <= ws.numel(), (lens, need, ws.numel(), sm_count(0))
        out, final = torch.empty_like(x["q"]), torch.empty_like(x["initial_state"])
        fk.fwd(*_args(x), D ** -0.5, out, x["A_log"], x["dt_bias"], -5.0, initial_state=x["initial_state"],
               final_state=final, cu_seqlens=cu, workspace=ws, cp="auto")
        want = kda_aot.prefill(*_args(x), A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                               output_final_state=True, cu_seqlens=cu, cp="auto")
        assert _bits_equal(out, want[0]) and _bits_equal(final, want[1]), lens


@pytest.mark.parametrize("name", ["varlen-in-out-bf16", "batched-in-out-fp32"])
def test_op_eager_and_compiled_equal_fwd(name):
    from kda_aot import flashkda_compat as fk

    x, cu, h0, final = _case(name, seed=4)
    want_out = torch.empty_like(x["q"])
    want_final = torch.empty_like(final)
    fk.fwd(*_args(x), D ** -0.5, want_out, x["A_log"], x["dt_bias"], -5.0, h0, want_final, cu)

    def step(q, k, v, g, beta, A_log, dt_bias, h0, cu, out, final):
        fk.FLASHKDA_FWD(q, k, v, g, beta, D ** -0.5, out, None, A_log, dt_bias, -5.0, h0, final, cu)
        return out, final

    inputs = (*_args(x), x["A_log"], x["dt_bias"], h0, cu)
    out, fin = step(*inputs, torch.empty_like(want_out), torch.empty_like(want_final))
    assert _bits_equal(out, want_out) and _bits_equal(fin, want_final)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    out, fin = compiled(*inputs, torch.empty_like(want_out), torch.empty_like(want_final))
    assert _bits_equal(out, want_out) and _bits_equal(fin, want_final)


@pytest.mark.parametrize("name", list(CASES))
def test_fwd_equals_upstream_flashkda_bitwise(name):
    flash_kda = pytest.importorskip("flash_kda", reason="FlashKDA is not installed (build it from its public source)")
    from kda_aot import flashkda_compat as fk

    if getattr(flash_kda, "fwd", None) is fk.fwd:
        pytest.skip("`flash_kda` is this compat module itself (FlashKDA's suite runner puts it first on sys.path)")
    from flashkda_recipe import require_stable_inverse

    require_stable_inverse(flash_kda.fwd)
    x, cu, h0, final = _case(name, seed=5)
    ours_out = torch.full_like(x["q"], float("nan"))
    fk.fwd(*_args(x), D ** -0.5, ours_out, x["A_log"], x["dt_bias"], -5.0, initial_state=h0, final_state=final,
           cu_seqlens=cu)
    fk_out = torch.full_like(x["q"], float("nan"))
    fk_final = None if final is None else torch.full_like(final, float("nan"))
    flash_kda.fwd(*_args(x), D ** -0.5, fk_out, x["A_log"], x["dt_bias"], -5.0, initial_state=h0,
                  final_state=fk_final, cu_seqlens=cu)
    torch.cuda.synchronize()
    assert _bits_equal(ours_out, fk_out), "output differs from FlashKDA"
    assert _bits_equal(final, fk_final), "final state differs from FlashKDA"
