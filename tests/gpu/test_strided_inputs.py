"""Strided q, k, v, g and beta on the GPU: views read in place (docs/api.md).

Each layout is a view an engine hands over without copying: q, k, v, g as column slices of one
packed [T, 4*H*128] projection (vLLM style) with beta a column slice of a wider [T, W] projection,
head-strided views ([T, 2H, 128] sliced [:, ::2]), an fp32 log-decay g strided, and dense
[B, T, H, 128] views of a bigger buffer whose batch stride is T times the token stride. Every
call is compared bit for bit (output and final state) with the same call on .contiguous()
copies, in both numerics modes, serial and CP. Everything around the views is poisoned (NaN), so
a kernel that reads the wrong columns or writes nothing fails. With out, final_state and
workspace given, the call allocates nothing: the peak of torch's allocator does not move.
"""

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
torch = pytest.importorskip("torch")

D = 128
NAMES = ("q", "k", "v", "g", "beta")


def _inputs(shape, H, seed):
    from kda_aot import reference

    return reference.make_inputs(shape, H, seed=seed, device="cuda", state="fp32")


def _nan(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def _flat(t):
    """[B, T, H, X] or [B, T, H] -> rows of the flat token order [B*T, H*X] / [B*T, H]."""
    return t.reshape(t.shape[0] * t.shape[1], -1)


def _as_bt(rows, B, T, H, last=None):
    """A [B*T, H*last] (or [B*T, H]) column view as [B, T, H, last] (or [B, T, H]) without copying."""
    shape = (B, T, H) if last is None else (B, T, H, last)
    st = rows.stride(0)
    strides = (T * st, st, 1) if last is None else (T * st, st, rows.stride(1) * last, 1)
    return rows.as_strided(shape, strides)


def packed_views(x, beta_width=None):
    """q, k, v, g column slices of one poisoned [B*T, 4*H*128] projection; beta columns of a
    poisoned [B*T, W] projection (W odd: any token stride), at a column offset past its start."""
    B, T, H, _ = x["q"].shape
    HD = H * D
    proj = _nan((B * T, 4 * HD), torch.bfloat16)
    views = {}
    for i, name in enumerate(("q", "k", "v", "g")):
        cols = proj[:, i * HD:(i + 1) * HD]
        cols.copy_(_flat(x[name]))
        views[name] = _as_bt(cols, B, T, H, D)
    W = beta_width or (3 * H + 5)
    wide = _nan((B * T, W), x["beta"].dtype)
    cols = wide[:, H + 1:2 * H + 1]
    cols.copy_(_flat(x["beta"]))
    views["beta"] = _as_bt(cols, B, T, H)
    return views, (proj, wide)


def head_strided_views(x):
    """q, k, v, g as [B*T, 2H, 128] tensors sliced [:, ::2] (q, v) or [:, 1::2] (k, g): head
    stride 256, token stride 2H*128; beta the second half of a [B*T, 2H] tensor."""
    B, T, H, _ = x["q"].shape
    views, keep = {}, []
    for i, name in enumerate(("q", "k", "v", "g")):
        buf = _nan((B * T, 2 * H, D), x[name].dtype)
        sl = buf[:, i % 2::2]
        sl.copy_(x[name].reshape(B * T, H, D))
        views[name] = sl.as_strided((B, T, H, D), (T * sl.stride(0), sl.stride(0), sl.stride(1), 1))
        keep.append(buf)
    wide = _nan((B * T, 2 * H), x["beta"].dtype)
    cols = wide[:, H:]
    cols.copy_(_flat(x["beta"]))
    views["beta"] = _as_bt(cols, B, T, H)
    keep.append(wide)
    return views, keep


LAYOUTS = {
    "packed": packed_views,
    "heads": head_strided_views,
}


def _call(x, views, *, out=None, final_state=None, workspace=None, **kw):
    import kda_aot

    args = {k: x[k] for k in ("A_log", "dt_bias", "lower_bound", "initial_state", "cu_seqlens")}
    args.update(kw)
    return kda_aot.prefill(*(views[n] for n in NAMES), output_final_state=True, out=out, final_state=final_state,
                           workspace=workspace, **args)


def _outputs(x):
    """Poisoned out and final_state buffers of the call's shapes."""
    N = x["initial_state"].shape[0]
    H = x["q"].shape[2]
    return _nan(tuple(x["q"].shape), torch.bfloat16), _nan((N, H, D, D), x["initial_state"].dtype)


def _check_equal_to_contiguous(x, views, **kw):
    for name in NAMES:  # the views hold the inputs' values, but not their layout
        assert torch.equal(views[name], x[name]), name
    assert any(not views[n].is_contiguous() for n in NAMES)
    contiguous = {n: views[n].contiguous() for n in NAMES}
    o_want, s_want = _outputs(x)
    _call(x, contiguous, out=o_want, final_state=s_want, **kw)
    o, s = _outputs(x)
    got = _call(x, views, out=o, final_state=s, **kw)
    assert got[0] is o and got[1] is s
    assert not torch.isnan(o.float()).any() and not torch.isnan(s.float()).any(), "outputs were not written"
    assert torch.equal(o, o_want), "output of the strided call differs from the contiguous one"
    assert torch.equal(s, s_want), "final state of the strided call differs from the contiguous one"


CASES = {  # name: (shape: lengths (packed) or (B, T) (dense), H)
    "varlen": ([1500, 17, 0, 2600], 2),
    "dense": ((2, 2100), 2),
}


@pytest.mark.parametrize("cp", ["off", 4])
@pytest.mark.parametrize("numerics", ["flashkda", "accurate"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_strided_views_equal_contiguous_copies(layout, case, numerics, cp):
    shape, H = CASES[case]
    x = _inputs(shape, H, seed=60)
    views, _keep = LAYOUTS[layout](x)
    if case == "dense":
        B, T = shape
        assert views["q"].stride(0) == T * views["q"].stride(1) and views["q"].shape[0] == B > 1
    _check_equal_to_contiguous(x, views, cp=cp, numerics=numerics)


@pytest.mark.parametrize("cp", ["off", 4])
@pytest.mark.parametrize("numerics", ["flashkda", "accurate"])
def test_strided_fp32_log_decay_gate(numerics, cp):
    """gate="log_decay" with an fp32 g (kda_aot.references.input_classes' "logdecay" class) as a head-strided
    slice of an fp32 [T, 2H, 128] tensor, q, k, v packed, beta a column slice."""
    from kda_aot.references import input_classes

    lens, H = [1800, 33, 2300], 2
    T = sum(lens)
    a = input_classes.make_class_inputs("logdecay", 1, T, H, gate="log_decay", seed=61, state="fp32",
                                        n_states=len(lens))
    x = {n: torch.from_numpy(a[n]).cuda() for n in NAMES}
    for n in ("q", "k", "v", "beta"):
        x[n] = x[n].to(torch.bfloat16)
    assert x["g"].dtype == torch.float32
    x.update(A_log=None, dt_bias=None, lower_bound=None,
             initial_state=torch.from_numpy(a["initial_state"]).cuda(),
             cu_seqlens=torch.from_numpy(input_classes.cu_seqlens(lens)).cuda())
    views, _keep = packed_views(dict(x, g=x["q"]))  # q, k, v, beta; g below
    gbuf = _nan((T, 2 * H, D), torch.float32)
    gsl = gbuf[:, 1::2]
    gsl.copy_(x["g"].reshape(T, H, D))
    views["g"] = gsl.as_strided((1, T, H, D), (T * gsl.stride(0), gsl.stride(0), gsl.stride(1), 1))
    assert views["g"].stride()[1:] == (2 * H * D, 2 * D, 1)
    _check_equal_to_contiguous(x, views, cp=cp, numerics=numerics, gate="log_decay")


def test_plans_are_keyed_by_strides():
    """Two different strided layouts of the same shapes, one after the other (and a size-1 batch
    dimension with an arbitrary stride): each equals the contiguous call, so no call ran with
    another layout's strides."""
    lens, H = [700, 300], 2
    x = _inputs(lens, H, seed=62)
    for _ in range(2):
        for layout in ("packed", "heads", "packed"):
            views, _keep = LAYOUTS[layout](x)
            _check_equal_to_contiguous(x, views, cp="off")
        # packed views again, with the token stride of a wider projection
        views, _keep = packed_views(x, beta_width=4 * H + 9)
        _check_equal_to_contiguous(x, views, cp="off")
    # a [1, T, H, 128] view whose batch stride is anything: it is ignored
    views, _keep = packed_views(x)
    odd = dict(views)
    for name in ("q", "k"):
        t = views[name]
        odd[name] = t.as_strided(t.shape, (12345 * 8,) + t.stride()[1:])
    _check_equal_to_contiguous(x, odd, cp="off")


@pytest.mark.parametrize("cp", ["off", 4])
def test_strided_call_allocates_nothing(cp):
    """With out, final_state and workspace given, the strided call allocates no device memory: no
    copy of a view is made (torch's allocator peak stays where it was)."""
    import kda_aot

    lens, H = [3000, 100, 1100], 2
    x = _inputs(lens, H, seed=63)
    views, _keep = packed_views(x)
    args = {k: x[k] for k in ("A_log", "dt_bias", "lower_bound", "initial_state", "cu_seqlens")}
    n = kda_aot.workspace_size(*(views[k] for k in NAMES), output_final_state=True, cp=cp, **args)
    ws = torch.empty((max(n, 1),), dtype=torch.uint8, device="cuda")
    o, s = _outputs(x)
    _call(x, views, out=o, final_state=s, workspace=ws, cp=cp)  # the plan is built on the first call
    o_want, s_want = o.clone(), s.clone()
    o.fill_(float("nan"))
    s.fill_(float("nan"))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    for _ in range(3):
        _call(x, views, out=o, final_state=s, workspace=ws, cp=cp)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() == base, "the strided call allocated device memory (a copy?)"
    assert torch.cuda.memory_allocated() == base
    assert torch.equal(o, o_want) and torch.equal(s, s_want)
