"""Clocks. Every time-dependent part of hourglass takes one; tests drive a FakeClock.

Waiting is always "until a deadline or until an event is set", never a fixed poll:
``clock.wait(event, deadline_ms)`` returns True when ``event`` was set, False when the clock
reached ``deadline_ms``. A FakeClock wakes every waiter whenever it is advanced, so a thread
sleeping until a due time in fake time wakes as soon as a test moves the clock past it.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Current time, epoch milliseconds."""
        ...

    def wait(self, event: threading.Event, deadline_ms: int | None,
             not_before: float | None = None) -> bool:
        """Block until ``event`` is set (-> True) or the clock reaches ``deadline_ms``
        (-> False). ``None`` waits for the event only. ``not_before``: a ``time.monotonic()``
        instant the caller will not act before anyway (real-time pacing): a real clock
        then wakes for the deadline no earlier, so that the caller sleeps once, not twice;
        a fake clock, whose time is not real time, ignores it (the caller sleeps the rest
        of its pause itself)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def wait(self, event: threading.Event, deadline_ms: int | None,
             not_before: float | None = None) -> bool:
        if deadline_ms is None:
            return event.wait()
        # to the exact instant deadline_ms.000, not whole ms from a truncated now (which
        # woke up to 1 ms late, 0.5 ms on average)
        deadline_ns = deadline_ms * 1_000_000
        if not_before is not None:  # (+10 µs: the two clocks are read one after the other,
            # and NTP may slew one against the other by 500 ppm: 2 µs over a 4 ms pause)
            floor_ns = time.time_ns() + int((not_before - time.monotonic()) * 1e9) + 10_000
            deadline_ns = max(deadline_ns, floor_ns)
        while True:
            remaining_ns = deadline_ns - time.time_ns()
            if remaining_ns <= 0:
                return event.is_set()
            if event.wait(remaining_ns / 1e9):
                return True


_PR_SET_TIMERSLACK = 29


def precise_timers() -> None:
    """Let the calling thread's timed waits end within 1 µs of their deadline instead of
    Linux's default 50 µs of timer slack (``prctl(PR_SET_TIMERSLACK)``; nothing elsewhere).
    For the threads that wake at a due instant: W3 of bench/peers, lateness p50 1.40 ->
    1.31 ms at the same CPU (docs/performance.md at f86b3f2, section 14)."""
    if sys.platform != "linux":
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, 1_000, 0, 0, 0)
    except (OSError, AttributeError):  # no such libc call: the default slack
        pass


class FakeClock:
    """A manually driven clock. ``advance``/``set`` wake every thread blocked in ``wait``."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._lock = threading.Lock()
        self._waiters: set[threading.Event] = set()

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> int:
        if ms < 0:
            raise ValueError("a clock does not go backwards")
        return self.set(self._now + ms)

    def set(self, now_ms: int) -> int:
        with self._lock:
            if now_ms < self._now:
                raise ValueError("a clock does not go backwards")
            self._now = now_ms
            waiters = list(self._waiters)
        for event in waiters:
            event.set()  # waiters re-check the time; a spurious wake-up only costs a rescan
        return now_ms

    def wait(self, event: threading.Event, deadline_ms: int | None,
             not_before: float | None = None) -> bool:
        with self._lock:
            self._waiters.add(event)
        try:
            while True:
                if deadline_ms is not None and self._now >= deadline_ms:
                    return event.is_set()
                if event.wait(1.0):
                    return True
        finally:
            with self._lock:
                self._waiters.discard(event)
