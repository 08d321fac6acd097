"""Three ``hourglass serve --cluster`` processes on loopback over a NatsCluster, for the
cluster tests and the failover measurement."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.support.nats_cluster import NatsCluster
from bench.support.server_process import ServerProcess, free_ports

TOKEN = "cluster-admin-token-0123456789"
LEASE_MS = 1500


class HourglassCluster:
    def __init__(self, root: Path, nats: NatsCluster, size: int = 3,
                 lease_ms: int = LEASE_MS, **settings: str) -> None:
        self.nats = nats
        self.nodes: list[ServerProcess] = []
        for i, port in enumerate(free_ports(size)):
            node = ServerProcess(root / f"h{i}", token=TOKEN, log_path=root / f"h{i}.log",
                                 port=port,
                                 settings={"cluster": nats.url_list, "node_id": f"h{i}",
                                           "cluster_lease_ms": str(lease_ms), "log_level": "info",
                                           # logs are read from offset 0: no segment deleted
                                           # for a disk other work filled (1.0: never)
                                           "disk_clean_ratio": "1.0", **settings})
            node.settings["advertise"] = node.base_url
            self.nodes.append(node)

    def start(self) -> None:
        for node in self.nodes:
            node.start(ready="/healthz")

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop(10)

    def get(self, node: ServerProcess, path: str, **kw: Any) -> httpx.Response:
        with node.client(timeout_s=10) as c:
            return c.get(path, **kw)

    def view(self, node: ServerProcess) -> dict[str, Any] | None:
        try:
            r = self.get(node, "/v1/cluster")
        except httpx.TransportError:
            return None
        return r.json() if r.status_code == 200 else None

    def leader(self, timeout_s: float = 30.0) -> ServerProcess:
        """The node that says it is leader (waits for one)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for node in self.nodes:
                if node.alive():
                    v = self.view(node)
                    if v is not None and v["role"] == "leader":
                        return node
            if time.monotonic() > deadline:
                raise AssertionError("no leader elected:\n" + "\n".join(
                    n.log_tail(15) for n in self.nodes))
            time.sleep(0.05)

    def wait_converged(self, timeout_s: float = 30.0) -> int:
        """Until every live node applied the same sequence as the leader; returns it."""
        deadline = time.monotonic() + timeout_s
        while True:
            views = [self.view(n) for n in self.nodes if n.alive()]
            seqs = {v["appliedSeq"] for v in views if v is not None}
            roles = sorted(v["role"] for v in views if v is not None)
            if len(seqs) == 1 and None not in views and roles.count("leader") == 1:
                return seqs.pop()
            if time.monotonic() > deadline:
                raise AssertionError(f"not converged: {views}")
            time.sleep(0.05)

    def __enter__(self) -> HourglassCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_topic(node: ServerProcess, topic: str) -> list[tuple[int, str]]:
    """(offset, msgId) of every message of ``topic`` as ``node`` serves it."""
    out: list[tuple[int, str]] = []
    offset = 0
    with node.client() as c:
        while True:
            r = c.get(f"/v1/topics/{topic}/messages", params={"offset": offset, "max": 1000})
            assert r.status_code == 200, r.text
            page = r.json()
            out += [(m["offset"], m["msgId"]) for m in page["messages"]]
            if not page["messages"]:
                return out
            offset = page["nextOffset"]


def until(condition: Callable[[], bool], timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.05)
