"""Every figure of the analysis against an independent computation on the known workload."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from storage.records import MessageStatus
from tests.spark import direct
from tests.spark.conftest import SPEC, Generated, Series

pytestmark = pytest.mark.spark


def _waiting(g: Generated) -> list[Any]:
    return [m for m in g.work.messages if m.state is MessageStatus.SCHEDULED]


def _latest(report: dict[str, Any]) -> dict[str, Any]:
    return report["snapshots"][-1]


def test_counts_and_states(analysis: dict[str, Any], workload: Generated) -> None:
    counts = _latest(analysis)["logical"]["counts"]
    states = Counter(m.state.value for m in workload.work.messages)
    assert counts["indexStates"] == dict(states)
    assert states["DELIVERED"] == 3_000 and states["CANCELLED"] == 1_000
    by_shard = Counter(f"timer.{m.shard}" for m in _waiting(workload))
    for cf, n in by_shard.items():
        assert counts["byCf"][cf]["rows"] == n
        assert counts["byCf"][cf]["keyBytes"] == sum(
            m.key_size for m in _waiting(workload) if f"timer.{m.shard}" == cf)
    assert counts["byCf"]["cq"]["rows"] == 3_000
    assert counts["byCf"]["index"]["rows"] == SPEC.messages


def test_due_load_profiles_and_peaks(analysis: dict[str, Any], workload: Generated) -> None:
    due = _latest(analysis)["logical"]["dueLoad"]
    now = SPEC.now_ms
    future = [m for m in _waiting(workload) if m.deliver_at >= now]
    overdue = [m for m in _waiting(workload) if m.deliver_at < now]
    assert len(overdue) == SPEC.overdue
    assert due["overdue"] == {"messages": len(overdue),
                              "bytes": sum(m.value_size for m in overdue),
                              "oldestAgeMs": now - min(m.deliver_at for m in overdue)}
    assert due["future"] == {"messages": len(future), "bytes": sum(m.value_size for m in future)}
    for key, unit_ms in (("perSecond", 1000), ("perMinute", 60_000), ("perHour", 3_600_000),
                         ("perDay", 86_400_000)):
        profile = due[key]
        n = len(profile["messages"])
        expected_n, expected_b = [0] * n, [0] * n
        for m in future:
            slot = m.deliver_at // unit_ms - now // unit_ms
            if slot < n:
                expected_n[slot] += 1
                expected_b[slot] += m.value_size
        assert profile["messages"] == expected_n, key
        assert profile["bytes"] == expected_b, key
        assert profile["startsAt"] == now // unit_ms * unit_ms
    per_second = Counter(m.deliver_at // 1000 for m in future)
    peak_sec, peak_n = min(per_second.items(), key=lambda kv: (-kv[1], kv[0]))
    assert due["peakSecond"]["messages"] == peak_n
    assert due["peakSecond"]["at"] == peak_sec * 1000
    assert due["peakSecond"]["bytes"] == sum(m.value_size for m in future
                                             if m.deliver_at // 1000 == peak_sec)
    # the workload's burst: a tenth of the future messages within the second at +30 min
    assert peak_sec == (now + SPEC.burst_at_ms) // 1000
    assert [t["messages"] for t in due["topSeconds"]] == sorted(per_second.values(),
                                                                reverse=True)[:10]
    per_minute = Counter(m.deliver_at // 60_000 for m in future)
    assert due["peakMinute"]["messages"] == max(per_minute.values())
    per_hour = Counter(m.deliver_at // 3_600_000 for m in future)
    assert due["peakHour"]["messages"] == max(per_hour.values())


def test_delay_percentiles(analysis: dict[str, Any], workload: Generated) -> None:
    pct = _latest(analysis)["logical"]["dueLoad"]["delayPercentilesMs"]
    delays = sorted(m.deliver_at - SPEC.now_ms for m in _waiting(workload)
                    if m.deliver_at >= SPEC.now_ms)
    assert pct["max"] == delays[-1]
    for key, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        rank = sum(1 for d in delays if d <= pct[key]) / len(delays)
        assert abs(rank - q) <= 0.002, (key, rank)


def test_value_sizes_and_blob_shares(analysis: dict[str, Any], workload: Generated) -> None:
    vs = _latest(analysis)["logical"]["valueSizes"]
    sizes = [m.value_size for m in _waiting(workload)]
    assert (vs["values"], vs["bytes"]) == (len(sizes), sum(sizes))
    hist: Counter[int] = Counter()
    hist_b: Counter[int] = Counter()
    for s in sizes:
        k = (s - 1).bit_length() if s > 1 else 0  # smallest k with s <= 2**k
        hist[k] += 1
        hist_b[k] += s
    assert vs["histogram"] == [{"upTo": 1 << k, "values": hist[k], "bytes": hist_b[k]}
                               for k in sorted(hist)]
    for b in vs["blobSeparation"]:
        moved = [s for s in sizes if s >= b["thresholdBytes"]]
        assert b["valuesMoved"] == len(moved) and b["bytesMoved"] == sum(moved)
        assert b["shareOfBytes"] == pytest.approx(sum(moved) / sum(sizes))
    ordered = sorted(sizes)
    rank = sum(1 for s in ordered if s <= vs["percentiles"]["p99"]) / len(ordered)
    assert rank >= 0.99 and vs["percentiles"]["max"] == ordered[-1]


def test_topics_and_shards(analysis: dict[str, Any], workload: Generated) -> None:
    lg = _latest(analysis)["logical"]
    per_topic = Counter(m.topic for m in _waiting(workload))
    assert lg["topics"]["count"] == len(per_topic)
    assert {t["topic"]: t["messages"] for t in lg["topics"]["top"]} == dict(per_topic)
    assert lg["topics"]["topShare"] == pytest.approx(max(per_topic.values()) / sum(
        per_topic.values()))
    xs = list(per_topic.values())  # Gini by mean absolute difference, another formula
    mad = sum(abs(a - b) for a in xs for b in xs) / (len(xs) ** 2)
    assert lg["topics"]["gini"] == pytest.approx(mad / (2 * sum(xs) / len(xs)))
    per_shard = Counter(m.shard for m in _waiting(workload))
    assert {r["shard"]: r["messages"] for r in lg["shards"]["rows"]} == dict(per_shard)
    assert lg["shards"]["maxToMean"] == pytest.approx(
        max(per_shard.values()) / (sum(per_shard.values()) / len(per_shard)))


def test_tombstones_and_positions(analysis: dict[str, Any], workload: Generated) -> None:
    ph = _latest(analysis)["physical"]
    files = direct.live_files(workload.snapshot.db_path)
    assert ph["tombstones"]["total"] == sum(f["num_deletions"] for f in files)
    assert ph["sst"]["bytes"] == sum(f["size"] for f in files)
    assert ph["tombstones"]["perSstMax"] == max(f["num_deletions"] for f in files)
    # classify the timer SSTs against the watermark independently
    watermark = SPEC.now_ms - 10_000
    for cf, entry in ph["tombstones"]["byCf"].items():
        if not cf.startswith("timer."):
            continue
        assert entry["reference"] == watermark
    expected: Counter[str] = Counter()
    for f in ph["files"]:
        if not f["cf"].startswith("timer."):
            continue
        first = int(f["start_key"][:16], 16)
        last = int(f["end_key"][:16], 16)
        where = "below" if last < watermark else "above" if first >= watermark else "straddling"
        expected[where] += f["num_deletions"]
    got: Counter[str] = Counter()
    for cf, entry in ph["tombstones"]["byCf"].items():
        if cf.startswith("timer."):
            for where in ("below", "straddling", "above"):
                got[where] += entry[where]["deletions"]
    assert +got == +expected
    assert got.total() == 4_000 or ph["rocksdb"]["counters"]["compactWriteBytes"] > 0


def test_space_and_read_amplification(analysis: dict[str, Any], workload: Generated) -> None:
    report = _latest(analysis)
    ph = report["physical"]
    manifest = json.loads((workload.snapshot.path / "manifest.json").read_text())
    truth = _waiting(workload)
    cf = "timer.0"
    props = manifest["rocksdb"]["columnFamilies"][cf]["tableProperties"]
    ratio = props["data block size"] / (props["raw key size"] + props["raw value size"])
    mine = [m for m in truth if m.shard == 0]
    live = (sum(m.key_size + m.value_size for m in mine) + 8 * len(mine)) * ratio
    sst = sum(f["size"] for f in ph["files"] if f["cf"] == cf)
    assert ph["space"]["byCf"][cf]["spaceAmplification"] == pytest.approx(sst / live)
    # read amplification: SSTs of each shard overlapping [watermark, now + 1 s)
    lo, hi = SPEC.now_ms - 10_000, SPEC.now_ms + 1000
    for shard, entry in ph["readAmplification"]["byShard"].items():
        hit = [f for f in ph["files"] if f["cf"] == f"timer.{shard}"
               and int(f["start_key"][:16], 16) < hi and int(f["end_key"][:16], 16) >= lo]
        assert entry["ssts"] == len(hit)
        assert entry["fromStart"]["ssts"] >= entry["ssts"]
        # measured by running the scan: the shard's overdue keys, and no tombstone (the
        # deliveries lie below the watermark, the cancels after now + 1 s)
        mine = [m for m in truth if m.shard == int(shard)]
        assert entry["liveKeys"] == sum(1 for m in mine if lo <= m.deliver_at < hi)
        assert entry["internalKeysSkipped"] == 0
        # from key 0: the same live keys (everything below the watermark was deleted)
        assert entry["fromStart"]["liveKeys"] == entry["liveKeys"]


def test_rocksdb_counters_from_the_manifest(analysis: dict[str, Any],
                                            workload: Generated) -> None:
    manifest = json.loads((workload.snapshot.path / "manifest.json").read_text())
    tickers = manifest["rocksdb"]["statistics"]["tickers"]
    rocks = _latest(analysis)["physical"]["rocksdb"]
    assert rocks["statisticsEnabled"]
    assert rocks["writeAmplificationSinceOpen"] == pytest.approx(
        (tickers["rocksdb.flush.write.bytes"] + tickers["rocksdb.compact.write.bytes"])
        / tickers["rocksdb.bytes.written"])
    assert rocks["counters"]["bytesWritten"] == tickers["rocksdb.bytes.written"]


def test_series_write_amplification_and_trends(spark: Any, series: Series) -> None:
    from spark_jobs.analyze import expand_inputs, run_analysis

    sources = expand_inputs([str(series.root / "snapshots")])  # a root expands to all three
    assert [s.snapshot_id for s in sources] == [s.snapshot_id for s in series.snapshots]
    report, _ = run_analysis(spark, sources, partitions=2)
    manifests = [json.loads((s.path / "manifest.json").read_text()) for s in series.snapshots]
    ticks = [m["rocksdb"]["statistics"]["tickers"] for m in manifests]
    intervals = report["series"]["intervals"]
    assert len(intervals) == 2
    for i, interval in enumerate(intervals):
        a, b = ticks[i], ticks[i + 1]
        written = sum(b[t] - a[t] for t in ("rocksdb.flush.write.bytes",
                                             "rocksdb.compact.write.bytes"))
        ingested = b["rocksdb.bytes.written"] - a["rocksdb.bytes.written"]
        assert ingested > 0 and interval["counterReset"] is False
        assert interval["writeAmplification"] == pytest.approx(written / ingested)
        assert interval["elapsedMs"] == 60_000
    tombstones = report["series"]["trends"]["tombstones"]
    assert tombstones["values"] == [s["physical"]["tombstones"]["total"]
                                    for s in report["snapshots"]]
    pending = report["series"]["trends"]["pendingMessages"]
    expected = [sum(1 for w in series.works[: i + 1] for m in w.messages
                    if m.state is MessageStatus.SCHEDULED) for i in range(3)]
    assert pending["values"] == expected
    assert pending["slopePerHour"] == pytest.approx((expected[2] - expected[0]) / 2 * 60)


def test_counter_reset_is_detected() -> None:
    from spark_jobs.series import interval

    def rep(ident: str, at: int, written: int, flushed: int) -> dict[str, Any]:
        return {"snapshot": {"snapshotId": ident, "createdAt": at},
                "physical": {"rocksdb": {"counters": {"bytesWritten": written,
                                                      "flushWriteBytes": flushed,
                                                      "compactWriteBytes": 0}}}}

    out = interval(rep("a", 0, 1000, 900), rep("b", 60_000, 400, 200))
    assert out["counterReset"] is True
    assert out["writeAmplification"] == pytest.approx(200 / 400)  # since the restart
    out = interval(rep("a", 0, 1000, 900), rep("b", 60_000, 3000, 2900))
    assert out["counterReset"] is False
    assert out["writeAmplification"] == pytest.approx(2000 / 2000)
