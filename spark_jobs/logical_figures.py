"""Figures from the logical rows of one snapshot, computed with Spark.

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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from spark_jobs.keyspace import CfKind
from spark_jobs.skew import shard_what_if
from storage.constants import CF_TIMER_PREFIX

BLOB_THRESHOLDS = (256, 1024, 4096, 65536)
PERCENTILES = (0.5, 0.9, 0.99, 0.999)
PERCENTILE_ACCURACY = 100_000


@dataclass(frozen=True, kw_only=True)
class Horizons:
    seconds: int = 3600  # per-second profile length
    minutes: int = 1440  # per-minute profile length
    hours: int = 168  # per-hour profile length
    days: int = 366  # per-day profile length


UNITS = {1: "perSecond", 60: "perMinute", 3600: "perHour", 86_400: "perDay"}
PEAK_UNITS = {1: "peakSecond", 60: "peakMinute", 3600: "peakHour"}
TOP_SLOTS = 10


def _slots(future: DataFrame, now_s: int, horizons: Horizons) -> tuple[dict[str, Any], dict]:
    """Profiles (per second / minute / hour / day ahead) and the busiest slots of each unit,
    in one Spark job: messages are counted per second, each second is credited to its slot
    of every unit, and one collect returns the slots inside a profile or in a unit's top 10."""
    lengths = {1: horizons.seconds, 60: horizons.minutes, 3600: horizons.hours,
               86_400: horizons.days}
    per_sec = (future.groupBy(F.floor(F.col("deliver_at") / 1000).alias("sec"))
               .agg(F.count("*").alias("n"), F.sum("value_size").alias("b")))
    unit = F.explode(F.array(*(F.lit(u) for u in UNITS))).alias("unit")
    per_slot = (per_sec.select("sec", "n", "b", unit)
                .groupBy("unit", F.floor(F.col("sec") / F.col("unit")).alias("slot"))
                .agg(F.sum("n").alias("n"), F.sum("b").alias("b")))
    rank = F.row_number().over(Window.partitionBy("unit").orderBy(F.desc("n"), F.asc("slot")))
    first = F.floor(F.lit(now_s) / F.col("unit"))
    length = F.create_map(*(x for u, n in lengths.items() for x in (F.lit(u), F.lit(n))))
    offset = F.col("slot") - first
    rows = (per_slot.withColumn("rank", rank).withColumn("offset", offset)
            .where((F.col("rank") <= TOP_SLOTS)
                   | ((F.col("offset") >= 0) & (F.col("offset") < length[F.col("unit")])))
            .collect())
    counts = {u: [0] * lengths[u] for u in UNITS}
    sizes = {u: [0] * lengths[u] for u in UNITS}
    tops: dict[int, list[dict[str, Any]]] = {u: [] for u in UNITS}
    for r in rows:
        u, off = int(r["unit"]), int(r["offset"])
        if 0 <= off < lengths[u]:
            counts[u][off] = int(r["n"])
            sizes[u][off] = int(r["b"])
        if int(r["rank"]) <= TOP_SLOTS:
            tops[u].append({"rank": int(r["rank"]), "at": int(r["slot"]) * u * 1000,
                            "messages": int(r["n"]), "bytes": int(r["b"])})
    for slots in tops.values():
        slots.sort(key=lambda t: t["rank"])
        for t in slots:
            del t["rank"]
    profiles = {name: {"unitSeconds": u, "startsAt": now_s // u * u * 1000,
                       "messages": counts[u], "bytes": sizes[u]} for u, name in UNITS.items()}
    return profiles, tops


def due_load(waiting: DataFrame, now_ms: int, horizons: Horizons) -> dict[str, Any]:
    d = F.col("deliver_at")
    past, ahead = d < now_ms, d >= now_ms
    beyond = d >= (now_ms // 86_400_000 + horizons.days) * 86_400_000
    stats = waiting.agg(
        F.sum(F.when(past, 1).otherwise(0)).alias("on"),
        F.sum(F.when(past, F.col("value_size")).otherwise(0)).alias("ob"),
        F.min(F.when(past, d)).alias("oldest"),
        F.sum(F.when(ahead, 1).otherwise(0)).alias("n"),
        F.sum(F.when(ahead, F.col("value_size")).otherwise(0)).alias("b"),
        F.percentile_approx(F.when(ahead, d - now_ms), list(PERCENTILES),
                            PERCENTILE_ACCURACY).alias("p"),
        F.max(F.when(ahead, d - now_ms)).alias("max"),
        F.sum(F.when(beyond, 1).otherwise(0)).alias("bn"),
        F.sum(F.when(beyond, F.col("value_size")).otherwise(0)).alias("bb"),
    ).collect()[0]
    profiles, tops = _slots(waiting.where(ahead), now_ms // 1000, horizons)
    return {
        "now": now_ms,
        "future": {"messages": int(stats["n"] or 0), "bytes": int(stats["b"] or 0)},
        "overdue": {"messages": int(stats["on"] or 0), "bytes": int(stats["ob"] or 0),
                    "oldestAgeMs": None if stats["oldest"] is None
                    else now_ms - int(stats["oldest"])},
        "delayPercentilesMs": _percentiles(stats["p"], stats["max"]),
        **profiles,
        "beyondPerDay": {"messages": int(stats["bn"] or 0), "bytes": int(stats["bb"] or 0)},
        "topSeconds": tops[1],
        **{name: (tops[u][0] if tops[u] else None) for u, name in PEAK_UNITS.items()},
    }


def _percentiles(values: list[Any] | None, maximum: Any) -> dict[str, int | None]:
    out: dict[str, int | None] = {f"p{str(q * 100).rstrip('0').rstrip('.')}": None
                                  for q in PERCENTILES}
    for key, value in zip(out, values or (), strict=False):
        out[key] = int(value)
    out["max"] = None if maximum is None else int(maximum)
    return out


def value_sizes(waiting: DataFrame) -> dict[str, Any]:
    aggs = [F.count("*").alias("n"), F.sum("value_size").alias("b"),
            F.max("value_size").alias("max"),
            F.percentile_approx("value_size", list(PERCENTILES), PERCENTILE_ACCURACY).alias("p")]
    for t in BLOB_THRESHOLDS:
        big = F.col("value_size") >= t
        aggs.append(F.sum(F.when(big, 1).otherwise(0)).alias(f"n{t}"))
        aggs.append(F.sum(F.when(big, F.col("value_size")).otherwise(0)).alias(f"b{t}"))
    row = waiting.agg(*aggs).collect()[0]
    count, total = int(row["n"]), int(row["b"] or 0)
    # bucket k holds sizes in (2^(k-1), 2^k]: 0..1 -> 0, 2 -> 1, 3..4 -> 2, ...
    bucket = F.when(F.col("value_size") <= 1, 0).otherwise(
        F.ceil(F.log2(F.col("value_size"))).cast("int"))
    hist = (waiting.groupBy(bucket.alias("k"))
            .agg(F.count("*").alias("n"), F.sum("value_size").alias("b")).orderBy("k").collect())
    return {
        "values": count,
        "bytes": total,
        "percentiles": _percentiles(row["p"], row["max"]),
        "histogram": [{"upTo": 1 << int(r["k"]), "values": int(r["n"]), "bytes": int(r["b"])}
                      for r in hist],
        "blobSeparation": [
            {"thresholdBytes": t, "valuesMoved": int(row[f"n{t}"] or 0),
             "bytesMoved": int(row[f"b{t}"] or 0),
             "shareOfValues": (int(row[f"n{t}"] or 0) / count) if count else 0.0,
             "shareOfBytes": (int(row[f"b{t}"] or 0) / total) if total else 0.0}
            for t in BLOB_THRESHOLDS],
    }


def gini(values: list[int]) -> float:
    """Gini coefficient of non-negative counts (0 = even, towards 1 = one holds all)."""
    xs = sorted(values)
    n, total = len(xs), sum(xs)
    if n == 0 or total == 0:
        return 0.0
    weighted = sum((i + 1) * x for i, x in enumerate(xs))
    return (2 * weighted) / (n * total) - (n + 1) / n


def topics(waiting: DataFrame, *, timer_shards: int, top: int = 20) -> dict[str, Any]:
    """Messages and bytes per topic (top ``top``), skew figures, and what each timer shard
    count would give with the engine's placement (spark_jobs/skew.py)."""
    rows = (waiting.groupBy("topic")
            .agg(F.count("*").alias("n"), F.sum("value_size").alias("b")).collect())
    ranked = sorted(((str(r["topic"]), int(r["n"]), int(r["b"])) for r in rows),
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


def shards(per_shard: list[Any], timer_shards: int) -> dict[str, Any]:
    """Waiting messages per timer shard (at or above its watermark), and the delivered keys
    below the watermark not yet deleted."""
    acc: dict[int, dict[str, int]] = {
        s: {"shard": s, "messages": 0, "bytes": 0, "belowWatermark": 0}
        for s in range(timer_shards)}
    for r in per_shard:
        row = acc.setdefault(int(r["shard"]), {"shard": int(r["shard"]), "messages": 0,
                                               "bytes": 0, "belowWatermark": 0})
        if r["pending"]:
            row["messages"] += int(r["n"])
            row["bytes"] += int(r["v"])
        else:
            row["belowWatermark"] += int(r["n"])
    rows = [acc[s] for s in sorted(acc)]
    total = sum(r["messages"] for r in rows)
    return {
        "rows": rows,
        "maxToMean": max(r["messages"] for r in rows) / (total / len(rows)) if total else 0.0,
    }


def column_families(per_shard: list[Any], others: DataFrame) -> dict[str, Any]:
    """Rows, key and value bytes per column family; index entries per status. ``others``:
    the other CFs' counts per partition (cf, state, rows, key_bytes, value_bytes)."""
    groups = (others.groupBy("cf", "state").agg(F.sum("rows").alias("n"),
                                                F.sum("key_bytes").alias("k"),
                                                F.sum("value_bytes").alias("v")).collect())
    rows = [(str(r["cf"]), r["state"], r["n"], r["k"], r["v"]) for r in groups]
    rows += [(f"{CF_TIMER_PREFIX}{r['shard']}", None, r["n"], r["k"], r["v"]) for r in per_shard]
    by_cf: dict[str, dict[str, int]] = {}
    states: dict[str, int] = {}
    for cf, state, n, k, v in sorted(rows, key=lambda r: (r[0], str(r[1]))):
        acc = by_cf.setdefault(cf, {"rows": 0, "keyBytes": 0, "valueBytes": 0})
        acc["rows"] += int(n)
        acc["keyBytes"] += int(k)
        acc["valueBytes"] += int(v)
        if cf == CfKind.INDEX.value and n:
            states[str(state)] = states.get(str(state), 0) + int(n)
    return {"byCf": by_cf, "indexStates": states}


def pending_flag(watermarks: Mapping[int, int]) -> Column:
    """True for a timer key at or above its shard's watermark (a shard without one: 0)."""
    if not watermarks:
        return F.lit(True)
    marks = F.create_map(*(x for s, w in sorted(watermarks.items())
                           for x in (F.lit(s), F.lit(w).cast("bigint"))))
    return F.col("deliver_at") >= F.coalesce(marks[F.col("shard")], F.lit(0).cast("bigint"))


def logical_figures(timers: DataFrame, others: DataFrame, now_ms: int, horizons: Horizons,
                    watermarks: Mapping[int, int], timer_shards: int) -> dict[str, Any]:
    """Every logical figure of one snapshot: ``timers``, the timer shards' slim rows (shard,
    deliver_at, topic, key_size, value_size; cached: every figure but the counts reads them),
    and ``others``, every other column family's counts (SnapshotInput.cf_counts). Only timer
    keys at or above their shard's watermark are waiting messages."""
    slim = (timers.select("shard", "deliver_at", "topic", "key_size", "value_size",
                          pending_flag(watermarks).alias("pending"))
            .persist(StorageLevel.MEMORY_AND_DISK))
    try:
        per_shard = (slim.groupBy("shard", "pending")
                     .agg(F.count("*").alias("n"), F.sum("key_size").alias("k"),
                          F.sum("value_size").alias("v")).collect())
        waiting = slim.where(F.col("pending"))
        by_shard = shards(per_shard, timer_shards)
        return {
            "counts": column_families(per_shard, others),
            "dueLoad": due_load(waiting, now_ms, horizons),
            "valueSizes": value_sizes(waiting),
            "topics": topics(waiting, timer_shards=len(by_shard["rows"])),
            "shards": by_shard,
        }
    finally:
        slim.unpersist()
