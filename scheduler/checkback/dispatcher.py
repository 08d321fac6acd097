"""The check-back dispatcher: the thread that POSTs due checks to the groups' URLs.

It sleeps on the clock until the earliest next check of any group with an active callback
(scheduler/checkback/registry.py), or until woken by a registration or a prepare, claims the
due checks exactly as a poll does (each counts, the next is due one check interval later,
past the maximum the message is discarded), POSTs each from a small worker pool
(scheduler/checkback/client.py) and applies the answer: COMMIT, ROLLBACK, or UNKNOWN (nothing
to do: the next check is already scheduled).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from scheduler.checkback.client import CheckAnswer, CheckbackClient
from scheduler.checkback.registry import CallbackRegistration, CallbackRegistry
from scheduler.clock import Clock
from scheduler.model import PendingCheck
from storage.errors import InvalidArgument

log = logging.getLogger(__name__)

MAX_UNANSWERED_PER_ROUND = 1000  # unanswered checks claimed per dispatch round at most


class CheckSource(Protocol):
    """What the dispatcher needs from the transaction manager."""

    def poll_checks(self, producer_group: str, max_checks: int) -> list[PendingCheck]: ...

    def next_check_at(self, producer_group: str) -> int | None: ...

    def apply_answer(self, transaction_id: str, answer: CheckAnswer) -> None: ...

    def claim_unanswered(self, limit: int) -> int | None: ...


class CheckbackDispatcher:
    """One thread that sleeps on the clock until a callback group's next check is due, then
    claims and hands the checks to ``workers`` POSTing threads (at most ``2 * workers`` in
    flight: claiming more would only make them older before they are sent)."""

    def __init__(self, source: CheckSource, registry: CallbackRegistry, clock: Clock, *,
                 timeout_ms: int, workers: int, client: CheckbackClient | None = None,
                 on_answer: Callable[[CheckAnswer], None] | None = None) -> None:
        if workers < 1:
            raise InvalidArgument("transaction_callback_workers must be >= 1")
        self._source = source
        self._registry = registry
        self._clock = clock
        self._client = client or CheckbackClient(timeout_ms=timeout_ms, workers=workers)
        self._on_answer = on_answer
        self._max_in_flight = 2 * workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="checkback")
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._in_flight = 0
        self._started = 0  # dispatch rounds begun
        self._idle_round = 0  # last round that ended with nothing due and nothing in flight
        self._rotation = 0
        self._thread = threading.Thread(target=self._run, name="checkback-dispatcher",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    def join(self, timeout_s: float = 30.0) -> None:
        """Block until a dispatch round that began after this call ended with no check due
        at the clock's time and no POST in flight (tests call it after advancing the clock)."""
        with self._cond:
            target = self._started + 1  # the next round to begin reads the clock after now
        self._wake.set()
        with self._cond:
            if not self._cond.wait_for(
                    lambda: self._idle_round >= target or self._stop.is_set(), timeout_s):
                raise TimeoutError("check-back dispatcher did not become idle")

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            with self._cond:
                self._started += 1
                number = self._started
            try:
                deadline, idle = self._round()
            except Exception:  # storage trouble: keep the thread, retry after a pause
                log.exception("check-back dispatch round failed")
                deadline, idle = self._clock.now_ms() + 1000, False
            with self._cond:
                if idle:
                    self._idle_round = number
                self._cond.notify_all()
            self._clock.wait(self._wake, deadline)

    def _round(self) -> tuple[int | None, bool]:
        """Claim and submit due checks; returns (when to look again, idle)."""
        now = self._clock.now_ms()
        deadline: int | None = None
        regs = sorted(self._registry.active().items())
        if regs:  # start at a different group each round: one busy group cannot starve others
            self._rotation = (self._rotation + 1) % len(regs)
            regs = regs[self._rotation:] + regs[:self._rotation]
        for group, reg in regs:
            room = self._room()
            if room > 0:
                for check in self._source.poll_checks(group, room):
                    self._submit(reg, check)
            next_at = self._source.next_check_at(group)
            if next_at is not None:
                deadline = next_at if deadline is None else min(deadline, next_at)
        unanswered = self._source.claim_unanswered(MAX_UNANSWERED_PER_ROUND)
        if unanswered is not None:  # the other groups' checks nobody takes
            deadline = unanswered if deadline is None else min(deadline, unanswered)
            if unanswered <= now:  # more than one round's worth: go again now
                return now, False
        if deadline is not None and deadline <= now:  # more due than there was room for
            # with room left (discards freed it), go again now; else a finishing POST wakes us
            return (now if self._room() > 0 else None), False
        with self._cond:
            return deadline, self._in_flight == 0

    def _room(self) -> int:
        with self._cond:
            return self._max_in_flight - self._in_flight

    def _submit(self, reg: CallbackRegistration, check: PendingCheck) -> None:
        with self._cond:
            self._in_flight += 1
        self._pool.submit(self._ask, reg, check)

    def _ask(self, reg: CallbackRegistration, check: PendingCheck) -> None:
        try:
            answer = self._client.ask(reg, check, self._clock.now_ms())
            if self._on_answer is not None:
                self._on_answer(answer)
            self._source.apply_answer(check.transaction_id, answer)
        except Exception:
            log.exception("applying the check-back answer of %s failed", check.transaction_id)
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()
            self._wake.set()
