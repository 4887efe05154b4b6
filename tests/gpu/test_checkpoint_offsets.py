"""Checkpoints at given offsets on the GPU (kda_aot.prefill's checkpoint_offsets, docs/state_pool.md).

Checkpoint (n, k) is the state after the first checkpoint_offsets[n, k] tokens of sequence n,
written when that value is a positive multiple of 16 below the sequence's length, and nowhere
otherwise. Serial checkpoints are checked bit for bit against the final state of a separate
serial prefill of that prefix, into a buffer (checkpoint_state) and into pool slots
(checkpoint_slots); every destination that gets nothing (offset 0, negative, not a multiple of
16, equal to the length or past it; a slot outside the pool) must keep its poison bits. CP
checkpoints are held to the serial ones within the CP-vs-serial bound of
tests/gpu/test_state_pool.py. Engine style: device offsets only, CUDA graphs with new offsets
copied in before each replay, and no host synchronisation.
"""


import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
torch = pytest.importorskip("torch")

from state_buffers import inputs as _inputs, is_poison as _is_poison, poison as _poison  # noqa: E402
from state_buffers import pool as _pool, prefill as _prefill, same_bits as _same_bits  # noqa: E402

D = 128
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
OFFSET_DTYPES = {"int32": torch.int32, "int64": torch.int64}


def _poison_slots(pool, slots):
    for s in slots.flatten().tolist():
        _poison(pool[s])
    return pool


def _states(N, H, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (0.1 * torch.randn((N, H, D, D), generator=gen, device="cuda")).to(dtype)


def _lengths(x):
    """Per-sequence (start token in the flat [B*T] order, length); dense sequence n is row n."""
    if x["cu_seqlens"] is None:
        B, T = x["q"].shape[:2]
        return [(n * T, T) for n in range(B)]
    cu = x["cu_seqlens"].tolist()
    return [(cu[n], cu[n + 1] - cu[n]) for n in range(len(cu) - 1)]


def _written(off, L):
    """Whether checkpoint offset `off` of a sequence of L tokens is written (the spec's rule)."""
    return off > 0 and off % 16 == 0 and off < L


def _prefix_final(x, n, p, initial, dtype):
    """Final state (in `dtype`) of a separate serial prefill of the first p tokens of sequence n,
    starting from initial[n] (zero when initial is None), in the layout of x (packed or dense)."""
    if x["cu_seqlens"] is None:
        y = {k: x[k][n:n + 1, :p].contiguous() for k in ("q", "k", "v", "g", "beta")}
        y["cu_seqlens"] = None
    else:
        a = x["cu_seqlens"].tolist()[n]
        y = {k: x[k][:, a:a + p].contiguous() for k in ("q", "k", "v", "g", "beta")}
        y["cu_seqlens"] = torch.tensor([0, p], dtype=torch.int32, device="cuda")
    y.update(A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=x["lower_bound"])
    H = x["q"].shape[2]
    kw = {} if initial is None else dict(initial_state=initial[n:n + 1].contiguous())
    fs = _poison(torch.empty((1, H, D, D), dtype=dtype, device="cuda"))
    _, fs = _prefill(y, output_final_state=True, final_state=fs, cp="off", **kw)
    return fs[0]


def _check_against_prefixes(x, offsets, got, initial, dtype, what=""):
    """got: [N, K, H, 128, 128]; every written (n, k) equals its prefix's final state, the rest is poison."""
    lengths = _lengths(x)
    n_written = 0
    for n, row in enumerate(offsets):
        for k, off in enumerate(row):
            if _written(off, lengths[n][1]):
                want = _prefix_final(x, n, off, initial, dtype)
                assert _same_bits(got[n, k], want), f"{what} checkpoint ({n}, {k}) at {off} of {lengths[n][1]} tokens"
                n_written += 1
            else:
                assert _is_poison(got[n, k]), f"{what} checkpoint ({n}, {k}) at {off} of {lengths[n][1]} was written"
    return n_written


# Offsets per layout: [N, 2] covering written ones and each kind that writes nothing; the [N] and
# [N, 1] cases take their own column.
LAYOUTS = {
    # lengths 200, 64, 0, 37, 512, 130, 48
    "varlen": dict(shape=[200, 64, 0, 37, 512, 130, 48], H=2,
                   k2=[[64, 192], [64, 48], [16, 0], [32, -16], [500, 496], [128, 1000], [16, 17]],
                   k1=[192, 64, 0, 32, 500, 1000, -16]),
    # dense [3, 160]: sequence n is row n
    "dense": dict(shape=(3, 160), H=2, k2=[[16, 160], [144, -32], [88, 96]], k1=[144, 0, 32]),
}
KS = ["N", "N1", "N2"]  # offsets [N], [N, 1], [N, 2]


def _offsets(layout, K):
    spec = LAYOUTS[layout]
    if K == "N2":
        return spec["k2"]
    return [[o] for o in spec["k1"]]


def _offset_tensor(rows, K, dtype):
    t = torch.tensor(rows, dtype=dtype, device="cuda")
    return t[:, 0].contiguous() if K == "N" else t


@pytest.mark.parametrize("initial,offset_dtype", [(True, "int32"), (False, "int64"), (True, "int64")],
                         ids=["init-int32", "noinit-int64", "init-int64"])
@pytest.mark.parametrize("state", ["fp32", "bf16"])
@pytest.mark.parametrize("K", KS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_serial_checkpoints_into_a_buffer_are_prefix_final_states(layout, K, state, initial, offset_dtype):
    spec = LAYOUTS[layout]
    H = spec["H"]
    x = _inputs(spec["shape"], H, seed=40)
    N = len(_lengths(x))
    dtype = DTYPES[state]
    rows = _offsets(layout, K)
    offsets = _offset_tensor(rows, K, OFFSET_DTYPES[offset_dtype])
    shape = (N, H, D, D) if K == "N" else (N, len(rows[0]), H, D, D)
    ck = _poison(torch.empty(shape, dtype=dtype, device="cuda"))
    init = _states(N, H, dtype, seed=41) if initial else None

    def states():  # with initial and final states too; without any, checkpoint_state decides the dtype
        if not initial:
            return {}
        return dict(initial_state=init, output_final_state=True,
                    final_state=_poison(torch.empty((N, H, D, D), dtype=dtype, device="cuda")))

    kw = states()
    result = _prefill(x, cp="off", checkpoint_offsets=offsets, checkpoint_state=ck, **kw)
    assert len(result) == 2, "checkpoint_offsets must not change the return value"
    o, fs = result
    o_plain, fs_plain = _prefill(x, cp="off", **states())
    assert torch.equal(o, o_plain), "checkpoints changed the output"
    if initial:
        assert fs is kw["final_state"] and _same_bits(fs, fs_plain), "checkpoints changed the final state"
    else:
        assert fs is None
    got = ck if K != "N" else ck.unsqueeze(1)
    assert _check_against_prefixes(x, rows, got, init, dtype) >= 2


@pytest.mark.parametrize("state", ["fp32", "bf16"])
@pytest.mark.parametrize("K", ["N", "N2"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_serial_checkpoints_into_pool_slots(layout, K, state):
    """state_pool + state_indices + checkpoint_slots: the final states as gather -> prefill ->
    scatter, each written checkpoint in its slot as the prefix's final state from the gathered
    initial state; slots outside [0, S), slots of unwritten checkpoints, the other slots and the
    padding between slots keep their bits."""
    spec = LAYOUTS[layout]
    H = spec["H"]
    x = _inputs(spec["shape"], H, seed=42)
    lengths = _lengths(x)
    N = len(lengths)
    dtype = DTYPES[state]
    S = 24
    pool, storage = _pool(S, H, dtype, 4096, seed=43)
    idx_l = [3, 10, -1, 0, 7, 5, 12][:N]
    rows = _offsets(layout, K)
    Kn = len(rows[0])
    # distinct from the state slots and each other; the first written checkpoint's slot negative
    # and, with three or more, the last one's past the pool: those write nothing
    free = [s for s in range(S) if s not in idx_l]
    slots_l = [[free[n * Kn + k] for k in range(Kn)] for n in range(N)]
    written = [(n, k) for n, row in enumerate(rows) for k, off in enumerate(row) if _written(off, lengths[n][1])]
    slots_l[written[0][0]][written[0][1]] = -1
    if len(written) >= 3:
        slots_l[written[-1][0]][written[-1][1]] = S
    idx = torch.tensor(idx_l, dtype=torch.int32, device="cuda")
    offsets = _offset_tensor(rows, K, torch.int32 if state == "fp32" else torch.int64)
    slots = _offset_tensor(slots_l, K, torch.int32)

    init = torch.zeros((N, H, D, D), dtype=dtype, device="cuda")
    for n, s in enumerate(idx_l):
        if 0 <= s < S:
            init[n] = pool[s]
    o_want, fs_want = _prefill(x, initial_state=init, output_final_state=True, cp="off")
    pool_want = pool.clone()
    for n, s in enumerate(idx_l):
        if 0 <= s < S:
            pool_want[s] = fs_want[n]
    n_written = 0
    for n, row in enumerate(rows):
        for k, off in enumerate(row):
            s = slots_l[n][k]
            if _written(off, lengths[n][1]) and 0 <= s < S:
                pool_want[s] = _prefix_final(x, n, off, init, dtype)
                n_written += 1
    assert n_written >= 1
    storage_want = storage.clone()
    storage_want.as_strided(pool.shape, pool.stride()).copy_(pool_want)

    o, none = _prefill(x, state_pool=pool, state_indices=idx, checkpoint_offsets=offsets, checkpoint_slots=slots,
                       cp="off")
    assert none is None
    assert torch.equal(o, o_want)
    for s in range(S):
        assert _same_bits(pool[s], pool_want[s]), f"slot {s}"
    assert _same_bits(storage, storage_want), "the padding between slots was written"


CP_CASES = {  # name: (lengths, H, cp, offsets [N, 2])
    "cp4": ([4096, 1000, 0, 2500], 4, 4, [[1024, 4080], [512, 1000], [16, 0], [2496, 1603]]),
    "cp_on": ([8192, 2048], 4, "on", [[4096, 8176], [-1, 2032]]),
}


def _cp_bound(got, want, what):
    """tests/gpu/test_state_pool.py's CP-vs-serial bound on checkpoints: relative max error < 1e-2
    over all of them, relative RMSE < 4e-3 each."""
    g, w = torch.stack(got).double(), torch.stack(want).double()
    rmax = float((g - w).abs().max() / w.abs().max())
    assert rmax < 1e-2, f"{what}: rel max {rmax:.2e}"
    for i, (a, b) in enumerate(zip(got, want)):
        a, b = a.double(), b.double()
        rmse = float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())
        assert rmse < 4e-3, f"{what}: checkpoint {i}: rel RMSE {rmse:.2e}"


@pytest.mark.parametrize("state", ["fp32", "bf16"])
@pytest.mark.parametrize("dest", ["buffer", "pool"])
@pytest.mark.parametrize("case", list(CP_CASES))
def test_cp_checkpoints_within_cp_bound_of_serial(case, dest, state):
    lens, H, cp, rows = CP_CASES[case]
    x = _inputs(lens, H, seed=44)
    N = len(lens)
    dtype = DTYPES[state]
    offsets = torch.tensor(rows, dtype=torch.int64, device="cuda")
    written = [(n, k) for n, row in enumerate(rows) for k, off in enumerate(row) if _written(off, lens[n])]
    assert len(written) >= 3

    if dest == "buffer":
        init = _states(N, H, dtype, seed=45)

        def run(mode):
            ck = _poison(torch.empty((N, 2, H, D, D), dtype=dtype, device="cuda"))
            o, fs = _prefill(x, initial_state=init, output_final_state=True, cp=mode, checkpoint_offsets=offsets,
                             checkpoint_state=ck)
            return o, fs, ck
    else:
        S = 3 * N + 1
        pool0, _ = _pool(S, H, dtype, 512, seed=45)
        idx = torch.tensor(list(range(N)), dtype=torch.int32, device="cuda")
        slots = torch.tensor([[N + 2 * n, N + 2 * n + 1] for n in range(N)], dtype=torch.int32, device="cuda")
        _poison(pool0[N:])

        def run(mode):
            pool = pool0.clone()
            o, none = _prefill(x, state_pool=pool, state_indices=idx, cp=mode, checkpoint_offsets=offsets,
                               checkpoint_slots=slots)
            assert none is None
            return o, pool[:N], pool[N:N + 2 * N].reshape(N, 2, H, D, D)

    o_s, fs_s, ck_s = run("off")
    o_c, fs_c, ck_c = run(cp)
    for n, row in enumerate(rows):
        for k, off in enumerate(row):
            if (n, k) not in written:
                assert _is_poison(ck_s[n, k]) and _is_poison(ck_c[n, k]), f"checkpoint ({n}, {k}) at {off} was written"
    _cp_bound([ck_c[n, k] for n, k in written], [ck_s[n, k] for n, k in written], f"{case} {dest}")
    # the serial ones are the prefixes' final states (from zero where the pool has no initial state: never here)
    init_s = init if dest == "buffer" else pool0[:N].clone()
    for n, k in written[:2]:
        assert _same_bits(ck_s[n, k], _prefix_final(x, n, rows[n][k], init_s, dtype)), (n, k)
    assert torch.isfinite(o_c.float()).all() and torch.isfinite(fs_c.float()).all()


@pytest.mark.parametrize("dest", ["buffer", "pool"])
def test_cuda_graph_replays_with_fresh_offsets(dest):
    """The call captured once, replayed after new offsets (and new poison) are copied into the
    captured tensors: the checkpoints follow the new offsets (they are read on the device only).
    Serial: against the prefixes; cp=4: against an eager call bit for bit."""
    lens, H = [2100, 64, 1300], 4
    x = _inputs(lens, H, seed=46)
    N = len(lens)
    init = _states(N, H, torch.float32, seed=47)
    fresh_rows = [
        [[1024, 2096], [48, 64], [16, 1296]],
        [[2048, -16], [0, 32], [1300, 640]],
    ]
    offsets = torch.tensor([[16, 32], [16, 32], [16, 32]], dtype=torch.int32, device="cuda")
    S = 10
    idx = torch.tensor([1, 5, 9], dtype=torch.int32, device="cuda")
    slots = torch.tensor([[0, 2], [3, 4], [6, 8]], dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()
    for cp in ("off", 4):
        if dest == "buffer":
            ck = torch.empty((N, 2, H, D, D), dtype=torch.float32, device="cuda")
            kw = dict(initial_state=init, output_final_state=True, checkpoint_offsets=offsets, checkpoint_state=ck)
        else:
            pool0, _ = _pool(S, H, torch.float32, 0, seed=48)
            for n in range(N):
                pool0[int(idx[n])] = init[n]
            pool = pool0.clone()
            kw = dict(state_pool=pool, state_indices=idx, checkpoint_offsets=offsets, checkpoint_slots=slots)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _prefill(x, cp=cp, **kw)  # plan built before capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o_graph, _ = _prefill(x, cp=cp, **kw)
        for rows in fresh_rows:
            offsets.copy_(torch.tensor(rows, dtype=torch.int32))
            if dest == "buffer":
                _poison(ck)
            else:
                pool.copy_(pool0)
                _poison_slots(pool, slots)
            o_graph.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            got = ck if dest == "buffer" else pool[slots.long()]
            if cp == "off":
                n_written = _check_against_prefixes(x, rows, got, init, torch.float32, what=f"{dest} replay")
                assert n_written >= 3
                o_want, _ = _prefill(x, initial_state=init, output_final_state=True, cp="off")
                assert torch.equal(o_graph, o_want)
            else:
                want_offsets = torch.tensor(rows, dtype=torch.int32, device="cuda")
                if dest == "buffer":
                    ck_want = _poison(torch.empty_like(ck))
                    o_want, _ = _prefill(x, initial_state=init, output_final_state=True, cp=cp,
                                         checkpoint_offsets=want_offsets, checkpoint_state=ck_want)
                    want = ck_want
                else:
                    pool_want = _poison_slots(pool0.clone(), slots)
                    o_want, _ = _prefill(x, state_pool=pool_want, state_indices=idx, cp=cp,
                                         checkpoint_offsets=want_offsets, checkpoint_slots=slots)
                    want = pool_want[slots.long()]
                    assert _same_bits(pool, pool_want), "replayed pool differs from an eager call"
                assert torch.equal(o_graph, o_want) and _same_bits(got, want), (dest, cp, rows)


@pytest.mark.parametrize("dest,cp", [("buffer", "off"), ("pool", 4)])
def test_no_host_sync_with_device_offsets(dest, cp):
    """A call queued behind a long kernel returns while that kernel still runs: the offsets (and
    slots) are never read back to the host."""
    lens, H = [2048, 300, 1000], 2
    x = _inputs(lens, H, seed=49)
    N = len(lens)
    offsets = torch.tensor([1024, 288, 1000], dtype=torch.int32, device="cuda")
    if dest == "buffer":
        ck = torch.empty((N, H, D, D), dtype=torch.float32, device="cuda")
        kw = dict(initial_state=_states(N, H, torch.float32, seed=50), output_final_state=True,
                  checkpoint_offsets=offsets, checkpoint_state=ck)
    else:
        pool, _ = _pool(2 * N, H, torch.bfloat16, 0, seed=50)
        kw = dict(state_pool=pool, state_indices=torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda"),
                  checkpoint_offsets=offsets,
                  checkpoint_slots=torch.tensor([3, 4, 5], dtype=torch.int32, device="cuda"))
    _prefill(x, cp=cp, **kw)  # the first call of a shape builds its plan (host work only, but keep it out)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(1e9))  # about half a second of GPU time
    for _ in range(3):
        _prefill(x, cp=cp, **kw)
    assert not torch.cuda.current_stream().query(), "prefill waited for the GPU (a host sync)"
    torch.cuda.synchronize()
