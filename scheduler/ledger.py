"""The status of a message a scan delivered, derived instead of stored.

A scanner hands on every key of its shard in ``[start, end)``; the delivery commit appends
them to the CommitLog and moves the shard's persisted frontier to ``end`` in the same
RocksDB write (scheduler/committer.py). It does NOT rewrite each message's index entry to
DELIVERED: that was one random memtable insert per message, ~1.1 µs of a drain's ~2.5 µs
(docs/performance.md at f86b3f2, section 13). So an index entry that says ``SCHEDULED`` means:

- delivered, when its timer key (deliverAt + topic + msgId) lies below its shard's
  persisted frontier and it is not parked;
- pending otherwise.

It holds because nothing else leaves a SCHEDULED entry below the frontier: a cancel writes
CANCELLED (and the committer skips a key already handed on), a send due below the frontier
goes to the log at once and writes DELIVERED, a replayed record writes DELIVERED, a redrive
moves a parked message's entry (and key) above the frontier. The one exception is a parked
poison message (scheduler/poison.py): its commit moved the frontier past it, and it waits
under ``META_PARKED_PREFIX`` + its timer key until an operator redrives it.

Every reader of index entries goes through ``resolve`` / ``resolve_many``: the status
answer, cancel (by id, handle or marker), the send path's duplicate answers, and the
retention clean-up (scheduler/maintenance.py); the Spark job applies the same rule to a
snapshot (spark_jobs/sources.py). A reader reads the index entry first and the frontier
after it, so it never calls pending what a commit between the two reads delivered.

The ledger. A status answer carries the message's queue offset, which the index no longer
holds for these messages. Each commit stores, per scan, ``META_LEDGER_PREFIX`` + shard +
the scan's end key -> (log position of the scan's first record, its record count, commit
time): one small entry per scan instead of one per message. The scan that delivered a
message is the first entry of its shard whose end lies above its timer key; its records are
read from the log and the msgId found among them. The maintenance thread drops entries
older than the retention by point deletes (``expire``); a message whose ledger entry or
log segment is gone answers DELIVERED without an offset.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Sequence
from typing import Protocol

import msgspec

from scheduler.timer_index import TimerIndex
from storage.batch import Batch
from storage.constants import CF_META, META_LEDGER_PREFIX, META_PARKED_PREFIX
from storage.errors import HourglassError
from storage.keys import encode_timer_key, topic_shard
from storage.records import IndexEntry, MessageStatus, log_record_head
from storage.rocks import RocksStore

_VALUE = struct.Struct(">QIQ")  # first log position, records, committed at (ms)
_SHARD = struct.Struct(">H")
EXPIRE_SCAN = 1024  # ledger entries read per step of ``expire``


class LogReader(Protocol):
    def iter_from(self, position: int) -> Iterable[tuple[int, bytes]]: ...


def ledger_key(shard: int, end: bytes) -> bytes:
    return META_LEDGER_PREFIX + _SHARD.pack(shard) + end


def _shard_bounds(shard: int) -> tuple[bytes, bytes]:
    prefix = META_LEDGER_PREFIX + _SHARD.pack(shard)
    return prefix, META_LEDGER_PREFIX + _SHARD.pack(shard + 1)


class DeliveryLedger:
    def __init__(self, store: RocksStore, log: LogReader) -> None:
        self._store = store
        self._timers = TimerIndex(store)
        self._log = log
        self._shards = store.timer_shards

    # --- writing (the committer, under the commit lock) ---------------------------------------
    @staticmethod
    def put(batch: Batch, shard: int, end: bytes, first_position: int, records: int,
            now: int) -> None:
        """Note in ``batch`` that the scan of ``shard`` ending at ``end`` delivered
        ``records`` log records from ``first_position`` on."""
        batch.put(CF_META, ledger_key(shard, end), _VALUE.pack(first_position, records, now))

    # --- reading ------------------------------------------------------------------------------
    def resolve(self, topic: str, msg_id: str, entry: IndexEntry | None, *,
                offset: bool = False) -> IndexEntry | None:
        """``entry`` as it stands: a SCHEDULED entry a scan delivered becomes DELIVERED (with
        its queue offset and log position when ``offset`` and the ledger still knows it)."""
        if entry is None or entry.status is not MessageStatus.SCHEDULED:
            return entry
        shard = topic_shard(topic, self._shards)
        timer_key = encode_timer_key(entry.deliver_at, topic, msg_id)
        if not self._delivered(shard, [timer_key])[0]:
            return entry
        found = self._offset(shard, timer_key, topic, msg_id) if offset else None
        return msgspec.structs.replace(
            entry, status=MessageStatus.DELIVERED,
            queue_offset=None if found is None else found[0],
            log_position=None if found is None else found[1])

    def resolve_many(self, topics: Sequence[str], msg_ids: Sequence[str],
                     entries: Sequence[IndexEntry | None]) -> list[IndexEntry | None]:
        """``resolve`` of each (no offsets): one frontier read per shard, one multi-get of
        parked keys."""
        out = list(entries)
        todo: dict[int, list[tuple[int, bytes]]] = {}
        for i, entry in enumerate(entries):
            if entry is not None and entry.status is MessageStatus.SCHEDULED:
                topic = topics[i]
                todo.setdefault(topic_shard(topic, self._shards), []).append(
                    (i, encode_timer_key(entry.deliver_at, topic, msg_ids[i])))
        for shard, items in todo.items():
            delivered = self._delivered(shard, [key for _, key in items])
            for (i, _), yes in zip(items, delivered, strict=True):
                entry = entries[i]
                if yes and entry is not None:
                    out[i] = msgspec.structs.replace(entry, status=MessageStatus.DELIVERED)
        return out

    def _delivered(self, shard: int, timer_keys: Sequence[bytes]) -> list[bool]:
        frontier = self._timers.frontier(shard)  # (after the index entries were read)
        below = [key < frontier for key in timer_keys]
        if any(below):
            parked = self._store.multi_get(CF_META, [META_PARKED_PREFIX + key for key, b
                                                     in zip(timer_keys, below, strict=True) if b])
            marks = iter(parked)
            below = [b and next(marks) is None for b in below]
        return below

    def _offset(self, shard: int, timer_key: bytes, topic: str,
                msg_id: str) -> tuple[int, int] | None:
        """(queue offset, log position) of a message the scan of ``timer_key`` delivered."""
        _, upper = _shard_bounds(shard)
        found = list(self._store.scan(CF_META, ledger_key(shard, timer_key) + b"\x00", upper,
                                      limit=1))
        if not found:
            return None
        first, records, _ = _VALUE.unpack(found[0][1])
        try:
            for position, payload in itertools.islice(self._log.iter_from(first), records):
                head = log_record_head(payload)
                if head.msg_id == msg_id and head.topic == topic:
                    return head.queue_offset, position
        except (HourglassError, OSError):  # its segment is gone (retention) or unreadable
            return None
        return None

    # --- retention (the maintenance thread) -----------------------------------------------------
    def expire(self, before_ms: int) -> int:
        """Drop the entries of commits before ``before_ms`` (their messages' index entries
        have expired with them); returns how many."""
        dropped = 0
        for shard in range(self._shards):
            lower, upper = _shard_bounds(shard)
            limit = 1  # most calls find nothing old yet: the first entry tells
            while True:
                rows = list(self._store.scan(CF_META, lower, upper, limit=limit))
                old = [key for key, value in rows if _VALUE.unpack(value)[2] < before_ms]
                if not old:
                    break
                # committed in key order: the old ones are a prefix of the shard's entries.
                # Point deletes, not a delete_range: a range tombstone per round stays in the
                # memtable until a flush, and every iterator and get of the meta CF pays for
                # each (a RocksDB trap, measured here; and in the retention soak)
                batch = self._store.batch()
                batch.delete_many(CF_META, old)
                self._store.write(batch)
                dropped += len(old)
                if len(old) < len(rows) or len(rows) < limit:
                    break
                limit = EXPIRE_SCAN
        return dropped

    def drop_below(self, batch: Batch, position: int) -> int:
        """Add to ``batch`` the removal of the entries of scans whose records start below the
        log ``position`` (CommitLog retention deleted them: scheduler/retention.py); their
        messages answer DELIVERED without an offset. A shard's entries are in log order, so
        those are a prefix. Returns how many."""
        dropped = 0
        for shard in range(self._shards):
            lower, upper = _shard_bounds(shard)
            start = lower
            while True:
                rows = list(self._store.scan(CF_META, start, upper, limit=EXPIRE_SCAN))
                old = [key for key, value in rows if _VALUE.unpack(value)[0] < position]
                if old:
                    batch.delete_many(CF_META, old)
                    dropped += len(old)
                if len(old) < len(rows) or len(rows) < EXPIRE_SCAN:
                    break
                start = old[-1] + b"\x00"
        return dropped


__all__ = ["DeliveryLedger", "ledger_key"]
