"""Poison messages: a due message that cannot be delivered for a reason of its own is parked,
and the rest of its delivery batch goes on.

A reason of its own: its stored value cannot be decoded, or its log record is bigger than a
CommitLog segment (e.g. stored before ``segment_size`` was lowered). The delivery stage's
commit then fails with InvalidArgument or CorruptionError before anything is appended.
``Quarantine.commit_due`` (what the stage calls instead of ``Committer.commit_due``) checks
each message of the failed batches the way the commit encodes it, parks the ones that fail
(``meta`` column family, ``parked/`` + timer key -> [reason, stored value]; one RocksDB
write) and commits the others, whose commit moves the shard's frontier past the parked keys
too (maintenance deletes them with the rest of the dead prefix). A
storage fault (StorageError, OSError) is not a message's: it still blocks delivery and is
retried with back-off, and so is a failure no single message explains.

Parked messages are counted (metric ``hourglass_parked_messages``, ``parked`` in
``/v1/admin/stats``), listed by ``GET /v1/admin/parked`` and handed back to the scheduler by
``POST /v1/admin/parked:redrive`` (once the operator has fixed the cause): each is due again
at once, under a new deliverAt (its index entry follows).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgpack
import msgspec

from scheduler.clock import Clock
from scheduler.codec import log_payload_from_value, message_level
from scheduler.committer import CommitOutcome, Committer, ScanBatch
from scheduler.metrics import EngineMetrics
from scheduler.scanner import ShardState
from storage.constants import CF_INDEX, CF_META, META_PARKED_PREFIX, timer_cf
from storage.errors import CorruptionError, StorageError
from storage.keys import MAX_U64, pack_u64, topic_shard, unpack_u64
from storage.records import MessageStatus, decode_index, encode_index
from storage.rocks import RocksStore

if TYPE_CHECKING:
    from scheduler.backlog import Backlog
    from scheduler.backlog_store import BacklogStore

log = logging.getLogger(__name__)

#: what one message's own fault raises (InvalidArgument, a bad key's UnicodeError: ValueErrors)
MESSAGE_FAULTS = (ValueError, CorruptionError)
_END = META_PARKED_PREFIX[:-1] + bytes([META_PARKED_PREFIX[-1] + 1])


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParkedEntry:
    topic: str
    msg_id: str
    deliver_at: int
    reason: str
    size: int  # bytes of the stored value


def poison_reason(key: bytes, value: bytes, max_payload: int) -> str | None:
    """Why the due message (timer key, stored value) cannot be delivered, or None."""
    try:
        topic, msg_id = _names(key)
        payload = log_payload_from_value(value, topic, msg_id, MAX_U64, unpack_u64(key[:8]),
                                         MAX_U64)  # the widest integers: an upper bound
    except MESSAGE_FAULTS as exc:
        return f"cannot be decoded: {exc}"
    if len(payload) > max_payload:
        return (f"its log record of {len(payload)} bytes exceeds a CommitLog segment "
                f"({max_payload} bytes)")
    return None


def _level(value: bytes) -> int:
    """The delay level of a stored value; 0 when it cannot be decoded."""
    try:
        return message_level(value)
    except Exception:
        return 0


def _names(key: bytes) -> tuple[str, str]:
    """(topic, msgId) of a timer key; ValueError for a malformed one."""
    ikey = key[8:]
    sep = ikey.index(0)
    return ikey[:sep].decode("utf-8"), ikey[sep + 1:].decode("utf-8")


def _label(key: bytes) -> tuple[str, str]:
    """(topic, msgId) of a timer key, readable even when it is malformed."""
    topic, _, msg_id = key[8:].partition(b"\x00")
    return topic.decode("utf-8", "replace"), msg_id.decode("utf-8", "replace")


class Quarantine:
    """``commit_due`` for the delivery stage, parking poison messages; lists and redrives
    them."""

    def __init__(self, *, committer: Committer, store: RocksStore, shards: Sequence[ShardState],
                 max_payload: int, clock: Clock, metrics: EngineMetrics,
                 shard_locks: Callable[[Sequence[int]], contextlib.AbstractContextManager[None]],
                 backlog: Backlog | None = None, counts: BacklogStore | None = None,
                 ) -> None:
        """``backlog``, ``counts``: a parked message leaves the backlog (with the commit that
        moves the frontier past it), a redriven one comes back."""
        self._committer = committer
        self._store = store
        self._shards = shards
        self._max_payload = max_payload
        self._clock = clock
        self._metrics = metrics
        self._shard_locks = shard_locks
        self._backlog = backlog
        self._counts = counts
        self._parked = {key for key, _ in store.scan(CF_META, META_PARKED_PREFIX, _END)}
        metrics.parked.set_function(lambda: len(self._parked))

    def commit_due(self, scans: Sequence[ScanBatch]) -> CommitOutcome:
        try:
            return self._committer.commit_due(scans)
        except MESSAGE_FAULTS as exc:
            poison = {key: (value, reason) for scan in scans for key, value in scan.items
                      if (reason := poison_reason(key, value, self._max_payload)) is not None}
            if not poison:
                raise StorageError(f"delivery failed, and no single message explains it: "
                                   f"{exc}") from exc
        self._park(poison)
        clean = [dataclasses.replace(scan, items=[i for i in scan.items if i[0] not in poison],
                                     split=None) for scan in scans]
        taken = [(key, value) for key, (value, _) in poison.items()]
        outcome = self._committer.commit_due(clean, taken)
        if self._backlog is not None:
            self._backlog.delivered(
                [_label(key)[0] for key, _ in taken],
                [_level(value) for _, value in taken] if self._backlog.has_levels else (),
                deliver_ats=[unpack_u64(key) for key, _ in taken])
        for scan in scans:  # the parked keys are below the new frontier too: count them
            parked = len(scan.items) - sum(1 for i in scan.items if i[0] not in poison)
            removed = outcome.removed_by_shard
            removed[scan.shard] = removed.get(scan.shard, 0) + parked
        return outcome

    def _park(self, poison: dict[bytes, tuple[bytes, str]]) -> None:
        batch = self._store.batch()
        for key, (value, reason) in poison.items():
            batch.put(CF_META, META_PARKED_PREFIX + key, msgpack.packb([reason, value]))
        with self._committer.lock:
            self._committer.commit_no_append(batch)
        new = {META_PARKED_PREFIX + key for key in poison} - self._parked
        self._parked |= new
        self._metrics.pending.dec(len(new))
        for key, (_, reason) in poison.items():
            topic, msg_id = _label(key)
            log.error("message %s/%s parked (POST /v1/admin/parked:redrive hands it back): %s",
                      topic, msg_id, reason)

    def messages(self, limit: int = 1000) -> list[ParkedEntry]:
        out = []
        for pkey, raw in self._store.scan(CF_META, META_PARKED_PREFIX, _END, limit=limit):
            key = pkey[len(META_PARKED_PREFIX):]
            reason, value = msgpack.unpackb(raw)
            topic, msg_id = _label(key)
            out.append(ParkedEntry(topic=topic, msg_id=msg_id, deliver_at=unpack_u64(key[:8]),
                                     reason=reason, size=len(value)))
        return out

    def redrive(self) -> int:
        """Schedule every parked message again, due now; returns how many."""
        parked = list(self._store.scan(CF_META, META_PARKED_PREFIX, _END))
        if not parked:
            return 0
        with self._shard_locks(range(len(self._shards))), self._committer.lock:
            now = self._clock.now_ms()
            batch = self._store.batch()
            woken: dict[int, bytes] = {}  # shard -> its first key written
            redriven = []
            back: dict[str, list[int]] = {}  # topic -> deliverAt of what comes back
            levels: list[int] = []
            for pkey, raw in parked:
                key = pkey[len(META_PARKED_PREFIX):]
                _, value = msgpack.unpackb(raw)
                try:
                    topic, _ = _names(key)
                except ValueError:  # a malformed key has no topic, hence no shard: it stays
                    continue
                redriven.append(pkey)
                shard = self._shards[topic_shard(topic, len(self._shards))]
                # at or after the shard's frontier (what its scanner has passed), so that
                # it is scanned again: due now, or as soon after as the frontier allows
                frontier = shard.frontier_key
                at = max(now, unpack_u64(frontier[:8]) + (len(frontier) > 8))
                timer_key = pack_u64(at) + key[8:]
                batch.put(timer_cf(shard.shard), timer_key, value)
                back.setdefault(topic, []).append(at)
                levels.append(_level(value))
                batch.delete(CF_META, pkey)
                raw_index = self._store.get(CF_INDEX, key[8:])
                if raw_index is not None:
                    entry = decode_index(raw_index)
                    if entry.status is MessageStatus.SCHEDULED:
                        batch.put(CF_INDEX, key[8:], encode_index(
                            msgspec.structs.replace(entry, deliver_at=at, updated_at=now)))
                if shard.shard not in woken or timer_key < woken[shard.shard]:
                    woken[shard.shard] = timer_key
            if self._counts is not None:
                self._counts.put(batch, 1, back, levels)
            self._committer.commit_no_append(batch)
            if self._backlog is not None:
                self._backlog.scheduled_at(back, [level for level in levels if level])
            for shard_no, first in woken.items():
                self._shards[shard_no].note_scheduled(first)
        self._parked.difference_update(redriven)
        self._metrics.pending.inc(len(redriven))
        return len(redriven)
