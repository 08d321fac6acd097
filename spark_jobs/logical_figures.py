"""Figures from the logical rows of one snapshot, computed with Spark.

- due load: messages and bytes due per second (next hour), minute (next day), hour (next
  week) and day (next year) ahead of the snapshot, the peak second / minute / hour, overdue;
- value sizes of waiting messages: percentiles, log2 histogram, what blob separation would
  move at each threshold;
- topic skew and shard balance; message states; rows and bytes per column family.

"Waiting messages" are the keys of the timer shards (``timer.*``); their value is the encoded
message, the bytes RocksDB carries through every compaction. Seconds are wall-clock seconds
(``deliverAt // 1000``), the precision users ask for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.keyspace import CfKind
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


def _profile(df: DataFrame, unit_s: int, start_s: int, length: int) -> dict[str, Any]:
    """Messages/bytes due in each of ``length`` units of ``unit_s`` seconds from ``start_s``."""
    rows = (df.withColumn("u", F.floor((F.col("sec") - start_s) / unit_s))
            .where((F.col("u") >= 0) & (F.col("u") < length))
            .groupBy("u").agg(F.sum("n").alias("n"), F.sum("b").alias("b")).collect())
    messages, sizes = [0] * length, [0] * length
    for r in rows:
        messages[int(r["u"])] = int(r["n"])
        sizes[int(r["u"])] = int(r["b"])
    return {"unitSeconds": unit_s, "startsAt": start_s * 1000, "messages": messages,
            "bytes": sizes}


def _peaks(df: DataFrame, unit_s: int, top: int) -> list[dict[str, Any]]:
    rows = (df.groupBy(F.floor(F.col("sec") / unit_s).alias("u"))
            .agg(F.sum("n").alias("n"), F.sum("b").alias("b"))
            .orderBy(F.desc("n"), F.asc("u")).limit(top).collect())
    return [{"at": int(r["u"]) * unit_s * 1000, "messages": int(r["n"]), "bytes": int(r["b"])}
            for r in rows]


def due_load(waiting: DataFrame, now_ms: int, horizons: Horizons) -> dict[str, Any]:
    overdue = (waiting.where(F.col("deliver_at") < now_ms)
               .agg(F.count("*").alias("n"), F.sum("value_size").alias("b"),
                    F.min("deliver_at").alias("oldest")).collect()[0])
    future = waiting.where(F.col("deliver_at") >= now_ms)
    per_sec = (future.groupBy(F.floor(F.col("deliver_at") / 1000).alias("sec"))
               .agg(F.count("*").alias("n"), F.sum("value_size").alias("b"))
               .persist(StorageLevel.MEMORY_AND_DISK))
    try:
        now_s = now_ms // 1000
        top_seconds = _peaks(per_sec, 1, 10)
        stats = future.agg(
            F.count("*").alias("n"), F.sum("value_size").alias("b"),
            F.percentile_approx(F.col("deliver_at") - now_ms, list(PERCENTILES),
                                PERCENTILE_ACCURACY).alias("p"),
            F.max(F.col("deliver_at") - now_ms).alias("max")).collect()[0]
        horizon_end_s = now_s + 86_400 * horizons.days
        beyond = (per_sec.where(F.col("sec") >= horizon_end_s)
                  .agg(F.sum("n").alias("n"), F.sum("b").alias("b")).collect()[0])
        out: dict[str, Any] = {
            "now": now_ms,
            "future": {"messages": int(stats["n"]), "bytes": int(stats["b"] or 0)},
            "overdue": {"messages": int(overdue["n"]), "bytes": int(overdue["b"] or 0),
                        "oldestAgeMs": (now_ms - int(overdue["oldest"]))
                        if overdue["oldest"] is not None else None},
            "delayPercentilesMs": _percentiles(stats["p"], stats["max"]),
            "perSecond": _profile(per_sec, 1, now_s, horizons.seconds),
            "perMinute": _profile(per_sec, 60, now_s // 60 * 60, horizons.minutes),
            "perHour": _profile(per_sec, 3600, now_s // 3600 * 3600, horizons.hours),
            "perDay": _profile(per_sec, 86_400, now_s // 86_400 * 86_400, horizons.days),
            "beyondPerDay": {"messages": int(beyond["n"] or 0), "bytes": int(beyond["b"] or 0)},
            "peakSecond": top_seconds[0] if top_seconds else None,
            "topSeconds": top_seconds,
            "peakMinute": next(iter(_peaks(per_sec, 60, 1)), None),
            "peakHour": next(iter(_peaks(per_sec, 3600, 1)), None),
        }
    finally:
        per_sec.unpersist()
    return out


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


def topics_and_shards(waiting: DataFrame, top: int = 20) -> dict[str, Any]:
    rows = (waiting.groupBy("topic")
            .agg(F.count("*").alias("n"), F.sum("value_size").alias("b")).collect())
    ranked = sorted(((str(r["topic"]), int(r["n"]), int(r["b"])) for r in rows),
                    key=lambda t: (-t[1], t[0]))
    total = sum(n for _, n, _ in ranked)
    shards = sorted((int(r["shard"]), int(r["n"]), int(r["b"])) for r in
                    waiting.groupBy("shard").agg(F.count("*").alias("n"),
                                                 F.sum("value_size").alias("b")).collect())
    shard_counts = [n for _, n, _ in shards]
    return {
        "topics": {
            "count": len(ranked),
            "top": [{"topic": t, "messages": n, "bytes": b, "share": n / total if total else 0.0}
                    for t, n, b in ranked[:top]],
            "topShare": ranked[0][1] / total if total else 0.0,
            "maxToMean": (ranked[0][1] / (total / len(ranked))) if total else 0.0,
            "gini": gini([n for _, n, _ in ranked]),
        },
        "shards": {
            "rows": [{"shard": s, "messages": n, "bytes": b} for s, n, b in shards],
            "maxToMean": (max(shard_counts) / (sum(shard_counts) / len(shard_counts)))
            if sum(shard_counts) else 0.0,
        },
    }


def column_families(rows: DataFrame) -> dict[str, Any]:
    by_cf = (rows.groupBy("cf").agg(F.count("*").alias("n"), F.sum("key_size").alias("k"),
                                    F.sum("value_size").alias("v")).collect())
    states = (rows.where(F.col("cf") == CfKind.INDEX.value).groupBy("state").count().collect())
    by_cf.sort(key=lambda r: str(r["cf"]))
    return {
        "byCf": {str(r["cf"]): {"rows": int(r["n"]), "keyBytes": int(r["k"]),
                                "valueBytes": int(r["v"])} for r in by_cf},
        "indexStates": {str(r["state"]): int(r["count"]) for r in states},
    }


def logical_figures(rows: DataFrame, now_ms: int, horizons: Horizons) -> dict[str, Any]:
    """Every logical figure of one snapshot; ``rows`` is the hourglass_logical DataFrame."""
    slim = rows.select("cf", "shard", "deliver_at", "topic", "key_size", "value_size", "state")
    slim = slim.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        waiting = slim.where(F.col("cf").startswith(CF_TIMER_PREFIX))
        return {
            "counts": column_families(slim),
            "dueLoad": due_load(waiting, now_ms, horizons),
            "valueSizes": value_sizes(waiting),
            **topics_and_shards(waiting),
        }
    finally:
        slim.unpersist()
