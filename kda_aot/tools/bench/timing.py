"""How the benchmark times: the median of CUDA-event timings, the copy bandwidth behind the memory
floor, and the caller's host time per call, rows compared with each other timed interleaved
(docs/call_path.md).
"""

from __future__ import annotations

import statistics
from typing import Callable, List, Sequence


def time_ms(fn: Callable[[], object], iters: int, warmup: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 20, 5)
    return 2 * nbytes / (ms * 1e-3)


def host_us(fn, calls: int = 100, repeats: int = 7, busy: bool = True) -> float:
    """Host time per call, median of `repeats` batches of `calls`. With `busy`, each batch is
    queued behind a long sleep kernel, so no call waits for the device: what the caller's thread
    spends in prefill. Batches are short: a call queues up to 5 launches, and a full launch queue
    (about a thousand entries) would block the host. kda_aot.bench_op and ci/host_breakdown.py use
    it too; rows that are compared with each other go through host_us_each."""
    return host_us_each([fn], calls, repeats, busy)[0]


def host_us_each(fns: Sequence[Callable], calls: int = 100, repeats: int = 7, busy: bool = True) -> List[float]:
    """host_us of each of `fns`, their batches interleaved: batch r of every function runs before
    batch r + 1 of any. A machine whose speed drifts during the measurement (a freshly started one
    measured the same intake step at 17.6 us in its first minute and 8.7 us a few seconds later)
    then shifts every row alike, instead of inflating the rows timed first."""
    import time

    import torch

    for fn in fns:
        fn()
    torch.cuda.synchronize()
    samples: List[List[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, row in zip(fns, samples):
            if busy:
                torch.cuda._sleep(int(5e8))
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            row.append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
    return [statistics.median(row) for row in samples]
