"""What an HTTP client costs the consumer: httpx against urllib3, pulling the same messages.

The side-by-side's consumers share the machine's two cores with the server, so the CPU
their HTTP client spends is CPU the server does not get. This starts a server as the
side-by-side does, stores ``--n`` messages (due at once), then pulls all of them in
msgpack, 1000 a request, through each client in turn (``--rounds`` times), and prints the
client's CPU and the wall time per request::

    .venv/bin/python -m bench.peers.client_cost --n 100000 --rounds 2
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import httpx
import urllib3

from .consume_only import server_with_messages
from .systems.hourglass import MSGPACK, _read_page


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers.client_cost",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    with server_with_messages(args.n, {"hourglass_consume": "pull"}) as system:
        path = f"/v1/topics/{system.topic}/messages"
        headers = {"Accept": MSGPACK, "Authorization": f"Bearer {system.token}"}
        with httpx.Client(base_url=system.base, headers=headers) as hx, \
                urllib3.connection_from_url(system.base, headers=headers) as pool:
            clients: dict[str, Callable[[int], bytes]] = {
                "httpx": lambda offset: hx.get(
                    path, params={"max": 1000, "offset": offset}).content,
                "urllib3": lambda offset: pool.request(
                    "GET", f"{path}?max=1000&offset={offset}").data,
            }
            for _ in range(args.rounds):
                for name, get in clients.items():
                    cpu, wall, offset, requests = time.thread_time(), time.perf_counter(), 0, 0
                    while offset < args.n:
                        offset = _read_page(get(offset)).next_offset
                        requests += 1
                    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
                    print(f"{name:8s} per pull of 1000 (msgpack, decoded): client CPU "
                          f"{cpu / requests * 1e3:.2f} ms, wall {wall / requests * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
