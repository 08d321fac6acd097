"""``python -m bench.crash --kills 200``: the long crash run, with progress and a summary."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.crash.harness import CrashConfig, run
from bench.crash.retention import run_retention_kills


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.crash",
        description="kill -9 the real hourglass server N times under load (ingest, due "
                    "bursts, cancel storms, transactions, consumers), tear its CommitLog tail "
                    "now and then, and check every acknowledged message against the logs.")
    parser.add_argument("--kills", type=int, default=200, help="number of kill -9 (200)")
    parser.add_argument("--seed", type=int, help="random seed (default: random, printed)")
    parser.add_argument("--torn-every", type=int, default=4,
                        help="tear the CommitLog tail after every n-th kill (4; 0: never)")
    parser.add_argument("--burst", type=int, default=10_000,
                        help="messages due at the same instant in a burst phase (10000)")
    parser.add_argument("--storm", type=int, default=1000,
                        help="messages cancelled concurrently in a cancel-storm phase (1000)")
    parser.add_argument("--senders", type=int, default=2, help="sending client threads (2)")
    parser.add_argument("--retention-kills", type=int, default=0,
                        help="then kill -9 this many times while the log's retention deletes "
                             "segments, verifying the stopped store each time "
                             "(bench/crash/retention.py; 0: not run)")
    parser.add_argument("--workdir", type=Path,
                        help="where the data directory and server.log go (default: a new "
                             "temporary directory, kept)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hourglass-crash-"))
    print(f"crash run in {workdir} (server log: {workdir / 'server.log'})", flush=True)
    t0 = time.monotonic()

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f} s] {line}", flush=True)

    report = run(CrashConfig(workdir=workdir, kills=args.kills, seed=args.seed,
                             torn_every=args.torn_every, burst_size=args.burst,
                             storm_size=args.storm, senders=args.senders), progress)
    print(report.summary(), flush=True)
    ok = report.ok
    if args.retention_kills:
        kept = run_retention_kills(workdir / "retention", args.retention_kills, args.seed,
                                   progress)
        print(kept.summary(), flush=True)
        ok = ok and kept.ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
