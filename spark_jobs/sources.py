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

import itertools
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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
from spark_jobs.timer_aggregates import AGG_DDL, aggregate, decode_watermarks
from storage.constants import CF_TIMER_PREFIX
from storage.errors import CorruptionError
from storage.records import (
    FORMAT_VERSION,
    IndexEntry,
    MessageStatus,
    decode_index,
    decode_message,
    fields_of,
)
from storage.snapshot_read import ReadOnlyCheckpoint
from storage.snapshots import open_read_only, resolve_db_dir, sst_number

LOGICAL_FORMAT = "hourglass_logical"
TIMERS_FORMAT = "hourglass_timers"
COUNTS_FORMAT = "hourglass_cf_counts"
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
#: the slim rows of the timer shards the analysis reads (hourglass_timers): decoded column-wise
TIMERS_SCHEMA = pa.schema([
    ("shard", pa.int32()),
    ("deliver_at", pa.int64()),
    ("topic", pa.string()),
    ("key_size", pa.int32()),
    ("value_size", pa.int32()),
    ("pending", pa.bool_()),  # at or above the shard's scan frontier (null: frontier unknown)
])
#: rows, key and value bytes per column family and state, summed inside each task
#: (hourglass_cf_counts): the analysis needs these aggregates of the other CFs, not their rows
COUNTS_SCHEMA = pa.schema([
    ("cf", pa.string()),
    ("state", pa.string()),
    ("rows", pa.int64()),
    ("key_bytes", pa.int64()),
    ("value_bytes", pa.int64()),
])
_SPARK_TYPES = {pa.string(): "STRING", pa.int32(): "INT", pa.int64(): "BIGINT",
                pa.binary(): "BINARY", pa.bool_(): "BOOLEAN"}
BATCH_ROWS = 32_768
_STATUSES = frozenset(s.value for s in MessageStatus)
DEFAULT_PARTITIONS = 8


def ddl(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in schema)


def _path(options: Any) -> str:
    path = options.get("path")
    if not path:
        raise ValueError("give the snapshot directory: spark.read.format(...).load(PATH)")
    return str(resolve_db_dir(path))


# --- logical rows -----------------------------------------------------------------------------


def _utf8(values: list[bytes | None]) -> pa.Array:
    raw = pa.array(values, type=pa.binary())
    try:
        return raw.cast(pa.string())  # validates UTF-8 in C
    except pa.ArrowInvalid:  # not UTF-8: keep the row, replace the bad bytes
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in values],
                        type=pa.string())


def _names(rests: list[bytes]) -> tuple[list[bytes | None], list[bytes | None]]:
    """topic NUL msgId -> (topics, msgIds); None where a key has no separator."""
    seps = [r.find(b"\x00") for r in rests]
    topics = [r[:i] if i > 0 else None for r, i in zip(rests, seps, strict=True)]
    ids = [r[i + 1:] if i > 0 else None for r, i in zip(rests, seps, strict=True)]
    return topics, ids


_INDEX_FIELDS = {name: n + 1 for n, name in enumerate(fields_of(IndexEntry))}
_STATUS, _DELIVER_AT, _QUEUE_OFFSET = (_INDEX_FIELDS[f] for f in
                                       ("status", "deliver_at", "queue_offset"))


def _index_columns(values: list[bytes]) -> tuple[list[Any], list[Any], list[Any]]:
    """(deliver_at, queue_offset, status) of encoded IndexEntries.

    storage/records.py writes each record as one msgpack array: its format version, then the
    dataclass's fields in order. Unpacking the whole batch with one streaming Unpacker is
    ~20x cheaper than a decode_index call per row; any value that is not such an array
    (corrupt, or a format this reader does not know) goes through decode_index itself."""
    unpacker = msgpack.Unpacker(use_list=False, raw=False, strict_map_key=True,
                                max_buffer_size=max(sum(len(v) for v in values), 1 << 20))
    unpacker.feed(b"".join(values))
    out_da: list[Any] = []
    out_off: list[Any] = []
    out_state: list[Any] = []
    try:
        records = list(unpacker)
    except Exception:  # msgpack raises several types on garbage: fall back row by row
        records = []
    fast = len(records) == len(values) and all(
        type(r) is tuple and len(r) > _QUEUE_OFFSET and r[0] == FORMAT_VERSION
        and type(r[_STATUS]) is str and r[_STATUS] in _STATUSES for r in records)
    if fast:
        return ([r[_DELIVER_AT] for r in records], [r[_QUEUE_OFFSET] for r in records],
                [r[_STATUS] for r in records])
    for value in values:
        try:
            entry = decode_index(value)
        except CorruptionError:
            out_da.append(None)
            out_off.append(None)
            out_state.append(None)
            continue
        out_da.append(entry.deliver_at)
        out_off.append(entry.queue_offset)
        out_state.append(entry.status.value)
    return out_da, out_off, out_state


class DeliveredRule:
    """scheduler/ledger.py's rule, on a snapshot: a SCHEDULED index entry whose timer key
    (8-byte deliverAt + the index key) lies below its shard's persisted frontier, and is not
    parked, was delivered (the delivery commit does not rewrite it)."""

    def __init__(self, frontiers: Mapping[int, bytes], shards: int, parked: set[bytes]) -> None:
        self.frontiers = frontiers
        self.shards = max(shards, 1)
        self.parked = parked

    @classmethod
    def of(cls, snap: ReadOnlyCheckpoint) -> DeliveredRule:
        meta = snap.meta()
        shards = meta.get("timerShards") or sum(
            1 for name in snap.cf_names if name.startswith(CF_TIMER_PREFIX))
        return cls({int(s): bytes.fromhex(k) for s, k in meta["frontiers"].items()},
                   shards, snap.parked_keys())

    def apply(self, keys: Sequence[bytes], deliver_ats: Sequence[Any],
              states: Sequence[str | None]) -> list[str | None]:
        """``states`` of the index entries at ``keys``, SCHEDULED ones a scan delivered made
        DELIVERED."""
        out = list(states)
        for i, state in enumerate(states):
            at = deliver_ats[i]
            if state != _SCHEDULED or not isinstance(at, int) or not 0 <= at < 1 << 64:
                continue
            key = keys[i]
            frontier = self.frontiers.get(zlib.crc32(key[:key.find(b"\x00")]) % self.shards)
            timer_key = at.to_bytes(8, "big") + key
            if frontier is not None and timer_key < frontier and timer_key not in self.parked:
                out[i] = _DELIVERED
        return out


_SCHEDULED, _DELIVERED = MessageStatus.SCHEDULED.value, MessageStatus.DELIVERED.value


def _half_deliver_at(value: bytes) -> int | None:
    try:
        return decode_message(value).deliver_at
    except CorruptionError:
        return None


def decode_batch(cf: str, keys: list[bytes], values: list[bytes],
                 rule: DeliveredRule | None = None) -> pa.RecordBatch:
    """The logical rows of (key, value) pairs of ``cf``, built column by column; ``rule``
    gives index entries their status as it stands (else: as stored)."""
    kind, n = cf_kind(cf), len(keys)
    nothing: list[Any] = [None] * n
    kt, da, offsets, states = nothing, nothing, nothing, nothing
    topics: list[bytes | None] = nothing
    ids: list[bytes | None] = nothing
    if kind in (CfKind.TIMER, CfKind.HALF, CfKind.EXPIRY):
        kt = [key_time(k) for k in keys]
        topics, ids = _names([k[8:] for k in keys])
        if kind is CfKind.TIMER:
            da, states = kt, ["SCHEDULED"] * n
        elif kind is CfKind.HALF:
            da, states = [_half_deliver_at(v) for v in values], ["PREPARED"] * n
    elif kind is CfKind.INDEX:
        topics, ids = _names(keys)
        da, offsets, states = _index_columns(values)
        if rule is not None:
            states = rule.apply(keys, da, states)
    elif kind is CfKind.CQ:
        seps = [k.find(b"\x00") for k in keys]
        ok = [0 < i == len(k) - 9 for i, k in zip(seps, keys, strict=True)]
        topics = [k[:i] if good else None for k, i, good in zip(keys, seps, ok, strict=True)]
        offsets = [int.from_bytes(k[i + 1:], "big") if good else None
                   for k, i, good in zip(keys, seps, ok, strict=True)]
    columns = {
        "cf": pa.array([cf] * n, pa.string()),
        "shard": pa.array([timer_shard(cf)] * n, pa.int32()),
        "key_time": pa.array(kt, pa.int64()),
        "deliver_at": pa.array(da, pa.int64()),
        "topic": _utf8(topics),
        "msg_id": _utf8(ids),
        "queue_offset": pa.array(offsets, pa.int64()),
        "key_size": pc.binary_length(pa.array(keys, pa.binary())).cast(pa.int32()),
        "value_size": pc.binary_length(pa.array(values, pa.binary())).cast(pa.int32()),
        "state": pa.array(states, pa.string()),
    }
    return pa.RecordBatch.from_arrays([columns[f.name] for f in LOGICAL_SCHEMA],
                                      schema=LOGICAL_SCHEMA)


def read_ranges(path: str, ranges: list[KeyRange]) -> Iterator[pa.RecordBatch]:
    """Every (decoded) key of ``ranges`` of the snapshot at ``path``, as record batches."""
    with open_read_only(path) as snap:
        rule = DeliveredRule.of(snap)
        for rng in ranges:
            cf = snap.column_family(rng.cf)
            ro = rocksdict.ReadOptions()
            if rng.end is not None:
                # NB rocksdict's set_iterate_lower_bound sets the upper bound: never use it.
                ro.set_iterate_upper_bound(rng.end)
            it = cf.items(from_key=rng.start or b"", read_opt=ro)
            while chunk := list(itertools.islice(it, BATCH_ROWS)):
                yield decode_batch(rng.cf, [k for k, _ in chunk],  # type: ignore[misc]
                                   [v for _, v in chunk], rule)
            del it, cf


def _binary(items: Sequence[bytes]) -> tuple[pa.BinaryArray, np.ndarray]:
    """An Arrow binary array of ``items`` (and their lengths) from one joined buffer: ~4x
    cheaper than ``pa.array`` over Python bytes."""
    lengths = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
    offsets = np.zeros(len(items) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = b"".join(items)
    return pa.BinaryArray.from_buffers(pa.binary(), len(items), [
        None, pa.py_buffer(offsets), pa.py_buffer(data)]), lengths


def decode_timers(shard: int, keys: Sequence[bytes], values: Sequence[bytes],
                  frontier: bytes | None = None) -> pa.RecordBatch:
    """The slim rows of timer keys (8-byte deliverAt + topic NUL msgId), vectorised: the time
    from the joined key bytes with numpy, the topic with Arrow's split on NUL. ``frontier``:
    the shard's persisted scan frontier (a key: every key below it is delivered), which sets
    ``pending``; the keys compared one by one are only those of the frontier's millisecond."""
    n = len(keys)
    arr, key_sizes = _binary(keys)
    value_sizes = np.fromiter(map(len, values), dtype=np.int32, count=n)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n + 1)[:-1]
    raw = np.frombuffer(arr.buffers()[2], dtype=np.uint8)
    short = key_sizes < 8
    if short.any():  # not a timer key: no time (and no topic)
        at: pa.Array = pa.array([key_time(k) for k in keys], pa.int64())
    else:
        at = pa.array(raw[offsets[:, None] + np.arange(8)].copy().view(">u8").ravel()
                      .astype(np.int64))
    parts = pc.split_pattern(pc.binary_slice(arr, 8, 1 << 30), pattern=b"\x00", max_splits=1)
    has_sep = pc.greater(pc.list_value_length(parts), 1)
    topics = pc.if_else(has_sep, pc.list_element(parts, 0), pa.scalar(None, pa.binary()))
    try:
        topic = topics.cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8: keep the row, replace the bad bytes
        topic = _utf8(topics.to_pylist())
    pending: pa.Array = pa.nulls(n, pa.bool_())
    if frontier is not None:
        mark = int.from_bytes(frontier[:8].ljust(8, b"\x00"), "big")
        times = at.to_numpy(zero_copy_only=False)
        flags = times > mark
        for i in np.flatnonzero(times == mark).tolist():
            flags[i] = keys[i] >= frontier
        pending = pa.array(flags)
    return pa.RecordBatch.from_arrays(
        [pa.array(np.full(n, shard, dtype=np.int32)), at, topic,
         pa.array(key_sizes.astype(np.int32)), pa.array(value_sizes), pending],
        schema=TIMERS_SCHEMA)


def index_states(values: Sequence[bytes], keys: Sequence[bytes] = (),
                 rule: DeliveredRule | None = None) -> Counter[str | None]:
    """Index entries per status. An encoded IndexEntry starts with a msgpack array header,
    the format version and the status as a short string (storage/records.py): count those
    prefixes (a handful of distinct ones), and decode_index any value that does not start so.
    With ``rule`` (and the ``keys``), the SCHEDULED ones are decoded and counted as they
    stand (DeliveredRule)."""
    prefixes = [v[:3 + (v[2] & 31)] if len(v) > 2 else v for v in values]
    out: Counter[str | None] = Counter()
    odd: set[bytes] = set()
    scheduled: set[bytes] = set()
    for prefix, n in Counter(prefixes).items():
        status = None
        if len(prefix) > 3 and prefix[0] & 0xF0 == 0x90 and prefix[1] == FORMAT_VERSION \
                and prefix[2] & 0xE0 == 0xA0:
            status = prefix[3:].decode("utf-8", "replace")
        if status == _SCHEDULED and rule is not None:
            scheduled.add(prefix)
        elif status in _STATUSES:
            out[status] += n
        else:
            odd.add(prefix)
    if scheduled:
        assert rule is not None
        rows = [i for i, prefix in enumerate(prefixes) if prefix in scheduled]
        row_keys = [keys[i] for i in rows]
        da, _, states = _index_columns([values[i] for i in rows])
        out.update(rule.apply(row_keys, da, states))
    if odd:  # another format or corrupt: the codec decides, row by row
        for v, prefix in zip(values, prefixes, strict=True):
            if prefix in odd:
                try:
                    out[decode_index(v).status.value] += 1
                except CorruptionError:
                    out[None] += 1
    return out


def _chunks(snap: Any, rng: KeyRange) -> Iterator[tuple[tuple[bytes, ...], tuple[bytes, ...]]]:
    """(keys, values) of ``rng``, BATCH_ROWS at a time."""
    cf = snap.column_family(rng.cf)
    ro = rocksdict.ReadOptions()
    if rng.end is not None:
        # NB rocksdict's set_iterate_lower_bound sets the upper bound: never use it.
        ro.set_iterate_upper_bound(rng.end)
    it = cf.items(from_key=rng.start or b"", read_opt=ro)
    while chunk := list(itertools.islice(it, BATCH_ROWS)):
        keys, values = zip(*chunk, strict=True)
        yield keys, values
    del it, cf


def read_timers(path: str, ranges: list[KeyRange],
                frontiers: Mapping[int, bytes] | None = None) -> Iterator[pa.RecordBatch]:
    with open_read_only(path) as snap:
        for rng in ranges:
            shard = timer_shard(rng.cf)
            if shard is None:
                raise ValueError(f"{rng.cf} is not a timer shard")
            frontier = (frontiers or {}).get(shard)
            for keys, values in _chunks(snap, rng):
                yield decode_timers(shard, keys, values, frontier)


def count_ranges(path: str, ranges: list[KeyRange]) -> Iterator[pa.RecordBatch]:
    """One row per (column family, state) of ``ranges``: rows, key and value bytes."""
    acc: dict[tuple[str, str | None], list[int]] = {}
    with open_read_only(path) as snap:
        rule = DeliveredRule.of(snap)
        for rng in ranges:
            kind = cf_kind(rng.cf)
            fixed = {CfKind.TIMER: "SCHEDULED", CfKind.HALF: "PREPARED"}.get(kind)
            for keys, values in _chunks(snap, rng):
                key_bytes, value_bytes = sum(map(len, keys)), sum(map(len, values))
                if kind is CfKind.INDEX:
                    for state, n in index_states(values, keys, rule).items():
                        row = acc.setdefault((rng.cf, state), [0, 0, 0])
                        row[0] += n
                    # sizes per state would need a row pass: credit them to the CF's first row
                    row = acc.setdefault((rng.cf, None), [0, 0, 0])
                    row[1] += key_bytes
                    row[2] += value_bytes
                else:
                    row = acc.setdefault((rng.cf, fixed), [0, 0, 0])
                    row[0] += len(keys)
                    row[1] += key_bytes
                    row[2] += value_bytes
    if acc:
        cfs, states, rows = zip(*((cf, st, r) for (cf, st), r in sorted(
            acc.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))), strict=True)
        yield pa.RecordBatch.from_arrays(
            [pa.array(cfs, pa.string()), pa.array(states, pa.string()),
             *(pa.array([r[i] for r in rows], pa.int64()) for i in range(3))],
            schema=COUNTS_SCHEMA)


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


class TimersReader(LogicalReader):
    def __init__(self, options: Any) -> None:
        super().__init__({**dict(options), "cf": f"{CF_TIMER_PREFIX}*"})
        now = options.get("aggregate")
        self.now = None if now is None else int(now)
        self.watermarks = decode_watermarks(options.get("watermarks", ""))
        self.frontiers = {int(s): bytes.fromhex(k) for s, _, k in (
            part.partition(":") for part in options.get("frontiers", "").split(",") if part)}

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        rows = read_timers(self.path, partition.value, self.frontiers)
        if self.now is None:
            yield from rows
        else:
            yield from aggregate(rows, self.now, self.watermarks)


class TimersSource(DataSource):
    """The timer shards' slim rows (shard, deliverAt, topic, key and value size, pending).
    Options: ``partitions`` (8); ``frontiers`` (``shard:hex key,...``: sets ``pending``);
    ``aggregate`` (now, epoch ms) with ``watermarks`` (``shard:ms,...``): instead of rows,
    each task's partial aggregates (spark_jobs/timer_aggregates.py)."""

    @classmethod
    def name(cls) -> str:
        return TIMERS_FORMAT

    def schema(self) -> str:
        return AGG_DDL if self.options.get("aggregate") is not None else ddl(TIMERS_SCHEMA)

    def reader(self, schema: StructType) -> DataSourceReader:
        return TimersReader(self.options)


class CountsReader(LogicalReader):
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from count_ranges(self.path, partition.value)


class CountsSource(DataSource):
    """Rows, key and value bytes per column family and state, summed in each task (sum them
    again over the partitions). Options: ``cf`` and ``partitions`` as hourglass_logical."""

    @classmethod
    def name(cls) -> str:
        return COUNTS_FORMAT

    def schema(self) -> str:
        return ddl(COUNTS_SCHEMA)

    def reader(self, schema: StructType) -> DataSourceReader:
        return CountsReader(self.options)


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
    """Register the formats with a SparkSession (idempotent)."""
    for source in (LogicalSource, TimersSource, CountsSource, SstSource):
        spark.dataSource.register(source)
