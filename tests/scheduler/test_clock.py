"""``Clock.wait``'s ``not_before``: a real clock sleeps once for a deadline and a real-time
pause together, a fake clock leaves the pause to its caller; and the scanner, under a
steady flow of keys due within its pacing pause, sleeps once per scan, not twice (on these
machines every wake-up of a thread costs it cold caches: docs/performance.md at f86b3f2,
section 10).

Real time on purpose: the pacing this serves is in real time (tests/scheduler/
test_frontier.py, ``test_scans_are_paced_in_real_time``); each assertion is a bound that a
slow machine cannot break."""

from __future__ import annotations

import ctypes
import itertools
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from scheduler.broker import Broker
from scheduler.clock import FakeClock, SystemClock, precise_timers
from scheduler.config import EngineConfig
from scheduler.model import SendRequest
from scheduler.scanner import Scanner
from tests.support.engine import read_topic


def test_a_real_clock_wakes_for_a_past_deadline_no_sooner_than_not_before() -> None:
    clock = SystemClock()
    floor = time.monotonic() + 0.05
    assert clock.wait(threading.Event(), clock.now_ms() - 1, not_before=floor) is False
    assert time.monotonic() >= floor


def test_a_later_deadline_still_wins() -> None:
    clock = SystemClock()
    deadline = clock.now_ms() + 60
    assert clock.wait(threading.Event(), deadline, not_before=time.monotonic() + 0.01) is False
    assert clock.now_ms() >= deadline


def test_the_event_still_wakes_a_real_clock_at_once() -> None:
    clock = SystemClock()
    event = threading.Event()
    timer = threading.Timer(0.01, event.set)
    timer.start()
    began = time.monotonic()
    assert clock.wait(event, clock.now_ms() - 1, not_before=began + 30) is True
    assert time.monotonic() - began < 20
    timer.join()


def test_a_fake_clock_ignores_not_before() -> None:
    clock = FakeClock()
    began = time.monotonic()
    assert clock.wait(threading.Event(), clock.now_ms(), not_before=began + 30) is False
    assert time.monotonic() - began < 20


class Sleeps:
    """What the scanner threads do, in order: ``step`` (a scan) and ``sleep`` (a blocking
    wait on the clock or on the stop event)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float]] = []
        self._lock = threading.Lock()

    def note(self, what: str) -> None:
        if threading.current_thread().name.startswith("scanner-"):
            with self._lock:
                self.events.append((what, time.monotonic()))


class CountingClock(SystemClock):
    def __init__(self, sleeps: Sleeps) -> None:
        self.sleeps = sleeps

    def wait(self, event: threading.Event, deadline_ms: int | None,
             not_before: float | None = None) -> bool:
        self.sleeps.note("sleep")
        return super().wait(event, deadline_ms, not_before)


class CountingStop:
    """The broker's stop event, its waits counted (the scanner's pause sleeps on it)."""

    def __init__(self, event: threading.Event, sleeps: Sleeps) -> None:
        self._event = event
        self._sleeps = sleeps

    def wait(self, timeout: float | None = None) -> bool:
        self._sleeps.note("sleep")
        return self._event.wait(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._event, name)


def test_a_paced_scanner_sleeps_once_per_scan(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps = Sleeps()
    step = Scanner.step

    def noted(scanner: Scanner) -> bool | None:
        sleeps.note("step")
        return step(scanner)

    monkeypatch.setattr(Scanner, "step", noted)
    clock = CountingClock(sleeps)
    broker = Broker(EngineConfig(data_dir=tmp_path, timer_shards=1, scan_interval_ms=60),
                    clock)
    broker.start()
    try:
        for scanner in broker.parts.scanners:
            scanner._stopping = CountingStop(scanner._stopping, sleeps)  # type: ignore[assignment]
        now = clock.now_ms()
        first_due = time.monotonic() + 0.1
        # due 10 ms apart: each next key falls inside the 60 ms pause after a scan
        broker.send_batch([SendRequest(topic="t", body=b"x", msg_id=f"m{i}",
                                       deliver_at=now + 100 + 10 * i) for i in range(6)])
        give_up = time.monotonic() + 20
        while len(read_topic(broker, "t")) < 6 and time.monotonic() < give_up:
            time.sleep(0.01)
        assert [r.msg_id for r in read_topic(broker, "t")] == [f"m{i}" for i in range(6)]
        time.sleep(0.1)  # the scanner's last sleep begins
    finally:
        broker.close()
    # from the first scan that could deliver on: one sleep between two scans, never two
    scans = [i for i, (what, at) in enumerate(sleeps.events) if what == "step"]
    delivering = [i for i in scans if sleeps.events[i][1] >= first_due]
    assert len(delivering) >= 2, sleeps.events
    for a, b in itertools.pairwise(delivering):
        between = [what for what, _ in sleeps.events[a + 1:b]]
        assert between == ["sleep"], (between, sleeps.events)
    # and the pacing still holds: the scans that delivered began >= 60 ms apart
    starts = [sleeps.events[i][1] for i in delivering]
    assert all(b - a >= 0.06 * 0.99 for a, b in itertools.pairwise(starts))


@pytest.mark.skipif(sys.platform != "linux", reason="timer slack is Linux's")
def test_precise_timers_sets_the_calling_threads_timer_slack_only() -> None:
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    get_slack = 30  # PR_GET_TIMERSLACK: the calling thread's, in ns
    slack: dict[str, int] = {}

    def read(name: str, precise: bool) -> None:
        if precise:
            precise_timers()
        slack[name] = prctl(get_slack, 0, 0, 0, 0)

    for name, precise in (("scanner", True), ("other", False)):
        thread = threading.Thread(target=read, args=(name, precise))
        thread.start()
        thread.join()
    inherited = prctl(get_slack, 0, 0, 0, 0)  # this thread's (50 µs by default)
    assert slack == {"scanner": 1_000, "other": inherited} and inherited != 1_000
