"""The one small interface every system adapter implements.

A workload runs on a *fresh instance* of a system: ``start(workdir)``, then sends and consumes,
then ``stop()``. The adapter owns its server processes (started on 127.0.0.1, a free port, in
``workdir``) and its client connections.

Threads: ``send`` is called from several producer threads at once; consumers are threads (or,
for BullMQ, tasks on the adapter's own event loop) that call ``sink(ids, recv_ms, server_late)``
with each batch the moment the consumer code has it in hand.

The consumer side's CPU (what a deployment runs beside the server to get messages out: the
consumers, and a peer's own scheduling loop such as Redis's mover) is measured, not estimated:
every such thread is started through ``spawn_consumer_thread`` and every such process is
listed by ``consumer_processes``; ``consumer_cpu_s`` adds up their CPU time (a live thread's
from ``/proc/self/task/<tid>/schedstat``, an ended one's as it read ``time.thread_time()``
last thing before ending). Of that, ``sink_cpu_s`` is the harness's own bookkeeping inside
those threads (the sink: every system's consumer calls it, once per batch it receives).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from ..common import Batch

# sink(ids, recv_ms (one for the batch, or one per id), server_lateness_ms or None)
Sink = Callable[[Sequence[str], float | Sequence[float], Sequence[float] | None], None]


class SystemUnavailable(RuntimeError):
    """The system cannot run here (server missing, failed to start): skip it with this message."""


class System(ABC):
    #: short name used on the command line and in results
    name: str = ""
    #: human label for tables and plots
    label: str = ""
    #: delivery guarantee as configured here
    guarantee: str = ""
    #: durability as configured here
    durability: str = ""

    def __init__(self, options: dict) -> None:
        self.options = options
        self.consumers: int = int(options.get("consumers", 2))
        self._stop_consumers = threading.Event()
        self._threads: list[threading.Thread] = []
        self.consumer_cpu = ConsumerCpu()

    # --- lifecycle -------------------------------------------------------------------------
    @abstractmethod
    def start(self, workdir: Path) -> None:
        """Start a fresh server in ``workdir`` and connect; SystemUnavailable if impossible."""

    @abstractmethod
    def stop(self) -> None:
        """Close clients and stop servers; safe to call twice and after a failed start."""

    # --- producing -------------------------------------------------------------------------
    @abstractmethod
    def send(self, batch: Batch) -> None:
        """Store one batch durably as configured; return once the system acknowledged it."""

    # --- consuming -------------------------------------------------------------------------
    def start_consumers(self, sink: Sink) -> None:
        """Start consuming in the background; default: ``self.consumers`` threads of
        ``consume_loop``."""
        self._stop_consumers.clear()
        timed = self.consumer_cpu.timed_sink(sink)
        for k in range(self.consumer_threads()):
            self._threads.append(self.spawn_consumer_thread(
                self._guarded_loop, (k, timed), f"{self.name}-consumer-{k}"))

    def spawn_consumer_thread(self, target: Callable[..., object], args: tuple,
                              name: str) -> threading.Thread:
        """Start a thread of the consumer side (a consumer, a mover), its CPU accounted."""
        return self.consumer_cpu.spawn(target, args, name)

    def consumer_processes(self) -> list[psutil.Process]:
        """Processes of the consumer side (BullMQ's workers), for CPU accounting."""
        return []

    def consumer_cpu_s(self) -> tuple[float, float]:
        """CPU seconds so far of the consumer side (threads and processes), and of the sink
        within it: monotonic over the adapter's life, so a phase takes the difference."""
        total = self.consumer_cpu.threads_s()
        for p in self.consumer_processes():
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total, self.consumer_cpu.sink_s()

    def consumer_threads(self) -> int:
        return self.consumers

    def _guarded_loop(self, k: int, sink: Sink) -> None:
        try:
            self.consume_loop(k, sink, self._stop_consumers)
        except Exception as exc:  # surface it: a dead consumer shows up as missing messages
            from ..common import log

            log(f"{self.name} consumer {k} died: {exc!r}")
            self.consumer_error = exc

    def consume_loop(self, k: int, sink: Sink, stop: threading.Event) -> None:
        raise NotImplementedError

    def stop_consumers(self) -> None:
        self._stop_consumers.set()
        for t in self._threads:
            t.join(timeout=30)
        self._threads.clear()

    # --- inspection ------------------------------------------------------------------------
    @abstractmethod
    def pending_count(self) -> int | None:
        """Messages stored and not yet handed to a consumer (None if the system cannot say)."""

    def delivered_count(self) -> int:
        """Messages the system already delivered on its own (hourglass moves due messages into
        its log without a consumer); 0 for the queues, where nothing moves without one."""
        return 0

    @abstractmethod
    def footprint(self) -> dict[str, int | None]:
        """Bytes: ``memory`` (server RSS/PSS or the store's own figure), ``disk`` (data dir),
        and any system-specific parts (``aof``, ``wal``, ``relation``, ...)."""

    def compacted_disk(self) -> int | None:
        """Bytes of the data dir once the system compacted what it stores, if it has such a
        step (called last in W1: it may stop the server); None if it has none."""
        return None

    def server_processes(self) -> list[psutil.Process]:
        """The server's processes (for CPU accounting); empty if not started here."""
        return []

    def config(self) -> dict[str, str]:
        """The settings that matter for reading the numbers (shown in the report)."""
        return {}

    def extra_results(self) -> dict[str, object]:
        """System-specific figures of the workload just run, merged into its results (the
        cluster's follower lag); called once it finished, before ``stop``."""
        return {}

    def describe(self) -> dict[str, object]:
        return {"label": self.label, "guarantee": self.guarantee,
                "durability": self.durability, "config": self.config()}


def _schedstat_s(tid: int) -> float | None:
    """CPU seconds of one thread of this process (the scheduler's runtime, ns), or None when
    it has ended."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class ConsumerCpu:
    """The CPU time of the consumer side's threads: started by ``spawn``, read by
    ``threads_s`` (live threads from the kernel, ended ones as they measured themselves), and
    the part spent in the sink (``timed_sink``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, threading.Thread] = {}  # native id -> thread
        self._ended_s = 0.0
        self._sink_s = 0.0

    def spawn(self, target: Callable[..., object], args: tuple, name: str) -> threading.Thread:
        started = threading.Event()

        def run() -> None:
            tid = threading.get_native_id()
            with self._lock:
                self._live[tid] = threading.current_thread()
            started.set()
            try:
                target(*args)
            finally:
                spent = time.thread_time()
                with self._lock:
                    self._live.pop(tid, None)
                    self._ended_s += spent

        t = threading.Thread(target=run, name=name, daemon=True)
        t.start()
        started.wait()
        return t

    def threads_s(self) -> float:
        with self._lock:  # a thread that ends meanwhile waits to move its figure over
            total = self._ended_s
            for tid in self._live:
                spent = _schedstat_s(tid)
                if spent is not None:
                    total += spent
            return total

    def sink_s(self) -> float:
        with self._lock:
            return self._sink_s

    def timed_sink(self, sink: Sink) -> Sink:
        def timed(ids: Sequence[str], recv: float | Sequence[float],
                  server_late: Sequence[float] | None) -> None:
            t0 = time.thread_time()
            try:
                sink(ids, recv, server_late)
            finally:
                spent = time.thread_time() - t0
                with self._lock:
                    self._sink_s += spent

        return timed
