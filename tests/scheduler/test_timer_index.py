"""TimerIndex (scheduler/timer_index.py): due reads and the persisted frontier, over a real
RocksDB under tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.timer_index import TimerIndex
from storage.constants import CF_META, META_WATERMARK_PREFIX, timer_cf
from storage.errors import InvalidArgument
from storage.keys import encode_timer_key, pack_u64, time_bound, unpack_u64
from storage.rocks import RocksStore


def test_a_shard_outside_the_store_is_invalid_argument(store: RocksStore) -> None:
    timers = TimerIndex(store)
    assert timers.shards == store.timer_shards == 2
    for shard in (2, -1):
        with pytest.raises(InvalidArgument):
            timers.due(shard, 0, 10, 10)
        with pytest.raises(InvalidArgument):
            timers.cleanup(shard)


def test_due_returns_exactly_keys_up_to_now_in_order(store: RocksStore) -> None:
    timers = TimerIndex(store)
    times = [5, 1, 9, 10, 10, 11, 3, 100, 0]
    keys = [encode_timer_key(t, "topic", f"m{i}") for i, t in enumerate(times)]
    b = store.batch()
    b.put_many(timer_cf(1), [(k, b"v" + k) for k in keys])
    store.write(b)
    got = timers.due(1, 0, 10, 1000)
    expected = sorted(k for k, t in zip(keys, times, strict=True) if t <= 10)
    assert [k for k, _ in got] == expected
    assert all(v == b"v" + k for k, v in got)
    # from_ms is inclusive, limit is respected, other shards are untouched
    assert [unpack_u64(k) for k, _ in timers.due(1, 3, 10, 2)] == [3, 5]
    assert timers.due(0, 0, 10**12, 1000) == []
    assert timers.due(1, 11, 10, 1000) == []
    assert [unpack_u64(k) for k, _ in timers.due(1, 11, 10**12, 1000)] == [11, 100]


def test_read_due_reads_from_the_frontier_and_names_the_next_key(store: RocksStore) -> None:
    timers = TimerIndex(store)
    keys = [encode_timer_key(t, "topic", "m") for t in (3, 4, 8)]
    b = store.batch()
    b.put_many(timer_cf(0), [(k, b"v") for k in keys])
    store.write(b)
    items, after, complete = timers.read_due(timer_cf(0), time_bound(0), time_bound(5), 100)
    assert [k for k, _ in items] == keys[:2] and after == keys[2] and complete
    items, after, complete = timers.read_due(timer_cf(0), keys[0] + b"\x00", time_bound(5), 100)
    assert [k for k, _ in items] == keys[1:2] and after == keys[2] and complete
    assert timers.read_due(timer_cf(0), time_bound(9), time_bound(10), 100) == ([], None, True)


def test_watermark_persists_with_the_batch(tmp_path: Path) -> None:
    with RocksStore(tmp_path / "db", timer_shards=2) as s:
        timers = TimerIndex(s)
        assert timers.watermark(0) == 0
        assert timers.frontier(0) == time_bound(0)
        b = s.batch()
        timers.put_frontier(b, 1, pack_u64(12345))
        s.write(b, sync=True)
        assert timers.watermark(1) == 12345 and timers.watermark(0) == 0
    with RocksStore(tmp_path / "db", timer_shards=2) as s:
        assert TimerIndex(s).watermark(1) == 12345
        # where it lives: meta, the key snapshots read (storage/snapshot_read.py)
        assert s.get(CF_META, META_WATERMARK_PREFIX + b"1") == pack_u64(12345)


def test_a_frontier_inside_a_millisecond_reads_as_its_millisecond(store: RocksStore) -> None:
    timers = TimerIndex(store)
    inside = encode_timer_key(42, "topic", "m7") + b"\x00"
    b = store.batch()
    TimerIndex.put_frontier(b, 0, inside)
    store.write(b)
    assert timers.frontier(0) == inside
    assert timers.watermark(0) == 42


def test_cleanup_deletes_below_the_watermark_only(store: RocksStore) -> None:
    timers = TimerIndex(store)
    cf = timer_cf(1)
    b = store.batch()
    b.put_many(cf, [(encode_timer_key(t, "t", "m"), b"v") for t in range(1, 101)])
    timers.put_frontier(b, 1, time_bound(61))
    store.write(b)
    assert timers.cleanup(1) == 61
    assert [unpack_u64(k) for k, _ in store.scan(cf)] == list(range(61, 101))
