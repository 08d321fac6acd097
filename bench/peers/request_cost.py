"""What one request costs the server when requests come one at a time.

W3 (2 k msg/s) is a few hundred small requests a second, each alone on the connection: a
paced send, and the receive each paced delivery wakes. This starts a server as the
side-by-side does and sends ``--n`` requests of each kind back to back on one keep-alive
connection (the adapter's urllib3 pool), then prints the server's CPU per request, user and
system apart (the system part is the loopback TCP work and the wake-ups of the other side)::

    .venv/bin/python -m bench.peers.request_cost --n 2000
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import psutil

from .systems.hourglass import HourglassSystem

MSGPACK = {"Content-Type": "application/x-msgpack", "Accept": "application/x-msgpack"}


def _cpu(procs: list[psutil.Process]) -> tuple[float, float]:
    times = [p.cpu_times() for p in procs]
    return sum(t.user for t in times), sum(t.system for t in times)


def measure(system: HourglassSystem, n: int) -> dict[str, dict[str, float]]:
    """Server CPU (user, system, µs) and wall time per request of each kind."""
    topic, group = system.topic, system.group
    receive = msgpack.packb({"max": 1000})
    later = json.dumps({"body": "x", "delayMs": 3_600_000}).encode()
    kinds: dict[str, Callable[[], int]] = {
        "GET /healthz": lambda: system._call("GET", "/healthz").status,
        "receive, nothing there": lambda: system._call(
            "POST", f"/v1/topics/{topic}/groups/{group}:receive", receive, MSGPACK).status,
        "send one, due in 1 h": lambda: system._call(
            "POST", f"/v1/topics/{topic}/messages", later,
            {"Content-Type": "application/json"}).status,
    }
    server = system.server_processes()
    out = {}
    for name, call in kinds.items():
        status = call()
        if status >= 300:
            raise SystemExit(f"{name}: HTTP {status}")
        user0, sys0 = _cpu(server)
        began = time.perf_counter()
        for _ in range(n):
            call()
        wall = time.perf_counter() - began
        user1, sys1 = _cpu(server)
        out[name] = {"user_us": (user1 - user0) / n * 1e6, "system_us": (sys1 - sys0) / n * 1e6,
                     "wall_us": wall / n * 1e6}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers.request_cost",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="requests of each kind")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="hourglass-bench-"))
    system = HourglassSystem({})
    system.start(work)
    try:
        for name, row in measure(system, args.n).items():
            print(f"{name:24s} server CPU {row['user_us'] + row['system_us']:5.0f} µs "
                  f"(user {row['user_us']:.0f}, system {row['system_us']:.0f}), "
                  f"wall {row['wall_us']:.0f} µs per request")
    finally:
        system.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
