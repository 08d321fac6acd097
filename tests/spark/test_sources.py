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


def test_timer_rows_and_cf_counts_equal_a_direct_read(spark: Any, workload: Generated) -> None:
    from spark_jobs.inputs import open_input

    source = open_input(workload.snapshot.path)
    expected = direct.logical_rows(workload.snapshot.db_path)
    slim = [(r[1], r[3], r[4], r[7], r[8]) for r in expected if r[0].startswith("timer.")]
    rows = [tuple(r) for r in source.timers(spark, 5).collect()]
    assert Counter(r[:5] for r in rows) == Counter(slim)  # column-wise: the codecs' answer
    assert all(r[5] == (r[1] >= workload.work.watermarks[r[0]]) for r in rows)  # frontier
    counts: Counter[tuple[str, str]] = Counter()
    for r in source.cf_counts(spark, 5, "!timer.*").collect():
        counts[(r["cf"], "rows")] += r["rows"]
        counts[(r["cf"], "bytes")] += r["key_bytes"] + r["value_bytes"]
        if r["cf"] == "index" and r["rows"]:
            counts[("index", r["state"])] += r["rows"]
    truth: Counter[tuple[str, str]] = Counter()
    for r in expected:
        if not r[0].startswith("timer."):
            truth[(r[0], "rows")] += 1
            truth[(r[0], "bytes")] += r[7] + r[8]
            if r[0] == "index":
                truth[("index", r[9])] += 1
    assert +counts == +truth


def test_index_states_fall_back_to_the_codec_on_odd_values() -> None:
    from spark_jobs.sources import index_states
    from storage.records import IndexEntry, MessageStatus, encode_index

    def entry(status: MessageStatus) -> bytes:
        return encode_index(IndexEntry(status=status, deliver_at=1, updated_at=2))

    values = [entry(MessageStatus.SCHEDULED)] * 3 + [entry(MessageStatus.ROLLED_BACK),
                                                     b"\x01", b"\x93\x01\xa3BAD"]
    assert index_states(values) == Counter({"SCHEDULED": 3, "ROLLED_BACK": 1, None: 2})


def test_quantile_summary_bounds_the_rank_error() -> None:
    import numpy as np
    import pyarrow as pa

    from spark_jobs.logical_figures import weighted_percentiles
    from spark_jobs.timer_aggregates import aggregate

    rng = np.random.default_rng(3)
    at = 1_000_000 + np.concatenate([rng.integers(0, 10**7, 9_000), np.full(1_000, 5_000)])
    batch = pa.RecordBatch.from_pydict({
        "shard": pa.array(np.zeros(at.size, np.int32)), "deliver_at": pa.array(at),
        "topic": pa.array(["t"] * at.size), "key_size": pa.array(np.ones(at.size, np.int32)),
        "value_size": pa.array(np.ones(at.size, np.int32))})
    rows = pa.Table.from_batches(list(aggregate([batch], 1_000_000, {0: 0}, points=200)))
    delay = rows.filter(pa.compute.equal(rows["kind"], "delay"))
    values, weights = delay["key"].to_numpy(), delay["n"].to_numpy()
    assert weights.sum() == at.size and values.max() == at.max() - 1_000_000  # max exact
    ordered = np.sort(at - 1_000_000)
    for q, got in zip((0.05, 0.5, 0.9, 0.99), weighted_percentiles(values, weights,
                                                                  (0.05, 0.5, 0.9, 0.99)),
                      strict=True):
        below = np.searchsorted(ordered, got, side="left") / ordered.size  # ties: a rank
        upto = np.searchsorted(ordered, got, side="right") / ordered.size  # range
        assert below - 1 / 200 <= q <= upto + 1 / 200, (q, below, upto)


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
    # a filter that leaves most partitions empty: each task's fold must still answer
    from spark_jobs.timer_aggregates import AGG_DDL, aggregate

    timers = exported.timers(spark, 3)
    first = timers.agg({"deliver_at": "min"}).first()[0]
    lonely = timers.filter(timers.deliver_at == first).repartition(8)
    marks = dict(exported.watermarks)
    rows = lonely.mapInArrow(lambda b: aggregate(b, exported.created_at, marks), AGG_DDL)
    shard_rows = rows.filter(rows.kind == "shard").collect()
    assert sum(r.n for r in shard_rows) == lonely.count() > 0


def test_aggregate_of_an_empty_partition_is_empty() -> None:
    from spark_jobs.timer_aggregates import aggregate

    assert list(aggregate(iter(()), 1_000, {0: 0})) == []


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


def test_pending_follows_the_scan_frontier_inside_a_millisecond() -> None:
    import pyarrow as pa

    from spark_jobs.sources import decode_timers
    from spark_jobs.timer_aggregates import aggregate
    from storage.keys import encode_timer_key

    ms = 1_700_000_000_000
    keys = [encode_timer_key(ms - 1, "t", "z"), encode_timer_key(ms, "t", "a"),
            encode_timer_key(ms, "t", "b"), encode_timer_key(ms, "t", "c"),
            encode_timer_key(ms + 1, "t", "a")]
    # the engine stopped a scan after delivering (ms, t, b): its frontier is that key + NUL
    frontier = encode_timer_key(ms, "t", "b") + b"\x00"
    batch = decode_timers(0, keys, [b"v"] * len(keys), frontier)
    assert batch.column("pending").to_pylist() == [False, False, False, True, True]
    assert decode_timers(0, keys, [b"v"] * 5).column("pending").null_count == 5
    rows = pa.Table.from_batches(list(aggregate([batch], ms + 10, {0: ms})))
    shard = {r["key"]: r["n"] for r in rows.to_pylist() if r["kind"] == "shard"}
    assert shard == {1: 2, 0: 3}  # by the frontier, not by the watermark's millisecond
