"""Figures from the SST files of one snapshot and its manifest (plain Python: a few rows each).

Definitions (docs/analysis.md has the reasoning):
- tombstone position: an SST of a time-ordered column family lies *below* its reference when
  its last key is before it, *above* when its first key is at or after it, else it
  *straddles*. The reference is the shard's scan watermark for ``timer.N``, the snapshot time
  for ``half`` and ``expiry``. SSTs wholly below are the dead prefix: every key in them was
  delivered or cancelled, so their bytes are reclaimable by ``delete_range`` + compaction.
- live bytes estimate of a CF = (key + value + 8 bytes of sequence/type per live row) x the
  CF's compression ratio (data block bytes / raw key+value bytes of everything in its SSTs);
  space amplification = SST bytes / live bytes estimate; reclaimable = SST bytes - estimate.
- read amplification of the due scan = SST files of a timer shard whose key range overlaps
  [watermark, snapshot time + window): the files a scanner's seek and scan must consult; the
  tombstones it meets are measured by running that scan (spark_jobs/due_scan.py), never
  estimated from the files' deletion counts (a fresh L0 file spans the whole key range).
- write amplification since the DB was opened = (flush + compaction bytes written) / bytes
  written by the application (RocksDB statistics tickers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spark_jobs.keyspace import is_time_ordered, timer_shard

TICKERS = {
    "bytesWritten": "rocksdb.bytes.written",
    "keysWritten": "rocksdb.number.keys.written",
    "flushWriteBytes": "rocksdb.flush.write.bytes",
    "compactReadBytes": "rocksdb.compact.read.bytes",
    "compactWriteBytes": "rocksdb.compact.write.bytes",
    "walBytes": "rocksdb.wal.bytes",
    "stallMicros": "rocksdb.stall.micros",
    "compactionCpuMicros": "rocksdb.compaction.total.time.cpu_micros",
}
INTERNAL_KEY_SUFFIX = 8


def _acc() -> dict[str, int]:
    return {"files": 0, "bytes": 0, "entries": 0, "deletions": 0}


def _add(acc: dict[str, int], f: Mapping[str, Any]) -> None:
    acc["files"] += 1
    acc["bytes"] += int(f["size"])
    acc["entries"] += int(f["num_entries"])
    acc["deletions"] += int(f["num_deletions"])


def sst_summary(ssts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    total = _acc()
    by_level: dict[int, dict[str, int]] = {}
    by_cf: dict[str, dict[str, int]] = {}
    for f in ssts:
        _add(total, f)
        _add(by_level.setdefault(int(f["level"]), _acc()), f)
        _add(by_cf.setdefault(str(f["cf"]), _acc()), f)
    return {**total,
            "byLevel": [{"level": lv, **acc} for lv, acc in sorted(by_level.items())],
            "byCf": dict(sorted(by_cf.items()))}


def _reference(cf: str, watermarks: Mapping[int, int], now_ms: int) -> tuple[int, str]:
    shard = timer_shard(cf)
    if shard is not None:
        return watermarks.get(shard, 0), "watermark"
    return now_ms, "snapshotTime"


def _position(f: Mapping[str, Any], reference: int) -> str:
    if f["end_time"] is not None and int(f["end_time"]) < reference:
        return "below"
    if f["start_time"] is not None and int(f["start_time"]) >= reference:
        return "above"
    return "straddling"


def compression_ratio(manifest: Mapping[str, Any], cf: str) -> float | None:
    props = (manifest.get("rocksdb", {}).get("columnFamilies", {}).get(cf, {})
             .get("tableProperties", {}))
    raw = float(props.get("raw key size", 0)) + float(props.get("raw value size", 0))
    data = float(props.get("data block size", 0))
    return data / raw if raw > 0 and data > 0 else None


def space(ssts: Sequence[Mapping[str, Any]], live_by_cf: Mapping[str, Mapping[str, int]],
          manifest: Mapping[str, Any]) -> dict[str, Any]:
    sst_bytes: dict[str, int] = {}
    for f in ssts:
        sst_bytes[str(f["cf"])] = sst_bytes.get(str(f["cf"]), 0) + int(f["size"])
    by_cf: dict[str, Any] = {}
    total_sst = total_live = 0.0
    for cf in sorted(set(sst_bytes) | set(live_by_cf)):
        live = live_by_cf.get(cf, {})
        rows = int(live.get("rows", 0))
        raw = int(live.get("keyBytes", 0)) + int(live.get("valueBytes", 0)) \
            + INTERNAL_KEY_SUFFIX * rows
        ratio = compression_ratio(manifest, cf)
        estimate = raw * (ratio if ratio is not None else 1.0)
        on_disk = sst_bytes.get(cf, 0)
        total_sst += on_disk
        total_live += estimate
        by_cf[cf] = {"sstBytes": on_disk, "liveRows": rows, "liveRawBytes": raw,
                     "compressionRatio": ratio, "liveBytesEstimate": int(estimate),
                     "reclaimableBytes": max(0, int(on_disk - estimate)),
                     "spaceAmplification": on_disk / estimate if estimate > 0 else None}
    return {"byCf": by_cf, "sstBytes": int(total_sst), "liveBytesEstimate": int(total_live),
            "reclaimableBytes": sum(v["reclaimableBytes"] for v in by_cf.values()),
            "spaceAmplification": total_sst / total_live if total_live > 0 else None}


def tombstones(ssts: Sequence[Mapping[str, Any]], watermarks: Mapping[int, int], now_ms: int,
               top: int = 20) -> dict[str, Any]:
    by_cf: dict[str, Any] = {}
    rows = []
    for f in ssts:
        cf = str(f["cf"])
        position = None
        if is_time_ordered(cf):
            reference, kind = _reference(cf, watermarks, now_ms)
            position = _position(f, reference)
            entry = by_cf.setdefault(cf, {"reference": reference, "referenceKind": kind,
                                          "below": _acc(), "straddling": _acc(),
                                          "above": _acc()})
            _add(entry[position], f)
        entries = int(f["num_entries"])
        rows.append({"file": f["file"], "cf": cf, "level": int(f["level"]),
                     "size": int(f["size"]), "entries": entries,
                     "deletions": int(f["num_deletions"]), "position": position,
                     "deletionShare": int(f["num_deletions"]) / entries if entries else 0.0})
    deletions = [r["deletions"] for r in rows]
    rows.sort(key=lambda r: (-r["deletions"], r["file"]))
    return {
        "total": sum(deletions),
        "filesWithDeletions": sum(1 for d in deletions if d),
        "perSstMean": sum(deletions) / len(deletions) if deletions else 0.0,
        "perSstMax": max(deletions, default=0),
        "byCf": dict(sorted(by_cf.items())),
        "deadPrefixBytes": sum(v["below"]["bytes"] for v in by_cf.values()),
        "deadPrefixTombstones": sum(v["below"]["deletions"] for v in by_cf.values()),
        "topFiles": rows[:top],
    }


def read_amplification(ssts: Sequence[Mapping[str, Any]], watermarks: Mapping[int, int],
                       now_ms: int, window_ms: int,
                       due_scans: Mapping[str, Any] | None) -> dict[str, Any]:
    """Per timer shard, what one due scan of [watermark, now + window) meets: the SST files
    (and levels) its key range overlaps, from the SST rows, and, measured by running the scan
    (spark_jobs/due_scan.py), the live keys it returns, the internal keys it skips (point
    tombstones and the versions they hide), the range tombstones of the levels it touches and
    its time; ``fromStart``: the same from key 0, what a scanner without a watermark meets."""
    shards: dict[int, list[Mapping[str, Any]]] = {}
    for f in ssts:
        shard = timer_shard(str(f["cf"]))
        if shard is not None:
            shards.setdefault(shard, []).append(f)
    for shard in watermarks:
        shards.setdefault(shard, [])
    end = now_ms + window_ms
    measured = (due_scans or {}).get("byShard", {})

    def overlap(files: list[Mapping[str, Any]], start: int) -> dict[str, Any]:
        hit = [f for f in files if f["start_time"] is not None and int(f["start_time"]) < end
               and int(f["end_time"]) >= start]
        levels: dict[str, int] = {}
        for f in hit:
            levels[str(f["level"])] = levels.get(str(f["level"]), 0) + 1
        return {"ssts": len(hit), "byLevel": dict(sorted(levels.items()))}

    def scan(files: list[Mapping[str, Any]], start: int, run: Mapping[str, Any] | None,
             range_by_level: Mapping[str, int]) -> dict[str, Any]:
        out = overlap(files, start)
        if run is not None:
            out.update(liveKeys=run["liveKeys"], internalKeysSkipped=run["internalKeysSkipped"],
                       scanMicros=run["micros"],
                       rangeTombstones=sum(range_by_level.get(lv, 0) for lv in out["byLevel"]))
        return out

    by_shard = {}
    for s, files in sorted(shards.items()):
        m = measured.get(str(s))
        ranges = m["rangeTombstonesByLevel"] if m else {}
        by_shard[str(s)] = {"watermark": watermarks.get(s, 0),
                            **scan(files, watermarks.get(s, 0), m and m["scan"], ranges),
                            "fromStart": scan(files, 0, m and m["fromStart"], ranges)}
    counts = [v["ssts"] for v in by_shard.values()]

    def most(name: str) -> int | None:
        values = [v[name] for v in by_shard.values() if name in v]
        return max(values) if values else None

    return {"windowMs": window_ms, "measured": bool(measured), "byShard": by_shard,
            "max": max(counts, default=0),
            "mean": sum(counts) / len(counts) if counts else 0.0,
            "internalKeysSkippedMax": most("internalKeysSkipped"),
            "rangeTombstonesMax": most("rangeTombstones"),
            "scanMicrosMax": most("scanMicros")}


def rocksdb_counters(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Statistics and compaction state recorded in the manifest (empty without one)."""
    rocks = manifest.get("rocksdb", {})
    tickers = rocks.get("statistics", {}).get("tickers", {})
    out: dict[str, Any] = {"statisticsEnabled": bool(rocks.get("statisticsEnabled") and tickers)}
    out["counters"] = {name: int(tickers[t]) for name, t in TICKERS.items() if t in tickers}
    c = out["counters"]
    written = c.get("flushWriteBytes", 0) + c.get("compactWriteBytes", 0)
    out["writeAmplificationSinceOpen"] = (written / c["bytesWritten"]
                                          if c.get("bytesWritten") else None)
    pending: dict[str, int] = {}
    stalls: dict[str, int] = {}
    l0_files: dict[str, int] = {}
    for cf, info in rocks.get("columnFamilies", {}).items():
        props = info.get("properties", {})
        if "rocksdb.estimate-pending-compaction-bytes" in props:
            pending[cf] = int(props["rocksdb.estimate-pending-compaction-bytes"])
        if "rocksdb.num-files-at-level0" in props:
            l0_files[cf] = int(props["rocksdb.num-files-at-level0"])
        ws = info.get("compactionStats", {}).get("writeStalls", {})
        stalls[cf] = int(ws.get("total-delays", 0)) + int(ws.get("total-stops", 0))
    out["pendingCompactionBytes"] = pending
    out["pendingCompactionBytesMax"] = max(pending.values(), default=0)
    out["writeStalls"] = stalls
    out["writeStallsTotal"] = sum(stalls.values())
    out["l0FilesMax"] = max(l0_files.values(), default=0)
    return out


def physical_figures(
    ssts: Sequence[Mapping[str, Any]], live_by_cf: Mapping[str, Mapping[str, int]],
    manifest: Mapping[str, Any], watermarks: Mapping[int, int], now_ms: int, window_ms: int,
    due_scans: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "sst": sst_summary(ssts),
        "tombstones": tombstones(ssts, watermarks, now_ms),
        "space": space(ssts, live_by_cf, manifest),
        "readAmplification": read_amplification(ssts, watermarks, now_ms, window_ms, due_scans),
        "rocksdb": rocksdb_counters(manifest),
    }
