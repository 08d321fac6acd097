"""``python -m bench.soak --minutes 5``: see bench/soak/__init__.py."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from bench.soak.harness import SoakConfig, run
from bench.soak.plot import plot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="Steady sends, deliveries and pulls against the real server; RSS and "
                    "lateness sampled every second; a verdict and a PNG plot.")
    parser.add_argument("--minutes", type=float, default=5.0, help="duration (5)")
    parser.add_argument("--rate", type=int, default=2000, help="messages/s sent (2000)")
    parser.add_argument("--p99-ms", type=float, default=5.0, help="lateness p99 target (5)")
    parser.add_argument("--max-growth", type=float, default=0.10,
                        help="allowed RssAnon growth, last third vs first third (0.10)")
    parser.add_argument("--max-growth-mib", type=float, default=32.0,
                        help="... or this many MiB, whichever is larger (32)")
    parser.add_argument("--rocksdb-buffers", choices=("small", "default"), default="small",
                        help="small: memtables and block cache shrunk so they are in steady "
                             "state within a minute and growth means a leak (default); "
                             "default: the stock sizes (fill for tens of minutes)")
    parser.add_argument("--segment-size", default="64MiB",
                        help="CommitLog segment size (64MiB)")
    parser.add_argument("--retention", default=None,
                        help='commitlog_retention_ms, e.g. "5m" (default: the server\'s, 72h)')
    parser.add_argument("--status-retention", default=None,
                        help='retention_ms (final statuses, their index and ledger entries), '
                             'e.g. "5m" (default: the server\'s, 72h)')
    parser.add_argument("--max-data-growth-mib", type=float, default=None,
                        help="with --retention: allowed growth of the data directory, last "
                             "third vs first third (default: not judged)")
    parser.add_argument("--workdir", type=Path, help="data directory and server log "
                        "(default: a new temporary directory)")
    parser.add_argument("--plot", type=Path, help="PNG path (default: WORKDIR/soak.png)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hourglass-soak-"))
    config = SoakConfig(seconds=args.minutes * 60, rate=args.rate, p99_ms=args.p99_ms,
                        max_growth=args.max_growth, max_growth_mib=args.max_growth_mib,
                        workdir=workdir, small_buffers=args.rocksdb_buffers == "small",
                        settings={"segment_size": args.segment_size,
                                  **({"commitlog_retention_ms": args.retention}
                                     if args.retention else {}),
                                  **({"retention_ms": args.status_retention}
                                     if args.status_retention else {})},
                        max_data_growth_mib=args.max_data_growth_mib)
    print(f"soak for {args.minutes:g} min at {args.rate} msgs/s in {workdir}", flush=True)
    report = run(config, progress=lambda line: print(line, flush=True))
    png = args.plot or workdir / "soak.png"
    kept = (f", {args.segment_size} segments, {args.retention} retention" if args.retention
            else "")
    plot(report, png, f"hourglass soak: {args.minutes:g} min at {args.rate:,} msgs/s{kept} "
                      f"(2 cores, shared)")
    (workdir / "soak.json").write_text(json.dumps(
        {**asdict(report), "ok": report.ok}, indent=1, default=str))
    print(report.summary())
    print(f"plot: {png}; samples: {workdir / 'soak.json'}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
