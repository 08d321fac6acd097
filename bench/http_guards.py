"""``python -m bench.http_guards``: the CPU a request costs in uvicorn's httptools protocol,
without and with api/transport/'s guards.

In process, on uvloop: one protocol object on a fake transport is fed the same small POST
(7 headers, a 15-byte body) ``--requests`` times, answered by a trivial ASGI app; rounds of
the two protocols alternate, and the minimum and median per request are printed (the
minimum is the least disturbed by other processes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from api.transport import ConnectionLimits

REQUEST = (b"POST /v1/topics/orders/messages HTTP/1.1\r\nhost: 127.0.0.1:7740\r\n"
           b"authorization: Bearer abcdefghijklmnopqrstuvwxyz\r\n"
           b"content-type: application/json\r\naccept: */*\r\nuser-agent: bench\r\n"
           b'content-length: 15\r\n\r\n{"body": "x"}  ')


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _per_request_us(factory: Callable[..., Any], requests: int) -> float:
    config = uvicorn.Config(_app, lifespan="off", log_level="warning")
    config.load()
    protocol = factory(config=config, server_state=ServerState(), app_state={})
    protocol.connection_made(_Transport())
    started = time.process_time()
    for _ in range(requests):
        protocol.data_received(REQUEST)
        await asyncio.sleep(0)  # the ASGI task runs
        await asyncio.sleep(0)
    return (time.process_time() - started) / requests * 1e6


async def _measure(rounds: int, requests: int) -> dict[str, dict[str, float]]:
    guarded = ConnectionLimits(max_connections=1024, max_header_bytes=64 << 10,
                               header_timeout_ms=5_000)
    samples: dict[str, list[float]] = {"plain": [], "guarded": []}
    for _ in range(rounds):
        samples["plain"].append(await _per_request_us(HttpToolsProtocol, requests))
        samples["guarded"].append(await _per_request_us(guarded, requests))
    return {name: {"min_us": round(min(v), 2), "median_us": round(statistics.median(v), 2)}
            for name, v in samples.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_guards", description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--requests", type=int, default=10_000)
    args = parser.parse_args(argv)
    print(json.dumps(uvloop.run(_measure(args.rounds, args.requests))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
