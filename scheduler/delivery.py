"""The delivery stage: a bounded queue of scan batches drained by one committing thread.

Flow control: scanners block in ``put`` while the queue holds ``delivery_queue_batches``
batches, or ``delivery_queue_bytes`` of stored values (an estimate: a batch's count times
the mean size of its first, middle and last value; a batch is always taken into an empty
queue), or one commit's worth of messages (``delivery_batch_max``), so however many messages
are due at once, at most that many scan batches (plus the one being committed) are in
memory. The byte bound matters for large bodies: 32 batches of 1000 16 KiB messages were
half a GiB (a 20 k burst over HTTP: the server's RSS +549 MiB). The message bound keeps a
burst's scanners one commit ahead of the commits: with 32 batches of 1000 queued, the two
scanners read 32 000 keys ahead while the 2nd commit ran, the GIL shared three ways (a
commit of 4000 took 22 ms of wall time), and the stream, and its consumer on the other
core, started late (50 k due at once over HTTP: p99 137 -> 124 ms, p50 101 -> 78, medians
of 24-25 runs; docs/performance.md, W2). Large bodies are bound by bytes first, as before.
The consumer takes a batch and, while a backlog is queued, as many more as fit in
``delivery_batch_max`` messages, and commits them with ONE log append and ONE RocksDB write
(scheduler/committer.py); the first batch after a pause goes alone, so that what falls due
reaches the log without waiting for the ones behind it. When the stage is idle, a scanner
commits a small batch itself (``put``), which saves a thread hand-off per due instant.

Failures: a failed commit is retried with back-off min(n x 100 ms, retry_max_backoff_ms)
measured on the engine clock; the batch is never dropped. While it fails the stage is
``blocked`` (the Broker reports itself not ready) and every retry is counted. Shutdown
closes the queue: queued batches are dropped, which loses nothing, since their keys are
still in RocksDB below no persisted watermark and are scanned again on the next start.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from scheduler.clock import Clock
from scheduler.committer import CommitOutcome, ScanBatch
from scheduler.metrics import EngineMetrics
from scheduler.scanner import Progress

log = logging.getLogger(__name__)


def yield_gil() -> None:
    """Let a thread just woken take the GIL now. Without this the waking thread keeps it and
    runs on (a scanner scanning ahead, the delivery thread committing the next batch) until
    CPython's switch interval (5 ms) forces a hand-over, and what was handed on waits that
    long: 200 k due at once, in process, the first commit started 5.5-6.6 ms after due, with
    the scan it commits handed on at 0.9-2.5 ms (0.9 ms with this). ``time.sleep(0)``
    releases the GIL and asks for it again. After a commit only in a burst (a backlog
    queued): after every wake-up of the event loop, W3 cost 6 % more server CPU and moved
    no lateness."""
    time.sleep(0)


class CommitsDue(Protocol):
    """scheduler/poison.py's Quarantine (or a bare Committer)."""

    def commit_due(self, scans: Sequence[ScanBatch]) -> CommitOutcome: ...


INLINE_MAX = 256  # messages: a smaller batch handed to an idle stage is committed at once
#: bytes of stored values past which a commit takes no more queued batches: with 16 KiB
#: bodies ``delivery_batch_max`` (4096) alone let one commit hold 64 MiB of values, as much
#: again in log records and in their framed copy (a 20 k burst: the server's RSS +518 MiB)
COMMIT_BYTES_MAX = 16 << 20


def batch_bytes(batch: ScanBatch) -> int:
    """The stored values' bytes of a scan batch, estimated in O(1): its count times the mean
    size of its first, middle and last value (summing them all cost 25-70 µs a batch of
    1000, ~3 % of a burst's drain; a burst's values are mostly alike)."""
    items = batch.items
    n = len(items)
    if not n:
        return 0
    return n * (len(items[0][1]) + len(items[n // 2][1]) + len(items[-1][1])) // 3


class BoundedQueue:
    """A FIFO of scan batches with a capacity in batches; ``close`` wakes every waiter."""

    def __init__(self, capacity: int, max_bytes: int = 1 << 62,
                 max_messages: int = 1 << 62) -> None:
        """Puts wait while ``capacity`` batches, ``max_bytes`` (batch_bytes) or
        ``max_messages`` are queued (a batch always enters an empty queue)."""
        if capacity < 1 or max_bytes < 1 or max_messages < 1:
            raise ValueError("capacity, max_bytes and max_messages must be >= 1")
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._max_messages = max_messages
        self.bytes = 0  # the queued batches' estimated value bytes (batch_bytes)
        self._items: collections.deque[ScanBatch] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._busy = 0  # batches being committed (by the consumer or inline)
        self._waiting = 0  # consumers waiting in ``get``
        self.messages = 0

    def put(self, item: ScanBatch) -> bool:
        """Block while full; False when the queue was closed (the item is not queued)."""
        size = batch_bytes(item)
        with self._cond:
            while (self._items and not self._closed
                   and (len(self._items) >= self._capacity
                        or self.bytes + size > self._max_bytes
                        or self.messages >= self._max_messages)):
                self._cond.wait()
            if self._closed:
                return False
            self._items.append(item)
            self.messages += len(item.items)
            self.bytes += size
            self._cond.notify_all()
            woke = self._waiting > 0
        if woke:  # hand the GIL to the consumer just woken (yield_gil)
            yield_gil()
        return True

    def get(self) -> ScanBatch | None:
        """Block until an item is there and take it (the caller is busy until ``done``);
        None once closed."""
        with self._cond:
            while not self._items and not self._closed:
                self._waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self._waiting -= 1
            if self._closed:
                return None
            self._busy += 1
            return self._pop()

    def claim_idle(self) -> bool:
        """True (and busy until ``done``) when nothing is queued or being committed."""
        with self._cond:
            if self._items or self._busy or self._closed:
                return False
            self._busy += 1
            return True

    def done(self) -> None:
        with self._cond:
            self._busy -= 1

    def get_nowait(self) -> ScanBatch | None:
        with self._cond:
            return self._pop() if self._items and not self._closed else None

    def _pop(self) -> ScanBatch:
        item = self._items.popleft()
        self.messages -= len(item.items)
        self.bytes -= batch_bytes(item)
        self._cond.notify_all()
        return item

    def close(self) -> int:
        """Close and drop what is queued; returns the number of dropped batches."""
        with self._cond:
            self._closed = True
            dropped = len(self._items)
            self._items.clear()
            self.messages = 0
            self.bytes = 0
            self._cond.notify_all()
            return dropped

    def __len__(self) -> int:
        return len(self._items)


class DeliveryStage:
    def __init__(
        self, *, committer: CommitsDue, clock: Clock, metrics: EngineMetrics,
        progress: Progress, queue_batches: int, batch_max: int, max_backoff_ms: int,
        queue_bytes: int = 1 << 62,
        on_commit: Callable[[CommitOutcome], None],
    ) -> None:
        self._committer = committer
        self._clock = clock
        self._metrics = metrics
        self._progress = progress
        self._batch_max = batch_max
        self._max_backoff_ms = max_backoff_ms
        self._on_commit = on_commit
        # (at most one commit's worth of messages queued: module doc, flow control)
        self.queue = BoundedQueue(queue_batches, queue_bytes, max_messages=batch_max)
        self._stop = threading.Event()
        self._wake = threading.Event()  # clock.wait's event: a FakeClock sets it on advance
        self._thread = threading.Thread(target=self._run, name="delivery", daemon=True)
        self.blocked = False
        metrics.delivery_queue_batches.set_function(lambda: len(self.queue))
        metrics.delivery_queue_messages.set_function(lambda: self.queue.messages)

    def start(self) -> None:
        self._thread.start()

    def put(self, batch: ScanBatch) -> bool:
        """Hand a scan batch over (blocks while the queue is full); False when stopping.

        Fast path: a small batch handed over while nothing is queued or being committed is
        committed at once by the calling scanner, saving a thread hand-off (the latency of
        a steady flow of due messages). Nothing of this shard can be ahead of it, so the
        topic order holds; if that commit fails, the batch is queued and the delivery thread
        retries it with back-off as usual."""
        if len(batch.items) <= INLINE_MAX and self.queue.claim_idle():
            try:
                if self._commit_inline(batch):
                    return True
            finally:
                self.queue.done()
        return self.queue.put(batch)

    def _commit_inline(self, batch: ScanBatch) -> bool:
        try:
            outcome = self._committer.commit_due([batch])
        except Exception as exc:
            self._failed(exc, len(batch.items), 0)  # blocked until the queued retry works
            return False
        self._on_commit(outcome)
        self._progress.commit(1)
        return True

    def stop(self) -> None:
        """Stop taking batches; a commit in progress finishes, a back-off wait is cut short;
        queued batches are dropped (they are still in RocksDB)."""
        self._stop.set()
        self._wake.set()
        dropped = self.queue.close()
        if dropped:
            log.info("delivery stopped with %d scan batches queued: they stay in RocksDB",
                     dropped)
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        backlog = False  # batches were queued when the last commit ended
        while True:
            first = self.queue.get()
            if first is None:
                return
            batches = [first]
            count = len(first.items)
            size = batch_bytes(first)
            # the first batch after a pause goes alone (module doc); 200 k due at once, in
            # process: the first message in the log 15-27 ms after due instead of 30-53
            while backlog and count < self._batch_max and size < COMMIT_BYTES_MAX:
                more = self.queue.get_nowait()
                if more is None:
                    break
                batches.append(more)
                count += len(more.items)
                size += batch_bytes(more)
            try:
                if not self._commit(batches):
                    return
            finally:
                self.queue.done()
            backlog = len(self.queue) > 0
            if backlog:  # in a burst: let the consumers woken by this commit run first
                yield_gil()

    def _commit(self, batches: list[ScanBatch]) -> bool:
        """Commit, retrying with back-off until it works (True) or the stage stops (False)."""
        attempt = 0
        while True:
            try:
                outcome = self._committer.commit_due(batches)
                break
            except Exception as exc:
                attempt += 1
                backoff = min(attempt * 100, self._max_backoff_ms)
                self._failed(exc, sum(len(b.items) for b in batches), backoff)
                if not self._sleep(backoff):
                    return False
        if self.blocked:
            self.blocked = False
            self._metrics.blocked.set(0)
            log.info("delivery recovered after %d failed attempts", attempt)
        self._on_commit(outcome)
        self._progress.commit(len(batches))
        return True

    def _failed(self, exc: Exception, messages: int, backoff_ms: int) -> None:
        if not self.blocked:  # first: whoever sees the retry counted sees "not ready"
            self.blocked = True
            self._metrics.blocked.set(1)
        self._metrics.retries.inc()
        self._metrics.storage_errors.inc()
        log.warning("delivery of %d messages failed, retrying in %d ms: %s", messages,
                    backoff_ms, exc)

    def _sleep(self, ms: int) -> bool:
        """Wait ``ms`` on the engine clock; False when stopped meanwhile."""
        deadline = self._clock.now_ms() + ms
        while not self._stop.is_set():
            if self._clock.now_ms() >= deadline:
                return True
            self._wake.clear()
            if self._stop.is_set():  # stop() sets _stop before _wake: no lost wake-up
                break
            self._clock.wait(self._wake, deadline)
        return False
