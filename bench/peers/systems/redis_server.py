"""A redis-server for one run: Debian's binary, 127.0.0.1, AOF on with fsync every second."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import redis

from ..common import ManagedProcess, dir_size, free_port, tree_memory, wait_until
from .base import SystemUnavailable

# The settings that the report states; everything else is redis-server's default.
REDIS_SETTINGS = {
    "appendonly": "yes",
    "appendfsync": "everysec",
    "save": "",                 # no RDB snapshots: the AOF is the only persistence
    "maxmemory-policy": "noeviction",
}


class RedisServer:
    def __init__(self) -> None:
        self.proc: ManagedProcess | None = None
        self.port = 0
        self.dir: Path | None = None
        self.version = ""

    def start(self, workdir: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemUnavailable("redis-server not found (apt-get install redis-server)")
        self.dir = workdir / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        argv = [exe, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.dir),
                "--daemonize", "no", "--protected-mode", "no", "--logfile", ""]
        for k, v in REDIS_SETTINGS.items():
            argv += [f"--{k}", v]
        self.proc = ManagedProcess("redis-server", argv, workdir / "redis.log",
                                   stop_signal=signal.SIGTERM)
        probe = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)
        try:
            wait_until(lambda: bool(probe.ping()), 30, "redis-server", self.proc)
            self.version = str(probe.info("server").get("redis_version", ""))
        finally:
            probe.close()

    def client(self, **kw: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)  # type: ignore[arg-type]

    def footprint(self) -> dict[str, int | None]:
        assert self.proc is not None and self.dir is not None
        c = self.client(socket_timeout=10)
        try:
            mem = c.info("memory")
        finally:
            c.close()
        aof_dir = self.dir / "appendonlydir"
        aof = dir_size(aof_dir) if aof_dir.exists() else 0
        proc_mem = tree_memory(self.proc.tree())
        return {
            "memory": int(mem["used_memory"]),
            "used_memory_rss": int(mem["used_memory_rss"]),
            "process_rss": proc_mem["rss"],
            "aof": aof,
            "disk": dir_size(self.dir),
        }

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
