"""Listed sequences on the GPU (`segment_ids`, docs/state_pool.md "Listed sequences").

The contract, the vLLM FlashKDA fork's: a call with `segment_ids` computes the listed sequences
exactly as the call without the list does (their `out` rows, final states, pool slots and
checkpoints bit for bit), and leaves every other sequence's `out` rows, final state, pool slot and
checkpoints untouched (poisoned before the call, still poison after). An empty list writes
nothing. Checked serial and CP (where the list keeps each listed sequence's cut, so CP is bitwise
to CP without the list), varlen and dense, with plain states, a state pool and both kinds of
checkpoints, on model gates, long memory and correlated keys (kda_aot/references/input_classes.py),
with device-only cu_seqlens and inside a CUDA graph whose list changes between replays. Entries
outside [0, N) are skipped and repeated ones run once on the device; validate="host" refuses both.
"""

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]
torch = pytest.importorskip("torch")

from kda_aot.references import input_classes as ic  # noqa: E402
from state_buffers import is_poison, poison, same_bits  # noqa: E402

H = 4
LENS = [300, 16, 1, 513, 0, 64, 2048, 47]
LISTED = [3, 0, 2, 6]
CLASSES = ("model", "long", "correlated")


def _inputs(cls, lens, seed=0, state="fp32", dense=None):
    """Class inputs packed as one varlen batch of `lens` (or dense (B, T) when `dense` is given),
    on the device, with an initial state per sequence."""
    if dense is not None:
        B, T = dense
        x = ic.make_class_inputs(cls, B, T, H, seed=seed, state=state)
        cu = None
    else:
        x = ic.make_class_inputs(cls, 1, sum(lens), H, seed=seed, state=state, n_states=len(lens))
        cu = torch.tensor(ic.cu_seqlens(lens), dtype=torch.int32, device="cuda")
    dev = {n: torch.from_numpy(np.ascontiguousarray(x[n])).cuda().to(torch.bfloat16) for n in ("q", "k", "v", "g",
                                                                                             "beta")}
    dev["A_log"] = torch.from_numpy(x["A_log"]).cuda()
    dev["dt_bias"] = torch.from_numpy(x["dt_bias"]).cuda()
    dev["initial_state"] = torch.from_numpy(x["initial_state"]).cuda().to(
        torch.float32 if state == "fp32" else torch.bfloat16)
    dev["lower_bound"] = x["lower_bound"]
    dev["cu_seqlens"] = cu
    return dev


def _run(x, ids, cp="off", **kw):
    """prefill into poisoned out / final_state buffers; returns (out, final_state, rest)."""
    import kda_aot

    out = poison(torch.empty_like(x["v"]))
    fs = poison(torch.empty_like(x["initial_state"]))
    res = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                          lower_bound=x["lower_bound"], cu_seqlens=x["cu_seqlens"], initial_state=x["initial_state"],
                          output_final_state=True, final_state=fs, out=out, cp=cp, segment_ids=ids, **kw)
    return out, fs, res


def _ids(values):
    return torch.tensor(values, dtype=torch.int32, device="cuda")


def _token_ranges(x, lens):
    if x["cu_seqlens"] is None:
        B, T = x["q"].shape[:2]
        return [(n, slice(None), n) for n in range(B)]  # (sequence, token slice, batch row)
    cu = ic.cu_seqlens(lens)
    return [(n, slice(int(cu[n]), int(cu[n + 1])), 0) for n in range(len(lens))]


def _check_listed(x, lens, listed, full, got):
    """Listed sequences equal the full launch bit for bit; the others are untouched poison."""
    (o_full, fs_full), (o, fs) = full[:2], got[:2]
    for n, tokens, b in _token_ranges(x, lens):
        if n in listed:
            assert same_bits(o[b, tokens], o_full[b, tokens]), f"sequence {n}: out differs from the full launch"
            assert same_bits(fs[n], fs_full[n]), f"sequence {n}: final state differs from the full launch"
        else:
            assert is_poison(o[b, tokens]), f"sequence {n} is not listed but its out rows were written"
            assert is_poison(fs[n]), f"sequence {n} is not listed but its final state was written"


@pytest.mark.parametrize("cp", ["off", 4])
@pytest.mark.parametrize("state", ["fp32", "bf16"])
@pytest.mark.parametrize("cls", CLASSES)
def test_listed_sequences_equal_the_full_launch(cls, state, cp):
    x = _inputs(cls, LENS, seed=1, state=state)
    full = _run(x, None, cp=cp)
    got = _run(x, _ids(LISTED), cp=cp)
    _check_listed(x, LENS, set(LISTED), full, got)


@pytest.mark.parametrize("cp", ["off", 4])
def test_dense_batch(cp):
    x = _inputs("model", None, seed=2, dense=(5, 700))
    full = _run(x, None, cp=cp)
    got = _run(x, _ids([4, 1]), cp=cp)
    _check_listed(x, None, {4, 1}, full, got)


@pytest.mark.parametrize("cp", ["off", 4])
def test_empty_list_writes_nothing(cp):
    x = _inputs("model", LENS, seed=3)
    out, fs, _ = _run(x, _ids([]), cp=cp)
    assert is_poison(out) and is_poison(fs)


@pytest.mark.parametrize("cp", ["off", 4])
def test_out_of_range_and_repeated_entries_are_skipped_on_the_device(cp):
    x = _inputs("correlated", LENS, seed=4)
    want = _run(x, _ids([3, 0]), cp=cp)
    got = _run(x, _ids([3, 3, -1, 99, len(LENS), 0, -2147483648]), cp=cp)
    assert same_bits(got[0], want[0]) and same_bits(got[1], want[1])


def test_validate_host_refuses_out_of_range_and_repeated_entries():
    x = _inputs("model", LENS, seed=5)
    for bad, words in (([0, len(LENS)], "entry 1"), ([2, -1], "entry 1"), ([6, 1, 6], "appears at entries 0 and 2")):
        with pytest.raises(ValueError, match=f"segment_ids: .*{words}"):
            _run(x, _ids(bad), validate="host")
    _run(x, _ids(LISTED), validate="host")


@pytest.mark.parametrize("cp", ["off", 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_pool_slots_of_unlisted_sequences_are_untouched(dtype, cp):
    import kda_aot

    x = _inputs("long", LENS, seed=6)
    n_pool = len(LENS) + 3
    idx = _ids([5, 0, 9, 2, -1, 7, 1, 10])
    base = (0.1 * torch.randn((n_pool, H, 128, 128), device="cuda")).to(dtype)
    args = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=x["lower_bound"], cu_seqlens=x["cu_seqlens"],
                state_indices=idx, cp=cp)
    full_pool = base.clone()
    o_full, _ = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], state_pool=full_pool, **args)
    pool = base.clone()
    out = poison(torch.empty_like(x["v"]))
    kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], state_pool=pool, out=out,
                    segment_ids=_ids(LISTED), **args)
    slots = idx.tolist()
    for n, tokens, _ in _token_ranges(x, LENS):
        s = slots[n]
        if n in LISTED:
            assert same_bits(out[0, tokens], o_full[0, tokens])
            if s >= 0:
                assert same_bits(pool[s], full_pool[s]), f"sequence {n}: slot {s} differs from the full launch"
        else:
            assert is_poison(out[0, tokens])
            if s >= 0:
                assert same_bits(pool[s], base[s]), f"sequence {n} is not listed but its slot {s} was written"
    for s in range(n_pool):  # slots no sequence names
        if s not in slots:
            assert same_bits(pool[s], base[s])


@pytest.mark.parametrize("cp", ["off", 4])
def test_checkpoints_every_c(cp):
    x = _inputs("model", LENS, seed=7)
    C = 64
    full = _run(x, None, cp=cp, checkpoint_every=C)
    got = _run(x, _ids(LISTED), cp=cp, checkpoint_every=C)
    _check_listed(x, LENS, set(LISTED), full, got)
    ck_full, ck = full[2][2], got[2][2]
    seq_full, seq = ck_full.index[:, 0].tolist(), ck.index[:, 0].tolist()
    for slot, n in enumerate(seq_full):
        if n in LISTED:
            assert seq[slot] == n and torch.equal(ck.index[slot], ck_full.index[slot])
            assert same_bits(ck.states[slot], ck_full.states[slot])
        else:
            assert seq[slot] == -1, f"checkpoint slot {slot} of unlisted sequence {n} is not a hole"


@pytest.mark.parametrize("cp", ["off", 4])
def test_checkpoints_at_given_offsets(cp):
    x = _inputs("correlated", LENS, seed=8)
    offs = _ids([[256, 64], [16, 0], [0, 0], [512, 128], [0, 0], [32, 48], [2032, 1024], [32, 0]])

    def run(ids):
        buf = poison(torch.empty((len(LENS), 2, H, 128, 128), dtype=torch.float32, device="cuda"))
        res = _run(x, ids, cp=cp, checkpoint_offsets=offs, checkpoint_state=buf)
        return res[0], res[1], buf

    full, got = run(None), run(_ids(LISTED))
    _check_listed(x, LENS, set(LISTED), full, got)
    for n in range(len(LENS)):
        if n in LISTED:
            assert same_bits(got[2][n], full[2][n]), f"sequence {n}: checkpoints differ from the full launch"
        else:
            assert is_poison(got[2][n]), f"sequence {n} is not listed but its checkpoints were written"


def test_graph_replay_follows_the_list():
    """Captured once; the list's content changes between replays (its length is the graph's)."""
    x = _inputs("model", LENS, seed=9)
    ids = _ids([3, 0])
    out = torch.empty_like(x["v"])
    fs = torch.empty_like(x["initial_state"])
    import kda_aot

    def call():
        kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                        lower_bound=x["lower_bound"], cu_seqlens=x["cu_seqlens"], initial_state=x["initial_state"],
                        output_final_state=True, final_state=fs, out=out, segment_ids=ids)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()  # the plan, before the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    full = _run(x, None)
    for listed in ([6, 2], [7, 1], [5, 5]):
        poison(out)
        poison(fs)
        ids.copy_(_ids(listed))
        graph.replay()
        torch.cuda.synchronize()
        _check_listed(x, LENS, set(listed), full, (out, fs))


def test_flashkda_compat_takes_segment_ids_and_use_vsplit():
    from kda_aot import flashkda_compat as fk

    x = _inputs("model", LENS, seed=10)

    def run(ids, vsplit):
        out = poison(torch.empty_like(x["v"]))
        fs = poison(torch.empty_like(x["initial_state"]))
        fk.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], 128 ** -0.5, out, x["A_log"], x["dt_bias"], -5.0,
               initial_state=x["initial_state"], final_state=fs, cu_seqlens=x["cu_seqlens"], segment_ids=ids,
               use_vsplit=vsplit)
        return out, fs

    full = run(None, False)
    assert all(same_bits(a, b) for a, b in zip(full, run(None, True)))
    _check_listed(x, LENS, set(LISTED), full, run(_ids(LISTED), True))
    ws = torch.empty(fk.get_workspace_size(sum(LENS), H, len(LENS)), dtype=torch.uint8, device="cuda")
    out = poison(torch.empty_like(x["v"]))
    fs = poison(torch.empty_like(x["initial_state"]))
    fk.FLASHKDA_FWD(x["q"], x["k"], x["v"], x["g"], x["beta"], 128 ** -0.5, out, ws, x["A_log"], x["dt_bias"], -5.0,
                    x["initial_state"], fs, x["cu_seqlens"], segment_ids=_ids(LISTED))
    _check_listed(x, LENS, set(LISTED), full, (out, fs))
