"""The soak run: start the server, drive the load, sample each second, judge."""

from __future__ import annotations

import os
import secrets
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.soak.load import TOPICS, Load, Totals, now_ms
from bench.soak.memory import MEMORY_LOG_ENV, MIB, ROCKSDB_MEMORY, MemoryLog, anon_mib
from bench.support.server_process import ServerProcess


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
    commitlog_mib: float = 0.0  # bytes of the data directory's commitlog/ (segment files)
    rocksdb_disk_mib: float = 0.0  # bytes of its rocksdb/ (SST files, WAL, MANIFEST)
    cf_mib: dict[str, float] = field(default_factory=dict)  # SST + memtable per column family
    cf_keys: dict[str, int] = field(default_factory=dict)  # RocksDB's estimate of keys per CF

    @property
    def data_mib(self) -> float:
        return self.commitlog_mib + self.rocksdb_disk_mib

    @property
    def unaccounted_mib(self) -> float | None:
        """RssAnon minus what RocksDB accounts for: Python's heap, allocator slack, threads."""
        return None if self.rocksdb_mib is None else self.anon_mib - self.rocksdb_mib


def _quantile(values: list[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


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
    max_data_growth_mib: float | None = None  # with retention: data dir, last vs first third


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
    data_first_mib: float = 0.0  # the data directory's size, first third of the steady part
    data_last_mib: float = 0.0  # ... and last third

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
            f"data directory first third {self.data_first_mib:.1f} MiB, last third "
            f"{self.data_last_mib:.1f} MiB; column families at the end (SST + memtable): "
            + (", ".join(f"{cf} {mib:.1f} MiB" for cf, mib in self.samples[-1].cf_mib.items())
               if self.samples else "-"),
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
        argv=[sys.executable, "-c", "import sys, bench.soak.memory as m; "
              "sys.exit(m.serve_small_buffers())"] if config.small_buffers else None,
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
            samples.append(_sample(proc, totals, next_sample - t0, memory,
                                   config.workdir / "data"))
            if len(samples) % 10 == 0:
                s = samples[-1]
                rocks = "" if s.rocksdb_mib is None else f", RocksDB {s.rocksdb_mib:5.1f}"
                progress(f"[{s.t_s:5.0f} s] RSS {s.rss_mib:7.1f} MiB (anon {s.anon_mib:6.1f}"
                         f"{rocks}), "
                         f"cpu {s.cpu_pct:4.0f} %, sent {s.sent}/s, consumed {s.consumed}/s, "
                         f"lateness p99 {s.p99_ms} ms max {s.max_ms} ms, load {s.load1:.1f}"
                         f", data {s.commitlog_mib:.0f}+{s.rocksdb_disk_mib:.0f} MiB")
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


def _dir_mib(path: Path) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except OSError:  # deleted meanwhile (a segment, an SST)
                pass
    return total / MIB


def _sample(proc: psutil.Process, totals: Totals, t_s: float, memory: MemoryLog,
            data: Path) -> Sample:
    with totals.lock:
        window = list(totals.lateness)
        totals.lateness.clear()
        sent, totals.sent_window = totals.sent_window, 0
    mem = memory.read()
    rocksdb = None if mem is None else sum(
        mem.get(k) or 0 for k in (*ROCKSDB_MEMORY, "rocksdb.block-cache-usage")) / MIB
    return Sample(t_s=round(t_s, 1), rss_mib=proc.memory_info().rss / MIB,
                  anon_mib=anon_mib(proc.pid), cpu_pct=proc.cpu_percent(None), sent=sent,
                  consumed=len(window), p50_ms=_quantile(window, 0.5),
                  p99_ms=_quantile(window, 0.99), max_ms=float(max(window)) if window else None,
                  load1=os.getloadavg()[0], rocksdb_mib=rocksdb,
                  python_kblocks=None if mem is None else mem["python_blocks"] / 1000,
                  commitlog_mib=_dir_mib(data / "commitlog"),
                  rocksdb_disk_mib=_dir_mib(data / "rocksdb"),
                  cf_mib={cf: (v["sst"] + v["mem"]) / MIB
                          for cf, v in ((mem or {}).get("cf") or {}).items()},
                  cf_keys={cf: v["keys"] for cf, v in ((mem or {}).get("cf") or {}).items()})


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
    data_first, data_last = _thirds([s.data_mib for s in steady])
    if config.max_data_growth_mib is not None and data_last - data_first > \
            config.max_data_growth_mib:
        violations.append(f"the data directory grew {data_last - data_first:.1f} MiB (allowed "
                          f"{config.max_data_growth_mib:.1f} MiB)")
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
        unaccounted_last_mib=un_last, violations=violations, data_first_mib=data_first,
        data_last_mib=data_last)
