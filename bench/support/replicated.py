"""A node's replicated storage without NATS, as the engine opens it: a leader whose store
and log ship every write to a sink (``publish(record, expected_last_seq)``), and a
follower's storage that applies records. ``python -m bench.follower_apply`` and the cluster
tests (tests/support/replication.py) build their nodes with these."""

from __future__ import annotations

from pathlib import Path

from scheduler.broker import Broker
from scheduler.clock import Clock
from scheduler.committer import Log
from scheduler.config import EngineConfig
from scheduler.engine import open_commitlog, open_store
from storage.commitlog import CommitLog
from storage.replication import DEFAULT_MAX_MESSAGE_BYTES, FollowerGuard, LeaderReplicator, Sink
from storage.rocks import RocksStore


def open_leader_broker(config: EngineConfig, clock: Clock, sink: Sink, *,
                       max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                       ) -> tuple[Broker, list[LeaderReplicator]]:
    """A started Broker whose store and log ship every write to ``sink``, and the
    replicators it made (one per engine opened)."""
    stores: list[RocksStore] = []
    made: list[LeaderReplicator] = []

    def store_factory(directory: Path, cfg: EngineConfig) -> RocksStore:
        stores.append(open_store(directory, cfg))
        return stores[-1]

    def log_factory(directory: Path, cfg: EngineConfig) -> Log:
        commitlog = open_commitlog(directory, cfg)
        rep = LeaderReplicator(stores[-1], commitlog, sink,
                               max_message_bytes=max_message_bytes)
        made.append(rep)
        stores[-1].attach_replicator(rep)
        commitlog.attach_replicator(rep)  # type: ignore[attr-defined]
        return commitlog

    broker = Broker(config, clock, log_factory=log_factory, store_factory=store_factory)
    broker.start()
    return broker, made


def open_follower_storage(data_dir: Path, cfg: EngineConfig, *, wal: bool = False,
                          vector_timers: bool = True,
                          ) -> tuple[RocksStore, CommitLog, FollowerGuard]:
    """A follower's store, log and the guard that applies records to them (no engine).
    By default without RocksDB's WAL and with vector timer memtables, as a follower's
    engine opens them."""
    data_dir.mkdir(parents=True, exist_ok=True)
    store = open_store(data_dir / "rocksdb", cfg)
    if not wal:
        store.disable_wal(vector_timers=vector_timers)
    log: CommitLog = open_commitlog(data_dir / "commitlog", cfg)  # type: ignore[assignment]
    guard = FollowerGuard(store, log)
    store.attach_replicator(guard)
    log.attach_replicator(guard)
    return store, log, guard
