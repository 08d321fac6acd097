"""Delivery listeners: what the engine calls after a commit, and the bound on their work.

A delivery listener (``Broker.add_delivery_listener``) is called with the topics a commit
appended messages to, right after the commit, on the committing thread: the delivery
thread (scheduler/delivery.py -> committer.py), or a sending thread for messages due on
arrival and transaction commits (scheduler/writes.py). Today there are two, both in api:
``DeliveryNotifier.on_delivery`` (api/longpoll.py: wakes the waiting pulls; one
``call_soon_threadsafe``, a few µs) and ``StreamPusher.on_delivery`` (api/push.py: writes
the frames of at most 16 parked streams, hands the rest to its writer thread; 0.02 / 0.16-1.1
ms p50 / p99 with 200 streams of a topic, ``python -m bench.stream_commit_cost``).

The contract (:class:`DeliveryListener`):

- it is called once per commit with a collection of topic names, and must not keep it;
- it must not call back into the Broker's write paths (the committing thread may hold the
  commit lock or a shard's lock); reads (``Broker.read``) are allowed;
- it returns within ``LISTENER_BUDGET_MS``: everything the shard delivers next waits
  behind it. Work that may take longer goes to a thread of the listener's own (as the
  pusher's writer does);
- an exception it raises is logged by the engine and does not stop delivery (nor the other
  listeners).

The budget is measured: the engine wraps every listener in a :class:`BudgetedListener`,
which times each call and counts a call over the budget in the engine's metric
``delivery_listener_overruns_total`` (label ``listener``: its qualified name), logging a
WARNING at the first overrun of a listener and then at most once per
``OVERRUN_LOG_EVERY_S`` (with the count since). A call is not cut short: the listener runs
on the committing thread, which cannot be interrupted safely mid-write; an overrun is a bug
of the listener, made visible.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Protocol

from scheduler.metrics import Counter

log = logging.getLogger("hourglass.engine")

#: the most a delivery listener may take per call, ms (module doc)
LISTENER_BUDGET_MS = 5.0
#: an overrunning listener is logged at most once per this long (each overrun is counted)
OVERRUN_LOG_EVERY_S = 60.0
#: the timer a listener's call is measured with, seconds (tests put a fake one here)
TIMER: Callable[[], float] = time.perf_counter


class DeliveryListener(Protocol):
    """Called after each commit that appended messages, with their topics (module doc)."""

    def __call__(self, topics: Collection[str], /) -> None: ...


def listener_name(listener: DeliveryListener) -> str:
    """A stable name for ``listener`` (its qualified name: ``StreamPusher.on_delivery``)."""
    name = getattr(listener, "__qualname__", None)
    return name if isinstance(name, str) else type(listener).__qualname__


class BudgetedListener:
    """``listener``, timed by ``timer`` (seconds; default ``TIMER``): a call past
    ``budget_ms`` is counted in ``overruns`` (labelled with the listener's name) and logged
    (module doc)."""

    __slots__ = ("_budget_s", "_count", "_listener", "_logged_at", "_overruns", "_timer",
                 "_unlogged", "name")

    def __init__(self, listener: DeliveryListener, overruns: Counter, *,
                 budget_ms: float = LISTENER_BUDGET_MS,
                 timer: Callable[[], float] | None = None) -> None:
        self._listener, self._timer = listener, timer or TIMER
        self._budget_s = budget_ms / 1000.0
        self.name = listener_name(listener)
        self._overruns = overruns
        self._count = overruns.labels(self.name)
        self._logged_at: float | None = None  # timer() of the last overrun logged
        self._unlogged = 0  # overruns since then

    def __call__(self, topics: Collection[str], /) -> None:
        timer = self._timer
        started = timer()
        try:
            self._listener(topics)
        finally:
            took = timer() - started
            if took > self._budget_s:
                self._overran(took, len(topics), started + took)

    def _overran(self, took_s: float, topics: int, now: float) -> None:
        self._count.inc()
        self._unlogged += 1
        logged_at = self._logged_at
        if logged_at is not None and now - logged_at < OVERRUN_LOG_EVERY_S:
            return
        log.warning("delivery listener %s took %.1f ms for %d topic(s), over its %.1f ms "
                    "budget (%d overrun(s) since the last report; scheduler/listeners.py)",
                    self.name, took_s * 1000, topics, self._budget_s * 1000, self._unlogged)
        self._logged_at, self._unlogged = now, 0

    def __repr__(self) -> str:
        return f"BudgetedListener({self._listener!r})"
