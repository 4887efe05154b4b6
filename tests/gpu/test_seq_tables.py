"""The sequence-tables kernels on the GPU against their CPU twins (docs/kernel_abi.md): exact
tables for valid cu_seqlens, and for any other content the clamped tables of
cp_twins.device_seq_tables, with nothing written past the [N+1] tables."""

import numpy as np
import pytest

import cp_twins

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

POISON = -7
GUARD = 64  # int32 words after each table that the kernel must leave alone


def _expected(lengths):
    lengths = np.asarray(lengths, dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(lengths)])
    prefix = np.concatenate([[0], np.cumsum((lengths + 15) // 16)])
    return start.astype(np.int32), prefix.astype(np.int32)


def _random_lengths(rng):
    n = int(rng.choice([1, 2, 3, 7, 31, 32, 33, 255, 256, 257, 1000]))
    pool = np.array([0, 1, 15, 16, 17, 31, 32, 33, 100, 513, 4096])
    lengths = np.where(rng.random(n) < 0.5, rng.choice(pool, n), rng.integers(0, 3000, n))
    return lengths


def _run_varlen(cu_values, t_total, cu_dtype):
    """seq_tables_<cu_dtype> on cu_values; returns (seq_start, tile_prefix) and checks the guards."""
    import torch

    from kda_aot.library.loader import get_library

    cu = torch.tensor(np.asarray(cu_values, dtype=np.int64), dtype=cu_dtype, device="cuda")
    n = len(cu_values) - 1
    start = torch.full((n + 1 + GUARD,), POISON, dtype=torch.int32, device="cuda")
    prefix = torch.full((n + 1 + GUARD,), POISON, dtype=torch.int32, device="cuda")
    order = torch.full((n + GUARD,), POISON, dtype=torch.int32, device="cuda")
    name = "seq_tables_int32" if cu_dtype == torch.int32 else "seq_tables_int64"
    get_library().kernel(name)(cu.data_ptr(), start.data_ptr(), prefix.data_ptr(), order.data_ptr(), n, t_total,
                               torch.cuda.current_stream().cuda_stream)
    start, prefix, order = start.cpu().numpy(), prefix.cpu().numpy(), order.cpu().numpy()
    assert (start[n + 1:] == POISON).all() and (prefix[n + 1:] == POISON).all(), "write past the tables"
    assert (order[n:] == POISON).all(), "write past seq_order"
    # K2's dispatch order: every sequence once, longest first (by the kernel's bucketed key)
    assert cp_twins.is_dispatch_order(order[:n].tolist(), prefix[:n + 1].tolist()), \
        f"seq_order {order[:min(n, 16)].tolist()}.. is not longest-first for tile_prefix {prefix[:16].tolist()}.."
    return start[:n + 1], prefix[:n + 1]


def test_varlen_tables_match_cpu_on_1000_random_batches():
    import torch

    rng = np.random.default_rng(1234)
    for trial in range(1000):
        lengths = _random_lengths(rng)
        cu_dtype = torch.int32 if trial % 2 == 0 else torch.int64
        cu = np.concatenate([[0], np.cumsum(lengths)])
        start, prefix = _run_varlen(cu, int(cu[-1]), cu_dtype)
        want_start, want_prefix = _expected(lengths)
        np.testing.assert_array_equal(start, want_start, err_msg=f"trial {trial} seq_start")
        np.testing.assert_array_equal(prefix, want_prefix, err_msg=f"trial {trial} tile_prefix")


I32_MAX = 2 ** 31 - 1


def _adversarial(rng, n, T, wide):
    """cu_seqlens contents the host never checked: decreasing, negative, past T, extremes."""
    big = 2 ** 40 if wide else I32_MAX
    kind = int(rng.integers(0, 7))
    if kind == 0:  # decreasing
        return sorted(rng.integers(-T, 2 * T + 1, n + 1).tolist(), reverse=True)
    if kind == 1:  # all past T
        return rng.integers(T, T + 5000, n + 1).tolist()
    if kind == 2:  # negative
        return rng.integers(-5000, 0, n + 1).tolist()
    if kind == 3:  # the extremes of the type
        return rng.choice([-big, -1, 0, 1, T - 1, T, T + 1, I32_MAX, big], n + 1).tolist()
    if kind == 4:  # valid but with cu[0] > 0 and cu[N] < T
        cu = np.sort(rng.integers(0, T + 1, n + 1))
        return cu.tolist()
    if kind == 5:  # a valid table with a few entries overwritten
        cu = np.concatenate([[0], np.cumsum(rng.integers(0, 600, n))]).astype(np.int64)
        cu[rng.integers(0, n + 1, 3)] = rng.choice([-big, big, -1, I32_MAX], 3)
        return cu.tolist()
    return rng.integers(-big, big, n + 1).tolist()  # noise


@pytest.mark.parametrize("wide", [False, True], ids=["int32", "int64"])
def test_varlen_tables_clamp_any_content(wide):
    import torch

    rng = np.random.default_rng(99 + wide)
    for trial in range(400):
        n = int(rng.choice([1, 2, 5, 31, 32, 33, 255, 256, 257, 600]))
        T = int(rng.choice([0, 1, 15, 16, 17, 1000, 65536, I32_MAX]))
        cu = _adversarial(rng, n, T, wide)
        if not wide:  # what an int32 tensor holds: entries past its range (T + 5000 near 2^31) wrap
            cu = np.asarray(cu, np.int64).astype(np.int32).tolist()
        start, prefix = _run_varlen(cu, T, torch.int64 if wide else torch.int32)
        want_start, want_prefix = cp_twins.device_seq_tables(cu, T)
        np.testing.assert_array_equal(start, want_start, err_msg=f"trial {trial} seq_start, cu={cu[:8]}..")
        np.testing.assert_array_equal(prefix, want_prefix, err_msg=f"trial {trial} tile_prefix")
        assert (np.diff(start) >= 0).all() and start[0] >= 0 and start[-1] <= T
        assert prefix[-1] <= -(-T // 16) + n - 1  # inside K1's tile capacity


@pytest.mark.parametrize("n,T", [(1, 1), (3, 15), (4, 16), (2, 17), (8, 1024), (300, 33)])
def test_dense_tables(n, T):
    import torch

    from kda_aot.library.loader import get_library

    start = torch.full((n + 1 + GUARD,), POISON, dtype=torch.int32, device="cuda")
    prefix = torch.full((n + 1 + GUARD,), POISON, dtype=torch.int32, device="cuda")
    get_library().kernel("seq_tables_dense")(start.data_ptr(), prefix.data_ptr(), n, T,
                                            torch.cuda.current_stream().cuda_stream)
    want_start, want_prefix = _expected([T] * n)
    np.testing.assert_array_equal(start.cpu().numpy()[:n + 1], want_start)
    np.testing.assert_array_equal(prefix.cpu().numpy()[:n + 1], want_prefix)
    assert (start.cpu().numpy()[n + 1:] == POISON).all() and (prefix.cpu().numpy()[n + 1:] == POISON).all()


def _run_listed(cu_values, t_total, kind, ids, state_indices=None):
    """seq_tables_listed_<kind> (int32 / int64: cu_values; dense: cu_values = (B, T)); returns
    (seq_start, tile_prefix, listed, listed_slot) and checks the guards and the order."""
    import torch

    from kda_aot.library.loader import get_library

    n = cu_values[0] if kind == "dense" else len(cu_values) - 1
    cu = None if kind == "dense" else torch.tensor(np.asarray(cu_values, dtype=np.int64),
                                                  dtype=getattr(torch, kind), device="cuda")
    dev_ids = torch.tensor(ids, dtype=torch.int32, device="cuda")
    idx = None if state_indices is None else torch.tensor(state_indices, dtype=torch.int32, device="cuda")
    bufs = [torch.full((size + GUARD,), POISON, dtype=torch.int32, device="cuda") for size in (n, n, n + 1, n + 1, n)]
    listed, slot, start, prefix, order = bufs
    get_library().kernel(f"seq_tables_listed_{kind}")(
        0 if cu is None else cu.data_ptr(), dev_ids.data_ptr(), 0 if idx is None else idx.data_ptr(), listed.data_ptr(),
        slot.data_ptr(), start.data_ptr(), prefix.data_ptr(), order.data_ptr(), n, len(ids),
        cu_values[1] if kind == "dense" else t_total, torch.cuda.current_stream().cuda_stream)
    host = [b.cpu().numpy() for b in bufs]
    for name, size, b in zip(("listed", "listed_slot", "seq_start", "tile_prefix", "seq_order"),
                             (n, n, n + 1, n + 1, n), host):
        assert (b[size:] == POISON).all(), f"{name}: write past its {size} entries"
    listed, slot, start, prefix, order = (b[:size] for b, size in zip(host, (n, n, n + 1, n + 1, n)))
    assert cp_twins.is_dispatch_order(order.tolist(), prefix.tolist())
    return start.tolist(), prefix.tolist(), listed.tolist(), slot.tolist()


def test_listed_tables_match_their_twin():
    """seq_tables_listed_* (segment_ids) against cp_twins: the clamped starts, the tile prefix of
    the listed sequences only, the flags (entries out of range skipped, repeats idempotent) and
    the state slots, with and without state_indices; varlen of both integer types and dense."""
    rng = np.random.default_rng(77)
    for trial in range(300):
        lengths = _random_lengths(rng)
        n = len(lengths)
        ids = rng.integers(-3, n + 3, int(rng.integers(0, 2 * n + 2))).tolist()
        idx = None if trial % 3 else rng.integers(-2, 2 * n, n).tolist()
        flags = cp_twins.listed_flags(ids, n)
        if trial % 5 == 4:
            B, T = n, int(rng.integers(0, 300))
            got = _run_listed((B, T), B * T, "dense", ids, idx)
            want_c, want_p = cp_twins.device_seq_tables(cp_twins.dense_cu(B, T), B * T, flags)
        else:
            cu = np.concatenate([[0], np.cumsum(lengths)]).tolist()
            if trial % 7 == 6:  # any content: the same clamp as seq_tables_*
                cu = rng.integers(-100, int(sum(lengths)) + 100, n + 1).tolist()
            kind = "int32" if trial % 2 else "int64"
            got = _run_listed(cu, int(sum(lengths)), kind, ids, idx)
            want_c, want_p = cp_twins.device_seq_tables(cu, int(sum(lengths)), flags)
        assert got == (want_c, want_p, flags, cp_twins.listed_slots(flags, idx)), f"trial {trial}"
