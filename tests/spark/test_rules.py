"""Each recommendation fires on crafted figures and stays silent otherwise (at its threshold
too: rules fire strictly beyond it)."""

from __future__ import annotations

import copy
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from spark_jobs.rules import Thresholds, evaluate

MIB = 1 << 20
T = Thresholds()


def _scan(skipped: int, ranges: int) -> dict[str, Any]:
    return {"ssts": 2, "byLevel": {"0": 1, "1": 1}, "liveKeys": 10,
            "internalKeysSkipped": skipped, "scanMicros": 40, "rangeTombstones": ranges}


def neutral() -> dict[str, Any]:
    """A healthy snapshot: every figure comfortably inside its threshold."""
    return {
        "logical": {
            "counts": {"byCf": {"timer.0": {"rows": 100_000, "keyBytes": 3 * MIB,
                                            "valueBytes": 97 * MIB}}},
            "dueLoad": {"peakSecond": {"messages": 100, "at": 0, "bytes": 0},
                        "overdue": {"messages": 0, "bytes": 0, "oldestAgeMs": None}},
            "valueSizes": {"blobSeparation": [
                {"thresholdBytes": t, "shareOfBytes": 0.1, "shareOfValues": 0.05,
                 "bytesMoved": 10 * MIB} for t in (256, 1024, 4096, 65536)]},
            "topics": {"count": 5, "messages": 100_000, "meanMessages": 20_000.0,
                       "maxToMean": 1.5, "topShare": 0.3,
                       "top": [{"topic": "a", "messages": 30_000, "share": 0.3}],
                       "shardWhatIf": [{"shards": 2, "busiestShardMessages": 50_000,
                                        "maxToMean": 1.0, "current": True}]},
            "shards": {"rows": [{"messages": 50_000}, {"messages": 50_000}], "maxToMean": 1.0},
        },
        "physical": {
            "readAmplification": {"windowMs": 1000, "max": 2, "byShard": {"0": {
                "watermark": 0, **_scan(10, 0), "fromStart": _scan(500, 0)}}},
            "tombstones": {"deadPrefixBytes": 0},
            "sst": {"bytes": 200 * MIB},
            "space": {"spaceAmplification": 1.2, "sstBytes": 200 * MIB,
                      "liveBytesEstimate": 160 * MIB, "reclaimableBytes": 10 * MIB},
            "rocksdb": {"pendingCompactionBytesMax": 0, "writeStallsTotal": 0,
                        "counters": {"stallMicros": 0, "bytesWritten": 100 * MIB,
                                     "flushWriteBytes": 100 * MIB,
                                     "compactWriteBytes": 200 * MIB}},
        },
    }


def fired(report: dict[str, Any], series: dict[str, Any] | None = None,
          thresholds: Thresholds = T) -> set[str]:
    return {f.rule for f in evaluate(report, series or {}, thresholds) if f.fired}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(r: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = r
        for p in parents:
            node = node[p]
        node[leaf] = value
    return apply


def test_a_healthy_snapshot_fires_nothing() -> None:
    findings = evaluate(neutral(), {}, T)
    assert len(findings) == 14 and not [f for f in findings if f.fired]
    for f in findings:  # every figure a sentence with units, every threshold a number
        assert isinstance(f.threshold, int | float)
        assert f.measured.endswith(".") and "{" not in f.measured
        assert f.basis and "{" not in f.basis


CASES = {
    "due-scan-tombstones": ("physical.readAmplification.byShard.0.internalKeysSkipped",
                            T.due_scan_skipped_keys),
    "due-scan-range-tombstones": ("physical.readAmplification.byShard.0.rangeTombstones",
                                  T.due_scan_range_tombstones),
    "due-scan-read-amplification": ("physical.readAmplification.byShard.0.ssts",
                                    T.due_scan_ssts),
    "space-amplification": ("physical.space.spaceAmplification", T.space_amplification),
    "compaction-debt": ("physical.rocksdb.pendingCompactionBytesMax",
                        T.pending_compaction_bytes),
    "write-stalls": ("physical.rocksdb.writeStallsTotal", T.write_stalls),
    "overdue": ("logical.dueLoad.overdue.oldestAgeMs", T.overdue_age_ms),
    "shard-imbalance": ("logical.shards.maxToMean", T.shard_imbalance),
}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_fires_beyond_its_threshold_only(rule: str) -> None:
    path, threshold = CASES[rule]
    at = neutral()
    _set(path, threshold)(at)
    assert rule not in fired(at)
    beyond = neutral()
    _set(path, threshold * 1.5 if threshold else 1)(beyond)
    assert fired(beyond) == {rule}


def test_due_scan_tombstones_say_what_the_watermark_saves() -> None:
    r = neutral()
    _set("physical.readAmplification.byShard.0.internalKeysSkipped", 20_000)(r)
    finding = next(f for f in evaluate(r, {}, T) if f.rule == "due-scan-tombstones")
    assert finding.fired and finding.value == 20_000 and finding.unit == "internal keys"
    assert "skipped 20,000 internal keys" in finding.measured and "0.0 ms" in finding.measured
    # the window's own tombstones: the advice is compaction of the window, not prefix clean-up
    assert "deletion_trigger" in finding.advice and "compact_range" in finding.advice


def test_unmeasured_due_scan_is_said_and_never_fires() -> None:
    r = neutral()
    for key in ("internalKeysSkipped", "rangeTombstones"):
        del r["physical"]["readAmplification"]["byShard"]["0"][key]
    findings = {f.rule: f for f in evaluate(r, {}, T)}
    for rule in ("due-scan-tombstones", "due-scan-range-tombstones"):
        assert not findings[rule].fired and findings[rule].measured.startswith("Not measured")


def test_burst_against_the_delivery_rate() -> None:
    r = neutral()
    r["logical"]["dueLoad"]["peakSecond"]["messages"] = T.delivery_rate
    assert "burst" not in fired(r)
    r["logical"]["dueLoad"]["peakSecond"]["messages"] = 3 * T.delivery_rate
    assert fired(r) == {"burst"}
    finding = next(f for f in evaluate(r, {}, T) if f.rule == "burst")
    assert "3.0 s late" in finding.what_if and "at least 3 s" in finding.advice


def test_dead_prefix_share_and_size_floor() -> None:
    r = neutral()
    r["physical"]["tombstones"]["deadPrefixBytes"] = 100 * MIB  # half of 200 MiB
    assert fired(r) == {"dead-prefix"}
    small = neutral()
    small["physical"]["sst"]["bytes"] = 2 * MIB
    small["physical"]["tombstones"]["deadPrefixBytes"] = 1 * MIB
    assert "dead-prefix" not in fired(small)  # below min_sst_bytes: noise, not debt


LARGE_VALUES = [
    {"thresholdBytes": 256, "shareOfBytes": 0.97, "shareOfValues": 0.3, "bytesMoved": 97 * MIB},
    {"thresholdBytes": 1024, "shareOfBytes": 0.9, "shareOfValues": 0.2, "bytesMoved": 90 * MIB},
    {"thresholdBytes": 4096, "shareOfBytes": 0.8, "shareOfValues": 0.1, "bytesMoved": 80 * MIB},
    {"thresholdBytes": 65536, "shareOfBytes": 0.4, "shareOfValues": 0.01,
     "bytesMoved": 40 * MIB}]


def test_blob_separation_needs_compaction_rewriting_large_values() -> None:
    r = neutral()
    r["logical"]["valueSizes"]["blobSeparation"] = LARGE_VALUES
    counters = r["physical"]["rocksdb"]["counters"]
    counters["compactWriteBytes"] = 100 * MIB  # rewrites exactly what was ingested: silent
    assert fired(r) == set()
    counters["compactWriteBytes"] = 400 * MIB  # 4 rewrites per byte ingested
    assert fired(r) == {"blob-separation"}
    finding = next(f for f in evaluate(r, {}, T) if f.rule == "blob-separation")
    assert finding.value == 4.0 and "min_blob_size=4096" in finding.advice
    # saved: compaction's 400 MiB x the large values' 80 MiB of 100 MiB key + value bytes
    assert "about 320.0 MiB" in finding.what_if
    assert "garbage collection" in finding.advice and "one more file read" in finding.advice
    # the latest interval's counters win over those since open
    series = {"intervals": [{"deltas": {"bytesWritten": 10 * MIB, "compactWriteBytes": 5 * MIB,
                                       "flushWriteBytes": 10 * MIB}}]}
    assert fired(r, series) == set()


def test_write_amplification_prefers_the_latest_interval() -> None:
    r = neutral()  # 3x since open
    series = {"intervals": [{"deltas": {"bytesWritten": 1, "flushWriteBytes": 30,
                                       "compactWriteBytes": 0}},
                            {"deltas": {"bytesWritten": 10, "flushWriteBytes": 10,
                                        "compactWriteBytes": 40}}]}
    assert "write-amplification" not in fired(r, series)
    series["intervals"].append({"deltas": {"bytesWritten": 10, "flushWriteBytes": 10,
                                           "compactWriteBytes": 190}})
    assert fired(r, series) == {"write-amplification"}
    finding = next(f for f in evaluate(r, series, T) if f.rule == "write-amplification")
    assert finding.value == 20.0 and "blob files would not help" in finding.what_if


def test_tombstone_growth_needs_a_rising_series() -> None:
    rising = {"trends": {"tombstones": {"ratio": 3.0, "risingEveryInterval": True,
                                        "values": [10, 20, 30]}}}
    assert fired(neutral(), rising) == {"tombstone-growth"}
    wobbly = {"trends": {"tombstones": {"ratio": 3.0, "risingEveryInterval": False}}}
    assert fired(neutral(), wobbly) == set()
    slow = {"trends": {"tombstones": {"ratio": 1.5, "risingEveryInterval": True}}}
    assert fired(neutral(), slow) == set()


def test_a_hot_topic_is_named() -> None:
    r = neutral()
    tp = r["logical"]["topics"]
    tp["top"] = [{"topic": "orders", "messages": 60_000, "share": 0.6},
                 {"topic": "b", "messages": 10_000, "share": 0.1}]
    tp["count"], tp["meanMessages"], tp["maxToMean"] = 6, 100_000 / 6, 3.6
    assert fired(r) == {"topic-skew"}
    finding = next(f for f in evaluate(r, {}, T) if f.rule == "topic-skew")
    assert "'orders' (60%, 3.6x)" in finding.advice and "'b'" not in finding.advice
    assert "3.6x the mean of 6 topics" in finding.measured


def test_shard_advice_recommends_only_a_count_that_helps() -> None:
    from spark_jobs.skew import CANDIDATE_SHARDS, shard_what_if

    # six equal topics: crc32 % 2 puts five of them in one shard
    counts = dict.fromkeys(["orders", "payments", "emails", "audit", "push", "ledger"], 10_000)

    def busiest(n: int) -> int:  # the engine's placement, computed here independently
        per = Counter(zlib.crc32(t.encode()) % n for t in counts)
        return max(per.values()) * 10_000

    assert busiest(2) == 50_000
    helps = [n for n in CANDIDATE_SHARDS
             if busiest(n) < 50_000 and busiest(n) / (60_000 / n) <= T.shard_imbalance]
    assert helps  # the case is meaningful: some count helps, and not every count does
    r = neutral()
    what_if = shard_what_if(counts, 2)
    r["logical"]["topics"]["shardWhatIf"] = what_if
    assert {w["shards"]: w["busiestShardMessages"] for w in what_if} == {
        n: busiest(n) for n in CANDIDATE_SHARDS}
    r["logical"]["shards"]["maxToMean"] = 50_000 / 30_000
    finding = next(f for f in evaluate(r, {}, T) if f.rule == "shard-imbalance")
    assert finding.fired and f"Set timer_shards = {min(helps)}:" in finding.advice
    assert f"{min(helps)}: {busiest(min(helps)) / (60_000 / min(helps)):.1f}x" in finding.what_if


def test_shard_advice_says_when_no_count_helps() -> None:
    from spark_jobs.skew import shard_what_if

    counts = {"orders": 60_000, "payments": 20_000, "emails": 20_000}
    r = neutral()
    r["logical"]["topics"]["shardWhatIf"] = shard_what_if(counts, 2)
    r["logical"]["topics"]["top"] = [{"topic": "orders", "messages": 60_000, "share": 0.6}]
    r["logical"]["shards"]["maxToMean"] = 1.6
    finding = next(f for f in evaluate(r, {}, T) if f.rule == "shard-imbalance")
    assert finding.fired and "No timer shard count up to 32" in finding.advice
    assert "'orders' alone holds 60%" in finding.advice and "Set timer_shards" not in finding.advice


def test_skew_rules_are_silent_on_tiny_workloads() -> None:
    r = neutral()
    r["logical"]["shards"]["rows"] = [{"messages": 10}, {"messages": 1}]
    r["logical"]["shards"]["maxToMean"] = 1.8
    r["logical"]["topics"].update(messages=11, meanMessages=5.5, maxToMean=1.8)
    r["logical"]["topics"]["top"][0]["messages"] = 10
    assert fired(r) == set()


def test_threshold_overrides() -> None:
    t = T.with_overrides({"delivery_rate": "10", "space_amplification": "1.1"})
    assert (t.delivery_rate, t.space_amplification) == (10, 1.1)
    assert fired(neutral(), thresholds=t) == {"burst", "space-amplification"}
    with pytest.raises(ValueError, match="unknown threshold 'nope'"):
        T.with_overrides({"nope": "1"})
    with pytest.raises(ValueError, match="needs a number"):
        T.with_overrides({"delivery_rate": "fast"})


def test_findings_do_not_mutate_the_report() -> None:
    r = neutral()
    before = copy.deepcopy(r)
    evaluate(r, {}, T)
    assert r == before
