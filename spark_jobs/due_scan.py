"""What one due scan of each timer shard meets, measured by running it over the snapshot.

The engine's scanner seeks to its shard's persisted watermark and reads forward to
``now``; this module does exactly that on the checkpoint, opened read-only with RocksDB
statistics on, and reads RocksDB's own counters around each scan:

- ``rocksdb.number.iter.skip``: internal keys the iterator stepped over without returning
  them: at least one per point tombstone, plus older versions it had to step over (between
  one and two per deleted key here). Keys hidden by a *range* tombstone are not in it
  (RocksDB seeks past them);
- range tombstones: RocksDB keeps no per-scan counter readable here, so the figure is the
  ``# range deletions`` of the table properties of each level the scan's key range overlaps
  (per level, not per file: an upper bound for the levels it touches, exact for L0 files,
  which every scan opens when they overlap);
- live keys returned and the wall time of the seek and scan.

The same scan from key 0 (what a scanner without a watermark would pay) is the what-if of
the watermark. Plain Python on the driver: one scan per shard, bounded by the window.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import rocksdict

from spark_jobs.keyspace import timer_shard
from storage.constants import timer_cf
from storage.snapshot_manifest import NUM_LEVELS, parse_statistics, parse_table_properties
from storage.snapshots import open_read_only

SKIP_TICKER = "rocksdb.number.iter.skip"
NEXT_TICKER = "rocksdb.number.db.next"
SEEK_TICKER = "rocksdb.number.db.seek"
RANGE_DELETIONS = "# range deletions"


def _tickers(text: str) -> dict[str, int]:
    tickers: dict[str, int] = parse_statistics(text)["tickers"]
    return tickers


def _scan(snap: Any, cf: rocksdict.Rdict, start: bytes, end: int) -> dict[str, Any]:
    """Seek to the key ``start`` and read every key before ``end`` (epoch ms), counting."""
    before = _tickers(snap.statistics())
    ro = rocksdict.ReadOptions()
    # NB rocksdict's set_iterate_lower_bound sets the upper bound: never use it.
    ro.set_iterate_upper_bound(end.to_bytes(8, "big"))
    t0 = time.perf_counter()
    live = 0
    for _ in cf.keys(from_key=start, read_opt=ro):
        live += 1
    took = time.perf_counter() - t0
    after = _tickers(snap.statistics())

    def delta(name: str) -> int:
        return after.get(name, 0) - before.get(name, 0)

    return {"from": int.from_bytes(start[:8].ljust(8, b"\x00"), "big"), "to": end,
            "liveKeys": live, "internalKeysSkipped": delta(SKIP_TICKER),
            "seeks": delta(SEEK_TICKER), "nexts": delta(NEXT_TICKER),
            "micros": round(took * 1e6)}


def _range_deletions_by_level(cf: rocksdict.Rdict) -> dict[str, int]:
    out: dict[str, int] = {}
    for level in range(NUM_LEVELS):
        text = cf.property_value(f"rocksdb.aggregated-table-properties-at-level{level}") or ""
        count = int(parse_table_properties(text).get(RANGE_DELETIONS, 0))
        if count:
            out[str(level)] = count
    return out


def measure_due_scans(path: str | Path, watermarks: Mapping[int, int], now_ms: int,
                      window_ms: int, frontiers: Mapping[int, bytes] | None = None
                      ) -> dict[str, Any]:
    """Per timer shard: the scan of [frontier, now + window) (the engine seeks to its
    persisted frontier key; without one, to the watermark's millisecond) and of
    [0, now + window), with RocksDB's counters, and the range tombstones per level of the
    shard's column family."""
    end = now_ms + window_ms
    by_shard: dict[str, Any] = {}
    with open_read_only(path, statistics=True) as snap:
        shards = sorted(s for s in map(timer_shard, snap.cf_names) if s is not None)
        for shard in shards:
            cf = snap.column_family(timer_cf(shard))
            watermark = int(watermarks.get(shard, 0))
            start = (frontiers or {}).get(shard) or min(watermark, end).to_bytes(8, "big")
            by_shard[str(shard)] = {
                "watermark": watermark,
                "scan": _scan(snap, cf, start, end),
                "fromStart": _scan(snap, cf, bytes(8), end),
                "rangeTombstonesByLevel": _range_deletions_by_level(cf),
            }
            del cf
    return {"windowMs": window_ms, "end": end, "byShard": by_shard}
