"""BullMQ (the ``bullmq`` Python package) with delayed jobs, on its own redis-server.

- send: ``Queue.addBulk`` of the batch, each job ``{"id", "b"}`` with ``jobId`` = message id,
  ``timestamp`` = now and ``delay`` = due - now (so BullMQ's due time is exactly ours),
  ``removeOnComplete`` / ``removeOnFail`` true (nothing kept after processing).
- consumers: ``Worker`` objects with an async processor that records the job and returns; the
  worker then marks it completed (removed). BullMQ promotes due delayed jobs itself inside its
  ``moveToActive`` script.

The connection is handed over as options with ``socket_timeout=None``: redis-py 8 defaults to
a 5 s socket timeout, shorter than the worker's idle ``BZPOPMIN`` (up to 10 s), and
bullmq 3.4 then stalls silently on idle waits.

BullMQ is asyncio-only: the adapter runs one event loop in a thread of its own and the
harness's (threaded) producers submit coroutines to it.

Guarantee: at-least-once (a job whose worker dies before completing is retried after its lock
expires, as "stalled"). Durability: AOF, fsync every second.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import psutil

from ..common import Batch, now_ms
from .base import Sink, System, SystemUnavailable
from .redis_server import REDIS_SETTINGS, RedisServer

QUEUE = "bench"


class BullMQSystem(System):
    name = "bullmq"
    label = "BullMQ (Python)"
    guarantee = "at-least-once (stalled jobs retried)"
    durability = "AOF, appendfsync everysec (≤1 s of acked sends lost on crash)"

    def __init__(self, options: dict) -> None:
        super().__init__(options)
        try:
            import bullmq
        except ImportError as exc:
            raise SystemUnavailable(f"python package bullmq missing: {exc}") from exc
        self._bullmq = bullmq
        self.server = RedisServer()
        self.concurrency = int(options.get("bullmq_concurrency", 50))
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self.queue: Any = None
        self.workers: list[Any] = []

    def config(self) -> dict[str, str]:
        return {
            "bullmq": getattr(self._bullmq, "__version__", "?"),
            "redis-server": self.server.version or "?",
            **{k: repr(v) for k, v in REDIS_SETTINGS.items()},
            "connection": "redis-py asyncio, socket_timeout=None",
            "workers": f"{self.consumers} Worker objects × concurrency {self.concurrency}, "
                       "one asyncio loop",
            "jobs": "removeOnComplete, removeOnFail, attempts 1",
            "send": "Queue.addBulk (one MULTI pipeline of addDelayedJob scripts)",
        }

    def _conn_opts(self) -> dict[str, Any]:
        return {"host": "127.0.0.1", "port": self.server.port, "socket_timeout": None}

    def _run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = 600) -> Any:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, workdir: Path) -> None:
        self.server.start(workdir)
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="bullmq-loop",
                                             daemon=True)
        self._loop_thread.start()

        async def make_queue() -> Any:
            return self._bullmq.Queue(QUEUE, {"connection": self._conn_opts()})

        self.queue = self._run(make_queue())

    def stop(self) -> None:
        try:
            self.stop_consumers()
            if self.queue is not None and self.loop is not None:
                self._run(self.queue.close(), timeout=30)
        finally:
            self.queue = None
            if self.loop is not None:
                self.loop.call_soon_threadsafe(self.loop.stop)
                if self._loop_thread is not None:
                    self._loop_thread.join(timeout=10)
                self.loop.close()
                self.loop = None
            self.server.stop()

    def send(self, batch: Batch) -> None:
        now = int(time.time() * 1000)
        jobs = [
            {"name": "m", "data": {"id": i, "b": b},
             "opts": {"jobId": i, "timestamp": now, "delay": max(d - now, 0),
                      "removeOnComplete": True, "removeOnFail": True}}
            for i, d, b in zip(batch.ids, batch.due_ms, batch.bodies, strict=True)
        ]
        self._run(self.queue.addBulk(jobs))

    # --- consuming -------------------------------------------------------------------------
    def start_consumers(self, sink: Sink) -> None:
        async def processor(job: Any, token: str) -> None:
            sink((job.data["id"],), now_ms(), None)

        async def make_workers() -> list[Any]:
            return [
                self._bullmq.Worker(QUEUE, processor, {
                    "connection": self._conn_opts(),
                    "concurrency": self.concurrency,
                    "name": f"bench-{k}",
                })
                for k in range(self.consumers)
            ]

        self.workers = self._run(make_workers())

    def stop_consumers(self) -> None:
        if self.workers and self.loop is not None:
            async def close_all() -> None:
                await asyncio.gather(*(w.close() for w in self.workers),
                                     return_exceptions=True)

            try:
                self._run(close_all(), timeout=60)
            finally:
                self.workers = []

    # --- inspection ------------------------------------------------------------------------
    def server_processes(self) -> list[psutil.Process]:
        return self.server.proc.tree() if self.server.proc else []

    def pending_count(self) -> int | None:
        counts = self._run(self.queue.getJobCounts("delayed", "wait", "active", "prioritized"))
        return int(sum(int(v) for v in counts.values()))

    def footprint(self) -> dict[str, int | None]:
        time.sleep(1.5)  # AOF fsync runs every second
        return self.server.footprint()
