"""What a snapshot's manifest records of RocksDB: statistics, per-column-family properties,
compaction stats and the live SST files with their levels, read from the live store and from
the fresh checkpoint, and the parsers of RocksDB's text properties behind them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from storage.errors import InvalidArgument
from storage.snapshot_read import open_read_only, sst_number

NUM_LEVELS = 7

#: Per-column-family integer properties recorded in the manifest (read from the live store).
INT_PROPERTIES = (
    "rocksdb.estimate-pending-compaction-bytes",
    "rocksdb.total-sst-files-size",
    "rocksdb.live-sst-files-size",
    "rocksdb.estimate-live-data-size",
    "rocksdb.estimate-num-keys",
    "rocksdb.num-entries-active-mem-table",
    "rocksdb.num-deletes-active-mem-table",
    "rocksdb.cur-size-all-mem-tables",
    "rocksdb.compaction-pending",
    "rocksdb.num-running-compactions",
    "rocksdb.num-running-flushes",
    "rocksdb.actual-delayed-write-rate",
    "rocksdb.is-write-stopped",
    *(f"rocksdb.num-files-at-level{n}" for n in range(NUM_LEVELS)),
)
_CFSTATS = "rocksdb.cfstats-no-file-histogram"
_TABLE_PROPS = "rocksdb.aggregated-table-properties"


class SnapshotSource(Protocol):
    """What ``create_snapshot`` (storage/snapshots.py) needs of a store (a RocksStore)."""

    def checkpoint(self, dest: str | Path) -> Path: ...

    def property(self, cf: str, name: str) -> str | None: ...

    def statistics_text(self) -> str: ...


def collect_rocksdb(store: SnapshotSource, db_dir: Path) -> dict[str, Any]:
    """The manifest's ``"rocksdb"`` section: the checkpoint at ``db_dir`` (its meta, live
    files by column family and level) and the live ``store`` (statistics, properties)."""
    statistics_text = store.statistics_text()
    with open_read_only(db_dir) as db:
        cf_names = list(db.cf_names)
        files_by_number = db.sst_column_families()
        live_files = [_file_row(f, files_by_number) for f in db.db.live_files()]
        meta = db.meta()
    cfs: dict[str, Any] = {}
    for cf in cf_names:
        cfs[cf] = {"levels": _levels([f for f in live_files if f["cf"] == cf]),
                   **_cf_properties(store, cf)}
    return {
        "meta": meta,
        "statistics": parse_statistics(statistics_text or ""),
        "statisticsEnabled": bool(statistics_text),
        "columnFamilies": cfs,
        "liveFiles": live_files,
        "totals": {
            "sstFiles": len(live_files),
            "sstBytes": sum(f["size"] for f in live_files),
            "entries": sum(f["numEntries"] for f in live_files),
            "deletions": sum(f["numDeletions"] for f in live_files),
        },
    }


def _cf_properties(store: SnapshotSource, cf: str) -> dict[str, Any]:
    """The live store's properties of ``cf``; {} for a CF the store does not open (default)."""
    try:
        table_text = store.property(cf, _TABLE_PROPS)
    except InvalidArgument:
        return {}
    props: dict[str, int] = {}
    for name in INT_PROPERTIES:
        value = _int_or_none(store.property(cf, name))
        if value is not None:
            props[name] = value
    return {
        "properties": props,
        "tableProperties": parse_table_properties(table_text or ""),
        "compactionStats": parse_cfstats(store.property(cf, _CFSTATS) or ""),
    }


def _file_row(f: Mapping[str, Any], files_by_number: Mapping[int, str]) -> dict[str, Any]:
    name = str(f["name"]).lstrip("/")
    return {
        "name": name,
        "cf": files_by_number.get(sst_number(name)),
        "level": int(f["level"]),
        "size": int(f["size"]),
        "startKey": bytes(f["start_key"] or b"").hex(),
        "endKey": bytes(f["end_key"] or b"").hex(),
        "numEntries": int(f["num_entries"]),
        "numDeletions": int(f["num_deletions"]),
    }


def _levels(files: list[dict[str, Any]]) -> list[dict[str, int]]:
    levels = [{"level": n, "files": 0, "bytes": 0, "entries": 0, "deletions": 0}
              for n in range(NUM_LEVELS)]
    for f in files:
        row = levels[min(f["level"], NUM_LEVELS - 1)]
        row["files"] += 1
        row["bytes"] += f["size"]
        row["entries"] += f["numEntries"]
        row["deletions"] += f["numDeletions"]
    return levels


# --- parsing RocksDB's text properties -----------------------------------------------------

_TICKER = re.compile(r"^(\S+) COUNT : (\d+)$")
_HISTOGRAM = re.compile(
    r"^(\S+) P50 : (\S+) P95 : (\S+) P99 : (\S+) P100 : (\S+) COUNT : (\d+) SUM : (\d+)$"
)
_SSTABLE = re.compile(r"^\s*(\d+):(\d+)\[")
_LEVEL_ROW = re.compile(r"^\s*(L\d+|Sum)\s+(\d+)/(\d+)\s+([\d.]+)\s+(\w+)\s+(.*)$")
_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
_SUFFIX = {"K": 1_000, "M": 1_000_000, "G": 1_000_000_000, "T": 1_000_000_000_000}
_LEVEL_COLUMNS = ("score", "readGB", "rnGB", "rnp1GB", "writeGB", "wnewGB", "movedGB", "wAmp",
                  "rdMBps", "wrMBps", "compSec", "compMergeCpuSec", "compCount", "avgSec",
                  "keyIn", "keyDrop", "rblobGB", "wblobGB")


def parse_statistics(text: str) -> dict[str, Any]:
    """``Options.get_statistics()`` text -> {"tickers": {name: n}, "histograms": {...}}."""
    tickers: dict[str, int] = {}
    histograms: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        line = line.strip()
        if m := _TICKER.match(line):
            tickers[m[1]] = int(m[2])
        elif m := _HISTOGRAM.match(line):
            histograms[m[1]] = {"p50": float(m[2]), "p95": float(m[3]), "p99": float(m[4]),
                                "p100": float(m[5]), "count": int(m[6]), "sum": int(m[7])}
    return {"tickers": tickers, "histograms": histograms}


def parse_table_properties(text: str) -> dict[str, float]:
    """``rocksdb.aggregated-table-properties`` -> its numeric fields, named as RocksDB does."""
    out: dict[str, float] = {}
    for part in text.split(";"):
        name, sep, value = part.rpartition("=")
        if not sep:
            continue
        try:
            number = float(value.strip())
        except ValueError:
            continue
        out[name.strip()] = int(number) if number.is_integer() else number
    return out


def _human_number(text: str) -> float:
    if text and text[-1] in _SUFFIX:
        return float(text[:-1]) * _SUFFIX[text[-1]]
    return float(text)


def parse_cfstats(text: str) -> dict[str, Any]:
    """``rocksdb.cfstats-no-file-histogram`` -> per-level compaction rows, flush and stall counts.

    RocksDB prints these figures in GB with two decimals: fine for trends, too coarse for small
    databases (the exact DB-wide byte counters are in the statistics tickers)."""
    levels: dict[str, dict[str, float]] = {}
    out: dict[str, Any] = {"levels": levels}
    section_seen = False
    for line in text.splitlines():
        if line.startswith("** Compaction Stats"):
            if section_seen:  # the second table is by priority: skip it
                break
            section_seen = True
            continue
        if m := _LEVEL_ROW.match(line):
            values = m[6].split()
            row: dict[str, float] = {"files": int(m[2]), "filesCompacting": int(m[3]),
                                     "sizeBytes": float(m[4]) * _UNITS.get(m[5], 1)}
            for key, raw in zip(_LEVEL_COLUMNS, values, strict=False):
                try:
                    row[key] = _human_number(raw)
                except ValueError:
                    row[key] = 0.0
            levels[m[1]] = row
    for line in text.splitlines():
        if line.startswith("Flush(GB): cumulative"):
            out["flushGB"] = float(line.split()[2].rstrip(","))
        elif line.startswith("Cumulative compaction:"):
            nums = re.findall(r"([\d.]+) GB (write|read)", line)
            out.update({f"compaction{kind.title()}GB": float(v) for v, kind in nums})
            if sec := re.search(r"([\d.]+) seconds", line):
                out["compactionSeconds"] = float(sec[1])
        elif line.startswith("Estimated pending compaction bytes:"):
            out["pendingCompactionBytes"] = int(line.rsplit(":", 1)[1])
        elif line.startswith("Write Stall (count):"):
            out["writeStalls"] = {k.strip(): int(v) for k, v in
                                  re.findall(r"([\w-]+): (\d+)", line.split(":", 1)[1])}
    return out


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
