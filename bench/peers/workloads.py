"""The workloads, identical for every system (only the adapter differs).

- W1 ingest: N messages due uniformly over the next hour (from now+60 s to now+1 h), sent in
  batches of ``batch`` by ``producers`` threads; msgs/s. Then, with the N messages pending:
  memory and disk growth per million pending messages, and the pending count (correctness:
  pending + already delivered must be N; hourglass delivers due messages without a consumer).
  Last, the disk once compacted, where the system has such a step (``System.compacted_disk``:
  hourglass stops its server and compacts its RocksDB, what background compaction reaches
  in time; right after the ingest RocksDB still holds its WAL and uncompacted L0 files).
- W2 burst: N messages all due at one instant, a few seconds after the ingest is expected to end
  (2 × the time the W1 rate predicts, + 5 s; without W1, from a short pilot); consumers run
  throughout. Drain time (due → last message received), drain rate, lateness percentiles,
  and the servers' RSS: before the ingest, at its end and at its peak until the drain ended.
- W3 steady: ``rate`` msgs/s for ``duration`` s, each due 1-3 s (uniform) after it is sent;
  lateness percentiles and the number received before their due time (must be 0).

Lateness = the consumer's clock when the batch is in its hands − the message's due time. Every
run checks that every id was received exactly once (missing / duplicates / unexpected).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import psutil

from .common import (
    Batch,
    Progress,
    Tracker,
    log,
    msg_id,
    now_ms,
    quantile_curve,
    random_bodies,
    summarize,
)
from .systems.base import System

W1_MIN_DELAY_MS = 60_000
W1_MAX_DELAY_MS = 3_600_000
W2_LEAD_FACTOR = 2.0  # due at 2 × the expected ingest time + 5 s (the machine is shared)
GRACE_S = 2.0  # after the last expected message: time for a duplicate to show up


@dataclass
class Params:
    n: int = 1_000_000
    batch: int = 1000
    producers: int = 2
    w3_rate: float = 5000.0
    w3_duration_s: float = 30.0
    w3_delay_min_ms: int = 1000
    w3_delay_max_ms: int = 3000
    drain_timeout_s: float = 1800.0
    seed: int = 7
    payload: int = 100  # bytes of each body


class CpuMeter:
    """CPU seconds used during a phase by the servers, by the client side (this harness plus
    any consumer processes it spawned: producers, consumers, bookkeeping), and by the
    consumer side alone (the consumer threads and processes, and a peer's mover: what a
    deployment runs beside the server to get messages out; ``System.consumer_cpu_s``).

    ``whole_cpu_s`` = server + consumer side: the system's whole cost of delivering, both
    sides counted (the producers' CPU is the workload's, the same for every system). Of the
    consumer side, ``consumer_sink_cpu_s`` is the harness's bookkeeping called by each
    consumer per batch it receives."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.server0, self.client0, self.consumer0, self.sink0 = self._measure()

    def _measure(self) -> tuple[float, float, float, float]:
        servers = {p.pid: p for p in self.system.server_processes()}
        me = psutil.Process()
        try:
            clients = [me, *(c for c in me.children(recursive=True) if c.pid not in servers)]
        except psutil.Error:
            clients = [me]

        def cpu(procs: list[psutil.Process]) -> float:
            total = 0.0
            for p in procs:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.Error:
                    pass
            return total

        consumer, sink = self.system.consumer_cpu_s()
        return cpu(list(servers.values())), cpu(clients), consumer, sink

    def result(self) -> dict[str, float]:
        server, client, consumer, sink = self._measure()
        server_s, consumer_s = server - self.server0, consumer - self.consumer0
        return {"server_cpu_s": round(server_s, 2),
                "client_cpu_s": round(client - self.client0, 2),
                "consumer_cpu_s": round(consumer_s, 2),
                "consumer_sink_cpu_s": round(sink - self.sink0, 2),
                "whole_cpu_s": round(server_s + consumer_s, 2)}


class RssPeak:
    """The servers' RSS (summed over their processes), sampled every ``interval_s`` in a
    thread: its value when started, at each ``mark``, and its peak; on Linux also its
    anonymous and file-backed parts (``/proc/PID/status`` RssAnon, RssFile: a mapped log's
    pages are file-backed, and the kernel takes them back under memory pressure)."""

    def __init__(self, system: System, interval_s: float = 0.05) -> None:
        self.system = system
        self.interval_s = interval_s
        self.start_rss = self._rss()
        self.peak = dict(self.start_rss) if self.start_rss is not None else None
        self.marks: dict[str, dict[str, int] | None] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-peak", daemon=True)
        self._thread.start()

    def _rss(self) -> dict[str, int] | None:
        procs = self.system.server_processes()
        if not procs:
            return None
        total = {"rss": 0}
        for proc in procs:
            try:
                total["rss"] += proc.memory_info().rss
            except psutil.Error:
                continue
            parts = _rss_parts(proc.pid)
            for key, value in parts.items():
                total[key] = total.get(key, 0) + value
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            rss = self._rss()
            if rss is None:
                continue
            if self.peak is None:
                self.peak = dict(rss)
            for key, value in rss.items():
                self.peak[key] = max(self.peak.get(key, 0), value)

    def mark(self, name: str) -> None:
        self.marks[name] = self._rss()

    def result(self) -> dict[str, dict[str, int] | None]:
        self._stop.set()
        self._thread.join()
        return {"start": self.start_rss, **self.marks, "peak": self.peak}


def _rss_parts(pid: int) -> dict[str, int]:
    """RssAnon and RssFile of a process, in bytes ({} where /proc does not say)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("RssAnon:", "RssFile:")):
                    name, value = line.split(":", 1)
                    out["anon" if name == "RssAnon" else "file"] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return out


# ---------------------------------------------------------------- producing

def produce(system: System, tracker: Tracker | None, n: int, due_of: Callable[[int, int], list],
            p: Params, label: str) -> float:
    """Send ids 0..n-1 in batches from ``p.producers`` threads; return the elapsed seconds."""
    lock = threading.Lock()
    state = {"next": 0, "sent": 0}
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            with lock:
                s = state["next"]
                if s >= n:
                    return
                e = min(s + p.batch, n)
                state["next"] = e
            ids = [msg_id(i) for i in range(s, e)]
            due = due_of(s, e)
            if tracker is not None:
                tracker.set_due(ids, due)
            try:
                system.send(Batch(ids, due, random_bodies(e - s, p.payload)))
            except BaseException as exc:
                errors.append(exc)
                stop.set()
                return
            with lock:
                state["sent"] += e - s

    t0 = time.perf_counter()

    def status() -> str:
        el = time.perf_counter() - t0
        return f"sent {state['sent']:,}/{n:,} ({state['sent'] / max(el, 1e-9):,.0f} msg/s)"

    threads = [threading.Thread(target=worker, name=f"producer-{k}", daemon=True)
               for k in range(p.producers)]
    with Progress(label, status):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"send failed after {state['sent']:,} messages: {errors[0]!r}") \
            from errors[0]
    return elapsed


def wait_received(system: System, tracker: Tracker, expected: int, deadline_ms: float,
                  label: str) -> bool:
    """Wait until ``expected`` distinct ids arrived (True) or ``deadline_ms`` passed (False)."""
    t0, r0 = time.perf_counter(), tracker.distinct
    last = {"t": t0, "r": r0}

    def status() -> str:
        t, r = time.perf_counter(), tracker.distinct
        rate = (r - last["r"]) / max(t - last["t"], 1e-9)
        last.update(t=t, r=r)
        return f"received {r:,}/{expected:,} ({rate:,.0f} msg/s now)"

    with Progress(label, status):
        while tracker.distinct < expected:
            err = getattr(system, "consumer_error", None)
            if err is not None:
                raise RuntimeError(f"consumer failed: {err!r}") from err
            if now_ms() > deadline_ms:
                return False
            time.sleep(0.05)
    time.sleep(GRACE_S)
    return True


def _correctness(tracker: Tracker, expected: int, complete: bool) -> dict:
    c = tracker.correctness(expected)
    c["complete"] = complete
    c["ok"] = complete and c["missing"] == 0 and c["duplicates"] == 0 and c["unexpected"] == 0
    return c


# ---------------------------------------------------------------- W1

def w1_ingest(system: System, p: Params, ctx: dict) -> dict:
    rng = np.random.default_rng(p.seed)
    base = system.footprint()
    cpu = CpuMeter(system)
    t0 = int(now_ms())
    delays = rng.integers(W1_MIN_DELAY_MS, W1_MAX_DELAY_MS, size=p.n)
    elapsed = produce(system, None, p.n, lambda s, e: (t0 + delays[s:e]).tolist(), p,
                      f"{system.name} W1 ingest")
    rate = p.n / elapsed
    cpu_res = cpu.result()
    log(f"{system.name} W1: {p.n:,} in {elapsed:.1f} s = {rate:,.0f} msg/s; measuring footprint")
    pending = system.pending_count()
    delivered = system.delivered_count()  # W1 runs no consumer, but a server may deliver due
    after = system.footprint()            # messages on its own (the ingest can outlast 60 s)
    per_million: dict[str, float | None] = {}
    for k, v in after.items():
        b = base.get(k)
        per_million[k] = None if v is None or b is None else (v - b) * 1e6 / p.n
    # last, as it may stop the server: the disk once the system compacted what it stores
    compacted = system.compacted_disk()
    if compacted is not None and base.get("disk") is not None:
        per_million["disk_compacted"] = (compacted - base["disk"]) * 1e6 / p.n
    ctx.setdefault("ingest_rate", {})[system.name] = rate
    return {
        "n": p.n, "payload": p.payload, "elapsed_s": round(elapsed, 3), "msgs_per_s": rate,
        **cpu_res, "footprint_before": base, "footprint_after": after,
        "disk_compacted": compacted,
        "per_million_pending": per_million,
        "correctness": {"expected": p.n, "pending": pending, "delivered": delivered,
                        "ok": pending is None or pending + delivered == p.n},
    }


# ---------------------------------------------------------------- W2

def w2_burst(system: System, p: Params, ctx: dict) -> dict:
    est_rate = ctx.get("ingest_rate", {}).get(system.name)
    if not est_rate:
        raise RuntimeError("W2 needs an ingest-rate estimate (run W1 or a pilot first)")
    tracker = Tracker(p.n)
    system.start_consumers(tracker.record)
    t_start = now_ms()
    lead_ms = p.n / est_rate * 1000 * W2_LEAD_FACTOR + 5000
    due = int(t_start + lead_ms)
    log(f"{system.name} W2: {p.n:,} messages all due at +{lead_ms / 1000:.1f} s "
        f"(est. ingest {p.n / est_rate:.1f} s)")
    cpu = CpuMeter(system)
    rss = RssPeak(system)
    elapsed = produce(system, tracker, p.n, lambda s, e: [due] * (e - s), p,
                      f"{system.name} W2 ingest")
    ingest_end = now_ms()
    rss.mark("ingest_end")
    if ingest_end > due:
        log(f"{system.name} W2: ingest ended {ingest_end - due:,.0f} ms after the due time")
    complete = wait_received(system, tracker, p.n, due + p.drain_timeout_s * 1000,
                             f"{system.name} W2 drain")
    cpu_res = cpu.result()
    system.stop_consumers()
    server_rss = rss.result()
    lat = tracker.lateness()
    recv = tracker.recv[~np.isnan(tracker.recv)]
    first = float(recv.min() - due) if recv.size else None
    last = float(recv.max() - due) if recv.size else None
    drain_s = None if last is None else max(last, 1.0) / 1000.0
    return {
        "n": p.n, "ingest_s": round(elapsed, 3), "ingest_msgs_per_s": p.n / elapsed,
        "due_lead_s": round(lead_ms / 1000, 2),
        "ingest_overran_due_ms": max(0.0, ingest_end - due),
        "first_after_due_ms": first, "drain_s": drain_s,
        "drain_msgs_per_s": (tracker.distinct / drain_s) if drain_s else None,
        "lateness_ms": summarize(lat),
        "server_lateness_ms": summarize(tracker.server_lateness()),
        "early": int((lat < 0).sum()),
        "server_early": int((tracker.server_lateness() < 0).sum()),
        "lateness_quantiles_ms": quantile_curve(lat),
        **cpu_res,
        # bytes: the servers' RSS before the ingest, at its end, and at its peak (sampled
        # every 50 ms until the drain ended; each part's own peak); growth = peak - before
        "server_rss": server_rss,
        "server_rss_growth": _growth(server_rss),
        "correctness": _correctness(tracker, p.n, complete),
    }


# ---------------------------------------------------------------- W3

def w3_steady(system: System, p: Params, ctx: dict) -> dict:
    rng = np.random.default_rng(p.seed + 3)
    n = int(p.w3_rate * p.w3_duration_s)
    delays = rng.integers(p.w3_delay_min_ms, p.w3_delay_max_ms + 1, size=n)
    tracker = Tracker(n)
    system.start_consumers(tracker.record)
    cpu = CpuMeter(system)
    work: queue.Queue[tuple[int, int] | None] = queue.Queue()
    errors: list[BaseException] = []
    state = {"sent": 0, "max_behind_ms": 0.0}
    lock = threading.Lock()
    t0 = time.perf_counter()

    def sender() -> None:
        while True:
            item = work.get()
            if item is None:
                return
            s, e = item
            if errors:
                continue
            # how far behind schedule this batch goes out (the producer must keep the pace)
            behind = (time.perf_counter() - t0 - e / p.w3_rate) * 1000
            ids = [msg_id(i) for i in range(s, e)]
            now = now_ms()
            due = (now + delays[s:e]).astype(np.int64).tolist()
            tracker.set_due(ids, due)
            try:
                system.send(Batch(ids, due, random_bodies(e - s, p.payload)))
            except BaseException as exc:
                errors.append(exc)
                continue
            with lock:
                state["sent"] += e - s
                state["max_behind_ms"] = max(state["max_behind_ms"], behind)

    senders = [threading.Thread(target=sender, name=f"w3-sender-{k}", daemon=True)
               for k in range(p.producers)]
    for t in senders:
        t.start()

    def status() -> str:
        return (f"sent {state['sent']:,}/{n:,}, received {tracker.distinct:,}, "
                f"max behind schedule {state['max_behind_ms']:,.0f} ms")

    tick = 0.02  # 20 ms ticks: 100 messages per tick at 5 k/s
    with Progress(f"{system.name} W3 steady", status):
        queued = 0
        while queued < n and not errors:
            target = min(n, int((time.perf_counter() - t0) * p.w3_rate))
            while queued < target:
                e = min(queued + p.batch, target)
                work.put((queued, e))
                queued = e
            time.sleep(tick)
        for _ in senders:
            work.put(None)
        for t in senders:
            t.join()
    send_s = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"W3 send failed: {errors[0]!r}") from errors[0]
    deadline = now_ms() + p.w3_delay_max_ms + p.drain_timeout_s * 1000
    complete = wait_received(system, tracker, n, deadline, f"{system.name} W3 drain")
    cpu_res = cpu.result()
    system.stop_consumers()
    lat = tracker.lateness()
    slat = tracker.server_lateness()
    return {
        "n": n, "rate": p.w3_rate, "duration_s": p.w3_duration_s,
        "delay_ms": [p.w3_delay_min_ms, p.w3_delay_max_ms],
        "achieved_send_rate": n / send_s, "max_behind_schedule_ms": state["max_behind_ms"],
        "lateness_ms": summarize(lat),
        "server_lateness_ms": summarize(slat),
        "early": int((lat < 0).sum()),
        "server_early": int((slat < 0).sum()),
        "lateness_quantiles_ms": quantile_curve(lat),
        "server_lateness_quantiles_ms": quantile_curve(slat),
        **cpu_res,
        "correctness": _correctness(tracker, n, complete),
    }


def _growth(rss: dict[str, dict[str, int] | None]) -> dict[str, int] | None:
    start, peak = rss.get("start"), rss.get("peak")
    if start is None or peak is None:
        return None
    return {key: peak[key] - start[key] for key in peak if key in start}


def pilot_rate(system: System, p: Params, ctx: dict) -> dict:
    """A short ingest (far-future messages) to estimate the rate when W2 runs without W1."""
    n = min(p.n, 20_000)
    t0 = int(now_ms())
    elapsed = produce(system, None, n, lambda s, e: [t0 + W1_MAX_DELAY_MS] * (e - s), p,
                      f"{system.name} pilot")
    ctx.setdefault("ingest_rate", {})[system.name] = n / elapsed
    return {"n": n, "msgs_per_s": n / elapsed}


WORKLOADS: dict[str, Callable[[System, Params, dict], dict]] = {
    "w1": w1_ingest,
    "w2": w2_burst,
    "w3": w3_steady,
}
