"""Snapshots: a RocksDB checkpoint plus a manifest of the engine's and RocksDB's state.

Layout of a snapshot root (``data_dir/snapshots``)::

    <snapshot_id>/manifest.json   time, caller's extra (watermarks, applied log position),
                                  RocksDB statistics, per-column-family properties, SST list
    <snapshot_id>/db/             the checkpoint (SST files hard-linked to the live DB)

A snapshot is built under ``.tmp-<id>`` and renamed into place, so a listed snapshot is
always complete; removal renames it to ``.trash-<id>`` first for the same reason.

Because SST files are hard links, a fresh snapshot costs almost no disk; it starts to cost
once compaction replaces the live files it shares. :func:`disk_usage` tells how much.

This module creates, lists, removes and measures snapshots; what the manifest records of
RocksDB is collected in storage/snapshot_manifest.py, and a snapshot is opened for reading
by storage/snapshot_read.py. Their public names are importable from here too.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from storage.errors import InvalidArgument, NotFound, StorageError
from storage.private import DIR_MODE, FILE_MODE, private_dir
from storage.segment import fsync_dir
from storage.snapshot_manifest import (
    INT_PROPERTIES,
    NUM_LEVELS,
    SnapshotSource,
    collect_rocksdb,
    parse_cfstats,
    parse_statistics,
    parse_table_properties,
)
from storage.snapshot_read import (
    CHECKPOINT_DIR,
    ReadOnlyCheckpoint,
    open_read_only,
    resolve_db_dir,
    sst_number,
)

__all__ = [
    "CHECKPOINT_DIR",
    "INT_PROPERTIES",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "NUM_LEVELS",
    "SNAPSHOT_ID_PATTERN",
    "DiskUsage",
    "ReadOnlyCheckpoint",
    "SnapshotInfo",
    "SnapshotSource",
    "create_snapshot",
    "disk_usage",
    "get_snapshot",
    "list_snapshots",
    "open_read_only",
    "parse_cfstats",
    "parse_statistics",
    "parse_table_properties",
    "read_manifest",
    "remove_snapshot",
    "resolve_db_dir",
    "sst_number",
]

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
SNAPSHOT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")


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
    private_dir(root)
    tmp = root / f"{_TMP_PREFIX}{snapshot_id}"
    final = root / snapshot_id
    try:
        tmp.mkdir(mode=DIR_MODE)
        store.checkpoint(tmp / CHECKPOINT_DIR)
        manifest = {
            "format": MANIFEST_FORMAT,
            "snapshotId": snapshot_id,
            "createdAt": created_at,
            "createdAtIso": _iso(created_at),
            "extra": extra_json,
            "rocksdb": collect_rocksdb(store, tmp / CHECKPOINT_DIR),
        }
        _write_json(tmp / MANIFEST_NAME, manifest)
        os.replace(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SnapshotInfo(snapshot_id=snapshot_id, path=final, created_at=created_at)


def _new_id(created_at: int) -> str:
    stamp = datetime.fromtimestamp(created_at / 1000, UTC).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}{created_at % 1000:03d}Z-{secrets.token_hex(3)}"


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with open(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())


# --- finding, removing, measuring ------------------------------------------------------------


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
    check_snapshot_id(snapshot_id)
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


def check_snapshot_id(snapshot_id: object) -> str:
    """``snapshot_id`` if it is a valid id (a plain file name: never ``..`` nor a path),
    else InvalidArgument (a ValueError)."""
    if not isinstance(snapshot_id, str) or not SNAPSHOT_ID_PATTERN.match(snapshot_id):
        raise InvalidArgument(f"invalid snapshot id {snapshot_id!r}")
    return snapshot_id


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
