"""Cluster-mode test support without NATS: an in-memory write-ahead stream (with the same
fencing as JetStream's expected-last-sequence), and node storage that applies it."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.support.replicated import open_follower_storage, open_leader_broker
from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.timer_index import TimerIndex
from storage.errors import NotLeader
from storage.replication import LeaderReplicator
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

    return open_leader_broker(make_config(data_dir, **overrides), clock, stream,
                              max_message_bytes=max_message_bytes)


class FollowerNode:
    """A follower's storage (no engine): applies records with ``FollowerGuard``."""

    def __init__(self, data_dir: Path, **overrides: Any) -> None:
        from tests.support.engine import make_config

        self.config = make_config(data_dir, **overrides)
        self.store, self.log, self.guard = open_follower_storage(data_dir, self.config)

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
