"""``hourglass bench storage``: raw speed of the storage layer.

Measures, each on fresh files in a temporary directory (or ``--dir``):
- batched puts/s into one timer CF (batches of ``--batch``, 100-byte values, ``--keys`` keys);
- the due-scan rate: ``TimerIndex.due`` (scheduler/timer_index.py) in pages of ``--batch``
  over every key;
- batched deletes/s and the time of ``cleanup_prefix`` over the deleted prefix;
- CommitLog appends: records/s and MB/s of payload for ``--record-size`` records in batches
  of ``--batch`` (flush policy async), plus the same with ``--sync-records`` under "sync".
Keys and payloads are built before the clock starts: the figures are the store's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scheduler.timer_index import TimerIndex
from storage.commitlog import CommitLog
from storage.constants import timer_cf
from storage.keys import encode_timer_key
from storage.rocks import RocksStore

TARGET_PUTS = 1_000_000
TARGET_RECORDS = 1_000_000


class Progress:
    """One self-overwriting progress line on stderr."""

    def __init__(self, quiet: bool) -> None:
        self._quiet = quiet
        self._last = 0.0

    def __call__(self, what: str, done: int, total: int) -> None:
        now = time.perf_counter()
        done = min(done, total)
        if self._quiet or (done < total and now - self._last < 0.25):
            return
        self._last = now
        print(f"\r  {what}: {done:>10,}/{total:,} ({100 * done // max(total, 1):3d} %)",
              end="", file=sys.stderr, flush=True)
        if done >= total:
            print(file=sys.stderr, flush=True)


class Clock:
    """Wall and process CPU seconds of the timed sections. On a shared machine the CPU
    figure (every thread of this process, RocksDB's background threads included) shows what
    the work costs; the wall figure also shows what the neighbours took."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}

    def timed(self, name: str, fn: Callable[[], Any]) -> tuple[float, Any]:
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        self.cpu[name] = time.process_time() - cpu
        return time.perf_counter() - wall, result


CLOCK = Clock()


def bench_timer_store(path: Path, n: int, batch: int, progress: Progress) -> dict[str, float]:
    cf = timer_cf(0)
    keys = [encode_timer_key(1_700_000_000_000 + i, "bench", f"m{i:08d}") for i in range(n)]
    value = os.urandom(100)
    pairs = [(k, value) for k in keys]
    out: dict[str, float] = {}
    with RocksStore(path, timer_shards=1) as store:
        def put_all() -> None:
            for i in range(0, n, batch):
                b = store.batch()
                b.put_many(cf, pairs[i:i + batch])
                store.write(b)
                progress("puts", i + batch, n)

        seconds, _ = CLOCK.timed("put", put_all)
        out["put_per_s"] = n / seconds
        out["put_per_cpu_s"] = n / CLOCK.cpu["put"]

        timers = TimerIndex(store)

        def scan_all() -> int:
            seen, from_ms = 0, 0
            now = 1_700_000_000_000 + n
            while True:
                page = timers.due(0, from_ms, now, batch)
                if not page:
                    return seen
                seen += len(page)
                from_ms = int.from_bytes(page[-1][0][:8], "big") + 1
                progress("due scan", seen, n)

        seconds, seen = CLOCK.timed("scan", scan_all)
        if seen != n:
            raise RuntimeError(f"due scan saw {seen} keys, expected {n}")
        out["due_scan_per_s"] = n / seconds
        out["due_scan_per_cpu_s"] = n / CLOCK.cpu["scan"]

        def delete_all() -> None:
            for i in range(0, n, batch):
                b = store.batch()
                b.delete_many(cf, keys[i:i + batch])
                store.write(b)
                progress("deletes", i + batch, n)

        seconds, _ = CLOCK.timed("delete", delete_all)
        out["delete_per_s"] = n / seconds
        seconds, _ = CLOCK.timed("cleanup", lambda: store.cleanup_prefix(cf, 1_700_000_000_000 + n))
        out["cleanup_prefix_s"] = seconds
    return out


def bench_commitlog(path: Path, n: int, batch: int, size: int, policy: str,
                    progress: Progress) -> dict[str, float]:
    payloads = [os.urandom(size) for _ in range(min(batch, n))]
    segment = 1 << 30
    with CommitLog(path, segment_size=segment, flush_policy=policy) as log:
        def append_all() -> None:
            for i in range(0, n, batch):
                log.append_batch(payloads[: min(batch, n - i)])
                progress(f"commitlog {policy}", i + batch, n)

        seconds, _ = CLOCK.timed("append", append_all)
        cpu = CLOCK.cpu["append"]
        flush_s, _ = CLOCK.timed("flush", log.flush)
        read_s, count = CLOCK.timed("iter", lambda: sum(1 for _ in log.iter_from(0)))
    if count != n:
        raise RuntimeError(f"CommitLog holds {count} records, expected {n}")
    return {
        "records_per_s": n / seconds,
        "records_per_cpu_s": n / cpu,
        "mb_per_s": n * size / seconds / 1e6,
        "final_flush_s": flush_s,
        "iter_records_per_s": n / read_s,
    }


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hourglass bench storage", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000, help="timer keys (default 1 M)")
    p.add_argument("--records", type=int, default=1_000_000,
                   help="CommitLog records, async policy (default 1 M)")
    p.add_argument("--sync-records", type=int, default=100_000,
                   help="CommitLog records, sync policy (default 100 k; 0 skips)")
    p.add_argument("--record-size", type=int, default=200, help="payload bytes (default 200)")
    p.add_argument("--batch", type=int, default=1000, help="batch size (default 1000)")
    p.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir)")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="write figures here")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    ns = p.parse_args(argv)
    for name in ("keys", "records", "record_size", "batch"):
        if getattr(ns, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if ns.sync_records < 0:
        p.error("--sync-records must be >= 0")
    return ns


def main(argv: list[str]) -> int:
    ns = _parse(argv)
    progress = Progress(ns.quiet)
    work = Path(tempfile.mkdtemp(prefix="hourglass-bench-", dir=ns.dir))
    figures: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0],
                    "load_average_1m": os.getloadavg()[0]},
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(ns).items()},
    }
    try:
        figures["timer_store"] = bench_timer_store(work / "db", ns.keys, ns.batch, progress)
        figures["commitlog_async"] = bench_commitlog(
            work / "log-async", ns.records, ns.batch, ns.record_size, "async", progress)
        if ns.sync_records:
            figures["commitlog_sync"] = bench_commitlog(
                work / "log-sync", ns.sync_records, ns.batch, ns.record_size, "sync", progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ts, cl = figures["timer_store"], figures["commitlog_async"]
    lines = [
        f"timer CF puts   {ts['put_per_s']:>12,.0f} /s   (batches of {ns.batch}, 100 B values,"
        f" {ns.keys:,} keys; target {TARGET_PUTS:,}); {ts['put_per_cpu_s']:,.0f} per CPU-s",
        f"due scan        {ts['due_scan_per_s']:>12,.0f} keys/s (pages of {ns.batch});"
        f" {ts['due_scan_per_cpu_s']:,.0f} per CPU-s",
        f"timer deletes   {ts['delete_per_s']:>12,.0f} /s   (batched); cleanup_prefix"
        f" {ts['cleanup_prefix_s'] * 1000:.0f} ms",
        f"CommitLog async {cl['records_per_s']:>12,.0f} records/s {cl['mb_per_s']:8.1f} MB/s"
        f" ({ns.record_size} B, batches of {ns.batch}; target {TARGET_RECORDS:,});"
        f" {cl['records_per_cpu_s']:,.0f} per CPU-s",
        f"CommitLog read  {cl['iter_records_per_s']:>12,.0f} records/s (iter_from, CRC checked)",
    ]
    if "commitlog_sync" in figures:
        cs = figures["commitlog_sync"]
        lines.append(f"CommitLog sync  {cs['records_per_s']:>12,.0f} records/s"
                     f" {cs['mb_per_s']:8.1f} MB/s (msync per batch)")
    lines.append(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end)")
    print("\n".join(lines))
    if ns.json is not None:
        ns.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
