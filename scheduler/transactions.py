"""Transactional half messages: prepare, commit, rollback, and check-back.

A prepared message waits in the ``half`` column family, invisible to consumers, keyed by its
next check time. Commit hands it to the engine's send path (``WritePaths.submit``) with the
transaction's own changes composed into the same RocksDB batch; rollback removes it; a
check-back claim (a producer's poll, or the POST of scheduler/checkback/dispatcher.py) counts
the check and moves the next one an interval later, and past the maximum DISCARDS the message
into ``TRANS_CHECK_MAX_TIME_TOPIC``. docs/transactions.md has the rules and the reasons.

Atomicity and concurrency. Every state change is decided and written under the engine's
commit lock, after ``replay_if_needed``: so it serializes with every other transaction
change, with delivery and with cancels, and it sees whatever the CommitLog already holds.
A commit of a message that is due at once and a discard are CommitLog appends followed by
ONE RocksDB write holding the transaction's changes; a crash between the two leaves the
record in the log only, and the engine's replay calls :meth:`TransactionManager.on_replayed`,
which finishes the transaction the record belongs to (so a later commit, rollback or check
sees it settled and nothing is appended twice).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import msgspec

from scheduler.checkback.client import CheckAnswer
from scheduler.checkback.dispatcher import CheckbackDispatcher
from scheduler.checkback.registry import CallbackRegistration, CallbackRegistry
from scheduler.clock import Clock
from scheduler.committer import CommitOutcome
from scheduler.config import EngineConfig
from scheduler.intake import Intake, PreparedMessage, expiry_key
from scheduler.metrics import EngineMetrics
from scheduler.model import PendingCheck, SendOutcome, SendRequest, TransactionOutcome
from scheduler.tx_records import (
    HalfMessage,
    TransactionEntry,
    TransactionState,
    check_group,
    decode_entry,
    decode_half,
    encode_entry,
    encode_half,
    entry_key,
    group_key,
    group_prefix,
    immunity_ms,
    is_transaction_id,
    new_transaction_id,
    prefix_end,
)
from storage.constants import (
    CF_EXPIRY,
    CF_HALF,
    CF_INDEX,
    CF_TX,
    PROP_CHECK_IMMUNITY_SECONDS,
    PROP_PRODUCER_GROUP,
    PROP_REAL_TOPIC,
    PROP_TRANSACTION_CHECK_TIMES,
    PROP_TRANSACTION_ID,
    PROP_UNIQ_KEY,
    TOPIC_TRANS_CHECK_MAX_TIME,
    TX_GROUP_PREFIX,
)
from storage.errors import Conflict, CorruptionError, InvalidArgument, NotFound
from storage.keys import SEP, decode_timer_key, encode_timer_key, index_key, pack_u64, time_bound
from storage.records import (
    FLAG_DISCARDED,
    FLAG_TRANSACTIONAL,
    IndexEntry,
    LogRecord,
    MessageStatus,
    decode_index,
    encode_index,
)
from storage.rocks import Batch, RocksStore

log = logging.getLogger(__name__)

MAX_CHECKS_PER_POLL = 1000
FILTER_SCAN_BUDGET = 10 * MAX_CHECKS_PER_POLL  # keys a filtered poll reads at most
#: ``EngineConfig.transaction_unanswered_checks``: RocketMQ's rule, or a check counts only
#: when a poll or a callback takes it
COUNT_UNANSWERED, WAIT_FOR_POLLS = "count", "wait"


class Committing(Protocol):
    """What the manager needs of scheduler.committer.Committer."""

    @property
    def lock(self) -> AbstractContextManager[object]: ...
    def replay_if_needed(self) -> None: ...
    def commit_no_append(self, batch: Batch) -> None: ...
    def commit_immediate(self, batch: Batch,
                         messages: Sequence[PreparedMessage]) -> CommitOutcome: ...


class Submit(Protocol):
    """``WritePaths.submit`` (wired in scheduler/engine.py): store prepared messages,
    composing ``extra`` into the same batch."""

    def __call__(self, messages: Sequence[PreparedMessage], *,
                 extra: Callable[[Batch], None] | None = None,
                 replace_prepared: bool = False) -> list[SendOutcome]: ...


class _Settled(Exception):
    """Raised inside a commit's composed batch: the transaction ended meanwhile."""

    def __init__(self, entry: TransactionEntry) -> None:
        super().__init__(entry.state.value)
        self.entry = entry


class TransactionManager:
    """Owns the ``half`` and ``tx`` column families; built and driven by the Broker."""

    def __init__(
        self, *, store: RocksStore, config: EngineConfig, clock: Clock, intake: Intake,
        committer: Committing, submit: Submit, metrics: EngineMetrics,
        shard_locks: Callable[[Sequence[int]], AbstractContextManager[None]],
        on_appended: Callable[[Sequence[PreparedMessage], CommitOutcome], None],
    ) -> None:
        if config.transaction_check_interval_ms < 1 or config.transaction_timeout_ms < 0 \
                or config.transaction_check_max < 0:
            raise InvalidArgument("transaction settings: the check interval must be >= 1 ms, "
                                  "the timeout and the check maximum >= 0")
        if config.transaction_unanswered_checks not in (COUNT_UNANSWERED, WAIT_FOR_POLLS):
            raise InvalidArgument(f"transaction_unanswered_checks must be {COUNT_UNANSWERED!r} "
                                  f"or {WAIT_FOR_POLLS!r}, got "
                                  f"{config.transaction_unanswered_checks!r}")
        self.counts_unanswered = config.transaction_unanswered_checks == COUNT_UNANSWERED
        self._polled: dict[str, int] = {}  # group -> when it last polled (engine clock)
        self._started_at = clock.now_ms()
        # claim_unanswered: every half key below the floor was looked at; the keys it left to
        # pollers and callbacks are looked at again from recheck[1] at recheck[0]; the next
        # time it must run (None: when woken)
        self._unanswered_floor = b""
        self._recheck: tuple[int, bytes] | None = None
        self._unanswered_next: int | None = None
        self._store = store
        self._config = config
        self._clock = clock
        self._intake = intake
        self._committer = committer
        self._submit = submit
        self._metrics = metrics
        self._shard_locks = shard_locks
        self._on_appended = on_appended
        # per group: no live key of the group's check order is below this half key (kept
        # under the commit lock), so a poll seeks past the tombstones of claimed and finished
        # checks instead of stepping over them; unknown (b"": from the start) after a restart
        self._floor: dict[str, bytes] = {}
        self.callbacks = CallbackRegistry(store, config.transaction_callback_allowed_hosts,
                                          clock)
        self.dispatcher = CheckbackDispatcher(
            self, self.callbacks, clock, timeout_ms=config.transaction_callback_timeout_ms,
            workers=config.transaction_callback_workers,
            on_answer=lambda answer: metrics.tx_check_answers.labels(answer.value).inc())

    def start(self) -> None:
        """After recovery: count the prepared messages, start the callback dispatcher."""
        self.recount()
        self.dispatcher.start()

    def recount(self) -> None:
        """``tx_prepared_pending`` from RocksDB (a start, a cluster follower's refresh)."""
        start = TX_GROUP_PREFIX
        prepared = sum(1 for _ in self._store.scan(CF_TX, start, prefix_end(start)))
        self._metrics.tx_prepared_pending.set(prepared)

    def close(self) -> None:
        self.dispatcher.close()

    # --- prepare / commit / rollback ------------------------------------------------------
    def prepare(self, request: SendRequest, *, producer_group: str,
                check_immunity_seconds: str | int | float | None = None) -> TransactionOutcome:
        """Store a half message. The immunity is ``check_immunity_seconds`` (else the message
        property CHECK_IMMUNITY_TIME_IN_SECONDS) under RocketMQ's rule (tx_records).
        A re-sent prepare of the same (topic, msgId) by the same group answers the first
        transaction with ``duplicate=True``; a msgId used by anything else is a Conflict."""
        check_group(producer_group)
        now = self._clock.now_ms()
        tx_id = new_transaction_id(now)
        prepared = self._intake.prepare(request, now, tx_id=tx_id)  # validates as a send
        if check_immunity_seconds is None:
            check_immunity_seconds = request.properties.get(PROP_CHECK_IMMUNITY_SECONDS)
        immunity = immunity_ms(check_immunity_seconds, self._config.transaction_timeout_ms,
                               max_ms=self._config.max_delay_ms)
        record = prepared.record
        half = HalfMessage(
            tx_id=tx_id, producer_group=producer_group, body=record.body, tags=record.tags,
            keys=record.keys, properties=record.properties, deliver_at=request.deliver_at,
            delay_ms=request.delay_ms, delay_level=request.delay_level, prepared_at=now)
        entry = TransactionEntry(
            topic=prepared.topic, msg_id=prepared.msg_id, producer_group=producer_group,
            state=TransactionState.PREPARED, prepared_at=now, immunity_ms=immunity,
            next_check_at=now + immunity, deliver_at=prepared.deliver_at, updated_at=now)
        half_key = encode_timer_key(entry.next_check_at, entry.topic, entry.msg_id)
        committer = self._committer
        with self._shard_locks([prepared.shard]), committer.lock:  # as a send: idempotency
            committer.replay_if_needed()
            if not prepared.generated_id:
                existing = self._store.get(CF_INDEX, prepared.index_key)
                if existing is not None:
                    return self._duplicate(decode_index(existing), prepared, producer_group)
            batch = self._store.batch()
            batch.put(CF_HALF, half_key, encode_half(half))
            batch.put(CF_TX, group_key(producer_group, half_key), tx_id.encode("ascii"))
            batch.put(CF_TX, entry_key(tx_id), encode_entry(entry))
            batch.put(CF_INDEX, prepared.index_key, encode_index(IndexEntry(
                status=MessageStatus.PREPARED, deliver_at=prepared.deliver_at, updated_at=now,
                tx_id=tx_id)))
            committer.commit_no_append(batch)
            if producer_group in self._floor:
                self._floor[producer_group] = min(self._floor[producer_group], half_key)
            if half_key < self._unanswered_floor:  # (no immunity: due at once)
                self._unanswered_floor = half_key
        self._metrics.tx_prepared.inc()
        self._metrics.tx_prepared_pending.inc()
        unanswered_at = self._unanswered_next  # (set under the commit lock: see above)
        if self.callbacks.has(producer_group) or (self.counts_unanswered and (
                unanswered_at is None or entry.next_check_at < unanswered_at)):
            self.dispatcher.wake()
        return _result(tx_id, entry)

    def _duplicate(self, index: IndexEntry, prepared: PreparedMessage,
                   group: str) -> TransactionOutcome:
        if index.tx_id is not None:
            raw = self._store.get(CF_TX, entry_key(index.tx_id))
            if raw is not None:
                entry = decode_entry(raw)
                if entry.producer_group == group:
                    return msgspec.structs.replace(_result(index.tx_id, entry), duplicate=True)
        raise Conflict(f"msgId {prepared.msg_id!r} of topic {prepared.topic!r} is already "
                       f"used by another message")

    def commit(self, transaction_id: str) -> TransactionOutcome:
        """The half message becomes a normal message, scheduled by its own timing (a
        relative delay counts from now, as RocketMQ resolves it when it stores the committed
        message), or delivered now. Idempotent; Conflict after a rollback or a discard."""
        committer = self._committer
        with committer.lock:  # a consistent read: a claim may be moving the half key
            committer.replay_if_needed()
            entry = self._entry(transaction_id)
            if entry.state is not TransactionState.PREPARED:
                return self._settled_result(transaction_id, entry, "commit")
            half = self._half(entry)
        now = self._clock.now_ms()
        request = SendRequest(
            topic=entry.topic, body=half.body, tags=half.tags, keys=half.keys,
            properties=half.properties, msg_id=entry.msg_id, deliver_at=half.deliver_at,
            delay_ms=half.delay_ms, delay_level=half.delay_level)
        prepared = self._intake.prepare(request, now, flags=FLAG_TRANSACTIONAL,
                                        tx_id=transaction_id)
        prepared.record = msgspec.structs.replace(prepared.record, born_at=half.prepared_at)

        def finish(batch: Batch) -> None:  # every engine lock held, log replayed
            current = self._entry(transaction_id)
            if current.state is not TransactionState.PREPARED:
                raise _Settled(current)
            self._end(batch, transaction_id, current, TransactionState.COMMITTED, now,
                      deliver_at=prepared.deliver_at)

        try:
            [sent] = self._submit([prepared], extra=finish, replace_prepared=True)
        except _Settled as settled:
            return self._settled_result(transaction_id, settled.entry, "commit")
        self._metrics.tx_committed.inc()
        self._metrics.tx_prepared_pending.dec()
        return TransactionOutcome(transaction_id=transaction_id, msg_id=entry.msg_id,
                                 topic=entry.topic, status=TransactionState.COMMITTED.value,
                                 deliver_at=sent.deliver_at,
                                 cancel=sent.cancel or None)  # a cancel marker: what it did

    def rollback(self, transaction_id: str) -> TransactionOutcome:
        """The half message is removed and never delivered. Idempotent; Conflict after a
        commit or a discard."""
        committer = self._committer
        with committer.lock:
            committer.replay_if_needed()
            entry = self._entry(transaction_id)
            if entry.state is not TransactionState.PREPARED:
                return self._settled_result(transaction_id, entry, "roll back")
            now = self._clock.now_ms()
            batch = self._store.batch()
            done = self._end(batch, transaction_id, entry, TransactionState.ROLLED_BACK, now)
            committer.commit_no_append(batch)
        self._metrics.tx_rolled_back.inc()
        self._metrics.tx_prepared_pending.dec()
        return _result(transaction_id, done)

    def get(self, transaction_id: str) -> TransactionOutcome:
        """The transaction's current state; NotFound if unknown."""
        return _result(transaction_id, self._entry(transaction_id))

    @staticmethod
    def _settled_result(tx_id: str, entry: TransactionEntry, action: str) -> TransactionOutcome:
        """Repeating what was done answers it again; anything else is a Conflict."""
        wanted = TransactionState.COMMITTED if action == "commit" else TransactionState.ROLLED_BACK
        if entry.state is wanted:
            return _result(tx_id, entry)
        raise Conflict(f"cannot {action} transaction {tx_id}: it is {entry.state.value}")

    # --- check-back -------------------------------------------------------------------------
    def poll_checks(self, producer_group: str, max_checks: int, *,
                    may_see: Callable[[str], bool] | None = None) -> list[PendingCheck]:
        """Claim up to ``max_checks`` of the group's prepared messages whose next check is due
        (so their immunity has passed), oldest first, and past the first at most
        ``max_answer_bytes`` of bodies. Each returned check counts (checkTimes + 1) and the
        next is due one check interval later; a message already checked the maximum number
        of times is DISCARDED instead (and not returned). With ``may_see``, only messages of
        the topics it accepts are claimed (or discarded): the others are left as they are."""
        check_group(producer_group)
        if isinstance(max_checks, bool) or not isinstance(max_checks, int) \
                or not 1 <= max_checks <= MAX_CHECKS_PER_POLL:
            raise InvalidArgument(f"max must be an integer in 1..{MAX_CHECKS_PER_POLL}")
        committer = self._committer
        with committer.lock:
            committer.replay_if_needed()
            now = self._clock.now_ms()
            self._polled[producer_group] = now
            due, skipped = self._due(producer_group, now, max_checks, may_see)
            # every key read here moves past now or goes; any further due key is after them
            floor = due[-1][0] + b"\x00" if len(due) == max_checks else time_bound(now + 1)
            if not due:
                self._floor[producer_group] = min(floor, skipped or floor)
                return []
            checks, discards, batch, taken = self._claim(producer_group, due, now)
            if taken < len(due):  # the answer is full: the rest stays due
                floor = due[taken][0]
            outcome = committer.commit_immediate(batch, discards) if discards else None
            if outcome is None:
                committer.commit_no_append(batch)
            self._floor[producer_group] = min(floor, skipped or floor)
        if outcome is not None:
            self._on_appended(discards, outcome)
            self._metrics.tx_discarded.inc(len(discards))
            self._metrics.tx_prepared_pending.dec(len(discards))
        if checks:
            self._metrics.tx_checks_sent.inc(len(checks))
        return checks

    def claim_unanswered(self, limit: int = MAX_CHECKS_PER_POLL) -> int | None:
        """RocketMQ's rule (``transaction_unanswered_checks = "count"``): its broker counts a
        check-back round whether a producer answers it or not, so a half message whose
        producer is gone is discarded after the maximum number of checks. Here a group with
        a check callback is checked by the dispatcher; any other group's due check, while
        the group has not polled for two check intervals (a poller polls at least once an
        interval; one more of slack), is claimed as a poll would claim it (it counts; past
        the maximum: DISCARDED) and sent to nobody.

        Called by the check-back dispatcher; returns when to call again (None: never)."""
        if not self.counts_unanswered:
            return None
        interval = self._config.transaction_check_interval_ms
        committer = self._committer
        with committer.lock:
            committer.replay_if_needed()
            now = self._clock.now_ms()
            callbacks = self.callbacks.active()
            start, recheck = self._unanswered_floor, self._recheck
            if recheck is not None and recheck[0] <= now:  # some group may have gone since
                start, recheck = min(start, recheck[1]), None
            by_group: dict[str, list[tuple[bytes, str]]] = {}
            left: tuple[int, bytes] | None = None  # (look again at, first key) left to others
            claimed = 0
            end = time_bound(now + 1)
            resume = end
            for half_key, raw in self._store.scan(CF_HALF, start, end):
                half = decode_half(raw)
                group = half.producer_group
                # a callback group is the dispatcher's; a group that polled lately, its
                # poller's: look again when it may have gone (or its callback)
                until = now + 2 * interval if group in callbacks else \
                    self._polled.get(group, self._started_at) + 2 * interval
                if until > now:
                    left = (until, half_key) if left is None else (min(left[0], until), left[1])
                    continue
                by_group.setdefault(group, []).append((half_key, half.tx_id))
                claimed += 1
                if claimed >= limit:
                    resume = half_key + b"\x00"
                    break
            self._unanswered_floor = resume
            if left is not None:
                recheck = left if recheck is None else (min(recheck[0], left[0]),
                                                        min(recheck[1], left[1]))
            self._recheck = recheck
            results = []
            for group, due in by_group.items():
                checks, discards, batch, _ = self._claim(group, due, now, answered=False)
                outcome = committer.commit_immediate(batch, discards) if discards else None
                if outcome is None:
                    committer.commit_no_append(batch)
                results.append((len(checks), discards, outcome))
            following = next(iter(self._store.scan(CF_HALF, end, limit=1)), None)
            again = min((at for at in (
                now if claimed >= limit else None, recheck[0] if recheck else None,
                decode_timer_key(following[0])[0] if following else None) if at is not None),
                default=None)
            self._unanswered_next = again
        for unanswered, discards, outcome in results:
            self._metrics.tx_checks_unanswered.inc(unanswered)
            if outcome is not None:
                self._on_appended(discards, outcome)
                self._metrics.tx_discarded.inc(len(discards))
                self._metrics.tx_prepared_pending.dec(len(discards))
        return again

    def _claim(self, group: str, due: list[tuple[bytes, str]], now: int, *,
               answered: bool = True,
               ) -> tuple[list[PendingCheck], list[PreparedMessage], Batch, int]:
        """Claim (or discard) ``due`` in order until the answer holds ``max_answer_bytes``
        of bodies (``answered``: the checks go to a poller; else all of ``due``); also
        returns how many of ``due`` were taken."""
        halves = self._store.multi_get(CF_HALF, [half_key for half_key, _ in due])
        entries = self._store.multi_get(CF_TX, [entry_key(tx_id) for _, tx_id in due])
        batch = self._store.batch()
        checks: list[PendingCheck] = []
        discards: list[PreparedMessage] = []
        next_check = now + self._config.transaction_check_interval_ms
        room = self._config.max_answer_bytes if answered else None
        taken = 0
        for (half_key, tx_id), raw_half, raw_entry in zip(due, halves, entries, strict=True):
            if raw_half is None or raw_entry is None:  # cannot happen: written together
                log.error("transaction %s: dangling check key removed", tx_id)
                batch.delete(CF_TX, group_key(group, half_key))
                taken += 1
                continue
            half, entry = decode_half(raw_half), decode_entry(raw_entry)
            if entry.check_times >= self._config.transaction_check_max:
                discards.append(self._discard(batch, tx_id, entry, half, now))
                taken += 1
                continue
            if room is not None:
                if checks and len(half.body) > room:
                    break
                room -= len(half.body)
            claimed = dataclasses.replace(entry, check_times=entry.check_times + 1,
                                          next_check_at=next_check, updated_at=now)
            new_key = encode_timer_key(next_check, entry.topic, entry.msg_id)
            self._remove_half(batch, entry)
            batch.put(CF_HALF, new_key, raw_half)
            batch.put(CF_TX, group_key(group, new_key), tx_id.encode("ascii"))
            batch.put(CF_TX, entry_key(tx_id), encode_entry(claimed))
            checks.append(_check(tx_id, claimed, half))
            taken += 1
        return checks, discards, batch, taken

    def _discard(self, batch: Batch, tx_id: str, entry: TransactionEntry, half: HalfMessage,
                 now: int) -> PreparedMessage:
        """Stage the discard of a message checked the maximum number of times; returns the
        message to append to TRANS_CHECK_MAX_TIME_TOPIC (its msgId there is the transaction
        id: unique whatever topic it was for), with RocketMQ's properties naming its origin."""
        properties = {
            **half.properties, PROP_REAL_TOPIC: entry.topic, PROP_UNIQ_KEY: entry.msg_id,
            PROP_PRODUCER_GROUP: entry.producer_group, PROP_TRANSACTION_ID: tx_id,
            PROP_TRANSACTION_CHECK_TIMES: str(entry.check_times),
        }
        request = SendRequest(topic=TOPIC_TRANS_CHECK_MAX_TIME, body=half.body, tags=half.tags,
                              keys=half.keys, properties=properties, msg_id=tx_id,
                              deliver_at=now)
        prepared = self._intake.prepare(request, now, flags=FLAG_DISCARDED, allow_system=True,
                                        tx_id=tx_id)
        prepared.record = msgspec.structs.replace(prepared.record, born_at=half.prepared_at)
        self._end(batch, tx_id, entry, TransactionState.DISCARDED, now)
        return prepared

    def next_check_at(self, producer_group: str) -> int | None:
        """When the group's earliest prepared message is next due for a check, or None."""
        prefix = group_prefix(producer_group)
        start = prefix + self._floor.get(producer_group, b"")
        for key, _ in self._store.scan(CF_TX, start, prefix_end(prefix), limit=1):
            return decode_timer_key(key[len(prefix):])[0]
        return None

    def apply_answer(self, transaction_id: str, answer: CheckAnswer) -> None:
        """Apply a producer's answer to a check-back. UNKNOWN changes nothing (the next check
        is already scheduled); an answer that comes too late is logged and ignored."""
        try:
            if answer is CheckAnswer.COMMIT:
                self.commit(transaction_id)
            elif answer is CheckAnswer.ROLLBACK:
                self.rollback(transaction_id)
        except (Conflict, NotFound) as exc:
            log.info("check-back answer %s for %s ignored: %s", answer, transaction_id, exc)

    def register_callback(self, producer_group: str, url: str,
                          secret: str | None = None) -> CallbackRegistration:
        reg = self.callbacks.register(producer_group, url, secret)
        self.dispatcher.wake()
        return reg

    def _due(self, group: str, now: int, limit: int,
             may_see: Callable[[str], bool] | None = None,
             ) -> tuple[list[tuple[bytes, str]], bytes | None]:
        """(half key, transaction id) of the group's keys due at ``now`` whose topic
        ``may_see`` accepts, by time, and the first half key it refused (None if none).
        Reads at most ``FILTER_SCAN_BUDGET`` keys when filtering."""
        prefix = group_prefix(group)
        end = time_bound(now + 1)
        start = min(self._floor.get(group, b""), end)
        rows = self._store.scan(CF_TX, prefix + start, prefix + end,
                                limit=limit if may_see is None else FILTER_SCAN_BUDGET)
        due: list[tuple[bytes, str]] = []
        skipped = None
        for key, value in rows:
            half_key = key[len(prefix):]
            if may_see is not None and not may_see(decode_timer_key(half_key)[1]):
                skipped = skipped or half_key
                continue
            due.append((half_key, value.decode("ascii")))
            if len(due) == limit:
                break
        return due, skipped

    # --- recovery -----------------------------------------------------------------------------
    def on_replayed(self, records: Sequence[LogRecord]) -> None:
        """The engine applied log records that RocksDB had missed (commit lock held). A
        committed or discarded half message among them got into the log but its
        transaction's RocksDB changes did not: finish the transaction now."""
        settled: list[tuple[str, TransactionState, int | None]] = []
        for rec in records:
            if rec.flags & FLAG_DISCARDED and rec.topic == TOPIC_TRANS_CHECK_MAX_TIME:
                settled.append((rec.msg_id, TransactionState.DISCARDED, None))
            elif rec.flags & FLAG_TRANSACTIONAL:
                raw = self._store.get(CF_INDEX, index_key(rec.topic, rec.msg_id))
                tx_id = None if raw is None else decode_index(raw).tx_id
                if tx_id is not None:
                    settled.append((tx_id, TransactionState.COMMITTED, rec.deliver_at))
        batch = self._store.batch()
        counts = {TransactionState.COMMITTED: 0, TransactionState.DISCARDED: 0}
        now = self._clock.now_ms()
        for tx_id, state, deliver_at in settled:
            raw = self._store.get(CF_TX, entry_key(tx_id)) if is_transaction_id(tx_id) else None
            entry = None if raw is None else decode_entry(raw)
            if entry is None or entry.state is not TransactionState.PREPARED:
                continue  # its own write made it, or it is not ours
            self._end(batch, tx_id, entry, state, now, deliver_at=deliver_at)
            counts[state] += 1
            log.info("transaction %s finished by log replay: %s", tx_id, state.value)
        if len(batch):
            self._store.write(batch)
            self._metrics.tx_committed.inc(counts[TransactionState.COMMITTED])
            self._metrics.tx_discarded.inc(counts[TransactionState.DISCARDED])
            self._metrics.tx_prepared_pending.dec(sum(counts.values()))

    # --- helpers ------------------------------------------------------------------------------
    def _entry(self, transaction_id: str) -> TransactionEntry:
        raw = None
        if isinstance(transaction_id, str) and is_transaction_id(transaction_id):
            raw = self._store.get(CF_TX, entry_key(transaction_id))
        if raw is None:
            raise NotFound(f"unknown transaction {transaction_id!r}")
        return decode_entry(raw)

    def _half(self, entry: TransactionEntry) -> HalfMessage:
        raw = self._store.get(CF_HALF, _half_key(entry))
        if raw is None:
            raise CorruptionError(f"the half message of {entry.topic}/{entry.msg_id} is missing")
        return decode_half(raw)

    @staticmethod
    def _remove_half(batch: Batch, entry: TransactionEntry) -> None:
        half_key = _half_key(entry)
        batch.delete(CF_HALF, half_key)
        batch.delete(CF_TX, group_key(entry.producer_group, half_key))

    def _end(self, batch: Batch, tx_id: str, entry: TransactionEntry, state: TransactionState,
             now: int, *, deliver_at: int | None = None) -> TransactionEntry:
        """Stage the end of a prepared transaction: the half message goes, the entry takes
        its final state and expires after the retention (with the index entry, unless the
        engine's send path writes that one: a commit)."""
        self._remove_half(batch, entry)
        done = dataclasses.replace(entry, state=state, updated_at=now,
                                   deliver_at=entry.deliver_at if deliver_at is None
                                   else deliver_at)
        batch.put(CF_TX, entry_key(tx_id), encode_entry(done))
        expires = now + self._config.retention_ms
        batch.put(CF_EXPIRY, _tx_expiry_key(expires, tx_id), entry_key(tx_id))
        if state is not TransactionState.COMMITTED:
            status = (MessageStatus.ROLLED_BACK if state is TransactionState.ROLLED_BACK
                      else MessageStatus.DISCARDED)
            key = index_key(entry.topic, entry.msg_id)
            batch.put(CF_INDEX, key, encode_index(IndexEntry(
                status=status, deliver_at=done.deliver_at or 0, updated_at=now, tx_id=tx_id)))
            batch.put(CF_EXPIRY, expiry_key(expires, key), b"")
        return done


def _half_key(entry: TransactionEntry) -> bytes:
    return encode_timer_key(entry.next_check_at, entry.topic, entry.msg_id)


def _tx_expiry_key(expires_at: int, tx_id: str) -> bytes:
    """An expiry key whose index-key part starts with NUL (no index key does: topics are
    never empty); its value names the tx entry the engine's retention clean-up removes."""
    return pack_u64(expires_at) + SEP + entry_key(tx_id)


def _result(tx_id: str, entry: TransactionEntry) -> TransactionOutcome:
    return TransactionOutcome(
        transaction_id=tx_id, msg_id=entry.msg_id, topic=entry.topic, status=entry.state.value,
        deliver_at=entry.deliver_at if entry.state is TransactionState.COMMITTED else None)


def _check(tx_id: str, entry: TransactionEntry, half: HalfMessage) -> PendingCheck:
    return PendingCheck(
        transaction_id=tx_id, msg_id=entry.msg_id, topic=entry.topic,
        producer_group=entry.producer_group, check_times=entry.check_times,
        prepared_at=entry.prepared_at, body=half.body, tags=half.tags, keys=half.keys,
        properties=half.properties)


__all__ = ["MAX_CHECKS_PER_POLL", "TransactionManager"]
