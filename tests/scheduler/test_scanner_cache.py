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


def test_large_values_are_scanned_without_filling_the_block_cache(tmp_path: Path) -> None:
    cf = timer_cf(0)
    sizes = [100] * 4 + [LARGE_VALUE_BYTES * 4] * 8 + [100] * 4  # due at 0..15 ms
    with RocksStore(tmp_path / "db", timer_shards=1) as store:
        b = store.batch()
        b.put_many(cf, [(encode_timer_key(t, "t", "m"), b"v" * n) for t, n in enumerate(sizes)])
        store.write(b)
        store.flush()
        handed: list[ScanBatch] = []
        scanner = Scanner(state=ShardState(0, time_bound(0)), store=store,
                          clock=FakeClock(len(sizes)), batch_size=4,
                          hand_off=lambda batch: handed.append(batch) is None,
                          progress=Progress(), metrics=EngineMetrics(),
                          stopping=threading.Event())
        fills: list[bool] = []
        read_due = TimerIndex.read_due

        def spy(self: TimerIndex, *args: object, fill_cache: bool = True) -> object:
            fills.append(fill_cache)
            return read_due(self, *args, fill_cache=fill_cache)  # type: ignore[arg-type]

        TimerIndex.read_due = spy  # type: ignore[assignment,method-assign]
        try:
            while scanner.step():
                pass
        finally:
            TimerIndex.read_due = read_due  # type: ignore[method-assign]
        assert [len(v) for batch in handed for _, v in batch.items] == sizes
        # small, large, large (around the cache), small (after the last large scan), small
        assert fills == [True, True, False, False, True]
        assert scanner.large_values is False
