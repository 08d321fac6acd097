"""The queue-on-an-LSM problem, measured with RocksDB's own counters (not with a clock).

After 1 M delivered keys are deleted, a due scan (scheduler/timer_index.py) from the persisted
watermark must not step over their tombstones, while a scan from the start of the column
family does, until ``cleanup_prefix`` (delete_range + compact_range) removes them physically.

``rocksdb.number.iter.skip`` counts the internal entries (tombstones and the values they
shadow) an iterator stepped over; RocksDB adds it to the statistics when the iterator is
destroyed, which the store does before a scan returns.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from scheduler.timer_index import TimerIndex
from storage.constants import timer_cf
from storage.keys import encode_timer_key, pack_u64
from storage.rocks import RocksStore

N = 1_000_000
BATCH = 10_000
VALUE = b"v" * 100
SKIP = "rocksdb.number.iter.skip"
T = TypeVar("T")
NEXT = "rocksdb.number.db.next"


def _delta(store: RocksStore, action: Callable[[], T]) -> tuple[dict[str, int], T]:
    """The statistics tickers that ``action`` moved, and its result."""
    before = store.statistics()
    result = action()
    after = store.statistics()
    return {k: after[k] - before.get(k, 0) for k in after}, result


@pytest.mark.slow
def test_scan_from_watermark_skips_one_million_tombstones(tmp_path: Path) -> None:
    cf = timer_cf(0)
    with RocksStore(tmp_path / "db", timer_shards=1) as store:
        timers = TimerIndex(store)
        keys = [encode_timer_key(t, "topic", "m") for t in range(N)]
        for i in range(0, N, BATCH):
            b = store.batch()
            b.put_many(cf, [(k, VALUE) for k in keys[i:i + BATCH]])
            store.write(b)
        live = [encode_timer_key(N + 10 + t, "topic", "live") for t in range(5)]
        b = store.batch()
        b.put_many(cf, [(k, b"live") for k in live])
        store.write(b)
        store.flush()  # part of the data in SST files, like a real store
        # A snapshot keeps background compaction from dropping tombstones (and the values they
        # shadow) at the bottommost level while the contrast below counts them; without it how
        # many the scan from 0 steps over depends on compaction's timing (980 k once in CI).
        assert store._db is not None
        pinned = store._db.snapshot()

        # deliver the first million: batched deletes, watermark written in the same batch
        for i in range(0, N, BATCH):
            b = store.batch()
            b.delete_many(cf, keys[i:i + BATCH])
            if i + BATCH >= N:
                timers.put_frontier(b, 0, pack_u64(N))
            store.write(b)
        del keys
        wm = timers.watermark(0)
        assert wm == N

        now = N + 100
        stats, due = _delta(store, lambda: timers.due(0, wm, now, 10))
        assert [k for k, _ in due] == live
        assert stats[SKIP] < 100, stats[SKIP]  # none of the 2 M dead entries was visited

        stats, due = _delta(store, lambda: timers.due(0, 0, now, 10))  # the contrast
        assert [k for k, _ in due] == live
        assert stats[SKIP] >= N, stats[SKIP]

        del pinned
        store.cleanup_prefix(cf, wm)
        stats, due = _delta(store, lambda: timers.due(0, 0, now, 10))
        assert [k for k, _ in due] == live
        assert stats[SKIP] < 100, stats[SKIP]
        assert stats[NEXT] <= len(live)
        # and the files no longer hold them
        entries = sum(f["num_entries"] + f["num_deletions"] for f in store.live_files())
        assert entries < 1000, entries
