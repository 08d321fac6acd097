"""The engine: one Broker object that the API and the CLI drive.

Wiring (docs/engine.md has the reasons and the measurements):

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

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from scheduler.backlog import Backlog
from scheduler.backlog_store import BacklogStore
from scheduler.checkback.registry import CallbackRegistration
from scheduler.clock import Clock, SystemClock
from scheduler.codec import message_level
from scheduler.committer import CommitOutcome, Committer, Log
from scheduler.config import EngineConfig
from scheduler.delivery import DeliveryStage
from scheduler.group_state import check_group
from scheduler.groups import GroupManager, read_payloads
from scheduler.intake import (
    ColumnBatch,
    Intake,
    PreparedMessage,
    check_msg_id,
    check_topic,
)
from scheduler.ledger import DeliveryLedger
from scheduler.listeners import BudgetedListener, DeliveryListener
from scheduler.listing import list_scheduled
from scheduler.maintenance import Maintenance
from scheduler.metrics import EngineMetrics
from scheduler.model import (
    Cancelled,
    EngineStats,
    MessageLookup,
    PendingCheck,
    PulledPage,
    SendOutcome,
    SendRequest,
    TopicStats,
    TransactionOutcome,
)
from scheduler.overview import (
    OverviewCounts,
    delivered_by_topic,
    disk_bytes,
    waiting_transactions,
)
from scheduler.poison import ParkedEntry, Quarantine
from scheduler.retention import LogRetention, disk_used_ratio
from scheduler.scanner import Progress, Scanner, ShardState
from scheduler.timeline import TimelineView
from scheduler.timer_index import TimerIndex
from scheduler.transactions import TransactionManager
from scheduler.writes import WritePaths
from storage.commitlog import CHECKPOINT_NAME, CommitLog
from storage.constants import (
    CF_INDEX,
    COMMITLOG_DIR,
    MAX_BATCH_MESSAGES,
    MAX_PULL_MESSAGES,
    ROCKSDB_DIR,
    SNAPSHOTS_DIR,
)
from storage.consume_queue import ConsumeQueue
from storage.errors import (
    InvalidArgument,
    NotFound,
    NotLeader,
    OffsetExpired,
    Unavailable,
)
from storage.keys import (
    decode_handle,
    index_key,
    unpack_u64,
)
from storage.log_format import HEADER_SIZE
from storage.private import private_dir
from storage.records import (
    FLAG_IMMEDIATE,
    FLAG_LEVEL_SHIFT,
    LogRecord,
    decode_index,
    decode_log_records,
    log_record_head,
)
from storage.replication import (
    FollowerGuard,
    LeaderReplicator,
    Sink,
    applied_seq,
    settle_log,
)
from storage.rocks import Batch, RocksStore, StoreTuning
from storage.segment import NAME_PATTERN

log = logging.getLogger(__name__)

LogFactory = Callable[[Path, EngineConfig], Log]
StoreFactory = Callable[[Path, EngineConfig], RocksStore]

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


def open_commitlog(directory: Path, config: EngineConfig) -> Log:
    return CommitLog(directory, segment_size=config.segment_size,
                     flush_policy=config.flush_policy, flush_interval_ms=config.flush_interval_ms)


def open_store(directory: Path, config: EngineConfig) -> RocksStore:
    return RocksStore(directory, timer_shards=config.timer_shards, sync_writes=config.sync_writes,
                      tuning=StoreTuning.for_budget(config.rocksdb_memory_bytes),
                      disk_reserve_bytes=config.disk_reserve_bytes,
                      disk_retry_interval_ms=config.disk_retry_interval_ms)


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
        self._stopping = threading.Event()
        self._progress = Progress()
        self._store: RocksStore | None = None
        self._log: Log | None = None
        self._shards: list[ShardState] = []
        self._scanners: list[Scanner] = []
        self._delivery: DeliveryStage | None = None
        self._maintenance: Maintenance | None = None
        self.retention: LogRetention | None = None  # CommitLog retention (set by start)
        self._transactions: TransactionManager | None = None
        self._writes: WritePaths | None = None
        self._ledger: DeliveryLedger  # set by start
        self._groups: GroupManager | None = None
        self._quarantine: Quarantine | None = None
        self._backlog: Backlog  # set by start
        self._counts: BacklogStore  # set by start
        self.cluster = cluster
        self.role = LEADER if cluster is None else STARTING
        self._guard: FollowerGuard | None = None  # a follower's (storage/replication.py)
        self._replicator: LeaderReplicator | None = None  # a cluster leader's
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
        """Open storage and build the engine as ``role``. A follower recovers nothing and
        runs no thread (no scanner, delivery, maintenance or check-back): it applies the
        write-ahead stream (``apply``). A cluster leader ships every write to ``sink``."""
        cfg = self.config
        clustered = self.cluster is not None
        follower = role == FOLLOWER
        private_dir(cfg.data_dir)
        self._store = store = self._store_factory(cfg.data_dir / ROCKSDB_DIR, cfg)
        self._log = self._log_factory(cfg.data_dir / COMMITLOG_DIR, cfg)
        self._queues = ConsumeQueue(store)
        self._ledger = ledger = DeliveryLedger(store, self._log)
        self._intake = Intake(levels=self.levels, max_delay_ms=cfg.max_delay_ms,
                              max_body_bytes=cfg.max_body_bytes, shards=cfg.timer_shards,
                              max_record_bytes=cfg.max_record_bytes)
        self._counts = counts = BacklogStore(store)  # the backlog's counts, persisted
        self._committer = Committer(store=store, log=self._log, queues=self._queues,
                                    clock=self.clock, retention_ms=cfg.retention_ms,
                                    on_replayed=self._on_replayed, counts=counts)
        self._transactions = TransactionManager(
            store=store, config=cfg, clock=self.clock, intake=self._intake,
            committer=self._committer, submit=self.submit, metrics=self.metrics,
            shard_locks=self._locks,
            on_appended=self._count_appended)
        if clustered:  # what the log holds past the last applied record was never shipped
            settle_log(store, self._log)
        if follower:
            self._guard = FollowerGuard(store, self._log)
            store.attach_replicator(self._guard)
            self._log.attach_replicator(self._guard)  # type: ignore[attr-defined]
            self._committer.applied_position = self._committer._stored_applied()
        else:
            if clustered:
                assert sink is not None
                self._replicator = LeaderReplicator(store, self._log, sink, last_seq=last_seq)
                store.attach_replicator(self._replicator)
                self._log.attach_replicator(self._replicator)  # type: ignore[attr-defined]
                store.write(store.batch())  # the first record: fences out the old leader
            replayed = self._committer.recover()
            if replayed:
                log.info("recovery applied %d log records to RocksDB", len(replayed))
        timers = TimerIndex(store)
        self._shards = [ShardState(s, timers.frontier(s)) for s in range(cfg.timer_shards)]
        self._backlog = backlog = Backlog(store, [st.cf for st in self._shards],
                                          top=cfg.backlog_topic_labels)
        self._writes = WritePaths(
            store=store, committer=self._committer, shards=self._shards, clock=self.clock,
            metrics=self.metrics, backlog=backlog, retention_ms=cfg.retention_ms,
            check_running=self._check_running, notify=self._notify, ledger=ledger,
            counts=counts)
        counts.levels_pending = lambda: backlog.has_levels
        counts.on_rewrite = backlog.timeline.settle
        if counts.enabled:  # the counts as the last write left them: no scan
            series, levels, lazy = counts.load()
            self.metrics.pending.set(backlog.load(series, levels, lazy))
        else:  # a data directory from before they were persisted: scan once, keep them
            self.metrics.pending.set(backlog.rebuild())
            if not follower:
                counts.initialise(backlog.timeline.series(), backlog.by_level())
        self.metrics.pending_by_topic.set_label_function(
            lambda: {t: n for t, (n, _) in backlog.labelled().items()})
        self.metrics.oldest_pending_ms.set_label_function(
            lambda: {t: at for t, (_, at) in backlog.labelled().items()})
        self.metrics.pending_by_level.set_label_function(
            lambda: {str(level): n for level, n in backlog.by_level().items()})
        self._quarantine = Quarantine(
            committer=self._committer, store=store, shards=self._shards,
            max_payload=cfg.segment_size - HEADER_SIZE, clock=self.clock,
            metrics=self.metrics, shard_locks=self._locks, backlog=backlog, counts=counts)
        self._delivery = DeliveryStage(
            committer=self._quarantine, clock=self.clock, metrics=self.metrics,
            progress=self._progress, queue_batches=cfg.delivery_queue_batches,
            queue_bytes=cfg.delivery_queue_bytes, batch_max=cfg.delivery_batch_max,
            max_backoff_ms=cfg.retry_max_backoff_ms, on_commit=self._on_commit)
        self._scanners = [
            Scanner(state=st, store=store, clock=self.clock, batch_size=cfg.scan_batch_size,
                    interval_ms=cfg.scan_interval_ms,
                    hand_off=self._delivery.put, progress=self._progress,
                    metrics=self.metrics, stopping=self._stopping,
                    max_backoff_ms=cfg.retry_max_backoff_ms)
            for st in self._shards]
        self.retention = self._log_retention(store, ledger)
        self._maintenance = Maintenance(
            store=store, ledger=ledger, clock=self.clock, metrics=self.metrics,
            retention_ms=cfg.retention_ms, compact_after_deletes=cfg.compact_after_deletes,
            cleanup_interval_ms=cfg.cleanup_interval_ms, retention=self.retention,
            fold=lambda: counts.fold(self._all_locks))
        counts.on_first_delta = self._maintenance.ask
        self.metrics.watermark_lag_ms.set_label_function(self._lags)
        if not follower:
            self._delivery.start()
            for scanner in self._scanners:
                scanner.start()
        self._groups = GroupManager(
            store=store, read=read_payloads(self._log.read_many, self._queues.positions),
            end_offset=self._queues.end_offset, intake=self._intake, submit=self.submit,
            clock=self.clock, max_reconsume_times=cfg.max_reconsume_times,
            window=cfg.group_lease_window, check_running=self._check_running,
            metrics=self.metrics, max_answer_bytes=cfg.max_answer_bytes,
            max_groups_per_topic=cfg.max_groups_per_topic,
            metric_labels=cfg.group_metric_labels,
            quick_retries_per_s=cfg.group_quick_retries_per_s,
            quick_retry_burst=cfg.group_quick_retry_burst)
        self._groups.first_offset = self._queues.first_offset  # retention: catch_up
        self._groups.applying = follower
        if not follower:
            self._maintenance.start()
            self._transactions.start()
        else:
            self._transactions.recount()
        self._recounted = None
        self.role = role

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
            guard = self._guard
            if guard is None or self._state != "running":
                return
            now, last = self.clock.now_ms(), self._recounted
            if last is not None and (last[0] == guard.seq or now - last[1] < max(
                    FOLLOWER_RECOUNT_MS, 10 * last[2])):
                return
            seq = guard.seq
            self.metrics.pending.set(self._backlog.rebuild())
            if self._transactions is not None:
                self._transactions.recount()
            if self._groups is not None:
                self._groups.reload()
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
            self._reset()
            try:
                if replace is not None:
                    replace(self.config.data_dir)
                self._open(role, sink, last_seq)
            except BaseException:
                log.exception("could not open the engine as %s", role)
                self._shutdown()
                self._reset()
                raise
            with self._state_lock:
                self._state = "running"

    def _reset(self) -> None:
        self._stopping = threading.Event()
        self._progress = Progress()
        self._store = self._log = None
        self._shards, self._scanners = [], []
        self._delivery = self._maintenance = self._transactions = None
        self._writes = self._groups = self._quarantine = None
        self._guard = self._replicator = None

    @property
    def deposed(self) -> str | None:
        """Why this cluster leader may not write any more (None: it may, or not a leader)."""
        rep = self._replicator
        return None if rep is None else rep.deposed

    @property
    def applied_seq(self) -> int:
        """The write-ahead stream's sequence this node has applied (0: single-node mode)."""
        if self._guard is not None:
            return self._guard.seq
        if self._replicator is not None:  # what this node holds: a record published but
            return self._replicator.written_seq  # not yet written here is not applied
        store = self._store
        return 0 if store is None or store.closed else applied_seq(store)

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
        rep, store = self._replicator, self._store
        if rep is None or store is None or self._state != "running":
            raise NotLeader("only the cluster's leader takes snapshots")
        dest.mkdir(parents=True, exist_ok=True)
        with rep.lock:
            seq = applied_seq(store)
            store.checkpoint(dest / ROCKSDB_DIR)
            copy_log_files(self.config.data_dir / COMMITLOG_DIR, dest / COMMITLOG_DIR)
        return seq

    @property
    def consumed_seq(self) -> int:
        """A follower: the last stream message it took (a piece of a record too)."""
        guard = self._guard
        return self.applied_seq if guard is None else guard.consumed

    def apply(self, seq: int, data: bytes) -> None:
        """A follower: take the write-ahead stream's message ``seq``; when it completes a
        record, apply it, refresh what the engine caches and wake the readers of the topics
        it appended to."""
        with self._role_lock:
            guard = self._guard
            if guard is None or self._state != "running":
                raise NotLeader("this node is not a running follower")
            record = guard.apply(seq, data)
            if record is None:
                return
            topics = {log_record_head(p).topic for kind, _, payloads in record.log_ops
                      if payloads for p in payloads}
            if record.log_ops or record.ops:
                self._queues.forget()
            if record.ops:
                # the leader's retention ships its RocksDB write (the first offsets and
                # META_LOG_FIRST_POSITION); the segment files below go here as they went there
                self._queues.forget_firsts()
                if self.retention is not None:
                    self.retention.resume()
            store = self._store
            if store is not None:
                timers = TimerIndex(store)
                for st in self._shards:  # delivery commits move the frontiers
                    st.frontier_key = timers.frontier(st.shard)
                    st.covered_ms = unpack_u64(st.frontier_key) - 1
        if topics:
            self._notify(topics)

    def _log_retention(self, store: RocksStore, ledger: DeliveryLedger) -> LogRetention | None:
        """CommitLog retention (scheduler/retention.py), when the log is a CommitLog (tests
        may wrap it in one that is not)."""
        log_ = self._log
        if not isinstance(log_, CommitLog):
            return None
        cfg = self.config
        data = cfg.data_dir
        self.metrics.disk_used_ratio.set_function(lambda: _safe_ratio(data))
        return LogRetention(
            store=store, log=log_, queues=self._queues, ledger=ledger, clock=self.clock,
            metrics=self.metrics, retention_ms=cfg.commitlog_retention_ms,
            disk_clean_ratio=cfg.disk_clean_ratio, data_dir=data,
            applied=lambda: self._committer.applied_position,
            interval_ms=cfg.cleanup_interval_ms)

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
        self._stopping.set()
        if self._transactions is not None:
            self._transactions.close()  # no more check-back callbacks
        for st in self._shards:
            st.wake.set()
        if self._delivery is not None:
            self._delivery.queue.close()  # releases scanners blocked on a full queue
        for scanner in self._scanners:
            if scanner.is_alive():
                scanner.join()
        if self._delivery is not None:
            self._delivery.stop()
        if self._maintenance is not None:
            self._maintenance.stop()
        with self._all_locks():  # sends and cancels in progress finish first
            try:
                self._fold_counts()  # the next start reads no delta
                if self._log is not None:
                    self._log.close()  # flushes
            finally:
                if self._store is not None:
                    self._store.close()

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
        if self.role == FOLLOWER:
            return self._store is not None and not self._store.closed
        return (self._state == "running" and self._delivery is not None
                and not self._delivery.blocked and not self._committer.needs_replay
                and self._store is not None and self._store.writable)

    def drain(self, timeout_s: float = 30.0) -> None:
        """Block until every message due at the clock's current time is in the log; raises
        TimeoutError after ``timeout_s`` real seconds (e.g. while delivery keeps failing)."""
        self._check_running()
        target = self.clock.now_ms()
        deadline = time.monotonic() + timeout_s
        progress = self._progress
        with progress.cond:
            while not (progress.committed >= progress.handed
                       and all(st.covered_ms >= target for st in self._shards)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"messages due at {target} not all delivered within "
                                       f"{timeout_s} s")
                progress.cond.wait(remaining)

    # --- producing ------------------------------------------------------------------------
    def prepare(self, request: SendRequest, *, now_ms: int | None = None,
                tx_id: str | None = None) -> PreparedMessage:
        """Validate and resolve one request (no I/O); see ``submit``."""
        self._check_running()
        now = self.clock.now_ms() if now_ms is None else now_ms
        return self._intake.prepare(request, now, tx_id=tx_id)

    def send(self, request: SendRequest) -> SendOutcome:
        """Raises InvalidArgument / DelayTooLong / Unavailable (storage.errors)."""
        return self.send_batch([request])[0]

    def send_batch(self, requests: Sequence[SendRequest]) -> list[SendOutcome]:
        """All requests are validated before anything is stored; one atomic write."""
        if len(requests) > MAX_BATCH_MESSAGES:
            raise InvalidArgument(f"a batch holds at most {MAX_BATCH_MESSAGES} messages")
        self._check_running()
        now = self.clock.now_ms()
        if requests:  # the common case from columns (Intake.columns), as the API's sends
            columns = self._intake.columns(requests[0].topic, list(requests), now)
            assert self._writes is not None
            if columns is not None and self._writes.submit_columns(columns):
                return columns.results()
        prepare = self._intake.prepare
        return self.submit([prepare(r, now) for r in requests])

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
        self._check_running()
        assert self._writes is not None
        columns = self._intake.columns(topic, messages, self.clock.now_ms(), unset,
                                       max_count=min(max_count, MAX_BATCH_MESSAGES), json=json)
        if columns is None or not self._writes.submit_columns(columns):
            return None
        return columns

    def submit(
        self, messages: Sequence[PreparedMessage], *,
        extra: Callable[[Batch], None] | None = None, replace_prepared: bool = False,
        atomic: bool = False,
    ) -> list[SendOutcome]:
        """Store prepared messages atomically: each is scheduled (timer key + index entry)
        or, when already due, appended to the log; idempotent on (topic, msgId).

        For composition (transactions): ``extra(batch)`` runs while every lock is held
        (shard locks and the commit lock) and adds its own operations to the one RocksDB
        batch that also schedules the messages; it may raise to abort, before anything is
        written. ``replace_prepared``: an index entry PREPARED for the same (topic, msgId)
        is the half message being committed, not a duplicate. ``atomic``: messages due at
        once count only with the one RocksDB write (never by replay), as when scheduled ones
        share the batch: all or nothing, also with ``extra`` (consumer groups' nacks).
        """
        self._check_running()
        assert self._writes is not None
        return self._writes.submit(messages, extra=extra, replace_prepared=replace_prepared,
                                   atomic=atomic)

    # --- cancelling -----------------------------------------------------------------------
    @staticmethod
    def handle_topic(handle: str) -> str:
        """The topic of the message a cancel handle names (to authorise the cancel first);
        NotFound for a handle that is not one of ours."""
        return decode_handle(handle)[1]

    def cancel_by_handle(self, handle: str) -> Cancelled:
        """Raises NotFound, AlreadyDelivered."""
        deliver_at, topic, msg_id = decode_handle(handle)
        self._check_running()
        assert self._writes is not None
        return self._writes.cancel(topic, msg_id, deliver_at)

    def cancel(self, topic: str, msg_id: str) -> Cancelled:
        """Raises NotFound, AlreadyDelivered."""
        check_topic(topic, allow_system=True)
        check_msg_id(msg_id)
        self._check_running()
        assert self._writes is not None
        return self._writes.cancel(topic, msg_id, None)

    # --- reading --------------------------------------------------------------------------
    def status(self, topic: str, msg_id: str) -> MessageLookup:
        """Raises NotFound."""
        check_topic(topic, allow_system=True)
        check_msg_id(msg_id)
        store, _ = self._live()
        raw = store.get(CF_INDEX, index_key(topic, msg_id))
        if raw is None:
            raise NotFound(f"no message {msg_id!r} in topic {topic!r}")
        entry = self._ledger.resolve(topic, msg_id, decode_index(raw), offset=True)
        assert entry is not None
        offset = entry.queue_offset
        if offset is not None and offset < self._queues.first_offset(topic):
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
        store, _ = self._live()
        return list_scheduled(store, topic, from_ms=from_ms, to_ms=to_ms, limit=limit,
                              cursor=cursor, scan_budget=self.config.listing_scan_budget)

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
        """``read`` for a reader whose topic, offset and ``max`` were validated when it
        began (a stream's frames, written after each commit: api/push.py)."""
        self._live()
        assert self._log is not None
        queues = self._queues
        expired = False
        try:
            payloads = self._log.read_many(queues.positions(topic, offset, max_messages),
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
        self._live()
        queues = self._queues
        end = queues.end_offset(topic)
        return TopicStats(topic=topic, first_offset=min(queues.first_offset(topic), end),
                         end_offset=end, pending=self._backlog.pending(topic))

    def first_offset(self, topic: str) -> int:
        """The first offset of ``topic`` the log still holds (retention deletes below it)."""
        check_topic(topic, allow_system=True)
        self._live()
        return self._queues.first_offset(topic)

    def end_offset(self, topic: str) -> int:
        """The next queue offset of ``topic`` (number of messages delivered to it)."""
        check_topic(topic, allow_system=True)
        self._live()
        return self._queues.end_offset(topic)

    def add_delivery_listener(self, listener: DeliveryListener) -> None:
        """``listener(topics)`` is called after each commit that appended messages: from
        the delivery thread, and from the sending thread for messages due on arrival. It
        must be quick and must not call back into the Broker's write paths."""
        self._listeners.append(BudgetedListener(listener, self.metrics.listener_overruns))

    def get_group_offset(self, topic: str, group: str) -> int:
        check_topic(topic, allow_system=True)
        check_group(group)
        self._live()
        return self._queues.group_offset(topic, group)

    def group_read_offset(self, topic: str, group: str) -> int:
        """Where a pull or stream by ``group`` (no offset given) starts: its committed
        offset, moved up to the topic's first offset when retention deleted past it (the
        messages it lost count as ``expired``: scheduler/groups.py ``catch_up``)."""
        offset = self.get_group_offset(topic, group)
        if offset < self._queues.first_offset(topic):
            offset = self.groups.catch_up(topic, group)
        return offset

    def commit_group_offset(self, topic: str, group: str, offset: int) -> int:
        """Move the group's committed offset; its leases end (scheduler/groups.py)."""
        return self.groups.set_offset(topic, group, offset)

    @property
    def groups(self) -> GroupManager:
        """Consumer groups with competing members: receive, ack, nack, dead letters."""
        self._check_running()
        assert self._groups is not None
        return self._groups

    # --- transactions -------------------------------------------------------------------
    def prepare_transaction(
        self, request: SendRequest, *, producer_group: str,
        check_immunity_seconds: str | float | None = None,
    ) -> TransactionOutcome:
        """Store a half message (invisible to consumers). RocketMQ immunity rule:
        max(check_immunity_seconds parsed as RocketMQ does, transaction timeout)."""
        return self.transactions.prepare(request, producer_group=producer_group,
                                         check_immunity_seconds=check_immunity_seconds)

    def commit_transaction(self, transaction_id: str) -> TransactionOutcome:
        """Idempotent; raises NotFound, Conflict (after a rollback)."""
        return self.transactions.commit(transaction_id)

    def rollback_transaction(self, transaction_id: str) -> TransactionOutcome:
        """Idempotent; raises NotFound, Conflict (after a commit)."""
        return self.transactions.rollback(transaction_id)

    def poll_transaction_checks(
        self, producer_group: str, max_checks: int, *,
        may_see: Callable[[str], bool] | None = None,
    ) -> list[PendingCheck]:
        """Prepared messages of the group whose immunity passed and next check is due (of the
        topics ``may_see`` accepts); each returned check counts; past the maximum the message
        is DISCARDED."""
        return self.transactions.poll_checks(producer_group, max_checks, may_see=may_see)

    def transaction_status(self, transaction_id: str) -> TransactionOutcome:
        """Raises NotFound."""
        return self.transactions.get(transaction_id)

    def set_check_callback(self, producer_group: str, url: str,
                           secret: str | None = None) -> CallbackRegistration:
        """Check-back by callback for the group (host on the allow-list, else InvalidArgument)."""
        return self.transactions.register_callback(producer_group, url, secret)

    def get_check_callback(self, producer_group: str) -> CallbackRegistration:
        """Raises NotFound."""
        return self.transactions.callbacks.get(producer_group)

    def delete_check_callback(self, producer_group: str) -> CallbackRegistration:
        """Raises NotFound."""
        return self.transactions.callbacks.delete(producer_group)

    @property
    def transactions(self) -> TransactionManager:
        """scheduler/transactions.py's manager (tests: ``transactions.dispatcher.join()``)."""
        self._check_running()
        assert self._transactions is not None
        return self._transactions

    # --- poison messages (scheduler/poison.py) -----------------------------------------------
    def parked(self, limit: int = 1000) -> list[ParkedEntry]:
        """Due messages parked as undeliverable for a reason of their own."""
        self._live()
        assert self._quarantine is not None
        return self._quarantine.messages(limit)

    def redrive_parked(self) -> int:
        """Schedule every parked message again, due now; returns how many."""
        self._live()
        assert self._quarantine is not None
        return self._quarantine.redrive()

    # --- operations -----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """RocksDB checkpoint + manifest: {"snapshotId", "path", "createdAt"}."""
        from storage.snapshots import create_snapshot  # lazily: only a snapshot needs it

        store, _ = self._live()
        info = create_snapshot(store, self.config.data_dir / SNAPSHOTS_DIR,
                               extra=self._positions(), now_ms=self.clock.now_ms())
        return {"snapshotId": info.snapshot_id, "path": str(info.path),
                "createdAt": info.created_at}

    def stats(self) -> EngineStats:
        """Pending count, delivered/cancelled totals, watermarks, delivery lag, log sizes."""
        self._live()
        self.recount_applied()
        m = self.metrics
        now = self.clock.now_ms()
        lateness = m.lateness_ms.snapshot()
        topics = self._backlog.labelled()
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
            watermark_lag_ms=max(self._lags(now).values(), default=0),
            lateness_p50_ms=lateness.quantile(0.5),
            lateness_p99_ms=lateness.quantile(0.99),
            transactions_prepared=int(m.tx_prepared_pending.value),
            groups=self.groups.stats(),
            parked=int(m.parked.value),
            pending_by_topic={t: n for t, (n, _) in topics.items()},
            oldest_pending_by_topic={t: at for t, (_, at) in topics.items()},
            pending_by_level={str(level): n for level, n in sorted(
                self._backlog.by_level().items())},
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
        self._check_running()
        self.recount_applied()
        return self._backlog.timeline.query(from_ms, to_ms, buckets, topic)

    def overview(self) -> OverviewCounts:
        """What the dashboard shows beside ``stats`` (scheduler/overview.py); reads RocksDB
        and the file system: call it off the event loop."""
        store, _ = self._live()
        transactions, truncated = waiting_transactions(store, self.clock.now_ms())
        data = self.config.data_dir
        delivered = delivered_by_topic(store, self._queues.end_offset)
        try:
            st = os.statvfs(data)
            ratio: float | None = disk_used_ratio(data)
            free: int | None = st.f_bavail * st.f_frsize
        except OSError:
            ratio = free = None
        return OverviewCounts(
            pending_by_topic=self._backlog.by_topic(),
            delivered_by_topic=delivered,
            transactions=transactions, transactions_truncated=truncated,
            disk_bytes={"rocksdb": disk_bytes(data / ROCKSDB_DIR),
                        "commitlog": disk_bytes(data / COMMITLOG_DIR)},
            first_by_topic={t: self._queues.first_offset(t) for t in delivered},
            disk_used_ratio=ratio, disk_free_bytes=free)

    def _positions(self) -> dict[str, Any]:
        """The log's positions, as the stats and a snapshot's manifest name them."""
        store, committer = self._live()
        assert self._log is not None
        return {
            "timerShards": len(self._shards),
            "watermarks": {str(st.shard): TimerIndex(store).watermark(st.shard)
                           for st in self._shards},
            "appliedLogPosition": committer.applied_position,
            "logEndPosition": self._log.end_position,
        }

    # --- internals ------------------------------------------------------------------------
    def _check_running(self) -> None:
        if self._state != "running":
            if self.cluster is not None and self._state == "starting":
                raise NotLeader("this node is changing its cluster role")
            raise Unavailable(f"the engine is {self._state}")

    def _live(self) -> tuple[RocksStore, Committer]:
        self._check_running()
        assert self._store is not None
        return self._store, self._committer

    def _locks(self, shards: Sequence[int]) -> contextlib.AbstractContextManager[None]:
        """The locks of ``shards`` in ascending order (for transactions.py's commits)."""
        assert self._writes is not None
        return self._writes.locks(shards)

    @contextlib.contextmanager
    def _all_locks(self) -> Iterator[None]:
        if self._writes is None:  # start failed early: nobody can hold them
            yield
            return
        with self._writes.locks(range(len(self._shards))), self._committer.lock:
            yield

    def _count_appended(self, due: Collection[PreparedMessage], outcome: CommitOutcome) -> None:
        """Metrics and listeners for messages another path appended (transaction commits)."""
        assert self._writes is not None
        self._writes.count_sent([], list(due), 0, outcome)

    def _fold_counts(self) -> None:
        """On a clean stop (every lock held): fold the backlog's deltas (backlog_store.py)."""
        counts, store = getattr(self, "_counts", None), self._store
        if (counts is None or store is None or store.closed or self.role != LEADER
                or self._maintenance is None or self.cluster is not None):
            return
        try:
            counts.fold(contextlib.nullcontext)
        except Exception as exc:  # the next start reads them instead
            log.warning("could not fold the backlog's counts on stop: %s", exc)

    def _lags(self, now: int | None = None) -> dict[str, float]:
        now = self.clock.now_ms() if now is None else now
        return {str(s.state.shard): float(s.lag_ms(now)) for s in self._scanners}

    def _notify(self, topics: Collection[str]) -> None:
        for listener in list(self._listeners):
            try:
                listener(topics)
            except Exception:
                log.exception("delivery listener %r failed", listener)

    def _on_commit(self, outcome: CommitOutcome) -> None:
        n = len(outcome.topic_list)
        m = self.metrics
        if n:
            m.delivered.inc(n)
            m.pending.dec(n)
            backlog = self._backlog
            backlog.delivered(outcome.topic_list,
                              [message_level(v) for v in outcome.values]
                              if backlog.has_levels else (), deliver_ats=outcome.deliver_ats)
            m.lateness_ms.observe_many(outcome.lateness_ms)
            m.commit_batch_size.observe(n)
        if self._maintenance is not None:
            for shard, count in outcome.removed_by_shard.items():
                self._maintenance.note_delivered(shard, count)
        if n:
            self._notify(outcome.topics)

    def _on_replayed(self, records: list[LogRecord], runtime: bool) -> None:
        self.metrics.replayed.inc(len(records))
        if self._transactions is not None:  # finish transactions whose record outran RocksDB
            self._transactions.on_replayed(records)
        if runtime:  # a failed commit's records, now applied: they count as delivered
            self.metrics.delivered.inc(len(records))
            scheduled = [r for r in records if not r.flags & FLAG_IMMEDIATE]
            self.metrics.pending.dec(len(scheduled))
            self._backlog.delivered([r.topic for r in scheduled],
                                    [r.flags >> FLAG_LEVEL_SHIFT for r in scheduled],
                                    deliver_ats=[r.deliver_at for r in scheduled])
            self._notify({r.topic for r in records})


def _safe_ratio(path: Path) -> float:
    try:
        return disk_used_ratio(path)
    except OSError:
        return 0.0


__all__ = ["Broker",
           "open_commitlog", "open_store"]
