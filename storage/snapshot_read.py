"""Reading a snapshot: its checkpoint opened read-only with every column family (raw mode),
the engine's ``meta`` column family, and which column family each SST file belongs to.

Used to write a snapshot's manifest (storage/snapshot_manifest.py) and by the Spark jobs,
which read snapshots and never the live store.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rocksdict

from storage.constants import (
    CF_META,
    META_APPLIED_POSITION,
    META_FORMAT_VERSION,
    META_PARKED_PREFIX,
    META_SHARDS,
    META_WATERMARK_PREFIX,
)
from storage.errors import NotFound, StorageError
from storage.keys import unpack_u64

CHECKPOINT_DIR = "db"  # inside a snapshot directory, beside manifest.json
_SSTABLE = re.compile(r"^\s*(\d+):(\d+)\[")


@dataclass(frozen=True)
class ReadOnlyCheckpoint:
    db: rocksdict.Rdict
    cf_names: tuple[str, ...]
    options: rocksdict.Options | None = None

    def statistics(self) -> str:
        """RocksDB's statistics text of this reader ('' unless opened with statistics)."""
        return (self.options.get_statistics() or "") if self.options is not None else ""

    def column_family(self, name: str) -> rocksdict.Rdict:
        if name not in self.cf_names:
            raise NotFound(f"no column family {name!r} in the snapshot")
        return self.db.get_column_family(name)

    def meta(self) -> dict[str, Any]:
        """Watermarks (ms) and scan frontiers (hex keys) per shard, applied log position and
        shard count from the ``meta`` CF."""
        out: dict[str, Any] = {"watermarks": {}, "frontiers": {}}
        if CF_META not in self.cf_names:
            return out
        meta = self.db.get_column_family(CF_META)
        for key, value in meta.items(from_key=META_WATERMARK_PREFIX):
            assert isinstance(key, bytes) and isinstance(value, bytes)  # raw mode
            if not key.startswith(META_WATERMARK_PREFIX):
                break
            shard = key[len(META_WATERMARK_PREFIX):].decode()
            out["watermarks"][shard] = unpack_u64(value)  # ms: the frontier's leading 8 bytes
            out["frontiers"][shard] = value.hex()  # every timer key below it is delivered
        for name, key in (("appliedPosition", META_APPLIED_POSITION), ("timerShards", META_SHARDS),
                          ("formatVersion", META_FORMAT_VERSION)):
            raw = meta.get(key)
            out[name] = None if raw is None else unpack_u64(raw)
        del meta
        return out

    def parked_keys(self) -> set[bytes]:
        """Timer keys of the parked (poison) messages (scheduler/poison.py)."""
        if CF_META not in self.cf_names:
            return set()
        meta = self.db.get_column_family(CF_META)
        out = set()
        for key in meta.keys(from_key=META_PARKED_PREFIX):
            assert isinstance(key, bytes)  # raw mode
            if not key.startswith(META_PARKED_PREFIX):
                break
            out.add(key[len(META_PARKED_PREFIX):])
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


#: files a checkpoint reader may write itself: never linked from the snapshot, so a write lands
#: in the private directory (rocksdict rewrites its config on every open, even read-only)
_READER_OWNED = ("rocksdict-config.json", "LOCK", "LOG")


@contextmanager
def open_read_only(path: str | Path, *, statistics: bool = False) -> Iterator[ReadOnlyCheckpoint]:
    """Open a snapshot (or bare checkpoint) read-only with every column family, raw mode.

    Nothing is ever written into the snapshot, so it may sit on a read-only mount: RocksDB
    opens a private temporary directory of symbolic links to the checkpoint's files, where
    rocksdict writes its config file and RocksDB its info log. ``statistics``: RocksDB's
    tickers for this reader (``ReadOnlyCheckpoint.statistics()``)."""
    db_dir = resolve_db_dir(path).resolve()
    with tempfile.TemporaryDirectory(prefix="hourglass-ro-") as private:
        shadow = Path(private) / "db"
        shadow.mkdir()
        for f in db_dir.iterdir():
            if not f.name.startswith(_READER_OWNED):
                (shadow / f.name).symlink_to(f)
        opts = rocksdict.Options(raw_mode=True)
        opts.set_db_log_dir(private)
        if statistics:
            opts.enable_statistics()
        try:
            names = tuple(rocksdict.Rdict.list_cf(str(shadow), rocksdict.Options(raw_mode=True)))
            db = rocksdict.Rdict(
                str(shadow), opts,
                column_families={n: rocksdict.Options(raw_mode=True) for n in names},
                access_type=rocksdict.AccessType.read_only(),
            )
        except Exception as exc:  # rocksdict raises plain Exception subclasses
            why = str(exc).replace(str(shadow), str(db_dir))  # name the snapshot's own files
            raise StorageError(f"cannot open snapshot {db_dir} read-only: {why}") from exc
        try:
            yield ReadOnlyCheckpoint(db=db, cf_names=names, options=opts)
        finally:
            db.close()


def sst_number(name: str) -> int:
    """``'/000123.sst'`` -> 123."""
    return int(Path(name).stem)
