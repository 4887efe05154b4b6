"""The CP segment-tables kernels on the GPU against their CPU twin
(cp_twins.device_segment_tables): host plans, device plans, adversarial cu_seqlens and a too
small max_segments, with every table poisoned before the launch and guard words after each
table that must stay untouched."""

import numpy as np
import pytest

from kda_aot.plan import cp_plan
import cp_twins

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

POISON = -7
GUARD = 32  # int32 words after each table
I32_MAX = 2 ** 31 - 1
NAMES = ("seg_start", "seg_prefix", "scan_seg", "seg_first", "seg_count", "final_slot")


def _run(cu, t_total, params, kind):
    """cp_seg_tables_<kind> (int32 / int64: cu_seqlens values; dense: cu = (B, T)); returns the
    six tables as lists and checks the guard words."""
    import torch

    from kda_aot.library.loader import get_library

    seg_len, max_count, min_tiles, S = params
    n_seq = cu[0] if kind == "dense" else len(cu) - 1
    sizes = (S + 1, S + 1, S, n_seq, n_seq, S)
    bufs = [torch.full((n + GUARD,), POISON, dtype=torch.int32, device="cuda") for n in sizes]
    stream = torch.cuda.current_stream().cuda_stream
    ptrs = [b.data_ptr() for b in bufs]
    if kind == "dense":
        get_library().kernel("cp_seg_tables_dense")(*ptrs, n_seq, cu[1], seg_len, max_count, min_tiles, S, stream)
    else:
        dtype = torch.int32 if kind == "int32" else torch.int64
        dev_cu = torch.tensor(np.asarray(cu, dtype=np.int64), dtype=dtype, device="cuda")
        get_library().kernel(f"cp_seg_tables_{kind}")(dev_cu.data_ptr(), *ptrs, n_seq, t_total, seg_len, max_count,
                                                      min_tiles, S, stream)
    out = []
    for name, n, buf in zip(NAMES, sizes, bufs):
        host = buf.cpu().numpy()
        assert (host[n:] == POISON).all(), f"{name}: write past its {n} entries"
        out.append(host[:n].tolist())
    return tuple(out)


def _check(cu, t_total, params, kind, what):
    got = _run(cu, t_total, params, kind)
    if kind == "dense":
        want = cp_twins.device_segment_tables(cp_twins.dense_cu(*cu), cu[0] * cu[1], *params)
    else:
        want = cp_twins.device_segment_tables(cu, t_total, *params)
    for name, g, w in zip(NAMES, got, want):
        assert g == list(w), f"{what}: {name} differs (cu={list(cu)[:6]}.., params={params})"


def _cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int64).tolist()


def _lens(rng):
    n = int(rng.choice([1, 2, 3, 7, 31, 255, 256, 257, 600]))
    pool = np.array([0, 1, 15, 16, 17, 100, 513, 1024, 4096, 8192, 20000])
    return np.where(rng.random(n) < 0.5, rng.choice(pool, n), rng.integers(0, 9000, n)).tolist()


def test_host_plans():
    """The kernel reproduces host plans' tables (the twin equals them: test_cp_device_tables)."""
    rng = np.random.default_rng(11)
    for trial in range(300):
        lens = _lens(rng)
        mode = ["auto", "on", 2, 4, 16][trial % 5]
        H = int(rng.choice([1, 2, 4, 8, 16, 64]))
        try:
            plan = cp_plan.plan_prefill(lens, H, sm_count=132, mode=mode)
        except cp_plan.NotSplittableError:
            continue
        params = (plan.seg_len, plan.max_count, plan.min_tiles, plan.n_segments)
        _check(_cu(lens), sum(lens), params, "int32" if trial % 2 else "int64", f"trial {trial} {mode}")


def test_device_plans_on_valid_and_adversarial_cu():
    rng = np.random.default_rng(12)
    checked = 0
    for trial in range(600):
        N = int(rng.choice([1, 2, 3, 4, 8, 16, 33]))
        T = int(rng.choice([0, 100, 4096, 8192, 10240, 65536, 300000]))
        H = int(rng.choice([1, 2, 4, 8]))
        mode = ["auto", "on", 3, 8][trial % 4]
        try:
            params = cp_plan.device_plan(T, N, H, 132, mode)
        except cp_plan.NotSplittableError:
            continue
        if params is None:
            continue
        wide = trial % 2 == 1
        big = 2 ** 40 if wide else I32_MAX
        kind = trial % 6
        if kind == 0:
            cu = [0] + sorted(rng.integers(0, T + 1, N - 1).tolist()) + [T]  # valid
        elif kind == 1:
            cu = sorted(rng.integers(-T - 1, 2 * T + 2, N + 1).tolist(), reverse=True)  # decreasing
        elif kind == 2:
            cu = rng.integers(-5000, 0, N + 1).tolist()  # negative
        elif kind == 3:
            cu = (T + rng.integers(0, 5000, N + 1)).tolist()  # past T
        elif kind == 4:
            cu = rng.choice([-big, -1, 0, T, T + 1, I32_MAX, big], N + 1).tolist()
        else:
            cu = rng.integers(-big, big, N + 1).tolist()
        _check(cu, T, params, "int64" if wide else "int32", f"trial {trial}")
        checked += 1
    assert checked > 200


def test_too_small_max_segments_drops_and_stays_inside():
    rng = np.random.default_rng(13)
    for trial in range(300):
        lens = _lens(rng)
        params = (int(rng.integers(1, 40)), int(rng.integers(1, 50)), int(rng.integers(1, 8)),
                  int(rng.integers(1, 2 * len(lens) + 3)))
        _check(_cu(lens), sum(lens), params, "int32" if trial % 2 else "int64", f"trial {trial}")


def test_many_sequences_cross_blocks():
    """N past the CTA's 256 threads, with segment ranges that straddle the blocks."""
    rng = np.random.default_rng(14)
    for N in (255, 256, 257, 511, 513, 1000):
        lens = rng.integers(0, 3000, N).tolist()
        params = (1, 3, 4, 3 * N + 7)
        _check(_cu(lens), sum(lens), params, "int32", f"N={N}")
        _check(_cu(lens), sum(lens), (1, 3, 4, N + 100), "int64", f"N={N} dropped")


@pytest.mark.parametrize("B,T", [(1, 8192), (2, 4096), (3, 1000), (8, 1024), (300, 33), (1, 0), (5, 17)])
def test_dense(B, T):
    for params in ((32, I32_MAX, 32, 16), (1, 4, 4, B * 4 + 1), (43, I32_MAX, 32, 33), (1, 8, 4, 3)):
        _check((B, T), B * T, params, "dense", f"B={B} T={T}")


def _run_listed(cu, t_total, params, kind, ids):
    """cp_seg_tables_listed_<kind>: the six tables and the flags, with guard words checked."""
    import torch

    from kda_aot.library.loader import get_library

    seg_len, max_count, min_tiles, S = params
    n_seq = cu[0] if kind == "dense" else len(cu) - 1
    sizes = (S + 1, S + 1, S, n_seq, n_seq, S, n_seq)
    bufs = [torch.full((n + GUARD,), POISON, dtype=torch.int32, device="cuda") for n in sizes]
    dev_ids = torch.tensor(ids, dtype=torch.int32, device="cuda")
    dev_cu = None if kind == "dense" else torch.tensor(np.asarray(cu, dtype=np.int64), dtype=getattr(torch, kind),
                                                       device="cuda")
    *tables, listed = [b.data_ptr() for b in bufs]
    get_library().kernel(f"cp_seg_tables_listed_{kind}")(
        0 if dev_cu is None else dev_cu.data_ptr(), dev_ids.data_ptr(), listed, *tables, n_seq, len(ids),
        cu[1] if kind == "dense" else t_total, seg_len, max_count, min_tiles, S,
        torch.cuda.current_stream().cuda_stream)
    out = []
    for name, n, buf in zip(NAMES + ("listed",), sizes, bufs):
        host = buf.cpu().numpy()
        assert (host[n:] == POISON).all(), f"{name}: write past its {n} entries"
        out.append(host[:n].tolist())
    return tuple(out)


def test_listed_tables_match_their_twin():
    """cp_seg_tables_listed_* (segment_ids) against cp_twins.device_segment_tables(listed=): an
    unlisted sequence has one empty boundary segment, no carry and no final slot; lists with
    entries out of range and repeated; host-plan and too-small bounds; varlen and dense."""
    rng = np.random.default_rng(21)
    for trial in range(300):
        lens = _lens(rng)
        n = len(lens)
        ids = rng.integers(-3, n + 3, int(rng.integers(0, 2 * n + 2))).tolist()
        flags = cp_twins.listed_flags(ids, n)
        params = (int(rng.integers(1, 40)), int(rng.integers(1, 50)), int(rng.integers(1, 8)),
                  int(rng.integers(1, 3 * n + 3)))
        if trial % 5 == 4:
            B, T = n, int(rng.integers(0, 3000))
            got = _run_listed((B, T), B * T, params, "dense", ids)
            want = cp_twins.device_segment_tables(cp_twins.dense_cu(B, T), B * T, *params, listed=flags)
        else:
            kind = "int32" if trial % 2 else "int64"
            got = _run_listed(_cu(lens), sum(lens), params, kind, ids)
            want = cp_twins.device_segment_tables(_cu(lens), sum(lens), *params, listed=flags)
        for name, g, w in zip(NAMES + ("listed",), got, tuple(want) + (flags,)):
            assert g == list(w), f"trial {trial}: {name} differs (lens={lens[:6]}.., ids={ids[:6]}.., params={params})"
