"""Three nats-server processes (JetStream, one cluster) on free loopback ports under a tmp
dir, for the cluster tests. Stops exactly the processes it started, by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.support.server_process import free_ports

NATS_SERVER = Path(sys.executable).parent / "nats-server"


class NatsCluster:
    def __init__(self, root: Path, size: int = 3, *, gomaxprocs: int | None = 1) -> None:
        """``gomaxprocs``: each server's GOMAXPROCS (None: Go's default, the machine's cores;
        a GOMAXPROCS in this process's environment wins). 1 by default: three servers share
        this machine's cores with the hourglass nodes, and a Go runtime that runs goroutines
        on every core spins and switches looking for work (W1's records: 5.7 instead of 6.9 ms
        of the NATS servers' CPU a record, with local consumers; docs/cluster.md, "Measured")."""
        self.root = root
        self.gomaxprocs = gomaxprocs
        root.mkdir(parents=True, exist_ok=True)
        self.size = size
        ports = free_ports(3 * size)
        self.ports = ports[:size]
        self.cluster_ports = ports[size:2 * size]
        self.monitor_ports = ports[2 * size:]  # /healthz
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * size

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.ports]

    @property
    def url_list(self) -> str:
        return ",".join(self.urls)

    def _config(self, i: int) -> Path:
        routes = ", ".join(f"nats-route://127.0.0.1:{p}"
                           for j, p in enumerate(self.cluster_ports) if j != i)
        store = self.root / f"n{i}"
        store.mkdir(parents=True, exist_ok=True)
        path = self.root / f"n{i}.conf"
        path.write_text(
            f'server_name: "n{i}"\nlisten: "127.0.0.1:{self.ports[i]}"\nmax_payload: 8MB\n'
            f'http: "127.0.0.1:{self.monitor_ports[i]}"\n'
            f'jetstream {{ store_dir: "{store}" }}\n'
            f'cluster {{ name: "hg", listen: "127.0.0.1:{self.cluster_ports[i]}", '
            f"routes: [{routes}] }}\n")
        return path

    def start(self, i: int | None = None) -> None:
        for n in range(self.size) if i is None else [i]:
            log = open(self.root / f"n{n}.log", "ab")
            env = dict(os.environ)
            if self.gomaxprocs is not None:
                env.setdefault("GOMAXPROCS", str(self.gomaxprocs))
            self.procs[n] = subprocess.Popen(
                [str(NATS_SERVER), "-c", str(self._config(n))], stdout=log, stderr=log,
                stdin=subprocess.DEVNULL, env=env)
            log.close()
        self.wait_listening()

    def wait_listening(self, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        for n, port in enumerate(self.ports):
            if self.procs[n] is None:
                continue
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"nats-server n{n} is not listening") from None
                    time.sleep(0.05)

    def healthy(self, i: int) -> bool:
        """nats-server ``i``'s ``/healthz``: 200 once it is in the cluster and every JetStream
        asset it holds a replica of (the write-ahead stream, the KV buckets) is current."""
        try:
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.monitor_ports[i]}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:  # (an HTTPError 503 included: not current yet)
            return False

    def wait_healthy(self, i: int, timeout_s: float = 60.0) -> float:
        """Seconds until nats-server ``i`` is healthy (RuntimeError past ``timeout_s``)."""
        started = time.monotonic()
        while not self.healthy(i):
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"nats-server n{i} not healthy in {timeout_s} s")
            time.sleep(0.05)
        return time.monotonic() - started

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, sig)
            proc.wait(10)
        self.procs[i] = None

    def stop(self) -> None:
        for n, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(10)
            self.procs[n] = None

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
