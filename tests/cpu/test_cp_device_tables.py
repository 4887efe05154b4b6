"""The device-built tables' CPU twins (cp_twins.device_seq_tables, device_segment_tables) and the
parameters a host plan or device_plan gives them: pure Python, no GPU."""

import random

import pytest

import cp_twins
from cp_twins import device_segment_tables
from kda_aot.plan.cp_plan import NotSplittableError, device_plan, plan_prefill

I32_MAX = 2 ** 31 - 1


def _ceil_div(a, b):
    return -(-a // b)


def _cu(lens):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return cu


def _random_lens(rng):
    n = rng.choice([1, 1, 2, 3, 5, 8, 17])
    return [rng.choice([0, rng.randrange(1, 64), rng.randrange(1, 4096), rng.randrange(1, 70000)]) for _ in range(n)]


def _adversarial_cu(rng, n, T):
    kind = rng.randrange(5)
    if kind == 0:
        return sorted((rng.randrange(-T - 1, 2 * T + 2) for _ in range(n + 1)), reverse=True)
    if kind == 1:
        return [rng.choice([-2 ** 40, -1, 0, 1, T - 1, T, T + 1, I32_MAX, 2 ** 40]) for _ in range(n + 1)]
    if kind == 2:
        return sorted(rng.randrange(0, T + 1) for _ in range(n + 1))
    if kind == 3:
        cu = _cu([rng.randrange(0, 3000) for _ in range(n)])
        cu[rng.randrange(n + 1)] = rng.choice([-5, I32_MAX, 2 ** 40, T + 100])
        return cu
    return [rng.randrange(-2 ** 40, 2 ** 40) for _ in range(n + 1)]


def check_tables(tables, cu, t_total, S):
    """What K1, pre_scan, the merge and K2 rely on, for any content: sizes, monotone tables inside
    [c[0], c[N]] and the tile capacity, tiles = ceil(tokens / 16) per segment, full tiles for the
    scanned ones, indices inside their tables."""
    seg_start, seg_prefix, scan_seg, seg_first, seg_count, final_slot = tables
    c, prefix = cp_twins.device_seq_tables(cu, t_total)
    N = len(cu) - 1
    assert (len(seg_start), len(seg_prefix), len(scan_seg), len(final_slot)) == (S + 1, S + 1, S, S)
    assert len(seg_first) == len(seg_count) == N
    assert seg_start[0] == c[0] and seg_prefix[0] == 0
    assert seg_prefix[S] <= prefix[N] <= _ceil_div(t_total, 16) + N - 1
    assert all(0 <= a <= b <= t_total for a, b in zip(seg_start, seg_start[1:]))
    assert all(a <= b for a, b in zip(seg_prefix, seg_prefix[1:]))
    for s in range(S):
        assert seg_prefix[s + 1] - seg_prefix[s] == _ceil_div(seg_start[s + 1] - seg_start[s], 16)
    scanned = [j for j in scan_seg if j >= 0]
    assert scan_seg == scanned + [-1] * (S - len(scanned)) and scanned == sorted(set(scanned))
    for j in scanned:
        assert 0 <= j < S and final_slot[j] == -1
        assert seg_start[j + 1] - seg_start[j] == 16 * (seg_prefix[j + 1] - seg_prefix[j])
    assert sum(seg_count) <= S
    for n in range(N):
        first, count = seg_first[n], seg_count[n]
        assert 0 <= first <= S and 0 <= count <= S - first
        if count:
            segs = range(first, first + count)
            assert seg_start[first] == c[n] and seg_prefix[first] == prefix[n]
            assert [final_slot[s] for s in segs[:-1]] == [-1] * (count - 1)
            assert final_slot[segs[-1]] in (-1, n)
    assert sorted(n for n in final_slot if n >= 0) == [n for n in range(N) if final_slot.count(n)]


def test_seq_tables_are_the_identity_on_valid_cu():
    rng = random.Random(5)
    for _ in range(500):
        lens = _random_lens(rng)
        start, prefix = cp_twins.device_seq_tables(_cu(lens), sum(lens))
        assert start == _cu(lens)
        assert prefix == _cu([_ceil_div(n, 16) for n in lens])


def test_seq_tables_clamp():
    assert cp_twins.clamp_cu([5, 3, -1, 100, 2 ** 40, 7], 50) == [5, 5, 5, 50, 50, 50]
    assert cp_twins.device_seq_tables([-10, 20, 10, 40], 33) == ([0, 20, 20, 33], [0, 2, 2, 3])
    rng = random.Random(6)
    for _ in range(2000):
        n, T = rng.randrange(1, 40), rng.choice([0, 1, 16, 17, 1000, I32_MAX])
        start, prefix = cp_twins.device_seq_tables(_adversarial_cu(rng, n, T), T)
        assert all(0 <= a <= b <= T for a, b in zip(start, start[1:]))
        assert prefix[-1] <= _ceil_div(T, 16) + n - 1


def _host_tables(plan):
    S = plan.n_segments
    scan = cp_twins.non_last_segments(plan)
    starts, prefix = cp_twins.segment_tables(plan)
    return (starts, prefix, scan + [-1] * (S - len(scan)), [f for f, _ in plan.per_seq],
            [c for _, c in plan.per_seq], cp_twins.final_slots(plan))


@pytest.mark.parametrize("mode", ["auto", "on", 2, 3, 8, 40, 10 ** 12])
def test_twin_reproduces_host_plans(mode):
    rng = random.Random(hash(str(mode)) & 0xFFFF)
    n_cp = 0
    for _ in range(1500):
        lens = _random_lens(rng)
        H = rng.choice([1, 2, 4, 8, 16, 32, 64, 96])
        sms = rng.choice([None, 78, 132])
        try:
            plan = plan_prefill(lens, H, sm_count=sms, mode=mode)
        except NotSplittableError:
            continue
        n_cp += not plan.trivial
        tables = device_segment_tables(_cu(lens), sum(lens), plan.seg_len, plan.max_count, plan.min_tiles,
                                       plan.n_segments)
        assert tables == _host_tables(plan), (lens, H, sms, mode)
        check_tables(tables, _cu(lens), sum(lens), plan.n_segments)
    assert n_cp > 200


def test_device_params_of_worked_plans():
    plan = plan_prefill([8192, 2048], 8, sm_count=132)  # fit_to_slots cut 13 + 4 to 12 + 3
    assert (plan.seg_len, plan.max_count, plan.min_tiles) == (43, I32_MAX, 32)
    assert plan_prefill([8192], 8, sm_count=132).seg_len == 32  # the balanced target
    assert (plan_prefill([8192], 8, sm_count=132, mode=4).seg_len, plan_prefill([8192], 8, mode=4).max_count) == (1, 4)
    serial = plan_prefill([8192], 64, sm_count=132)
    assert serial.trivial and serial.max_count == 1


# H, lengths, segments per sequence, segment tiles (of the twin on the true lengths)
DEVICE_WORKED = [
    (8, [8192], [16], [32] * 16),
    (8, [8192, 2048], [12, 3], [43] * 8 + [42] * 4 + [43, 43, 42]),
    (4, [8192, 2048], [16, 4], [32] * 20),
    (4, [16384], [32], [32] * 32),
    (8, [16384], [16], [64] * 16),
]


@pytest.mark.parametrize("H,lens,counts,tiles", DEVICE_WORKED)
def test_device_plan_worked_examples(H, lens, counts, tiles):
    params = device_plan(sum(lens), len(lens), H, 132, "auto")
    assert params is not None
    seg_len, max_count, min_tiles, S = params
    bound = -(-sum(lens) // 16) + len(lens) - 1
    assert S == min(132 // H, -(-bound // seg_len) + len(lens) - 1) and (max_count, min_tiles) == (I32_MAX, 32)
    assert sum(counts) <= S
    seg_start, seg_prefix, scan, first, count, final = device_segment_tables(_cu(lens), sum(lens), *params)
    assert count == counts
    used = sum(counts)
    assert [b - a for a, b in zip(seg_prefix, seg_prefix[1:])][:used] == tiles
    assert seg_start[used:] == [sum(lens)] * (S + 1 - used) and final[used:] == [-1] * (S - used)
    assert device_plan(sum(lens), len(lens), H, 132, "on") == params


@pytest.mark.parametrize("H", [64, 96])
@pytest.mark.parametrize("lens", [[8192], [1024] * 8])
def test_device_plan_serial_when_the_heads_fill_the_machine(H, lens):
    assert device_plan(sum(lens), len(lens), H, 132, "auto") is None
    assert device_plan(sum(lens), len(lens), H, 132, "off") is None
    assert device_plan(sum(lens), len(lens), H, 132, None) is None


def test_device_plan_on_and_manual():
    with pytest.raises(NotSplittableError):
        device_plan(1000, 1, 8, 132, "on")  # 63 tiles < 2 x 32
    with pytest.raises(NotSplittableError):
        device_plan(8192 * 20, 20, 8, 132, "on")  # P = 16 < N
    assert device_plan(8192, 1, 8, 132, 4) == (1, 4, 4, 4)
    assert device_plan(8192, 2, 8, 132, 4) == (1, 4, 4, 8)
    assert device_plan(100, 2, 8, 132, 4) == (1, 4, 4, 2 + 8 // 4)  # T_b = 7 + 1 tiles
    assert device_plan(8192, 1, 8, 132, 10 ** 12)[1] == I32_MAX
    with pytest.raises(NotSplittableError):
        device_plan(8192, 3, 8, 132, 1)
    with pytest.raises(NotSplittableError):
        device_plan(16, 3, 8, 132, 4)  # T_b = 3 tiles: no sequence can hold 2 x 4
    for bad in (dict(t_total=-1), dict(t_total=True), dict(n_seq=0), dict(num_heads=0), dict(mode="yes")):
        args = dict(t_total=100, n_seq=1, num_heads=4, sm_count=132, mode="auto")
        args.update(bad)
        with pytest.raises(ValueError):
            device_plan(**args)


@pytest.mark.parametrize("mode", ["auto", "on", 2, 5, 64])
def test_device_plan_bound_holds_for_any_content(mode):
    """S = max_segments bounds the segment count for every cu_seqlens of N + 1 entries: nothing
    is dropped, every sequence's last segment writes its final state."""
    rng = random.Random(77 + len(str(mode)))
    checked = 0
    for _ in range(3000):
        N = rng.choice([1, 2, 3, 4, 7, 16, 33])
        T = rng.choice([0, 15, 100, 1023, 4096, 8192, 10240, 65536, 200000])
        H = rng.choice([1, 2, 4, 8, 16, 32])
        try:
            params = device_plan(T, N, H, 132, mode)
        except NotSplittableError:
            continue
        if params is None:
            continue
        if rng.random() < 0.5:
            cu = _adversarial_cu(rng, N, T)
        else:  # a valid table: N - 1 random cut points of [0, T]
            cu = [0] + sorted(rng.randrange(T + 1) for _ in range(N - 1)) + [T]
        tables = device_segment_tables(cu, T, *params)
        check_tables(tables, cu, T, params[3])
        seg_count, final = tables[4], tables[5]
        c, prefix = cp_twins.device_seq_tables(cu, T)
        want = [max(1, min(_ceil_div(prefix[n + 1] - prefix[n], params[0]), params[1],
                           (prefix[n + 1] - prefix[n]) // params[2])) for n in range(N)]
        assert seg_count == want  # nothing dropped
        assert sorted(n for n in final if n >= 0) == list(range(N))
        checked += 1
    assert checked > 500


def test_dropping_past_max_segments():
    """A seg_len too short for S: the excess segments are dropped, the tables stay safe."""
    lens = [1000, 17, 0, 513]  # 63, 2, 0, 33 tiles
    cu, T = _cu(lens), sum(lens)
    full = device_segment_tables(cu, T, 1, 4, 4, 10)
    assert full[4] == [4, 1, 1, 4] and full[3] == [0, 4, 5, 6]
    for S in range(1, 12):
        tables = device_segment_tables(cu, T, 1, 4, 4, S)
        check_tables(tables, cu, T, S)
        seg_start, seg_prefix, scan, first, count, final = tables
        kept = min(S, 10)
        assert seg_start[:kept] == full[0][:kept] and seg_prefix[:kept] == full[1][:kept]
        assert seg_start[S] == full[0][min(S, 10)]  # where the first dropped segment would start
        assert first == [min(f, S) for f in full[3]]
        assert count == [max(0, min(c, S - f)) for f, c in zip(full[3], full[4])]
    rng = random.Random(8)
    for _ in range(3000):
        N, T = rng.randrange(1, 9), rng.choice([0, 100, 5000, 70000])
        cu = _adversarial_cu(rng, N, T)
        params = (rng.randrange(-2, 70), rng.randrange(-2, 50), rng.randrange(-2, 40), rng.randrange(1, 40))
        check_tables(device_segment_tables(cu, T, *params), cu, T, params[3])


def test_dense_is_the_cu_of_equal_lengths():
    assert cp_twins.dense_cu(3, 100) == [0, 100, 200, 300]
    plan = plan_prefill([4096] * 3, 4, sm_count=132)
    assert device_segment_tables(cp_twins.dense_cu(3, 4096), 3 * 4096, plan.seg_len, plan.max_count,
                                 plan.min_tiles, plan.n_segments) == _host_tables(plan)
