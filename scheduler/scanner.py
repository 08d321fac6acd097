"""Scanners: one thread per timer shard, handing due key ranges to the delivery stage.

Each shard's state is shared with the send and cancel paths and guarded by the shard's lock:

- ``frontier_key``: every key of the shard below it has been handed to delivery. A scan
  reads [frontier, time_bound(now + 1)) (at most ``scan_batch_size`` keys) and moves the
  frontier to its end, all under the lock.
- The watermark race. A send whose key falls below the frontier would be stranded (the
  scanner has passed it) or, worse, taken for delivered once the frontier is persisted
  (every key below a persisted frontier counts as delivered, and the clean-up of
  scheduler/maintenance.py deletes it). So the send path decides under the same lock: a
  key below the frontier is already due (its deliverAt <= the time of that scan <= now)
  and goes straight to the log through the commit path; any other key is written while the
  lock is held, so the next scan sees it. Hence nothing new ever lands inside a scanned
  range: what lies below a committed frontier is exactly what was delivered (or cancelled).
- ``wake_at``: when the idle scanner will next look (the first pending key), or None. A send
  of an earlier key lowers it and sets ``wake``; the scanner clears ``wake`` under the lock
  before it looks, so a wake-up cannot be lost. Sleeping is ``clock.wait(wake, wake_at)``:
  no fixed poll, and a FakeClock wakes it when a test advances time.
- ``covered_ms``: every key with deliverAt <= covered_ms has been handed on (used by
  ``Broker.drain`` and the watermark-lag metric).
- Pacing: after a scan that found everything due, the next one starts no sooner than
  ``interval_ms`` of real time after it began. Under a steady flow of keys due on distinct
  milliseconds (2 k msg/s spread over time: ~860 instants a second), each scan would
  otherwise commit a handful of messages and wake every long-polling consumer: ~1000
  commits, pulls and offset commits a second, the fixed costs of which were most of the
  server's CPU. Pacing bounds that to 1000 / interval_ms a second at the price of at most
  ``interval_ms`` of lateness; a full batch is still followed by the next scan at once. Real
  time, not the engine clock: it bounds work per second of CPU, and a FakeClock that stands
  still in a test must not stall delivery. The idle scanner sleeps once per scan: until the
  next key or the end of the pause, whichever is later (``clock.wait(..., not_before=)``).
- The pause ends on a millisecond boundary of the epoch clock: ``interval_ms`` after the
  boundary the scan began in (so a little less than ``interval_ms`` of real time). deliverAt
  counts whole milliseconds, and a scan reads every key due by the millisecond it runs in: a
  scan at T.000 catches what fell due at T at once, one at T.999 holds it back 0.999 ms and
  catches nothing more. Paused from wherever the last scan happened to begin, the lateness
  of a steady flow was spread evenly over [0, interval_ms); on the boundaries it is a whole
  number of ms below ``interval_ms``: at 4 ms, p99 3.7 instead of 4.5 ms at the same scans a
  second (W3 of bench/peers, docs/performance.md at f86b3f2, section 14).
- The default interval (scheduler/config.py, 2 ms) is W3's trade of lateness against CPU,
  measured with ``python -m bench.peers.tradeoff`` (docs/performance.md, W3).
- Read-ahead (scheduler/prefetch.py): a scanner about to sleep until a key due at least
  ``PREFETCH_MIN_GAP_MS`` away wakes ``prefetch_ms`` before it instead, reads the keys due
  by then + ``prefetch_ms`` into ``ShardState.prefetch`` (a chunk at a time, the lock let go
  between chunks) and sleeps on until the due instant, when the scan takes them from there.
  Every write or delete of a timer key calls ``ShardState.touched`` under the lock, which
  cuts the read-ahead at that key.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from scheduler.clock import Clock, precise_timers
from scheduler.committer import ScanBatch, Split
from scheduler.metrics import EngineMetrics
from scheduler.prefetch import PREFETCH_MIN_GAP_MS, Prefetch
from scheduler.timer_index import TimerIndex
from storage.constants import timer_cf
from storage.keys import MAX_U64, time_bound, unpack_u64
from storage.rocks import RocksStore

log = logging.getLogger(__name__)

NOTHING_PENDING = MAX_U64  # covered_ms of a shard with no pending key at all
#: mean bytes of a scan's values from which the shard's next scan reads without filling
#: RocksDB's block cache (``Scanner.step``)
LARGE_VALUE_BYTES = 4096


def _large(items: list[tuple[bytes, bytes]]) -> bool:
    """Whether a read's values are large: the first, middle and last value's mean (as
    delivery's batch_bytes estimates) is ``LARGE_VALUE_BYTES`` or more."""
    return (len(items[0][1]) + len(items[len(items) // 2][1])
            + len(items[-1][1])) >= 3 * LARGE_VALUE_BYTES


class ShardState:
    def __init__(self, shard: int, frontier_key: bytes) -> None:
        """``frontier_key``: the persisted frontier (TimerIndex.frontier)."""
        self.shard = shard
        self.cf = timer_cf(shard)
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.frontier_key = frontier_key
        self.wake_at: int | None = None
        self.covered_ms = unpack_u64(frontier_key) - 1
        self.prefetch: Prefetch | None = None  # what the scanner read ahead (prefetch.py)

    def below_frontier(self, timer_key: bytes) -> bool:
        """True when the scanner has passed this key (lock held)."""
        return timer_key < self.frontier_key

    def touched(self, timer_key: bytes) -> None:
        """A timer key of this shard is being written or deleted (lock held): a read-ahead
        that covers it keeps only what lies below it (scheduler/prefetch.py)."""
        prefetch = self.prefetch
        if prefetch is not None and prefetch.truncate(timer_key) and not prefetch:
            self.prefetch = None

    def note_scheduled(self, timer_key: bytes) -> None:
        """``timer_key`` (the first of a write) was just written (lock held): wake the
        scanner if it sleeps past its time."""
        self.touched(timer_key)
        deliver_at = unpack_u64(timer_key)
        if self.wake_at is None or deliver_at < self.wake_at:
            self.wake_at = deliver_at
            self.covered_ms = min(self.covered_ms, deliver_at - 1)
            self.wake.set()


class Progress:
    """Batches handed to delivery vs. committed, for ``Broker.drain``."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.handed = 0
        self.committed = 0

    def hand(self) -> None:
        with self.cond:
            self.handed += 1

    def commit(self, batches: int) -> None:
        with self.cond:
            self.committed += batches
            self.cond.notify_all()

    def notify(self) -> None:
        with self.cond:
            self.cond.notify_all()


class Scanner(threading.Thread):
    def __init__(
        self, *, state: ShardState, store: RocksStore, clock: Clock, batch_size: int,
        hand_off: Callable[[ScanBatch], bool], progress: Progress, metrics: EngineMetrics,
        stopping: threading.Event, max_backoff_ms: int = 60_000, interval_ms: int = 0,
        batch_bytes: int | None = None, prefetch_ms: int = 0, prefetch_messages: int = 0,
        prefetch_bytes: int = 0,
    ) -> None:
        """``batch_size`` keys a scan at most, and with ``batch_bytes``, of large values only
        as many as add up to about that many bytes (the first commit of a burst of 16 KiB
        bodies: 256 of them, not 1000: docs/performance.md, Large bodies). ``prefetch_ms``:
        the read-ahead's lead (0: none), of at most ``prefetch_messages`` keys and
        ``prefetch_bytes`` of values (module doc)."""
        super().__init__(name=f"scanner-{state.shard}", daemon=True)
        self.state = state
        self._timers = TimerIndex(store)
        self._clock = clock
        self._batch_size = batch_size
        self._batch_bytes = batch_bytes
        self._hand_off = hand_off
        self._progress = progress
        self._metrics = metrics
        self._stopping = stopping
        self._max_backoff_ms = max_backoff_ms
        self._interval_ms = interval_ms
        self._prefetch_ms = prefetch_ms if prefetch_messages > 0 and prefetch_bytes > 0 else 0
        self._prefetch_messages = prefetch_messages
        self._prefetch_bytes = prefetch_bytes
        self._prefetched_for: int | None = None  # the due instant of the last read-ahead
        #: the last scan's values were large: the next one reads around the block cache
        #: (each due key is read once; 16 KiB bodies filled the cache and paid an insert and
        #: an eviction each, while small values' scans are cheaper with it: RocksStore.
        #: read_range_next)
        self.large_values = False
        #: the last read stopped at its limit, its range not all read (a burst, a backlog):
        #: the next one reads on through data blocks no scan reads again, around the block
        #: cache too (1 M due at once, in process: the reads 0.51-0.61 -> 0.37-0.44 s, CPU
        #: from T 1.65-1.84 -> 1.29-1.56 s, the cache not filled by the burst: the commits are
        #: cheaper too; docs/performance.md, W2). A steady flow's scans read everything due
        #: each time: through the cache, as before
        self.sweeping = False

    def run(self) -> None:
        precise_timers()  # it wakes at due instants: the default 50 µs slack is lateness
        failures = 0
        paced_until = 0.0  # monotonic time before which no scan starts
        while not self._stopping.is_set():
            pause = paced_until - time.monotonic()
            if pause > 0 and self._stopping.wait(pause):
                return
            started, started_ns = time.monotonic(), time.time_ns()
            try:
                found = self.step()
                failures = 0
            except Exception:  # a failed scan is retried with back-off, never fatal
                failures += 1
                self._metrics.storage_errors.inc()
                log.exception("scan of timer shard %d failed (%d in a row)", self.state.shard,
                              failures)
                backoff = min(failures * 100, self._max_backoff_ms)
                self._clock.wait(self.state.wake, self._clock.now_ms() + backoff)
                continue
            if found is None:
                return  # the hand-off refused: shutting down
            if not found and not self._stopping.is_set():  # (stop sets it, then wake)
                paced_until = self._pause_end(started, started_ns)
                if self._prefetch_ms and self._read_ahead(paced_until):
                    continue  # woken before the read-ahead's time: scan again
                # one sleep until the next key or the end of the pause, whichever is later
                # (a steady flow has its next key due within the pause: sleeping until the
                # key and then the rest of the pause woke this thread twice a scan, and on
                # these VMs a thread pays for each wake-up with cold caches)
                self._clock.wait(self.state.wake, self.state.wake_at, not_before=paced_until)

    def _read_ahead(self, paced_until: float) -> bool:
        """Before sleeping until the next key: when it is due ``PREFETCH_MIN_GAP_MS`` or more
        from now, wake ``prefetch_ms`` before it (True: woken sooner, by a send or a stop)
        and read what is due by then ahead (module doc). Once per due instant."""
        st = self.state
        target = st.wake_at  # (a hint read without the lock: a send that lowers it wakes us)
        if target is None or target == self._prefetched_for or st.prefetch is not None:
            return False
        now = self._clock.now_ms()
        if target - now < PREFETCH_MIN_GAP_MS:
            return False
        if target - now > self._prefetch_ms and self._clock.wait(
                st.wake, target - self._prefetch_ms, not_before=paced_until):
            return True
        self._prefetched_for = target
        try:
            self.prefetch(target)
        except Exception:  # the scan at the due time reads, and retries, as it would have
            with st.lock:
                st.prefetch = None
            self._metrics.storage_errors.inc()
            log.exception("read-ahead of timer shard %d failed", st.shard)
        return False

    def prefetch(self, target: int) -> None:
        """Read the keys due by ``target`` + ``prefetch_ms`` ahead into ``state.prefetch``,
        ``batch_size`` at a time, each chunk under the shard's lock (sends and cancels wait
        for one chunk at most); stops at the bounds, at ``target`` or on stop."""
        st = self.state
        bound = time_bound(target + self._prefetch_ms)
        while not self._stopping.is_set():
            with st.lock:
                pre = st.prefetch
                if pre is None:
                    pre = st.prefetch = Prefetch(st.frontier_key)
                room = self._prefetch_messages - len(pre)
                budget = self._prefetch_bytes - pre.bytes
                if (room <= 0 or budget <= 0 or pre.end >= bound
                        or self._clock.now_ms() >= target):
                    if not pre:
                        st.prefetch = None
                    break
                limit = min(room, self._batch_size)
                max_bytes = budget if self._batch_bytes is None else min(budget,
                                                                          self._batch_bytes)
                items, _, done = self._timers.read_due(st.cf, pre.end, bound, limit,
                                                       fill_cache=self._fill_cache(),
                                                       max_bytes=max_bytes)
                self.sweeping = not done
                if items and _large(items):
                    # large values are read when due, as before: their drain is bound by
                    # the bytes (docs/performance.md, Large bodies), and reading 16 KiB
                    # bodies ahead tripled a 20 k burst's drain (0.8-0.9 -> 2.3-2.8 s)
                    if not pre:
                        st.prefetch = None
                    break
                # (done: all of [pre.end, bound) read)
                pre.extend(items, bound if done else items[-1][0] + b"\x00")
                self._metrics.scan_prefetched.inc(len(items))
                if not pre:
                    st.prefetch = None
                if done:
                    break
            time.sleep(0)  # (the lock let go: a send waiting for it takes the GIL now)

    def _pause_end(self, started: float, started_ns: int) -> float:
        """When the pause after a scan that began at ``started`` (``time.monotonic()``;
        ``started_ns``: ``time.time_ns()`` read with it) ends: at the millisecond boundary
        ``interval_ms`` after the one the scan began in, on the epoch clock deliverAt counts
        in (module doc, pacing)."""
        if not self._interval_ms:
            return started
        boundary_ns = (started_ns // 1_000_000 + self._interval_ms) * 1_000_000
        return started + (boundary_ns - started_ns) / 1e9

    def step(self) -> bool | None:
        """Scan once. True: handed a full batch on (scan again at once); False: everything
        due is handed on (sleep until ``wake_at``); None: the hand-off was refused.

        One RocksDB iterator per step: it reads the due keys and, when they are all read,
        the first key after them, which is when to look next."""
        st = self.state
        limit = self._batch_size
        batch = None
        with st.lock:  # scan and frontier move are atomic w.r.t. the send path
            st.wake.clear()
            now = self._clock.now_ms()
            start = st.frontier_key
            end = time_bound(now + 1)
            items, after, complete, split = self._read(start, end, limit)
            self.sweeping = not complete
            if complete:
                st.frontier_key = max(start, end)
                # sends of an earlier key lower it (note_scheduled)
                st.wake_at = None if after is None else unpack_u64(after)
            else:
                st.frontier_key = items[-1][0] + b"\x00"
            pre = st.prefetch
            if pre is not None:
                if pre:
                    pre.advance(st.frontier_key)
                else:
                    st.prefetch = None
            if items:
                batch = ScanBatch(shard=st.shard, start=start, end=st.frontier_key, items=items,
                                  split=split)
            else:
                self._set_covered()
        if batch is None:
            self._progress.notify()
            return False
        # (the first, middle and last value's mean, as delivery's batch_bytes estimates)
        self.large_values = _large(items)
        self._metrics.scan_batch_size.observe(len(items))
        self._progress.hand()
        if not self._hand_off(batch):
            return None
        if not complete:
            return True
        with st.lock:  # everything due at ``now`` is handed on
            self._set_covered()
        self._progress.notify()
        return False

    def _read(self, start: bytes, end: bytes, limit: int,
              ) -> tuple[list[tuple[bytes, bytes]], bytes | None, bool, Split | None]:
        """A scan's read of [start, end) (lock held): from the read-ahead as far as it goes,
        then from RocksDB (TimerIndex.read_due's items, after and complete either way, and
        the columns of what came from the read-ahead alone, if it made them:
        ScanBatch.split)."""
        st = self.state
        pre = st.prefetch
        if pre is not None and pre.start != start:  # (never: only scans move the frontier)
            pre = st.prefetch = None
        try:
            if pre is not None:
                items, after, more = pre.take(end, limit, self._batch_bytes)
                split = pre.split()
                if not more:  # (take names the next key only when it read all of the range)
                    return items, after, after is not None, split
                rest, after, complete = self._timers.read_due(
                    st.cf, pre.end, end, limit - len(items), fill_cache=self._fill_cache(),
                    max_bytes=self._batch_bytes)
                st.prefetch = None  # (all taken)
                if rest:
                    return items + rest, after, complete, None
                return items, after, complete, split
            items, after, complete = self._timers.read_due(st.cf, start, end, limit,
                                                           fill_cache=self._fill_cache(),
                                                           max_bytes=self._batch_bytes)
            return items, after, complete, None
        except BaseException:
            st.prefetch = None  # (taken from, the frontier not moved: read it all again)
            raise

    def _fill_cache(self) -> bool:
        """Whether the next read puts the data blocks it reads into RocksDB's block cache:
        not after a scan of large values or a read its limit cut (``large_values``,
        ``sweeping``)."""
        return not (self.large_values or self.sweeping)

    def _set_covered(self) -> None:
        """covered_ms: just before the first pending key (``wake_at``); lock held. Only once
        the scanned keys are handed on (``Broker.drain`` reads it with the batch counts)."""
        st = self.state
        st.covered_ms = NOTHING_PENDING if st.wake_at is None else st.wake_at - 1

    def lag_ms(self, now_ms: int) -> int:
        covered = self.state.covered_ms
        return 0 if covered >= now_ms else now_ms - covered
