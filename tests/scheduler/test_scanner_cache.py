"""The scanner reads a shard's due range around RocksDB's block cache after a scan of large
values (scheduler/scanner.py ``large_values``), and through it after small ones; real
RocksDB under tmp_path, a FakeClock."""

from __future__ import annotations

import threading
from pathlib import Path

from scheduler.clock import FakeClock
from scheduler.committer import ScanBatch
from scheduler.metrics import EngineMetrics
from scheduler.scanner import LARGE_VALUE_BYTES, Progress, Scanner, ShardState
from scheduler.timer_index import TimerIndex
from storage.constants import timer_cf
from storage.keys import encode_timer_key, time_bound
from storage.rocks import RocksStore


def _spy_fills(fills: list[bool]) -> object:
    """Install a TimerIndex.read_due that notes each read's ``fill_cache``; returns the
    original (to put back)."""
    read_due = TimerIndex.read_due

    def spy(self: TimerIndex, *args: object, fill_cache: bool = True,
            **kwargs: object) -> object:
        fills.append(fill_cache)
        return read_due(self, *args, fill_cache=fill_cache, **kwargs)  # type: ignore[arg-type]

    TimerIndex.read_due = spy  # type: ignore[assignment,method-assign]
    return read_due


def test_large_values_are_scanned_without_filling_the_block_cache(tmp_path: Path) -> None:
    """Each scan reads all that is due (four keys, five a scan at most): only the scans
    after one of large values read around the cache."""
    cf = timer_cf(0)
    sizes = [100] * 4 + [LARGE_VALUE_BYTES * 4] * 8 + [100] * 4  # due at 0..15 ms
    with RocksStore(tmp_path / "db", timer_shards=1) as store:
        b = store.batch()
        b.put_many(cf, [(encode_timer_key(t, "t", "m"), b"v" * n) for t, n in enumerate(sizes)])
        store.write(b)
        store.flush()
        handed: list[ScanBatch] = []
        clock = FakeClock(3)
        scanner = Scanner(state=ShardState(0, time_bound(0)), store=store,
                          clock=clock, batch_size=5,
                          hand_off=lambda batch: handed.append(batch) is None,
                          progress=Progress(), metrics=EngineMetrics(),
                          stopping=threading.Event())
        fills: list[bool] = []
        read_due = _spy_fills(fills)
        try:
            for _ in range(5):
                assert scanner.step() is False
                clock.advance(4)
        finally:
            TimerIndex.read_due = read_due  # type: ignore[method-assign]
        assert [len(v) for batch in handed for _, v in batch.items] == sizes
        # small, large, large (around the cache), small (after the last large scan), small
        assert fills == [True, True, False, False, True]
        assert scanner.large_values is False


def test_a_burst_is_read_on_around_the_block_cache(tmp_path: Path) -> None:
    """A read that stopped at its limit is followed by reads around the block cache (a
    burst: every key is read once), also the read-ahead's; once a scan read all that was
    due, the next reads through the cache again."""
    cf = timer_cf(0)
    with RocksStore(tmp_path / "db", timer_shards=1) as store:
        b = store.batch()
        b.put_many(cf, [(encode_timer_key(5, "t", f"m{i:02d}"), b"v" * 100) for i in range(10)]
                   + [(encode_timer_key(50, "t", "later"), b"v" * 100)]
                   + [(encode_timer_key(90, "t", f"n{i:02d}"), b"v" * 100) for i in range(10)])
        store.write(b)
        store.flush()
        handed: list[ScanBatch] = []
        clock = FakeClock(10)
        scanner = Scanner(state=ShardState(0, time_bound(0)), store=store, clock=clock,
                          batch_size=4, hand_off=lambda batch: handed.append(batch) is None,
                          progress=Progress(), metrics=EngineMetrics(),
                          stopping=threading.Event(), prefetch_ms=200,
                          prefetch_messages=1000, prefetch_bytes=1 << 20)
        fills: list[bool] = []
        read_due = _spy_fills(fills)
        try:
            assert [scanner.step(), scanner.step(), scanner.step()] == [True, True, False]
            assert fills == [True, False, False]  # 4 (the limit), then 4, then 2 and "later"
            clock.set(50)
            assert scanner.step() is False
            assert fills[3:] == [True]  # (the last scan read all that was due)
            fills.clear()
            scanner.prefetch(90)  # the next burst read ahead: 4, 4, 2
            assert fills == [True, False, False]
            clock.set(90)
            fills.clear()
            assert [scanner.step(), scanner.step(), scanner.step()] == [True, True, False]
            assert fills == [False]  # (from the read-ahead; past it, what is next: one seek)
        finally:
            TimerIndex.read_due = read_due  # type: ignore[method-assign]
        assert [len(batch.items) for batch in handed] == [4, 4, 2, 1, 4, 4, 2]


def _scanner(store: RocksStore, now: int, handed: list[ScanBatch], *, batch_size: int,
             batch_bytes: int | None, frontier: bytes = time_bound(0)) -> Scanner:
    return Scanner(state=ShardState(0, frontier), store=store, clock=FakeClock(now),
                   batch_size=batch_size, batch_bytes=batch_bytes,
                   hand_off=lambda batch: handed.append(batch) is None, progress=Progress(),
                   metrics=EngineMetrics(), stopping=threading.Event())


def test_large_values_are_scanned_a_few_bytes_at_a_time_and_each_once(tmp_path: Path) -> None:
    """``batch_bytes`` cuts scans of large values (after the first 32 keys of each, which
    judge their size) and never skips or repeats a key: 100 keys of 10 KiB due at once and
    one due later, 64 KiB a scan: batches of 32, 32, 32 and 4, every key once, in order,
    the shard's frontier just past them; small values are scanned ``batch_size`` at a
    time, uncut."""
    cf = timer_cf(0)
    with RocksStore(tmp_path / "db", timer_shards=1) as store:
        big = [encode_timer_key(5, "t", f"m{i:03d}") for i in range(100)]
        later = encode_timer_key(50, "t", "later")
        b = store.batch()
        b.put_many(cf, [(k, b"v" * 10240) for k in big] + [(later, b"v" * 10240)])
        store.write(b)
        handed: list[ScanBatch] = []
        scanner = _scanner(store, 10, handed, batch_size=1000, batch_bytes=64 << 10)
        steps = [scanner.step()]
        while steps[-1]:
            steps.append(scanner.step())
        assert [len(batch.items) for batch in handed] == [32, 32, 32, 4]
        assert [k for batch in handed for k, _ in batch.items] == big
        assert steps == [True, True, True, False]
        assert handed[-1].end == scanner.state.frontier_key == time_bound(11)
        assert scanner.state.wake_at == 50

        small = [encode_timer_key(60, "t", f"s{i:03d}") for i in range(300)]
        b = store.batch()
        b.put_many(cf, [(k, b"v" * 100) for k in small])
        store.write(b)
        handed.clear()
        scanner = _scanner(store, 100, handed, batch_size=200, batch_bytes=64 << 10,
                           frontier=scanner.state.frontier_key)
        while scanner.step():
            pass
        assert [len(batch.items) for batch in handed] == [200, 101]  # (later + 300 small)
        assert [k for batch in handed for k, _ in batch.items] == [later, *small]
