"""RocksStore against a real RocksDB under tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.constants import CF_HALF, CF_INDEX, CF_META, META_SHARDS, timer_cf
from storage.errors import InvalidArgument, StorageError
from storage.keys import encode_timer_key, topic_shard, unpack_u64
from storage.rocks import RocksStore


def test_put_get_delete_round_trip(store: RocksStore) -> None:
    b = store.batch()
    b.put(CF_INDEX, b"t\x00a", b"A")
    b.put(CF_INDEX, b"t\x00b", b"B")
    assert len(b) == 2
    store.write(b)
    assert store.get(CF_INDEX, b"t\x00a") == b"A"
    assert store.multi_get(CF_INDEX, [b"t\x00b", b"nope", b"t\x00a"]) == [b"B", None, b"A"]
    b = store.batch()
    b.delete(CF_INDEX, b"t\x00a")
    store.write(b)
    assert store.get(CF_INDEX, b"t\x00a") is None
    assert store.get(CF_INDEX, b"t\x00b") == b"B"


def test_batch_is_atomic_across_column_families_and_single_use(store: RocksStore) -> None:
    b = store.batch()
    b.put(timer_cf(0), b"k", b"v")
    b.put(CF_HALF, b"h", b"v")
    store.write(b)
    assert store.get(timer_cf(0), b"k") == b"v" and store.get(CF_HALF, b"h") == b"v"
    with pytest.raises(InvalidArgument):
        store.write(b)
    with pytest.raises(InvalidArgument):
        b.put(CF_HALF, b"x", b"y")


def test_unknown_column_family_is_invalid_argument(store: RocksStore) -> None:
    with pytest.raises(InvalidArgument):
        store.get("nope", b"k")
    with pytest.raises(InvalidArgument):
        store.batch().put("nope", b"k", b"v")
    with pytest.raises(InvalidArgument):
        store.read_range(timer_cf(2), b"", None, 10)


def test_read_range_next_gives_the_range_and_the_first_key_past_it(store: RocksStore) -> None:
    cf = timer_cf(0)
    keys = [encode_timer_key(t, "t", "m") for t in (1, 2, 3, 7, 9)]
    b = store.batch()
    b.put_many(cf, [(k, b"v") for k in keys])
    store.write(b)
    end = encode_timer_key(5, "t", "")
    assert store.read_range_next(cf, keys[0], end, 10) == (
        [(k, b"v") for k in keys[:3]], keys[3], True)
    # the limit came first: not complete, no next key
    assert store.read_range_next(cf, keys[0], end, 2) == (
        [(k, b"v") for k in keys[:2]], None, False)
    # nothing at or past the end
    assert store.read_range_next(cf, keys[4], encode_timer_key(99, "t", ""), 10) == (
        [(keys[4], b"v")], None, True)
    with pytest.raises(InvalidArgument):
        store.read_range_next("nope", b"", b"x", 1)


@pytest.mark.parametrize("flushed", [False, True], ids=["memtable", "sst"])
@pytest.mark.parametrize("fill_cache", [True, False], ids=["cached", "uncached"])
@pytest.mark.parametrize("count", [3, 40], ids=["few", "past-the-head"])
def test_read_range_next_stops_at_its_end_and_names_the_next_live_key_of_its_cf(
        store: RocksStore, flushed: bool, fill_cache: bool, count: int) -> None:
    """The read stops at ``end``: a key equal to ``end`` is not in the range but is the one
    named next; a deleted key past the end is passed over; keys of the next column family
    (``timer.1``) are neither read nor named; a start past the end reads nothing and names
    the first key at or after the start; a read that stopped at ``limit`` is not complete
    and names nothing, one with room left is. With 40 keys in the range the read goes past
    its first 32 (``_SIZED_HEAD``) and on with RocksDB's upper bound."""
    cf, other = timer_cf(0), timer_cf(1)
    end = encode_timer_key(5, "t", "m")
    below = [encode_timer_key(1 + i * 3 // count, "t", f"m{i:02d}") for i in range(count)]
    gone, past = encode_timer_key(6, "t", "m"), encode_timer_key(8, "t", "m")
    b = store.batch()
    b.put_many(cf, [(k, b"v") for k in [*below, end, gone, past]])
    b.put_many(other, [(encode_timer_key(t, "t", "m"), b"w") for t in (2, 4, 7, 9)])
    store.write(b)
    b = store.batch()
    b.delete(cf, gone)
    store.write(b)
    if flushed:
        store.flush()

    def read(start: bytes, stop: bytes, limit: int, max_bytes: int | None = None,
             ) -> tuple[list[bytes], bytes | None, bool]:
        items, after, complete = store.read_range_next(cf, start, stop, limit,
                                                       fill_cache=fill_cache,
                                                       max_bytes=max_bytes)
        assert all(v == b"v" for _, v in items)
        return [k for k, _ in items], after, complete

    assert read(below[0], end, 100) == (below, end, True)
    assert read(below[0], end, 100, max_bytes=1 << 20) == (below, end, True)
    assert read(below[0], end, count) == (below, None, False)  # (the limit: nothing named)
    assert read(below[0], end, count + 1) == (below, end, True)
    assert read(below[1], end + b"\x00", 100) == ([*below[1:], end], past, True)
    assert read(past, end, 100) == ([], past, True)  # (start past the end)
    assert read(past + b"\x00", encode_timer_key(99, "t", ""), 100) == ([], None, True)
    b = store.batch()
    b.delete(cf, end)
    b.delete(cf, past)
    store.write(b)
    assert read(below[0], end, 100) == (below, None, True)  # (timer.1's keys are not next)
    assert store.read_range_next(other, encode_timer_key(3, "t", ""), end, 100) == (
        [(encode_timer_key(4, "t", "m"), b"w")], encode_timer_key(7, "t", "m"), True)


def test_read_range_next_without_fill_cache_leaves_the_block_cache(tmp_path: Path) -> None:
    """A scan of large values read with ``fill_cache=False`` (the scanners' reads of large
    bodies) puts none of its data blocks into the block cache; read again with it, the same
    range fills the cache by about its bytes."""
    cf = timer_cf(0)
    with RocksStore(tmp_path / "db", timer_shards=1) as s:
        keys = [encode_timer_key(t, "t", "m") for t in range(200)]
        b = s.batch()
        b.put_many(cf, [(k, bytes([k[7]]) * 16384) for k in keys])
        s.write(b)
        s.flush()  # (from an SST file, not the memtable)

        def cache() -> int:
            return s.property_int(cf, "rocksdb.block-cache-usage") or 0

        before = cache()
        items, after, complete = s.read_range_next(cf, keys[0], encode_timer_key(150, "t", ""),
                                                   1000, fill_cache=False)
        assert [k for k, _ in items] == keys[:150] and after == keys[150] and complete
        assert all(v == bytes([k[7]]) * 16384 for k, v in items)
        assert cache() - before < 16384 * 10  # (index and filter blocks at most)
        again = s.read_range_next(cf, keys[0], encode_timer_key(150, "t", ""), 1000)
        assert again == (items, after, True)
        assert cache() - before > 16384 * 100


def test_read_range_next_bounded_in_bytes_cuts_only_large_values(store: RocksStore) -> None:
    """``max_bytes`` stops a read of large values once they add up to it (then the read is
    not complete, no next key is named and the values add up to ``max_bytes`` or more); the
    first 32 are read whatever their size; small values are read up to ``limit``,
    uncounted."""
    cf = timer_cf(0)
    keys = [encode_timer_key(t, "t", "m") for t in range(100)]
    b = store.batch()
    b.put_many(cf, [(k, b"v" * (50 if t >= 80 else 4096)) for t, k in enumerate(keys)])
    store.write(b)
    end = encode_timer_key(1000, "t", "")
    items, after, complete = store.read_range_next(cf, keys[0], end, 1000,
                                                   max_bytes=40 * 4096 + 1)
    assert [k for k, _ in items] == keys[:41] and after is None and not complete
    assert sum(len(v) for _, v in items) >= 40 * 4096 + 1
    items, after, complete = store.read_range_next(cf, keys[0], end, 1000, max_bytes=4096)
    assert [k for k, _ in items] == keys[:32] and after is None  # (the first 32 always)
    assert not complete
    items, after, complete = store.read_range_next(cf, keys[70], end, 1000, max_bytes=4096)
    assert [k for k, _ in items] == keys[70:] and after is None  # judged by its first 32
    assert complete
    items, after, complete = store.read_range_next(
        cf, keys[80], encode_timer_key(95, "t", ""), 1000, max_bytes=100)
    assert [k for k, _ in items] == keys[80:95] and after == keys[95] and complete
    assert store.read_range_next(cf, keys[0], end, 50, max_bytes=1 << 30) == (
        store.read_range_next(cf, keys[0], end, 50))


def test_shard_count_is_persisted_and_enforced(tmp_path: Path) -> None:
    with RocksStore(tmp_path / "db", timer_shards=3) as s:
        assert unpack_u64(s.get(CF_META, META_SHARDS) or b"") == 3
        b = s.batch()
        b.put(timer_cf(2), b"k", b"v")
        s.write(b)
    with pytest.raises(InvalidArgument, match="timer_shards=3"):
        RocksStore(tmp_path / "db", timer_shards=4)
    # the refused open created nothing and released the lock
    with RocksStore(tmp_path / "db", timer_shards=None) as s:
        assert s.timer_shards == 3
        assert s.get(timer_cf(2), b"k") == b"v"
        with pytest.raises(InvalidArgument):
            s.get(timer_cf(3), b"k")


def test_topic_shard_places_a_topic_in_one_shard_and_spreads_topics() -> None:
    assert {topic_shard(f"t{i}", 2) for i in range(100)} == {0, 1}
    assert topic_shard("t1", 2) == topic_shard("t1", 2)


def test_close_really_closes_even_with_an_abandoned_scan(tmp_path: Path) -> None:
    s = RocksStore(tmp_path / "db", timer_shards=1)
    b = s.batch()
    b.put_many(CF_INDEX, [(b"k%05d" % i, b"v") for i in range(3000)])
    s.write(b)
    it = s.scan(CF_INDEX)
    assert next(it)[0] == b"k00000"
    s.close()
    with pytest.raises(StorageError):
        s.get(CF_INDEX, b"k")
    s2 = RocksStore(tmp_path / "db", timer_shards=1)  # the lock was released
    assert s2.get(CF_INDEX, b"k02999") == b"v"
    s2.close()


def test_scan_bounds_limit_and_reverse(store: RocksStore) -> None:
    keys = [b"k%05d" % i for i in range(2500)]
    b = store.batch()
    b.put_many(CF_INDEX, [(k, k) for k in keys])
    store.write(b)
    assert [k for k, _ in store.scan(CF_INDEX)] == keys
    assert [k for k, _ in store.scan(CF_INDEX, b"k00010", b"k02100")] == keys[10:2100]
    assert [k for k, _ in store.scan(CF_INDEX, b"k00010", b"k02100", limit=1500)] == keys[10:1510]
    got = [k for k, _ in store.scan(CF_INDEX, b"k00010", b"k02100", reverse=True)]
    assert got == keys[10:2100][::-1]
    got = [k for k, _ in store.scan(CF_INDEX, b"k00010", None, limit=1100, reverse=True)]
    assert got == keys[::-1][:1100]
    assert list(store.scan(CF_INDEX, b"k5", b"k4")) == []


def test_checkpoint_opens_read_only(store: RocksStore, tmp_path: Path) -> None:
    b = store.batch()
    b.put(timer_cf(0), encode_timer_key(7, "t", "m"), b"payload")
    store.write(b)
    dest = store.checkpoint(tmp_path / "cp")
    b = store.batch()
    b.put(timer_cf(0), encode_timer_key(8, "t", "later"), b"x")
    store.write(b)
    with RocksStore(dest, timer_shards=None, read_only=True) as ro:
        assert ro.timer_shards == 2
        assert [v for _, v in ro.read_range(timer_cf(0), b"", None, 10)] == [b"payload"]
        w = ro.batch()
        w.put(CF_INDEX, b"k", b"v")
        with pytest.raises(StorageError):
            ro.write(w)
    with pytest.raises(InvalidArgument):
        store.checkpoint(dest)


def test_properties_statistics_and_live_files(store: RocksStore) -> None:
    b = store.batch()
    b.put_many(timer_cf(0), [(encode_timer_key(i, "t", "m"), b"v" * 100) for i in range(1000)])
    store.write(b)
    store.flush()
    assert store.property(timer_cf(0), "rocksdb.estimate-num-keys") == "1000"
    assert store.property(timer_cf(0), "rocksdb.no-such-property") is None
    files = store.live_files()
    assert sum(f["num_entries"] for f in files) >= 1000
    store.read_range(timer_cf(0), b"", None, 10)
    assert store.statistics()["rocksdb.number.db.seek"] >= 1


def test_rocksdb_failures_are_storage_errors(tmp_path: Path) -> None:
    with RocksStore(tmp_path / "db", timer_shards=1) as s:
        with pytest.raises(StorageError, match="lock"):
            RocksStore(tmp_path / "db", timer_shards=1)  # held by the open store
        b = s.batch()
    with pytest.raises(StorageError):
        b.put(CF_INDEX, b"k", b"v")  # a batch of a closed store
    with pytest.raises(StorageError):
        RocksStore(tmp_path / "nowhere", timer_shards=1, read_only=True)
    (tmp_path / "file").write_bytes(b"not a directory")
    with pytest.raises(StorageError):
        RocksStore(tmp_path / "file", timer_shards=1)


def test_cleanup_prefix_removes_only_below_the_bound(store: RocksStore) -> None:
    cf = timer_cf(0)
    b = store.batch()
    b.put_many(cf, [(encode_timer_key(t, "t", "m"), b"v") for t in range(1, 101)])
    store.write(b)
    store.cleanup_prefix(cf, 51)
    assert [unpack_u64(k) for k, _ in store.scan(cf)] == list(range(51, 101))
    store.cleanup_prefix(cf, 51)  # again: a no-op
    with pytest.raises(InvalidArgument):
        store.cleanup_prefix(CF_INDEX, 10)  # not time-ordered
