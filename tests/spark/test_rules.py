"""Each recommendation fires on crafted figures and stays silent otherwise (at its threshold
too: rules fire strictly beyond it)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from spark_jobs.rules import Thresholds, evaluate

MIB = 1 << 20
T = Thresholds()


def neutral() -> dict[str, Any]:
    """A healthy snapshot: every figure comfortably inside its threshold."""
    return {
        "logical": {
            "dueLoad": {"peakSecond": {"messages": 100, "at": 0, "bytes": 0},
                        "overdue": {"messages": 0, "bytes": 0, "oldestAgeMs": None}},
            "valueSizes": {"blobSeparation": [
                {"thresholdBytes": t, "shareOfBytes": 0.1, "shareOfValues": 0.05}
                for t in (256, 1024, 4096, 65536)]},
            "topics": {"count": 5, "topShare": 0.3, "top": [{"topic": "a"}]},
            "shards": {"rows": [{"messages": 50_000}, {"messages": 50_000}], "maxToMean": 1.0},
        },
        "physical": {
            "readAmplification": {"max": 2, "tombstonesMax": 10},
            "tombstones": {"deadPrefixBytes": 0},
            "sst": {"bytes": 200 * MIB},
            "space": {"spaceAmplification": 1.2, "sstBytes": 200 * MIB,
                      "reclaimableBytes": 10 * MIB},
            "rocksdb": {"writeAmplificationSinceOpen": 3.0, "pendingCompactionBytesMax": 0,
                        "writeStallsTotal": 0, "counters": {"stallMicros": 0}},
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
    assert len(findings) == 13 and not [f for f in findings if f.fired]
    assert all(f.threshold is not None for f in findings)


CASES = {
    "due-scan-tombstones": ("physical.readAmplification.tombstonesMax", T.due_scan_tombstones),
    "due-scan-read-amplification": ("physical.readAmplification.max", T.due_scan_ssts),
    "space-amplification": ("physical.space.spaceAmplification", T.space_amplification),
    "compaction-debt": ("physical.rocksdb.pendingCompactionBytesMax",
                        T.pending_compaction_bytes),
    "write-stalls": ("physical.rocksdb.writeStallsTotal", T.write_stalls),
    "write-amplification": ("physical.rocksdb.writeAmplificationSinceOpen",
                            T.write_amplification),
    "overdue": ("logical.dueLoad.overdue.oldestAgeMs", T.overdue_age_ms),
    "topic-skew": ("logical.topics.topShare", T.topic_share),
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


def test_burst_against_the_delivery_rate() -> None:
    r = neutral()
    r["logical"]["dueLoad"]["peakSecond"]["messages"] = T.delivery_rate
    assert "burst" not in fired(r)
    r["logical"]["dueLoad"]["peakSecond"]["messages"] = 3 * T.delivery_rate
    assert fired(r) == {"burst"}
    finding = next(f for f in evaluate(r, {}, T) if f.rule == "burst")
    assert "3.0 s" in finding.advice  # the lateness it implies


def test_dead_prefix_share_and_size_floor() -> None:
    r = neutral()
    r["physical"]["tombstones"]["deadPrefixBytes"] = 100 * MIB  # half of 200 MiB
    assert fired(r) == {"dead-prefix"}
    small = neutral()
    small["physical"]["sst"]["bytes"] = 2 * MIB
    small["physical"]["tombstones"]["deadPrefixBytes"] = 1 * MIB
    assert "dead-prefix" not in fired(small)  # below min_sst_bytes: noise, not debt


def test_blob_separation_picks_the_largest_fitting_threshold() -> None:
    r = neutral()
    r["logical"]["valueSizes"]["blobSeparation"] = [
        {"thresholdBytes": 256, "shareOfBytes": 0.97, "shareOfValues": 0.3},
        {"thresholdBytes": 1024, "shareOfBytes": 0.9, "shareOfValues": 0.2},
        {"thresholdBytes": 4096, "shareOfBytes": 0.8, "shareOfValues": 0.1},
        {"thresholdBytes": 65536, "shareOfBytes": 0.4, "shareOfValues": 0.01}]
    assert fired(r) == {"blob-separation"}
    finding = next(f for f in evaluate(r, {}, T) if f.rule == "blob-separation")
    assert finding.value["thresholdBytes"] == 4096
    assert "min_blob_size=4096" in finding.advice


def test_write_amplification_prefers_the_latest_interval() -> None:
    r = neutral()
    series = {"intervals": [{"writeAmplification": 30.0}, {"writeAmplification": 5.0}]}
    assert "write-amplification" not in fired(r, series)
    series["intervals"].append({"writeAmplification": 20.0})
    assert fired(r, series) == {"write-amplification"}


def test_tombstone_growth_needs_a_rising_series() -> None:
    rising = {"trends": {"tombstones": {"ratio": 3.0, "risingEveryInterval": True}}}
    assert fired(neutral(), rising) == {"tombstone-growth"}
    wobbly = {"trends": {"tombstones": {"ratio": 3.0, "risingEveryInterval": False}}}
    assert fired(neutral(), wobbly) == set()
    slow = {"trends": {"tombstones": {"ratio": 1.5, "risingEveryInterval": True}}}
    assert fired(neutral(), slow) == set()


def test_skew_rules_are_silent_on_tiny_workloads() -> None:
    r = neutral()
    r["logical"]["shards"]["rows"] = [{"messages": 10}, {"messages": 1}]
    r["logical"]["shards"]["maxToMean"] = 1.8
    r["logical"]["topics"]["topShare"] = 0.95
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
