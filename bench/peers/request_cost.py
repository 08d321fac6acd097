"""What one request costs the server when requests come one at a time.

W3 (2 k msg/s) is a few hundred small requests a second, each alone on the connection: a
paced send, and the receive each paced delivery wakes. This starts a server as the
side-by-side does and sends ``--n`` requests of each kind back to back on one keep-alive
connection (the adapter's urllib3 pool), then prints the server's CPU per request, user and
system apart (the system part is the loopback TCP work and the wake-ups of the other side)::

    .venv/bin/python -m bench.peers.request_cost --n 2000 --gaps-ms 0,4,20

``--gaps-ms``: the client sleeps this long before each request (0: back to back), as a paced
producer and a consumer woken once per scan do. On this machine's VMs the same request costs
the server ~3x the CPU after 20 ms idle as back to back: the CPU comes back from idle with
cold caches (docs/performance.md at f86b3f2, section 10).
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

from .common import number_list
from .systems.hourglass import HourglassSystem

MSGPACK = {"Content-Type": "application/x-msgpack", "Accept": "application/x-msgpack"}


def _cpu(procs: list[psutil.Process]) -> tuple[float, float]:
    times = [p.cpu_times() for p in procs]
    return sum(t.user for t in times), sum(t.system for t in times)


def measure(system: HourglassSystem, n: int, gap_s: float = 0.0) -> dict[str, dict[str, float]]:
    """Server CPU (user, system, µs) and wall time per request of each kind, the client idle
    ``gap_s`` before each request (the wall time counts the requests only)."""
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
        wall = 0.0
        for _ in range(n):
            if gap_s:
                time.sleep(gap_s)
            began = time.perf_counter()
            call()
            wall += time.perf_counter() - began
        user1, sys1 = _cpu(server)
        out[name] = {"user_us": (user1 - user0) / n * 1e6, "system_us": (sys1 - sys0) / n * 1e6,
                     "wall_us": wall / n * 1e6}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers.request_cost",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="requests of each kind")
    ap.add_argument("--gaps-ms", default="0",
                    help="idle time before each request, ms, comma-separated (default 0)")
    args = ap.parse_args(argv)
    gaps = number_list(ap, "--gaps-ms", args.gaps_ms, float, "0,4,20")
    work = Path(tempfile.mkdtemp(prefix="hourglass-bench-"))
    system = HourglassSystem({})
    system.start(work)
    try:
        for gap in gaps:
            for name, row in measure(system, args.n, gap / 1000).items():
                print(f"gap {gap:g} ms  {name:24s} server CPU "
                      f"{row['user_us'] + row['system_us']:5.0f} µs (user {row['user_us']:.0f}, "
                      f"system {row['system_us']:.0f}), wall {row['wall_us']:.0f} µs per request")
    finally:
        system.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
