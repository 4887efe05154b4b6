"""State pool by slot index and checkpoint states on the GPU (docs/state_pool.md).

The pool is checked bit for bit against what an engine does by hand today (gather the slots,
prefill with initial_state / output_final_state, scatter the final states back), serial and CP;
checkpoints against the final state of a prefill of each prefix (serial: bitwise) and, for CP,
against the serial checkpoints within the CP-vs-serial bound of tests/gpu/test_cp.py. Engine style
throughout: cu_seqlens only on the device, fresh tensors, the caller's stream, CUDA graphs.
"""


import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
torch = pytest.importorskip("torch")

from state_buffers import inputs as _inputs, pool as _pool, prefill as _prefill, poison as _poison  # noqa: E402

D = 128
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _by_hand(x, pool, idx, cp):
    """Gather -> prefill(initial_state, output_final_state) -> scatter, on copies: (o, expected storage)."""
    idx_l = idx.tolist()
    S = pool.shape[0]
    init = torch.zeros((len(idx_l),) + tuple(pool.shape[1:]), dtype=pool.dtype, device="cuda")
    for n, s in enumerate(idx_l):
        if 0 <= s < S:
            init[n] = pool[s]
    o, fs = _prefill(x, initial_state=init, output_final_state=True, cp=cp)
    want = pool.clone()
    for n, s in enumerate(idx_l):
        if 0 <= s < S:
            want[s] = fs[n]
    return o, want


def _same_bits(a, b):
    return torch.equal(a.contiguous().view(torch.int8), b.contiguous().view(torch.int8))


CASES = {  # name: (lengths, H, cp)
    "serial": ([300, 0, 1024, 77, 16], 4, "off"),
    "cp": ([4096, 1000, 0, 2500], 4, 4),
    "cp_on": ([8192, 2048], 4, "on"),
}


@pytest.mark.parametrize("pad", [0, 4096])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("case", list(CASES))
def test_pool_equals_gather_prefill_scatter(case, dtype, pad):
    lens, H, cp = CASES[case]
    x = _inputs(lens, H, seed=len(lens) + pad)
    pool, storage = _pool(9, H, DTYPES[dtype], pad, seed=3)
    idx = torch.tensor([7, 2, 0, 5, 8][:len(lens)], dtype=torch.int32, device="cuda")
    o_want, pool_want = _by_hand(x, pool, idx, cp)
    storage_want = storage.clone()
    storage_want.as_strided(pool.shape, pool.stride()).copy_(pool_want)
    o, none = _prefill(x, state_pool=pool, state_indices=idx, cp=cp)
    assert none is None
    assert torch.equal(o, o_want)
    assert _same_bits(storage, storage_want), "pool (or its padding) differs from gather -> prefill -> scatter"


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("case", list(CASES))
def test_negative_and_out_of_range_indices_start_from_zero_and_write_nothing(case, dtype):
    lens, H, cp = CASES[case]
    x = _inputs(lens, H, seed=17)
    S = 6
    pool, storage = _pool(S, H, DTYPES[dtype], 0, seed=4)
    _poison(pool[1])
    _poison(pool[4])
    idx = torch.tensor([-1, 3, S, 0, -7][:len(lens)], dtype=torch.int32, device="cuda")
    before = storage.clone()
    o_want, pool_want = _by_hand(x, pool, idx, cp)
    o, _ = _prefill(x, state_pool=pool, state_indices=idx, cp=cp)
    assert torch.equal(o, o_want)
    assert _same_bits(pool, pool_want)
    for s in (1, 2, 4, 5):  # slots no sequence names (or only as an out-of-range index) keep their bits
        assert _same_bits(pool[s], before.view(pool.shape)[s]), f"slot {s} was written"
    # the output of a sequence with index -1 is the zero-initial-state output
    o_zero, _ = _prefill(x, cp=cp)
    cu = x["cu_seqlens"].tolist()
    for n, s in enumerate(idx.tolist()):
        if not 0 <= s < S:
            assert torch.equal(o[0, cu[n]:cu[n + 1]], o_zero[0, cu[n]:cu[n + 1]])


def test_pool_fresh_tensors_side_stream_and_cuda_graph():
    """Fresh tensors each call on the caller's stream, then the call captured into a CUDA graph
    and replayed on new pool contents: equal to gather -> prefill -> scatter each time."""
    lens, H = [700, 64, 1300], 4
    x = _inputs(lens, H, seed=5)
    side = torch.cuda.Stream()
    for trial in range(3):
        pool, _ = _pool(5, H, torch.float32, 64, seed=10 + trial)
        idx = torch.tensor([4, -1, 1], dtype=torch.int32, device="cuda")
        o_want, pool_want = _by_hand(x, pool, idx, "off")
        y = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in x.items()}
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            o, _ = _prefill(y, state_pool=pool, state_indices=idx.clone(), cp="off")
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(o, o_want) and _same_bits(pool, pool_want)

    pool, _ = _pool(5, H, torch.bfloat16, 0, seed=20)
    idx = torch.tensor([0, 3, 2], dtype=torch.int32, device="cuda")
    for cp in ("off", 4):
        graph = torch.cuda.CUDAGraph()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _prefill(x, state_pool=pool.clone(), state_indices=idx, cp=cp)  # plan built before capture
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            o_graph, _ = _prefill(x, state_pool=pool, state_indices=idx, cp=cp)
        for seed in (21, 22):
            fresh, _ = _pool(5, H, torch.bfloat16, 0, seed=seed)
            pool.copy_(fresh)
            o_want, pool_want = _by_hand(x, pool, idx, cp)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(o_graph, o_want) and _same_bits(pool, pool_want), (cp, seed)


def test_repeated_indices_refused_with_validate_host():
    lens, H = [100, 200, 50], 2
    x = _inputs(lens, H, seed=6)
    pool, _ = _pool(4, H, torch.float32, 0, seed=7)
    before = pool.clone()
    with pytest.raises(ValueError, match=r"state_indices: slot 2 appears at entries 0 and 2"):
        _prefill(x, state_pool=pool, state_indices=torch.tensor([2, -1, 2], dtype=torch.int32, device="cuda"),
                 validate="host")
    with pytest.raises(ValueError, match=r"state_indices: entry 1 = 4 is past the pool's 4 slots"):
        _prefill(x, state_pool=pool, state_indices=torch.tensor([0, 4, 1], dtype=torch.int32, device="cuda"),
                 validate="host")
    assert _same_bits(pool, before), "a refused call wrote the pool"
    # repeated negative indices are padding, not a race
    _prefill(x, state_pool=pool, state_indices=torch.tensor([-1, -1, 3], dtype=torch.int32, device="cuda"),
             validate="host")


# ------------------------------------------------------------------------------------------------
# checkpoints


def _expected_index(lens, C, T_total):
    """(sequence, prefix tokens) per slot, (-1, -1) in holes: docs/state_pool.md's layout."""
    table = [(-1, -1)] * (T_total // C)
    start = 0
    for n, L in enumerate(lens):
        for j in range(1, L // C + 1):
            table[(start + j * C) // C - 1] = (n, j * C)
        start += L
    return table


def _prefix_final(x, n, p, initial):
    """Final state of a serial prefill of the first p tokens of sequence n alone."""
    cu = x["cu_seqlens"].tolist()
    a = cu[n]
    y = {k: x[k][:, a:a + p] for k in ("q", "k", "v", "g", "beta")}
    y.update(A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=x["lower_bound"],
             cu_seqlens=torch.tensor([0, p], dtype=torch.int32, device="cuda"))
    kw = {} if initial is None else dict(initial_state=initial[n:n + 1].contiguous())
    _, fs = _prefill(y, output_final_state=True, cp="off", **kw)
    return fs[0]


@pytest.mark.parametrize("C", [64, 16])
@pytest.mark.parametrize("state", ["fp32", "bf16", None])
def test_serial_checkpoints_are_prefix_final_states(state, C):
    lens, H = [200, 64, 0, 37, 512, 130, 48], 2
    x = _inputs(lens, H, seed=8)
    T = sum(lens)
    initial = None
    kw = {}
    if state is not None:
        gen = torch.Generator(device="cuda").manual_seed(9)
        initial = (0.1 * torch.randn((len(lens), H, D, D), generator=gen, device="cuda")).to(DTYPES[state])
        kw = dict(initial_state=initial)
    dtype = DTYPES[state or "fp32"]
    ck_buf = _poison(torch.empty((T // C, H, D, D), dtype=dtype, device="cuda"))
    ix_buf = torch.full((T // C, 2), 12345, dtype=torch.int32, device="cuda")
    o, fs, ck = _prefill(x, output_final_state=True, cp="off", checkpoint_every=C, checkpoints=ck_buf,
                         checkpoint_index=ix_buf, **kw)
    assert ck.states is ck_buf and ck.index is ix_buf
    table = [tuple(r) for r in ck.index.tolist()]
    assert table == _expected_index(lens, C, T)
    o_plain, fs_plain = _prefill(x, output_final_state=True, cp="off", **kw)
    assert torch.equal(o, o_plain) and torch.equal(fs, fs_plain), "checkpoints changed the output"
    for s, (n, p) in enumerate(table):
        if n < 0:
            assert _same_bits(ck.states[s], _poison(torch.empty_like(ck.states[s]))), f"hole {s} was written"
            continue
        want = _prefix_final(x, n, p, initial)
        assert _same_bits(ck.states[s], want), f"checkpoint {s} = (sequence {n}, {p} tokens)"
        if p == lens[n]:
            assert _same_bits(ck.states[s], fs[n]), "the end-of-sequence checkpoint is the final state"


def test_checkpoint_edges_dense_short_and_empty():
    import kda_aot

    H = 2
    # dense [B, T]: sequence n starts at n*T
    from kda_aot import reference

    x = reference.make_inputs((2, 160), H, seed=12, device="cuda")
    x.pop("initial_state", None)
    o, none, ck = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                                  dt_bias=x["dt_bias"], checkpoint_every=64)
    assert none is None and ck.states.dtype == torch.float32 and ck.states.shape == (5, H, D, D)
    assert [tuple(r) for r in ck.index.tolist()] == _expected_index([160, 160], 64, 320)
    # every sequence shorter than C: slots exist but all are holes
    y = _inputs([50, 40, 60], H, seed=13)
    _, _, ck = _prefill(y, checkpoint_every=64)
    assert ck.index.tolist() == [[-1, -1], [-1, -1]]
    # T = 0 and T < C: no slot at all
    for lens in ([0], [0, 0], [10, 20]):
        z = _inputs(lens, H, seed=14)
        o, _, ck = _prefill(z, checkpoint_every=64)
        assert ck.states.shape == (0, H, D, D) and ck.index.shape == (0, 2)


@pytest.mark.parametrize("state", ["fp32", "bf16"])
def test_cp_checkpoints_within_cp_bound_of_serial(state):
    lens, H = [4096, 1000, 0, 2500], 4
    x = _inputs(lens, H, seed=15)
    gen = torch.Generator(device="cuda").manual_seed(16)
    initial = (0.1 * torch.randn((len(lens), H, D, D), generator=gen, device="cuda")).to(DTYPES[state])
    o_s, fs_s, ck_s = _prefill(x, initial_state=initial, output_final_state=True, cp="off", checkpoint_every=64)
    o_c, fs_c, ck_c = _prefill(x, initial_state=initial, output_final_state=True, cp=4, checkpoint_every=64)
    assert torch.equal(ck_c.index, ck_s.index)
    valid = ck_s.index[:, 0] >= 0
    got, want = ck_c.states[valid].double(), ck_s.states[valid].double()
    rmax = float((got - want).abs().max() / want.abs().max())
    assert rmax < 1e-2, f"rel max {rmax:.2e}"
    for s in torch.nonzero(valid).flatten().tolist():
        a, b = ck_c.states[s].double(), ck_s.states[s].double()
        rmse = float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())
        assert rmse < 4e-3, f"checkpoint {s}: rel RMSE {rmse:.2e}"


@pytest.mark.parametrize("cp", ["off", 4])
def test_pool_with_checkpoints(cp):
    """Both features at once: the pool as with gather/scatter, the checkpoints as with initial_state."""
    lens, H = [4096, 1000, 0, 2500], 4
    x = _inputs(lens, H, seed=18)
    pool, storage = _pool(6, H, torch.bfloat16, 512, seed=19)
    idx = torch.tensor([5, -1, 0, 2], dtype=torch.int32, device="cuda")
    init = torch.zeros((4, H, D, D), dtype=torch.bfloat16, device="cuda")
    for n, s in enumerate(idx.tolist()):
        if s >= 0:
            init[n] = pool[s]
    o_want, fs_want, ck_want = _prefill(x, initial_state=init, output_final_state=True, cp=cp, checkpoint_every=128)
    pool_want = pool.clone()
    for n, s in enumerate(idx.tolist()):
        if s >= 0:
            pool_want[s] = fs_want[n]
    o, none, ck = _prefill(x, state_pool=pool, state_indices=idx, cp=cp, checkpoint_every=128)
    assert none is None and torch.equal(o, o_want) and _same_bits(pool, pool_want)
    assert torch.equal(ck.index, ck_want.index)
    valid = ck.index[:, 0] >= 0
    assert _same_bits(ck.states[valid], ck_want.states[valid])


# ------------------------------------------------------------------------------------------------
# the torch op (kda_aot::prefill_pool)


@pytest.mark.parametrize("pad", [0, 1024])
def test_torch_op_and_compile_equal_the_direct_call(pad):
    """kda_aot.torch.prefill with a pool, eager and under torch.compile(fullgraph=True), writes the
    pool exactly as kda_aot.prefill does (a padded pool too)."""
    import kda_aot.torch as kt

    lens, H = [300, 0, 700], 4
    x = _inputs(lens, H, seed=30)
    idx = torch.tensor([3, 1, -1], dtype=torch.int32, device="cuda")
    ref_pool, _ = _pool(4, H, torch.float32, pad, seed=31)
    o_want, _ = _prefill(x, state_pool=ref_pool, state_indices=idx, cp="off")

    def fn(pool):
        o, _ = kt.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                          cu_seqlens=x["cu_seqlens"], state_pool=pool, state_indices=idx, cp="off")
        return o, o.float().square().sum()

    eager_pool, _ = _pool(4, H, torch.float32, pad, seed=31)
    o, _ = fn(eager_pool)
    assert torch.equal(o, o_want) and _same_bits(eager_pool, ref_pool)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)  # any graph break raises
    comp_pool, _ = _pool(4, H, torch.float32, pad, seed=31)
    o_c, _ = compiled(comp_pool)
    assert torch.equal(o_c, o_want) and _same_bits(comp_pool, ref_pool)
