"""kda_aot/intake/pending.py's bookkeeping with stand-in events: an action runs once its event completed,
never before, poll never waits, drain waits for every event (the device side is covered by
tests/gpu/test_frameworks.py)."""

import pytest

from kda_aot.intake import pending


class FakeEvent:
    def __init__(self):
        self.is_done, self.synced = False, False

    def sync(self):
        self.synced, self.is_done = True, True


@pytest.fixture(autouse=True)
def empty_queue():
    pending.drain()
    yield
    pending.drain()


def test_an_action_waits_for_its_event():
    ran, event = [], FakeEvent()
    pending.after(event, lambda: ran.append("a"))
    pending.after(None, lambda: ran.append("now"))
    pending.poll()
    assert ran == ["now"] and pending.pending_count() == 1 and not event.synced
    event.is_done = True
    pending.poll()
    assert ran == ["now", "a"] and pending.pending_count() == 0


def test_drain_waits_for_every_event_and_runs_everything():
    ran, events = [], [FakeEvent(), FakeEvent()]
    for i, e in enumerate(events):
        pending.after(e, lambda i=i: ran.append(i))
    pending.drain()
    assert sorted(ran) == [0, 1] and all(e.synced for e in events) and pending.pending_count() == 0
