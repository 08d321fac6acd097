"""CommitLog retention: whole old segments are deleted, with everything that points into them.

The log holds only delivered messages (pending ones wait in RocksDB's timer column families,
half messages in ``tx``), so deleting a segment never touches a pending message. What points
into a segment: consume-queue entries (per topic, a prefix of its queue, since a topic's
offsets are given in log order), delivery-ledger entries (scheduler/ledger.py: per shard, a
prefix too) and the committed offsets, acks and leases of consumer groups (these are moved
lazily, on the group's next read: scheduler/groups.py ``catch_up``).

When. A sealed segment (never the last one: appends go there) is due once its newest record
is older than ``commitlog_retention_ms``. Its newest record is not indexed anywhere; the first
record of the next segment was stored after it, so its ``storedAt`` is an upper bound: a
segment is deleted when the first record of the segment after it is older than the
retention (never early; late by at most the time one segment took to fill). Early: while the
data directory's file system is fuller than ``disk_clean_ratio`` (``statvfs``: used /
size, as ``df`` counts it), the oldest sealed segment goes at once, one at a time, each
logged and counted. Never a segment the RocksDB side has not applied entirely (past the
applied position, a restart replays the log).

Order, so that a kill -9 anywhere leaves a store that opens, verifies and answers:

1. one RocksDB write (``RocksStore.write``, where replication hooks): the consume-queue runs
   below the cut are deleted (a run that straddles it is stored again from its first entry
   above), each trimmed topic's new first offset is stored (``META_TOPIC_FIRST_PREFIX``),
   the ledger entries below it are deleted, and ``META_LOG_FIRST_POSITION`` = the cut;
2. the segments are taken out of the CommitLog's lists (appends wait only for that);
3. their files are removed, oldest first, and the directory fsync'ed.

A crash before 1 changes nothing. After 1, nothing in RocksDB points below the cut; the files
still there are deleted on the next start (step 2-3 again from ``META_LOG_FIRST_POSITION``).
Removing oldest first keeps the log a run of whole segments without a gap, which is what the
CommitLog opens. No consume-queue entry ever points into a missing segment.

Readers. Before the write, the topics' first offsets move in memory (``ConsumeQueue
.moved_first``): a reader checks its offset against the first offset AFTER it read the
consume queue (``Broker.read_prevalidated``), so a reader that saw entries gone also sees the new
first offset and answers 410 ``OFFSET_EXPIRED`` instead of skipping silently; a reader that
read positions before the write and the log after step 2 gets ``OffsetExpired`` from the
CommitLog, answered the same way. A mapping is closed one round after its segment left the
lists (``CommitLog.delete_segments``).

Memory. Every round also gives back the pages of the segments nobody wrote or read since the
round before (``CommitLog.release_idle``): the RSS of a server holds the segment being
written and those being read, not every segment of the log.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scheduler.clock import Clock
from scheduler.ledger import DeliveryLedger
from scheduler.metrics import EngineMetrics
from storage.commitlog import CommitLog
from storage.constants import CF_META, META_LOG_FIRST_POSITION
from storage.consume_queue import ConsumeQueue
from storage.errors import HourglassError
from storage.keys import MAX_U64, pack_u64, unpack_u64
from storage.records import decode_log_record
from storage.rocks import RocksStore

log = logging.getLogger(__name__)

TOPICS_PAGE = 1000  # topics listed per seek page while trimming
IDLE_CHECK_MS = 10_000  # longest sleep between rounds (disk ratio, idle pages); shorter
#                        when cleanup_interval_ms is


@dataclass(frozen=True, slots=True)
class Deletion:
    """One deletion: the log positions [first, cut) and why."""

    first: int
    cut: int
    segments: int
    reason: str  # "retention" | "disk"
    topics: dict[str, int]  # topic -> its new first offset


def disk_used_ratio(path: Path) -> float:
    """Used / size of the file system holding ``path``, as ``df`` counts it (blocks kept for
    root count as used)."""
    st = os.statvfs(path)
    if not st.f_blocks:
        return 0.0
    return 1.0 - st.f_bavail / st.f_blocks


class LogRetention:
    def __init__(
        self, *, store: RocksStore, log: CommitLog, queues: ConsumeQueue,
        ledger: DeliveryLedger, clock: Clock, metrics: EngineMetrics, retention_ms: int,
        disk_clean_ratio: float, data_dir: Path, applied: Callable[[], int],
        used_ratio: Callable[[Path], float] = disk_used_ratio,
        interval_ms: int = IDLE_CHECK_MS,
    ) -> None:
        self._store = store
        self._log = log
        self._queues = queues
        self._ledger = ledger
        self._clock = clock
        self._metrics = metrics
        self._retention_ms = retention_ms
        self._clean_ratio = disk_clean_ratio
        self._data_dir = data_dir
        self._applied = applied
        self._used_ratio = used_ratio
        self._interval_ms = max(1, min(interval_ms, IDLE_CHECK_MS))
        self.deletions: list[Deletion] = []  # the last few (tests, the log line)
        self._lock = threading.RLock()  # one round at a time (the upkeep thread, tests)
        self._next_at = 0  # when ``run_if_due`` runs the next round

    # --- the round ------------------------------------------------------------------------
    def run_if_due(self) -> int:
        """``run_once`` when the round it planned is due (the upkeep thread asks every
        round of its own); returns when the next one is due."""
        if self._clock.now_ms() >= self._next_at:
            self._next_at = self.run_once()
        return self._next_at

    def run_once(self) -> int:
        """Delete what is due (by age, then by disk use); returns when the next round is
        due (engine ms)."""
        with self._lock:
            return self._run_once()

    def _run_once(self) -> int:
        self.resume()
        now = self._clock.now_ms()
        next_at = min(now + self._interval_ms, MAX_U64)
        cut, due_at = self._cut_by_age(now)
        if cut > self._log.first_position:
            self.delete_below(cut, "retention")
        if due_at is not None:
            next_at = min(next_at, due_at)
        while self._over_ratio():
            sealed = self._deletable()
            if not sealed:
                log.warning("the data directory's file system is %.0f %% full (above "
                            "disk_clean_ratio %.2f) and no CommitLog segment is left to "
                            "delete", 100 * self._ratio(), self._clean_ratio)
                break
            self.delete_below(sealed[0][1], "disk")
        self._log.release_idle()
        return next_at

    def resume(self) -> None:
        """Finish a deletion a crash interrupted after its RocksDB write (steps 2-3)."""
        raw = self._store.get(CF_META, META_LOG_FIRST_POSITION)
        stored = 0 if raw is None else unpack_u64(raw)
        if stored > self._log.first_position:
            dropped = self._log.drop_segments_below(stored)
            self._log.delete_segments(dropped)
            if dropped:
                log.info("removed %d CommitLog segment(s) below %d, deleted before a restart",
                         len(dropped), stored)

    def _deletable(self) -> list[tuple[int, int]]:
        """(base, end) of the sealed segments RocksDB has applied entirely, oldest first."""
        applied = self._applied()
        return [(base, end) for base, end in self._log.sealed_segments() if end <= applied]

    def _cut_by_age(self, now: int) -> tuple[int, int | None]:
        """(where the log may start: the end of the last segment due, when the next one is
        due, or None when none is sealed)."""
        cut = self._log.first_position
        for _, end in self._deletable():
            stored_at = self._stored_at(end)
            if stored_at is None:
                return cut, None
            due = stored_at + self._retention_ms
            if due > now:
                return cut, due
            cut = end
        return cut, None

    def _stored_at(self, position: int) -> int | None:
        """storedAt of the record at ``position`` (the first of a segment), or None."""
        try:
            return decode_log_record(self._log.read(position)).stored_at
        except (HourglassError, ValueError):
            return None

    def _ratio(self) -> float:
        try:
            return self._used_ratio(self._data_dir)
        except OSError:
            return 0.0

    def _over_ratio(self) -> bool:
        return self._clean_ratio < 1.0 and self._ratio() > self._clean_ratio

    # --- deleting -----------------------------------------------------------------------------
    def delete_below(self, cut: int, reason: str) -> Deletion:
        """Delete every segment that ends at or below ``cut`` (module doc: the order)."""
        with self._lock:
            return self._delete_below(cut, reason)

    def _delete_below(self, cut: int, reason: str) -> Deletion:
        first = self._log.first_position
        queues = self._queues
        batch = self._store.batch()
        topics: dict[str, int] = {}
        after: str | None = None
        while True:
            page = queues.topics(after, TOPICS_PAGE)
            for topic in page:
                moved = queues.trim_topic(batch, topic, cut)
                if moved is not None:
                    topics[topic] = moved
            if len(page) < TOPICS_PAGE:
                break
            after = page[-1]
        ledger = self._ledger.drop_below(batch, cut)
        batch.put(CF_META, META_LOG_FIRST_POSITION, pack_u64(cut))
        for topic, moved in topics.items():  # before the write: module doc, "Readers"
            queues.moved_first(topic, moved)
        self._store.write(batch)
        dropped = self._log.drop_segments_below(cut)
        self._log.delete_segments(dropped)
        size = sum(seg.size for seg in dropped)
        deletion = Deletion(first=first, cut=cut, segments=len(dropped), reason=reason,
                            topics=topics)
        self.deletions = [*self.deletions[-15:], deletion]
        m = self._metrics
        m.log_segments_deleted.labels(reason).inc(len(dropped))
        m.log_bytes_deleted.labels(reason).inc(size)
        if reason == "disk":
            m.log_early_deletions.inc()
            log.warning(
                "disk above disk_clean_ratio %.2f: deleted %d CommitLog segment(s) early, "
                "positions [%d, %d), %d bytes, %d ledger entries; first offsets now %s",
                self._clean_ratio, len(dropped), first, cut, size, ledger, _brief(topics))
        else:
            log.info("retention: deleted %d CommitLog segment(s), positions [%d, %d), %d bytes;"
                     " first offsets now %s", len(dropped), first, cut, size, _brief(topics))
        return deletion


def _brief(topics: dict[str, int], most: int = 10) -> str:
    shown = ", ".join(f"{t}={o}" for t, o in list(topics.items())[:most])
    more = len(topics) - most
    return "{" + shown + (f", ... {more} more" if more > 0 else "") + "}"


__all__ = ["Deletion", "LogRetention", "disk_used_ratio"]
