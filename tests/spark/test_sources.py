"""The data sources return exactly what a direct rocksdict read returns."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

from spark_jobs.keyspace import plan_cf, plan_partitions, select_cfs
from tests.spark import direct
from tests.spark.conftest import Generated

pytestmark = pytest.mark.spark

COLUMNS = ("cf", "shard", "key_time", "deliver_at", "topic", "msg_id", "queue_offset",
           "key_size", "value_size", "state")


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return [tuple(r[c] for c in COLUMNS) for r in df.collect()]


def test_logical_rows_equal_a_direct_read(spark: Any, workload: Generated) -> None:
    df = (spark.read.format("hourglass_logical").option("partitions", "7")
          .load(str(workload.snapshot.path)))
    assert df.rdd.getNumPartitions() > 1  # the key space really was split
    got = _rows(df)
    expected = direct.logical_rows(workload.snapshot.db_path)
    assert len(got) == len(expected)  # no key read twice
    assert Counter(got) == Counter(expected)


def test_logical_rows_match_the_ground_truth(spark: Any, workload: Generated) -> None:
    df = spark.read.format("hourglass_logical").option("cf", "timer.*,index").load(
        str(workload.snapshot.path))
    rows = _rows(df)
    timers = {(r[4], r[5]): r for r in rows if r[0].startswith("timer.")}
    index = {(r[4], r[5]): r for r in rows if r[0] == "index"}
    for m in workload.work.messages:
        entry = index[(m.topic, m.msg_id)]
        assert entry[9] == m.state.value and entry[3] == m.deliver_at
        if m.state.value == "SCHEDULED":
            t = timers.pop((m.topic, m.msg_id))
            assert (t[1], t[3], t[7], t[8]) == (m.shard, m.deliver_at, m.key_size, m.value_size)
    assert not timers  # no timer key for a delivered or cancelled message


def test_cf_option_selects_and_rejects_unknown(spark: Any, workload: Generated) -> None:
    path = str(workload.snapshot.path)
    cfs = {r["cf"] for r in spark.read.format("hourglass_logical").option("cf", "cq")
           .load(path).select("cf").distinct().collect()}
    assert cfs == {"cq"}
    with pytest.raises(Exception, match="no column family matches 'nope'"):
        spark.read.format("hourglass_logical").option("cf", "nope").load(path).count()


def test_missing_path_is_a_clear_error(spark: Any, tmp_path: Any) -> None:
    with pytest.raises(Exception, match="neither a snapshot directory nor a RocksDB checkpoint"):
        spark.read.format("hourglass_sst").load(str(tmp_path)).count()


def test_sst_rows_equal_live_files(spark: Any, workload: Generated) -> None:
    rows = [r.asDict() for r in spark.read.format("hourglass_sst")
            .load(str(workload.snapshot.path)).collect()]
    files = {f["name"].lstrip("/"): f for f in direct.live_files(workload.snapshot.db_path)}
    assert {r["file"] for r in rows} == set(files)
    for r in rows:
        f = files[r["file"]]
        assert (r["level"], r["size"], r["num_entries"], r["num_deletions"]) == (
            f["level"], f["size"], f["num_entries"], f["num_deletions"])
        assert (bytes(r["start_key"]), bytes(r["end_key"])) == (f["start_key"], f["end_key"])
        if r["cf"].startswith("timer."):
            assert r["start_time"] == int.from_bytes(f["start_key"][:8], "big")
            assert r["end_time"] == int.from_bytes(f["end_key"][:8], "big")
        else:
            assert r["start_time"] is None
    # the column family of each file, checked against RocksDB's per-CF SST totals
    per_cf: Counter[str] = Counter()
    for r in rows:
        per_cf[r["cf"]] += r["size"]
    assert {cf: n for cf, n in direct.cf_sst_bytes(workload.snapshot.db_path).items() if n} \
        == dict(per_cf)


def test_parquet_export_round_trip(spark: Any, workload: Generated, tmp_path: Any) -> None:
    from spark_jobs.inputs import export_parquet, open_input

    source = open_input(workload.snapshot.path)
    dest = export_parquet(spark, source, tmp_path, partitions=3, window_ms=1000)
    exported = open_input(dest)
    assert exported.kind == "parquet"
    assert (exported.snapshot_id, exported.created_at, exported.watermarks) == (
        source.snapshot_id, source.created_at, source.watermarks)
    assert Counter(_rows(exported.logical(spark, 3))) == Counter(
        direct.logical_rows(workload.snapshot.db_path))
    assert exported.ssts(spark).count() == len(direct.live_files(workload.snapshot.db_path))
    # the due scan cannot run without RocksDB: the export carries the one measured at export
    def counts(scans: Any) -> dict[str, tuple[int, int]]:
        return {s: (v["scan"]["liveKeys"], v["scan"]["internalKeysSkipped"])
                for s, v in scans["byShard"].items()}

    assert counts(exported.due_scans(1000)) == counts(source.due_scans(1000))
    assert exported.due_scans(500) is None  # measured for another window: not made up


# --- partition planning (pure Python) ----------------------------------------------------------


def _file(start: int, end: int, entries: int, deletions: int = 0) -> dict[str, Any]:
    return {"start_key": start.to_bytes(8, "big") + b"t\x00x",
            "end_key": end.to_bytes(8, "big") + b"t\x00x",
            "num_entries": entries, "num_deletions": deletions}


def test_plan_cf_covers_the_key_space_contiguously() -> None:
    files = [_file(0, 1000, 50_000), _file(500, 3000, 10_000), _file(3000, 9000, 90_000)]
    ranges = plan_cf("timer.0", files, target_rows=20_000)
    assert ranges[0].start is None and ranges[-1].end is None
    for a, b in itertools.pairwise(ranges):
        assert a.end == b.start and a.end is not None
    assert len(ranges) >= 5  # big files were cut inside, not only at their starts
    assert sum(r.estimated_rows for r in ranges) == 150_000


def test_plan_partitions_packs_small_cfs_together() -> None:
    files = {"timer.0": [_file(0, 10, 100_000)], "meta": [_file(0, 1, 3)],
             "cq": [_file(0, 1, 10)]}
    groups = plan_partitions(files, ["cq", "meta", "timer.0"], partitions=4)
    assert len(groups) >= 4
    small = [g for g in groups if {r.cf for r in g.ranges} & {"cq", "meta"}]
    assert len(small) == 1  # cq and meta share one partition
    assert sum(len(g.ranges) for g in groups if any(r.cf == "timer.0" for r in g.ranges)) >= 4


def test_select_cfs() -> None:
    names = ["timer.0", "timer.1", "index", "meta"]
    assert select_cfs(names, None) == sorted(names)
    assert select_cfs(names, "timer.*, meta") == ["timer.0", "timer.1", "meta"]
    assert select_cfs(names, "!timer.*") == ["index", "meta"]
    assert select_cfs(names, "timer.*,!timer.1") == ["timer.0"]
    with pytest.raises(ValueError, match=r"timer\.9"):
        select_cfs(names, "timer.9")
