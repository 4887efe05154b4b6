"""CP planner (docs/algorithm.md §4.1 / 4.5): pure Python, no GPU."""

import random

import pytest

from kda_aot.plan import cp_plan
import cp_twins
from kda_aot.plan.cp_plan import NotSplittableError, plan_prefill


def _ceil_div(a, b):
    return -(-a // b)


def check_invariants(plan, seq_lens):
    """Structural facts every plan must satisfy, whatever the mode."""
    tiles = [_ceil_div(n, 16) for n in seq_lens]
    assert plan.seq_tiles == tuple(tiles)
    assert plan.seq_lens == tuple(seq_lens)
    assert len(plan.seg_cu) == plan.n_segments + 1
    assert len(plan.seg_token_start) == plan.n_segments + 1
    assert plan.seg_cu[0] == 0 and plan.seg_cu[-1] == sum(tiles)
    assert plan.seg_token_start[0] == 0 and plan.seg_token_start[-1] == sum(seq_lens)
    assert all(a <= b for a, b in zip(plan.seg_cu, plan.seg_cu[1:]))
    # per_seq: consecutive, covering every segment exactly once, >= 1 segment per sequence
    expect_first = 0
    tok0 = 0
    tile0 = 0
    for n, (first, count) in enumerate(plan.per_seq):
        assert first == expect_first and count >= 1
        expect_first += count
        segs = range(first, first + count)
        sizes = [plan.seg_cu[s + 1] - plan.seg_cu[s] for s in segs]
        assert sum(sizes) == tiles[n]
        assert plan.seg_cu[first] == tile0
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)  # balanced
        if tiles[n] > 0:
            assert min(sizes) >= 1
        # token boundaries: 16 * tiles from the sequence start; the last one ends at the sequence end
        local = 0
        for s, size in zip(segs, sizes):
            assert plan.seg_token_start[s] == tok0 + 16 * local
            local += size
            seg_len = plan.seg_token_start[s + 1] - plan.seg_token_start[s]
            if s < first + count - 1:
                assert seg_len == 16 * size  # only the last segment may hold a partial tile
            else:
                assert plan.seg_token_start[s + 1] == tok0 + seq_lens[n]
            assert _ceil_div(seg_len, 16) == size  # tile_prefix arithmetic holds per segment
        tok0 += seq_lens[n]
        tile0 += tiles[n]
    assert expect_first == plan.n_segments
    assert plan.trivial == (plan.n_segments <= len(seq_lens))
    assert plan.max_segment_tiles == max(b - a for a, b in zip(plan.seg_cu, plan.seg_cu[1:]))
    starts, prefix = cp_twins.segment_tables(plan)
    assert starts == list(plan.seg_token_start) and prefix == list(plan.seg_cu)
    assert all(isinstance(x, int) for x in starts + prefix)
    last = cp_twins.last_segments(plan)
    assert last == [f + c - 1 for f, c in plan.per_seq]
    non_last = cp_twins.non_last_segments(plan)
    assert sorted(non_last + last) == list(range(plan.n_segments))
    assert sorted(cp_twins.non_last_segments(plan, longest_first=True)) == non_last
    assert isinstance(plan.describe(), str) and len(plan.describe().splitlines()) >= 2


# H, seq_lens, expected segments per sequence, max segment tiles, P, target, serial_wall, cp_wall, CP?
WORKED = [
    (4, [1023], [2], 32, 33, 32, 64, 96, False),
    (4, [4096], [8], 32, 33, 32, 256, 96, True),
    (4, [8192], [16], 32, 33, 32, 512, 96, True),
    (4, [8192, 2048], [16, 4], 32, 33, 32, 512, 96, True),
    (4, [16384], [32], 32, 33, 32, 1024, 96, True),
    (8, [8192], [16], 32, 16, 32, 512, 96, True),
    (8, [8192, 2048], [12, 3], 43, 16, 40, 512, 129, True),  # spec: 13 + 4 (see fit_to_slots)
    (8, [16384], [16], 64, 16, 64, 1024, 192, True),
    (8, [14336] + [128] * 16, [14] + [1] * 16, 64, 16, 64, 896, 192, True),
    (64, [8192], [2], 256, 2, 256, 512, 768, False),
]


@pytest.mark.parametrize("H,lens,n_segs,max_seg,P,target,serial_wall,cp_wall,is_cp", WORKED)
def test_spec_worked_examples(H, lens, n_segs, max_seg, P, target, serial_wall, cp_wall, is_cp):
    plan = plan_prefill(lens, H, sm_count=132, mode="auto")
    check_invariants(plan, lens)
    assert (plan.P, plan.target, plan.serial_wall, plan.cp_wall) == (P, target, serial_wall, cp_wall)
    assert f"P={P}" in plan.reason and f"target={target}" in plan.reason
    assert f"serial_wall={serial_wall}" in plan.reason and f"={cp_wall}" in plan.reason
    assert plan.trivial is (not is_cp)
    if is_cp:
        assert [c for _, c in plan.per_seq] == n_segs
        assert plan.max_segment_tiles == max_seg
        assert plan.reason.startswith("CP")
    else:
        assert [c for _, c in plan.per_seq] == [1] * len(lens)
        assert "does not pay" in plan.reason
        # the split that was rejected is the one in the table: "on" forces it
        forced = plan_prefill(lens, H, sm_count=132, mode="on")
        check_invariants(forced, lens)
        assert [c for _, c in forced.per_seq] == n_segs and forced.max_segment_tiles == max_seg


def test_spec_split_balanced_before_the_slot_fit():
    # docs/algorithm.md §4.1's own row for H=8 [8192, 2048]: 13 + 4 segments, 17 > P = 16
    counts, P, target = cp_plan.balanced_counts([512, 128], 8, 132)
    assert (counts, P, target) == ([13, 4], 16, 40)
    assert cp_plan.fit_to_slots([512, 128], counts, P) == [12, 3]
    # short unsplit sequences share slots: H=4 [14336] + 16 x [128] keeps its balanced 28 segments
    counts, P, _ = cp_plan.balanced_counts([896] + [8] * 16, 4, 132)
    assert counts == [28] + [1] * 16 and cp_plan.fit_to_slots([896] + [8] * 16, counts, P) == counts


def test_fit_to_slots_properties():
    rng = random.Random(7)
    n_fitted = 0
    for _ in range(3000):
        tiles = [rng.choice([0, 1, rng.randrange(1, 200), rng.randrange(64, 5000)]) for _ in range(rng.randrange(1, 9))]
        P = rng.randrange(1, 70)
        counts = [max(1, min(rng.randrange(1, 40), t // 32)) for t in tiles]
        fitted = cp_plan.fit_to_slots(tiles, counts, P)
        assert all(1 <= f <= c for f, c in zip(fitted, counts))  # never grows, never drops a sequence
        split = [i for i, c in enumerate(counts) if c > 1]
        unsplit = sum(t for t, c in zip(tiles, counts) if c == 1)

        def slots(L):
            return sum(min(counts[i], _ceil_div(tiles[i], L)) for i in split) + _ceil_div(unsplit, L)

        if fitted != counts:
            n_fitted += 1
            assert sum(counts) > P
            # oracle: a linear scan for the smallest segment length whose slots fit
            L = next(L for L in range(1, max(tiles) + 1) if slots(L) <= P)
            assert fitted == [min(c, _ceil_div(t, L)) if c > 1 else 1 for t, c in zip(tiles, counts)]
    assert n_fitted > 100


@pytest.mark.parametrize("lens", [[8192], [65536], [8192, 2048], [14336] + [128] * 16, [100, 0, 5000]])
def test_h96_is_trivial(lens):
    plan = plan_prefill(lens, 96, sm_count=132)
    check_invariants(plan, lens)
    assert plan.P == 1 and plan.target >= sum(plan.seq_tiles)
    assert plan.trivial and plan.n_segments == len(lens)
    assert "machine full / too short" in plan.reason
    with pytest.raises(NotSplittableError):
        plan_prefill(lens, 96, sm_count=132, mode="on")


def test_sm_count_default_is_assumed():
    plan = plan_prefill([8192], 4)
    assert plan.sm_count == 132 and "assumed" in plan.reason
    assert "assumed" not in plan_prefill([8192], 4, sm_count=132).reason
    assert plan_prefill([8192], 4, sm_count=132).seg_cu == plan.seg_cu


def test_auto_never_picks_cp_that_does_not_pay():
    rng = random.Random(20240611)
    n_cp = n_serial = 0
    for _ in range(3000):
        n = rng.choice([1, 1, 2, 3, 5, 8, 17])
        lens = [rng.choice([0, rng.randrange(1, 64), rng.randrange(1, 4096), rng.randrange(1, 70000)])
                for _ in range(n)]
        H = rng.choice([1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 200])
        sms = rng.choice([None, 1, 78, 114, 132])
        plan = plan_prefill(lens, H, sm_count=sms, mode="auto")
        check_invariants(plan, lens)
        assert plan == plan_prefill(lens, H, sm_count=sms, mode="auto")  # deterministic
        P = max(1, plan.sm_count // H)
        load = _ceil_div(sum(plan.seq_tiles), P)
        assert (plan.P, plan.load) == (P, load)
        assert plan.serial_wall == max(max(plan.seq_tiles), load)
        if not plan.trivial:
            n_cp += 1
            cp_wall = cp_plan.RERUN_RATIO * max(plan.max_segment_tiles, load)  # from the plan's own segments
            assert plan.cp_wall == cp_wall
            assert plan.serial_wall >= cp_wall
            assert plan.max_segment_tiles >= 1
            # every split sequence has auto-sized segments
            for (first, count), tiles in zip(plan.per_seq, plan.seq_tiles):
                if count > 1:
                    assert tiles // count >= cp_plan.AUTO_MIN_SEG_TILES
        else:
            n_serial += 1
            assert plan.n_segments == len(lens)
            assert plan.cp_wall is None or plan.serial_wall < plan.cp_wall or "too short" in plan.reason
    assert n_cp > 100 and n_serial > 100  # both branches exercised


MANUAL_LENS = [[8192], [8192, 2048], [16384], [14336] + [128] * 16]


@pytest.mark.parametrize("split", [2, 4, 8, 16])
@pytest.mark.parametrize("lens", MANUAL_LENS)
def test_manual_splits(lens, split):
    plan = plan_prefill(lens, 8, sm_count=132, mode=split)
    check_invariants(plan, lens)
    assert plan.mode == split and not plan.trivial
    for (first, count), tiles in zip(plan.per_seq, plan.seq_tiles):
        assert count == max(1, min(split, tiles // 4))
        sizes = plan.segment_tiles[first:first + count]
        assert sizes == tuple([tiles // count + (1 if i < tiles % count else 0) for i in range(count)])
    # every tile exactly once
    covered = [t for a, b in zip(plan.seg_cu, plan.seg_cu[1:]) for t in range(a, b)]
    assert covered == list(range(sum(plan.seq_tiles)))
    # token starts of segments are tile-aligned relative to their sequence
    seq_starts = [sum(lens[:n]) for n in range(len(lens))]
    for n, (first, count) in enumerate(plan.per_seq):
        for s in range(first, first + count):
            assert (plan.seg_token_start[s] - seq_starts[n]) % 16 == 0


def test_manual_has_no_cost_check():
    # 64 tiles at H=64: auto says serial, a manual split still splits (down to 4-tile segments)
    assert plan_prefill([1024], 64, sm_count=132).trivial
    plan = plan_prefill([1024], 64, sm_count=132, mode=16)
    assert plan.n_segments == 16 and plan.max_segment_tiles == 4
    assert plan_prefill([1024], 64, sm_count=132, mode=100).n_segments == 16  # capped at tiles // 4


def test_partial_tiles_and_empty_sequences():
    lens = [1000, 17, 0, 513]  # 63, 2, 0, 33 tiles
    for mode in ("off", "auto", 2, 4, 8):
        plan = plan_prefill(lens, 4, sm_count=132, mode=mode)
        check_invariants(plan, lens)
    plan = plan_prefill(lens, 4, sm_count=132, mode=4)
    assert plan.seq_tiles == (63, 2, 0, 33)
    assert [c for _, c in plan.per_seq] == [4, 1, 1, 4]
    assert plan.seg_cu == (0, 16, 32, 48, 63, 65, 65, 74, 82, 90, 98)
    assert plan.seg_token_start == (0, 256, 512, 768, 1000, 1017, 1017, 1017 + 144, 1017 + 272,
                                    1017 + 400, 1530)
    assert cp_twins.last_segments(plan) == [3, 4, 5, 9]
    assert cp_twins.non_last_segments(plan) == [0, 1, 2, 6, 7, 8]
    assert cp_twins.non_last_segments(plan, longest_first=True) == [0, 1, 2, 6, 7, 8]
    starts, prefix = cp_twins.segment_tables(plan)
    assert starts == list(plan.seg_token_start) and prefix == list(plan.seg_cu)
    # the empty sequence keeps one empty segment
    first, count = plan.per_seq[2]
    assert count == 1 and plan.seg_cu[first] == plan.seg_cu[first + 1]
    assert plan.seg_token_start[first] == plan.seg_token_start[first + 1] == 1017


def test_longest_first_order():
    plan = plan_prefill([8192 + 16, 2048], 8, sm_count=132, mode=4)  # 513 tiles -> 129,128,128,128
    order = cp_twins.non_last_segments(plan, longest_first=True)
    tiles = plan.segment_tiles
    assert [tiles[s] for s in order] == sorted((tiles[s] for s in order), reverse=True)
    assert order[0] == 0


def test_off_is_serial():
    lens = [65536, 100, 0]
    plan = plan_prefill(lens, 1, sm_count=132, mode="off")
    check_invariants(plan, lens)
    assert plan.trivial and plan.reason == "cp off" and plan.n_segments == 3
    assert plan_prefill(lens, 1, sm_count=132, mode=None) == plan
    assert cp_twins.non_last_segments(plan) == []
    assert cp_twins.last_segments(plan) == [0, 1, 2]


def test_on_forces_split_and_raises_when_trivial():
    plan = plan_prefill([1023], 4, sm_count=132, mode="on")  # auto rejects this one (64 < 96)
    assert not plan.trivial and plan.n_segments == 2
    with pytest.raises(NotSplittableError, match=r"\[100\]") as info:
        plan_prefill([100], 4, mode="on")
    assert isinstance(info.value, ValueError) and "target" in str(info.value)
    with pytest.raises(NotSplittableError, match="seq_lens"):
        plan_prefill([100], 4, mode=2)  # 7 tiles // 4 = 1 segment
    with pytest.raises(NotSplittableError):
        plan_prefill([8192, 4096], 4, mode=1)


@pytest.mark.parametrize("kwargs,match", [
    (dict(seq_lens=[-1], num_heads=4), "seq_lens"),
    (dict(seq_lens=[16, 2.5], num_heads=4), "seq_lens"),
    (dict(seq_lens=[True], num_heads=4), "seq_lens"),
    (dict(seq_lens=[], num_heads=4), "seq_lens"),
    (dict(seq_lens=16, num_heads=4), "seq_lens"),
    (dict(seq_lens="16", num_heads=4), "seq_lens"),
    (dict(seq_lens=[16], num_heads=0), "num_heads"),
    (dict(seq_lens=[16], num_heads=True), "num_heads"),
    (dict(seq_lens=[16], num_heads=4.0), "num_heads"),
    (dict(seq_lens=[16], num_heads=4, sm_count=0), "sm_count"),
    (dict(seq_lens=[16], num_heads=4, sm_count=-3), "sm_count"),
    (dict(seq_lens=[16], num_heads=4, mode=True), "mode"),
    (dict(seq_lens=[16], num_heads=4, mode=False), "mode"),
    (dict(seq_lens=[16], num_heads=4, mode=0), "mode"),
    (dict(seq_lens=[16], num_heads=4, mode="yes"), "mode"),
    (dict(seq_lens=[16], num_heads=4, mode=2.0), "mode"),
])
def test_input_validation(kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        plan_prefill(**kwargs)
    assert not isinstance(info.value, NotSplittableError)


def test_constants():
    assert (cp_plan.AUTO_MIN_SEG_TILES, cp_plan.RERUN_RATIO, cp_plan.MIN_SEG_TILES) == (32, 3, 4)


def test_plan_is_frozen():
    plan = plan_prefill([8192], 4, sm_count=132)
    with pytest.raises(AttributeError):
        plan.seg_cu = ()


def test_dispatch_key_is_monotone_and_fits_64_buckets():
    """The CPU twin of seq_tables.length_bucket (K2's longest-first order, docs/dispatch_order.md)."""
    keys = [cp_twins.dispatch_key(t) for t in range(0, 70000)]
    assert all(a >= b for a, b in zip(keys, keys[1:])), "longer sequences must never get a larger key"
    assert keys[:4] == [63, 62, 61, 60] and keys[4] < 60  # exact below 4 tiles
    # 64 buckets, of which 60 are used: 0-3 tiles take 63-60, then four per octave from 4 tiles (55 down)
    assert set(keys) == set(range(56)) | {60, 61, 62, 63}
    assert cp_twins.dispatch_key(2 ** 16) == cp_twins.dispatch_key(2 ** 30) == 0
    # four keys per octave: within an octave, lengths a quarter apart get different keys
    assert len({cp_twins.dispatch_key(t) for t in (64, 80, 96, 112)}) == 4


def test_is_dispatch_order_accepts_longest_first_with_ties_in_any_order():
    lengths_in_tiles = [82, 35, 128, 61, 17, 192, 128]
    prefix = [0]
    for t in lengths_in_tiles:
        prefix.append(prefix[-1] + t)
    assert cp_twins.is_dispatch_order([5, 2, 6, 0, 3, 1, 4], prefix)
    assert cp_twins.is_dispatch_order([5, 6, 2, 0, 3, 1, 4], prefix)  # 2 and 6 tie
    assert not cp_twins.is_dispatch_order([4, 1, 3, 0, 2, 6, 5], prefix)  # shortest first
    assert not cp_twins.is_dispatch_order([5, 2, 2, 0, 3, 1, 4], prefix)  # not a permutation
    assert not cp_twins.is_dispatch_order([5, 2, 6, 0, 3, 1], prefix)  # one missing
    assert cp_twins.is_dispatch_order([], [0])
