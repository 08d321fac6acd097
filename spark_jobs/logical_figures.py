"""Figures from the logical rows of one snapshot.

- due load: messages and bytes due per second (next hour), minute (next day), hour (next
  week) and day (next year) ahead of the snapshot, the peak second / minute / hour, overdue;
- value sizes of waiting messages: percentiles, log2 histogram, what blob separation would
  move at each threshold;
- topic skew and shard balance; message states; rows and bytes per column family.

"Waiting messages" are the keys of each timer shard (``timer.N``) at or above that shard's
persisted scan watermark: the scanner has handed on everything below it, so a key below is
delivered but not yet deleted (the engine deletes delivered keys in periodic clean-ups below
the watermark) and is counted apart (``shards.rows[].belowWatermark``). Their value is the
encoded message, the bytes RocksDB carries through every compaction. Seconds are wall-clock
seconds (``deliverAt // 1000``), the precision users ask for.

Spark reads the snapshot in parallel key ranges and each task folds its rows into partial
aggregates (spark_jobs/timer_aggregates.py; the other column families into counts); one
Spark job sums those, and the figures below are derived from the sums on the driver (numpy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.keyspace import CfKind
from spark_jobs.skew import shard_what_if
from storage.constants import CF_TIMER_PREFIX

BLOB_THRESHOLDS = (256, 1024, 4096, 65536)
PERCENTILES = (0.5, 0.9, 0.99, 0.999)


@dataclass(frozen=True, kw_only=True)
class Horizons:
    seconds: int = 3600  # per-second profile length
    minutes: int = 1440  # per-minute profile length
    hours: int = 168  # per-hour profile length
    days: int = 366  # per-day profile length


UNITS = {1: "perSecond", 60: "perMinute", 3600: "perHour", 86_400: "perDay"}
PEAK_UNITS = {1: "peakSecond", 60: "peakMinute", 3600: "peakHour"}
TOP_SLOTS = 10


@dataclass(frozen=True)
class Aggregates:
    """The summed partial aggregates of one snapshot's timer shards, by kind."""

    rows: dict[str, list[dict[str, Any]]]

    @classmethod
    def collect(cls, partials: DataFrame) -> Aggregates:
        """Sum the tasks' partial rows on the driver: handed over as Arrow (no Row objects;
        a few hundred thousand rows at most), grouped with Arrow."""
        table = partials.toArrow()
        merged = table.group_by(["kind", "shard", "topic", "key"], use_threads=False).aggregate(
            [("n", "sum"), ("bytes", "sum"), ("low", "sum"), ("low", "min")])
        rows: dict[str, list[dict[str, Any]]] = {}
        for r in merged.to_pylist():
            kind = str(r["kind"])
            low = r["low_min"] if kind == "overdue" else r["low_sum"]
            rows.setdefault(kind, []).append({
                "shard": r["shard"], "topic": r["topic"], "key": r["key"],
                "n": int(r["n_sum"] or 0), "bytes": int(r["bytes_sum"] or 0),
                "low": None if low is None else int(low)})
        return cls(rows)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return self.rows.get(kind, [])

    def arrays(self, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(key, n, bytes) of ``kind`` sorted by key."""
        rows = sorted(self.of(kind), key=lambda r: r["key"])
        return (np.array([r["key"] for r in rows], dtype=np.int64),
                np.array([r["n"] for r in rows], dtype=np.int64),
                np.array([r["bytes"] for r in rows], dtype=np.int64))


def _slots(secs: np.ndarray, n: np.ndarray, b: np.ndarray, now_s: int,
           horizons: Horizons) -> tuple[dict[str, Any], dict[int, list[dict[str, Any]]]]:
    """Profiles (per second / minute / hour / day ahead) and the busiest slots of each unit."""
    lengths = {1: horizons.seconds, 60: horizons.minutes, 3600: horizons.hours,
               86_400: horizons.days}
    profiles: dict[str, Any] = {}
    tops: dict[int, list[dict[str, Any]]] = {}
    for unit, name in UNITS.items():
        slots, inverse = np.unique(secs // unit, return_inverse=True)
        count = np.bincount(inverse, n, minlength=slots.size).astype(np.int64)
        size = np.bincount(inverse, b, minlength=slots.size).astype(np.int64)
        offset = slots - now_s // unit
        inside = (offset >= 0) & (offset < lengths[unit])
        messages, sizes = [0] * lengths[unit], [0] * lengths[unit]
        for off, c, s in zip(offset[inside].tolist(), count[inside].tolist(),
                             size[inside].tolist(), strict=True):
            messages[off], sizes[off] = c, s
        profiles[name] = {"unitSeconds": unit, "startsAt": now_s // unit * unit * 1000,
                          "messages": messages, "bytes": sizes}
        order = np.lexsort((slots, -count))[:TOP_SLOTS]  # most messages, then earliest
        tops[unit] = [{"at": int(slots[i]) * unit * 1000, "messages": int(count[i]),
                       "bytes": int(size[i])} for i in order]
    return profiles, tops


def weighted_percentiles(values: np.ndarray, weights: np.ndarray,
                         qs: Sequence[float]) -> list[int | None]:
    """The smallest value whose cumulative weight reaches q of the total, for each q."""
    if values.size == 0:
        return [None] * len(qs)
    cumulative = np.cumsum(weights)
    total = cumulative[-1]
    return [int(values[min(int(np.searchsorted(cumulative, q * total)), values.size - 1)])
            for q in qs]


def due_load(agg: Aggregates, now_ms: int, horizons: Horizons) -> dict[str, Any]:
    secs, n, b = agg.arrays("second")
    delays, weights, _ = agg.arrays("delay")
    overdue = agg.of("overdue")
    beyond = secs >= (now_ms // 86_400_000 + horizons.days) * 86_400
    profiles, tops = _slots(secs, n, b, now_ms // 1000, horizons)
    over_n = sum(r["n"] for r in overdue)
    oldest = min((r["low"] for r in overdue if r["low"] is not None), default=None)
    return {
        "now": now_ms,
        "future": {"messages": int(n.sum()), "bytes": int(b.sum())},
        "overdue": {"messages": over_n, "bytes": sum(r["bytes"] for r in overdue),
                    "oldestAgeMs": None if oldest is None or not over_n else now_ms - oldest},
        "delayPercentilesMs": _percentiles(weighted_percentiles(delays, weights, PERCENTILES),
                                           int(delays[-1]) if delays.size else None),
        **profiles,
        "beyondPerDay": {"messages": int(n[beyond].sum()), "bytes": int(b[beyond].sum())},
        "topSeconds": tops[1],
        **{name: (tops[u][0] if tops[u] else None) for u, name in PEAK_UNITS.items()},
    }


def _percentiles(values: Sequence[int | None], maximum: int | None) -> dict[str, int | None]:
    out: dict[str, int | None] = {f"p{str(q * 100).rstrip('0').rstrip('.')}": v
                                  for q, v in zip(PERCENTILES, values, strict=True)}
    out["max"] = maximum
    return out


def value_sizes(agg: Aggregates) -> dict[str, Any]:
    sizes, counts, total_bytes = agg.arrays("size")
    count, total = int(counts.sum()), int(total_bytes.sum())
    # bucket k holds sizes in (2^(k-1), 2^k]: 0..1 -> 0, 2 -> 1, 3..4 -> 2, ...
    buckets = np.where(sizes <= 1, 0, np.ceil(np.log2(np.maximum(sizes, 1))).astype(np.int64))
    hist = []
    for k in np.unique(buckets).tolist():
        inside = buckets == k
        hist.append({"upTo": 1 << k, "values": int(counts[inside].sum()),
                     "bytes": int(total_bytes[inside].sum())})
    blob = []
    for t in BLOB_THRESHOLDS:
        big = sizes >= t
        moved_n, moved_b = int(counts[big].sum()), int(total_bytes[big].sum())
        blob.append({"thresholdBytes": t, "valuesMoved": moved_n, "bytesMoved": moved_b,
                     "shareOfValues": moved_n / count if count else 0.0,
                     "shareOfBytes": moved_b / total if total else 0.0})
    return {
        "values": count,
        "bytes": total,
        "percentiles": _percentiles(weighted_percentiles(sizes, counts, PERCENTILES),
                                    int(sizes[-1]) if sizes.size else None),
        "histogram": hist,
        "blobSeparation": blob,
    }


def gini(values: list[int]) -> float:
    """Gini coefficient of non-negative counts (0 = even, towards 1 = one holds all)."""
    xs = sorted(values)
    n, total = len(xs), sum(xs)
    if n == 0 or total == 0:
        return 0.0
    weighted = sum((i + 1) * x for i, x in enumerate(xs))
    return (2 * weighted) / (n * total) - (n + 1) / n


def topics(agg: Aggregates, *, timer_shards: int, top: int = 20) -> dict[str, Any]:
    """Messages and bytes per topic (top ``top``), skew figures, and what each timer shard
    count would give with the engine's placement (spark_jobs/skew.py)."""
    ranked = sorted(((str(r["topic"]), r["n"], r["bytes"]) for r in agg.of("topic")),
                    key=lambda t: (-t[1], t[0]))
    total = sum(n for _, n, _ in ranked)
    return {
        "count": len(ranked),
        "messages": total,
        "meanMessages": total / len(ranked) if ranked else 0.0,
        "shardWhatIf": shard_what_if({t: n for t, n, _ in ranked}, timer_shards),
        "top": [{"topic": t, "messages": n, "bytes": b, "share": n / total if total else 0.0}
                for t, n, b in ranked[:top]],
        "topShare": ranked[0][1] / total if total else 0.0,
        "maxToMean": (ranked[0][1] / (total / len(ranked))) if total else 0.0,
        "gini": gini([n for _, n, _ in ranked]),
    }


def shards(agg: Aggregates, timer_shards: int) -> dict[str, Any]:
    """Waiting messages per timer shard (at or above its watermark), and the delivered keys
    below the watermark not yet deleted."""
    acc: dict[int, dict[str, int]] = {
        s: {"shard": s, "messages": 0, "bytes": 0, "belowWatermark": 0}
        for s in range(timer_shards)}
    for r in agg.of("shard"):
        row = acc.setdefault(int(r["shard"]), {"shard": int(r["shard"]), "messages": 0,
                                               "bytes": 0, "belowWatermark": 0})
        if r["key"]:
            row["messages"] += r["n"]
            row["bytes"] += r["bytes"]
        else:
            row["belowWatermark"] += r["n"]
    rows = [acc[s] for s in sorted(acc)]
    total = sum(r["messages"] for r in rows)
    return {
        "rows": rows,
        "maxToMean": max(r["messages"] for r in rows) / (total / len(rows)) if total else 0.0,
    }


def column_families(agg: Aggregates, others: DataFrame) -> dict[str, Any]:
    """Rows, key and value bytes per column family; index entries per status. ``others``:
    the other CFs' counts per partition (cf, state, rows, key_bytes, value_bytes)."""
    groups = (others.groupBy("cf", "state").agg(F.sum("rows").alias("n"),
                                                F.sum("key_bytes").alias("k"),
                                                F.sum("value_bytes").alias("v")).collect())
    rows = [(str(r["cf"]), r["state"], r["n"], r["k"], r["v"]) for r in groups]
    rows += [(f"{CF_TIMER_PREFIX}{r['shard']}", None, r["n"], r["low"], r["bytes"])
             for r in agg.of("shard")]
    by_cf: dict[str, dict[str, int]] = {}
    states: dict[str, int] = {}
    for cf, state, n, k, v in sorted(rows, key=lambda r: (r[0], str(r[1]))):
        acc = by_cf.setdefault(cf, {"rows": 0, "keyBytes": 0, "valueBytes": 0})
        acc["rows"] += int(n)
        acc["keyBytes"] += int(k or 0)
        acc["valueBytes"] += int(v or 0)
        if cf == CfKind.INDEX.value and n:
            states[str(state)] = states.get(str(state), 0) + int(n)
    return {"byCf": by_cf, "indexStates": states}


def logical_figures(timer_partials: DataFrame, others: DataFrame, now_ms: int,
                    horizons: Horizons, timer_shards: int) -> dict[str, Any]:
    """Every logical figure of one snapshot from ``timer_partials`` (the timer shards' partial
    aggregates: SnapshotInput.timer_aggregates) and ``others`` (every other column family's
    counts: SnapshotInput.cf_counts)."""
    agg = Aggregates.collect(timer_partials)
    by_shard = shards(agg, timer_shards)
    return {
        "counts": column_families(agg, others),
        "dueLoad": due_load(agg, now_ms, horizons),
        "valueSizes": value_sizes(agg),
        "topics": topics(agg, timer_shards=len(by_shard["rows"])),
        "shards": by_shard,
    }
