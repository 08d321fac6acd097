"""Background upkeep on the engine clock: status retention, the delivered prefix, and the
CommitLog's retention (scheduler/retention.py: ``LogRetention.run_once`` each round).

- Retention: a final state (DELIVERED, CANCELLED, ...) stays readable for ``retention_ms``.
  Whoever writes a final state also writes ``expiry`` key = 8-byte expiresAt + topic NUL
  msgId (a delivery commit writes ONE entry for all its messages: expiresAt, NUL 0x01, its
  log position, with their index keys in the value); this thread deletes the index entries
  whose expiry is due, oldest first, in bounded batches, sleeping until the next expiry
  (never a fixed poll). An index entry that is no longer final (the key was re-used after an
  earlier clean-up) is left alone; "final" as the entry stands (a SCHEDULED entry a scan
  delivered is DELIVERED, scheduler/ledger.py), and the delivery ledger's entries of commits
  older than the retention go with them. An expiry value, when not empty, is a tx column-family
  key to delete as well (a finished transaction's entry; its expiry key has an index part
  starting with NUL, so no index key).
- Delivered prefix: delivery only moves a shard's persisted frontier; the timer keys below
  it are dead but still stored (every reader starts at the frontier). Once a shard has had
  ``compact_after_deletes`` keys delivered since its last clean-up, or
  ``cleanup_interval_ms`` after the first of them, this thread runs ``cleanup_prefix``
  (ONE delete_range + compact_range below the persisted watermark), so neither dead keys
  nor range tombstones pile up at the head of the key space. Compaction releases the GIL,
  so it costs the delivery thread little.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from scheduler.clock import Clock
from scheduler.codec import decode_keys
from scheduler.intake import EXPIRY_GROUP_MARK
from scheduler.ledger import DeliveryLedger
from scheduler.metrics import EngineMetrics
from scheduler.retention import LogRetention
from scheduler.timer_index import TimerIndex
from storage.constants import CF_EXPIRY, CF_INDEX, CF_TX
from storage.errors import InvalidArgument
from storage.keys import MAX_U64, decode_index_key, time_bound, unpack_u64
from storage.records import FINAL_STATUSES, decode_index
from storage.rocks import RocksStore

log = logging.getLogger(__name__)

EXPIRY_BATCH = 1000
ROUND_MS = 1000  # rounds of this thread start at least this far apart (or cleanup_interval_ms)


class Maintenance(threading.Thread):
    def __init__(
        self, *, store: RocksStore, ledger: DeliveryLedger, clock: Clock,
        metrics: EngineMetrics, retention_ms: int, compact_after_deletes: int,
        cleanup_interval_ms: int, retention: LogRetention | None = None,
        fold: Callable[[], int] | None = None,
    ) -> None:
        """``fold``: folds the backlog's count deltas (scheduler/backlog_store.py), each round
        after ``ask``."""
        super().__init__(name="maintenance", daemon=True)
        self._store = store
        self._timers = TimerIndex(store)
        self._ledger = ledger
        self._clock = clock
        self._metrics = metrics
        self._retention_ms = retention_ms
        self._compact_after = compact_after_deletes
        self._cleanup_interval = cleanup_interval_ms
        self._retention = retention  # CommitLog retention (scheduler/retention.py)
        self._fold = fold
        self._fold_asked = fold is not None  # a delta was written since the last fold (or
        #                                     the start read some: fold at the first round)
        self._round_started = 0
        self._round_ms = min(ROUND_MS, cleanup_interval_ms)
        self._expiry_floor = b""  # every expiry key below it was removed (by this thread)
        self._halt = threading.Event()
        self._wake = threading.Event()
        self._asked = False  # a wake-up asked for (not a clock moving)
        self._lock = threading.Lock()
        self._deleted: dict[int, int] = {}  # shard -> keys delivered since its last clean-up
        self._first: dict[int, int] = {}  # shard -> when the first of those was noted (ms)

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()
        if self.is_alive():
            self.join()

    def note_delivered(self, shard: int, count: int) -> None:
        """Delivery removed ``count`` keys of ``shard``; wakes the thread past the threshold."""
        with self._lock:
            total = self._deleted.get(shard, 0) + count
            self._deleted[shard] = total
            first = shard not in self._first
            if first:
                self._first[shard] = self._clock.now_ms()
        if total >= self._compact_after or first:  # first: plan the timed clean-up
            self._asked = True
            self._wake.set()

    def ask(self) -> None:
        """The first count delta since the last fold was written: fold it at the next round
        (at most a ROUND_MS after the last one)."""
        self._fold_asked = True
        self._wake.set()  # (the thread shortens its sleep to the next round, not now)

    def fold_counts(self) -> int:
        """Fold the backlog's count deltas (if asked since the last fold); returns how many."""
        if self._fold is None or not self._fold_asked:
            return 0
        self._fold_asked = False
        return self._fold()

    def run(self) -> None:
        failures = 0
        while not self._halt.is_set():
            self._wake.clear()
            self._asked = False
            if self._halt.is_set():
                return
            try:
                started = self._round_started = self._clock.now_ms()
                self.fold_counts()
                next_at = min(self.expire_due(), self.cleanup_prefixes())
                if self._retention is not None:
                    next_at = min(next_at, self._retention.run_if_due())
                # a steady flow has an expiry due every few ms: one round a ROUND_MS at most
                # (each round scans, and writes its own batch: measured, a round per commit
                # kept this thread at 100 % of a core and grew the heap without bound)
                next_at = max(next_at, started + self._round_ms)
                failures = 0
            except Exception:
                failures += 1
                self._metrics.storage_errors.inc()
                log.exception("maintenance failed (%d in a row)", failures)
                next_at = self._clock.now_ms() + min(failures * 1000, 60_000)
            self._sleep_until(next_at)

    def _sleep_until(self, next_at: int) -> None:
        """Until ``next_at``, or a wake-up someone asked for (``note_delivered``, ``stop``);
        a clock that wakes its waiters whenever it moves (FakeClock) does not start a round
        early."""
        while not self._halt.is_set():
            if self._fold_asked:  # deltas to fold: a round a ROUND_MS after the last one
                next_at = min(next_at, self._round_started + self._round_ms)
            self._clock.wait(self._wake, next_at)
            if self._asked or self._halt.is_set() or self._clock.now_ms() >= next_at:
                return
            self._wake.clear()

    def expire_due(self) -> int:
        """Remove every due expiry; returns when the next one is due (or a bound on it)."""
        store = self._store
        while True:
            now = self._clock.now_ms()
            # from the floor: the keys removed before it are tombstones until a compaction,
            # and a scan from the start of the CF would wade through all of them
            due = list(store.scan(CF_EXPIRY, self._expiry_floor, time_bound(now + 1),
                                  EXPIRY_BATCH))
            if due:
                self._expire(due)
                # (not above a second ago: a key written meanwhile expires in the future,
                # unless the retention is 0, when it may expire now)
                self._expiry_floor = min(due[-1][0] + b"\x00", time_bound(max(now - 1000, 0)))
            if len(due) < EXPIRY_BATCH:
                break
        self._ledger.expire(now - self._retention_ms)
        first = list(store.scan(CF_EXPIRY, self._expiry_floor, None, 1))
        if first:
            return unpack_u64(first[0][0])
        # nothing pending: anything written from now on expires after now + retention
        return min(now + max(self._retention_ms, 1), MAX_U64)

    def _expire(self, due: list[tuple[bytes, bytes]]) -> None:
        """Remove the due expiry entries and what they name, in RocksDB writes of about
        EXPIRY_BATCH index keys (a delivery commit's one entry names all its messages)."""
        keys: list[bytes] = []
        ikeys: list[bytes] = []
        tx_keys: list[bytes] = []
        for key, value in due:
            keys.append(key)
            if key[8:10] == EXPIRY_GROUP_MARK:
                ikeys.extend(decode_keys(value))
            else:
                ikeys.append(key[8:])
                if value:  # a transaction entry (tx CF key) that expires too
                    tx_keys.append(value)
            if len(ikeys) >= EXPIRY_BATCH:
                self._remove(keys, ikeys, tx_keys)
                keys, ikeys, tx_keys = [], [], []
        if keys:
            self._remove(keys, ikeys, tx_keys)

    def _remove(self, keys: list[bytes], ikeys: list[bytes], tx_keys: list[bytes]) -> None:
        """Delete expiry ``keys``, the tx entries, and the index entries still final."""
        store = self._store
        entries = store.multi_get(CF_INDEX, ikeys)
        batch = store.batch()
        batch.delete_many(CF_EXPIRY, keys)
        batch.delete_many(CF_TX, tx_keys)
        final: list[bytes] = []  # what stays are entries no longer final (re-used keys)
        keys_, stored, topics, msg_ids = [], [], [], []
        for ikey, raw in zip(ikeys, entries, strict=True):
            if raw is None:
                continue
            entry, names = decode_index(raw), _names(ikey)
            if names is None:  # (a key the engine never writes): judged as stored
                if entry.status in FINAL_STATUSES:
                    final.append(ikey)
                continue
            keys_.append(ikey)
            stored.append(entry)
            topics.append(names[0])
            msg_ids.append(names[1])
        current = self._ledger.resolve_many(topics, msg_ids, stored)  # as they stand
        final += [ikey for ikey, entry in zip(keys_, current, strict=True)
                  if entry is not None and entry.status in FINAL_STATUSES]
        batch.delete_many(CF_INDEX, final)
        store.write(batch)
        self._metrics.expired.inc(len(final))

    def cleanup_prefixes(self) -> int:
        """Clean the prefixes that are due; returns when the next timed clean-up is due."""
        now = self._clock.now_ms()
        with self._lock:
            ready = [s for s, n in self._deleted.items()
                     if n >= self._compact_after or now >= self._first[s] + self._cleanup_interval]
            for shard in ready:
                del self._deleted[shard], self._first[shard]
            next_at = min((t + self._cleanup_interval for t in self._first.values()),
                          default=MAX_U64)
        for shard in ready:
            watermark = self._timers.cleanup(shard)
            log.debug("cleaned the delivered prefix of shard %d below %d", shard, watermark)
        return next_at


def _names(ikey: bytes) -> tuple[str, str] | None:
    """(topic, msgId) of an index key; None for one that is not (the engine never writes
    one: its entry is left alone)."""
    try:
        return decode_index_key(ikey)
    except InvalidArgument:
        return None
