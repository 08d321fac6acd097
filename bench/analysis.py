"""``hourglass bench analysis --keys N``: the compaction-impact analysis of an N-key snapshot,
as ``hourglass analyze`` runs it, with a breakdown of where the time goes.

Builds a store as the engine writes it (support/analysis_workload.py: 30 % of the messages
delivered with consume-queue entries, 10 % cancelled, 1 % overdue, a known delay mixture with a
burst second; 80 % 100 B, 15 % 512 B, 5 % 4 KiB bodies) of about N keys in all column families
(N / 1.9 messages: each leaves an index entry, 60 % a timer key, 30 % a consume-queue entry),
snapshots it, then times one whole run on a fresh local Spark session: session start, SST
rows, the logical pass (timer shards and the other CFs' counts), the due scans, the physical
figures, the rules, the charts and report.html. Samples the resident memory of the whole
process tree (this Python, the JVM, the Python workers) every 0.2 s and reports its peak.
``--repeat`` adds runs on the warm session. Prints the figures and, with ``--json``, one JSON
line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.support.analysis_workload import WorkloadSpec, build_store

BENCH_BODY_SIZES = ((100, 0.8), (512, 0.15), (4_096, 0.05))
KEYS_PER_MESSAGE = 1.9  # index entry + 0.6 timer key + 0.3 consume-queue entry


def build_snapshot(root: Path, messages: int, shards: int) -> tuple[Path, dict[str, Any]]:
    from storage.snapshots import create_snapshot

    spec = WorkloadSpec(messages=messages, delivered=messages * 3 // 10,
                        cancelled=messages // 10, overdue=min(1_000, messages // 100),
                        shards=shards, body_sizes=BENCH_BODY_SIZES, batch_size=10_000)
    t0 = time.perf_counter()
    store, _ = build_store(root / "rocksdb", spec)
    built = time.perf_counter() - t0
    try:
        info = create_snapshot(store, root / "snapshots", extra={"bench": "analysis"},
                               now_ms=spec.now_ms)
    finally:
        store.close()
    return info.path, {"messages": messages, "shards": shards, "buildSeconds": round(built, 1)}


class PeakMemory:
    """Peak resident memory of this process and all its descendants, sampled in a thread."""

    def __init__(self, interval: float = 0.2) -> None:
        import psutil

        self.root = psutil.Process()
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        import psutil

        total = 0
        for proc in [self.root, *self.root.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except psutil.Error:  # gone between listing and reading
                continue
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self._sample())

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) used so far by the living process tree."""
        import psutil

        total = 0.0
        for proc in [self.root, *self.root.children(recursive=True)]:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hourglass bench analysis", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000,
                   help="keys in the snapshot, all column families (default 1 000 000)")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--repeat", type=int, default=0, help="warm runs after the first")
    p.add_argument("--partitions", type=int, default=0, help="default: 2 x parallelism")
    p.add_argument("--snapshot", type=Path, help="analyse this snapshot instead of building one")
    p.add_argument("--keep", type=Path, metavar="DIR",
                   help="build the store in DIR and keep it (reuse with --snapshot)")
    p.add_argument("--master", help="Spark master (default local[2])")
    p.add_argument("--json", action="store_true", help="also print one JSON line of results")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.keys < 2_000 or args.repeat < 0:
        p.error("--keys must be >= 2000 and --repeat >= 0")

    with tempfile.TemporaryDirectory(prefix="hourglass-bench-analysis-") as tmp:
        built: dict[str, Any] = {}
        if args.snapshot:
            snapshot = args.snapshot
        else:
            messages = round(args.keys / KEYS_PER_MESSAGE)
            print(f"building a store of about {args.keys:,} keys ({messages:,} messages) ...",
                  file=sys.stderr)
            snapshot, built = build_snapshot(args.keep or Path(tmp), messages, args.shards)
            print(f"snapshot: {snapshot} (built in {built['buildSeconds']} s)", file=sys.stderr)
        results = run(snapshot, args, Path(tmp))
    results.update(built)
    print(report(results))
    if args.json:
        print(json.dumps(results, sort_keys=True))
    return 0


def _cpu_progress(memory: PeakMemory) -> Any:
    """A quiet Progress that also records the process tree's CPU seconds per stage."""
    from contextlib import contextmanager

    from spark_jobs.analyze import Progress

    class CpuProgress(Progress):
        def __init__(self) -> None:
            super().__init__(quiet=True)
            self.cpu: dict[str, float] = {}

        @contextmanager  # type: ignore[override]
        def stage(self, name: str, label: str) -> Any:
            before = memory.cpu_seconds()
            with super().stage(name, label):
                yield
            self.cpu[name.split("/")[-1]] = round(memory.cpu_seconds() - before, 2)

    return CpuProgress()


def run(snapshot: Path, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    from spark_jobs.analyze import run_analysis
    from spark_jobs.inputs import open_input
    from spark_jobs.report import render_charts, write_html, write_json
    from spark_jobs.session import get_session

    source = open_input(snapshot)
    runs: list[dict[str, Any]] = []
    with PeakMemory() as memory:
        t_start, cpu_start = time.perf_counter(), memory.cpu_seconds()
        spark = get_session(args.master, app_name="hourglass-bench-analysis")
        session = time.perf_counter() - t_start
        session_cpu = memory.cpu_seconds() - cpu_start
        partitions = args.partitions or 2 * spark.sparkContext.defaultParallelism
        try:
            for _ in range(1 + args.repeat):
                progress = _cpu_progress(memory)
                t0, c0 = time.perf_counter(), memory.cpu_seconds()
                report_, ssts = run_analysis(spark, [source], partitions=partitions,
                                             progress=progress)
                t1, c1 = time.perf_counter(), memory.cpu_seconds()
                write_html(report_, render_charts(report_, ssts), scratch)
                write_json(report_, scratch)
                t2, c2 = time.perf_counter(), memory.cpu_seconds()
                runs.append({"analysisSeconds": t1 - t0, "chartsSeconds": t2 - t1,
                             "stages": {k.split("/")[-1]: v for k, v in progress.timings.items()},
                             "stagesCpu": progress.cpu, "analysisCpu": round(c1 - c0, 2),
                             "chartsCpu": round(c2 - c1, 2), "totalSeconds": t2 - t0})
            master = spark.sparkContext.master
        finally:
            spark.stop()
        first_total = session + runs[0]["totalSeconds"]
    counts = report_["snapshots"][0]["logical"]["counts"]["byCf"]
    return {"master": master, "partitions": partitions,
            "keys": sum(c["rows"] for c in counts.values()),
            "sstBytes": report_["snapshots"][0]["physical"]["sst"]["bytes"],
            "sessionSeconds": round(session, 2), "sessionCpu": round(session_cpu, 2),
            "firstRunSeconds": round(first_total, 2),
            "runs": runs, "peakTreeRssBytes": memory.peak}


def report(r: dict[str, Any]) -> str:
    first = r["runs"][0]
    stages = [(name, seconds, first["stagesCpu"].get(name, 0.0))
              for name, seconds in first["stages"].items()]
    rest = first["analysisSeconds"] - sum(first["stages"].values())
    rest_cpu = first["analysisCpu"] - sum(first["stagesCpu"].values())
    lines = [
        f"analysis of a {r['keys']:,}-key snapshot ({r['sstBytes'] / 2**20:.1f} MiB SST), "
        f"master {r['master']}, {r['partitions']} partitions",
        f"  whole first run      {r['firstRunSeconds']:.1f} s (session start included), "
        f"peak memory of the process tree {r['peakTreeRssBytes'] / 2**30:.2f} GiB",
        f"  {'stage':<20} {'wall s':>7} {'CPU s':>7}  (CPU: this process, the JVM, workers)",
        f"  {'session start':<20} {r['sessionSeconds']:>7.1f} {r['sessionCpu']:>7.1f}",
        *(f"  {name:<20} {wall:>7.1f} {cpu:>7.1f}" for name, wall, cpu in stages),
        f"  {'rules, series':<20} {rest:>7.1f} {rest_cpu:>7.1f}",
        f"  {'charts, report':<20} {first['chartsSeconds']:>7.1f} {first['chartsCpu']:>7.1f}",
        f"  keys per second      {r['keys'] / first['analysisSeconds']:,.0f} wall, "
        f"{r['keys'] / max(first['analysisCpu'], 1e-9):,.0f} per CPU-s (analysis only)",
    ]
    lines += [f"  warm run {n}           {w['totalSeconds']:.1f} s wall, "
              f"{w['analysisCpu'] + w['chartsCpu']:.1f} CPU-s "
              f"({', '.join(f'{k} {v:.1f}' for k, v in w['stages'].items())})"
              for n, w in enumerate(r["runs"][1:], 1)]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
