"""The exactly-once hand-off: CommitLog append, then ONE RocksDB write.

Every message reaches the log through this module, whether it was due on arrival (the send
path, synchronously) or found due by a scanner (the delivery stage):

1. under the commit lock, drop what must not be delivered (the *skip set*, below);
2. assign each message its topic's next queue offset (in memory) and append the batch to the
   CommitLog: each record carries topic, msgId, queue offset and deliverAt;
3. commit ONE RocksDB batch: the shards' new watermarks, consume-queue entries, one ledger
   entry per scan (where its records went; the index entries stay SCHEDULED: below the
   watermark that means delivered, scheduler/ledger.py), one expiry entry naming them all
   for the retention clean-up, and the applied log position; messages due on arrival write
   their index entries DELIVERED instead. The delivered timer keys are NOT deleted here:
   every key of a shard below its persisted watermark is delivered (or cancelled) by
   definition, every reader of the timer CFs starts at the watermark, and
   scheduler/maintenance.py removes the dead prefix now and then with one ``delete_range`` +
   compaction. One range tombstone per commit (up to ~1000 a second at a steady rate) made
   every new RocksDB iterator pay for all of them until the next flush (measured:
   0.9 ms each with 5000); point deletes would cost a tombstone and ~0.3 µs per message.

A crash between 2 and 3 leaves records in the log that RocksDB does not know; ``replay``
applies every record past the applied position (timer key re-derived from deliverAt, topic
and msgId; consume-queue entry at the record's own queue offset; index -> DELIVERED), which
is idempotent. It runs on start, and also at run time: a failed step 3 sets
``needs_replay`` and the next commit, cancel or send replays before it looks at anything, so
a retried batch never appends a message twice.

All or nothing. A send batch that mixes due-now and scheduled messages stores the scheduled
ones in the same RocksDB write that commits the due-now ones' log records, so that one write
decides the whole batch. Replaying its log records after that write failed would deliver the
due-now half alone; so those records carry ``FLAG_BATCH`` and are never replayed: a failed
write revokes them from the log at once (``CommitLog.revoke``, under the commit lock, where
nobody else appends), and a replay (after a crash between the append and the write, or when
the revoke failed) skips them and revokes them if they are the log's tail, which they are
(every append is preceded by a replay, so past the applied position there is only the last
append). The applied position moves in the same atomic write as the batch, so a record past
it belongs to a write that never landed.

The skip set. Delivery does not read the index to learn whether a scanned message is still
wanted (that multi-get would cost more than the rest of the commit). Instead, a cancel of a
message the scanner may already have handed on (its key lies below the shard's scan
frontier) adds the key to the skip set, under the same locks, and so does a replay for the
keys it delivered. A batch's skipped keys leave the set only once that batch has been
committed, so a failed attempt retried later still skips them.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from scheduler.backlog_store import BacklogStore
from scheduler.clock import Clock
from scheduler.codec import (
    delivered_index_values,
    encode_keys,
    log_payload,
    log_payloads,
    message_level,
    split_due,
)
from scheduler.intake import PreparedMessage, expiry_group_key, expiry_key, topic_shard
from scheduler.ledger import DeliveryLedger
from scheduler.timer_index import TimerIndex
from storage.constants import CF_EXPIRY, CF_INDEX, CF_META, META_APPLIED_POSITION, timer_cf
from storage.consume_queue import Run
from storage.errors import HourglassError
from storage.keys import encode_timer_key, index_key, pack_u64, unpack_u64
from storage.records import (
    FLAG_BATCH,
    FLAG_IMMEDIATE,
    FLAG_LEVEL_SHIFT,
    IndexEntry,
    LogRecord,
    MessageStatus,
    decode_index,
    decode_log_record,
    encode_index,
)
from storage.rocks import Batch, RocksStore

log = logging.getLogger(__name__)

REPLAY_CHUNK = 4096  # log records per RocksDB batch when replaying


class Log(Protocol):
    """What the engine needs of storage.commitlog.CommitLog (tests wrap it to inject faults)."""

    @property
    def end_position(self) -> int: ...
    def append_batch(self, payloads: Sequence[bytes]) -> list[int]: ...
    def read(self, position: int) -> bytes: ...
    def read_many(self, positions: Sequence[int],
                  max_bytes: int | None = None) -> list[bytes]: ...
    def iter_from(self, position: int) -> Iterable[tuple[int, bytes]]: ...
    def revoke(self, position: int) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class Queues(Protocol):
    """What the engine needs of storage.consume_queue.ConsumeQueue."""

    def put(self, batch: Batch, topic: str, queue_offset: int, position: int,
            size: int) -> None: ...
    def put_many(self, batch: Batch, topic: str,
                 entries: list[tuple[int, int, int]]) -> list[Run]: ...
    def put_run(self, batch: Batch, topic: str, first: int, positions: list[int],
                sizes: list[int]) -> list[Run]: ...
    def end_offset(self, topic: str) -> int: ...
    def landed(self, ends: dict[str, int], runs: Sequence[Run] = ()) -> None: ...
    def forget(self) -> None: ...


#: the columns of scanned (key, value) pairs (codec.split_due): index keys, values,
#: deliverAts, topics (the msgIds stay in the index keys: codec.log_payloads reads them)
Split = tuple[list[bytes], list[bytes], list[int], list[str]]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScanBatch:
    """Due keys a scanner found: every key of ``shard`` in [start, end), in order."""

    shard: int
    start: bytes
    end: bytes
    items: list[tuple[bytes, bytes]]  # (timer key, encoded MessageRecord)
    #: ``items`` already split into columns (a scanner's read-ahead made them before the due
    #: time: scheduler/prefetch.py), or None; whoever changes ``items`` drops it
    split: Split | None = None


@dataclass(slots=True)
class CommitOutcome:
    """What one commit appended."""

    topic_list: list[str] = field(default_factory=list)  # the topic of each appended
    lateness_ms: list[int] = field(default_factory=list)  # of each appended (due on arrival)
    #: how many appended were how late, ms (found due: ``lateness_ms`` stays empty)
    lateness_counts: dict[int, int] = field(default_factory=dict)
    single: str | None = None  # the one topic of them all, if so
    skipped: int = 0
    removed_by_shard: dict[int, int] = field(default_factory=dict)  # timer keys deleted
    values: list[bytes] = field(default_factory=list)  # delivered MessageRecord values (due)
    deliver_ats: list[int] = field(default_factory=list)  # their deliverAt (due)

    @property
    def topics(self) -> set[str]:
        if self.single is not None:
            return {self.single}
        return set(self.topic_list)


class Committer:
    def __init__(
        self, *, store: RocksStore, log: Log, queues: Queues, clock: Clock, retention_ms: int,
        on_replayed: Callable[[list[LogRecord], bool], None] | None = None,
        counts: BacklogStore | None = None,
    ) -> None:
        """``counts``: the backlog's persisted counts; a commit and a replay stage their
        change in their own RocksDB write (scheduler/backlog_store.py)."""
        self.lock = threading.Lock()  # THE commit lock: append + RocksDB commit, cancels
        self._store = store
        self._log = log
        self._queues = queues
        self._clock = clock
        self._retention_ms = retention_ms
        self._on_replayed = on_replayed
        self._counts = counts
        self._offsets: dict[str, int] = {}  # topic -> next queue offset (lazily loaded)
        self._skip: set[bytes] = set()
        self.applied_position = 0
        self.needs_replay = False

    # --- queue offsets ---------------------------------------------------------------------
    def _take_offsets(self, pending: _Appends) -> list[int]:
        """The appends' queue offsets; notes in ``pending.single`` whether they are all of
        one topic (the common case: one range, one consume-queue run)."""
        offsets = self._offsets
        topics = pending.topics
        if topics and topics.count(topics[0]) == len(topics):
            single = pending.single = topics[0]
            nxt = offsets.get(single)
            if nxt is None:
                nxt = self._queues.end_offset(single)
            offsets[single] = nxt + len(topics)
            return list(range(nxt, nxt + len(topics)))
        out = []
        for topic in topics:
            nxt = offsets.get(topic)
            if nxt is None:
                nxt = self._queues.end_offset(topic)
            out.append(nxt)
            offsets[topic] = nxt + 1
        return out

    # --- skip set ------------------------------------------------------------------------------
    def skip(self, timer_key: bytes) -> None:
        """Never deliver the scanned-but-uncommitted message with this key (lock held)."""
        self._skip.add(timer_key)

    # --- recovery ------------------------------------------------------------------------------
    def recover(self) -> list[LogRecord]:
        """On start: apply every log record past the persisted applied position."""
        with self.lock:
            self.applied_position = self._stored_applied()
            end = self._log.end_position
            if self.applied_position > end:
                log.error("applied log position %d is past the log's end %d: the log lost its "
                          "tail (power loss with async flushing?); continuing from the end",
                          self.applied_position, end)
                self._write(self._store.batch())  # RocksDB says so too, from now on
            return self._replay(runtime=False)

    def _stored_applied(self) -> int:
        raw = self._store.get(CF_META, META_APPLIED_POSITION)
        return 0 if raw is None else unpack_u64(raw)

    def replay_if_needed(self) -> None:
        """After a failed RocksDB commit: apply what the log holds first (lock held)."""
        if self.needs_replay:
            self._replay(runtime=True)

    def _replay(self, *, runtime: bool) -> list[LogRecord]:
        try:
            return self._replay_log(runtime=runtime)
        finally:  # it wrote consume-queue entries (some, if it raised)
            self._queues.forget()

    def _replay_log(self, *, runtime: bool) -> list[LogRecord]:
        if runtime:  # a write that raised may have landed all the same: it is not replayed
            stored = self._stored_applied()
            if self.applied_position < stored <= self._log.end_position:
                self.applied_position = stored
        replayed: list[LogRecord] = []
        chunk: list[tuple[int, int, LogRecord]] = []
        dropped = 0
        dead_tail: int | None = None  # where the records of a batch that never committed start
        for position, payload in self._log.iter_from(self.applied_position):
            record = decode_log_record(payload)
            if record.flags & FLAG_BATCH:  # its batch's write never landed: never apply it
                dropped += 1
                if dead_tail is None:
                    dead_tail = position
                continue
            dead_tail = None  # not the tail after all (see the module doc): skipped only
            if len(chunk) >= REPLAY_CHUNK:
                self._apply(chunk, position, runtime)
                replayed.extend(r for _, _, r in chunk)
                chunk = []
            chunk.append((position, len(payload), record))
        if chunk:
            end = self._log.end_position if dead_tail is None else dead_tail
            self._apply(chunk, end, runtime)
            replayed.extend(r for _, _, r in chunk)
        if dropped:
            revoked = dead_tail is not None and self._revoke(dead_tail)
            log.warning("replay skipped %d log record(s) of a send batch whose RocksDB write "
                        "never landed (%s)", dropped,
                        "revoked from the log" if revoked else "left in the log, never applied")
        self.needs_replay = False
        self._offsets.clear()  # reloaded from the consume queues, which now hold everything
        if replayed and self._on_replayed is not None:
            self._on_replayed(replayed, runtime)
        return replayed

    def _apply(self, chunk: list[tuple[int, int, LogRecord]], applied_after: int,
               runtime: bool) -> None:
        store = self._store
        batch = store.batch()
        ikeys = [index_key(r.topic, r.msg_id) for _, _, r in chunk]
        previous = store.multi_get(CF_INDEX, ikeys) if ikeys else []
        skip_keys = []
        gone: list[LogRecord] = []  # scheduled ones: they leave the backlog
        for (position, size, rec), ikey, old in zip(chunk, ikeys, previous, strict=True):
            if not rec.flags & FLAG_IMMEDIATE:
                tkey = encode_timer_key(rec.deliver_at, rec.topic, rec.msg_id)
                batch.delete(timer_cf(topic_shard(rec.topic, store.timer_shards)), tkey)
                skip_keys.append(tkey)
                gone.append(rec)
            self._queues.put(batch, rec.topic, rec.queue_offset, position, size)
            tx_id = None if old is None else decode_index(old).tx_id
            batch.put(CF_INDEX, ikey, encode_index(IndexEntry(
                status=MessageStatus.DELIVERED, deliver_at=rec.deliver_at,
                updated_at=rec.stored_at, queue_offset=rec.queue_offset, log_position=position,
                tx_id=tx_id)))
            batch.put(CF_EXPIRY, expiry_key(rec.stored_at + self._retention_ms, ikey), b"")
        if gone and self._counts is not None:
            self._counts.put_columns(batch, -1, [r.topic for r in gone],
                                     [r.deliver_at for r in gone],
                                     [r.flags >> FLAG_LEVEL_SHIFT for r in gone])
        batch.put(CF_META, META_APPLIED_POSITION, pack_u64(applied_after))
        store.write(batch)
        self.applied_position = applied_after
        if runtime:  # these may sit in a scanned batch that will be retried: never again
            self._skip.update(skip_keys)

    # --- commits ---------------------------------------------------------------------------------
    def commit_due(self, scans: Sequence[ScanBatch],
                   parked: Sequence[tuple[bytes, bytes]] = ()) -> CommitOutcome:
        """Deliver scanned batches (the delivery stage; takes the commit lock). ``parked``:
        (key, value) of poison messages taken out of ``scans`` (scheduler/poison.py): the
        frontier passes them too, so they leave the backlog's counts with this write."""
        with self.lock:
            self.replay_if_needed()
            now = self._clock.now_ms()
            skip = self._skip
            skipped = [key for scan in scans for key, _ in scan.items
                       if key in skip] if skip else []
            # (key, value) -> the columns of the appends, each in one pass (no Python call
            # or append per message: a fifth of this commit's CPU was such appends); split
            # before the due time by the scanner's read-ahead, if it read them
            split: Split
            if skipped:
                split = split_due([kv for scan in scans for kv in scan.items
                                   if kv[0] not in skip])
                counts = [sum(1 for key, _ in scan.items if key not in skip) for scan in scans]
            else:
                split = _columns(scans)
                counts = [len(scan.items) for scan in scans]
            pending = _Appends()
            pending.ikeys, pending.extra, pending.deliver_ats, pending.topics = split
            pending.scans = [(scan.shard, scan.end, n)
                             for scan, n in zip(scans, counts, strict=True)]
            offsets = self._take_offsets(pending)
            try:
                payloads = log_payloads(pending.extra, pending.topics, pending.ikeys, offsets,
                                        pending.deliver_ats, now)
            except BaseException:  # a poison value (scheduler/poison.py): no offset is used
                self._offsets.clear()
                raise
            batch = self._store.batch()
            self._advance_watermarks(batch, scans)
            persisted = self._counts
            if persisted is not None and persisted.enabled:  # what the frontiers pass leaves
                topics, ats, values = pending.topics, pending.deliver_ats, pending.extra
                if parked:
                    topics, ats, values = list(topics), list(ats), list(values)
                    for key, value in parked:  # (a poison key may be malformed)
                        topics.append(key[8:].partition(b"\x00")[0].decode("utf-8", "replace"))
                        ats.append(unpack_u64(key))
                        values.append(value)
                persisted.put_columns(batch, -1, topics, ats, map(_level, values)
                                      if persisted.levels_pending() else ())
            outcome = self._append_and_commit(batch, pending, offsets, payloads, now)
            skip.difference_update(skipped)
            outcome.skipped = len(skipped)
            removed = outcome.removed_by_shard
            for scan in scans:
                removed[scan.shard] = removed.get(scan.shard, 0) + len(scan.items)
            outcome.lateness_counts = _lateness(now, pending.deliver_ats)
            outcome.values = pending.extra
            outcome.deliver_ats = pending.deliver_ats
            return outcome

    def commit_immediate(self, batch: Batch, messages: Sequence[PreparedMessage], *,
                         atomic: bool = False) -> CommitOutcome:
        """Append messages due on arrival and write them with ``batch`` (which may hold the
        caller's own operations, e.g. scheduled siblings of a send batch). Lock held.

        ``atomic``: ``batch`` stores other messages of the same send batch, so the messages
        count only with it: if the write fails they are revoked, never replayed (module doc)."""
        now = self._clock.now_ms()
        flags = FLAG_IMMEDIATE | FLAG_BATCH if atomic else FLAG_IMMEDIATE
        pending = _Appends()
        for m in messages:
            pending.add(m.topic, m.deliver_at, m.index_key, m.tx_id, m)
        offsets = self._take_offsets(pending)
        payloads = [
            log_payload(m.topic, m.msg_id, offset, m.body, m.tags, m.keys, m.properties,
                        m.born_at, m.deliver_at, now, m.flags | flags)
            for m, offset in zip(messages, offsets, strict=True)]
        outcome = self._append_and_commit(batch, pending, offsets, payloads, now, atomic=atomic)
        outcome.lateness_ms = [now - max(m.deliver_at, m.born_at) for m in messages]
        return outcome

    def commit_no_append(self, batch: Batch) -> None:
        """Write ``batch`` under the commit lock with nothing appended (lock held)."""
        self.replay_if_needed()
        self._write(batch)

    @staticmethod
    def _advance_watermarks(batch: Batch, scans: Sequence[ScanBatch]) -> None:
        """Each shard's new watermark: the end of its last scan in ``scans`` (a shard's scans
        are handed on, and so committed, in key order)."""
        ends: dict[int, bytes] = {}
        for scan in scans:
            ends[scan.shard] = scan.end
        for shard, end in ends.items():
            TimerIndex.put_frontier(batch, shard, end)

    def _append_and_commit(self, batch: Batch, pending: _Appends, offsets: list[int],
                           payloads: list[bytes], now: int, *,
                           atomic: bool = False) -> CommitOutcome:
        outcome = CommitOutcome()
        positions: list[int] = []
        if payloads:
            try:
                positions = self._log.append_batch(payloads)
            except BaseException:
                self._offsets.clear()  # offsets handed out for nothing: reload them
                raise
            self.needs_replay = True  # until the write below succeeds
        runs: list[Run] = []
        try:
            if payloads:
                runs = self._add_delivered(batch, pending, offsets, positions, payloads, now,
                                           outcome)
            self._write(batch)
        except BaseException:
            self._queues.forget()  # (the write may have landed)
            if atomic and positions and self._revoke(positions[0]):
                # the log is as it was before the append: nothing to replay
                self.needs_replay = self._log.end_position != self.applied_position
            raise
        if payloads:  # readers' end offsets (ConsumeQueue.end_offset), before any wake-up
            single = pending.single
            self._queues.landed({single: offsets[-1] + 1} if single is not None else
                                {t: self._offsets[t] for t in set(pending.topics)}, runs)
        return outcome

    def _add_delivered(self, batch: Batch, pending: _Appends, offsets: list[int],
                       positions: list[int], payloads: list[bytes], now: int,
                       outcome: CommitOutcome) -> list[Run]:
        """The consume-queue, index (DELIVERED) or ledger, and expiry entries of appended records;
        returns the consume-queue runs stored."""
        topics = pending.topics
        if pending.single is not None:  # one topic: its offsets are one run (_take_offsets)
            runs = self._queues.put_run(batch, pending.single, offsets[0], positions,
                                        list(map(len, payloads)))
        else:
            entries = list(zip(offsets, positions, map(len, payloads), strict=True))
            by_topic: dict[str, list[tuple[int, int, int]]] = {}
            for topic, entry in zip(topics, entries, strict=True):
                by_topic.setdefault(topic, []).append(entry)
            runs = []
            for topic, run in by_topic.items():
                runs += self._queues.put_many(batch, topic, run)
        if pending.scans is None:  # due on arrival: index -> DELIVERED
            batch.put_many(CF_INDEX, zip(pending.ikeys, delivered_index_values(
                pending.deliver_ats, now, offsets, positions, pending.tx_ids), strict=True))
        else:  # found by scans: the frontier says delivered, the ledger where (ledger.py)
            first = 0
            for shard, end, records in pending.scans:
                if records:
                    DeliveryLedger.put(batch, shard, end, positions[first], records, now)
                    first += records
        outcome.topic_list = topics
        outcome.single = pending.single
        # ONE expiry entry for the whole commit (its messages share ``now``), not one each:
        # a put per message now and a delete per message when it expires saved
        batch.put(CF_EXPIRY, expiry_group_key(now + self._retention_ms, positions[0]),
                  encode_keys(pending.ikeys))
        return runs

    def _revoke(self, position: int) -> bool:
        """Take the records of a batch that never committed out of the log (from
        ``position`` to the end). Not if RocksDB's applied position covers them (the write
        raised but landed: the batch is committed, whole). On failure they stay, and
        FLAG_BATCH keeps replay off them."""
        try:
            stored = self._stored_applied()
            if stored > position:
                log.warning("the RocksDB write of a send batch raised but landed: kept whole")
                self.applied_position = max(self.applied_position, stored)
                return False
            self._log.revoke(position)
        except (HourglassError, OSError):
            log.exception("could not revoke the log records of a failed send batch from "
                          "position %d: they stay in the log, never applied", position)
            return False
        self._offsets.clear()  # the revoked records' queue offsets are free again
        return True  # (both callers have the consume queue's end offsets read again)

    def _write(self, batch: Batch) -> None:
        end = self._log.end_position
        if end != self.applied_position:
            batch.put(CF_META, META_APPLIED_POSITION, pack_u64(end))
        self._store.write(batch)
        self.applied_position = end
        self.needs_replay = False


def _columns(scans: Sequence[ScanBatch]) -> Split:
    """The columns of every scan's items: those a read-ahead split already, the rest split
    now (``split_due``)."""
    if len(scans) == 1 and scans[0].split is not None:
        return scans[0].split
    if not any(scan.split is not None for scan in scans):  # one split_due of them all
        return split_due([kv for scan in scans for kv in scan.items])
    out: Split = ([], [], [], [])
    for scan in scans:
        split = scan.split if scan.split is not None else split_due(scan.items)
        for column, more in zip(out, split, strict=True):
            column += more  # type: ignore[operator]
    return out


def _lateness(now: int, deliver_ats: list[int]) -> dict[int, int]:
    """How many of ``deliver_ats`` were how late at ``now`` (ms -> count): the histogram's
    input in one C pass (``Counter``), or none when they are one instant (a burst's)."""
    if not deliver_ats:
        return {}
    first = deliver_ats[0]
    if deliver_ats[-1] == first and deliver_ats.count(first) == len(deliver_ats):
        return {now - first: len(deliver_ats)}
    return {now - at: n for at, n in Counter(deliver_ats).items()}


def _level(value: bytes) -> int:
    """The delay level of a stored value (0 for one that cannot be decoded: a poison one)."""
    try:
        return message_level(value)
    except Exception:
        return 0


class _Appends:
    """Columns of the messages one commit appends (plain lists: no object per message)."""

    __slots__ = ("deliver_ats", "extra", "ikeys", "scans", "single", "topics", "tx_ids")

    def __init__(self) -> None:
        self.topics: list[str] = []
        self.single: str | None = None  # the one topic of them all, if so (_take_offsets)
        self.deliver_ats: list[int] = []
        self.ikeys: list[bytes] = []  # index keys (topic NUL msgId)
        self.tx_ids: list[str | None] = []
        self.extra: list[Any] = []
        self.scans: list[tuple[int, bytes, int]] | None = None  # (shard, end, records) found due

    def add(self, topic: str, deliver_at: int, ikey: bytes, tx_id: str | None,
            extra: Any) -> None:
        self.topics.append(topic)
        self.deliver_ats.append(deliver_at)
        self.ikeys.append(ikey)
        self.tx_ids.append(tx_id)
        self.extra.append(extra)
