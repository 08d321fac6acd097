"""Figures across a series of snapshots: write amplification per interval, and trends.

Write amplification between two snapshots = (flush + compaction bytes written) / bytes the
application wrote, all from the RocksDB statistics tickers of the two manifests. The tickers
count from the opening of the DB: when a later value is smaller than an earlier one the server
was restarted in between, and the interval uses the later snapshot's counts alone (the part
since the restart), flagged ``counterReset``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

HOUR_MS = 3_600_000


def interval(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Figures between two per-snapshot reports (``a`` older than ``b``)."""
    ca = a["physical"]["rocksdb"]["counters"]
    cb = b["physical"]["rocksdb"]["counters"]
    out: dict[str, Any] = {"from": a["snapshot"]["snapshotId"], "to": b["snapshot"]["snapshotId"],
                           "elapsedMs": b["snapshot"]["createdAt"] - a["snapshot"]["createdAt"]}
    if not ca or not cb:
        out.update(writeAmplification=None, reason="no RocksDB statistics in a manifest")
        return out
    reset = any(cb.get(k, 0) < ca.get(k, 0) for k in cb)
    delta = dict(cb) if reset else {k: cb.get(k, 0) - ca.get(k, 0) for k in cb}
    written = delta.get("flushWriteBytes", 0) + delta.get("compactWriteBytes", 0)
    ingested = delta.get("bytesWritten", 0)
    seconds = out["elapsedMs"] / 1000
    out.update(
        counterReset=reset,
        deltas=delta,
        writeAmplification=written / ingested if ingested else None,
        ingestBytesPerSecond=ingested / seconds if seconds > 0 and not reset else None,
        compactionWriteBytesPerSecond=(delta.get("compactWriteBytes", 0) / seconds
                                       if seconds > 0 and not reset else None),
    )
    return out


#: metric name -> how to read it from a per-snapshot report
TREND_METRICS: dict[str, Callable[[Mapping[str, Any]], float | None]] = {
    "pendingMessages": lambda r: r["logical"]["dueLoad"]["future"]["messages"]
    + r["logical"]["dueLoad"]["overdue"]["messages"],
    "overdueMessages": lambda r: r["logical"]["dueLoad"]["overdue"]["messages"],
    "peakSecondMessages": lambda r: (r["logical"]["dueLoad"]["peakSecond"] or {})
    .get("messages", 0),
    "sstBytes": lambda r: r["physical"]["sst"]["bytes"],
    "sstFiles": lambda r: r["physical"]["sst"]["files"],
    "tombstones": lambda r: r["physical"]["tombstones"]["total"],
    "deadPrefixBytes": lambda r: r["physical"]["tombstones"]["deadPrefixBytes"],
    "spaceAmplification": lambda r: r["physical"]["space"]["spaceAmplification"],
    "dueScanSsts": lambda r: r["physical"]["readAmplification"]["max"],
    "pendingCompactionBytes": lambda r: r["physical"]["rocksdb"]["pendingCompactionBytesMax"],
}


def slope_per_hour(times_ms: Sequence[int], values: Sequence[float]) -> float | None:
    """Least-squares slope of values over time, per hour (None under two distinct times)."""
    n = len(times_ms)
    if n < 2:
        return None
    mt = sum(times_ms) / n
    mv = sum(values) / n
    var = sum((t - mt) ** 2 for t in times_ms)
    if var == 0:
        return None
    cov = sum((t - mt) * (v - mv) for t, v in zip(times_ms, values, strict=True))
    return cov / var * HOUR_MS


def trends(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    times = [int(r["snapshot"]["createdAt"]) for r in reports]
    for name, read in TREND_METRICS.items():
        raw = [read(r) for r in reports]
        points = [(t, float(v)) for t, v in zip(times, raw, strict=True) if v is not None]
        values = [v for _, v in points]
        steps = [b - a for a, b in itertools.pairwise(values)]
        out[name] = {
            "values": raw,
            "first": values[0] if values else None,
            "last": values[-1] if values else None,
            "change": (values[-1] - values[0]) if values else None,
            "ratio": (values[-1] / values[0]) if values and values[0] else None,
            "slopePerHour": slope_per_hour([t for t, _ in points], values),
            "risingEveryInterval": bool(steps) and all(s > 0 for s in steps),
        }
    return out


def series_figures(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    ordered = sorted(reports, key=lambda r: r["snapshot"]["createdAt"])
    return {
        "snapshots": [r["snapshot"]["snapshotId"] for r in ordered],
        "intervals": [interval(a, b) for a, b in itertools.pairwise(ordered)],
        "trends": trends(ordered) if len(ordered) >= 2 else {},
    }
