"""Delivery listeners (scheduler/listeners.py): each call is timed; a call over the budget
is counted per listener and logged, at most once per OVERRUN_LOG_EVERY_S (with the count
since); a call within it is neither; an overrunning or failing listener delays no delivery
to the others."""

from __future__ import annotations

import logging
from collections.abc import Collection

import pytest

from scheduler import listeners
from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.listeners import LISTENER_BUDGET_MS, OVERRUN_LOG_EVERY_S, BudgetedListener
from scheduler.metrics import Counter
from scheduler.model import SendRequest


class FakeTimer:
    """Seconds; moved on only by the listeners under test (no sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Slow:
    """A listener that takes ``took_ms`` of the fake timer per call."""

    def __init__(self, timer: FakeTimer, took_ms: float) -> None:
        self.timer, self.took_ms = timer, took_ms
        self.seen: list[set[str]] = []

    def on_delivery(self, topics: Collection[str]) -> None:
        self.seen.append(set(topics))
        self.timer.now += self.took_ms / 1000


def overrun_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "hourglass.engine" and "over its" in r.getMessage()]


def deliver(broker: Broker, clock: FakeClock, topic: str, n: int = 1) -> None:
    broker.send_batch([SendRequest(topic=topic, body=b"x", delay_ms=10) for _ in range(n)])
    clock.advance(10)
    broker.drain()


def test_an_engine_listener_over_its_budget_is_counted_and_logged(
        broker: Broker, clock: FakeClock, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    timer = FakeTimer()
    monkeypatch.setattr(listeners, "TIMER", timer)
    caplog.set_level(logging.WARNING, logger="hourglass.engine")
    slow, quick = Slow(timer, LISTENER_BUDGET_MS + 2), Slow(timer, LISTENER_BUDGET_MS - 1)
    broker.add_delivery_listener(slow.on_delivery)
    broker.add_delivery_listener(quick.on_delivery)
    overruns = broker.metrics.listener_overruns
    deliver(broker, clock, "t")
    assert slow.seen == quick.seen == [{"t"}]  # (both called; the slow one cut nothing short)
    assert overruns.labels("Slow.on_delivery").value == 1
    assert overruns.value == 1  # the quick one is within its budget
    (logged,) = overrun_logs(caplog)
    assert "Slow.on_delivery took 7.0 ms for 1 topic(s), over its 5.0 ms budget" in logged
    assert broker.metrics.as_dict()["delivery_listener_overruns_total"] == {
        "Slow.on_delivery": 1}


def test_overruns_are_each_counted_and_logged_at_most_once_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="hourglass.engine")
    timer = FakeTimer()
    slow = Slow(timer, 50)
    counter = Counter("overruns_total", "test", "listener")
    budgeted = BudgetedListener(slow.on_delivery, counter, timer=timer)
    for _ in range(5):
        budgeted(["a", "b"])
    assert counter.value == 5
    assert len(overrun_logs(caplog)) == 1
    timer.now += OVERRUN_LOG_EVERY_S
    budgeted(["a"])
    assert counter.value == 6
    first, second = overrun_logs(caplog)
    assert "(1 overrun(s) since the last report" in first
    assert "(5 overrun(s) since the last report" in second  # 4 unlogged, then this one


def test_a_failing_listener_is_timed_too_and_the_others_still_run(
        broker: Broker, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    timer = FakeTimer()
    monkeypatch.setattr(listeners, "TIMER", timer)

    def failing(topics: Collection[str]) -> None:
        timer.now += 1.0
        raise RuntimeError("a listener bug")

    after = Slow(timer, 0)
    broker.add_delivery_listener(failing)
    broker.add_delivery_listener(after.on_delivery)
    deliver(broker, clock, "t", 3)
    assert after.seen == [{"t"}]
    assert broker.metrics.listener_overruns.value == 1
    assert broker.pull("t", 0, 10).next_offset == 3  # delivered all the same
