"""bench.host_us_each: the host-cost rows that are compared with each other are timed in interleaved
batches, so a drift in the machine's speed falls on every row alike (a fake torch records the order)."""

import sys
import time
import types

from kda_aot.tools import bench


def fake_torch(events):
    cuda = types.SimpleNamespace(_sleep=lambda cycles: events.append("sleep"),
                                 synchronize=lambda: events.append("sync"))
    return types.SimpleNamespace(cuda=cuda)


def test_batches_interleave_and_each_row_gets_its_own_median(monkeypatch):
    events = []
    monkeypatch.setitem(sys.modules, "torch", fake_torch(events))
    clock = {"t": 0.0}
    cost = {"a": 10e-6, "b": 30e-6}  # seconds per call

    def timed(name):
        def fn():
            events.append(name)
            clock["t"] += cost[name]
        return fn

    monkeypatch.setattr(time, "perf_counter", lambda: clock["t"])
    a_us, b_us = bench.host_us_each([timed("a"), timed("b")], calls=3, repeats=2)
    assert abs(a_us - 10.0) < 1e-6 and abs(b_us - 30.0) < 1e-6
    # one warm-up call each, then per repeat: sleep, a's batch, sync, sleep, b's batch, sync
    batch = ["sleep"] + ["a"] * 3 + ["sync", "sleep"] + ["b"] * 3 + ["sync"]
    assert events == ["a", "b", "sync"] + batch * 2


def test_drift_falls_on_every_row(monkeypatch):
    """The machine slows down 2x after the first repeat: both rows see it, neither is skewed."""
    events = []
    monkeypatch.setitem(sys.modules, "torch", fake_torch(events))
    clock = {"t": 0.0, "calls": 0}

    def fn():
        clock["calls"] += 1
        clock["t"] += 20e-6 if clock["calls"] <= 2 + 2 * 4 else 10e-6  # warm-up and first repeat slow

    monkeypatch.setattr(time, "perf_counter", lambda: clock["t"])
    first, second = bench.host_us_each([fn, fn], calls=4, repeats=3)
    assert abs(first - 10.0) < 1e-6 and abs(second - 10.0) < 1e-6


def test_host_us_is_the_one_row_case(monkeypatch):
    events = []
    monkeypatch.setitem(sys.modules, "torch", fake_torch(events))
    clock = {"t": 0.0}

    def fn():
        clock["t"] += 5e-6

    monkeypatch.setattr(time, "perf_counter", lambda: clock["t"])
    assert abs(bench.host_us(fn, calls=2, repeats=3, busy=False) - 5.0) < 1e-6
    assert "sleep" not in events
