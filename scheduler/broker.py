"""The engine: one Broker object that the API and the CLI drive.

The Broker holds the running parts and their lifecycle (start, close, the cluster roles:
``become``, ``apply``); ``build_engine`` (scheduler/engine.py) opens storage and builds and
wires the parts. Groups, transactions and parked messages are reached as objects
(``groups``, ``transactions``, ``quarantine``); the Broker's own methods are what needs more
than one part.

How the parts meet (docs/engine.md has the reasons and the measurements):

    send ──► Intake.prepare ──► shard locks ──► due now / below the scan frontier? ──► Committer
                                     │                                                    ▲
                                     └── else: timer key + index SCHEDULED (one write)    │
    Scanner (one per timer shard) ──► bounded queue ──► DeliveryStage ───────────────────►┘
                                                                        CommitLog append, then
                                                                        ONE RocksDB write

Locks, always taken in this order: shard locks (ascending shard number) ─► commit lock.
A send holds the locks of its shards while it checks idempotency and writes; a cancel
holds its shard's lock and the commit lock; the delivery stage holds only the commit lock;
a scanner holds only its shard's lock, and only while it scans.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Protocol

from scheduler.clock import Clock, SystemClock
from scheduler.config import EngineConfig
from scheduler.engine import (
    EngineParts,
    LogFactory,
    StoreFactory,
    build_engine,
    open_commitlog,
    open_store,
)
from scheduler.groups import GroupManager
from scheduler.intake import ColumnBatch, check_msg_id, check_topic
from scheduler.listeners import BudgetedListener, DeliveryListener
from scheduler.listing import list_scheduled
from scheduler.metrics import EngineMetrics
from scheduler.model import (
    Cancelled,
    EngineStats,
    MessageLookup,
    PulledPage,
    SendOutcome,
    SendRequest,
    TopicStats,
)
from scheduler.overview import (
    OverviewCounts,
    delivered_by_topic,
    disk_bytes,
    waiting_transactions,
)
from scheduler.poison import Quarantine
from scheduler.retention import disk_used_ratio
from scheduler.timeline import TimelineView
from scheduler.timer_index import TimerIndex
from scheduler.transactions import TransactionManager
from storage.commitlog import CHECKPOINT_NAME
from storage.constants import (
    CF_INDEX,
    COMMITLOG_DIR,
    MAX_BATCH_MESSAGES,
    MAX_PULL_MESSAGES,
    ROCKSDB_DIR,
    SNAPSHOTS_DIR,
)
from storage.errors import (
    InvalidArgument,
    NotFound,
    NotLeader,
    OffsetExpired,
    Unavailable,
)
from storage.keys import decode_handle, index_key
from storage.records import decode_index, decode_log_records, log_record_head
from storage.replication import Sink, applied_seq
from storage.segment import NAME_PATTERN

log = logging.getLogger(__name__)

#: a Broker's roles: single-node mode is always "leader"; in cluster mode a node starts as
#: "follower" and a ClusterControl moves it (``Broker.become``)
LEADER, FOLLOWER, STARTING = "leader", "follower", "starting"
#: a cluster follower recounts what its engine does not keep up while it applies (pending
#: per topic and level, prepared transactions, the groups' offsets) at most this often
FOLLOWER_RECOUNT_MS = 1000


class ClusterControl(Protocol):
    """What a Broker in cluster mode is driven by (scheduler/cluster/node.py)."""

    def prepare(self, data_dir: Path) -> None:
        """Before the engine opens: reach the cluster; an empty data directory is filled from
        the cluster's snapshot, if there is one."""

    def start(self, broker: Broker) -> None:
        """Begin (the broker is open as a follower): apply the stream, watch the lease."""

    def close(self) -> None: ...

    @property
    def ready(self) -> bool:
        """Caught up closely enough to answer reads (``/readyz``)."""

    def view(self) -> dict[str, Any]:
        """The answer of ``GET /v1/cluster``."""

    @property
    def leader_url(self) -> str | None:
        """Where writes go (None: no leader known)."""

    @property
    def lag_ms(self) -> int:
        """How long since this node last was at the stream's end (0: the leader)."""


def copy_log_files(src: Path, dest: Path) -> None:
    """The CommitLog's files, hard-linked (instant, whatever the log's size): its
    checkpoint first (the segments hold at least what it says; it is replaced, never
    rewritten, so the link keeps this one), then the segments. Bytes below the recorded log
    end are never written again; what is appended after the link is cut on restore."""
    dest.mkdir(parents=True)
    names = sorted(p.name for p in src.iterdir() if NAME_PATTERN.match(p.name))
    if (src / CHECKPOINT_NAME).exists():
        shutil.copyfile(src / CHECKPOINT_NAME, dest / CHECKPOINT_NAME)
    for name in names:
        try:
            os.link(src / name, dest / name)
        except OSError:  # (another file system)
            shutil.copyfile(src / name, dest / name)


class Broker:
    def __init__(
        self, config: EngineConfig, clock: Clock | None = None, *,
        log_factory: LogFactory | None = None, store_factory: StoreFactory | None = None,
        cluster: ClusterControl | None = None,
    ) -> None:
        """``log_factory`` / ``store_factory`` open the CommitLog and the RocksStore (default:
        ``open_commitlog`` / ``open_store``); tests pass ones that wrap them to inject faults.
        ``cluster``: cluster mode (docs/cluster.md): the node starts as a follower."""
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.levels = config.check()
        self.metrics = EngineMetrics()
        self._log_factory = log_factory or open_commitlog
        self._store_factory = store_factory or open_store
        self._state = "new"  # new -> running -> closing -> closed
        self._state_lock = threading.Lock()
        self._listeners: list[Callable[[Collection[str]], None]] = []
        self._parts: EngineParts | None = None  # the open engine's (scheduler/engine.py)
        self.cluster = cluster
        self.role = LEADER if cluster is None else STARTING
        self._role_lock = threading.Lock()  # become / apply
        # a follower's last recount: (applied seq, when it ended, how long it took), ms
        self._recounted: tuple[int, int, int] | None = None

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Open storage, recover (replay the log past the applied position), start threads."""
        with self._state_lock:
            if self._state != "new":
                raise InvalidArgument(f"a Broker starts once (it is {self._state})")
            self._state = "starting"
        try:
            if self.cluster is not None:
                self.cluster.prepare(self.config.data_dir)
            self._open(FOLLOWER if self.cluster is not None else LEADER)
        except BaseException:
            self._shutdown()
            with self._state_lock:
                self._state = "closed"
            raise
        with self._state_lock:
            self._state = "running"
        if self.cluster is not None:
            try:
                self.cluster.start(self)
            except BaseException:
                self.close()
                raise

    def _open(self, role: str, sink: Sink | None = None, last_seq: int | None = None) -> None:
        """Open storage and build the engine as ``role`` (scheduler/engine.py). A follower
        recovers nothing and runs no thread (no scanner, delivery, maintenance or
        check-back): it applies the write-ahead stream (``apply``). A cluster leader ships
        every write to ``sink``."""
        self._parts = parts = build_engine(
            self.config, levels=self.levels, clock=self.clock, metrics=self.metrics,
            follower=role == FOLLOWER, clustered=self.cluster is not None,
            check_running=self._check_running, notify=self._notify,
            store_factory=self._store_factory, log_factory=self._log_factory,
            sink=sink, last_seq=last_seq)
        parts.start()
        self._recounted = None
        self.role = role

    @property
    def parts(self) -> EngineParts:
        """The open engine's parts (scheduler/engine.py); Unavailable before it opened."""
        parts = self._parts
        if parts is None:
            raise Unavailable(f"the engine is {self._state}")
        return parts

    def recount_applied(self) -> None:
        """A cluster follower: the counts its engine would keep up as leader, taken again
        from what it applied (``apply`` writes RocksDB and the log, past the engine): the
        backlog (``pending``, per topic, oldest, per level, the timeline), the prepared
        transactions and the groups' offsets (``group_backlog``). Only when it applied
        something since the last time, at most every ``FOLLOWER_RECOUNT_MS`` and never
        more than a tenth of the time (it scans those keys, and apply waits meanwhile).
        Nothing on a leader: it keeps them as it writes."""
        if self.role != FOLLOWER or not self._role_lock.acquire(timeout=1.0):
            return  # (a become under way: the counts as they were)
        try:
            parts = self._parts
            guard = None if parts is None else parts.guard
            if parts is None or guard is None or self._state != "running":
                return
            now, last = self.clock.now_ms(), self._recounted
            if last is not None and (last[0] == guard.seq or now - last[1] < max(
                    FOLLOWER_RECOUNT_MS, 10 * last[2])):
                return
            seq = guard.seq
            self.metrics.pending.set(parts.backlog.rebuild())
            parts.transactions.recount()
            parts.groups.reload()
            done = self.clock.now_ms()
            self._recounted = (seq, done, done - now)
        finally:
            self._role_lock.release()

    # --- cluster mode --------------------------------------------------------------------
    def become(self, role: str, sink: Sink | None = None, last_seq: int | None = None,
               replace: Callable[[Path], None] | None = None) -> None:
        """Cluster mode: close this engine and open it again on the same data directory as
        ``role`` (every cache rebuilt by the normal start path); a leader publishes to
        ``sink`` after ``last_seq`` (default: what it applied); ``replace(data_dir)`` runs while
        the engine is closed (a follower restored from a snapshot). Requests meanwhile answer
        NotLeader (503 + Retry-After). Raises what opening raised (the node is then
        STARTING, every request NotLeader, until a later ``become`` works)."""
        with self._role_lock:
            with self._state_lock:
                if self._state != "running" and self._state != "starting":
                    raise Unavailable(f"the engine is {self._state}")
                self._state = "starting"
            self.role = STARTING
            self._shutdown()
            self._parts = None
            try:
                if replace is not None:
                    replace(self.config.data_dir)
                self._open(role, sink, last_seq)
            except BaseException:
                log.exception("could not open the engine as %s", role)
                self._shutdown()
                self._parts = None
                raise
            with self._state_lock:
                self._state = "running"

    @property
    def deposed(self) -> str | None:
        """Why this cluster leader may not write any more (None: it may, or not a leader)."""
        parts = self._parts
        return None if parts is None or parts.replicator is None else parts.replicator.deposed

    @property
    def applied_seq(self) -> int:
        """The write-ahead stream's sequence this node has applied (0: single-node mode)."""
        parts = self._parts
        if parts is None:
            return 0
        if parts.guard is not None:
            return parts.guard.seq
        if parts.replicator is not None:  # what this node holds: a record published but
            return parts.replicator.written_seq  # not yet written here is not applied
        return 0 if parts.store.closed else applied_seq(parts.store)

    def cluster_view(self) -> dict[str, Any]:
        """``GET /v1/cluster``'s answer (single-node mode: the fixed one of the contract)."""
        if self.cluster is None:
            return {"nodeId": "single", "role": LEADER, "leader": None, "appliedSeq": 0,
                    "nodes": []}
        return self.cluster.view()

    def cluster_checkpoint(self, dest: Path) -> int:
        """A cluster leader: a consistent copy of this node's data at ``dest`` (RocksDB
        checkpoint + the CommitLog's files, taken with no record in flight); returns the
        sequence it holds. What the log holds past the recorded end is cut on restore."""
        parts = self._parts
        rep = None if parts is None else parts.replicator
        if parts is None or rep is None or self._state != "running":
            raise NotLeader("only the cluster's leader takes snapshots")
        store = parts.store
        dest.mkdir(parents=True, exist_ok=True)
        with rep.lock:
            seq = applied_seq(store)
            store.checkpoint(dest / ROCKSDB_DIR)
            copy_log_files(self.config.data_dir / COMMITLOG_DIR, dest / COMMITLOG_DIR)
        return seq

    @property
    def consumed_seq(self) -> int:
        """A follower: the last stream message it took (a piece of a record too)."""
        guard = None if self._parts is None else self._parts.guard
        return self.applied_seq if guard is None else guard.consumed

    def apply(self, seq: int, data: bytes) -> None:
        """A follower: take the write-ahead stream's message ``seq``; when it completes a
        record, apply it, refresh what the engine caches and wake the readers of the topics
        it appended to."""
        with self._role_lock:
            parts = self._parts
            guard = None if parts is None else parts.guard
            if parts is None or guard is None or self._state != "running":
                raise NotLeader("this node is not a running follower")
            record = guard.apply(seq, data)
            if record is None:
                return
            topics = {log_record_head(p).topic for kind, _, payloads in record.log_ops
                      if payloads for p in payloads}
            if record.log_ops or record.ops:
                parts.queues.forget()
            if record.ops:
                # the leader's retention ships its RocksDB write (the first offsets and
                # META_LOG_FIRST_POSITION); the segment files below go here as they went there
                parts.queues.forget_firsts()
                if parts.retention is not None:
                    parts.retention.resume()
            parts.reload_frontiers()  # delivery commits move the frontiers
        if topics:
            self._notify(topics)

    def close(self) -> None:
        """Stop intake, stop the scanners, hand back queued batches (they are still in
        RocksDB), wait for sends and cancels in progress, flush the log, close storage."""
        if self.cluster is not None:
            self.cluster.close()
        with self._state_lock:
            if self._state in ("closed", "closing", "new"):
                self._state = "closed" if self._state == "new" else self._state
                return
            self._state = "closing"
        try:
            self._shutdown()
        finally:
            with self._state_lock:
                self._state = "closed"

    def _shutdown(self) -> None:
        if self._parts is not None:
            self._parts.stop()

    def __enter__(self) -> Broker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def ready(self) -> bool:
        """Storage open and taking writes, recovery done, delivery stage not blocked by
        failures. While the store refuses writes (a full disk), reading this may try to
        recover it (RocksStore.writable): read it off the event loop."""
        if self.cluster is not None and not (self._state == "running" and self.cluster.ready):
            return False
        parts = self._parts
        if parts is None:
            return False
        if self.role == FOLLOWER:
            return not parts.store.closed
        return (self._state == "running" and not parts.delivery.blocked
                and not parts.committer.needs_replay and parts.store.writable)

    def drain(self, timeout_s: float = 30.0) -> None:
        """Block until every message due at the clock's current time is in the log; raises
        TimeoutError after ``timeout_s`` real seconds (e.g. while delivery keeps failing)."""
        parts = self._running()
        target = self.clock.now_ms()
        deadline = time.monotonic() + timeout_s
        progress = parts.progress
        with progress.cond:
            while not (progress.committed >= progress.handed
                       and all(st.covered_ms >= target for st in parts.shards)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"messages due at {target} not all delivered within "
                                       f"{timeout_s} s")
                progress.cond.wait(remaining)

    # --- producing ------------------------------------------------------------------------
    def send(self, request: SendRequest) -> SendOutcome:
        """Raises InvalidArgument / DelayTooLong / Unavailable (storage.errors)."""
        return self.send_batch([request])[0]

    def send_batch(self, requests: Sequence[SendRequest]) -> list[SendOutcome]:
        """All requests are validated before anything is stored; one atomic write."""
        if len(requests) > MAX_BATCH_MESSAGES:
            raise InvalidArgument(f"a batch holds at most {MAX_BATCH_MESSAGES} messages")
        parts = self._running()
        now = self.clock.now_ms()
        if requests:  # the common case from columns (Intake.columns), as the API's sends
            columns = parts.intake.columns(requests[0].topic, list(requests), now)
            if columns is not None and parts.writes.submit_columns(columns):
                return columns.results()
        prepare = parts.intake.prepare
        return parts.writes.submit([prepare(r, now) for r in requests])

    def send_columns(self, topic: str, messages: list[Any] | bytes, unset: object = None, *,
                     max_count: int = MAX_BATCH_MESSAGES, json: bool = False
                     ) -> ColumnBatch | None:
        """A send batch of body-only messages (``Intake.columns``: bodies due later, nothing else)
        stored from columns, with no object per message: what ``send_batch`` would store and
        answer. ``messages``: as the API decoded them (``unset`` marking an absent field),
        or a msgpack request body (``json``: a JSON one) of at most ``max_count`` messages.
        None, with nothing stored, for any other batch (or one holding a re-send, or a
        message due by now): call ``send_batch``, which also says what is wrong, if
        anything."""
        if not isinstance(messages, bytes) and len(messages) > MAX_BATCH_MESSAGES:
            return None
        parts = self._running()
        columns = parts.intake.columns(topic, messages, self.clock.now_ms(), unset,
                                       max_count=min(max_count, MAX_BATCH_MESSAGES),
                                       json=json)
        if columns is None or not parts.writes.submit_columns(columns):
            return None
        return columns

    # --- cancelling -----------------------------------------------------------------------
    @staticmethod
    def handle_topic(handle: str) -> str:
        """The topic of the message a cancel handle names (to authorise the cancel first);
        NotFound for a handle that is not one of ours."""
        return decode_handle(handle)[1]

    def cancel_by_handle(self, handle: str) -> Cancelled:
        """Raises NotFound, AlreadyDelivered."""
        deliver_at, topic, msg_id = decode_handle(handle)
        return self._running().writes.cancel(topic, msg_id, deliver_at)

    def cancel(self, topic: str, msg_id: str) -> Cancelled:
        """Raises NotFound, AlreadyDelivered."""
        check_topic(topic, allow_system=True)
        check_msg_id(msg_id)
        return self._running().writes.cancel(topic, msg_id, None)

    # --- reading --------------------------------------------------------------------------
    def status(self, topic: str, msg_id: str) -> MessageLookup:
        """Raises NotFound."""
        check_topic(topic, allow_system=True)
        check_msg_id(msg_id)
        parts = self._running()
        raw = parts.store.get(CF_INDEX, index_key(topic, msg_id))
        if raw is None:
            raise NotFound(f"no message {msg_id!r} in topic {topic!r}")
        entry = parts.ledger.resolve(topic, msg_id, decode_index(raw), offset=True)
        assert entry is not None
        offset = entry.queue_offset
        if offset is not None and offset < parts.queues.first_offset(topic):
            offset = None  # its record was deleted by retention: DELIVERED, without offset
        return MessageLookup(msg_id=msg_id, topic=topic, status=entry.status,
                           deliver_at=entry.deliver_at, offset=offset)

    def list_scheduled(
        self, topic: str, *, from_ms: int | None, to_ms: int | None, limit: int,
        cursor: str | None,
    ) -> tuple[list[MessageLookup], str | None]:
        """Pending messages of ``topic`` by deliver time; returns (page, next cursor or None).
        ``from_ms`` inclusive, ``to_ms`` exclusive; a page may be short (see listing.py)."""
        check_topic(topic, allow_system=True)
        return list_scheduled(self._running().store, topic, from_ms=from_ms, to_ms=to_ms,
                              limit=limit, cursor=cursor,
                              scan_budget=self.config.listing_scan_budget)

    # --- consuming ------------------------------------------------------------------------
    def pull(self, topic: str, offset: int, max_messages: int) -> PulledPage:
        messages = decode_log_records(self.read(topic, offset, max_messages))
        next_offset = messages[-1].queue_offset + 1 if messages else offset
        return PulledPage(messages=messages, next_offset=next_offset)

    def read(self, topic: str, offset: int, max_messages: int) -> list[bytes]:
        """``pull`` before decoding: the LogRecord payloads (storage.records), checked
        against their CRC32C, in queue order from ``offset``."""
        check_topic(topic, allow_system=True)
        if offset < 0:
            raise InvalidArgument("offset must be >= 0")
        if not 1 <= max_messages <= MAX_PULL_MESSAGES:
            raise InvalidArgument(f"max must be in 1..{MAX_PULL_MESSAGES}")
        return self.read_prevalidated(topic, offset, max_messages)

    def read_prevalidated(self, topic: str, offset: int, max_messages: int) -> list[bytes]:
        """``read`` for a reader whose topic, offset and ``max`` were checked when it
        began (a stream's frames, written after each commit: api/push.py)."""
        parts = self._running()
        queues = parts.queues
        expired = False
        try:
            payloads = parts.log.read_many(queues.positions(topic, offset, max_messages),
                                           self.config.max_answer_bytes)
        except OffsetExpired:  # its segment went between the two reads
            payloads, expired = [], True
        # after the read: retention moves the first offset before it deletes entries, so a
        # read that found them gone sees it moved (scheduler/retention.py, "Readers")
        first = queues.first_offset(topic)
        if offset < first or expired:
            raise OffsetExpired(f"offset {offset} of {topic!r} was deleted by retention; the "
                                f"log starts at {first}", first_offset=first)
        return payloads

    def topic(self, topic: str) -> TopicStats:
        """The topic's log: first and end offsets, and messages pending for it."""
        check_topic(topic, allow_system=True)
        parts = self._running()
        end = parts.queues.end_offset(topic)
        return TopicStats(topic=topic, first_offset=min(parts.queues.first_offset(topic), end),
                         end_offset=end, pending=parts.backlog.pending(topic))

    def first_offset(self, topic: str) -> int:
        """The first offset of ``topic`` the log still holds (retention deletes below it)."""
        check_topic(topic, allow_system=True)
        return self._running().queues.first_offset(topic)

    def end_offset(self, topic: str) -> int:
        """The next queue offset of ``topic`` (number of messages delivered to it)."""
        check_topic(topic, allow_system=True)
        return self._running().queues.end_offset(topic)

    def add_delivery_listener(self, listener: DeliveryListener) -> None:
        """``listener(topics)`` is called after each commit that appended messages: from
        the delivery thread, and from the sending thread for messages due on arrival. It
        must be quick and must not call back into the Broker's write paths."""
        self._listeners.append(BudgetedListener(listener, self.metrics.listener_overruns))

    @property
    def groups(self) -> GroupManager:
        """Consumer groups (scheduler/groups.py), the one way in: committed offsets
        (``offset``, ``read_offset``, ``set_offset``) and competing members (receive, ack,
        nack, dead letters)."""
        return self._running().groups

    # --- transactions (scheduler/transactions.py) --------------------------------------
    @property
    def transactions(self) -> TransactionManager:
        """Transactions (scheduler/transactions.py), the one way in: prepare, commit,
        rollback, get, poll_checks, and the check-back callbacks (``register_callback``,
        ``callbacks``)."""
        return self._running().transactions

    # --- poison messages (scheduler/poison.py) -----------------------------------------------
    @property
    def quarantine(self) -> Quarantine:
        """Due messages parked as undeliverable for a reason of their own: ``messages``,
        ``redrive`` (schedule every parked message again, due now)."""
        return self._running().quarantine

    # --- operations -----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """RocksDB checkpoint + manifest: {"snapshotId", "path", "createdAt"}."""
        from storage.snapshots import create_snapshot  # lazily: only a snapshot needs it

        info = create_snapshot(self._running().store, self.config.data_dir / SNAPSHOTS_DIR,
                               extra=self._positions(), now_ms=self.clock.now_ms())
        return {"snapshotId": info.snapshot_id, "path": str(info.path),
                "createdAt": info.created_at}

    def stats(self) -> EngineStats:
        """Pending count, delivered/cancelled totals, watermarks, delivery lag, log sizes."""
        parts = self._running()
        self.recount_applied()
        m = self.metrics
        now = self.clock.now_ms()
        lateness = m.lateness_ms.snapshot()
        topics = parts.backlog.labelled()
        positions = self._positions()
        return EngineStats(
            ready=self.ready,
            pending=int(m.pending.value),
            scheduled=m.scheduled.value,
            delivered=m.delivered.value,
            delivered_immediate=m.delivered_immediate.value,
            cancelled=m.cancelled.value,
            duplicates=m.duplicates.value,
            retries=m.retries.value,
            delivery_queue_batches=int(m.delivery_queue_batches.value),
            delivery_queue_messages=int(m.delivery_queue_messages.value),
            watermark_lag_ms=max(parts.lags(now).values(), default=0),
            lateness_p50_ms=lateness.quantile(0.5),
            lateness_p99_ms=lateness.quantile(0.99),
            transactions_prepared=int(m.tx_prepared_pending.value),
            groups=parts.groups.stats(),
            parked=int(m.parked.value),
            pending_by_topic={t: n for t, (n, _) in topics.items()},
            oldest_pending_by_topic={t: at for t, (_, at) in topics.items()},
            pending_by_level={str(level): n for level, n in sorted(
                parts.backlog.by_level().items())},
            timer_shards=positions["timerShards"],
            watermarks=positions["watermarks"],
            applied_log_position=positions["appliedLogPosition"],
            log_end_position=positions["logEndPosition"],
        )

    def timeline(self, from_ms: int, to_ms: int, buckets: int,
                 topic: str | None = None) -> TimelineView:
        """Pending messages of ``topic`` (None: every topic) by deliver time over [from, to),
        in ``buckets`` buckets or one more: maintained counts (scheduler/timeline.py)."""
        if topic is not None:
            check_topic(topic, allow_system=True)
        parts = self._running()
        self.recount_applied()
        return parts.backlog.timeline.query(from_ms, to_ms, buckets, topic)

    def overview(self) -> OverviewCounts:
        """What the dashboard shows beside ``stats`` (scheduler/overview.py); reads RocksDB
        and the file system: call it off the event loop."""
        parts = self._running()
        transactions, truncated = waiting_transactions(parts.store, self.clock.now_ms())
        data = self.config.data_dir
        delivered = delivered_by_topic(parts.store, parts.queues.end_offset)
        try:
            st = os.statvfs(data)
            ratio: float | None = disk_used_ratio(data)
            free: int | None = st.f_bavail * st.f_frsize
        except OSError:
            ratio = free = None
        return OverviewCounts(
            pending_by_topic=parts.backlog.by_topic(),
            delivered_by_topic=delivered,
            transactions=transactions, transactions_truncated=truncated,
            disk_bytes={"rocksdb": disk_bytes(data / ROCKSDB_DIR),
                        "commitlog": disk_bytes(data / COMMITLOG_DIR)},
            first_by_topic={t: parts.queues.first_offset(t) for t in delivered},
            disk_used_ratio=ratio, disk_free_bytes=free)

    def _positions(self) -> dict[str, Any]:
        """The log's positions, as the stats and a snapshot's manifest name them."""
        parts = self._running()
        timers = TimerIndex(parts.store)
        return {
            "timerShards": len(parts.shards),
            "watermarks": {str(st.shard): timers.watermark(st.shard) for st in parts.shards},
            "appliedLogPosition": parts.committer.applied_position,
            "logEndPosition": parts.log.end_position,
        }

    # --- internals ------------------------------------------------------------------------
    def _check_running(self) -> None:
        if self._state != "running":
            if self.cluster is not None and self._state == "starting":
                raise NotLeader("this node is changing its cluster role")
            raise Unavailable(f"the engine is {self._state}")

    def _running(self) -> EngineParts:
        """The open engine's parts; Unavailable (NotLeader while changing roles) unless it
        is running."""
        self._check_running()
        parts = self._parts
        assert parts is not None
        return parts

    def _notify(self, topics: Collection[str]) -> None:
        for listener in list(self._listeners):
            try:
                listener(topics)
            except Exception:
                log.exception("delivery listener %r failed", listener)


__all__ = ["Broker"]
