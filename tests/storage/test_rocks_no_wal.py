"""RocksStore.disable_wal (a cluster follower's store: the write-ahead stream is its WAL):
nothing goes to RocksDB's WAL, a kill -9 leaves the store as it was at one write (all column
families flushed together), a close keeps everything, a reopen stops the writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from storage.constants import CF_INDEX, CF_META, timer_cf
from storage.errors import StorageError
from storage.keys import pack_u64, unpack_u64
from storage.rocks import RocksStore, StoreTuning

REPO = Path(__file__).resolve().parents[2]
SEQ = b"test-seq"

# a child process writes record after record (each: a small key in the index CF, a large
# value in a timer CF, its number in meta), with small memtables so they flush often and at
# different times, then kills itself with SIGKILL: no close, no flush
CHILD = """
import os, signal, sys
from storage.constants import CF_INDEX, CF_META, timer_cf
from storage.keys import pack_u64
from storage.rocks import RocksStore, StoreTuning
tuning = StoreTuning(timer_write_buffer_bytes=256 << 10, index_write_buffer_bytes=1 << 20,
                     other_write_buffer_bytes=4 << 20, db_write_buffer_bytes=64 << 20)
store = RocksStore(sys.argv[1], timer_shards=1, tuning=tuning)
store.disable_wal(vector_timers=True)  # (as a cluster follower's)
for i in range(1, int(sys.argv[2]) + 1):
    b = store.batch()
    b.put(CF_INDEX, pack_u64(i), b"i")
    b.put(timer_cf(0), pack_u64(i), os.urandom(2000))
    b.put(CF_META, b"test-seq", pack_u64(i))
    store.write(b)
print("written", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def last_key(store: RocksStore, cf: str) -> int:
    keys = [unpack_u64(k) for k, _ in store.scan(cf, b"")]
    return max(keys, default=0)


def test_killed_store_is_one_write_in_every_column_family(tmp_path: Path) -> None:
    path = tmp_path / "db"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.run([sys.executable, "-c", CHILD, str(path), "3000"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    store = RocksStore(path, timer_shards=1)
    try:
        raw = store.get(CF_META, SEQ)
        seq = 0 if raw is None else unpack_u64(raw)
        # every family holds exactly the writes up to that one: none newer, none missing
        assert last_key(store, CF_INDEX) == seq
        assert last_key(store, timer_cf(0)) == seq
        assert len(list(store.scan(CF_INDEX, b""))) == seq
        # some flushes happened (the timer CF's memtable is 256 KiB: ~6 MB were written),
        # not the last writes (they were in memtables only)
        assert 0 < seq < 3000
    finally:
        store.close()


def test_no_wal_close_keeps_everything_and_writes_no_wal(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = RocksStore(path, timer_shards=1)
    store.disable_wal()
    assert not store.wal
    for i in range(200):
        b = store.batch()
        b.put(CF_INDEX, pack_u64(i), os.urandom(1000))
        store.write(b, sync=True)  # (sync means nothing without a WAL: no error)
    wal = sum(p.stat().st_size for p in path.glob("*.log"))
    assert wal < 20_000  # 200 KB written, none of it to the WAL
    store.close()
    store = RocksStore(path, timer_shards=1)
    try:
        assert store.wal
        assert len(list(store.scan(CF_INDEX, b""))) == 200
    finally:
        store.close()


def test_vector_timer_memtables_read_in_key_order(tmp_path: Path) -> None:
    """A follower's timer CFs (vector memtables) still read in key order (its recount and
    listings scan them), from the memtable and from flushed files alike."""
    store = RocksStore(tmp_path / "db", timer_shards=1)
    try:
        store.disable_wal(vector_timers=True)
        keys = [pack_u64(k) for k in (7, 3, 9, 1, 5)]
        for k in keys:  # one write each, in no order
            b = store.batch()
            b.put(timer_cf(0), k, b"v" + k)
            store.write(b)
        assert [k for k, _ in store.scan(timer_cf(0), b"")] == sorted(keys)
        assert store.get(timer_cf(0), pack_u64(9)) == b"v" + pack_u64(9)
        store.flush()
        b = store.batch()
        b.put(timer_cf(0), pack_u64(4), b"x")
        store.write(b)
        assert [unpack_u64(k) for k, _ in store.scan(timer_cf(0), pack_u64(3))] == [3, 4, 5, 7, 9]
    finally:
        store.close()


def test_reopen_without_wal_stops_writes(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "db", timer_shards=1, tuning=StoreTuning())
    try:
        store.disable_wal()
        b = store.batch()
        b.put(CF_INDEX, b"k", b"v")
        store.write(b)
        store.reopen()  # (as after a full disk): what was only in the memtables is gone
        b = store.batch()
        b.put(CF_INDEX, b"k2", b"v")
        with pytest.raises(StorageError, match="reopened without a WAL"):
            store.write(b)
    finally:
        store.close()
