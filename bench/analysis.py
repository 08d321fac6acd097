"""``python -m bench.analysis``: time the compaction-impact analysis of a 1 M-message snapshot.

Builds a store as the engine writes it (bench/analysis_workload.py: 1 M messages, 30 %
delivered, 10 % cancelled, a known delay mixture with a burst second), snapshots it, starts a
local Spark session, runs the analysis once to warm it (JIT, Python workers), then times
``--repeat`` runs on the warm session. Prints the figures and, with ``--json``, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.analysis_workload import WorkloadSpec, build_store

BENCH_BODY_SIZES = ((100, 0.8), (512, 0.15), (4_096, 0.05))


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
    sst_bytes = sum(f.stat().st_size for f in info.db_path.glob("*.sst"))
    return info.path, {"messages": messages, "shards": shards, "buildSeconds": round(built, 1),
                       "sstBytes": sst_bytes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.analysis", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--partitions", type=int, default=0, help="default: 2 x parallelism")
    p.add_argument("--snapshot", type=Path, help="analyse this snapshot instead of building one")
    p.add_argument("--keep", type=Path, metavar="DIR",
                   help="build the store in DIR and keep it (reuse with --snapshot)")
    p.add_argument("--master", help="Spark master (default local[2])")
    p.add_argument("--json", action="store_true", help="also print one JSON line of results")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.messages < 1_000 or args.repeat < 1:
        p.error("--messages must be >= 1000 and --repeat >= 1")

    with tempfile.TemporaryDirectory(prefix="hourglass-bench-analysis-") as tmp:
        built: dict[str, Any] = {}
        if args.snapshot:
            snapshot = args.snapshot
            built["sstBytes"] = sum(f.stat().st_size for f in snapshot.glob("db/*.sst"))
        else:
            print(f"building a {args.messages:,}-message store ...", file=sys.stderr)
            snapshot, built = build_snapshot(args.keep or Path(tmp), args.messages, args.shards)
            print(f"snapshot: {snapshot}", file=sys.stderr)
        results = run(snapshot, args)
    results.update(built)
    print(f"analysis of {results.get('messages', args.messages):,} messages "
          f"({results['rows']:,} logical rows, {results.get('sstBytes', 0) / 2**20:.1f} MiB SST), "
          f"master {results['master']}, {results['partitions']} partitions")
    print(f"  session start      {results['sessionSeconds']:.1f} s")
    print(f"  first run (cold)   {results['coldSeconds']:.1f} s")
    print(f"  warm runs          {', '.join(f'{t:.1f}' for t in results['warmSeconds'])} s "
          f"(median {results['warmMedianSeconds']:.1f} s, "
          f"{results['rows'] / results['warmMedianSeconds']:,.0f} rows/s)")
    print(f"  logical scan only  {results['scanSeconds']:.1f} s (count of every row)")
    print("  stages (last run)  " + ", ".join(f"{k.split('/')[-1]} {v:.1f} s"
                                              for k, v in results["stages"].items()))
    if args.json:
        print(json.dumps(results, sort_keys=True))
    return 0


def run(snapshot: Path, args: argparse.Namespace) -> dict[str, Any]:
    from spark_jobs.analyze import Progress, run_analysis
    from spark_jobs.inputs import open_input
    from spark_jobs.session import get_session

    t0 = time.perf_counter()
    spark = get_session(args.master, app_name="hourglass-bench-analysis")
    session = time.perf_counter() - t0
    partitions = args.partitions or 2 * spark.sparkContext.defaultParallelism
    source = open_input(snapshot)
    try:
        t0 = time.perf_counter()
        run_analysis(spark, [source], partitions=partitions)
        cold = time.perf_counter() - t0
        warm, progress = [], Progress(quiet=True)
        for _ in range(args.repeat):
            progress = Progress(quiet=True)
            t0 = time.perf_counter()
            run_analysis(spark, [source], partitions=partitions, progress=progress)
            warm.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rows = source.logical(spark, partitions).count()
        scan = time.perf_counter() - t0
        return {"master": spark.sparkContext.master, "partitions": partitions, "rows": rows,
                "sessionSeconds": session, "coldSeconds": cold,
                "warmSeconds": [round(t, 2) for t in warm],
                "warmMedianSeconds": statistics.median(warm), "scanSeconds": scan,
                "stages": progress.timings}
    finally:
        spark.stop()


if __name__ == "__main__":
    raise SystemExit(main())
