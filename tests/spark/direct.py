"""Independent reads of a checkpoint with rocksdict alone (no spark_jobs, no storage.snapshots):
what the data sources and figures are checked against."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import rocksdict

from storage.keys import decode_cq_key, decode_index_key, decode_timer_key
from storage.records import decode_index, decode_message


def open_checkpoint(db_dir: Path) -> tuple[rocksdict.Rdict, list[str]]:
    names = rocksdict.Rdict.list_cf(str(db_dir), rocksdict.Options(raw_mode=True))
    db = rocksdict.Rdict(str(db_dir), rocksdict.Options(raw_mode=True),
                         column_families={n: rocksdict.Options(raw_mode=True) for n in names},
                         access_type=rocksdict.AccessType.read_only())
    return db, list(names)


def logical_rows(db_dir: Path) -> list[tuple[Any, ...]]:
    """(cf, shard, key_time, deliver_at, topic, msg_id, queue_offset, key_size, value_size,
    state) for every key, decoded with the storage codecs; an index entry's state as it
    stands (a SCHEDULED one below its shard's frontier, not parked, was delivered)."""
    db, names = open_checkpoint(db_dir)
    rows = []
    try:
        meta = db.get_column_family("meta")
        pairs: list[tuple[bytes, bytes]] = list(meta.items())  # type: ignore[arg-type]
        del meta  # (raw mode: bytes)
        frontiers = {int(k[3:]): v for k, v in pairs if k.startswith(b"wm/")}
        parked = {k[7:] for k, _ in pairs if k.startswith(b"parked/")}
        shards = sum(1 for n in names if n.startswith("timer."))
        for cf in names:
            handle = db.get_column_family(cf)
            for key, value in handle.items():
                assert isinstance(key, bytes) and isinstance(value, bytes)  # raw mode
                row = _decode(cf, key, value)
                if cf == "index" and row[-1] == "SCHEDULED":  # delivered by a scan?
                    timer_key = row[3].to_bytes(8, "big") + key
                    frontier = frontiers.get(zlib.crc32(row[4].encode()) % shards)
                    if frontier is not None and timer_key < frontier and timer_key not in parked:
                        row = (*row[:-1], "DELIVERED")
                rows.append(row)
            del handle
    finally:
        db.close()
    return rows


def _decode(cf: str, key: bytes, value: bytes) -> tuple[Any, ...]:
    shard = kt = da = topic = msg_id = offset = state = None
    if cf.startswith("timer.") or cf in ("half", "expiry"):
        kt, topic, msg_id = decode_timer_key(key)
        if cf.startswith("timer."):
            shard, da, state = int(cf.split(".")[1]), kt, "SCHEDULED"
        elif cf == "half":
            da, state = decode_message(value).deliver_at, "PREPARED"
    elif cf == "index":
        topic, msg_id = decode_index_key(key)
        entry = decode_index(value)
        da, offset, state = entry.deliver_at, entry.queue_offset, entry.status.value
    elif cf == "cq":
        topic, offset = decode_cq_key(key)
    return (cf, shard, kt, da, topic, msg_id, offset, len(key), len(value), state)


def live_files(db_dir: Path) -> list[dict[str, Any]]:
    db, _ = open_checkpoint(db_dir)
    try:
        return [dict(f) for f in db.live_files()]
    finally:
        db.close()


def cf_sst_bytes(db_dir: Path) -> dict[str, int]:
    """Per column family, RocksDB's own total SST size (a second way to attribute files)."""
    db, names = open_checkpoint(db_dir)
    out = {}
    try:
        for cf in names:
            handle = db.get_column_family(cf)
            out[cf] = int(handle.property_int_value("rocksdb.total-sst-files-size") or 0)
            del handle
    finally:
        db.close()
    return out
