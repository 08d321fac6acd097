"""Consumer groups with competing members: leases, acknowledgements, retries, dead letters.

A group of a topic reads two logs, each a *stream* with its own committed offset: the
topic's log, and the group's retry topic (RocketMQ's ``%RETRY%group``), where the scheduler
delivers the group's nacked messages when their retry delay has passed. A third topic, the
dead-letter topic (``%DLQ%group``), holds what failed ``max_reconsume_times`` times.

- ``receive`` leases offsets the group has not acknowledged and that nobody holds: first
  the retry stream, then the topic; in each, first offsets whose lease expired (oldest
  first), then offsets never handed out. Leases live in memory only.
- ``ack`` is one RocksDB write per request: the committed offset of a stream moves up as
  acks fill the gaps; an ack above it is a ``gack/`` key until the gap below it fills.
- ``nack`` is ONE write too, through ``WritePaths.submit(extra=..., atomic=True)``: the same
  RocksDB batch acknowledges the message in its stream and schedules its retry (or appends
  its dead letter). ``atomic``: a retry or dead letter that is due at once is appended to the
  log with FLAG_BATCH, so it counts only with that batch's write, never by replay (see
  scheduler/committer.py): a nack is applied whole or not at all, also across kill -9, and
  one answered 200 yields exactly one retry.
- Bounded memory: a stream hands out offsets only below ``committed + group_lease_window``,
  so its leases, its expired-lease queue and its acks above the committed offset each hold
  at most ``group_lease_window`` offsets, however far members run ahead; past it, ``receive``
  hands out fewer (none) until the oldest outstanding message is acknowledged.

The in-memory state (streams, leases, receipts, ack plans) is scheduler/group_state.py.
Lock order: a group's lock, then the Broker's (shard locks, commit lock, in ``submit``).
"""

from __future__ import annotations

import heapq
import itertools
import math
import secrets
import threading
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Protocol

import msgspec

from scheduler.backlog import OTHER
from scheduler.clock import Clock
from scheduler.group_state import (
    MAIN,
    RETRY,
    AckPlan,
    Group,
    Lease,
    Seal,
    Stream,
    ack_prefix,
    ack_runs,
    as_original,
    check_group,
    dlq_topic,
    parse_receipts,
    retry_topic,
    state_key,
)
from scheduler.intake import Intake, PreparedMessage, check_topic
from scheduler.metrics import EngineMetrics
from scheduler.model import GroupStats, SendOutcome, SendRequest
from storage.constants import (
    CF_META,
    MAX_PULL_MESSAGES,
    META_GROUP_EXPIRED_PREFIX,
    META_GROUP_RECEIPT_KEY,
    META_GROUP_STATE_PREFIX,
    PROP_ORIGIN_BORN_AT,
    PROP_ORIGIN_MESSAGE_ID,
    PROP_ORIGIN_OFFSET,
    PROP_RECONSUME_TIME,
)
from storage.consume_queue import ConsumeQueue
from storage.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
    OffsetExpired,
    PayloadTooLarge,
    TooManyRequests,
)
from storage.keys import pack_u64, unpack_u64
from storage.records import (
    LogRecord,
    decode_log_record,
    decode_log_records,
    log_record_offsets,
)
from storage.rocks import Batch, RocksStore

LEASE_MS_MIN = 1_000
LEASE_MS_MAX = 43_200_000
DEFAULT_RETRY_LEVEL = 3  # RocketMQ: a retry waits level 3 + reconsumeTimes
QUICK_RETRY_MS = 1_000  # a nack with a smaller delayMs is a quick retry (rate-bounded)
RECEIPT_KEY_BYTES = 32


class LeasedMessage(msgspec.Struct, frozen=True, gc=False):
    """A leased message as its topic knows it (msgId, offset, properties of the original):
    its LogRecord bytes (``payload``) when it is shown as stored, decoded only when
    ``record`` is asked for (an answer in msgpack is transcoded from the bytes, in C where
    it is built: api/routes/groups.py); otherwise (a retry shown as its original) the record
    it is shown as (``shown``). (Positional: a receive builds 1000 with one ``map``.)"""

    receipt: str
    delivery_count: int
    reconsume_times: int
    payload: bytes | None = None
    shown: LogRecord | None = None

    @property
    def record(self) -> LogRecord:
        if self.shown is not None:
            return self.shown
        assert self.payload is not None
        return decode_log_record(self.payload)


class LeasedBatch:
    """What a receive leased, until ``lease_until``. The usual receive (no retry among
    them: every message shown as stored) keeps three columns, ``payloads``, ``receipts``
    and ``counts`` (delivery counts), and no object per message: an answer is transcoded
    from them in C in one buffer (api/routes/groups.py). ``messages`` (a LeasedMessage
    each) is made from them when asked for; a receive with retries gives only it."""

    __slots__ = ("_messages", "counts", "lease_until", "payloads", "receipts")

    def __init__(self, *, lease_until: int, messages: list[LeasedMessage] | None = None,
                 payloads: list[bytes] | None = None, receipts: list[str] | None = None,
                 counts: list[int] | None = None) -> None:
        self.lease_until = lease_until
        self._messages = messages
        self.payloads, self.receipts, self.counts = payloads, receipts, counts
        if messages is None and (payloads is None or receipts is None or counts is None
                                 or not len(payloads) == len(receipts) == len(counts)):
            raise ValueError("messages, or payloads, receipts and counts of one length each")

    @property
    def columns(self) -> tuple[list[bytes], list[str], list[int]] | None:
        """(payloads, receipts, counts) when every message is shown as stored, else None."""
        if self.payloads is None or self.receipts is None or self.counts is None:
            return None
        return self.payloads, self.receipts, self.counts

    @property
    def messages(self) -> list[LeasedMessage]:
        found = self._messages
        if found is None:
            assert self.payloads is not None and self.receipts is not None \
                and self.counts is not None
            found = self._messages = list(map(LeasedMessage, self.receipts, self.counts,
                                              repeat(0), self.payloads))
        return found

    def __len__(self) -> int:
        return len(self._messages if self._messages is not None else self.payloads or ())

    def __repr__(self) -> str:
        return f"LeasedBatch(lease_until={self.lease_until}, messages={self.messages!r})"


class AckCounts(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    acked: int
    stale: list[str]


class NackCounts(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    retrying: int
    dead_lettered: int
    stale: list[str]


class GroupProgress(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    committed_offset: int
    end_offset: int
    leased: int
    retrying: int
    dead_lettered: int
    expired: int = 0  # messages lost to CommitLog retention (``catch_up``)


class DeadLetters(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    messages: list[tuple[LogRecord, int]]  # (the message as its topic knows it, reconsumeTimes)
    next_offset: int


class GroupManager:
    def __init__(
        self, *, store: RocksStore, read: ReadPayloads,
        end_offset: Callable[[str], int], intake: Intake,
        submit: Callable[..., list[SendOutcome]], clock: Clock, max_reconsume_times: int,
        window: int, check_running: Callable[[], None], metrics: EngineMetrics,
        max_answer_bytes: int = 8 << 20, max_groups_per_topic: int = 1_000,
        metric_labels: int = 50, quick_retries_per_s: int = 100,
        quick_retry_burst: int = 2_000,
    ) -> None:
        self._store = store
        self._offsets = ConsumeQueue(store)
        self._read = read
        self._end_offset = end_offset
        self._intake = intake
        self._submit = submit
        self._clock = clock
        self._max_reconsume = max_reconsume_times
        self._window = window
        self._check_running = check_running
        self._metrics = metrics
        self._max_bytes = max_answer_bytes
        self._max_groups = max_groups_per_topic
        self._metric_labels = metric_labels
        self._quick_rate = quick_retries_per_s
        self._quick_burst = quick_retry_burst
        # /metrics: one walk of the groups serves the four gauges of a scrape (``_gauge``)
        self._snapshot: dict[str, dict[str, float]] = {}
        self._served: set[str] = set()
        self._snapshot_lock = threading.Lock()
        for gauge, name in ((metrics.group_backlog, "backlog"), (metrics.group_leased, "leased"),
                            (metrics.group_retrying, "retrying"),
                            (metrics.group_dead_letters, "dead_lettered")):
            gauge.set_label_function(self._gauge(name))
        self._groups: dict[tuple[str, str], Group] = {}
        self._per_topic: dict[str, int] = {}  # groups of each topic
        self._labelled = 0  # groups with their own label in /metrics
        self._groups_lock = threading.Lock()
        # made by the first receive, not at open: a store no group used holds no key, and a
        # node that only applies a replicated stream never writes one of its own
        self._receipt_key = self._stored_receipt_key()
        # CommitLog retention (``catch_up``): a log's first offset (the Broker sets it), and
        # per group the messages it lost, as stored
        self.first_offset: Callable[[str], int] = lambda _topic: 0
        self._expired: dict[tuple[str, str], int] = {}
        # lease ids: unique across restarts (a receipt's lease is compared by equality)
        self._lease_ids = itertools.count(secrets.randbits(62))
        #: a cluster follower's: it applies the write-ahead stream to RocksDB, past this
        self.applying = False
        self._load_all()

    def _stored_receipt_key(self) -> bytes | None:
        key = self._store.get(CF_META, META_GROUP_RECEIPT_KEY)
        return key if key is not None and len(key) == RECEIPT_KEY_BYTES else None

    def _load_all(self) -> None:
        for key, _ in self._store.scan(CF_META, META_GROUP_STATE_PREFIX,
                                       META_GROUP_STATE_PREFIX + b"\xff"):
            topic, group = key[len(META_GROUP_STATE_PREFIX):].decode().split("\0", 1)
            self._group(topic, group, create=True, limit=False)

    def reload(self) -> None:
        """A cluster follower: every group again as RocksDB holds it. Applying the
        write-ahead stream writes the groups' offsets and acks there, not into the groups
        kept here (a follower hands out no lease: nothing held here is lost)."""
        self._receipt_key = self._stored_receipt_key()
        with self._groups_lock:
            self._groups.clear()
            self._per_topic.clear()
            self._labelled = 0
        with self._snapshot_lock:
            self._served = set()
        self._load_all()

    def _seal(self, topic: str, group: str, *, kept: bool) -> Seal:
        """The seal of a group's receipts, under the key made once per data directory and
        kept in RocksDB (receipts stay valid across restarts). A group shown but not kept
        (a read) has issued no receipt: a throwaway key, so none verifies."""
        key = self._receipt_key
        if key is None:
            key = secrets.token_bytes(RECEIPT_KEY_BYTES)
            if kept:  # under _groups_lock: one key, made once
                batch = self._store.batch()
                batch.put(CF_META, META_GROUP_RECEIPT_KEY, key)
                self._store.write(batch)
                self._receipt_key = key
        return Seal(key, topic, group)

    # --- the groups ----------------------------------------------------------------------
    def _find(self, topic: str, group: str) -> Group | None:
        """The group if it exists (a receive made it); nothing is created."""
        found = self._groups.get((topic, group))
        if found is None:
            check_topic(topic, allow_system=True)
            check_group(group)
        return found

    def _group(self, topic: str, group: str, *, create: bool = True,
               limit: bool = True) -> Group:
        """The group, made (a receive) when ``create``: at most ``max_groups_per_topic`` per
        topic (``limit``; Conflict past it). Without ``create``, one that does not exist is
        shown as a new one would be, without keeping it (a read never creates a group)."""
        found = self._groups.get((topic, group))
        if found is not None:
            return found
        check_topic(topic, allow_system=True)
        check_group(group)
        if not create:
            return self._load(topic, group, kept=False)
        with self._groups_lock:
            found = self._groups.get((topic, group))
            if found is None:
                count = self._per_topic.get(topic, 0)
                if limit and count >= self._max_groups:
                    raise Conflict(f"topic {topic!r} has {count} consumer groups, the most it "
                                   f"may have (max_groups_per_topic)")
                found = self._load(topic, group, kept=True)
                if self._labelled < self._metric_labels:
                    self._labelled += 1
                else:
                    found.label = OTHER
                self._per_topic[topic] = count + 1
                self._groups[(topic, group)] = found
        return found

    def _load(self, topic: str, group: str, *, kept: bool) -> Group:
        store = self._store
        retry = retry_topic(topic, group)
        dlq = dlq_topic(topic, group)
        state = store.get(CF_META, state_key(topic, group))
        return Group(
            topic=topic, group=group,
            streams=(self._load_stream(topic, group), self._load_stream(retry, group)),
            dlq_topic=dlq, dlq_cursor=self._offset(dlq, group),
            retrying=0 if state is None else unpack_u64(state), registered=state is not None,
            seal=self._seal(topic, group, kept=kept), label=f"{topic}/{group}",
            quick=float(self._quick_burst), quick_at=self._clock.now_ms())

    def _offset(self, log_topic: str, group: str) -> int:
        return self._offsets.group_offset(log_topic, group)

    def _load_stream(self, log_topic: str, group: str) -> Stream:
        prefix = ack_prefix(log_topic, group)
        runs = {}  # one key per run of acked offsets (first -> end); an empty value: one
        for key, value in self._store.scan(CF_META, prefix, prefix + b"\xff"):
            first = unpack_u64(key, len(prefix))
            runs[first] = unpack_u64(value) if value else first + 1
        return Stream(log_topic, self._offset(log_topic, group), runs)

    def topics(self, topic: str, group: str) -> tuple[str, str]:
        """The logs a receive of the group reads (what a long poll waits on)."""
        check_topic(topic, allow_system=True)
        return topic, retry_topic(topic, check_group(group))

    # --- receive ---------------------------------------------------------------------------
    def receive(self, topic: str, group: str, max_messages: int,
                lease_ms: int) -> LeasedBatch:
        if not 1 <= max_messages <= MAX_PULL_MESSAGES:
            raise InvalidArgument(f"max must be in 1..{MAX_PULL_MESSAGES}")
        if not LEASE_MS_MIN <= lease_ms <= LEASE_MS_MAX:
            raise InvalidArgument(f"leaseMs must be in {LEASE_MS_MIN}..{LEASE_MS_MAX}")
        self._check_running()
        g = self._group(topic, group)
        out: list[LeasedMessage] = []
        columns: tuple[list[bytes], list[str], list[int]] | None = None
        room = self._max_bytes  # bytes of records past the first, as a pull
        with g.lock:
            # leases live in this node's memory, written nowhere: in cluster mode only a
            # leader whose lease holds may hand out (a leader paused past it and resumed
            # must not: the next one leads, without its leases, and sees acks it cannot)
            self._store.check_leading()
            now = self._clock.now_ms()
            until = now + lease_ms
            self._expire(g, now)
            if not g.registered:  # the group shows in stats from now on, also after a restart
                self._write_state(g, g.retrying)
            self._catch_up(g)
            for kind in (RETRY, MAIN):
                stream = g.streams[kind]
                wanted = max_messages - len(out)
                if wanted <= 0 or (out and room <= 0):
                    break
                taken, again = stream.take(wanted, self._end_offset(stream.log_topic),
                                           self._window)
                if not taken:
                    continue
                offsets: list[int] = []
                records: list[LogRecord] = []
                try:
                    payloads = self._read_kept(stream.log_topic, taken, room)
                    if out and payloads and len(payloads[0]) > room:
                        payloads = []  # (only the answer's first message may pass the bound)
                    if kind == MAIN:  # shown as stored: only the offsets are read here
                        # (the last stream read: no room counted for another, ~40 µs)
                        offsets = _offsets_read(taken, payloads, again)
                    else:
                        room -= sum(map(len, payloads))  # (what the topic's read may add)
                        records = decode_log_records(payloads)
                        offsets = [r.queue_offset for r in records]
                finally:  # what could not be read is handed out again later
                    if len(offsets) != len(taken):
                        for offset in set(taken).difference(offsets):
                            stream.counts[offset] = again.get(offset, 1) - 1
                            heapq.heappush(stream.returned, offset)
                if not offsets:
                    continue
                lease = Lease(next(self._lease_ids), until, kind, offsets, again)
                heapq.heappush(g.expiry, (until, lease.lease_id, lease))
                stream.leases.update(dict.fromkeys(offsets, lease))
                receipts = g.issue(lease)
                counts = list(map(lease.count, offsets)) if again else [1] * len(offsets)
                if kind == MAIN:
                    if out:  # after retries: a LeasedMessage each, as theirs
                        out.extend(map(LeasedMessage, receipts, counts, repeat(0), payloads))
                    else:  # the usual receive: kept as columns (LeasedBatch)
                        columns = (payloads, receipts, counts)
                    continue
                for record, receipt, count in zip(records, receipts, counts, strict=True):
                    shown, reconsumed = as_original(topic, record)
                    out.append(LeasedMessage(receipt, count, reconsumed, shown=shown))
            if len(g.expiry) > g.expiry_limit:  # drop the leases that hold nothing any more
                g.expiry = [e for e in g.expiry if e[2].held > 0]
                heapq.heapify(g.expiry)
                g.issued = {e[2].head: e[2] for e in g.expiry if e[2].head in g.issued}
                g.kept = sum(len(lease.receipts) for lease in g.issued.values())
                g.expiry_limit = max(64, 2 * len(g.expiry))  # amortised: O(1) per receive
        if columns is not None:
            return LeasedBatch(payloads=columns[0], receipts=columns[1], counts=columns[2],
                               lease_until=until)
        return LeasedBatch(messages=out, lease_until=until)

    def next_expiry(self, topic: str, group: str) -> int | None:
        """When the group's earliest lease ends (a long poll waits at most until then)."""
        g = self._find(topic, group)
        if g is None:
            return None
        with g.lock:
            return g.expiry[0][0] if g.expiry else None

    def _expire(self, g: Group, now: int) -> None:
        """End the group's leases due by ``now``; count the messages handed back."""
        expired = g.expire(now)
        if expired:
            self._metrics.group_redelivered.labels(g.label).inc(expired)

    def _add_acks(self, g: Group, plan: AckPlan, batch: Batch, retrying: int) -> None:
        """The plan's RocksDB operations (and the group's retry count) into ``batch``."""
        for kind, stream in enumerate(g.streams):
            prefix = ack_prefix(stream.log_topic, g.group)
            committed = plan.committed.get(kind)
            if committed is not None:
                ConsumeQueue.put_group_offset(batch, stream.log_topic, g.group, committed)
                if stream.runs:  # runs now below the committed offset
                    batch.delete_many(CF_META, [prefix + pack_u64(first)
                                                for first in stream.runs if first < committed])
            else:
                committed = stream.committed
            taken = plan.accepted[kind]
            above = sorted(o for o in taken if o >= committed) if taken and plan.highest[
                kind] >= committed else None
            if above:  # gaps below them remain: kept until they fill, a key per run
                runs = plan.runs[kind] = ack_runs(above)
                batch.put_many(CF_META, [(prefix + pack_u64(first), pack_u64(end))
                                         for first, end in runs])
        batch.put(CF_META, state_key(g.topic, g.group), pack_u64(retrying))

    # --- ack / nack --------------------------------------------------------------------------
    def _decode(self, topic: str, group: str, receipts: Sequence[str]
                ) -> tuple[Group, tuple[list[int], list[int], list[int]]]:
        """The group and its receipts' columns (Group.decode): InvalidArgument for a request
        that is not receipts, NotFound for a receipt this server did not issue to this group
        (also when the group does not exist: nothing is created)."""
        self._check_running()
        g = self._find(topic, group)
        if g is None:
            parse_receipts(receipts)
            raise NotFound(f"topic {topic!r} has no consumer group {group!r}: its receipts "
                           f"are not this server's")
        return g, g.decode(receipts)

    def _plan(self, g: Group, receipts: Sequence[str],
              decoded: tuple[list[int], list[int], list[int]]) -> AckPlan:
        ends = (self._end_offset(g.streams[MAIN].log_topic),
                self._end_offset(g.streams[RETRY].log_topic))
        return g.plan(receipts, decoded, ends, self._window)

    def ack(self, topic: str, group: str, receipts: Sequence[str]) -> AckCounts:
        g, decoded = self._decode(topic, group, receipts)
        with g.lock:
            self._expire(g, self._clock.now_ms())
            plan = self._plan(g, receipts, decoded)
            retrying = g.retrying - len(plan.accepted[RETRY])
            if plan.taken:
                batch = self._store.batch()
                self._add_acks(g, plan, batch, retrying)
                self._store.write(batch)
                g.apply(plan, retrying)
                self._metrics.group_acked.labels(g.label).inc(plan.taken)
        return AckCounts(acked=plan.taken, stale=plan.stale)

    def nack(self, topic: str, group: str, receipts: Sequence[str], *,
             delay_level: int | None = None, delay_ms: int | None = None) -> NackCounts:
        """Retry later (at ``delay_ms``, at ``delay_level``, or RocketMQ's level 3 +
        reconsumeTimes); a message nacked ``max_reconsume_times`` times already becomes a
        dead letter instead."""
        if delay_level is not None and delay_ms is not None:
            raise InvalidArgument("give at most one of delayLevel and delayMs")
        if delay_level is not None and (type(delay_level) is not int or delay_level < 1):
            raise InvalidArgument(f"delayLevel must be an integer >= 1, got {delay_level!r}")
        g, decoded = self._decode(topic, group, receipts)
        with g.lock:
            now = self._clock.now_ms()
            self._expire(g, now)
            plan = self._plan(g, receipts, decoded)
            if not plan.taken:
                return NackCounts(retrying=0, dead_lettered=0, stale=plan.stale)
            quick = plan.taken if delay_ms is not None and delay_ms < QUICK_RETRY_MS else 0
            if quick:
                self._quick(g, quick, now, whole=True)
            messages: list[PreparedMessage] = []
            dead = 0
            room = self._max_bytes  # bytes of records past the first, as a receive
            for kind, stream in enumerate(g.streams):
                offsets = sorted(plan.accepted[kind])
                payloads = self._read(stream.log_topic, offsets, room) if offsets else []
                size = sum(map(len, payloads))
                if (messages and size > room) or (len(payloads) < len(offsets) and self._read(
                        stream.log_topic, offsets[len(payloads):len(payloads) + 1])):
                    raise PayloadTooLarge(
                        f"the messages of these receipts hold more than max_answer_bytes "
                        f"({self._max_bytes}) past the first, more than a receive hands out: "
                        f"nack them in smaller requests")
                room -= size
                records = decode_log_records(payloads)
                if len(records) != len(offsets):
                    raise NotFound(f"messages of {stream.log_topic!r} at offsets {offsets} are "
                                   f"not all in the log")
                for record in records:
                    shown, reconsumed = self._as_topic_message(g, kind, record)
                    if reconsumed >= self._max_reconsume:
                        dead += 1
                        messages.append(self._prepare(g.dlq_topic, shown, reconsumed, now,
                                                      delay_ms=0))
                    elif delay_ms is not None:
                        messages.append(self._prepare(g.streams[RETRY].log_topic, shown,
                                                      reconsumed + 1, now, delay_ms=delay_ms))
                    else:
                        level = delay_level or DEFAULT_RETRY_LEVEL + reconsumed
                        messages.append(self._prepare(g.streams[RETRY].log_topic, shown,
                                                      reconsumed + 1, now, delay_level=level))
            retried = len(messages) - dead
            retrying = (g.retrying + retried
                        - len(plan.accepted[RETRY]))
            self._submit(messages, extra=lambda batch: self._add_acks(g, plan, batch, retrying),
                         atomic=True)
            g.apply(plan, retrying)
            g.quick -= quick
        self._metrics.group_nacked.labels(g.label).inc(plan.taken)
        if dead:
            self._metrics.group_dead_lettered.labels(g.label).inc(dead)
        return NackCounts(retrying=retried, dead_lettered=dead, stale=plan.stale)

    def _prepare(self, log_topic: str, shown: LogRecord, reconsume_times: int, now: int, *,
                 delay_ms: int | None = None, delay_level: int | None = None
                 ) -> PreparedMessage:
        """A retry (or dead letter) of ``shown``: its body, tags, keys and properties, and
        where it came from."""
        properties = dict(shown.properties)
        properties[PROP_ORIGIN_MESSAGE_ID] = shown.msg_id
        properties[PROP_ORIGIN_OFFSET] = str(shown.queue_offset)
        properties[PROP_ORIGIN_BORN_AT] = str(shown.born_at)
        properties[PROP_RECONSUME_TIME] = str(reconsume_times)
        request = SendRequest(topic=log_topic, body=shown.body, tags=shown.tags,
                              keys=shown.keys, properties=properties, delay_ms=delay_ms,
                              delay_level=delay_level)
        return self._intake.prepare(request, now, allow_system=True)

    @staticmethod
    def _as_topic_message(g: Group, kind: int, record: LogRecord) -> tuple[LogRecord, int]:
        """The message as its topic knows it, and its reconsumeTimes: a retry (or dead
        letter) shows the original's msgId, topic, offset, bornAt and properties."""
        if kind == MAIN:
            return record, 0
        return as_original(g.topic, record)

    # --- state, offsets, dead letters ----------------------------------------------------------
    def state(self, topic: str, group: str) -> GroupProgress:
        """The group's state; a group no receive made shows as a new one would (and is not
        made). A cluster follower (``applying``) reads it as RocksDB holds it."""
        self._check_running()
        if self.applying:  # apply writes the groups' state there, not into the ones kept here
            return self._state(self._load(check_topic(topic, allow_system=True),
                                          check_group(group), kept=False))
        return self._state(self._group(topic, group, create=False))

    def _state(self, g: Group) -> GroupProgress:
        topic = g.topic
        with g.lock:
            self._expire(g, self._clock.now_ms())
            committed, lost = self._behind(g)
            return GroupProgress(
                committed_offset=committed,
                end_offset=self._end_offset(topic), leased=g.leased, retrying=g.retrying,
                dead_lettered=self._end_offset(g.dlq_topic) - max(
                    g.dlq_cursor, self.first_offset(g.dlq_topic)),  # (retention deletes some)
                expired=self._stored_expired(g) + lost)

    def offset(self, topic: str, group: str) -> int:
        """The group's committed offset in ``topic`` (0: none committed yet)."""
        check_topic(topic, allow_system=True)
        check_group(group)
        self._check_running()
        return self._offsets.group_offset(topic, group)

    def read_offset(self, topic: str, group: str) -> int:
        """Where a pull or stream by ``group`` (no offset given) starts: its committed
        offset, moved up to the topic's first offset when retention deleted past it (the
        messages it lost count as ``expired``: ``catch_up``)."""
        offset = self.offset(topic, group)
        if offset < self.first_offset(topic):
            offset = self.catch_up(topic, group)
        return offset

    def set_offset(self, topic: str, group: str, offset: int) -> int:
        """Move the committed offset (skip or replay): acks above it are forgotten and every
        lease of the group ends."""
        if type(offset) is not int or offset < 0:
            raise InvalidArgument("offset must be an integer >= 0")
        self._check_running()
        g = self._find(topic, group)
        end = self._end_offset(topic)
        if offset > end:
            raise InvalidArgument(f"offset {offset} is beyond the end of {topic!r} ({end})")
        if g is None:
            with self._groups_lock:  # (no receive makes it meanwhile)
                g = self._groups.get((topic, group))
                if g is None:  # a group of pulls only: its offset, nothing more
                    batch = self._store.batch()
                    ConsumeQueue.put_group_offset(batch, topic, group, offset)
                    self._store.write(batch)
                    return offset
        with g.lock:
            main = g.streams[MAIN]
            batch = self._store.batch()
            ConsumeQueue.put_group_offset(batch, topic, group, offset)
            prefix = ack_prefix(topic, group)
            batch.delete_many(CF_META, [prefix + pack_u64(first) for first in main.runs])
            self._store.write(batch)
            main.drop_leases()
            main.committed = main.handed = offset
            main.acked.clear()
            main.runs.clear()
            main.returned.clear()
            main.counts.clear()
            g.streams[RETRY].drop_leases()
        return offset

    def dead_letters(self, topic: str, group: str, offset: int | None,
                     max_messages: int) -> DeadLetters:
        """Dead letters from ``offset`` of the dead-letter log (default: the first one not
        redriven)."""
        if not 1 <= max_messages <= MAX_PULL_MESSAGES:
            raise InvalidArgument(f"max must be in 1..{MAX_PULL_MESSAGES}")
        if offset is not None and offset < 0:
            raise InvalidArgument("offset must be >= 0")
        self._check_running()
        g = self._group(topic, group, create=False)
        first = self.first_offset(g.dlq_topic)  # (retention deletes dead letters too)
        if offset is not None and offset < first:
            raise OffsetExpired(f"dead letter {offset} was deleted by retention; the "
                                f"dead-letter log starts at {first}", first_offset=first)
        start = max(g.dlq_cursor, first) if offset is None else offset
        end = min(self._end_offset(g.dlq_topic), start + max_messages)
        records = decode_log_records(self._read(g.dlq_topic, range(start, end), self._max_bytes))
        return DeadLetters(messages=[as_original(topic, r) for r in records],
                           next_offset=records[-1].queue_offset + 1 if records else start)

    def redrive(self, topic: str, group: str, max_messages: int) -> int:
        """Hand up to ``max_messages`` dead letters back to the group (as retries due now,
        reconsumeTimes 0), oldest first; one write. Bounded in bytes as a pull, and by the
        group's quick retries (``_quick``: TooManyRequests when none is left)."""
        if not 1 <= max_messages <= MAX_PULL_MESSAGES:
            raise InvalidArgument(f"max must be in 1..{MAX_PULL_MESSAGES}")
        self._check_running()
        g = self._find(topic, group)
        if g is None:  # no receive made it: it has no dead letters
            return 0
        with g.lock:
            now = self._clock.now_ms()
            cursor = max(g.dlq_cursor, self.first_offset(g.dlq_topic))  # (retention)
            end = min(self._end_offset(g.dlq_topic), cursor + max_messages)
            if end <= cursor:
                return 0
            end = min(end, cursor + self._quick(g, end - cursor, now))
            records = decode_log_records(self._read(g.dlq_topic, range(cursor, end),
                                                    self._max_bytes))
            if not records:
                return 0
            cursor = records[-1].queue_offset + 1
            messages = [self._prepare(g.streams[RETRY].log_topic, as_original(topic, r)[0], 0,
                                      now, delay_ms=0) for r in records]
            retrying = g.retrying + len(messages)

            def extra(batch: Batch) -> None:
                ConsumeQueue.put_group_offset(batch, g.dlq_topic, group, cursor)
                batch.put(CF_META, state_key(topic, group), pack_u64(retrying))

            self._submit(messages, extra=extra, atomic=True)
            g.dlq_cursor, g.retrying, g.registered = cursor, retrying, True
            g.quick -= len(messages)
        return len(messages)

    def _quick(self, g: Group, n: int, now: int, *, whole: bool = False) -> int:
        """How many of ``n`` quick retries (nacked with delayMs < 1 s, or redriven) the group
        may make now: its bucket refills at ``group_quick_retries_per_s`` up to
        ``group_quick_retry_burst`` (engine clock). TooManyRequests, with the seconds until
        there is room, when it holds less than one (``whole``: less than ``n``, or a full
        bucket when ``n`` is more). Bounds how fast a consumer can grow the log by nacking
        at once and redriving, forever."""
        if now > g.quick_at:
            g.quick = min(float(self._quick_burst),
                          g.quick + (now - g.quick_at) * self._quick_rate / 1000.0)
            g.quick_at = now
        need = min(n, self._quick_burst) if whole else 1
        if g.quick >= need:
            return min(n, int(g.quick))
        raise TooManyRequests(
            f"group {g.group!r} of topic {g.topic!r} may make {max(int(g.quick), 0)} quick "
            f"retries now (nacked messages with delayMs < {QUICK_RETRY_MS}, redriven dead "
            f"letters), not {n}: at most {self._quick_rate} a second, {self._quick_burst} at "
            f"once",
            retry_after_s=max(1, math.ceil((need - g.quick) / self._quick_rate)))

    # --- CommitLog retention (scheduler/retention.py) -------------------------------------------
    def catch_up(self, topic: str, group: str) -> int:
        """Move the group past what retention deleted (``_catch_up``); returns its committed
        offset in the topic's log (a pull or stream by group starts there)."""
        self._check_running()
        # moving a group is a write: it keeps the group (a pull group too), past the cap
        g = self._group(topic, group, create=True, limit=False)
        with g.lock:
            self._catch_up(g)
            return g.streams[MAIN].committed

    def _catch_up(self, g: Group) -> None:
        """A stream whose committed offset fell below its log's first offset continues from
        that first offset: the offsets in between that it had not acknowledged count as
        ``expired`` (stored, and in /metrics per group), its acks and leases below go. One
        write; the memory follows only once it succeeded. Under the group's lock."""
        moves: list[tuple[Stream, int, dict[int, int]]] = []
        lost = 0
        batch: Batch | None = None
        for stream in g.streams:
            first = self.first_offset(stream.log_topic)
            if stream.committed >= first:
                continue
            acked = sum(1 for o in stream.acked if o < first)
            lost += first - stream.committed - acked
            if batch is None:
                batch = self._store.batch()
            ConsumeQueue.put_group_offset(batch, stream.log_topic, g.group, first)
            prefix = ack_prefix(stream.log_topic, g.group)
            runs = {}
            for start, end in stream.runs.items():
                if start < first:
                    batch.delete(CF_META, prefix + pack_u64(start))
                    if end > first:  # a run across the first offset: kept from there
                        batch.put(CF_META, prefix + pack_u64(first),
                                  b"" if end == first + 1 else pack_u64(end))
                        runs[first] = end
                else:
                    runs[start] = end
            moves.append((stream, first, runs))
        if batch is None:
            return
        expired = self._stored_expired(g) + lost
        batch.put(CF_META, expired_key(g.topic, g.group), pack_u64(expired))
        self._store.write(batch)
        self._expired[(g.topic, g.group)] = expired
        if lost:
            self._metrics.group_expired.labels(g.name).inc(lost)
        for stream, first, runs in moves:
            for offset, lease in list(stream.leases.items()):
                if offset < first:
                    del stream.leases[offset]
                    lease.held -= 1
            stream.returned = [o for o in stream.returned if o >= first]
            heapq.heapify(stream.returned)
            stream.counts = {o: n for o, n in stream.counts.items() if o >= first}
            stream.acked = {o for o in stream.acked if o >= first}
            stream.runs = runs
            stream.committed = first
            stream.handed = max(stream.handed, first)

    def _read_kept(self, log_topic: str, offsets: Sequence[int],
                   max_bytes: int | None = None) -> list[bytes]:
        """``_read``, or nothing when retention deleted a segment between this receive's
        ``_catch_up`` and its read: the offsets are handed out again, and the next receive
        moves past what went."""
        try:
            return self._read(log_topic, offsets, max_bytes)
        except OffsetExpired:
            return []

    def _behind(self, g: Group) -> tuple[int, int]:
        """(the main stream's committed offset as the next read will see it, the messages
        the streams will count as expired then), without writing: reading a group never
        creates or changes it. Under the group's lock."""
        lost = 0
        committed = g.streams[MAIN].committed
        for kind, stream in enumerate(g.streams):
            first = self.first_offset(stream.log_topic)
            if stream.committed < first:
                lost += first - stream.committed - sum(1 for o in stream.acked if o < first)
                if kind == MAIN:
                    committed = first
        return committed, lost

    def _stored_expired(self, g: Group) -> int:
        key = (g.topic, g.group)
        found = self._expired.get(key)
        if found is None:
            raw = self._store.get(CF_META, expired_key(g.topic, g.group))
            found = self._expired[key] = 0 if raw is None else unpack_u64(raw)
        return found

    # --- stats and metrics ---------------------------------------------------------------------
    def stats(self) -> dict[str, GroupStats]:
        """Per group ("topic/group"): backlog (end - committed offset), leased, retrying,
        dead-lettered, and redeliveries after a lease expired."""
        out = {}
        with self._groups_lock:
            groups = sorted(self._groups.items())
        for _, g in groups:
            state = self._state(g)
            out[g.name] = GroupStats(
                backlog=state.end_offset - state.committed_offset,
                committed_offset=state.committed_offset, end_offset=state.end_offset,
                leased=state.leased, retrying=state.retrying,
                dead_lettered=state.dead_lettered, redelivered=g.redelivered)
        return out

    def _gauge(self, name: str) -> Callable[[], dict[str, float]]:
        """The values of one of the four group gauges. One walk of the groups serves all
        four: a gauge that asks again (the next scrape) makes a new one."""
        def values() -> dict[str, float]:
            with self._snapshot_lock:
                if name in self._served or not self._served:
                    self._snapshot = self._metric_values()
                    self._served = set()
                self._served.add(name)
                return self._snapshot[name]
        return values

    def _metric_values(self) -> dict[str, dict[str, float]]:
        """Per label (the first ``group_metric_labels`` groups by their own, the rest summed
        under ``__other__``): backlog, leased, retrying, dead-lettered. One pass, without the
        groups' locks (a group with a lease due is expired first)."""
        with self._groups_lock:
            groups = list(self._groups.values())
        now = self._clock.now_ms()
        ends: dict[str, int] = {}

        def end(topic: str) -> int:
            found = ends.get(topic)
            if found is None:
                found = ends[topic] = self._end_offset(topic)
            return found

        out: dict[str, dict[str, float]] = {n: {} for n in _GAUGES}
        backlog, leased, retrying, dead = (out[n] for n in _GAUGES)
        for g in groups:
            try:
                due = g.expiry[0][0] <= now
            except IndexError:  # (no lease, or the last one just went: read without the lock)
                due = False
            if due:
                with g.lock:
                    self._expire(g, now)
            label, main = g.label, g.streams[MAIN]
            backlog[label] = backlog.get(label, 0) + end(g.topic) - main.committed
            leased[label] = leased.get(label, 0) + len(main.leases) + len(
                g.streams[RETRY].leases)
            retrying[label] = retrying.get(label, 0) + g.retrying
            dead[label] = dead.get(label, 0) + self._end_offset(g.dlq_topic) - g.dlq_cursor
        return out

    def _write_state(self, g: Group, retrying: int) -> None:
        batch = self._store.batch()
        batch.put(CF_META, state_key(g.topic, g.group), pack_u64(retrying))
        self._store.write(batch)
        g.registered = True


_GAUGES = ("backlog", "leased", "retrying", "dead_lettered")


def _offsets_read(taken: list[int], payloads: list[bytes], again: dict[int, int]) -> list[int]:
    """The queue offsets of the records ``payloads`` read for ``taken``, in order. New offsets
    only (none handed out ``again``) are taken in increasing order; when they are one run and
    every one was read, the read returned the run's records in order: those are its offsets,
    and the records' heads are not read for them (57 µs a receive of 1000, in process)."""
    n = len(payloads)
    if not again and n and n == len(taken) and taken[-1] - taken[0] + 1 == n:
        return taken
    return log_record_offsets(payloads)


def expired_key(topic: str, group: str) -> bytes:
    """CF_META key of the messages ``group`` of ``topic`` lost to CommitLog retention."""
    return META_GROUP_EXPIRED_PREFIX + topic.encode() + b"\0" + group.encode()


def read_payloads(read_many: Callable[[list[int], int | None], list[bytes]],
                  positions: Callable[[str, int, int], list[int]]) -> ReadPayloads:
    """``read(log_topic, offsets, max_bytes)``: the LogRecord bytes at those queue offsets,
    in offset order, one consume-queue range read per run of consecutive offsets (fewer when
    some are not in the log); with ``max_bytes``, the first of them past which the rest
    would add up to more (a bounded answer, as a pull: CommitLog.read_many)."""
    def read(log_topic: str, offsets: Sequence[int],
             max_bytes: int | None = None) -> list[bytes]:
        wanted = sorted(offsets)
        if wanted and wanted[-1] - wanted[0] + 1 == len(wanted):  # one run (offsets unique)
            return read_many(positions(log_topic, wanted[0], len(wanted)), max_bytes)
        found: list[int] = []
        i = 0
        while i < len(wanted):
            j = i + 1
            while j < len(wanted) and wanted[j] == wanted[j - 1] + 1:
                j += 1
            found.extend(positions(log_topic, wanted[i], j - i))
            i = j
        return read_many(found, max_bytes)
    return read


class ReadPayloads(Protocol):
    def __call__(self, log_topic: str, offsets: Sequence[int],
                 max_bytes: int | None = None) -> list[bytes]: ...


__all__ = [
    "LEASE_MS_MAX",
    "LEASE_MS_MIN",
    "AckCounts",
    "DeadLetters",
    "GroupManager",
    "GroupProgress",
    "LeasedBatch",
    "LeasedMessage",
    "NackCounts",
    "read_payloads",
]
