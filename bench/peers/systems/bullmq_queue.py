"""BullMQ (the ``bullmq`` Python package) with delayed jobs, on its own redis-server.

- send: ``Queue.addBulk`` of the batch, each job ``{"id", "b"}`` with ``jobId`` = message id,
  ``timestamp`` = now and ``delay`` = due - now (so BullMQ's due time is exactly ours),
  ``removeOnComplete`` / ``removeOnFail`` true (nothing kept after processing).
- consumers: ``consumers`` worker *processes*, each one ``Worker`` (``concurrency`` jobs in
  flight) whose async processor stamps the job's receive time and returns; BullMQ then marks it
  completed (removed). BullMQ promotes due delayed jobs itself inside ``moveToActive``. Worker
  processes, not threads: one Python process saturates a core at ~1.2 k jobs/s here, and
  BullMQ scales by adding worker processes.

The connection is handed over as options with ``socket_timeout=None``: redis-py 8 defaults to
a 5 s socket timeout, shorter than the worker's idle ``BZPOPMIN`` (up to 10 s), and
bullmq 3.4 then stalls silently on idle waits.

BullMQ is asyncio-only: for sending, the adapter runs one event loop in a thread of its own and
the harness's (threaded) producers submit coroutines to it.

Guarantee: at-least-once (a job whose worker dies before completing is retried after its lock
expires, as "stalled"). Durability: AOF, fsync every second.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import psutil

from ..common import Batch, log
from .base import Sink, System, SystemUnavailable
from .redis_server import REDIS_SETTINGS, RedisServer

QUEUE = "bench"


class BullMQSystem(System):
    name = "bullmq"
    label = "BullMQ (Python)"
    guarantee = "at-least-once (stalled jobs retried)"
    durability = ("AOF, appendfsync everysec: acked sends survive a process crash; "
                  "≤ ~1 s lost on an OS crash")

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
        self._procs: list[Any] = []

    def config(self) -> dict[str, str]:
        return {
            "bullmq": getattr(self._bullmq, "__version__", "?"),
            "redis-server": self.server.version or "?",
            **{k: repr(v) for k, v in REDIS_SETTINGS.items()},
            "connection": "redis-py asyncio, socket_timeout=None",
            "workers": f"{self.consumers} worker processes × 1 Worker × concurrency "
                       f"{self.concurrency}",
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
        """``self.consumers`` worker *processes* (BullMQ scales by adding worker processes; one
        Python process saturates a core at a few thousand jobs/s), each one ``Worker`` with
        ``concurrency`` jobs in flight. They stamp each job when the processor gets it and ship
        (id, time) pairs back every 20 ms."""
        ctx = mp.get_context("spawn")
        self._mp_stop = ctx.Event()
        self._mp_queue = ctx.Queue()
        ready = [ctx.Event() for _ in range(self.consumers)]
        self._procs = [
            ctx.Process(target=_worker_process, name=f"bullmq-worker-{k}", daemon=True,
                        args=(self._conn_opts(), self.concurrency, f"bench-{k}",
                              self._mp_queue, self._mp_stop, ready[k]))
            for k in range(self.consumers)
        ]
        for pr in self._procs:
            pr.start()
        for k, ev in enumerate(ready):
            if not ev.wait(60):
                raise RuntimeError(f"bullmq worker process {k} did not start")
        self._drain_stop = threading.Event()
        self._drainer = self.spawn_consumer_thread(
            self._drain, (self.consumer_cpu.timed_sink(sink),), "bullmq-drain")

    def _drain(self, sink: Sink) -> None:
        q = self._mp_queue
        while True:
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                if self._drain_stop.is_set():
                    return
                continue
            if isinstance(item, str):  # a worker process failed
                log(f"bullmq worker: {item}")
                self.consumer_error = RuntimeError(item)
                continue
            ids, times = item
            sink(ids, times, None)

    def stop_consumers(self) -> None:
        procs = getattr(self, "_procs", [])
        if not procs:
            return
        self._mp_stop.set()
        for pr in procs:
            pr.join(timeout=60)
            if pr.is_alive():
                pr.kill()
                pr.join(5)
        self._drain_stop.set()
        self._drainer.join(timeout=30)
        self._procs = []

    def server_processes(self) -> list[psutil.Process]:
        return self.server.proc.tree() if self.server.proc else []

    def consumer_processes(self) -> list[psutil.Process]:
        procs = []
        for pr in getattr(self, "_procs", []):
            try:
                if pr.pid is not None:
                    procs.append(psutil.Process(pr.pid))
            except psutil.Error:
                pass
        return procs

    # --- inspection ------------------------------------------------------------------------
    def pending_count(self) -> int | None:
        counts = self._run(self.queue.getJobCounts("delayed", "wait", "active", "prioritized"))
        return int(sum(int(v) for v in counts.values()))

    def footprint(self) -> dict[str, int | None]:
        time.sleep(1.5)  # AOF fsync runs every second
        return self.server.footprint()


def _worker_process(conn: dict, concurrency: int, name: str, out: Any, stop: Any,
                    ready: Any) -> None:
    """A BullMQ worker process: record (id, receive time) per job, ship them in batches."""
    import bullmq

    async def main() -> None:
        buf_ids: list[str] = []
        buf_t: list[float] = []

        async def processor(job: Any, token: str) -> None:
            buf_ids.append(job.data["id"])
            buf_t.append(time.time() * 1000.0)

        worker = bullmq.Worker(QUEUE, processor, {"connection": conn,
                                                  "concurrency": concurrency, "name": name})
        worker.on("error", lambda err, *a: out.put(f"{name}: {err!r}"))
        ready.set()
        try:
            while not stop.is_set():
                await asyncio.sleep(0.02)
                if buf_ids:
                    out.put((buf_ids[:], buf_t[:]))
                    del buf_ids[:], buf_t[:]
        finally:
            await worker.close()
            if buf_ids:
                out.put((buf_ids, buf_t))

    try:
        asyncio.run(main())
    except Exception as exc:
        out.put(f"{name} crashed: {exc!r}")
