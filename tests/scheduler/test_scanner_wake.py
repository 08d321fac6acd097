"""The scanner sleeps until the next due time, exactly, and not before: no fixed poll.

Fake time only (no sleeps, nothing timed): a clock that records the deadline of every
sleep of the scanner thread, so a test sees when the scanner means to look next, then moves
fake time to just before and to exactly that instant. Each test runs without the real-time
pacing (``scan_interval_ms`` 0, as tests/support/engine.py has it) and with the default
interval (a pause of at most that much real time after a scan, which a fake clock does not
shorten or lengthen: scheduler/clock.py); the pacing's own tests are in test_frontier.py and
test_clock.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.config import EngineConfig
from scheduler.model import SendRequest
from tests.support.engine import START_MS, Harness, read_topic

WAIT_S = 30.0  # how long a test waits for the scanner thread to react, at most
INTERVALS = pytest.mark.parametrize(
    "interval_ms", [0, EngineConfig(data_dir=Path(".")).scan_interval_ms])


class SleepLog(FakeClock):
    """A FakeClock noting the deadline of each sleep of a scanner thread; ``sleeping_until``
    waits for the scanner to go to sleep with a given deadline."""

    def __init__(self, start_ms: int = START_MS) -> None:
        super().__init__(start_ms)
        self.cond = threading.Condition()
        self.sleeps: list[int | None] = []  # deadlines, in order
        self.asleep = False

    def wait(self, event: threading.Event, deadline_ms: int | None,
             not_before: float | None = None) -> bool:
        if not threading.current_thread().name.startswith("scanner-"):
            return super().wait(event, deadline_ms, not_before)
        with self.cond:
            self.sleeps.append(deadline_ms)
            self.asleep = True
            self.cond.notify_all()
        try:
            return super().wait(event, deadline_ms, not_before)
        finally:
            with self.cond:
                self.asleep = False

    def sleeping_until(self, deadline_ms: int | None) -> None:
        """Until the scanner sleeps with ``deadline_ms`` as its latest deadline."""
        with self.cond:
            ok = self.cond.wait_for(
                lambda: self.asleep and self.sleeps and self.sleeps[-1] == deadline_ms,
                WAIT_S)
            assert ok, f"the scanner's sleeps: {self.sleeps}, asleep {self.asleep}"


def _send(broker: Broker, msg_id: str, deliver_at: int) -> None:
    broker.send(SendRequest(topic="t", body=b"x", msg_id=msg_id, deliver_at=deliver_at))


@INTERVALS
def test_the_scanner_sleeps_until_the_first_pending_key_and_delivers_it_then(
        tmp_path: Path, interval_ms: int) -> None:
    clock = SleepLog()
    harness = Harness(tmp_path / "data", clock)
    try:
        broker = harness.open(timer_shards=1, scan_interval_ms=interval_ms)
        clock.sleeping_until(None)  # nothing pending: it waits for a send only
        _send(broker, "late", START_MS + 900)
        _send(broker, "early", START_MS + 500)
        clock.sleeping_until(START_MS + 500)

        # one ms before: a wake-up (a fake clock wakes every sleeper when it moves), a look,
        # nothing delivered, and back to sleep until the same instant
        clock.set(START_MS + 499)
        broker.drain()
        assert read_topic(broker, "t") == []
        clock.sleeping_until(START_MS + 500)

        clock.set(START_MS + 500)  # exactly then: the key is delivered, the next one awaited
        broker.drain()
        assert [r.msg_id for r in read_topic(broker, "t")] == ["early"]
        clock.sleeping_until(START_MS + 900)

        clock.set(START_MS + 899)
        broker.drain()
        assert [r.msg_id for r in read_topic(broker, "t")] == ["early"]
        clock.set(START_MS + 900)
        broker.drain()
        assert [r.msg_id for r in read_topic(broker, "t")] == ["early", "late"]
        clock.sleeping_until(None)
        # every deadline the scanner slept towards was a due time (or none): no poll
        assert set(clock.sleeps) <= {None, START_MS + 500, START_MS + 900}, clock.sleeps
    finally:
        harness.close_all()


@INTERVALS
def test_a_send_due_earlier_wakes_the_scanner_for_its_own_time(tmp_path: Path,
                                                               interval_ms: int) -> None:
    clock = SleepLog()
    harness = Harness(tmp_path / "data", clock)
    try:
        broker = harness.open(timer_shards=1, scan_interval_ms=interval_ms)
        _send(broker, "later", START_MS + 10_000)
        clock.sleeping_until(START_MS + 10_000)
        _send(broker, "sooner", START_MS + 250)  # no clock move: the send itself wakes it
        clock.sleeping_until(START_MS + 250)
        _send(broker, "between", START_MS + 5_000)  # not earlier: the deadline stays
        clock.set(START_MS + 250)
        broker.drain()
        assert [r.msg_id for r in read_topic(broker, "t")] == ["sooner"]
        clock.sleeping_until(START_MS + 5_000)
    finally:
        harness.close_all()
