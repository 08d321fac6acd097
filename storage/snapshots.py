"""Snapshots: a RocksDB checkpoint plus a manifest of the engine's and RocksDB's state.

Layout of a snapshot root (``data_dir/snapshots``)::

    <snapshot_id>/manifest.json   time, caller's extra (watermarks, applied log position),
                                  RocksDB statistics, per-column-family properties, SST list
    <snapshot_id>/db/             the checkpoint (SST files hard-linked to the live DB)

A snapshot is built under ``.tmp-<id>`` and renamed into place, so a listed snapshot is
always complete; removal renames it to ``.trash-<id>`` first for the same reason.

Because SST files are hard links, a fresh snapshot costs almost no disk; it starts to cost
once compaction replaces the live files it shares. :func:`disk_usage` tells how much.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import rocksdict

from storage.constants import (
    CF_META,
    META_APPLIED_POSITION,
    META_FORMAT_VERSION,
    META_SHARDS,
    META_WATERMARK_PREFIX,
)
from storage.errors import InvalidArgument, NotFound, StorageError
from storage.keys import unpack_u64

MANIFEST_NAME = "manifest.json"
CHECKPOINT_DIR = "db"
MANIFEST_FORMAT = 1
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
SNAPSHOT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
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
    """What :func:`create_snapshot` needs of a store (storage.timer_store.TimerStore)."""

    def checkpoint(self, dest: str | Path) -> Path: ...

    def property(self, cf: str, name: str) -> str | None: ...

    def statistics_text(self) -> str: ...


@dataclass(frozen=True, kw_only=True)
class SnapshotInfo:
    snapshot_id: str
    path: Path  # the snapshot directory: manifest.json and db/
    created_at: int  # epoch ms

    @property
    def db_path(self) -> Path:
        return self.path / CHECKPOINT_DIR


@dataclass(frozen=True, kw_only=True)
class DiskUsage:
    """Bytes a snapshot occupies, by how they are shared with the live DB and other snapshots."""

    total_bytes: int  # every file of the checkpoint, shared or not
    pinned_bytes: int  # SST files the live DB no longer has: kept alive only by snapshots
    exclusive_bytes: int  # files no one else links: what removing this snapshot frees


# --- creating -------------------------------------------------------------------------------


def create_snapshot(
    store: SnapshotSource, root: Path, *, extra: Mapping[str, Any], now_ms: int | None = None,
) -> SnapshotInfo:
    """Checkpoint ``store`` into ``root/<id>/db`` and write ``root/<id>/manifest.json``.

    ``extra`` (watermarks, applied log position, ...) is stored under ``"extra"``; it must be
    JSON-serialisable. The watermarks, applied log position and shard count are also read
    from the checkpoint's ``meta`` column family into ``"meta"``, whatever ``extra`` holds.
    """
    try:
        extra_json = json.loads(json.dumps(dict(extra)))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"snapshot extra is not JSON-serialisable: {exc}") from exc
    created_at = int(time.time() * 1000) if now_ms is None else int(now_ms)
    snapshot_id = _new_id(created_at)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{_TMP_PREFIX}{snapshot_id}"
    final = root / snapshot_id
    try:
        tmp.mkdir()
        store.checkpoint(tmp / CHECKPOINT_DIR)
        manifest = {
            "format": MANIFEST_FORMAT,
            "snapshotId": snapshot_id,
            "createdAt": created_at,
            "createdAtIso": _iso(created_at),
            "extra": extra_json,
            "rocksdb": _collect_rocksdb(store, tmp / CHECKPOINT_DIR),
        }
        _write_json(tmp / MANIFEST_NAME, manifest)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SnapshotInfo(snapshot_id=snapshot_id, path=final, created_at=created_at)


def _new_id(created_at: int) -> str:
    stamp = datetime.fromtimestamp(created_at / 1000, UTC).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}{created_at % 1000:03d}Z-{secrets.token_hex(3)}"


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _collect_rocksdb(store: SnapshotSource, db_dir: Path) -> dict[str, Any]:
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


def sst_number(name: str) -> int:
    """``'/000123.sst'`` -> 123."""
    return int(Path(name).stem)


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


# --- reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadOnlyCheckpoint:
    db: rocksdict.Rdict
    cf_names: tuple[str, ...]

    def column_family(self, name: str) -> rocksdict.Rdict:
        if name not in self.cf_names:
            raise NotFound(f"no column family {name!r} in the snapshot")
        return self.db.get_column_family(name)

    def meta(self) -> dict[str, Any]:
        """Watermarks per shard, applied log position and shard count from the ``meta`` CF."""
        out: dict[str, Any] = {"watermarks": {}}
        if CF_META not in self.cf_names:
            return out
        meta = self.db.get_column_family(CF_META)
        for key, value in meta.items(from_key=META_WATERMARK_PREFIX):
            assert isinstance(key, bytes) and isinstance(value, bytes)  # raw mode
            if not key.startswith(META_WATERMARK_PREFIX):
                break
            out["watermarks"][key[len(META_WATERMARK_PREFIX):].decode()] = unpack_u64(value)
        for name, key in (("appliedPosition", META_APPLIED_POSITION), ("timerShards", META_SHARDS),
                          ("formatVersion", META_FORMAT_VERSION)):
            raw = meta.get(key)
            out[name] = None if raw is None else unpack_u64(raw)
        del meta
        return out

    def sst_column_families(self) -> dict[int, str]:
        """SST file number -> column family name (from each CF's ``rocksdb.sstables``)."""
        out: dict[int, str] = {}
        for name in self.cf_names:
            cf = self.db.get_column_family(name)
            text = cf.property_value("rocksdb.sstables") or ""
            del cf
            for line in text.splitlines():
                if m := _SSTABLE.match(line):
                    out[int(m[1])] = name
        return out


def resolve_db_dir(path: str | Path) -> Path:
    """The checkpoint directory of a snapshot dir (``<snap>/db``) or of a bare checkpoint."""
    path = Path(path)
    if (path / CHECKPOINT_DIR / "CURRENT").is_file():
        return path / CHECKPOINT_DIR
    if (path / "CURRENT").is_file():
        return path
    raise NotFound(f"{path} is neither a snapshot directory nor a RocksDB checkpoint")


@contextmanager
def open_read_only(path: str | Path) -> Iterator[ReadOnlyCheckpoint]:
    """Open a snapshot (or bare checkpoint) read-only with every column family, raw mode.

    RocksDB's info log goes to a private temporary directory, so concurrent readers (Spark
    tasks) never write into the snapshot and the snapshot may sit on a read-only share."""
    db_dir = resolve_db_dir(path)
    with tempfile.TemporaryDirectory(prefix="hourglass-ro-log-") as log_dir:
        opts = rocksdict.Options(raw_mode=True)
        opts.set_db_log_dir(log_dir)
        try:
            names = tuple(rocksdict.Rdict.list_cf(str(db_dir), rocksdict.Options(raw_mode=True)))
            db = rocksdict.Rdict(
                str(db_dir), opts,
                column_families={n: rocksdict.Options(raw_mode=True) for n in names},
                access_type=rocksdict.AccessType.read_only(),
            )
        except Exception as exc:  # rocksdict raises plain Exception subclasses
            raise StorageError(f"cannot open snapshot {db_dir} read-only: {exc}") from exc
        try:
            yield ReadOnlyCheckpoint(db=db, cf_names=names)
        finally:
            db.close()


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of a snapshot directory ({} for a bare checkpoint without one)."""
    manifest = Path(path) / MANIFEST_NAME
    if not manifest.is_file():
        resolve_db_dir(path)  # NotFound unless it is at least a checkpoint
        return {}
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StorageError(f"cannot read {manifest}: {exc}") from exc
    if not isinstance(data, dict):
        raise StorageError(f"{manifest} is not a JSON object")
    return data


def list_snapshots(root: str | Path) -> list[SnapshotInfo]:
    """Complete snapshots under ``root``, oldest first (unfinished ``.tmp-`` dirs are skipped)."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for child in root.iterdir():
        if child.name.startswith(".") or not (child / MANIFEST_NAME).is_file():
            continue
        manifest = read_manifest(child)
        out.append(SnapshotInfo(snapshot_id=child.name, path=child,
                                created_at=int(manifest.get("createdAt", 0))))
    return sorted(out, key=lambda s: (s.created_at, s.snapshot_id))


def get_snapshot(root: str | Path, snapshot_id: str) -> SnapshotInfo:
    _check_id(snapshot_id)
    for info in list_snapshots(root):
        if info.snapshot_id == snapshot_id:
            return info
    raise NotFound(f"no snapshot {snapshot_id!r} in {root}")


def remove_snapshot(root: str | Path, snapshot_id: str) -> None:
    """Delete one snapshot; NotFound if there is none of that id."""
    info = get_snapshot(root, snapshot_id)
    trash = Path(root) / f"{_TRASH_PREFIX}{snapshot_id}"
    os.replace(info.path, trash)
    shutil.rmtree(trash)


def _check_id(snapshot_id: str) -> None:
    if not SNAPSHOT_ID_PATTERN.match(snapshot_id):
        raise InvalidArgument(f"invalid snapshot id {snapshot_id!r}")


def disk_usage(snapshot: SnapshotInfo | Path, live_db_dir: str | Path | None = None) -> DiskUsage:
    """How much disk a snapshot holds.

    ``pinned_bytes`` counts SST files the live DB no longer has (compaction replaced them):
    with ``live_db_dir`` by comparing inodes with its files, without it by link count 1 (an
    undercount when two snapshots share a file the live DB dropped). ``exclusive_bytes`` is
    every file no one else links, the snapshot's own MANIFEST and WAL copies included."""
    path = snapshot.path if isinstance(snapshot, SnapshotInfo) else Path(snapshot)
    db_dir = resolve_db_dir(path)
    live: set[tuple[int, int]] | None = None
    if live_db_dir is not None:
        live = set()
        for f in Path(live_db_dir).iterdir():
            st = f.stat()
            live.add((st.st_dev, st.st_ino))
    total = pinned = exclusive = 0
    for f in db_dir.iterdir():
        if not f.is_file():
            continue
        st = f.stat()
        total += st.st_size
        alone = st.st_nlink <= 1
        if alone:
            exclusive += st.st_size
        if f.suffix == ".sst" and (alone if live is None else (st.st_dev, st.st_ino) not in live):
            pinned += st.st_size
    return DiskUsage(total_bytes=total, pinned_bytes=pinned, exclusive_bytes=exclusive)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
