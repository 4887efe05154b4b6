"""kda_aot::prefill_pool without a GPU (docs/state_pool.md): its schema declares exactly the pool (and
checkpoint_state) as written, torch.library.opcheck passes with a CPU stand-in for the kernels (gather the slots, the
float64 gold prefill, scatter the final states back), and kda_aot.torch.prefill routes the pool
arguments to it and refuses what the pool excludes. tests/gpu/test_state_pool.py runs the op on
the device.
"""


import pytest

torch = pytest.importorskip("torch")

import kda_aot.torch as kt  # noqa: E402
from kda_aot import api  # noqa: E402
from kda_aot import reference

from torch_stand_ins import FORMS, gold, with_forms  # noqa: E402

D = 128


class PoolStandIn:
    """api.prefill's pool contract on CPU tensors: slot idx[n] in, final state back into it; a
    slot outside [0, S) starts from zero and is not written."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, g, beta, *, A_log=None, dt_bias=None, lower_bound=None, scale=None, cu_seqlens=None,
                 state_pool=None, state_indices=None, gate="safe", beta_form="logits", allow_neg_eigval=False, **rest):
        self.calls.append(dict(rest, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, scale=scale,
                               state_pool=state_pool, gate=gate, beta_form=beta_form, allow_neg_eigval=allow_neg_eigval))
        S, idx = state_pool.shape[0], state_indices.tolist()
        init = torch.stack([state_pool[i] if 0 <= i < S else torch.zeros_like(state_pool[0]) for i in idx])
        o64, s64 = gold(q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, init, cu_seqlens, gate=gate,
                        beta_form=beta_form, allow_neg_eigval=allow_neg_eigval)
        for n, i in enumerate(idx):
            if 0 <= i < S:
                state_pool[i].copy_(s64[n])
        return q.new_empty(q.shape).copy_(o64), None


@pytest.fixture
def stand_in(monkeypatch):
    fake = PoolStandIn()
    monkeypatch.setattr(api, "prefill", fake)
    return fake


def _case(lens=(9, 0, 14), H=2, S=4, dtype=torch.float32):
    x = reference.make_inputs(list(lens), H, seed=1)
    gen = torch.Generator().manual_seed(2)
    pool = (0.1 * torch.randn(S, H, D, D, generator=gen)).to(dtype)
    idx = torch.tensor([2, -1, 0][:len(lens)], dtype=torch.int32)
    return x, pool, idx


def test_schema_writes_the_pool_and_the_checkpoint_buffer():
    schema = kt.PREFILL_POOL._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["state_pool", "checkpoint_state"]
    assert str(schema).endswith("-> Tensor")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_pool_op(stand_in, dtype):
    x, pool, idx = _case(dtype=dtype)
    result = torch.library.opcheck(kt.PREFILL_POOL, (x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"],
                                                     x["dt_bias"], pool, idx), dict(cu_seqlens=x["cu_seqlens"]))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_python_face_routes_the_pool_and_refuses_what_it_excludes(stand_in):
    x, pool, idx = _case()
    before = pool.clone()
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    o, none = kt.prefill(*args, A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"],
                         state_pool=pool, state_indices=idx, lower_bound=-4.0)
    assert none is None and stand_in.calls[-1]["lower_bound"] == -4.0
    init = torch.stack([before[2], torch.zeros_like(before[0]), before[0]])
    o64, s64 = reference.gold_prefill(*args, x["A_log"], x["dt_bias"], -4.0, None, init, x["cu_seqlens"])
    assert torch.equal(o, o64.to(torch.bfloat16))
    assert torch.equal(pool[2], s64[0].float()) and torch.equal(pool[0], s64[2].float())
    assert torch.equal(pool[1], before[1]) and torch.equal(pool[3], before[3]), "slots no sequence names changed"
    for kw, name in ((dict(initial_state=before[:3]), "initial_state"), (dict(output_final_state=True),
                     "output_final_state"), (dict(out=torch.empty_like(x["q"])), "out")):
        with pytest.raises(ValueError, match=rf"^state_pool: kda_aot.torch.prefill takes no {name}"):
            kt.prefill(*args, A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"],
                       state_pool=pool, state_indices=idx, **kw)
    with pytest.raises(ValueError, match=r"^state_indices: state_pool and state_indices go together"):
        kt.prefill(*args, A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"], state_pool=pool)


@pytest.mark.parametrize("form", FORMS, ids=[f["gate"] for f in FORMS])
def test_pool_op_passes_the_gate_and_beta_forms_through(stand_in, form):
    x, pool, idx = _case()
    x, params, forms = with_forms(x, form)
    before = pool.clone()
    o, _ = kt.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=x["cu_seqlens"], state_pool=pool,
                      state_indices=idx, **params, **forms)
    call = stand_in.calls[-1]
    assert {name: call[name] for name in forms} == forms
    assert all(call[name] is value for name, value in params.items())
    init = torch.stack([before[2], torch.zeros_like(before[0]), before[0]])
    o64, s64 = gold(x["q"], x["k"], x["v"], x["g"], x["beta"], params["A_log"], params["dt_bias"],
                    forms["lower_bound"], None, init, x["cu_seqlens"],
                    **{k: forms[k] for k in ("gate", "beta_form", "allow_neg_eigval")})
    assert torch.equal(o, o64.to(torch.bfloat16)) and torch.equal(pool[2], s64[0].float())
