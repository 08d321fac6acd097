"""The plain Redis delay queue: a sorted set scored by due time, a Lua mover, a ready list.

- send: one ``ZADD`` per batch, member = ``id|body``, score = due epoch ms.
- mover (one thread, as a deployment runs one scheduler loop): ``EVALSHA`` of a script that
  atomically takes up to 1000 members with score <= now (``ZRANGEBYSCORE ... LIMIT``),
  ``RPUSH``es them to the ready list and ``ZREM``s them, and returns the next due score; the
  mover loops at once while it moves full batches, else sleeps until the next due score
  (at least 1 ms, at most 50 ms: a newly added earlier message waits at most that long).
- consumers: ``LPOP ready 1000``; when empty, ``BLPOP ready 0.5`` (one message) and go on.

Guarantee: at-most-once to the consumer (a popped message is gone; a consumer crash loses it),
no duplicates. Durability: AOF, fsync every second (an acknowledged send can be lost in the
last second before a crash).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import redis

from ..common import Batch, log, now_ms
from .base import Sink, System
from .redis_server import REDIS_SETTINGS, RedisServer

MOVE_LUA = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then
  redis.call('RPUSH', KEYS[2], unpack(due))
  redis.call('ZREM', KEYS[1], unpack(due))
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if nxt[2] then
  return {#due, nxt[2]}
end
return {#due}
"""

ZSET = "dq:bench:delayed"
READY = "dq:bench:ready"
MOVE_BATCH = 1000
POP_BATCH = 1000
IDLE_SLEEP_S = 0.05
MIN_SLEEP_S = 0.001  # a 1 ms floor: no busy loop while messages trickle in


class RedisZSetSystem(System):
    name = "redis"
    label = "Redis ZSET + Lua"
    guarantee = "at-most-once (pop = delete), no duplicates"
    durability = ("AOF, appendfsync everysec: acked sends survive a process crash; "
                  "≤ ~1 s lost on an OS crash")

    def __init__(self, options: dict) -> None:
        super().__init__(options)
        self.server = RedisServer()
        self.client: redis.Redis | None = None
        self._mover: threading.Thread | None = None
        self._sha = ""
        self.moved = 0

    def config(self) -> dict[str, str]:
        return {
            "redis-server": self.server.version or "?",
            **{k: repr(v) for k, v in REDIS_SETTINGS.items()},
            "mover": f"1 thread, EVALSHA ZRANGEBYSCORE LIMIT {MOVE_BATCH} -> RPUSH; "
                     f"idle sleep ≤ {int(IDLE_SLEEP_S * 1000)} ms, wakes at next due score",
            "consumers": f"{self.consumers} threads, LPOP {POP_BATCH} / BLPOP",
            "send": "1 ZADD of the whole batch per request",
        }

    def start(self, workdir: Path) -> None:
        self.server.start(workdir)
        # a pool shared by producer, mover and consumer threads (redis-py is thread-safe)
        self.client = self.server.client(socket_timeout=30, max_connections=64)
        self._sha = str(self.client.script_load(MOVE_LUA))

    def stop(self) -> None:
        self.stop_consumers()
        if self.client is not None:
            self.client.close()
            self.client = None
        self.server.stop()

    def send(self, batch: Batch) -> None:
        assert self.client is not None
        mapping = {f"{i}|{b}": d for i, d, b in zip(batch.ids, batch.due_ms, batch.bodies,
                                                    strict=True)}
        self.client.zadd(ZSET, mapping)

    # --- consuming -------------------------------------------------------------------------
    def start_consumers(self, sink: Sink) -> None:
        super().start_consumers(sink)
        self._mover = self.spawn_consumer_thread(self._move_loop, (), "redis-mover")

    def stop_consumers(self) -> None:
        super().stop_consumers()
        if self._mover is not None:
            self._mover.join(timeout=30)
            self._mover = None

    def _move_loop(self) -> None:
        assert self.client is not None
        stop = self._stop_consumers
        try:
            while not stop.is_set():
                res = self.client.evalsha(self._sha, 2, ZSET, READY, int(now_ms()), MOVE_BATCH)
                moved = int(res[0])
                self.moved += moved
                if moved >= MOVE_BATCH:
                    continue
                wait = IDLE_SLEEP_S
                if len(res) > 1:
                    wait = min(max((float(res[1]) - now_ms()) / 1000.0, MIN_SLEEP_S), wait)
                stop.wait(wait)
        except Exception as exc:
            log(f"redis mover died: {exc!r}")
            self.consumer_error = exc

    def consume_loop(self, k: int, sink: Sink, stop: threading.Event) -> None:
        assert self.client is not None
        c = self.client
        while not stop.is_set():
            items = c.lpop(READY, POP_BATCH)
            if not items:
                got = c.blpop([READY], timeout=0.5)
                if got is None:
                    continue
                items = [got[1]]
            t = now_ms()
            sink([m.split(b"|", 1)[0] for m in items], t, None)

    # --- inspection ------------------------------------------------------------------------
    def server_processes(self) -> list[psutil.Process]:
        return self.server.proc.tree() if self.server.proc else []

    def pending_count(self) -> int | None:
        assert self.client is not None
        return int(self.client.zcard(ZSET)) + int(self.client.llen(READY))

    def footprint(self) -> dict[str, int | None]:
        # AOF fsync runs every second: let the last second reach the disk before measuring
        time.sleep(1.5)
        return self.server.footprint()
