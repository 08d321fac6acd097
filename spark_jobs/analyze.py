"""``hourglass analyze SNAPSHOT... --out DIR``: the compaction-impact analysis.

Also a spark-submit entry point (ship the code as a zip)::

    spark-submit --master spark://HOST:7077 --py-files hourglass.zip \\
        spark_jobs/analyze.py /mnt/nfs/snapshots/ID --out /mnt/nfs/report

Each SNAPSHOT is a snapshot directory, a bare RocksDB checkpoint, a Parquet export, or a
snapshot root (``DATA_DIR/snapshots``: every snapshot in it, oldest first). Several make a
series: write amplification between them and trends.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file (spark-submit): keep siblings from shadowing modules
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]

import argparse
import dataclasses
import importlib
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

ANALYSIS_FORMAT = 1
DEFAULT_WINDOW_MS = 1000
#: what the analysis imports beyond the server's own dependencies (the ``analysis`` extra)
ANALYSIS_MODULES = ("pyspark", "pandas", "matplotlib")
INSTALL_HINT = "pip install 'hourglass[analysis]'"


def missing_modules() -> list[str]:
    """The analysis's dependencies that cannot be imported here."""
    missing = []
    for name in ANALYSIS_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


class Progress:
    """Stage-by-stage progress on stderr: what runs now, and how long each stage took."""

    def __init__(self, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.t0 = time.perf_counter()
        self.timings: dict[str, float] = {}

    def stage(self, name: str, label: str) -> _Stage:
        return _Stage(self, name, label)

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"[analyze {time.perf_counter() - self.t0:7.1f}s] {text}", file=self.stream,
                  flush=True)


class _Stage:
    def __init__(self, progress: Progress, name: str, label: str) -> None:
        self.p, self.name, self.label = progress, name, label

    def __enter__(self) -> None:
        self.start = time.perf_counter()
        self.p.say(f"{self.label} ...")

    def __exit__(self, exc_type: object, *_: object) -> None:
        took = time.perf_counter() - self.start
        self.p.timings[self.name] = round(took, 3)
        if exc_type is None:
            self.p.say(f"{self.label}: done in {took:.1f} s")


def expand_inputs(paths: Sequence[str]) -> list[Any]:
    """SnapshotInputs for the paths, oldest first; a snapshot root expands to its snapshots."""
    from spark_jobs.inputs import EXPORT_MARKER, open_input, refuse_data_dir
    from storage.snapshots import list_snapshots

    found = []
    for raw in paths:
        path = Path(raw)
        refuse_data_dir(path)
        if path.is_dir() and not (path / "CURRENT").exists() \
                and not (path / "db").exists() and not (path / EXPORT_MARKER).exists():
            snaps = list_snapshots(path)
            if not snaps:
                raise FileNotFoundError(f"{path}: no snapshots in this directory")
            found += [open_input(s.path) for s in snaps]
        else:
            found.append(open_input(path))
    return sorted(found, key=lambda s: (s.created_at, s.snapshot_id))


def analyse_snapshot(spark: Any, source: Any, *, partitions: int, window_ms: int,
                     progress: Progress, index: str) -> tuple[dict[str, Any], list[dict]]:
    """Every figure of one snapshot; also returns its SST rows (for the charts)."""
    from spark_jobs.logical_figures import Horizons, logical_figures
    from spark_jobs.physical_figures import physical_figures
    from storage.constants import CF_TIMER_PREFIX

    with progress.stage(f"{source.snapshot_id}/sst", f"{index} SST files"):
        ssts = source.sst_list(spark)
    with progress.stage(f"{source.snapshot_id}/logical",
                        f"{index} logical rows: due load, value sizes, topics (Spark)"):
        logical = logical_figures(source.timer_aggregates(spark, partitions),
                                  source.cf_counts(spark, partitions, f"!{CF_TIMER_PREFIX}*"),
                                  source.created_at, Horizons(), source.timer_shards)
    with progress.stage(f"{source.snapshot_id}/due-scan",
                        f"{index} one due scan per shard, with RocksDB's counters"):
        due_scans = source.due_scans(window_ms)
    with progress.stage(f"{source.snapshot_id}/physical",
                        f"{index} tombstones, space and read amplification"):
        physical = physical_figures(ssts, logical["counts"]["byCf"], source.manifest,
                                    source.watermarks, source.created_at, window_ms, due_scans)
    physical["files"] = [{**f, "start_key": bytes(f["start_key"]).hex(),
                          "end_key": bytes(f["end_key"]).hex()} for f in ssts]
    return {"snapshot": source.describe(), "logical": logical, "physical": physical}, ssts


def run_analysis(spark: Any, sources: Sequence[Any], *, thresholds: Any = None,
                 partitions: int = 8, window_ms: int = DEFAULT_WINDOW_MS,
                 progress: Progress | None = None) -> tuple[dict[str, Any], list[dict]]:
    """The whole report over ``sources`` (oldest first); also the latest snapshot's SSTs."""
    from spark_jobs import rules as rules_module
    from spark_jobs.rules import Thresholds, evaluate
    from spark_jobs.series import series_figures

    thresholds = thresholds or Thresholds()
    progress = progress or Progress(quiet=True)
    reports: list[dict[str, Any]] = []
    ssts: list[dict[str, Any]] = []
    for n, source in enumerate(sources, 1):
        report, ssts = analyse_snapshot(spark, source, partitions=partitions,
                                        window_ms=window_ms, progress=progress,
                                        index=f"[{n}/{len(sources)}] {source.snapshot_id}:")
        reports.append(report)
    series = series_figures(reports)
    findings = evaluate(reports[-1], series, thresholds)
    return {
        "format": ANALYSIS_FORMAT,
        "generatedAt": datetime.now(UTC).isoformat(timespec="seconds"),
        "parameters": {"windowMs": window_ms, "partitions": partitions,
                       "thresholds": dataclasses.asdict(thresholds),
                       "master": spark.sparkContext.master,
                       "code": str(Path(rules_module.__file__ or "").parent)},  # which copy ran
        "snapshots": reports,
        "series": series,
        "rules": [f.as_dict() for f in findings],
        "recommendations": [f.as_dict() for f in findings if f.fired],
        "timingsSeconds": progress.timings,
    }, ssts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hourglass analyze",
                                description=(__doc__ or "").replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("snapshots", nargs="+", metavar="SNAPSHOT")
    p.add_argument("--out", required=True, help="directory for report.json and report.html")
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[2])")
    p.add_argument("--partitions", type=int, default=0,
                   help="key-range partitions per snapshot (default: 2 x Spark parallelism)")
    p.add_argument("--window-ms", type=int, default=DEFAULT_WINDOW_MS,
                   help="due window of the read-amplification figure (default 1000)")
    p.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                   help="override a recommendation threshold (see docs/analysis.md)")
    p.add_argument("--export-parquet", metavar="DIR",
                   help="also write each snapshot's rows as Parquet under DIR/<snapshot id>")
    p.add_argument("--no-html", action="store_true", help="write report.json only")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    missing = missing_modules()
    if missing:
        print(f"hourglass analyze: needs {', '.join(missing)}, not installed here; install "
              f"the analysis extra: {INSTALL_HINT}", file=sys.stderr)
        return 2
    progress = Progress(quiet=args.quiet)
    from spark_jobs.inputs import DamagedSnapshot
    from spark_jobs.rules import Thresholds

    try:
        overrides = dict(_split_override(o) for o in args.threshold)
        thresholds = Thresholds().with_overrides(overrides)
        if args.window_ms <= 0 or args.partitions < 0:
            raise ValueError("--window-ms must be > 0 and --partitions >= 0")
        sources = expand_inputs(args.snapshots)
    except DamagedSnapshot as exc:  # checked before Spark starts: nothing written
        print(f"hourglass analyze: {exc}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, LookupError) as exc:
        print(f"hourglass analyze: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    from spark_jobs.session import get_session

    with progress.stage("session", "starting Spark"):
        spark = get_session(args.master)
    partitions = args.partitions or 2 * spark.sparkContext.defaultParallelism
    progress.say(f"master {spark.sparkContext.master}, {len(sources)} snapshot(s), "
                 f"{partitions} partitions each")
    if args.export_parquet:
        from spark_jobs.inputs import export_parquet

        for source in sources:
            with progress.stage(f"{source.snapshot_id}/export", f"exporting {source.snapshot_id}"):
                dest = export_parquet(spark, source, args.export_parquet, partitions,
                                      args.window_ms)
            progress.say(f"Parquet export: {dest}")
    report, ssts = run_analysis(spark, sources, thresholds=thresholds, partitions=partitions,
                                window_ms=args.window_ms, progress=progress)
    from spark_jobs.report import console_summary, render_charts, write_html, write_json

    out_dir.mkdir(parents=True, exist_ok=True)  # only now: a failed run leaves nothing
    if not args.no_html:
        with progress.stage("charts", "charts and report.html"):
            write_html(report, render_charts(report, ssts), out_dir)
    write_json(report, out_dir)
    print(console_summary(report))
    progress.say(f"wrote {out_dir / 'report.json'}"
                 + ("" if args.no_html else f" and {out_dir / 'report.html'}"))
    return 0


def _split_override(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"--threshold wants NAME=VALUE, not {text!r}")
    return name.strip(), value.strip()


if __name__ == "__main__":
    sys.exit(main())
