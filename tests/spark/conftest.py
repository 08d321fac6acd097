"""Shared fixtures of the Spark suite: ONE SparkSession for the whole run, and known-answer
stores written as the engine writes them (support/analysis_workload.py), snapshotted."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.support.analysis_workload import Workload, WorkloadSpec, build_store, generate
from storage.snapshots import SnapshotInfo, create_snapshot

SPEC = WorkloadSpec(messages=10_000, delivered=3_000, cancelled=1_000, overdue=50)
PARTITIONS = 4


@dataclass(frozen=True)
class Generated:
    root: Path  # the data directory: rocksdb/ and snapshots/
    snapshot: SnapshotInfo
    work: Workload


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from spark_jobs.session import get_session

    session = get_session()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    """10 k messages with a known delay mixture: 3 k delivered, 1 k cancelled, 50 overdue."""
    root = tmp_path_factory.mktemp("workload")
    store, work = build_store(root / "rocksdb", SPEC)
    try:
        info = create_snapshot(store, root / "snapshots", extra={"test": "workload"},
                               now_ms=SPEC.now_ms)
    finally:
        store.close()
    return Generated(root=root, snapshot=info, work=work)


@dataclass(frozen=True)
class Series:
    root: Path
    snapshots: list[SnapshotInfo]
    works: list[Workload]


@pytest.fixture(scope="session")
def series(tmp_path_factory: pytest.TempPathFactory) -> Series:
    """Three snapshots of one open store, each after another round of sends and deliveries
    (a minute apart): counters grow, tombstones pile up."""
    root = tmp_path_factory.mktemp("series")
    first = WorkloadSpec(messages=3_000, delivered=1_000, cancelled=300, seed=1, id_prefix="a")
    store, work = build_store(root / "rocksdb", first)
    works, snaps = [work], []
    try:
        snaps.append(create_snapshot(store, root / "snapshots", extra={}, now_ms=first.now_ms))
        for n, prefix in enumerate(("b", "c"), 1):
            spec = WorkloadSpec(messages=3_000, delivered=1_500, cancelled=500, seed=1 + n,
                                id_prefix=prefix, now_ms=first.now_ms + 60_000 * n)
            works.append(generate(store, spec))
            snaps.append(create_snapshot(store, root / "snapshots", extra={},
                                         now_ms=spec.now_ms))
    finally:
        store.close()
    return Series(root=root, snapshots=snaps, works=works)


@pytest.fixture(scope="session")
def analysis(spark: Any, workload: Generated) -> dict[str, Any]:
    """The report of the workload snapshot (shared by the figure tests)."""
    from spark_jobs.analyze import run_analysis
    from spark_jobs.inputs import open_input

    report, _ = run_analysis(spark, [open_input(workload.snapshot.path)],
                             partitions=PARTITIONS)
    return report
