"""The write paths that decide under the shard locks: send (schedule, or deliver at once)
and cancel.

A send holds the locks of its shards (ascending) while it checks idempotency, reads the
clock, decides "due or not" against each shard's scan frontier and writes; a cancel holds
its shard's lock and the commit lock. Scanners take their shard's lock to scan, so a key is
never written below a scanner's frontier (the watermark race, scheduler/scanner.py), and a
cancel either precedes a message's delivery commit or sees it (scheduler/committer.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import NamedTuple

from msgspec.structs import replace

from scheduler.backlog import Backlog
from scheduler.backlog_store import BacklogStore
from scheduler.clock import Clock
from scheduler.codec import (
    cancel_handle,
    cancel_handles,
    index_value,
    message_level,
    scheduled_values,
)
from scheduler.committer import CommitOutcome, Committer
from scheduler.intake import ColumnBatch, PreparedMessage, expiry_key, topic_shard
from scheduler.ledger import DeliveryLedger
from scheduler.metrics import EngineMetrics
from scheduler.model import Cancelled, CancelMarkerEffect, SendOutcome
from scheduler.scanner import ShardState
from storage.constants import CF_EXPIRY, CF_INDEX
from storage.errors import AlreadyDelivered, Conflict, NotFound
from storage.keys import encode_handle, encode_timer_key, index_key
from storage.records import IndexEntry, MessageStatus, decode_index, encode_index
from storage.rocks import Batch, RocksStore


class WritePaths:
    def __init__(
        self, *, store: RocksStore, committer: Committer, shards: list[ShardState],
        clock: Clock, metrics: EngineMetrics, backlog: Backlog, retention_ms: int,
        check_running: Callable[[], None], notify: Callable[[Collection[str]], None],
        ledger: DeliveryLedger, counts: BacklogStore | None = None,
    ) -> None:
        """``counts``: the backlog's persisted counts; each write that schedules or cancels
        stages its change in its own batch (scheduler/backlog_store.py)."""
        self._store = store
        self._ledger = ledger
        self._committer = committer
        self._shards = shards
        self._clock = clock
        self._metrics = metrics
        self._backlog = backlog
        self._counts = counts
        self._retention_ms = retention_ms
        self._check_running = check_running
        self._notify = notify

    @contextlib.contextmanager
    def locks(self, shards: Iterable[int]) -> Iterator[None]:
        """The locks of ``shards``, in ascending order."""
        with contextlib.ExitStack() as stack:
            for s in sorted(shards):
                stack.enter_context(self._shards[s].lock)
            yield

    def submit(
        self, messages: Sequence[PreparedMessage], *,
        extra: Callable[[Batch], None] | None = None, replace_prepared: bool = False,
        atomic: bool = False,
    ) -> list[SendOutcome]:
        """Store prepared messages atomically: each is scheduled (timer key + index entry)
        or, when already due, appended to the log; idempotent on (topic, msgId).

        For composition (transactions, consumer groups' nacks): ``extra(batch)`` runs while
        every lock is held (shard locks and the commit lock) and adds its own operations to
        the one RocksDB batch that also schedules the messages; it may raise to abort, before
        anything is written. ``replace_prepared``: an index entry PREPARED for the same
        (topic, msgId) is the half message being committed, not a duplicate. ``atomic``:
        messages due at once count only with the one RocksDB write (never by replay), as when
        scheduled ones share the batch: all or nothing, also with ``extra``.
        """
        if not messages:
            return []
        store, committer = self._store, self._committer
        results: list[SendOutcome | None] = [None] * len(messages)
        shards = sorted({m.shard for m in messages})
        # encode before taking the locks: they are held only for the decision and the write;
        # not for messages already due by this reading (they are delivered at once)
        at = self._clock.now_ms()
        stored = scheduled_values(messages, at)
        with self.locks(shards):
            self._check_running()
            if committer.needs_replay:
                with committer.lock:
                    committer.replay_if_needed()
            duplicates, markers = self._find_duplicates(messages, results, replace_prepared)
            now = self._clock.now_ms()
            due: list[PreparedMessage] = []
            later: list[PreparedMessage] = []
            later_stored: list[tuple[bytes, bytes]] = []
            frontiers = {s: self._shards[s].frontier_key for s in shards}  # (locks held)
            for m, result, encoded in zip(messages, results, stored, strict=True):
                if result is not None:
                    continue
                if encoded is None or m.deliver_at <= now or m.timer_key < frontiers[m.shard]:
                    due.append(m)
                else:
                    later.append(m)
                    later_stored.append(encoded)
            batch = store.batch()
            if later:
                self._add_scheduled(batch, later, later_stored, len(shards) == 1)
                if self._counts is not None:
                    self._counts.put_columns(batch, 1, [m.topic for m in later],
                                             [m.deliver_at for m in later],
                                             [m.level for m in later if m.level is not None])
            outcome = None
            cancelled: list[_Cancel] = []
            try:
                if due or extra is not None or markers:
                    with committer.lock:
                        committer.replay_if_needed()
                        if markers:
                            cancelled = self._cancel_marked(batch, messages, markers, results,
                                                            now)
                        if extra is not None:
                            extra(batch)
                        # with scheduled siblings (or cancels) in ``batch``, the due ones
                        # count only with that one write: all or nothing (committer.py)
                        outcome = committer.commit_immediate(
                            batch, due, atomic=atomic or bool(later or cancelled))
                        if cancelled:
                            self._cancelled(cancelled)
                else:
                    store.write(batch)
            finally:  # also when the write raised: it may have landed (else: one idle scan)
                first_key: dict[int, bytes] = {}
                for m in later:
                    key = first_key.get(m.shard)
                    if key is None or m.timer_key < key:
                        first_key[m.shard] = m.timer_key
                for shard, key in first_key.items():
                    self._shards[shard].note_scheduled(key)
            if later:  # before any scan or cancel can see them (they take these locks)
                self._backlog.scheduled(later)
        self.count_sent(later, due, duplicates, outcome)
        return self._results(messages, results, {m.index_key for m in due},
                             duplicates + len(markers))

    def submit_columns(self, cols: ColumnBatch) -> bool:
        """Store a column batch (``Intake.columns``) when every message in it is new and due
        later, as ``submit`` would (same locks, look-up, checks and write, from columns);
        False, with nothing written, for any other: ``submit`` then takes the batch."""
        store = self._store
        # the WriteBatch is built before the locks (it is only this call's until written;
        # dropped if a check below says no), each CF's entries in key order (Batch.put_sorted);
        # the index entries first: a msgId twice (a duplicate) stops it there
        batch = store.batch()
        if batch.put_sorted(CF_INDEX, cols.index_keys, cols.entries, distinct=True) is False:
            return False
        by_shard: dict[int, tuple[list[bytes], list[bytes]]]
        if cols.shards is None:
            by_shard = {cols.shard: (cols.timer_keys, cols.values)}
        else:
            by_shard = {}
            for shard_, key, value in zip(cols.shards, cols.timer_keys, cols.values,
                                          strict=True):
                columns = by_shard.get(shard_)
                if columns is None:
                    by_shard[shard_] = ([key], [value])
                else:
                    columns[0].append(key)
                    columns[1].append(value)
        shards = []  # (shard, its first key)
        for s, (keys, values) in sorted(by_shard.items()):
            shard = self._shards[s]
            first = batch.put_sorted(shard.cf, keys, values)
            assert first  # (a shard is here for a key of its own)
            shards.append((shard, first))
        first_at = min(cols.deliver_ats)
        with self.locks(by_shard):
            self._check_running()
            if self._committer.needs_replay:
                return False
            if cols.given and store.multi_get(CF_INDEX, cols.given).count(None) != len(
                    cols.given):
                return False
            if first_at <= self._clock.now_ms() or any(first < shard.frontier_key
                                                       for shard, first in shards):
                return False  # one is due (by now, or below its shard's scan frontier)
            by_topic = cols.deliver_ats_by_topic()
            if self._counts is not None:  # (inside the locks: backlog_store.py)
                self._counts.put(batch, 1, by_topic)
            try:
                store.write(batch)
            finally:  # also when the write raised: it may have landed (else: one idle scan)
                for shard, first in shards:
                    shard.note_scheduled(first)
            self._backlog.scheduled_at(by_topic)
        self._metrics.scheduled.inc(len(cols.timer_keys))
        self._metrics.pending.inc(len(cols.timer_keys))
        return True

    def _find_duplicates(
        self, messages: Sequence[PreparedMessage], results: list[SendOutcome | None],
        replace_prepared: bool,
    ) -> tuple[int, list[int]]:
        """Fill ``results`` for re-sends (stored before, or earlier in this batch); returns
        their number and the positions of the cancel markers (their results: placeholders
        until ``_cancel_marked``)."""
        lookup = [i for i, m in enumerate(messages) if not m.generated_id]
        if not lookup:
            return 0, _NO_MARKERS
        markers = [i for i in lookup if messages[i].cancels is not None]
        if markers:
            lookup = [i for i in lookup if messages[i].cancels is None]
            for i in markers:
                results[i] = _PENDING_MARKER
        found = self._entries([messages[i] for i in lookup],
                              [messages[i].msg_id for i in lookup])
        count = 0
        for i, entry in zip(lookup, found, strict=True):
            if entry is None:
                continue
            if replace_prepared and entry.status is MessageStatus.PREPARED:
                continue
            results[i] = _duplicate_result(messages[i], entry)
            count += 1
        first: dict[bytes, int] = {}
        for i in lookup:
            if results[i] is not None:
                continue
            j = first.setdefault(messages[i].index_key, i)
            if j != i:  # the second occurrence in one batch is a duplicate of the first
                results[i] = _PENDING_DUPLICATE
                count += 1
        return count, markers or _NO_MARKERS

    def _cancel_marked(self, batch: Batch, messages: Sequence[PreparedMessage],
                       markers: list[int], results: list[SendOutcome | None],
                       now: int) -> list[_Cancel]:
        """Stage in ``batch`` what the cancel markers do (every lock held): each cancels the
        message it names as ``cancel`` would, and its result says how; the marker itself is
        not stored (a committed transactional one: its index entry becomes CANCELLED). A
        marker sees the messages stored before its batch. Returns the cancels staged."""
        marking = [messages[i] for i in markers]
        targets = [index_key(m.topic, m.cancels or "") for m in marking]
        entries = self._entries(marking, [m.cancels or "" for m in marking], targets)
        done: dict[bytes, str] = {}  # target -> outcome: twice in one batch, once
        cancelled: list[_Cancel] = []
        expires = now + self._retention_ms
        for i, ikey, entry in zip(markers, targets, entries, strict=True):
            m = messages[i]
            outcome = done.get(ikey)
            if outcome is None:
                outcome = done[ikey] = _cancel_outcome(entry)
                if outcome == _TO_CANCEL:
                    assert entry is not None and m.cancels is not None
                    cancelled.append(self._stage_cancel(  # (in the marker's own topic)
                        batch, self._shards[m.shard], m.topic, m.cancels, ikey, entry, now))
                    outcome = done[ikey] = _CANCELLED
            if m.tx_id is not None:  # its PREPARED entry: never delivered
                batch.put(CF_INDEX, m.index_key, index_value(
                    _CANCELLED, m.deliver_at, now, tx_id=m.tx_id))
                batch.put(CF_EXPIRY, expiry_key(expires, m.index_key), b"")
            results[i] = SendOutcome(
                msg_id=m.msg_id, topic=m.topic, deliver_at=m.deliver_at,
                status=MessageStatus.CANCELLED, cancel_handle=cancel_handle(m.timer_key),
                cancel=CancelMarkerEffect(msg_id=m.cancels or "", status=outcome))
        return cancelled

    def _entries(self, messages: Sequence[PreparedMessage], msg_ids: Sequence[str],
                 keys: Sequence[bytes] | None = None) -> list[IndexEntry | None]:
        """The index entries of ``msg_ids`` in the messages' topics (at ``keys``, else the
        messages' own index keys), as they stand (scheduler/ledger.py)."""
        if keys is None:
            keys = [m.index_key for m in messages]
        raw = self._store.multi_get(CF_INDEX, keys)
        out: list[IndexEntry | None] = [None] * len(raw)
        found = [(i, decode_index(r)) for i, r in enumerate(raw) if r is not None]
        if found:  # (new msgIds: none)
            resolved = self._ledger.resolve_many([messages[i].topic for i, _ in found],
                                                 [msg_ids[i] for i, _ in found],
                                                 [entry for _, entry in found])
            for (i, _), entry in zip(found, resolved, strict=True):
                out[i] = entry
        return out

    def _stage_cancel(self, batch: Batch, shard: ShardState, topic: str, msg_id: str,
                      ikey: bytes, entry: IndexEntry, now: int) -> _Cancel:
        """Stage the cancel of a SCHEDULED message."""
        timer_key = encode_timer_key(entry.deliver_at, topic, msg_id)
        level = 0
        if self._backlog.has_levels:  # its level is in its stored value
            value = self._store.get(shard.cf, timer_key)
            level = 0 if value is None else message_level(value)
        batch.delete(shard.cf, timer_key)
        shard.touched(timer_key)  # (its lock held: a read-ahead holding the key lets it go)
        if self._counts is not None:
            self._counts.put(batch, -1, {topic: [entry.deliver_at]}, (level,))
        batch.put(CF_INDEX, ikey, encode_index(replace(
            entry, status=MessageStatus.CANCELLED, updated_at=now)))
        batch.put(CF_EXPIRY, expiry_key(now + self._retention_ms, ikey), b"")
        return _Cancel(shard, timer_key, topic, entry.deliver_at, level)

    def _cancelled(self, cancels: list[_Cancel]) -> None:
        """After the write of staged cancels (commit lock held): a cancelled message the
        scanner may already have handed on is filtered out of delivery; metrics, backlog."""
        for c in cancels:
            if c.shard.below_frontier(c.timer_key):
                self._committer.skip(c.timer_key)
            self._backlog.cancelled(c.topic, c.deliver_at, c.level)
        self._metrics.cancelled.inc(len(cancels))
        self._metrics.pending.dec(len(cancels))

    def _add_scheduled(self, batch: Batch, later: list[PreparedMessage],
                       stored: list[tuple[bytes, bytes]], one_shard: bool) -> None:
        """Timer keys and index entries (SCHEDULED) of ``later``, pre-encoded in ``stored``;
        each CF's in key order (Batch.put_sorted)."""
        if one_shard:  # the common case: a batch for one topic
            batch.put_sorted(self._shards[later[0].shard].cf, [m.timer_key for m in later],
                             [value for value, _ in stored])
        else:
            by_shard: dict[str, tuple[list[bytes], list[bytes]]] = {}
            for m, (value, _) in zip(later, stored, strict=True):
                cf = self._shards[m.shard].cf
                columns = by_shard.get(cf)
                if columns is None:
                    columns = by_shard[cf] = ([], [])
                columns[0].append(m.timer_key)
                columns[1].append(value)
            for cf, (keys, values) in by_shard.items():
                batch.put_sorted(cf, keys, values)
        batch.put_sorted(CF_INDEX, [m.index_key for m in later], [entry for _, entry in stored])

    def _results(self, messages: Sequence[PreparedMessage], results: list[SendOutcome | None],
                 delivered: set[bytes], duplicates: int) -> list[SendOutcome]:
        if not duplicates:  # the common case: one new result per message, in order
            scheduled, at_once = MessageStatus.SCHEDULED, MessageStatus.DELIVERED
            handles = cancel_handles([m.timer_key for m in messages])
            return [SendOutcome(msg_id=m.msg_id, topic=m.topic, deliver_at=m.deliver_at,
                               status=at_once if delivered and m.index_key in delivered
                               else scheduled, cancel_handle=handle)
                    for m, handle in zip(messages, handles, strict=True)]
        out: list[SendOutcome] = []
        first: dict[bytes, SendOutcome] = {}
        for m, result in zip(messages, results, strict=True):
            if result is _PENDING_DUPLICATE:
                result = replace(first[m.index_key], duplicate=True)
            elif result is None:
                result = SendOutcome(
                    msg_id=m.msg_id, topic=m.topic, deliver_at=m.deliver_at,
                    status=(MessageStatus.DELIVERED if m.index_key in delivered
                            else MessageStatus.SCHEDULED),
                    cancel_handle=cancel_handle(m.timer_key))
                if m.generated_id:  # unique: never looked up again
                    out.append(result)
                    continue
            first.setdefault(m.index_key, result)
            out.append(result)
        return out

    def count_sent(self, later: list[PreparedMessage], due: list[PreparedMessage],
                    duplicates: int, outcome: CommitOutcome | None) -> None:
        metrics = self._metrics
        if later:
            metrics.scheduled.inc(len(later))
            metrics.pending.inc(len(later))
            for m in later:
                if m.level is not None:
                    metrics.scheduled_by_level.labels(m.level).inc()
        if duplicates:
            metrics.duplicates.inc(duplicates)
        if due and outcome is not None:
            metrics.delivered.inc(len(due))
            metrics.delivered_immediate.inc(len(due))
            metrics.lateness_ms.observe_many(outcome.lateness_ms)
            metrics.commit_batch_size.observe(len(due))
            self._notify(outcome.topics)

    def cancel(self, topic: str, msg_id: str, handle_at: int | None) -> Cancelled:
        """Cancel a SCHEDULED message (``handle_at``: the deliverAt its handle names)."""
        store, committer = self._store, self._committer
        shard = self._shards[topic_shard(topic, len(self._shards))]
        ikey = index_key(topic, msg_id)
        with shard.lock, committer.lock:
            self._check_running()
            committer.replay_if_needed()  # a message in the log is delivered, whatever RocksDB says
            raw = store.get(CF_INDEX, ikey)
            entry = self._ledger.resolve(topic, msg_id, None if raw is None else decode_index(raw))
            if entry is not None and handle_at is not None and entry.deliver_at != handle_at:
                entry = None
            outcome = _cancel_outcome(entry)
            result = Cancelled(msg_id=msg_id, topic=topic, status=MessageStatus.CANCELLED)
            if outcome == _CANCELLED:
                return result
            if outcome == _NOT_FOUND:
                raise NotFound(f"no message {msg_id!r} in topic {topic!r}")
            assert entry is not None
            if outcome == _ALREADY_DELIVERED:
                raise AlreadyDelivered(f"message {msg_id!r} of topic {topic!r} was delivered")
            if outcome == _CONFLICT:
                raise Conflict(f"message {msg_id!r} of topic {topic!r} is a transactional "
                               f"message ({entry.status}); use its transaction instead")
            batch = store.batch()
            staged = self._stage_cancel(batch, shard, topic, msg_id, ikey, entry,
                                        self._clock.now_ms())
            committer.commit_no_append(batch)
            self._cancelled([staged])
        return result


class _Cancel(NamedTuple):
    """A cancel staged in a batch, to finish once the batch is written."""

    shard: ShardState
    timer_key: bytes
    topic: str
    deliver_at: int
    level: int


_PENDING_DUPLICATE = SendOutcome(msg_id="", topic="", deliver_at=0,
                                status=MessageStatus.SCHEDULED, cancel_handle="")
_PENDING_MARKER = replace(_PENDING_DUPLICATE, status=MessageStatus.CANCELLED)
_NO_MARKERS: list[int] = []  # never mutated

# a cancel's outcome, by the target's index entry (the API's codes; "SCHEDULED": cancel it)
_CANCELLED, _ALREADY_DELIVERED, _NOT_FOUND, _CONFLICT, _TO_CANCEL = (
    MessageStatus.CANCELLED.value, "ALREADY_DELIVERED", "NOT_FOUND", "CONFLICT",
    MessageStatus.SCHEDULED.value)


def _cancel_outcome(entry: IndexEntry | None) -> str:
    if entry is None:
        return _NOT_FOUND
    if entry.status is MessageStatus.SCHEDULED:
        return _TO_CANCEL
    if entry.status is MessageStatus.CANCELLED:
        return _CANCELLED
    if entry.status is MessageStatus.DELIVERED:
        return _ALREADY_DELIVERED
    return _CONFLICT  # a transactional message: PREPARED, ROLLED_BACK, DISCARDED


def _duplicate_result(m: PreparedMessage, entry: IndexEntry) -> SendOutcome:
    if entry.status in (MessageStatus.PREPARED, MessageStatus.ROLLED_BACK,
                        MessageStatus.DISCARDED):
        raise Conflict(f"msgId {m.msg_id!r} of topic {m.topic!r} belongs to a transactional "
                       f"message ({entry.status})")
    status = (MessageStatus.DELIVERED if entry.status is MessageStatus.DELIVERED
              else MessageStatus.SCHEDULED)
    return SendOutcome(msg_id=m.msg_id, topic=m.topic, deliver_at=entry.deliver_at,
                      status=status,
                      cancel_handle=encode_handle(entry.deliver_at, m.topic, m.msg_id),
                      duplicate=True)


