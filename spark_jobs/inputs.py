"""What the analysis reads: a snapshot directory, a bare checkpoint, or a Parquet export.

A snapshot (``<id>/manifest.json`` + ``<id>/db``) is read through the hourglass data sources,
so every executor must see its path (local mode, or a shared mount on a cluster). A Parquet
export (``export_parquet``) holds the same rows plus the manifest in ``snapshot.json``; copy
it to any storage the cluster reads (HDFS, S3, NFS) and analyse it without RocksDB there.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.sources import (
    COUNTS_FORMAT,
    LOGICAL_FORMAT,
    SST_FORMAT,
    TIMERS_FORMAT,
    TIMERS_SCHEMA,
    sst_rows,
)
from spark_jobs.timer_aggregates import AGG_DDL, aggregate, encode_watermarks
from storage.constants import CF_TIMER_PREFIX, ROCKSDB_DIR, SNAPSHOTS_DIR
from storage.errors import StorageError
from storage.snapshots import check_snapshot_id, open_read_only, read_manifest, resolve_db_dir

EXPORT_MARKER = "snapshot.json"
EXPORT_FORMAT = 1


@dataclass(frozen=True, kw_only=True)
class SnapshotInput:
    snapshot_id: str
    path: Path
    kind: str  # "snapshot" | "checkpoint" | "parquet"
    created_at: int  # epoch ms: the analysis's "now" for this snapshot
    manifest: dict[str, Any]  # {} for a bare checkpoint
    watermarks: dict[int, int]  # timer shard -> persisted scan watermark (deliverAt ms)
    applied_position: int | None
    timer_shards: int  # the store's timer shard count
    frontiers: dict[int, bytes] = dataclasses.field(default_factory=dict)  # shard -> scan
    #                                            frontier key (below it: delivered)
    due_scans_measured: dict[str, Any] | None = None  # a Parquet export's, taken at export

    def due_scans(self, window_ms: int) -> dict[str, Any] | None:
        """What one due scan of each shard meets (spark_jobs/due_scan.py): measured on the
        snapshot; for a Parquet export, what was measured at export time (None if that was
        another window: an export holds no RocksDB to scan)."""
        if self.kind != "parquet":
            from spark_jobs.due_scan import measure_due_scans

            return measure_due_scans(self.path, self.watermarks, self.created_at, window_ms,
                                     self.frontiers)
        measured = self.due_scans_measured
        return measured if measured and measured.get("windowMs") == window_ms else None

    def logical(self, spark: SparkSession, partitions: int, cf: str | None = None) -> DataFrame:
        """The logical rows; ``cf`` picks column families as the data source's option does."""
        if self.kind == "parquet":
            rows = spark.read.parquet(str(self.path / "logical"))
            return rows if not cf else rows.where(cf_predicate(cf))
        reader = spark.read.format(LOGICAL_FORMAT).option("partitions", str(partitions))
        if cf:
            reader = reader.option("cf", cf)
        return reader.load(str(self.path))

    def timers(self, spark: SparkSession, partitions: int) -> DataFrame:
        """The timer shards' slim rows: shard, deliver_at, topic, key_size, value_size, pending
        (at or above the shard's frontier; null for an export)."""
        if self.kind == "parquet":  # the export has no frontier: pending by watermark
            return (self.logical(spark, partitions, f"{CF_TIMER_PREFIX}*")
                    .withColumn("pending", F.lit(None).cast("boolean"))
                    .select(*TIMERS_SCHEMA.names))
        return (spark.read.format(TIMERS_FORMAT).option("partitions", str(partitions))
                .option("frontiers", self._frontiers_option()).load(str(self.path)))

    def _frontiers_option(self) -> str:
        return ",".join(f"{s}:{k.hex()}" for s, k in sorted(self.frontiers.items()))

    def timer_aggregates(self, spark: SparkSession, partitions: int) -> DataFrame:
        """The timer shards folded into partial aggregates inside the tasks
        (spark_jobs/timer_aggregates.py): a few rows per task, not one per key."""
        if self.kind == "parquet":
            now, marks = self.created_at, dict(self.watermarks)
            return self.timers(spark, partitions).mapInArrow(
                lambda batches: aggregate(batches, now, marks), AGG_DDL)
        return (spark.read.format(TIMERS_FORMAT).option("partitions", str(partitions))
                .option("aggregate", str(self.created_at))
                .option("watermarks", encode_watermarks(self.watermarks))
                .option("frontiers", self._frontiers_option())
                .load(str(self.path)))

    def cf_counts(self, spark: SparkSession, partitions: int, cf: str) -> DataFrame:
        """Rows, key and value bytes per column family and state of the CFs ``cf`` picks,
        summed in the tasks (one small row per partition and state, not one per key)."""
        if self.kind == "parquet":
            return (self.logical(spark, partitions, cf).groupBy("cf", "state")
                    .agg(F.count("*").alias("rows"), F.sum("key_size").alias("key_bytes"),
                         F.sum("value_size").alias("value_bytes")))
        return (spark.read.format(COUNTS_FORMAT).option("partitions", str(partitions))
                .option("cf", cf).load(str(self.path)))

    def sst_list(self, spark: SparkSession) -> list[dict[str, Any]]:
        """The SST rows as dicts: read on the driver for a snapshot (a few rows: no Spark
        job), from the export's Parquet otherwise."""
        if self.kind == "parquet":
            return [r.asDict() for r in self.ssts(spark).collect()]
        rows: list[dict[str, Any]] = sst_rows(str(resolve_db_dir(self.path))).to_pylist()
        return rows

    def ssts(self, spark: SparkSession) -> DataFrame:
        if self.kind == "parquet":
            return spark.read.parquet(str(self.path / "sst"))
        return spark.read.format(SST_FORMAT).load(str(self.path))

    def describe(self) -> dict[str, Any]:
        return {"snapshotId": self.snapshot_id, "path": str(self.path), "kind": self.kind,
                "createdAt": self.created_at, "appliedPosition": self.applied_position,
                "timerShards": self.timer_shards,
                "watermarks": {str(k): v for k, v in sorted(self.watermarks.items())}}


def cf_predicate(spec: str) -> Column:
    """``select_cfs``'s comma list (names, ``prefix*``, ``!`` to exclude) as a filter."""
    def match(pattern: str) -> Column:
        return (F.col("cf").startswith(pattern[:-1]) if pattern.endswith("*")
                else F.col("cf") == pattern)

    parts = [p.strip() for p in spec.split(",") if p.strip()]
    include = [match(p) for p in parts if not p.startswith("!")]
    exclude = [match(p[1:].strip()) for p in parts if p.startswith("!")]
    predicate = functools.reduce(operator.or_, include) if include else F.lit(True)
    for column in exclude:
        predicate = predicate & ~column
    return predicate


class DamagedSnapshot(ValueError):
    """A snapshot whose files do not match what its manifest (or its own MANIFEST) lists."""


def open_input(path: str | Path) -> SnapshotInput:
    """Recognise what ``path`` is; a clear FileNotFoundError when it is none of the three, a
    DamagedSnapshot naming the file when an SST is missing or not the size recorded."""
    path = Path(path)
    if (path / EXPORT_MARKER).is_file():
        return _from_export(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such snapshot")
    refuse_data_dir(path)
    try:
        db_dir = resolve_db_dir(path)
    except LookupError as exc:
        raise FileNotFoundError(
            f"{path} is not a snapshot, a RocksDB checkpoint or a Parquet export") from exc
    manifest = read_manifest(path)
    check_files(db_dir, manifest)
    try:
        with open_read_only(db_dir) as snap:
            meta = snap.meta()  # the checkpoint's own (the manifest recorded the same)
            check_files(db_dir, {"rocksdb": {"liveFiles": [
                {"name": str(f["name"]).lstrip("/"), "size": int(f["size"])}
                for f in snap.db.live_files()]}})
            shard_cfs = sum(1 for n in snap.cf_names if n.startswith(CF_TIMER_PREFIX))
    except StorageError as exc:
        why = " ".join(exc.detail.split())  # RocksDB's message may span lines
        raise DamagedSnapshot(f"{path}: RocksDB cannot open it: {why}") from exc
    if manifest:
        created_at = int(manifest["createdAt"])
        snapshot_id = check_snapshot_id(manifest.get("snapshotId", path.name))
    else:  # a bare checkpoint: its CURRENT file was written when it was taken
        created_at = int((db_dir / "CURRENT").stat().st_mtime * 1000)
        snapshot_id = path.resolve().name  # the directory's own name: never ".."
    return SnapshotInput(
        snapshot_id=snapshot_id, path=path, kind="snapshot" if manifest else "checkpoint",
        created_at=created_at, manifest=manifest,
        watermarks={int(k): int(v) for k, v in meta.get("watermarks", {}).items()},
        applied_position=meta.get("appliedPosition"),
        timer_shards=int(meta.get("timerShards") or shard_cfs),
        frontiers={int(k): bytes.fromhex(v) for k, v in meta.get("frontiers", {}).items()},
    )


def refuse_data_dir(path: Path) -> None:
    """A server's data directory is not a snapshot: say which directory to give instead."""
    if (path / ROCKSDB_DIR / "CURRENT").is_file():
        raise FileNotFoundError(
            f"{path} is a data directory, not a snapshot: give {path / SNAPSHOTS_DIR} (every "
            f"snapshot in it) or one snapshot directory inside it")


def check_files(db_dir: Path, manifest: dict[str, Any]) -> None:
    """Every SST the manifest lists is there with its recorded size (before Spark starts:
    a truncated file otherwise fails deep inside a task)."""
    for f in manifest.get("rocksdb", {}).get("liveFiles", []):
        file = db_dir / str(f["name"])
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            raise DamagedSnapshot(f"{file} is missing (the snapshot's manifest lists it, "
                                  f"{int(f['size']):,} bytes)") from None
        if size != int(f["size"]):
            raise DamagedSnapshot(f"{file} is {size:,} bytes, the snapshot's manifest says "
                                  f"{int(f['size']):,}: the snapshot is damaged (truncated or "
                                  "overwritten)")


def _from_export(path: Path) -> SnapshotInput:
    data = json.loads((path / EXPORT_MARKER).read_text(encoding="utf-8"))
    if data.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{path}: unknown export format {data.get('format')!r}")
    return SnapshotInput(
        snapshot_id=check_snapshot_id(data.get("snapshotId")), path=path, kind="parquet",
        created_at=int(data["createdAt"]), manifest=data.get("manifest") or {},
        watermarks={int(k): int(v) for k, v in data.get("watermarks", {}).items()},
        applied_position=data.get("appliedPosition"),
        timer_shards=int(data.get("timerShards") or len(data.get("watermarks", {})) or 1),
        due_scans_measured=data.get("dueScans"),
    )


def export_parquet(spark: SparkSession, source: SnapshotInput, out_dir: str | Path,
                   partitions: int, window_ms: int) -> Path:
    """Write the logical and SST rows of ``source`` as Parquet under ``out_dir/<snapshot id>``
    (replacing an earlier export of the same snapshot); returns that directory."""
    dest = Path(out_dir) / source.snapshot_id
    if dest.resolve().parent != Path(out_dir).resolve():  # an id is a name, never a path
        raise ValueError(f"snapshot id {source.snapshot_id!r} is not a plain name")
    source.logical(spark, partitions).write.mode("overwrite").parquet(str(dest / "logical"))
    source.ssts(spark).coalesce(1).write.mode("overwrite").parquet(str(dest / "sst"))
    marker = {"format": EXPORT_FORMAT, **source.describe(), "manifest": source.manifest,
              "dueScans": source.due_scans(window_ms)}
    (dest / EXPORT_MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True),
                                      encoding="utf-8")
    return dest
