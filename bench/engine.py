"""``hourglass bench engine``: the engine's three workloads, in process.

1. schedule: ``send_batch`` of 1000 messages (100-byte bodies) due far in the future, so
   nothing is delivered; msgs/s. Target >= 400 k/s. Run twice: engine-generated msgIds, and
   client msgIds (each send then pays an idempotency look-up).
2. drain: ``--messages`` messages due at the same instant (a FakeClock jumps to it), timed
   until every one is in the CommitLog; msgs/s and the peak RSS growth while draining.
   Targets >= 400 k/s, <= 200 MB.
3. lateness: a steady ``--rate`` msgs/s for ``--seconds`` with delays uniform in 0.1-5 s on
   the system clock; lateness = storedAt - deliverAt of every message, read back from the
   log. Targets p50 <= 1 ms, p99 <= 5 ms, none early.
4. burst (not in ``all``): ``--messages`` messages of one topic due at one instant
   ``--burst-lead-ms`` ahead on the system clock (W2 of bench/peers without HTTP); lateness =
   storedAt - deliverAt read back from the log, and the process CPU from the due time to the
   last commit. ``--rounds`` bursts, one engine each.

``--shards 1,2,4`` repeats workloads 1 and 2 per timer-shard count (messages spread over 8
topics: one topic lives in one shard). Every figure comes with the process CPU seconds it
took and the load average, because the machine is shared: wall-clock rates depend on the
neighbours, CPU-second rates much less.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from scheduler.broker import Broker
from scheduler.clock import FakeClock, SystemClock
from scheduler.config import EngineConfig
from scheduler.model import SendRequest

BODY = b"x" * 100
TOPICS = tuple(f"bench{i}" for i in range(8))
START_MS = 1_700_000_000_000
TARGETS = {"schedule_msgs_per_s": 400_000, "drain_msgs_per_s": 400_000,
           "drain_rss_growth_mb": 200, "lateness_p50_ms": 1, "lateness_p99_ms": 5}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Progress:
    def __init__(self, what: str, total: int) -> None:
        self.what, self.total, self._last = what, total, 0.0

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        if done < self.total and now - self._last < 0.5:
            return
        self._last = now
        print(f"\r  {self.what}: {done:>10,}/{self.total:,}", end="", file=sys.stderr,
              flush=True)
        if done >= self.total:
            print(file=sys.stderr, flush=True)


def _rss() -> tuple[int, int, int]:
    """(RSS, anonymous RSS, file-backed RSS) of this process, bytes (Linux /proc)."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                fields[name] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["RssAnon"], fields["RssFile"] + fields.get("RssShmem", 0)


class RssSampler:
    """Peak RSS of this process, sampled every 20 ms on a thread; also its two parts:
    anonymous memory (Python heap, RocksDB memtables and block cache) and file-backed pages
    (the memory-mapped CommitLog segments: page cache, reclaimable by the kernel)."""

    def __init__(self) -> None:
        self.base, self.base_anon, self.base_file = _rss()
        self.peak, self.peak_anon, self.peak_file = self.base, self.base_anon, self.base_file
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        rss, anon, file = _rss()
        self.peak = max(self.peak, rss)
        self.peak_anon = max(self.peak_anon, anon)
        self.peak_file = max(self.peak_file, file)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._sample()

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 2**20

    @property
    def anon_growth_mb(self) -> float:
        return (self.peak_anon - self.base_anon) / 2**20

    @property
    def file_growth_mb(self) -> float:
        return (self.peak_file - self.base_file) / 2**20


@contextmanager
def timed(out: dict[str, float]) -> Iterator[None]:
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    out["wall_s"] = time.perf_counter() - wall
    out["cpu_s"] = time.process_time() - cpu
    out["load_avg_1m"] = os.getloadavg()[0]


def engine_config(data_dir: Path, shards: int, memory_mb: int | None = None) -> EngineConfig:
    """The server's defaults but larger CommitLog segments; ``memory_mb``: RocksDB's budget."""
    config = EngineConfig(data_dir=data_dir, timer_shards=shards, segment_size=256 << 20)
    return config if memory_mb is None else replace(config, rocksdb_memory_bytes=memory_mb << 20)


def requests(n: int, *, deliver_at: int, client_ids: bool, prefix: str = "") -> list[SendRequest]:
    return [SendRequest(topic=TOPICS[i % len(TOPICS)], body=BODY, deliver_at=deliver_at,
                        msg_id=f"{prefix}{i}" if client_ids else None) for i in range(n)]


def send_all(broker: Broker, n: int, *, deliver_at: int, client_ids: bool,
             what: str) -> dict[str, float]:
    """Send ``n`` messages in batches of 1000; the requests are built outside the timing."""
    progress = Progress(what, n)
    batches = [requests(min(1000, n - i), deliver_at=deliver_at, client_ids=client_ids,
                        prefix=f"{i}-") for i in range(0, n, 1000)]
    out: dict[str, float] = {}
    with timed(out):
        done = 0
        for batch in batches:
            broker.send_batch(batch)
            done += len(batch)
            progress(done)
    out["messages"] = n
    out["msgs_per_s"] = n / out["wall_s"]
    out["msgs_per_cpu_s"] = n / max(out["cpu_s"], 1e-9)
    return out


def bench_schedule(root: Path, n: int, shards: int) -> dict[str, Any]:
    result: dict[str, Any] = {"shards": shards}
    for client_ids in (False, True):
        data = Path(tempfile.mkdtemp(dir=root))
        clock = FakeClock(START_MS)
        broker = Broker(engine_config(data, shards), clock)
        broker.start()
        try:
            label = "client_ids" if client_ids else "generated_ids"
            result[label] = send_all(broker, n, deliver_at=START_MS + 3_600_000,
                                     client_ids=client_ids,
                                     what=f"schedule ({label}, {shards} shards)")
        finally:
            broker.close()
            shutil.rmtree(data, ignore_errors=True)
    return result


def rocksdb_memory_mb(broker: Broker) -> dict[str, float]:
    """RocksDB's own memory after the run: memtables of every CF, the shared block cache."""
    store = broker.parts.store  # the benchmark looks inside on purpose
    assert store is not None
    names = [*store.timer_cf_names(), "index", "cq", "expiry", "meta"]
    memtables = sum(store.property_int(cf, "rocksdb.size-all-mem-tables") or 0 for cf in names)
    cache = store.property_int("index", "rocksdb.block-cache-usage") or 0
    return {"rocksdb_memtables_mb": memtables / 2**20, "rocksdb_block_cache_mb": cache / 2**20}


def bench_drain(root: Path, n: int, shards: int, memory_mb: int | None) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(dir=root))
    clock = FakeClock(START_MS)
    broker = Broker(engine_config(data, shards, memory_mb), clock)
    broker.start()
    try:
        due = START_MS + 1000
        send_all(broker, n, deliver_at=due, client_ids=False, what=f"drain: load ({shards} shards)")
        out: dict[str, Any] = {"shards": shards, "messages": n,
                               "rocksdb_memory_budget_mb": memory_mb or "default"}
        progress = Progress(f"drain: deliver ({shards} shards)", n)
        stop = threading.Event()

        def report() -> None:
            while not stop.wait(0.5):
                progress(int(broker.metrics.delivered.value))

        reporter = threading.Thread(target=report, daemon=True)
        with RssSampler() as rss, timed(out):
            reporter.start()
            clock.set(due)
            broker.drain(timeout_s=3600)
        stop.set()
        reporter.join()
        progress(int(broker.metrics.delivered.value))
        delivered = int(broker.metrics.delivered.value)
        if delivered != n:
            raise AssertionError(f"delivered {delivered} of {n}")
        out["msgs_per_s"] = n / out["wall_s"]
        out["msgs_per_cpu_s"] = n / max(out["cpu_s"], 1e-9)
        out["rss_growth_mb"] = rss.growth_mb
        out.update(rocksdb_memory_mb(broker))
        out["rss_anon_growth_mb"] = rss.anon_growth_mb
        out["rss_file_growth_mb"] = rss.file_growth_mb
        out["commit_batches"] = broker.metrics.commit_batch_size.snapshot().count
        return out
    finally:
        broker.close()
        shutil.rmtree(data, ignore_errors=True)


class StageTimes:
    """Sub-ms breakdown of the lateness (benchmark-only instrumentation, wrapping the
    scanner's step and the commit on the class): how late a scanner starts after its planned
    wake-up, how old the first key of a batch is when its commit starts, and how long a
    commit takes, all in ms of the system clock."""

    def __init__(self) -> None:
        self.wake_late: list[float] = []
        self.age_at_commit: list[float] = []
        self.commit: list[float] = []
        self._saved: list[tuple[type, str, Any]] = []

    def install(self) -> None:
        from scheduler.committer import Committer
        from scheduler.scanner import Scanner

        step, commit_due = Scanner.step, Committer.commit_due
        times = self

        def timed_step(scanner: Scanner) -> bool | None:
            wake_at = scanner.state.wake_at
            if wake_at is not None:
                times.wake_late.append(time.time() * 1000 - wake_at)
            return step(scanner)

        def timed_commit(committer: Committer, scans: Any) -> Any:
            start = time.time() * 1000
            for scan in scans:
                if scan.items:
                    times.age_at_commit.append(start - int.from_bytes(scan.items[0][0][:8], "big"))
            try:
                return commit_due(committer, scans)
            finally:
                times.commit.append(time.time() * 1000 - start)

        self._saved = [(Scanner, "step", step), (Committer, "commit_due", commit_due)]
        Scanner.step = timed_step  # type: ignore[method-assign,assignment]
        Committer.commit_due = timed_commit  # type: ignore[method-assign,assignment]

    def uninstall(self) -> None:
        for cls, name, original in self._saved:
            setattr(cls, name, original)

    def summary(self) -> dict[str, float]:
        out = {}
        for name in ("wake_late", "age_at_commit", "commit"):
            values = sorted(getattr(self, name))
            if values:
                out[f"{name}_p50_ms"] = round(values[len(values) // 2], 3)
                out[f"{name}_p99_ms"] = round(values[min(len(values) - 1,
                                                         int(0.99 * len(values)))], 3)
        return out


def bench_lateness(root: Path, rate: int, seconds: float, shards: int,
                   breakdown: bool = False) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(dir=root))
    stages = StageTimes()
    if breakdown:
        stages.install()
    broker = Broker(engine_config(data, shards), SystemClock())
    broker.start()
    rng = random.Random(1)
    tick_s = 0.005  # a batch every 5 ms
    per_tick = max(1, round(rate * tick_s))
    total = int(rate * seconds)
    progress = Progress("lateness: send", total)
    try:
        sent = 0
        start = time.perf_counter()
        tick = 0
        while sent < total:
            target = start + tick * tick_s
            pause = target - time.perf_counter()
            if pause > 0:
                time.sleep(pause)  # pacing of the producer, not waiting for a due time
            count = min(per_tick, total - sent)
            batch = [SendRequest(topic=TOPICS[(sent + i) % len(TOPICS)], body=BODY,
                                 delay_ms=rng.randrange(100, 5001)) for i in range(count)]
            broker.send_batch(batch)
            sent += count
            tick += 1
            progress(sent)
        achieved = sent / (time.perf_counter() - start)
        say("  lateness: waiting for the last deliveries (<= 5 s)")
        last_due = time.time() + 5.1
        while time.time() < last_due or broker.metrics.delivered.value < total:
            time.sleep(0.1)
            if time.time() > last_due + 60:
                break
        late = _lateness(broker, TOPICS)
        if not late:
            raise AssertionError("nothing was delivered")

        def pct(q: float) -> int:
            return late[min(len(late) - 1, int(q * len(late)))]

        return {
            "shards": shards, "rate_target": rate, "rate_achieved": achieved,
            "messages": len(late), "sent": sent, "early": sum(1 for x in late if x < 0),
            "p50_ms": pct(0.50), "p90_ms": pct(0.90), "p99_ms": pct(0.99),
            "p999_ms": pct(0.999), "max_ms": late[-1], "mean_ms": statistics.fmean(late),
            "load_avg_1m": os.getloadavg()[0], **stages.summary(),
        }
    finally:
        broker.close()
        stages.uninstall()
        shutil.rmtree(data, ignore_errors=True)


def bench_burst(root: Path, n: int, lead_ms: int, shards: int) -> dict[str, Any]:
    """``n`` messages of one topic due at one instant ``lead_ms`` from now (system clock)."""
    data = Path(tempfile.mkdtemp(dir=root))
    broker = Broker(engine_config(data, shards), SystemClock())
    broker.start()
    topic = TOPICS[0]
    try:
        due = SystemClock().now_ms() + lead_ms
        batches = [[SendRequest(topic=topic, body=BODY, deliver_at=due)
                    for _ in range(min(1000, n - i))] for i in range(0, n, 1000)]
        for batch in batches:
            broker.send_batch(batch)
        if time.time() * 1000 >= due:
            raise AssertionError("the ingest overran the due time: give a longer lead")
        time.sleep(max(0.0, due / 1000 - time.time() - 0.001))
        cpu = time.process_time()
        while broker.metrics.delivered.value < n:
            time.sleep(0.001)
        cpu = time.process_time() - cpu
        late = _lateness(broker, [topic])
        if len(late) != n:
            raise AssertionError(f"delivered {len(late)} of {n}")

        def pct(q: float) -> int:
            return late[min(len(late) - 1, int(q * len(late)))]

        return {"messages": n, "first_ms": late[0], "p50_ms": pct(0.5), "p99_ms": pct(0.99),
                "max_ms": late[-1], "early": sum(1 for x in late if x < 0),
                "cpu_s": round(cpu, 4), "load_avg_1m": os.getloadavg()[0]}
    finally:
        broker.close()
        shutil.rmtree(data, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hourglass bench engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("schedule", "drain", "lateness", "burst", "all"),
                        default="all")
    parser.add_argument("--messages", type=int, default=1_000_000,
                        help="messages for the schedule and drain workloads")
    parser.add_argument("--shards", default="2",
                        help="comma-separated timer-shard counts for schedule/drain, e.g. 1,2,4")
    parser.add_argument("--rocksdb-memory-mb", type=int, default=None,
                        help="drain once more with this RocksDB memory budget (cache+memtables)")
    parser.add_argument("--rate", type=int, default=20_000, help="lateness: msgs/s")
    parser.add_argument("--seconds", type=float, default=20.0, help="lateness: how long to send")
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="lateness: sys.setswitchinterval for the run (default: Python's 5 ms)")
    parser.add_argument("--breakdown", action="store_true",
                        help="lateness: also time the scanner wake-up and the commit (sub-ms)")
    parser.add_argument("--burst-lead-ms", type=int, default=2000,
                        help="burst: the due time, this long after the ingest starts")
    parser.add_argument("--rounds", type=int, default=1, help="burst: how many bursts")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the data")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    shard_counts = [int(s) for s in args.shards.split(",")]
    root = Path(tempfile.mkdtemp(prefix="hourglass-bench-engine-", dir=args.dir))
    results: dict[str, Any] = {"targets": TARGETS, "cpus": os.cpu_count(),
                               "messages": args.messages}
    try:
        if args.workload in ("schedule", "all"):
            results["schedule"] = [bench_schedule(root, args.messages, s) for s in shard_counts]
            for r in results["schedule"]:
                for label in ("generated_ids", "client_ids"):
                    f = r[label]
                    print(f"schedule  shards={r['shards']} {label:13s} {f['msgs_per_s']:>10,.0f} "
                          f"msgs/s  ({f['msgs_per_cpu_s']:,.0f} per CPU-s, load "
                          f"{f['load_avg_1m']:.1f})  target >= 400,000")
        if args.workload in ("drain", "all"):
            results["drain"] = [bench_drain(root, args.messages, s, None) for s in shard_counts]
            if args.rocksdb_memory_mb:
                results["drain"].append(bench_drain(root, args.messages, shard_counts[0],
                                                    args.rocksdb_memory_mb))
            for r in results["drain"]:
                print(f"drain     shards={r['shards']} rocksdb memory "
                      f"{r['rocksdb_memory_budget_mb']} {r['messages']:,} due at once: "
                      f"{r['msgs_per_s']:>10,.0f} msgs/s ({r['msgs_per_cpu_s']:,.0f} per CPU-s, "
                      f"load {r['load_avg_1m']:.1f}), peak RSS growth {r['rss_growth_mb']:.0f} MB "
                      f"(anonymous {r['rss_anon_growth_mb']:.0f} MB, file-backed log pages "
                      f"{r['rss_file_growth_mb']:.0f} MB; RocksDB memtables "
                      f"{r['rocksdb_memtables_mb']:.0f} MB, block cache "
                      f"{r['rocksdb_block_cache_mb']:.0f} MB)  targets >= 400,000 msgs/s, "
                      f"<= 200 MB")
        if args.workload == "burst":
            results["burst"] = []
            for _ in range(args.rounds):
                r = bench_burst(root, args.messages, args.burst_lead_ms, shard_counts[0])
                results["burst"].append(r)
                print(f"burst     {r['messages']:,} due at once: first {r['first_ms']} ms, p50 "
                      f"{r['p50_ms']} ms, p99 {r['p99_ms']} ms, last {r['max_ms']} ms, early "
                      f"{r['early']}, CPU {r['cpu_s']:.3f} s (load {r['load_avg_1m']:.1f})",
                      flush=True)
        if args.workload in ("lateness", "all"):
            previous = sys.getswitchinterval()
            if args.switch_interval_ms is not None:
                sys.setswitchinterval(args.switch_interval_ms / 1000)
            try:
                r = bench_lateness(root, args.rate, args.seconds, shard_counts[0],
                                   breakdown=args.breakdown)
            finally:
                sys.setswitchinterval(previous)
            r["switch_interval_ms"] = (args.switch_interval_ms if args.switch_interval_ms
                                       is not None else previous * 1000)
            results["lateness"] = r
            print(f"lateness  {r['messages']:,} msgs at {r['rate_achieved']:,.0f}/s: p50 "
                  f"{r['p50_ms']} ms, p99 {r['p99_ms']} ms, p99.9 {r['p999_ms']} ms, max "
                  f"{r['max_ms']} ms, early {r['early']} (load {r['load_avg_1m']:.1f}, GIL switch "
                  f"interval {r['switch_interval_ms']:g} ms)  "
                  f"targets p50 <= 1, p99 <= 5, none early")
            if args.breakdown:
                print("          breakdown (ms, p50/p99): scanner wake-up late "
                      f"{r.get('wake_late_p50_ms')}/{r.get('wake_late_p99_ms')}, first key's age "
                      f"when its commit starts {r.get('age_at_commit_p50_ms')}/"
                      f"{r.get('age_at_commit_p99_ms')}, commit {r.get('commit_p50_ms')}/"
                      f"{r.get('commit_p99_ms')}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def _lateness(broker: Broker, topics: Sequence[str]) -> list[int]:
    """``storedAt - deliverAt`` of every message in the logs of ``topics``, sorted."""
    late: list[int] = []
    for topic in topics:
        offset = 0
        while True:
            page = broker.pull(topic, offset, 1000)
            if not page.messages:
                break
            late.extend(m.stored_at - m.deliver_at for m in page.messages)
            offset = page.next_offset
    return sorted(late)
