"""PySpark Python data sources over a hourglass snapshot (or a bare RocksDB checkpoint).

``spark.read.format("hourglass_logical").load(path)``: one row per key of every column family
(or of ``.option("cf", "timer.*,index")``), decoded: column family, shard, deliverAt, topic,
msgId, value size, state. The key space is split into ranges along SST boundaries; each Spark
task opens the snapshot read-only itself and yields Arrow record batches.

``spark.read.format("hourglass_sst").load(path)``: one row per SST file: column family, level,
size, key range (decoded to time for time-ordered CFs), entries and deletions.

Both need the snapshot on a path every executor can read (local mode, or a shared mount); for a
cluster without one, export to Parquet first (spark_jobs/inputs.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import rocksdict
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from spark_jobs.keyspace import (
    CfKind,
    KeyRange,
    cf_kind,
    key_time,
    plan_partitions,
    select_cfs,
    timer_shard,
)
from storage.errors import CorruptionError
from storage.records import decode_index, decode_message
from storage.snapshots import open_read_only, resolve_db_dir, sst_number

LOGICAL_FORMAT = "hourglass_logical"
SST_FORMAT = "hourglass_sst"

LOGICAL_SCHEMA = pa.schema([
    ("cf", pa.string()),
    ("shard", pa.int32()),  # timer shard number, null for other column families
    ("key_time", pa.int64()),  # leading time of a time-ordered key (deliverAt, next check, expiry)
    ("deliver_at", pa.int64()),  # epoch ms the message is (or was) due
    ("topic", pa.string()),
    ("msg_id", pa.string()),
    ("queue_offset", pa.int64()),
    ("key_size", pa.int32()),
    ("value_size", pa.int32()),
    ("state", pa.string()),  # SCHEDULED / PREPARED for timer / half keys, the index status
])
SST_SCHEMA = pa.schema([
    ("file", pa.string()),
    ("file_number", pa.int64()),
    ("cf", pa.string()),
    ("level", pa.int32()),
    ("size", pa.int64()),
    ("start_key", pa.binary()),
    ("end_key", pa.binary()),
    ("start_time", pa.int64()),  # time-ordered CFs only: deliverAt (etc.) of the first key
    ("end_time", pa.int64()),
    ("num_entries", pa.int64()),
    ("num_deletions", pa.int64()),
])
_SPARK_TYPES = {pa.string(): "STRING", pa.int32(): "INT", pa.int64(): "BIGINT",
                pa.binary(): "BINARY"}
BATCH_ROWS = 32_768
DEFAULT_PARTITIONS = 8


def ddl(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in schema)


def _path(options: Any) -> str:
    path = options.get("path")
    if not path:
        raise ValueError("give the snapshot directory: spark.read.format(...).load(PATH)")
    return str(resolve_db_dir(path))


# --- logical rows -----------------------------------------------------------------------------


class _Columns:
    """Column buffers of one record batch."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {f.name: [] for f in LOGICAL_SCHEMA}

    def __len__(self) -> int:
        return len(self.cols["cf"])

    def batch(self) -> pa.RecordBatch:
        arrays = []
        for f in LOGICAL_SCHEMA:
            values = self.cols[f.name]
            if f.type == pa.string() and f.name in ("topic", "msg_id"):
                arrays.append(_utf8(values))
            else:
                arrays.append(pa.array(values, type=f.type))
        self.cols = {f.name: [] for f in LOGICAL_SCHEMA}
        return pa.RecordBatch.from_arrays(arrays, schema=LOGICAL_SCHEMA)


def _utf8(values: list[bytes | None]) -> pa.Array:
    raw = pa.array(values, type=pa.binary())
    try:
        return raw.cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8: keep the row, replace the bad bytes
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in values],
                        type=pa.string())


def _split_name(rest: bytes) -> tuple[bytes | None, bytes | None]:
    """topic NUL msgId -> (topic, msgId); (None, None) when there is no separator."""
    sep = rest.find(b"\x00")
    if sep <= 0:
        return None, None
    return rest[:sep], rest[sep + 1:]


def _fill(
    cols: _Columns, cf: str, items: Iterator[tuple[bytes, bytes]],
) -> Iterator[pa.RecordBatch]:
    """Decode (key, value) pairs of ``cf`` into ``cols``, yielding a batch every BATCH_ROWS."""
    kind = cf_kind(cf)
    shard = timer_shard(cf)
    c = cols.cols
    cf_col, shard_col, kt_col, da_col = c["cf"], c["shard"], c["key_time"], c["deliver_at"]
    topic_col, id_col, off_col, state_col = c["topic"], c["msg_id"], c["queue_offset"], c["state"]
    ks_col, vs_col = c["key_size"], c["value_size"]
    fixed_state = {CfKind.TIMER: "SCHEDULED", CfKind.HALF: "PREPARED"}.get(kind)
    for key, value in items:
        kt = da = off = None
        state = fixed_state
        topic = msg_id = None
        if kind in (CfKind.TIMER, CfKind.HALF, CfKind.EXPIRY):
            kt = key_time(key)
            topic, msg_id = _split_name(key[8:])
            if kind is CfKind.TIMER:
                da = kt
            elif kind is CfKind.HALF:
                try:
                    da = decode_message(value).deliver_at
                except CorruptionError:
                    da = None
        elif kind is CfKind.INDEX:
            topic, msg_id = _split_name(key)
            try:
                entry = decode_index(value)
                da, off, state = entry.deliver_at, entry.queue_offset, entry.status.value
            except CorruptionError:
                state = None
        elif kind is CfKind.CQ:
            sep = key.find(b"\x00")
            if sep > 0 and len(key) == sep + 9:
                topic = key[:sep]
                off = int.from_bytes(key[sep + 1:], "big")
        cf_col.append(cf)
        shard_col.append(shard)
        kt_col.append(kt)
        da_col.append(da)
        topic_col.append(topic)
        id_col.append(msg_id)
        off_col.append(off)
        ks_col.append(len(key))
        vs_col.append(len(value))
        state_col.append(state)
        if len(cf_col) >= BATCH_ROWS:
            yield cols.batch()
            c = cols.cols
            cf_col, shard_col, kt_col, da_col = c["cf"], c["shard"], c["key_time"], c["deliver_at"]
            topic_col, id_col = c["topic"], c["msg_id"]
            off_col, state_col, ks_col, vs_col = (c["queue_offset"], c["state"], c["key_size"],
                                                  c["value_size"])


def read_ranges(path: str, ranges: list[KeyRange]) -> Iterator[pa.RecordBatch]:
    """Every (decoded) key of ``ranges`` of the snapshot at ``path``, as record batches."""
    cols = _Columns()
    with open_read_only(path) as snap:
        for rng in ranges:
            cf = snap.column_family(rng.cf)
            ro = rocksdict.ReadOptions()
            if rng.end is not None:
                # NB rocksdict's set_iterate_lower_bound sets the upper bound: never use it.
                ro.set_iterate_upper_bound(rng.end)
            it = cf.items(from_key=rng.start or b"", read_opt=ro)
            yield from _fill(cols, rng.cf, it)  # type: ignore[arg-type]
            del it, cf
    if len(cols):
        yield cols.batch()


class LogicalReader(DataSourceReader):
    def __init__(self, options: Any) -> None:
        self.path = _path(options)
        self.cf_spec = options.get("cf")
        self.partition_count = int(options.get("partitions", DEFAULT_PARTITIONS))
        if self.partition_count < 1:
            raise ValueError("partitions must be >= 1")

    def partitions(self) -> list[InputPartition]:
        with open_read_only(self.path) as snap:
            cfs = select_cfs(snap.cf_names, self.cf_spec)
            owner = snap.sst_column_families()
            files = snap.db.live_files()
        by_cf: dict[str, list[dict[str, Any]]] = {cf: [] for cf in cfs}
        for f in files:
            cf = owner.get(sst_number(f["name"]))
            if cf in by_cf:
                by_cf[cf].append(f)
        groups = plan_partitions(by_cf, cfs, self.partition_count)
        return [InputPartition(g.ranges) for g in groups] or [InputPartition([])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_ranges(self.path, partition.value)


class LogicalSource(DataSource):
    """Options: ``cf`` (comma list, ``timer.*`` allowed; default all), ``partitions`` (8)."""

    @classmethod
    def name(cls) -> str:
        return LOGICAL_FORMAT

    def schema(self) -> str:
        return ddl(LOGICAL_SCHEMA)

    def reader(self, schema: StructType) -> DataSourceReader:
        return LogicalReader(self.options)


# --- physical rows ----------------------------------------------------------------------------


def sst_rows(path: str) -> pa.RecordBatch:
    with open_read_only(path) as snap:
        owner = snap.sst_column_families()
        files = snap.db.live_files()
    rows: dict[str, list[Any]] = {f.name: [] for f in SST_SCHEMA}
    for f in sorted(files, key=lambda f: sst_number(f["name"])):
        number = sst_number(f["name"])
        cf = owner.get(number)
        start, end = bytes(f["start_key"] or b""), bytes(f["end_key"] or b"")
        timed = cf is not None and cf_kind(cf) in (CfKind.TIMER, CfKind.HALF, CfKind.EXPIRY)
        for name, value in (
            ("file", str(f["name"]).lstrip("/")), ("file_number", number), ("cf", cf),
            ("level", int(f["level"])), ("size", int(f["size"])), ("start_key", start),
            ("end_key", end), ("start_time", key_time(start) if timed else None),
            ("end_time", key_time(end) if timed else None),
            ("num_entries", int(f["num_entries"])), ("num_deletions", int(f["num_deletions"])),
        ):
            rows[name].append(value)
    return pa.RecordBatch.from_pydict(rows, schema=SST_SCHEMA)


class SstReader(DataSourceReader):
    def __init__(self, options: Any) -> None:
        self.path = _path(options)

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield sst_rows(self.path)


class SstSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SST_FORMAT

    def schema(self) -> str:
        return ddl(SST_SCHEMA)

    def reader(self, schema: StructType) -> DataSourceReader:
        return SstReader(self.options)


def register(spark: Any) -> None:
    """Register both formats with a SparkSession (idempotent)."""
    spark.dataSource.register(LogicalSource)
    spark.dataSource.register(SstSource)
