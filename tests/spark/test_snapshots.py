"""storage/snapshots.py: create (checkpoint + manifest), list, remove, pinned disk."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from bench.support.analysis_workload import WorkloadSpec, build_store
from storage.constants import timer_cf
from storage.errors import InvalidArgument, NotFound
from storage.rocks import RocksStore
from storage.snapshot_manifest import INT_PROPERTIES
from storage.snapshots import (
    create_snapshot,
    disk_usage,
    get_snapshot,
    list_snapshots,
    open_read_only,
    read_manifest,
    remove_snapshot,
)
from tests.spark import direct

SMALL = WorkloadSpec(messages=2_000, delivered=600, cancelled=200)


@pytest.fixture
def workload_store(tmp_path: Path) -> Any:
    """A store holding the SMALL workload, written as the engine writes it."""
    store, _ = build_store(tmp_path / "rocksdb", SMALL)
    yield store
    store.close()


def test_manifest_records_the_moment(workload_store: RocksStore, tmp_path: Path) -> None:
    info = create_snapshot(workload_store, tmp_path / "snaps", extra={"appliedPosition": 42},
                           now_ms=SMALL.now_ms)
    assert info.created_at == SMALL.now_ms and info.path.parent == tmp_path / "snaps"
    m = read_manifest(info.path)
    assert m["snapshotId"] == info.snapshot_id and m["createdAt"] == SMALL.now_ms
    assert m["extra"] == {"appliedPosition": 42}
    rocks = m["rocksdb"]
    assert rocks["meta"]["watermarks"] == {"0": SMALL.now_ms - 10_000,
                                           "1": SMALL.now_ms - 10_000}
    assert rocks["meta"]["timerShards"] == 2
    assert rocks["statisticsEnabled"]
    assert rocks["statistics"]["tickers"]["rocksdb.bytes.written"] > 0
    assert "rocksdb.db.flush.micros" in rocks["statistics"]["histograms"]
    # the SST list is the checkpoint's own, each file attributed to its column family
    files = direct.live_files(info.db_path)
    assert sorted(f["name"] for f in rocks["liveFiles"]) == sorted(
        f["name"].lstrip("/") for f in files)
    assert rocks["totals"]["deletions"] == sum(f["num_deletions"] for f in files)
    timer0 = rocks["columnFamilies"][timer_cf(0)]
    assert sum(lv["bytes"] for lv in timer0["levels"]) == direct.cf_sst_bytes(
        info.db_path)[timer_cf(0)]
    # the workload_store's own figures at that moment (nothing was written since)
    assert timer0["properties"] == {name: workload_store.property_int(timer_cf(0), name)
                                    for name in INT_PROPERTIES}
    assert timer0["properties"]["rocksdb.estimate-num-keys"] > 0
    assert "writeStalls" in timer0["compactionStats"]
    assert timer0["tableProperties"]["# entries"] > 0


def test_bad_extra_changes_nothing(workload_store: RocksStore, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="JSON"):
        create_snapshot(workload_store, tmp_path / "snaps", extra={"x": object()})
    assert not (tmp_path / "snaps").exists() or not any((tmp_path / "snaps").iterdir())


def test_list_get_remove(workload_store: RocksStore, tmp_path: Path) -> None:
    root = tmp_path / "snaps"
    a = create_snapshot(workload_store, root, extra={}, now_ms=1_000)
    b = create_snapshot(workload_store, root, extra={}, now_ms=2_000)
    (root / ".tmp-unfinished").mkdir()  # a crashed create: never listed
    assert [s.snapshot_id for s in list_snapshots(root)] == [a.snapshot_id, b.snapshot_id]
    assert get_snapshot(root, b.snapshot_id) == b
    remove_snapshot(root, a.snapshot_id)
    assert [s.snapshot_id for s in list_snapshots(root)] == [b.snapshot_id]
    with pytest.raises(NotFound):
        remove_snapshot(root, a.snapshot_id)
    with pytest.raises(InvalidArgument):
        remove_snapshot(root, "../rocksdb")
    assert list_snapshots(tmp_path / "none") == []


def _gone(snapshot_db: Path, live: Path) -> list[Path]:
    """SST files of a snapshot the live DB no longer has, by name (RocksDB never reuses one)."""
    live_names = {f.name for f in live.iterdir()}
    return [f for f in snapshot_db.iterdir() if f.suffix == ".sst" and f.name not in live_names]


def test_pinned_bytes_grow_when_compaction_replaces_files(
    workload_store: RocksStore, tmp_path: Path,
) -> None:
    root, live = tmp_path / "snaps", tmp_path / "rocksdb"
    old = create_snapshot(workload_store, root, extra={})
    for shard in range(SMALL.shards):  # compact the timer CFs: their SSTs are replaced
        workload_store.cleanup_prefix(timer_cf(shard), SMALL.now_ms + 30 * 86_400_000)
    new = create_snapshot(workload_store, root, extra={})
    workload_store.close()  # no background compaction from here on: the figures hold still
    gone = _gone(old.db_path, live)
    timer_ssts = {f["name"] for f in read_manifest(old.path)["rocksdb"]["liveFiles"]
                  if f["cf"].startswith("timer.")}
    assert timer_ssts <= {f.name for f in gone}  # every old timer SST was compacted away
    usage = disk_usage(old, live)
    assert usage.pinned_bytes == sum(f.stat().st_size for f in gone) > 0
    assert disk_usage(old).pinned_bytes == usage.pinned_bytes  # link count alone agrees
    assert disk_usage(new, live).pinned_bytes == sum(
        f.stat().st_size for f in _gone(new.db_path, live))
    assert usage.exclusive_bytes >= usage.pinned_bytes
    assert usage.total_bytes == sum(f.stat().st_size for f in old.db_path.iterdir())
    remove_snapshot(root, old.snapshot_id)  # removing it gives its exclusive bytes back
    assert not old.path.exists()


def test_read_only_open_writes_nothing_into_the_snapshot(workload_store: RocksStore,
                                                         tmp_path: Path) -> None:
    info = create_snapshot(workload_store, tmp_path / "snaps", extra={})

    def state() -> dict[str, tuple[int, str]]:  # names, times and contents
        return {f.name: (f.stat().st_mtime_ns, hashlib.sha256(f.read_bytes()).hexdigest())
                for f in info.db_path.iterdir()}

    before = state()
    with open_read_only(info.path, statistics=True) as snap:
        assert timer_cf(0) in snap.cf_names
        assert snap.meta()["timerShards"] == 2
        assert "rocksdb.number.iter.skip" in snap.statistics()
    assert state() == before  # rocksdict used to rewrite its config file in there


def test_not_a_snapshot(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps([1]))
    with pytest.raises(Exception, match="not a JSON object"):
        read_manifest(tmp_path)
