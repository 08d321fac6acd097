"""The engine's construction: storage opened, every part built and wired, in one place.

``build_engine`` turns an ``EngineConfig`` and a role into ``EngineParts``: the RocksStore
and the CommitLog, the consume queues, the delivery ledger, intake, the committer (and the
recovery it runs), the timer shards and their scanners, the delivery stage, the quarantine,
maintenance and log retention, consumer groups, transactions, and in cluster mode the
replication hooks (storage/replication.py). The Broker (scheduler/broker.py) holds the parts
and drives their lifecycle (start, ``become``, close); it constructs none of them.

What the parts call back into is wired here too: a commit's metrics and listeners
(``on_commit``), a replay's (``on_replayed``), the send path that transactions and groups
share (``submit``: the running check, then ``WritePaths.submit``). The Broker hands in only
what outlives one opening: its clock, its metrics, its running check and its listeners
(``notify``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from scheduler.backlog import Backlog
from scheduler.backlog_store import BacklogStore
from scheduler.clock import Clock
from scheduler.codec import message_level
from scheduler.committer import CommitOutcome, Committer, Log
from scheduler.config import EngineConfig
from scheduler.delivery import DeliveryStage
from scheduler.groups import GroupManager, read_payloads
from scheduler.intake import Intake, PreparedMessage
from scheduler.ledger import DeliveryLedger
from scheduler.levels import DelayLevels
from scheduler.maintenance import Maintenance
from scheduler.metrics import EngineMetrics
from scheduler.model import SendOutcome
from scheduler.poison import Quarantine
from scheduler.retention import LogRetention, disk_used_ratio
from scheduler.scanner import Progress, Scanner, ShardState
from scheduler.timer_index import TimerIndex
from scheduler.transactions import TransactionManager
from scheduler.writes import WritePaths
from storage.commitlog import CommitLog
from storage.constants import COMMITLOG_DIR, ROCKSDB_DIR
from storage.consume_queue import ConsumeQueue
from storage.keys import unpack_u64
from storage.log_format import HEADER_SIZE
from storage.private import private_dir
from storage.records import FLAG_IMMEDIATE, FLAG_LEVEL_SHIFT, LogRecord
from storage.replication import FollowerGuard, LeaderReplicator, Sink, settle_log
from storage.rocks import Batch, RocksStore, StoreTuning

log = logging.getLogger(__name__)

LogFactory = Callable[[Path, EngineConfig], Log]
StoreFactory = Callable[[Path, EngineConfig], RocksStore]


def open_commitlog(directory: Path, config: EngineConfig) -> Log:
    return CommitLog(directory, segment_size=config.segment_size,
                     flush_policy=config.flush_policy, flush_interval_ms=config.flush_interval_ms)


def open_store(directory: Path, config: EngineConfig) -> RocksStore:
    return RocksStore(directory, timer_shards=config.timer_shards, sync_writes=config.sync_writes,
                      tuning=StoreTuning.for_budget(config.rocksdb_memory_bytes),
                      disk_reserve_bytes=config.disk_reserve_bytes,
                      disk_retry_interval_ms=config.disk_retry_interval_ms)


@dataclass(eq=False)
class EngineParts:
    """One opening of the engine: its parts, built and wired by ``build_engine``. A
    follower's parts run no thread (``start`` leaves them); ``stop`` ends what ``start``
    began and closes storage."""

    follower: bool
    store: RocksStore
    log: Log
    queues: ConsumeQueue
    ledger: DeliveryLedger
    intake: Intake
    committer: Committer
    writes: WritePaths
    shards: list[ShardState]
    backlog: Backlog
    counts: BacklogStore  # the backlog's counts, persisted (scheduler/backlog_store.py)
    quarantine: Quarantine
    progress: Progress
    stopping: threading.Event
    delivery: DeliveryStage
    scanners: list[Scanner]
    retention: LogRetention | None  # CommitLog retention (None: a log that is not one)
    maintenance: Maintenance
    groups: GroupManager
    transactions: TransactionManager
    fold_on_stop: bool = False  # single-node mode: a clean stop folds the counts' deltas
    guard: FollowerGuard | None = None  # a cluster follower's (storage/replication.py)
    replicator: LeaderReplicator | None = None  # a cluster leader's

    def start(self) -> None:
        """Start the threads: delivery, scanners, maintenance, check-backs. A follower starts
        none: it counts the prepared transactions once (``Broker.recount_applied`` again)."""
        if self.follower:
            self.transactions.recount()
            return
        self.delivery.start()
        for scanner in self.scanners:
            scanner.start()
        self.maintenance.start()
        self.transactions.start()

    def stop(self) -> None:
        """Stop the threads, hand back queued batches (they are still in RocksDB), wait for
        sends and cancels in progress, flush the log, close storage."""
        self.stopping.set()
        self.transactions.close()  # no more check-back callbacks
        for st in self.shards:
            st.wake.set()
        self.delivery.queue.close()  # releases scanners blocked on a full queue
        for scanner in self.scanners:
            if scanner.is_alive():
                scanner.join()
        self.delivery.stop()
        self.maintenance.stop()
        with self._all_locks():  # sends and cancels in progress finish first
            try:
                self._fold_counts()  # the next start reads no delta
            finally:
                _close_storage(self.store, self.log)

    def _fold_counts(self) -> None:
        """On a clean stop (every lock held): fold the backlog's deltas (backlog_store.py)."""
        if not self.fold_on_stop or self.store.closed:
            return
        try:
            self.counts.fold(contextlib.nullcontext)
        except Exception as exc:  # the next start reads them instead
            log.warning("could not fold the backlog's counts on stop: %s", exc)

    @contextlib.contextmanager
    def _all_locks(self) -> Iterator[None]:
        """Every shard lock, then the commit lock (the order of the Broker's docstring)."""
        with self.writes.locks(range(len(self.shards))), self.committer.lock:
            yield

    def lags(self, now: int) -> dict[str, float]:
        """Each shard's watermark lag at ``now``. A leader's: now minus the time its scanner
        covered. A follower's scanners do not run, and its frontiers move only with the
        delivery commits it applies: its lag is how late the oldest due message it holds
        undelivered is (0 when none is due), as it applied them."""
        if not self.follower:
            return {str(s.state.shard): float(s.lag_ms(now)) for s in self.scanners}
        timers = TimerIndex(self.store)
        lags = {}
        for st in self.shards:
            due = timers.oldest_due(st.shard, st.frontier_key, now)
            lags[str(st.shard)] = 0.0 if due is None else float(now - due)
        return lags

    def reload_frontiers(self) -> None:
        """A follower applied delivery commits: the shards' frontiers moved."""
        timers = TimerIndex(self.store)
        for st in self.shards:
            st.frontier_key = timers.frontier(st.shard)
            st.covered_ms = unpack_u64(st.frontier_key) - 1


def build_engine(
    config: EngineConfig, *, levels: DelayLevels, clock: Clock, metrics: EngineMetrics,
    follower: bool, clustered: bool, check_running: Callable[[], None],
    notify: Callable[[Collection[str]], None],
    store_factory: StoreFactory = open_store, log_factory: LogFactory = open_commitlog,
    sink: Sink | None = None, last_seq: int | None = None,
) -> EngineParts:
    """Open storage under ``config.data_dir`` and build the engine's parts, wired, with no
    thread started (``EngineParts.start``). A leader (``follower`` False) recovers first:
    records past the applied log position are applied again. A follower recovers nothing: it
    applies the write-ahead stream (``Broker.apply``). A cluster leader (``clustered``) ships
    every write to ``sink`` after ``last_seq``. What failed to build is closed again."""
    private_dir(config.data_dir)
    store = store_factory(config.data_dir / ROCKSDB_DIR, config)
    log_: Log | None = None
    try:
        log_ = log_factory(config.data_dir / COMMITLOG_DIR, config)
        return _wire(config, levels=levels, clock=clock, metrics=metrics, follower=follower,
                     clustered=clustered, check_running=check_running, notify=notify,
                     store=store, log_=log_, sink=sink, last_seq=last_seq)
    except BaseException:
        _close_storage(store, log_)
        raise


def _close_storage(store: RocksStore, log_: Log | None) -> None:
    try:
        if log_ is not None:
            log_.close()  # flushes
    finally:
        store.close()


def _wire(
    cfg: EngineConfig, *, levels: DelayLevels, clock: Clock, metrics: EngineMetrics,
    follower: bool, clustered: bool, check_running: Callable[[], None],
    notify: Callable[[Collection[str]], None], store: RocksStore, log_: Log,
    sink: Sink | None, last_seq: int | None,
) -> EngineParts:
    queues = ConsumeQueue(store)
    ledger = DeliveryLedger(store, log_)
    intake = Intake(levels=levels, max_delay_ms=cfg.max_delay_ms,
                    max_body_bytes=cfg.max_body_bytes, shards=cfg.timer_shards,
                    max_record_bytes=cfg.max_record_bytes)

    def on_replayed(records: list[LogRecord], runtime: bool) -> None:
        metrics.replayed.inc(len(records))
        transactions.on_replayed(records)  # finish transactions whose record outran RocksDB
        if runtime:  # a failed commit's records, now applied: they count as delivered
            metrics.delivered.inc(len(records))
            scheduled = [r for r in records if not r.flags & FLAG_IMMEDIATE]
            metrics.pending.dec(len(scheduled))
            backlog.delivered([r.topic for r in scheduled],
                              [r.flags >> FLAG_LEVEL_SHIFT for r in scheduled],
                              deliver_ats=[r.deliver_at for r in scheduled])
            notify({r.topic for r in records})

    def on_commit(outcome: CommitOutcome) -> None:
        n = len(outcome.topic_list)
        if n:
            metrics.delivered.inc(n)
            metrics.pending.dec(n)
            backlog.delivered(outcome.topic_list,
                              [message_level(v) for v in outcome.values]
                              if backlog.has_levels else (), deliver_ats=outcome.deliver_ats)
            metrics.lateness_ms.observe_counts(outcome.lateness_counts)
            metrics.commit_batch_size.observe(n)
        for shard, count in outcome.removed_by_shard.items():
            maintenance.note_delivered(shard, count)
        if n:
            notify(outcome.topics)

    def submit(messages: Sequence[PreparedMessage], *,
               extra: Callable[[Batch], None] | None = None, replace_prepared: bool = False,
               atomic: bool = False) -> list[SendOutcome]:
        check_running()
        return writes.submit(messages, extra=extra, replace_prepared=replace_prepared,
                             atomic=atomic)

    def count_appended(due: Collection[PreparedMessage], outcome: CommitOutcome) -> None:
        """Metrics and listeners for messages another path appended (transaction commits)."""
        writes.count_sent([], list(due), 0, outcome)

    counts = BacklogStore(store)  # the backlog's counts, persisted
    committer = Committer(store=store, log=log_, queues=queues, clock=clock,
                          retention_ms=cfg.retention_ms, on_replayed=on_replayed, counts=counts)
    transactions = TransactionManager(
        store=store, config=cfg, clock=clock, intake=intake, committer=committer,
        submit=submit, metrics=metrics, shard_locks=lambda shards: writes.locks(shards),
        on_appended=count_appended)
    guard = replicator = None
    if clustered:  # what the log holds past the last applied record was never shipped
        settle_log(store, log_)
    if follower:
        # the write-ahead stream is a follower's WAL: after a kill its RocksDB is what it was
        # at its last flush, settle_log (above, at the next start) cuts the log back to the
        # end recorded there, and the stream is applied again from its applied sequence on.
        # Closing it (``become``, a stop) flushes its memtables: a leader's data is durable.
        # its timer CFs' memtables are vectors (appended to, sorted when flushed): it
        # only writes them, apart from its recount (docs/cluster.md, "Followers")
        store.disable_wal(vector_timers=True)
        guard = FollowerGuard(store, log_)
        store.attach_replicator(guard)
        log_.attach_replicator(guard)  # type: ignore[attr-defined]
        committer.applied_position = committer._stored_applied()
    else:
        if clustered:
            assert sink is not None
            replicator = LeaderReplicator(store, log_, sink, last_seq=last_seq)
            store.attach_replicator(replicator)
            log_.attach_replicator(replicator)  # type: ignore[attr-defined]
            store.write(store.batch())  # the first record: fences out the old leader
        replayed = committer.recover()
        if replayed:
            log.info("recovery applied %d log records to RocksDB", len(replayed))
    timers = TimerIndex(store)
    shards = [ShardState(s, timers.frontier(s)) for s in range(cfg.timer_shards)]
    backlog = Backlog(store, [st.cf for st in shards], top=cfg.backlog_topic_labels)
    writes = WritePaths(
        store=store, committer=committer, shards=shards, clock=clock, metrics=metrics,
        backlog=backlog, retention_ms=cfg.retention_ms, check_running=check_running,
        notify=notify, ledger=ledger, counts=counts)
    counts.levels_pending = lambda: backlog.has_levels
    counts.on_rewrite = backlog.timeline.settle
    if counts.enabled:  # the counts as the last write left them: no scan
        series, levels_, lazy = counts.load()
        metrics.pending.set(backlog.load(series, levels_, lazy))
    else:  # a data directory from before they were persisted: scan once, keep them
        metrics.pending.set(backlog.rebuild())
        if not follower:
            counts.initialise(backlog.timeline.series(), backlog.by_level())
    metrics.pending_by_topic.set_label_function(
        lambda: {t: n for t, (n, _) in backlog.labelled().items()})
    metrics.oldest_pending_ms.set_label_function(
        lambda: {t: at for t, (_, at) in backlog.labelled().items()})
    metrics.pending_by_level.set_label_function(
        lambda: {str(level): n for level, n in backlog.by_level().items()})
    quarantine = Quarantine(
        committer=committer, store=store, shards=shards,
        max_payload=cfg.segment_size - HEADER_SIZE, clock=clock, metrics=metrics,
        shard_locks=writes.locks, backlog=backlog, counts=counts)
    progress, stopping = Progress(), threading.Event()
    delivery = DeliveryStage(
        committer=quarantine, clock=clock, metrics=metrics, progress=progress,
        queue_batches=cfg.delivery_queue_batches, queue_bytes=cfg.delivery_queue_bytes,
        batch_max=cfg.delivery_batch_max,
        max_backoff_ms=cfg.retry_max_backoff_ms, on_commit=on_commit)
    scanners = [
        Scanner(state=st, store=store, clock=clock, batch_size=cfg.scan_batch_size,
                batch_bytes=cfg.scan_batch_bytes, prefetch_ms=cfg.scan_prefetch_ms,
                prefetch_messages=cfg.scan_prefetch_messages,
                prefetch_bytes=cfg.scan_prefetch_bytes,
                interval_ms=cfg.scan_interval_ms, hand_off=delivery.put, progress=progress,
                metrics=metrics, stopping=stopping, max_backoff_ms=cfg.retry_max_backoff_ms)
        for st in shards]
    retention = _log_retention(cfg, store=store, log_=log_, queues=queues, ledger=ledger,
                               clock=clock, metrics=metrics, committer=committer)
    maintenance = Maintenance(
        store=store, ledger=ledger, clock=clock, metrics=metrics,
        retention_ms=cfg.retention_ms, compact_after_deletes=cfg.compact_after_deletes,
        cleanup_interval_ms=cfg.cleanup_interval_ms, retention=retention,
        fold=lambda: counts.fold(parts._all_locks))
    counts.on_first_delta = maintenance.ask
    groups = GroupManager(
        store=store, read=read_payloads(log_.read_many, queues.positions),
        end_offset=queues.end_offset, intake=intake, submit=submit, clock=clock,
        max_reconsume_times=cfg.max_reconsume_times, window=cfg.group_lease_window,
        check_running=check_running, metrics=metrics, max_answer_bytes=cfg.max_answer_bytes,
        max_groups_per_topic=cfg.max_groups_per_topic, metric_labels=cfg.group_metric_labels,
        quick_retries_per_s=cfg.group_quick_retries_per_s,
        quick_retry_burst=cfg.group_quick_retry_burst)
    groups.first_offset = queues.first_offset  # retention: catch_up
    groups.applying = follower
    parts = EngineParts(
        follower=follower, store=store, log=log_, queues=queues, ledger=ledger, intake=intake,
        committer=committer, writes=writes, shards=shards, backlog=backlog, counts=counts,
        quarantine=quarantine, progress=progress, stopping=stopping, delivery=delivery,
        scanners=scanners, retention=retention, maintenance=maintenance, groups=groups,
        transactions=transactions, fold_on_stop=not clustered and not follower, guard=guard,
        replicator=replicator)
    metrics.watermark_lag_ms.set_label_function(lambda: parts.lags(clock.now_ms()))
    return parts


def _log_retention(
    cfg: EngineConfig, *, store: RocksStore, log_: Log, queues: ConsumeQueue,
    ledger: DeliveryLedger, clock: Clock, metrics: EngineMetrics, committer: Committer,
) -> LogRetention | None:
    """CommitLog retention (scheduler/retention.py), when the log is a CommitLog (tests may
    wrap it in one that is not)."""
    if not isinstance(log_, CommitLog):
        return None
    data = cfg.data_dir
    metrics.disk_used_ratio.set_function(lambda: _safe_ratio(data))
    return LogRetention(
        store=store, log=log_, queues=queues, ledger=ledger, clock=clock, metrics=metrics,
        retention_ms=cfg.commitlog_retention_ms, disk_clean_ratio=cfg.disk_clean_ratio,
        data_dir=data, applied=lambda: committer.applied_position,
        interval_ms=cfg.cleanup_interval_ms)


def _safe_ratio(path: Path) -> float:
    try:
        return disk_used_ratio(path)
    except OSError:
        return 0.0


__all__ = ["EngineParts", "LogFactory", "StoreFactory", "build_engine", "open_commitlog",
           "open_store"]
