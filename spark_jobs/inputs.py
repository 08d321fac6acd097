"""What the analysis reads: a snapshot directory, a bare checkpoint, or a Parquet export.

A snapshot (``<id>/manifest.json`` + ``<id>/db``) is read through the hourglass data sources,
so every executor must see its path (local mode, or a shared mount on a cluster). A Parquet
export (``export_parquet``) holds the same rows plus the manifest in ``snapshot.json``; copy
it to any storage the cluster reads (HDFS, S3, NFS) and analyse it without RocksDB there.
"""

from __future__ import annotations

import functools
import json
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.sources import LOGICAL_FORMAT, SST_FORMAT
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

    def logical(self, spark: SparkSession, partitions: int, cf: str | None = None) -> DataFrame:
        """The logical rows; ``cf`` picks column families as the data source's option does."""
        if self.kind == "parquet":
            rows = spark.read.parquet(str(self.path / "logical"))
            return rows if not cf else rows.where(cf_predicate(cf))
        reader = spark.read.format(LOGICAL_FORMAT).option("partitions", str(partitions))
        if cf:
            reader = reader.option("cf", cf)
        return reader.load(str(self.path))

    def ssts(self, spark: SparkSession) -> DataFrame:
        if self.kind == "parquet":
            return spark.read.parquet(str(self.path / "sst"))
        return spark.read.format(SST_FORMAT).load(str(self.path))

    def describe(self) -> dict[str, Any]:
        return {"snapshotId": self.snapshot_id, "path": str(self.path), "kind": self.kind,
                "createdAt": self.created_at, "appliedPosition": self.applied_position,
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


def open_input(path: str | Path) -> SnapshotInput:
    """Recognise what ``path`` is; a clear FileNotFoundError when it is none of the three."""
    path = Path(path)
    if (path / EXPORT_MARKER).is_file():
        return _from_export(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such snapshot")
    try:
        db_dir = resolve_db_dir(path)
    except LookupError as exc:
        raise FileNotFoundError(
            f"{path} is not a snapshot, a RocksDB checkpoint or a Parquet export") from exc
    manifest = read_manifest(path)
    meta = manifest.get("rocksdb", {}).get("meta")
    if meta is None:
        with open_read_only(db_dir) as snap:
            meta = snap.meta()
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
    )


def _from_export(path: Path) -> SnapshotInput:
    data = json.loads((path / EXPORT_MARKER).read_text(encoding="utf-8"))
    if data.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{path}: unknown export format {data.get('format')!r}")
    return SnapshotInput(
        snapshot_id=check_snapshot_id(data.get("snapshotId")), path=path, kind="parquet",
        created_at=int(data["createdAt"]), manifest=data.get("manifest") or {},
        watermarks={int(k): int(v) for k, v in data.get("watermarks", {}).items()},
        applied_position=data.get("appliedPosition"),
    )


def export_parquet(spark: SparkSession, source: SnapshotInput, out_dir: str | Path,
                   partitions: int) -> Path:
    """Write the logical and SST rows of ``source`` as Parquet under ``out_dir/<snapshot id>``
    (replacing an earlier export of the same snapshot); returns that directory."""
    dest = Path(out_dir) / source.snapshot_id
    if dest.resolve().parent != Path(out_dir).resolve():  # an id is a name, never a path
        raise ValueError(f"snapshot id {source.snapshot_id!r} is not a plain name")
    source.logical(spark, partitions).write.mode("overwrite").parquet(str(dest / "logical"))
    source.ssts(spark).coalesce(1).write.mode("overwrite").parquet(str(dest / "sst"))
    marker = {"format": EXPORT_FORMAT, **source.describe(), "manifest": source.manifest}
    (dest / EXPORT_MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True),
                                      encoding="utf-8")
    return dest
