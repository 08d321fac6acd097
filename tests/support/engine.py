"""Engine test support: a harness opening real Brokers (RocksDB + CommitLog under a data
directory) on a FakeClock with small segments, fault-injecting wrappers of the log and the
store, and helpers to read a topic and drive time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.committer import Log
from scheduler.config import EngineConfig
from scheduler.engine import open_commitlog, open_store
from storage.errors import StorageError
from storage.records import LogRecord
from storage.rocks import Batch, RocksStore

START_MS = 1_700_000_000_000


class FlakyLog:
    """Wraps the real CommitLog; ``fail_appends = n`` makes the next n appends raise (and
    append nothing, as a real failed append); ``after_append`` runs after a successful one;
    ``fail_revokes`` as ``fail_appends`` for ``revoke``."""

    def __init__(self, inner: Log) -> None:
        self.inner = inner
        self.fail_appends = 0
        self.appends = 0
        self.records = 0
        self.after_append: Callable[[list[int]], None] | None = None
        self.before_append: Callable[[], None] | None = None
        self.fail_revokes = 0  # the next n revokes raise (and revoke nothing)
        self.revokes: list[int] = []  # positions revoked

    @property
    def end_position(self) -> int:
        return self.inner.end_position

    def append_batch(self, payloads: Sequence[bytes]) -> list[int]:
        if self.before_append is not None:
            self.before_append()
        if self.fail_appends > 0:
            self.fail_appends -= 1
            raise StorageError("injected: disk full")
        positions = self.inner.append_batch(payloads)
        self.appends += 1
        self.records += len(payloads)
        if self.after_append is not None:
            self.after_append(positions)
        return positions

    def read(self, position: int) -> bytes:
        return self.inner.read(position)

    def read_many(self, positions: Sequence[int], max_bytes: int | None = None) -> list[bytes]:
        return self.inner.read_many(positions, max_bytes)

    def iter_from(self, position: int) -> Any:
        return self.inner.iter_from(position)

    def revoke(self, position: int) -> None:
        if self.fail_revokes > 0:
            self.fail_revokes -= 1
            raise StorageError("injected: revoke failed")
        self.inner.revoke(position)
        self.revokes.append(position)

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()


class FlakyStore(RocksStore):
    """A real RocksStore whose ``write`` fails ``fail_writes`` times when armed; it records
    the prefix clean-ups it is asked for."""

    fail_writes = 0
    fail_after_writes = 0  # the next n writes land, then raise (an error that is not a no)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cleanups: list[tuple[str, int]] = []

    def cleanup_prefix(self, cf: str, before_ms: int) -> None:
        self.cleanups.append((cf, before_ms))
        super().cleanup_prefix(cf, before_ms)

    def write(self, batch: Batch, *, sync: bool | None = None) -> None:
        if self.fail_writes > 0:
            self.fail_writes -= 1
            raise StorageError("injected: RocksDB write failed")
        super().write(batch, sync=sync)
        if self.fail_after_writes > 0:
            self.fail_after_writes -= 1
            raise StorageError("injected: RocksDB write raised after it landed")


def make_config(data_dir: Path, **overrides: Any) -> EngineConfig:
    settings: dict[str, Any] = {
        "data_dir": data_dir, "timer_shards": 2, "segment_size": 1 << 20,
        "max_body_bytes": 512 << 10,
        "flush_interval_ms": 50, "scan_interval_ms": 0,  # pacing: test_frontier.py
        "scan_prefetch_ms": 0,  # the read-ahead: test_prefetch.py
    }
    settings.update(overrides)
    return EngineConfig(**settings)


class Harness:
    """Opens Brokers on one data dir and closes every one at teardown."""

    def __init__(self, data_dir: Path, clock: FakeClock) -> None:
        self.data_dir = data_dir
        self.clock = clock
        self.brokers: list[Broker] = []
        self.log: FlakyLog | None = None
        self.store: FlakyStore | None = None

    def open(self, *, flaky: bool = False, **overrides: Any) -> Broker:
        config = make_config(self.data_dir, **overrides)

        def log_factory(directory: Path, cfg: EngineConfig) -> Log:
            self.log = FlakyLog(open_commitlog(directory, cfg))
            return self.log

        def store_factory(directory: Path, cfg: EngineConfig) -> RocksStore:
            self.store = FlakyStore(directory, timer_shards=cfg.timer_shards)
            return self.store

        broker = Broker(config, self.clock,
                        log_factory=log_factory if flaky else None,
                        store_factory=store_factory if flaky else open_store)
        self.brokers.append(broker)
        broker.start()
        return broker

    def close_all(self) -> None:
        for broker in self.brokers:
            broker.close()


def read_topic(broker: Broker, topic: str) -> list[LogRecord]:
    """Every message delivered to ``topic``, in queue order."""
    out: list[LogRecord] = []
    offset = 0
    while True:
        page = broker.pull(topic, offset, 1000)
        out.extend(page.messages)
        if not page.messages:
            return out
        offset = page.next_offset


def run_threads(targets: Sequence[Callable[[], None]]) -> None:
    """Start every target at once (a barrier), join them, re-raise the first error."""
    barrier = threading.Barrier(len(targets))
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                barrier.wait()
                fn()
            except BaseException as exc:
                errors.append(exc)
        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def advance_until(clock: FakeClock, condition: Callable[[], bool], step: int = 100,
                  timeout_s: float = 60.0) -> None:
    """Advance fake time by ``step`` until ``condition()`` holds. Between steps the test
    yields the CPU for a moment so the engine threads can react (this never waits for a
    due time: fake time only moves here)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition never held")
        clock.advance(step)
        time.sleep(0.001)


def open_failing_after_append(
    harness: Harness, *, messages: int, store_failures: int, **overrides: Any,
) -> tuple[Broker, FlakyLog, FlakyStore]:
    """A flaky Broker holding ``messages`` scheduled messages (topic "t", ids m0.., due in
    10 ms), armed so that once the first delivery append has landed in the CommitLog, the
    next ``store_failures`` RocksDB writes fail: the window between the log append and the
    RocksDB commit. The clock is not moved."""
    from scheduler.model import SendRequest  # (imports above are shared with other helpers)

    broker = harness.open(flaky=True, **overrides)
    store, log = harness.store, harness.log
    assert store is not None and log is not None
    broker.send_batch([SendRequest(topic="t", body=b"x", msg_id=f"m{i}", delay_ms=10)
                       for i in range(messages)])

    def fail_store_writes(_positions: list[int]) -> None:
        store.fail_writes = store_failures
        log.after_append = None

    log.after_append = fail_store_writes
    return broker, log, store
