"""``hourglass bench groups``: consumer groups with competing members against pulls, in server
CPU per message, and the drain speed-up of a second member.

Starts ``hourglass serve`` (as ``hourglass bench http`` does: one uvicorn worker, a fresh data
directory), pre-fills one topic with delivered messages of 100 bytes, then measures, each
phase on its own group of that topic so every phase reads the same messages:

- ``pull``: ``GET …/messages?offset=R&max=1000`` at random offsets, over ``--connections``
  keep-alive connections (bench/http.py's ``pull`` phase);
- ``receive-ack``: ``--connections`` members, each ``POST …:receive`` (max 1000) then
  ``POST …:ack`` with the 1000 receipts, for ``--duration`` seconds;
- ``drain-1`` / ``drain-2``: one, then two members drain ``--drain`` messages (receive + ack)
  of a fresh group; the figure is messages per second of wall time.

The result that matters is messages per server CPU-second (the server process's user + system
time over the measured window), pull against receive+ack, and drain-2 / drain-1.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson
import psutil

from bench.http import (
    _free_port,
    _prefill,
    _process_cpu,
    _run_phase,
    _start_server,
    request_bytes,
)
from storage.constants import MAX_PULL_MESSAGES

TOPIC = "bench.groups"


@dataclass
class GroupPhase:
    name: str
    seconds: float
    messages: int
    messages_per_s: float
    server_cpu_s: float
    messages_per_server_cpu_s: float
    errors: int


async def _member(port: int, token: str, group: str, stop: list[bool], counted: list[int],
                  errors: list[int], until: int | None) -> None:
    """receive (1000) + ack in a loop on one connection; stops at ``stop`` or, with
    ``until``, once the group has received that many messages in all."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
    path = f"/v1/topics/{TOPIC}/groups/{group}"
    receive = request_bytes("POST", f"{path}:receive", token,
                            orjson.dumps({"max": MAX_PULL_MESSAGES, "leaseMs": 600_000}))

    async def call(request: bytes) -> tuple[int, bytes]:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        at = head.lower().find(b"content-length:")
        length = int(head[at + 15:head.index(b"\r\n", at)]) if at >= 0 else 0
        return int(head[9:12]), await reader.readexactly(length)

    try:
        while not stop[0] and (until is None or counted[0] < until):
            status, body = await call(receive)
            messages = orjson.loads(body)["messages"] if status == 200 else []
            if status != 200:
                errors[0] += 1
            if not messages:
                return  # drained (a phase that runs dry ends early: see its seconds)
            status, _ = await call(request_bytes("POST", f"{path}:ack", token, orjson.dumps(
                {"receipts": [m["receipt"] for m in messages]})))
            if status == 200:
                counted[0] += len(messages)
            else:
                errors[0] += 1
    finally:
        writer.close()


async def _members(name: str, port: int, token: str, group: str, members: int,
                   server: psutil.Process, *, duration_s: float | None = None,
                   until: int | None = None) -> GroupPhase:
    stop = [False]
    counted, errors = [0], [0]
    cpu_before = _process_cpu(server)
    started = time.perf_counter()
    tasks = [asyncio.create_task(_member(port, token, group, stop, counted, errors, until))
             for _ in range(members)]
    if duration_s is not None:
        await asyncio.sleep(duration_s)
        stop[0] = True
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    cpu = _process_cpu(server) - cpu_before
    print(f"  {name}: {counted[0]:,} messages in {elapsed:.2f} s", file=sys.stderr)
    return GroupPhase(name=name, seconds=round(elapsed, 2), messages=counted[0],
                      messages_per_s=round(counted[0] / elapsed),
                      server_cpu_s=round(cpu, 2),
                      messages_per_server_cpu_s=round(counted[0] / cpu) if cpu > 0 else 0,
                      errors=errors[0])


async def _run(args: argparse.Namespace, port: int, token: str,
               server: psutil.Process) -> list[GroupPhase]:
    print(f"  prefilling {args.prefill:,} delivered messages", file=sys.stderr)
    await asyncio.to_thread(_prefill, port, token, TOPIC, args.prefill)
    rng = random.Random(7)
    top = max(1, args.prefill - MAX_PULL_MESSAGES)
    pulls = [request_bytes("GET", f"/v1/topics/{TOPIC}/messages?offset={rng.randrange(top)}"
                                  f"&max={MAX_PULL_MESSAGES}", token) for _ in range(4096)]
    print("phase pull", file=sys.stderr)
    pulled = await _run_phase("pull", port, itertools.cycle(pulls).__next__, MAX_PULL_MESSAGES,
                              args.warmup, args.duration, args.connections, server)
    results = [GroupPhase(
        name="pull", seconds=pulled.seconds, messages=pulled.messages,
        messages_per_s=pulled.messages_per_s, server_cpu_s=round(
            pulled.messages / pulled.messages_per_server_cpu_s, 2)
        if pulled.messages_per_server_cpu_s else 0.0,
        messages_per_server_cpu_s=pulled.messages_per_server_cpu_s, errors=pulled.errors)]
    print("phase receive-ack", file=sys.stderr)
    results.append(await _members("receive-ack", port, token, "bench-ra", args.connections,
                                  server, duration_s=args.duration))
    for members in (1, 2):
        print(f"phase drain-{members}", file=sys.stderr)
        results.append(await _members(f"drain-{members}", port, token, f"bench-d{members}",
                                      members, server, until=args.drain))
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hourglass bench groups", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0,
                        help="seconds of the pull and receive-ack phases")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    parser.add_argument("--connections", type=int, default=2,
                        help="connections (members) of the pull and receive-ack phases")
    parser.add_argument("--prefill", type=int, default=300_000,
                        help="messages delivered before the phases (receive-ack must not "
                             "run out of them)")
    parser.add_argument("--drain", type=int, default=100_000,
                        help="messages each drain phase receives and acknowledges")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    try:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        pass
    token = secrets.token_urlsafe(24)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="hourglass-bench-groups-") as tmp:
        proc = _start_server(Path(tmp) / "data", port, token, Path(tmp) / "server.log")
        try:
            results = asyncio.run(_run(args, port, token, psutil.Process(proc.pid)))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    by_name = {r.name: r for r in results}
    pull, ra = by_name["pull"], by_name["receive-ack"]
    d1, d2 = by_name["drain-1"], by_name["drain-2"]
    cpu_ratio = (pull.messages_per_server_cpu_s / ra.messages_per_server_cpu_s
                 if ra.messages_per_server_cpu_s else float("inf"))
    speedup = d2.messages_per_s / d1.messages_per_s if d1.messages_per_s else 0.0
    print(f"{'phase':<12} {'msgs':>9} {'seconds':>8} {'msgs/s':>9} {'server CPU-s':>13} "
          f"{'msgs/server CPU-s':>18} {'errors':>7}")
    for r in results:
        print(f"{r.name:<12} {r.messages:>9,} {r.seconds:>8} {r.messages_per_s:>9,} "
              f"{r.server_cpu_s:>13} {r.messages_per_server_cpu_s:>18,} {r.errors:>7}")
    print(f"server CPU per message, receive+ack / pull: {cpu_ratio:.2f}x; "
          f"drain with 2 members / 1 member: {speedup:.2f}x")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps({
            "benchmark": "groups", "phases": [asdict(r) for r in results],
            "cpu_per_message_receive_ack_over_pull": round(cpu_ratio, 3),
            "drain_speedup_2_over_1": round(speedup, 3),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "load_average": os.getloadavg()}, indent=2))
    return 0 if all(r.errors == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
