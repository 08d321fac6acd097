"""The one small interface every system adapter implements.

A workload runs on a *fresh instance* of a system: ``start(workdir)``, then sends and consumes,
then ``stop()``. The adapter owns its server processes (started on 127.0.0.1, a free port, in
``workdir``) and its client connections.

Threads: ``send`` is called from several producer threads at once; consumers are threads (or,
for BullMQ, tasks on the adapter's own event loop) that call ``sink(ids, recv_ms, server_late)``
with each batch the moment the consumer code has it in hand.
"""

from __future__ import annotations

import threading
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
        for k in range(self.consumer_threads()):
            t = threading.Thread(target=self._guarded_loop, args=(k, sink),
                                 name=f"{self.name}-consumer-{k}", daemon=True)
            t.start()
            self._threads.append(t)

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

    def describe(self) -> dict[str, object]:
        return {"label": self.label, "guarantee": self.guarantee,
                "durability": self.durability, "config": self.config()}
