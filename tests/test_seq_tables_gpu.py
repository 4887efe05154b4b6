"""The sequence-tables kernel on the GPU against a CPU computation (docs/kernel_abi.md)."""

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


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


def test_varlen_tables_match_cpu_on_1000_random_batches():
    import torch

    from kda_aot.loader import get_library

    lib = get_library()
    rng = np.random.default_rng(1234)
    stream = torch.cuda.current_stream().cuda_stream
    checked = 0
    for trial in range(1000):
        lengths = _random_lengths(rng)
        cu_dtype = torch.int32 if trial % 2 == 0 else torch.int64
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=cu_dtype, device="cuda")
        n = len(lengths)
        start = torch.full((n + 1,), -7, dtype=torch.int32, device="cuda")  # poison
        prefix = torch.full((n + 1,), -7, dtype=torch.int32, device="cuda")
        name = "seq_tables_int32" if cu_dtype == torch.int32 else "seq_tables_int64"
        lib.kernel(name)(cu.data_ptr(), start.data_ptr(), prefix.data_ptr(), n, stream)
        want_start, want_prefix = _expected(lengths)
        np.testing.assert_array_equal(start.cpu().numpy(), want_start, err_msg=f"trial {trial} seq_start")
        np.testing.assert_array_equal(prefix.cpu().numpy(), want_prefix, err_msg=f"trial {trial} tile_prefix")
        checked += 1
    assert checked == 1000


@pytest.mark.parametrize("n,T", [(1, 1), (3, 15), (4, 16), (2, 17), (8, 1024), (300, 33)])
def test_dense_tables(n, T):
    import torch

    from kda_aot.loader import get_library

    start = torch.full((n + 1,), -7, dtype=torch.int32, device="cuda")
    prefix = torch.full((n + 1,), -7, dtype=torch.int32, device="cuda")
    get_library().kernel("seq_tables_dense")(start.data_ptr(), prefix.data_ptr(), n, T,
                                            torch.cuda.current_stream().cuda_stream)
    want_start, want_prefix = _expected([T] * n)
    np.testing.assert_array_equal(start.cpu().numpy(), want_start)
    np.testing.assert_array_equal(prefix.cpu().numpy(), want_prefix)
