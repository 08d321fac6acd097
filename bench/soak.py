"""``python -m bench.soak --minutes 5``: the real server under a steady load for a bounded
time, its memory and the delivery lateness sampled every second.

Load: producers send ``--rate`` messages/s (every 100 ms a batch and two single sends) due
100 ms - 3 s later; a canceller cancels ~2 % of them before they are due;
one consumer long-polls each topic by group and commits its offsets. Sampled each second:
the server's RSS and its anonymous part (RssAnon: heap, RocksDB memtables and block cache;
without the CommitLog's mapped segment files, which are page cache the kernel can drop), its
CPU, and the lateness (storedAt - deliverAt, as the server measured it) of what was
consumed in that second.

Memory is attributed: with ``--rocksdb-buffers small`` (the default) the server runs with
RocksDB's memtables and block cache shrunk (SMALL_BUFFERS), so those bounded caches reach
their steady state within a minute instead of filling for tens of minutes, and it logs each
second what RocksDB says it holds (memtables, table readers, block cache) and Python's
allocated blocks; the soak plots RssAnon, RocksDB's share, and the rest.

Verdict (exit code 1 when broken): the rest (RssAnon minus RocksDB's accounted memory; all
of RssAnon without that log) grows from the first third of the run to the last by at most
``--max-growth`` (relative) or ``--max-growth-mib``, whichever is larger; lateness p99 <=
``--p99-ms``; every acknowledged, uncancelled message consumed exactly once, none early,
nothing cancelled consumed. A PNG (``--plot``) shows memory, lateness and rates.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.crash.server import ServerProcess

TOPICS = ("soak.a", "soak.b")
GROUP = "soak"
MIB = 1 << 20
TICK_S = 0.1  # producers send every tick
SINGLES = 2  # of each tick's messages, this many go as single sends, the rest as one batch
CANCEL_SHARE = 0.02  # of the rate, cancelled before due


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Sample:
    t_s: float  # since the load started
    rss_mib: float
    anon_mib: float
    cpu_pct: float
    sent: int  # acknowledged in this second
    consumed: int  # consumed in this second
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    load1: float  # the machine's 1-minute load average (2 cores, shared: others run too)
    rocksdb_mib: float | None = None  # memtables + table readers + block cache, as RocksDB says
    python_kblocks: float | None = None  # sys.getallocatedblocks() / 1000 in the server

    @property
    def unaccounted_mib(self) -> float | None:
        """RssAnon minus what RocksDB accounts for: Python's heap, allocator slack, threads."""
        return None if self.rocksdb_mib is None else self.anon_mib - self.rocksdb_mib


@dataclass
class Totals:
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    acked: set[tuple[str, str]] = field(default_factory=set)
    cancelled: set[tuple[str, str]] = field(default_factory=set)
    consumed: list[tuple[str, str]] = field(default_factory=list)
    lateness: deque[int] = field(default_factory=deque)  # drained by the sampler each second
    all_lateness: list[int] = field(default_factory=list)
    early: int = 0
    errors: list[str] = field(default_factory=list)
    sent_window: int = 0


def _anon_mib(pid: int) -> float:
    """RssAnon of ``pid`` in MiB (Linux); RSS - shared elsewhere."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    info = psutil.Process(pid).memory_info()
    return (info.rss - getattr(info, "shared", 0)) / MIB


def _quantile(values: list[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


class Load:
    def __init__(self, server: ServerProcess, rate: int, totals: Totals) -> None:
        self.server, self.rate, self.totals = server, rate, totals
        self.stop_sending = threading.Event()
        self.stop_consuming = threading.Event()
        self.recent: deque[tuple[str, str, str, int]] = deque(maxlen=5000)  # topic, id, handle, due
        self.last_due = 0

    def produce(self, seed: int, producers: int) -> None:
        """This thread's share of the rate, paced in ticks of TICK_S (fixed rate: when it
        falls behind it does not burst to catch up; the achieved rate is reported)."""
        rng = random.Random(seed)
        per_tick, carry, n = self.rate * TICK_S / producers, 0.0, 0
        next_tick = time.monotonic()
        with self.server.client() as client:
            while not self.stop_sending.is_set():
                carry += per_tick
                count = int(carry)
                carry -= count
                messages = []
                for _ in range(count):
                    n += 1
                    messages.append({"body": f"soak {seed}-{n}", "msgId": f"s{seed}-{n}",
                                     "delayMs": rng.randrange(100, 3000)})
                topic = rng.choice(TOPICS)
                singles, batch = messages[:SINGLES], messages[SINGLES:]
                for m in singles:
                    self._send(client, topic, [m], single=True)
                if batch:
                    self._send(client, topic, batch, single=False)
                next_tick += TICK_S
                delay = next_tick - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    next_tick = time.monotonic()

    def _send(self, client: httpx.Client, topic: str, messages: list[dict[str, Any]],
              single: bool) -> None:
        try:
            r = (client.post(f"/v1/topics/{topic}/messages", json=messages[0]) if single else
                 client.post(f"/v1/topics/{topic}/messages:batch", json={"messages": messages}))
        except httpx.HTTPError as exc:
            self.totals.errors.append(f"send: {exc!r}")
            return
        if r.status_code != 201:
            self.totals.errors.append(f"send answered {r.status_code}: {r.text[:200]}")
            return
        results = [r.json()] if single else r.json()["results"]
        with self.totals.lock:
            for res in results:
                self.totals.acked.add((topic, res["msgId"]))
                self.recent.append((topic, res["msgId"], res["cancelHandle"], res["deliverAt"]))
                self.last_due = max(self.last_due, res["deliverAt"])
            self.totals.sent_window += len(results)

    def cancel(self, seed: int) -> None:
        rng = random.Random(seed)
        with self.server.client() as client:
            while not self.stop_sending.wait(1 / max(1, self.rate * CANCEL_SHARE)):
                with self.totals.lock:
                    pick = self.recent[rng.randrange(len(self.recent))] if self.recent else None
                if pick is None or pick[3] < now_ms() + 50:
                    continue
                r = client.delete(f"/v1/scheduled/{pick[2]}")
                if r.status_code == 200:
                    with self.totals.lock:
                        self.totals.cancelled.add((pick[0], pick[1]))
                elif r.status_code != 409:
                    self.totals.errors.append(f"cancel answered {r.status_code}: {r.text[:200]}")

    def consume(self, topic: str) -> None:
        with self.server.client(timeout_s=30) as client:
            while not self.stop_consuming.is_set():
                r = client.get(f"/v1/topics/{topic}/messages",
                               params={"group": GROUP, "max": 1000, "waitMs": 500})
                if r.status_code != 200:
                    self.totals.errors.append(f"pull answered {r.status_code}: {r.text[:200]}")
                    continue
                doc = r.json()
                with self.totals.lock:
                    for m in doc["messages"]:
                        late = m["storedAt"] - m["deliverAt"]
                        self.totals.early += late < 0
                        self.totals.lateness.append(late)
                        self.totals.all_lateness.append(late)
                        self.totals.consumed.append((topic, m["msgId"]))
                if doc["messages"]:
                    client.put(f"/v1/topics/{topic}/groups/{GROUP}/offset",
                               json={"offset": doc["nextOffset"]})


@dataclass(frozen=True, kw_only=True)
class SoakConfig:
    seconds: float
    rate: int = 2000  # messages/s
    producers: int = 2
    max_growth: float = 0.10  # RssAnon, last third vs first third
    max_growth_mib: float = 32.0  # ... or this many MiB, whichever is larger
    p99_ms: float = 5.0
    workdir: Path
    small_buffers: bool = True  # RocksDB caches in steady state within a minute (SMALL_BUFFERS)
    settings: dict[str, str] = field(default_factory=lambda: {"segment_size": "64MiB"})


@dataclass
class SoakReport:
    config: dict[str, Any]
    samples: list[Sample]
    acked: int
    cancelled: int
    consumed: int
    achieved_rate: float
    lateness_ms: dict[str, float | None]
    anon_first_mib: float
    anon_last_mib: float
    rss_first_mib: float
    rss_last_mib: float
    unaccounted_first_mib: float | None  # RssAnon - RocksDB's own accounting (small buffers)
    unaccounted_last_mib: float | None
    violations: list[str]

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        lat = self.lateness_ms
        growth = self.anon_last_mib - self.anon_first_mib
        unaccounted = ("" if self.unaccounted_first_mib is None or self.unaccounted_last_mib
                       is None else
                       f"; RssAnon minus RocksDB's memtables, table readers and block cache "
                       f"{self.unaccounted_first_mib:.1f} -> {self.unaccounted_last_mib:.1f} MiB")
        lines = [
            f"soak: {self.config['seconds']:.0f} s at {self.achieved_rate:,.0f} msgs/s "
            f"(target {self.config['rate']:,}), machine load average "
            f"{statistics.fmean(s.load1 for s in self.samples) if self.samples else 0:.1f} on "
            f"{os.cpu_count()} cores; {self.acked:,} acknowledged, "
            f"{self.cancelled:,} cancelled, {self.consumed:,} consumed",
            f"lateness (storedAt - deliverAt): p50 {lat['p50']} ms, p99 {lat['p99']} ms, "
            f"p99.9 {lat['p999']} ms, max {lat['max']} ms",
            f"RssAnon first third {self.anon_first_mib:.1f} MiB, last third "
            f"{self.anon_last_mib:.1f} MiB ({growth:+.1f} MiB){unaccounted}; RSS "
            f"{self.rss_first_mib:.1f} -> {self.rss_last_mib:.1f} MiB",
            "VERDICT: " + ("flat memory, lateness within target, nothing lost"
                           if self.ok else "; ".join(self.violations)),
        ]
        return "\n".join(lines)


def _thirds(values: list[float]) -> tuple[float, float]:
    third = max(1, len(values) // 3)
    return statistics.fmean(values[:third]), statistics.fmean(values[-third:])


def run(config: SoakConfig, progress: Any = print) -> SoakReport:
    config.workdir.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(
        config.workdir / "data", token=secrets.token_urlsafe(24),
        log_path=config.workdir / "server.log", settings=config.settings,
        argv=[sys.executable, "-c", "import sys, bench.soak; sys.exit(bench.soak."
              "serve_small_buffers())"] if config.small_buffers else None,
        env={MEMORY_LOG_ENV: str(config.workdir / "memory.jsonl")})
    memory = MemoryLog(config.workdir / "memory.jsonl")
    server.start(ready="/readyz")
    assert server.pid is not None
    proc = psutil.Process(server.pid)
    proc.cpu_percent(None)
    totals = Totals()
    load = Load(server, config.rate, totals)
    threads = [threading.Thread(target=load.produce, args=(i, config.producers), daemon=True)
               for i in range(config.producers)]
    threads.append(threading.Thread(target=load.cancel, args=(99,), daemon=True))
    consumers = [threading.Thread(target=load.consume, args=(t,), daemon=True) for t in TOPICS]
    samples: list[Sample] = []
    t0 = time.monotonic()
    try:
        for t in threads + consumers:
            t.start()
        next_sample = t0 + 1.0
        while next_sample - t0 <= config.seconds:
            time.sleep(max(0.0, next_sample - time.monotonic()))
            samples.append(_sample(proc, totals, next_sample - t0, memory))
            if len(samples) % 10 == 0:
                s = samples[-1]
                rocks = "" if s.rocksdb_mib is None else f", RocksDB {s.rocksdb_mib:5.1f}"
                progress(f"[{s.t_s:5.0f} s] RSS {s.rss_mib:7.1f} MiB (anon {s.anon_mib:6.1f}"
                         f"{rocks}), "
                         f"cpu {s.cpu_pct:4.0f} %, sent {s.sent}/s, consumed {s.consumed}/s, "
                         f"lateness p99 {s.p99_ms} ms max {s.max_ms} ms, load {s.load1:.1f}")
            next_sample += 1.0
        load.stop_sending.set()
        for t in threads:
            t.join()
        _wait_consumed(totals, load.last_due)
    finally:
        load.stop_consuming.set()
        for t in consumers:
            t.join(timeout=10)
        server.stop()
    return _report(config, samples, totals)


class MemoryLog:
    """The server's latest line of ``_log_memory`` (nothing when it does not write one)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.latest = path, 0, None

    def read(self) -> dict[str, Any] | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                f.seek(self.offset)
                lines = f.readlines()
                self.offset = f.tell()
        except FileNotFoundError:
            return None
        complete = [line for line in lines if line.endswith("\n")]
        if complete:
            self.latest = json.loads(complete[-1])
        return self.latest


def _sample(proc: psutil.Process, totals: Totals, t_s: float, memory: MemoryLog) -> Sample:
    with totals.lock:
        window = list(totals.lateness)
        totals.lateness.clear()
        sent, totals.sent_window = totals.sent_window, 0
    mem = memory.read()
    rocksdb = None if mem is None else sum(
        mem.get(k) or 0 for k in (*ROCKSDB_MEMORY, "rocksdb.block-cache-usage")) / MIB
    return Sample(t_s=round(t_s, 1), rss_mib=proc.memory_info().rss / MIB,
                  anon_mib=_anon_mib(proc.pid), cpu_pct=proc.cpu_percent(None), sent=sent,
                  consumed=len(window), p50_ms=_quantile(window, 0.5),
                  p99_ms=_quantile(window, 0.99), max_ms=float(max(window)) if window else None,
                  load1=os.getloadavg()[0], rocksdb_mib=rocksdb,
                  python_kblocks=None if mem is None else mem["python_blocks"] / 1000)


def _wait_consumed(totals: Totals, last_due: int, timeout_s: float = 60.0) -> None:
    """Until everything acknowledged and not cancelled was consumed (or the timeout)."""
    deadline = time.monotonic() + max(0.0, (last_due - now_ms()) / 1000) + timeout_s
    while time.monotonic() < deadline:
        with totals.lock:
            if len(set(totals.consumed)) >= len(totals.acked - totals.cancelled):
                return
        time.sleep(0.2)


def _report(config: SoakConfig, samples: list[Sample], totals: Totals) -> SoakReport:
    violations = list(totals.errors[:10])
    consumed = totals.consumed
    counted: dict[tuple[str, str], int] = {}
    for key in consumed:
        counted[key] = counted.get(key, 0) + 1
    missing = totals.acked - totals.cancelled - set(counted)
    if missing:
        violations.append(f"{len(missing)} acknowledged messages never consumed, e.g. "
                          f"{sorted(missing)[:3]}")
    doubled = [k for k, n in counted.items() if n > 1]
    if doubled:
        violations.append(f"{len(doubled)} messages consumed twice, e.g. {doubled[:3]}")
    if totals.cancelled & set(counted):
        violations.append(f"{len(totals.cancelled & set(counted))} cancelled messages consumed")
    if totals.early:
        violations.append(f"{totals.early} messages stored before their deliverAt")
    steady = samples[len(samples) // 10:] or samples  # without the first tenth (warm-up)
    anon_first, anon_last = _thirds([s.anon_mib for s in steady])
    rss_first, rss_last = _thirds([s.rss_mib for s in steady])
    rest = [s.unaccounted_mib for s in steady]
    un_first, un_last = _thirds([r for r in rest if r is not None]) if all(
        r is not None for r in rest) and rest else (None, None)
    # the leak check: what RocksDB does not account for when it says, else all of RssAnon
    first, last, what = ((un_first, un_last, "RssAnon minus RocksDB's accounted memory")
                         if un_first is not None and un_last is not None
                         else (anon_first, anon_last, "RssAnon"))
    allowed = max(config.max_growth * first, config.max_growth_mib)
    if last - first > allowed:
        violations.append(f"{what} grew {last - first:.1f} MiB (allowed {allowed:.1f} MiB)")
    lat = totals.all_lateness
    lateness = {"p50": _quantile(lat, 0.5), "p99": _quantile(lat, 0.99),
                "p999": _quantile(lat, 0.999), "max": float(max(lat)) if lat else None}
    if lateness["p99"] is None or lateness["p99"] > config.p99_ms:
        violations.append(f"lateness p99 {lateness['p99']} ms > {config.p99_ms} ms")
    seconds = samples[-1].t_s if samples else config.seconds
    return SoakReport(
        config={k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
        samples=samples, acked=len(totals.acked), cancelled=len(totals.cancelled),
        consumed=len(consumed), achieved_rate=len(totals.acked) / max(seconds, 1e-9),
        lateness_ms=lateness, anon_first_mib=anon_first, anon_last_mib=anon_last,
        rss_first_mib=rss_first, rss_last_mib=rss_last, unaccounted_first_mib=un_first,
        unaccounted_last_mib=un_last, violations=violations)


def plot(report: SoakReport, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t_s for s in report.samples]
    fig, (mem, late, rate) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    mem.plot(t, [s.rss_mib for s in report.samples], label="RSS (with mapped CommitLog pages)")
    mem.plot(t, [s.anon_mib for s in report.samples], label="RssAnon (heap, memtables, cache)")
    if all(s.rocksdb_mib is not None for s in report.samples):
        mem.plot(t, [s.rocksdb_mib for s in report.samples],
                 label="RocksDB: memtables + table readers + block cache")
        mem.plot(t, [s.unaccounted_mib for s in report.samples],
                 label="RssAnon - RocksDB (Python heap, allocator, threads)")
    mem.set_ylabel("MiB")
    mem.set_ylim(bottom=0)
    mem.legend(loc="lower right")
    mem.set_title(title)
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max")):
        late.plot(t, [getattr(s, key) for s in report.samples], label=label)
    late.axhline(report.config["p99_ms"], color="grey", linestyle="--", label="p99 target")
    late.set_ylabel("lateness, ms (per second)")
    late.set_yscale("symlog", linthresh=10)
    late.legend(loc="upper right")
    rate.plot(t, [s.sent for s in report.samples], label="sent (acknowledged)")
    rate.plot(t, [s.consumed for s in report.samples], label="consumed")
    rate.set_ylabel("messages/s")
    rate.set_xlabel("seconds")
    rate.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


SMALL_BUFFERS = {  # StoreTuning for --rocksdb-buffers small: caches in steady state in a minute
    "block_cache_bytes": 16 * MIB, "db_write_buffer_bytes": 32 * MIB,
    "timer_write_buffer_bytes": 4 * MIB, "other_write_buffer_bytes": 2 * MIB,
    "max_total_wal_bytes": 64 * MIB,
}


MEMORY_LOG_ENV = "SOAK_MEMORY_LOG"  # the launcher appends one JSON line per second there
ROCKSDB_MEMORY = ("rocksdb.cur-size-all-mem-tables", "rocksdb.estimate-table-readers-mem")


def _log_memory(path: Path, stores: list[Any]) -> None:
    """In the server: what RocksDB says it holds (memtables, table readers, block cache) and
    Python's allocated blocks, each second, so the soak can attribute the RssAnon it sees."""
    from storage.rocks_options import all_cf_names

    while True:
        time.sleep(1.0)
        if not stores or stores[-1].closed:
            continue
        store = stores[-1]
        try:
            cfs = all_cf_names(store.timer_shards)
            doc = {name: sum(store.property_int(cf, name) or 0 for cf in cfs)
                   for name in ROCKSDB_MEMORY}
            doc["rocksdb.block-cache-usage"] = store.property_int("meta",
                                                                  "rocksdb.block-cache-usage")
        except Exception:  # closing: the server is stopping
            return
        doc["t"] = time.time()
        doc["python_blocks"] = sys.getallocatedblocks()
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(doc) + "\n")


def serve_small_buffers() -> int:
    """``hourglass serve`` (app/server.py) with SMALL_BUFFERS as the store's tuning, which
    the server's settings do not expose; run as a subprocess by the soak."""
    import logging

    from api.app import create_app
    from app.server import Server, ensure_admin_token, parse_args, uvicorn_config
    from app.settings import load_settings
    from scheduler.broker import Broker
    from scheduler.config import EngineConfig
    from storage.timer_store import StoreTuning, TimerStore

    args = parse_args(sys.argv[1:])
    settings = ensure_admin_token(load_settings(
        cli={"data_dir": str(args.data_dir), "host": args.host, "port": args.port},
        env=os.environ))
    logging.basicConfig(level=settings.log_level.upper())
    tuning = StoreTuning(**SMALL_BUFFERS)
    stores: list[TimerStore] = []

    def store_factory(directory: Path, cfg: EngineConfig) -> TimerStore:
        store = TimerStore(directory, timer_shards=cfg.timer_shards, sync_writes=cfg.sync_writes,
                           tuning=tuning)
        stores.append(store)
        return store

    if os.environ.get(MEMORY_LOG_ENV):
        threading.Thread(target=_log_memory, args=(Path(os.environ[MEMORY_LOG_ENV]), stores),
                         daemon=True).start()

    app = create_app(settings, broker=Broker(settings.engine, store_factory=store_factory))
    server = Server(uvicorn_config(app, settings), on_shutdown=app.state.ctx.notifier.close)
    server.run()
    return 0


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
    parser.add_argument("--workdir", type=Path, help="data directory and server log "
                        "(default: a new temporary directory)")
    parser.add_argument("--plot", type=Path, help="PNG path (default: WORKDIR/soak.png)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hourglass-soak-"))
    config = SoakConfig(seconds=args.minutes * 60, rate=args.rate, p99_ms=args.p99_ms,
                        max_growth=args.max_growth, max_growth_mib=args.max_growth_mib,
                        workdir=workdir, small_buffers=args.rocksdb_buffers == "small")
    print(f"soak for {args.minutes:g} min at {args.rate} msgs/s in {workdir}", flush=True)
    report = run(config, progress=lambda line: print(line, flush=True))
    png = args.plot or workdir / "soak.png"
    plot(report, png, f"hourglass soak: {args.minutes:g} min at {args.rate:,} msgs/s "
                      f"(2 cores, shared)")
    (workdir / "soak.json").write_text(json.dumps(
        {**asdict(report), "ok": report.ok}, indent=1, default=str))
    print(report.summary())
    print(f"plot: {png}; samples: {workdir / 'soak.json'}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
