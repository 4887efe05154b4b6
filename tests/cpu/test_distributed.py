"""Cross-GPU context parallelism on the CPU (docs/distributed.md): the slicing plan, the exchange
with a fake process group (threads behind a barrier, all_gather_into_tensor semantics), the carry
algebra against float64, and the whole host plumbing of kda_aot.distributed.prefill with the float64
gold standing in for the GPU prefill on every rank."""

import random
import threading

import pytest

from kda_aot.plan.dist_plan import KINDS, plan_rank, segment_starts, transfer_segments

pytestmark = pytest.mark.timeout(300)


# ---------------------------------------------------------------------------------------------
# the plan (pure Python)

def _bounds(lens, cuts):
    """Slices [(offset, t_local)] of len(cuts) + 1 ranks from the interior cut points."""
    total = sum(lens)
    pts = [0] + list(cuts) + [total]
    return [(a, b - a) for a, b in zip(pts, pts[1:])]


def _random_case(rng):
    lens = [rng.choice([0, 1, 5, 16, 17, 40, 100]) for _ in range(rng.randint(1, 6))]
    total = sum(lens)
    world = rng.randint(1, 5)
    cuts = sorted(rng.randint(0, total) for _ in range(world - 1))
    return lens, cuts


def _check_plan(lens, cuts):
    slices = _bounds(lens, cuts)
    world = len(slices)
    starts = [0]
    for x in lens:
        starts.append(starts[-1] + x)
    works = [plan_rank(lens, off, t, r, world) for r, (off, t) in enumerate(slices)]
    owner = {}
    for r, w in enumerate(works):
        assert w.kind in KINDS
        # head + rest cover the slice exactly
        assert w.head_len + sum(w.rest_lens) == w.t_local, (lens, cuts, r, w)
        for n in w.final_seqs if hasattr(w, "final_seqs") else range(w.final_first, w.final_first + w.final_count):
            assert n not in owner, f"sequence {n} returned by ranks {owner[n]} and {r}"
            owner[n] = r
        if w.has_head:
            n = w.head_seq
            assert starts[n] < w.token_offset < starts[n + 1]
            # walking back: transfers / identities, then the rank where the sequence began (a reset)
            j = r - 1
            while works[j].kind in ("transfer", "identity"):
                assert works[j].kind == "identity" or works[j].head_seq == n
                j -= 1
            assert works[j].kind == "reset" and works[j].rest_first + len(works[j].rest_lens) - 1 == n, (lens, cuts, r)
    assert sorted(owner) == list(range(len(lens))), (lens, cuts, owner)
    for n, r in owner.items():  # the owner holds the last token (or, for an empty sequence, its start)
        off, t = slices[r]
        if lens[n]:
            assert off < starts[n + 1] <= off + t
    return works


def test_plan_examples():
    lens = [100, 37, 0, 90]  # tokens 0..227
    w = _check_plan(lens, [50, 160, 160])  # ranks: [0,50) [50,160) [] [160,227)
    assert [x.kind for x in w] == ["reset", "reset", "identity", "end"]
    assert (w[1].head_seq, w[1].head_len, w[1].head_ends, w[1].rest_first, w[1].rest_lens) == (0, 50, True, 1, (37, 0, 23))
    assert (w[3].head_seq, w[3].head_len, w[3].rest_lens) == (3, 67, ())
    w = _check_plan([300], [100, 200])
    assert [x.kind for x in w] == ["reset", "transfer", "end"]
    w = _check_plan([10, 0], [10])  # the trailing empty sequence belongs to the last rank
    assert w[0].final_count == 1 and (w[1].final_first, w[1].final_count, w[1].kind) == (1, 1, "identity")


def test_plan_random_partitions_cover_every_sequence_once():
    rng = random.Random(0)
    for _ in range(3000):
        _check_plan(*_random_case(rng))


@pytest.mark.parametrize("bad", [dict(token_offset=1, rank=0), dict(token_offset=0, t_local=5, rank=1),
                                 dict(token_offset=8, t_local=5, rank=1), dict(rank=2)])
def test_plan_refuses_slices_that_cannot_partition_the_batch(bad):
    args = dict(seq_lens=[10], token_offset=0, t_local=10, rank=0, world_size=2)
    args.update(bad)
    with pytest.raises(ValueError, match="token_offset|rank"):
        plan_rank(**args)


def test_transfer_segments():
    assert transfer_segments(0, 8, 132) == (0, 0)
    assert transfer_segments(100, 8, 132) == (1, 7)  # 7 tiles: one segment
    s, per = transfer_segments(8192, 8, 132)  # 512 tiles, P = 16
    assert (s, per) == (16, 32)
    s, per = transfer_segments(65536, 64, 132)  # P = 2
    assert (s, per) == (2, 2048)
    assert segment_starts(100, 7, 1) == (0, 100)
    assert segment_starts(1000, 32, 2) == (0, 512, 1000)


# ---------------------------------------------------------------------------------------------
# the transfer program (the real manifest, launches recorded: tests/recording.py)

@pytest.mark.parametrize("T,H,S", [(10000, 8, 5), (100, 64, 1), (4000, 2, 7)])
def test_transfer_program_wires_k1_and_pre_scan_over_every_segment(monkeypatch, T, H, S):
    from recording import Recorder

    from kda_aot.plan import planner
    from kda_aot.plan.program import INPUTS, pack_inputs
    from kda_aot.plan.transfer import transfer_program

    rec = Recorder(monkeypatch)
    transfer_program.cache_clear()
    tp = transfer_program(rec.lib, 0, H, T, S, 128 ** -0.5, -5.0, 132)
    ptrs = dict(q=1 << 40, k=2 << 40, v=3 << 40, g=4 << 40, beta=5 << 40, A_log=6 << 40, dt_bias=7 << 40,
                cu_seqlens=8 << 40, out=9 << 40, workspace=10 << 40)
    tp.program.run(pack_inputs([ptrs.get(n, 0) for n in INPUTS[:-1]] + [77]))
    tables, k1, scan = rec.last
    assert (tables.name, k1.name) == ("seq_tables_int32", "k1_prepare")
    assert scan.name == f"cp_pre_scan_vb{128 // planner.value_split(S, H, 132)}"
    assert tables.args["cu_seqlens"] == ptrs["cu_seqlens"] and tables.args["n_seq"] == S
    assert tables.args["t_total"] == k1.args["t_total"] == T
    for name in ("seq_start", "tile_prefix"):
        assert tables.args[name] == k1.args[name] == scan.args[name]
    assert k1.args["cap"] == scan.args["cap"] == -(-T // 16) + S and k1.args["n_seq"] == S
    for name in ("kd", "kr", "gt", "inv", "bsig"):
        assert k1.args[f"ws_{name}"] == scan.args[f"ws_{name}"]
    ws_args = [v for n, v in k1.args.items() if n.startswith("ws_") or n in ("seq_start", "tile_prefix")]
    assert all(ptrs["workspace"] <= a < ptrs["workspace"] + tp.workspace_bytes for a in ws_args)
    # every segment is scanned: scan_seg follows the S + 1 segment starts in the table buffer
    assert scan.args["scan_seg"] == ptrs["cu_seqlens"] + 4 * (S + 1) and tp.table_ints == 2 * S + 1
    assert scan.args["n_scan"] == S and scan.args["n_heads"] == H
    assert scan.args["b_seg"] == ptrs["out"] and scan.args["m_seg"] == ptrs["out"] + 4 * S * H * 128 * 128
    assert tp.out_floats == 2 * S * H * 128 * 128
    assert all(launch.args["stream"] == 77 for launch in rec.last)


# ---------------------------------------------------------------------------------------------
# the exchange and the carry algebra (torch on the CPU)

torch = pytest.importorskip("torch")


class FakeGroup:
    """all_gather_into_tensor semantics for threads of one process: every rank publishes its input,
    waits for all, concatenates in rank order."""

    def __init__(self, rank, shared):
        self._rank, self.shared = rank, shared

    def rank(self):
        return self._rank

    def size(self):
        return len(self.shared["slots"])

    def all_gather_into_tensor(self, out, inp):
        s = self.shared
        s["slots"][self._rank] = inp.detach().clone()
        s["calls"][self._rank] += 1
        s["barrier"].wait()
        out.copy_(torch.cat(s["slots"]))
        s["barrier"].wait()


def run_ranks(world, fn):
    """fn(rank, group) on `world` threads; returns the results in rank order (re-raising failures)."""
    shared = dict(slots=[None] * world, calls=[0] * world, barrier=threading.Barrier(world, timeout=60))
    results, errors = [None] * world, []

    def body(r):
        try:
            results[r] = fn(r, FakeGroup(r, shared))
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
            shared["barrier"].abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    assert shared["calls"] == [1] * world, f"each rank must call the collective exactly once: {shared['calls']}"
    return results


def test_exchange_gathers_in_rank_order():
    from kda_aot import distributed

    out = run_ranks(3, lambda r, grp: distributed.exchange(torch.full((5,), float(r)), grp))
    for got in out:
        assert torch.equal(got, torch.arange(3.0).repeat_interleave(5).view(3, 5))


def test_entry_state_chains_carries_like_float64():
    """Ranks: 0 reset, 1 transfer, 2 identity, 3 transfer, 4 end, 5 reset (after a NaN-poisoned
    unrelated end), 6 transfer. The entry of rank r is the fold of its predecessors from the last
    reset."""
    from kda_aot import distributed

    H, D = 2, 128
    gen = torch.Generator().manual_seed(0)
    kinds = ["reset", "transfer", "identity", "transfer", "end", "reset", "transfer", "transfer"]
    # contractive random transfers so the chain stays O(1)
    Ms = [torch.randn(H, D, D, generator=gen, dtype=torch.float64) / (2 * D ** 0.5) for _ in kinds]
    Bs = [torch.randn(H, D, D, generator=gen, dtype=torch.float64) for _ in kinds]

    def rank_fn(r, grp):
        kind = kinds[r]
        p = distributed.pack_payload(kind, H, "cpu", Ms[r].float(), Bs[r].float()) if kind in ("transfer",) else \
            distributed.pack_payload(kind, H, "cpu", B=Bs[r].float() if kind == "reset" else None)
        if kind == "end":
            p[H * D * D:2 * H * D * D] = float("nan")  # an unrelated sequence's garbage must not leak
        gathered = distributed.exchange(p, grp)
        return distributed.entry_state(gathered, r, H)

    got = run_ranks(len(kinds), rank_fn)
    # float64 reference: the rank's head sequence began at the last reset before it
    for r in (1, 2, 3, 4, 6, 7):
        carry = None
        for j in range(r):
            if kinds[j] == "reset":
                carry = Bs[j].clone()
            elif kinds[j] == "transfer":
                carry = carry @ Ms[j] + Bs[j]
            elif kinds[j] == "end":
                carry = None
        if carry is None:
            continue
        err = (got[r].double() - carry).norm() / carry.norm()
        assert err < 1e-5, (r, float(err))
    assert torch.isfinite(got[6]).all() and torch.isfinite(got[7]).all()


def test_fold_transfers_and_unswizzle():
    from kda_aot import distributed
    from kda_aot import reference

    gen = torch.Generator().manual_seed(1)
    M = torch.randn(3, 2, 128, 128, generator=gen) / 12
    B = torch.randn(3, 2, 128, 128, generator=gen)
    m, b = distributed.fold_transfers(M, B)
    S0 = torch.randn(2, 128, 128, generator=gen, dtype=torch.float64)
    want = S0
    for i in range(3):
        want = want @ M[i].double() + B[i].double()
    got = S0 @ m.double() + b.double()
    assert (got - want).norm() / want.norm() < 1e-5
    assert torch.equal(distributed.unswizzle(reference.m_seg_swizzle(M)), M)


def test_ieee_fp32_restores_the_callers_setting():
    from kda_aot import distributed

    m = torch.backends.cuda.matmul
    attr = "fp32_precision" if hasattr(m, "fp32_precision") else "allow_tf32"
    before = getattr(m, attr)
    setattr(m, attr, "tf32" if attr == "fp32_precision" else True)
    try:
        with distributed.ieee_fp32_matmul():
            assert getattr(m, attr) in ("ieee", False)
        assert getattr(m, attr) in ("tf32", True)
    finally:
        setattr(m, attr, before)


# ---------------------------------------------------------------------------------------------
# the whole call, with the float64 gold as every rank's local prefill

def _gold_engine(calls):
    from kda_aot import reference

    def fake_prefill(q, k, v, g, beta, *, A_log, dt_bias, lower_bound, scale, cp, initial_state=None,
                     cu_seqlens=None, seq_lens=None, out=None, output_final_state=False, final_state=None):
        if cu_seqlens is not None:  # the device table and the host hint must agree
            cu = [0]
            for x in seq_lens:
                cu.append(cu[-1] + x)
            assert cu_seqlens.tolist() == cu
        calls.append(dict(T=q.shape[1], varlen=cu_seqlens is not None, has_initial=initial_state is not None,
                          final=output_final_state))
        o, fs = reference.gold_prefill(q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, initial_state,
                                       cu_seqlens)
        out.copy_(o)
        if output_final_state:
            if final_state is None:
                final_state = fs.to(initial_state.dtype if initial_state is not None else torch.float32)
            else:
                final_state.copy_(fs)
        return out, final_state if output_final_state else None

    def fake_transfer(q, k, v, g, beta, *, A_log, dt_bias, lower_bound, scale):
        H = q.shape[2]
        eye = torch.eye(128, dtype=torch.float64).expand(1, H, 128, 128)
        _, M = reference.gold_prefill(q, k, torch.zeros_like(v), g, beta, A_log, dt_bias, lower_bound, scale, eye)
        _, B = reference.gold_prefill(q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, None)
        return M[0].float(), B[0].float()

    return fake_prefill, fake_transfer


def _long_memory_inputs(lens, H, seed):
    """float64 copies of bf16 inputs with g ~ N(-8, 1): state kept over the whole batch, so a
    wrong or skipped carry shows."""
    from kda_aot import reference

    x = reference.make_inputs(list(lens), H, seed=seed, state="fp32")
    gen = torch.Generator().manual_seed(seed + 7)
    x["g"] = (torch.randn(x["g"].shape, generator=gen) - 8.0).to(torch.bfloat16)
    for name in ("q", "k", "v", "g", "beta", "initial_state"):
        x[name] = x[name].double()
    return x


CASES = {
    # name: (lengths, interior cut points)
    "one sequence over 3 ranks": ([150], [40, 97]),
    "varlen spanning, empty slice, empty sequences": ([70, 0, 33, 64, 0], [50, 50, 120]),
    "boundaries on sequence starts": ([32, 48, 20], [32, 80]),
    "4 ranks, one holds only a middle piece": ([20, 140, 9], [30, 60, 150]),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("with_initial", [True, False])
def test_prefill_plumbing_equals_whole_batch_gold(monkeypatch, name, with_initial):
    from kda_aot import distributed
    from kda_aot import reference

    lens, cuts = CASES[name]
    H = 2
    x = _long_memory_inputs(lens, H, seed=3)
    init = x["initial_state"] if with_initial else None
    gold_o, gold_fs = reference.gold_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"],
                                             x["lower_bound"], x["scale"], init, x["cu_seqlens"])
    calls = []
    fake_prefill, fake_transfer = _gold_engine(calls)
    monkeypatch.setattr(distributed, "_local_prefill", fake_prefill)
    monkeypatch.setattr(distributed, "slice_transfer", fake_transfer)
    slices = _bounds(lens, cuts)

    def rank_fn(r, grp):
        off, t = slices[r]
        part = {n: x[n][:, off:off + t] for n in ("q", "k", "v", "g", "beta")}
        return distributed.prefill(**part, A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=x["lower_bound"],
                                   scale=x["scale"], initial_state=init, output_final_state=True, token_offset=off,
                                   seq_lens=lens, group=grp, cp="off")

    results = run_ranks(len(slices), rank_fn)
    o = torch.cat([res.o for res in results], dim=1)
    seen = []
    for res in results:
        for i, n in enumerate(res.final_seqs):
            seen.append(n)
            assert (res.final_state[i] - gold_fs[n]).abs().max() <= 1e-5 * gold_fs[n].abs().max() + 1e-12, n
    assert sorted(seen) == list(range(len(lens)))
    assert (o - gold_o).abs().max() <= 1e-5 * gold_o.abs().max()
    # the pieces of sequences that begin on a rank are the whole batch's computation (up to the CPU's
    # length-dependent vectorisation of the float64 reference: the GPU test checks bit for bit)
    for res, (off, t) in zip(results, slices):
        h = res.work.head_len
        if h < t:
            assert (res.o[:, h:] - gold_o[:, off + h:off + t]).abs().max() <= 1e-12 * gold_o.abs().max()
    if any(r.work.has_head for r in results):
        # negative control: the same plumbing with the carries dropped misses the bound
        monkeypatch.setattr(distributed, "entry_state", lambda gathered, rank, H: torch.zeros(H, 128, 128))
        bad = torch.cat([res.o for res in run_ranks(len(slices), rank_fn)], dim=1)
        assert (bad - gold_o).abs().max() > 1e-2 * gold_o.abs().max()
