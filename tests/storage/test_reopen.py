"""A full disk under a real RocksDB (a 16 MiB tmpfs): the sticky ENOSPC, the reopen in place,
its pacing on a FakeClock, the free-space reserve, readiness, and the Gate that the reopen
passes alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.config import EngineConfig
from scheduler.model import SendRequest
from storage.constants import CF_INDEX, timer_cf
from storage.errors import StorageError
from storage.gate import Gate
from storage.records import MessageStatus
from storage.rocks import RocksStore
from storage.write_guard import SPACE_CHECK_MS, is_sticky, wal_bytes
from tests.disk import fill_disk, tmpfs

KIB = 1024
MIB = 1024 * KIB
INTERVAL_MS = 1000
VALUE = b"v" * KIB


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs: a disk that really fills up."""
    with tmpfs(tmp_path, 16) as mountpoint:
        yield mountpoint


def open_store(fs: Path, clock: FakeClock, reserve: int = 0) -> RocksStore:
    return RocksStore(fs / "db", timer_shards=1, clock=clock, disk_reserve_bytes=reserve,
                      disk_retry_interval_ms=INTERVAL_MS)


def put(store: RocksStore, keys: list[bytes]) -> None:
    batch = store.batch()
    batch.put_many(CF_INDEX, [(k, VALUE) for k in keys])
    store.write(batch)


def write_until_refused(store: RocksStore, prefix: str) -> tuple[list[bytes], StorageError]:
    """Batches of 8 x 1 KiB until a write fails; returns the acknowledged keys and the error."""
    acked: list[bytes] = []
    for i in range(100_000):
        keys = [f"{prefix}{i:06}-{j}".encode() for j in range(8)]
        try:
            put(store, keys)
        except StorageError as exc:
            return acked, exc
        acked.extend(keys)
    pytest.fail("the disk never filled")


def refused(store: RocksStore, key: bytes) -> str:
    with pytest.raises(StorageError) as info:
        put(store, [key])
    return str(info.value)


def test_acknowledged_writes_are_all_there_after_the_reopen(fs: Path) -> None:
    clock = FakeClock()
    store = open_store(fs, clock)
    before = [f"early{i}".encode() for i in range(100)]
    put(store, before)
    ballast = fill_disk(fs, leave_bytes=256 * KIB)
    acked, error = write_until_refused(store, "k")
    assert "No space left on device" in str(error)
    assert is_sticky(error) and len(acked) > 8
    assert not store.writable
    # the sticky error: reads still work, every write is refused, also once space is back
    assert store.multi_get(CF_INDEX, acked) == [VALUE] * len(acked)
    assert "I/O error" in refused(store, b"x")
    ballast.unlink()
    assert "I/O error" in refused(store, b"x")  # the last attempt was < 1 interval ago
    assert store.reopens == 0
    clock.advance(INTERVAL_MS)
    put(store, [b"after"])  # this write reopens the DB first
    assert store.reopens == 1 and store.refusal is None and store.writable
    everything = [*before, *acked, b"after"]
    assert store.multi_get(CF_INDEX, everything) == [VALUE] * len(everything)
    assert store.get(CF_INDEX, b"x") is None  # refused writes are nowhere
    store.close()
    with RocksStore(fs / "db", timer_shards=1) as again:  # and durable: in the WAL / SSTs
        assert again.multi_get(CF_INDEX, everything) == [VALUE] * len(everything)


def test_the_reopen_is_tried_at_most_once_per_interval(fs: Path) -> None:
    clock = FakeClock()
    store = open_store(fs, clock)
    ballast = fill_disk(fs, leave_bytes=128 * KIB)
    first, _ = write_until_refused(store, "a")
    ballast.unlink()
    put(store, [b"at-once"])  # the first write after the error may try at once
    assert store.reopens == 1
    ballast = fill_disk(fs, leave_bytes=128 * KIB)
    second, _ = write_until_refused(store, "b")
    assert "are free" in refused(store, b"x")  # tried at once: no room, next in 1 interval
    ballast.unlink()
    for _ in range(3):  # space is back, but neither writes nor readiness checks try yet
        clock.advance(INTERVAL_MS // 4)
        assert "are free" in refused(store, b"x")
        assert not store.writable
    assert store.reopens == 1
    clock.advance(INTERVAL_MS // 4)
    assert store.writable  # a readiness check reopens, with no write at all
    assert store.reopens == 2
    keys = [*first, b"at-once", *second]
    assert store.multi_get(CF_INDEX, keys) == [VALUE] * len(keys)
    store.close()


def test_below_the_reserve_writes_are_refused_before_rocksdb_sees_enospc(fs: Path) -> None:
    clock = FakeClock()
    store = open_store(fs, clock, reserve=4 * MIB)
    put(store, [b"a"])
    ballast = fill_disk(fs, leave_bytes=2 * MIB)
    put(store, [b"b"])  # the free space is read at most every SPACE_CHECK_MS
    clock.advance(SPACE_CHECK_MS)
    assert "below the reserve" in refused(store, b"c")
    assert not store.writable
    assert store.get(CF_INDEX, b"b") == VALUE
    ballast.unlink()
    assert not store.writable  # re-read only after the retry interval
    clock.advance(INTERVAL_MS)
    assert store.writable
    put(store, [b"c"])
    assert store.reopens == 0  # RocksDB itself never failed
    assert store.multi_get(CF_INDEX, [b"a", b"b", b"c"]) == [VALUE] * 3
    store.close()


def test_a_reopen_needs_room_for_the_wal_replay(fs: Path) -> None:
    clock = FakeClock()
    store = open_store(fs, clock)
    ballast = fill_disk(fs, leave_bytes=512 * KIB)
    write_until_refused(store, "w")
    ballast.unlink()
    wal = wal_bytes(fs / "db")
    assert wal > 0
    # room for less than the WAL's flush: no attempt, the store keeps its (readable) DB
    fill_disk(fs, leave_bytes=wal // 2)
    clock.advance(INTERVAL_MS)
    assert "are free" in refused(store, b"x")
    assert store.reopens == 0 and store.get(CF_INDEX, b"w000000-0") == VALUE
    store.close()


def test_readiness_is_503_while_writes_are_refused_though_nothing_is_due(fs: Path) -> None:
    clock = FakeClock()
    config = EngineConfig(data_dir=fs / "data", timer_shards=1, segment_size=1 * MIB,
                          max_body_bytes=MIB // 2,
                          disk_reserve_bytes=0, disk_retry_interval_ms=0)
    with Broker(config, clock) as broker:
        assert broker.ready
        ballast = fill_disk(fs, leave_bytes=64 * KIB)
        acked = []
        with pytest.raises(StorageError, match="No space left"):
            for i in range(10_000):
                broker.send(SendRequest(topic="t", body=VALUE, msg_id=f"m{i}",
                                        delay_ms=3_600_000))
                acked.append(f"m{i}")
        assert not broker.ready  # nothing is due: the store's refusal alone says so
        assert not broker.ready
        ballast.unlink()
        assert broker.ready  # this check reopened the store (interval 0)
        broker.send(SendRequest(topic="t", body=VALUE, msg_id="after", delay_ms=3_600_000))
        assert all(broker.status("t", m).status is MessageStatus.SCHEDULED
                   for m in [*acked, "after"])


def test_reopen_under_concurrent_reads_and_writes(tmp_path: Path) -> None:
    """Threads build batches, write and read while the store reopens again and again: every
    operation works (those that meet a reopen wait for it), nothing acknowledged is lost,
    and no handle of an old DB survives a reopen (the reopen would fail with "lock")."""
    store = RocksStore(tmp_path / "db", timer_shards=1)
    stop = threading.Event()
    acked: list[bytes] = []
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        i = 0
        while not stop.is_set():
            key = f"{name}{i:08}".encode()
            batch = store.batch()
            batch.put(timer_cf(0), key, VALUE)
            batch.put(CF_INDEX, key, VALUE)
            try:
                store.write(batch)
            except StorageError as exc:
                errors.append(exc)
                continue
            acked.append(key)
            i += 1

    def reader() -> None:
        while not stop.is_set():
            try:
                list(store.scan(timer_cf(0), limit=300))
                store.multi_get(CF_INDEX, acked[-50:])
            except StorageError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(name,)) for name in "ab"]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    try:
        for _ in range(20):
            store.reopen()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert store.reopens == 20
    assert errors == []
    assert len(acked) > 0
    assert store.multi_get(CF_INDEX, acked) == [VALUE] * len(acked)
    assert sorted(k for k, _ in store.scan(timer_cf(0))) == sorted(acked)
    store.close()


def test_the_gate_lets_the_exclusive_side_in_alone() -> None:
    gate = Gate()
    holding, release = threading.Event(), threading.Event()
    inside: list[str] = []

    def shared(name: str, hold: bool) -> None:
        with gate:
            inside.append(name)
            if hold:
                holding.set()
                release.wait()

    def exclusive() -> None:
        with gate.exclusive():
            inside.append("exclusive")
            assert gate.in_flight == 0

    first = threading.Thread(target=shared, args=("first", True))
    first.start()
    assert holding.wait(10)
    ex = threading.Thread(target=exclusive)
    ex.start()
    while not gate._pausing:  # the exclusive side is waiting for "first" to leave
        ex.join(0.001)
    late = threading.Thread(target=shared, args=("late", False))
    late.start()
    late.join(0.2)
    assert inside == ["first"]  # neither the exclusive side nor a newcomer got in
    release.set()
    for t in (first, ex, late):
        t.join(10)
    assert inside == ["first", "exclusive", "late"]
    assert gate.in_flight == 0
