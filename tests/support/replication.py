"""Cluster-mode test support without NATS: an in-memory write-ahead stream (with the same
fencing as JetStream's expected-last-sequence), and node storage that applies it."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.committer import Log
from scheduler.config import EngineConfig
from scheduler.engine import open_commitlog, open_store
from scheduler.timer_index import TimerIndex
from storage.commitlog import CommitLog
from storage.errors import NotLeader
from storage.replication import FollowerGuard, LeaderReplicator
from storage.rocks import RocksStore
from storage.segment import NAME_PATTERN


class MemoryStream:
    """A list of records; ``publish`` refuses a stale expected last sequence."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.lock = threading.Lock()
        self.refuse_next = 0  # the next n publishes fail as a lost lease would
        self.max_bytes = 1 << 30  # NATS's max_payload
        self.lease_lapsed = False  # as a leader's own clock would tell it

    def check_leading(self) -> None:
        if self.lease_lapsed:
            raise NotLeader("injected: the lease lapsed")

    def publish(self, record: bytes, expected_last_seq: int) -> int:
        with self.lock:
            if len(record) > self.max_bytes:
                raise ValueError(f"message of {len(record)} bytes over {self.max_bytes}")
            if self.refuse_next:
                self.refuse_next -= 1
                raise NotLeader("injected: wrong last sequence")
            if expected_last_seq != len(self.records):
                raise NotLeader(f"wrong last sequence: {len(self.records)}, "
                                f"expected {expected_last_seq}")
            self.records.append(record)
            return len(self.records)


def open_leader(data_dir: Path, clock: FakeClock, stream: MemoryStream, *,
                max_message_bytes: int = 1 << 20,
                **overrides: Any) -> tuple[Broker, list[LeaderReplicator]]:
    """A Broker whose store and log ship every write to ``stream``."""
    from tests.support.engine import make_config

    config = make_config(data_dir, **overrides)
    stores: list[RocksStore] = []
    made: list[LeaderReplicator] = []

    def store_factory(directory: Path, cfg: EngineConfig) -> RocksStore:
        stores.append(open_store(directory, cfg))
        return stores[-1]

    def log_factory(directory: Path, cfg: EngineConfig) -> Log:
        commitlog = open_commitlog(directory, cfg)
        rep = LeaderReplicator(stores[-1], commitlog, stream,
                               max_message_bytes=max_message_bytes)
        made.append(rep)
        stores[-1].attach_replicator(rep)
        commitlog.attach_replicator(rep)  # type: ignore[attr-defined]
        return commitlog

    broker = Broker(config, clock, log_factory=log_factory, store_factory=store_factory)
    broker.start()
    return broker, made


class FollowerNode:
    """A follower's storage (no engine): applies records with ``FollowerGuard``."""

    def __init__(self, data_dir: Path, **overrides: Any) -> None:
        from tests.support.engine import make_config

        cfg = make_config(data_dir, **overrides)
        self.config = cfg
        data_dir.mkdir(parents=True, exist_ok=True)
        self.store = open_store(data_dir / "rocksdb", cfg)
        self.store.disable_wal(vector_timers=True)  # as a follower's engine opens it
        self.log: CommitLog = open_commitlog(data_dir / "commitlog", cfg)  # type: ignore[assignment]
        self.guard = FollowerGuard(self.store, self.log)
        self.store.attach_replicator(self.guard)
        self.log.attach_replicator(self.guard)

    def catch_up(self, stream: MemoryStream) -> int:
        n = 0
        while self.guard.consumed < len(stream.records):
            seq = self.guard.consumed + 1
            self.guard.apply(seq, stream.records[seq - 1])
            n += 1
        return n

    def close(self) -> None:
        self.log.close()
        self.store.close()


def log_bytes(directory: Path, end: int) -> bytes:
    """The CommitLog's bytes up to ``end``, segment after segment, as they are on disk."""
    out = bytearray()
    for path in sorted(p for p in directory.iterdir() if NAME_PATTERN.match(p.name)):
        out += path.read_bytes()
    return bytes(out[:end])


def store_contents(store: RocksStore, *, skip_timer_below_frontier: bool = True) -> dict[str, Any]:
    """Every column family's pairs (a timer CF's only from its frontier on: the prefix below
    it is dead and cleaned locally, never shipped)."""
    out: dict[str, Any] = {}
    for cf in sorted(store._families):
        start = b""
        if skip_timer_below_frontier and cf.startswith("timer."):
            start = TimerIndex(store).frontier(int(cf.split(".")[1]))
        out[cf] = list(store.scan(cf, start))
    return out


@dataclass
class Pair:
    """A leader engine shipping every write to ``stream``; a follower's storage beside it."""

    stream: MemoryStream
    leader: Broker
    replicators: list[LeaderReplicator]
    follower: FollowerNode
    closed: bool = False

    def close(self) -> None:
        """Both closed (once): a test may open their data directories again."""
        if not self.closed:
            self.closed = True
            try:
                self.leader.close()
            finally:
                self.follower.close()
