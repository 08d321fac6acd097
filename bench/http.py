"""``hourglass bench http``: the HTTP API under load on loopback.

Starts ``hourglass serve`` as a subprocess (one uvicorn worker, uvloop + httptools) on a fresh
data directory and drives it from this process with an async load generator: 64 keep-alive
HTTP/1.1 connections over raw asyncio streams on uvloop (requests are pre-encoded bytes and
responses are read by Content-Length, so the generator costs a few µs per request and leaves
the CPU to the server). Phases:

- ``single``: ``POST /v1/topics/{t}/messages``, one message each (scheduled 1 h ahead);
- ``batch``: ``POST …/messages:batch`` with 1000 messages (JSON), and ``batch-msgpack``
  (the same as ``application/x-msgpack``);
- ``pull``: ``GET …/messages?offset=R&max=1000`` at random offsets of a topic pre-filled
  with delivered messages.

Each phase warms up, then measures for ``--duration`` seconds; progress goes to stderr, the
figures to stdout and, with ``--json PATH``, to a file.
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
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgpack
import msgspec
import orjson
import psutil

from storage.constants import MAX_PULL_MESSAGES

CONNECTIONS = 64
BATCH = 1000
PREFILL = 200_000
HOUR_MS = 3_600_000


@dataclass
class PhaseResult:
    name: str
    seconds: float
    requests: int
    messages: int
    errors: int
    requests_per_s: float
    messages_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    statuses: dict[str, int] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # % of the machine's CPU time
    #: messages per CPU-second of the server process (all its threads): what one dedicated
    #: core would serve; steal is not CPU time, so it moves this much less than msgs/s
    messages_per_server_cpu_s: float = 0.0


def cpu_times() -> list[int]:
    """The machine's CPU time counters (/proc/stat: user nice system idle iowait irq softirq
    steal), or [] where there is none."""
    try:
        with open("/proc/stat") as stat:
            return [int(x) for x in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return []


def _process_cpu(process: psutil.Process | None) -> float:
    """User + system CPU seconds of ``process`` (every thread), 0 without one."""
    if process is None:
        return 0.0
    times = process.cpu_times()
    return float(times.user + times.system)


def cpu_shares(before: list[int], after: list[int]) -> dict[str, float]:
    """Busy, idle and steal time between two ``cpu_times()``, in % of the total. Steal is
    time the hypervisor gave the machine's CPUs to someone else: a load average cannot show
    it, and a phase measured during heavy steal is not comparable."""
    if len(before) != 8 or len(after) != 8:
        return {}
    d = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(d) or 1
    return {"busy": round(100 * (total - d[3] - d[4] - d[7]) / total, 1),
            "idle": round(100 * (d[3] + d[4]) / total, 1), "steal": round(100 * d[7] / total, 1)}


# --- the load generator -----------------------------------------------------------------------
def request_bytes(method: str, path: str, token: str, body: bytes = b"",
                  content_type: str = "application/json") -> bytes:
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode("ascii") + body


async def _connection(stream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                      make: Callable[[], bytes], stop: list[bool],
                      latencies: list[tuple[float, float]], statuses: dict[int, int]) -> None:
    reader, writer = stream
    clock = time.perf_counter
    try:
        while not stop[0]:
            started = clock()
            writer.write(make())
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            at = head.lower().find(b"content-length:")
            length = int(head[at + 15:head.index(b"\r\n", at)]) if at >= 0 else 0
            await reader.readexactly(length)
            latencies.append((started, clock() - started))
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


async def _run_phase(name: str, port: int, make: Callable[[], bytes], per_request: int,
                     warmup_s: float, duration_s: float, connections: int,
                     server: psutil.Process | None = None) -> PhaseResult:
    """Opens every connection before the first request (uvicorn accepts about one new
    connection per event-loop turn under load, so connections opened during the load wait
    seconds for their first answer: a ramp, not the steady state); counts the requests that
    complete during the measured window, and takes latencies of those that also started in
    it."""
    stop = [False]
    latencies: list[tuple[float, float]] = []
    statuses: dict[int, int] = {}
    streams = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
                                     for _ in range(connections)))
    tasks = [asyncio.create_task(_connection(stream, make, stop, latencies, statuses))
             for stream in streams]
    await asyncio.sleep(warmup_s)
    latencies.clear()
    statuses.clear()
    cpu_before = cpu_times()
    server_before = _process_cpu(server)
    started = time.perf_counter()
    ticks = max(1, int(duration_s))
    for tick in range(ticks):
        await asyncio.sleep(duration_s / ticks)
        elapsed = time.perf_counter() - started
        print(f"  {name}: {tick + 1}/{ticks} s, {len(latencies) / elapsed:,.0f} req/s, "
              f"{len(latencies) * per_request / elapsed:,.0f} msgs/s", file=sys.stderr)
    stop[0] = True
    elapsed = time.perf_counter() - started
    cpu = cpu_shares(cpu_before, cpu_times())
    server_cpu = _process_cpu(server) - server_before
    done = len(latencies)
    ok = sum(n for status, n in statuses.items() if status < 300)
    await asyncio.gather(*tasks, return_exceptions=True)
    ordered = sorted(took for began, took in latencies[:done] if began >= started)
    def pct(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2) \
            if ordered else 0.0
    return PhaseResult(
        name=name, seconds=round(elapsed, 2), requests=done, messages=ok * per_request,
        errors=done - ok, requests_per_s=round(done / elapsed), messages_per_s=round(
            ok * per_request / elapsed), latency_p50_ms=pct(0.5), latency_p99_ms=pct(0.99),
        statuses={str(k): v for k, v in sorted(statuses.items())}, cpu=cpu,
        messages_per_server_cpu_s=round(ok * per_request / server_cpu) if server_cpu > 0 else 0,
    )


# --- the server ---------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _call(port: int, method: str, path: str, token: str, body: bytes | None = None,
          content_type: str = "application/json") -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method,
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _start_server(data_dir: Path, port: int, token: str, log: Path,
                  timeout_s: float = 120) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HOURGLASS_ADMIN_TOKEN": token, "HOURGLASS_LOG_LEVEL": "warning"}
    cmd = [sys.executable, "-m", "app.cli", "serve", "--data-dir", str(data_dir),
           "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                cwd=Path(__file__).resolve().parents[1])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}); see {log}")
        try:
            if _call(port, "GET", "/readyz", token)[0] == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the server did not become ready; see {log}")


def _prefill(port: int, token: str, topic: str, count: int) -> None:
    body = orjson.dumps({"messages": [{"body": "x" * 100} for _ in range(BATCH)]})
    for _ in range(count // BATCH):
        status, text = _call(port, "POST", f"/v1/topics/{topic}/messages:batch", token, body)
        if status != 201:
            raise RuntimeError(f"prefill failed: {status} {text[:200]!r}")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # delivery is asynchronous: wait until all are in the log
        _, raw = _call(port, "GET", f"/v1/topics/{topic}/messages?offset={count - 1}&max=1",
                       token)
        if orjson.loads(raw)["messages"]:
            return
        time.sleep(0.2)
    raise RuntimeError("prefilled messages were not delivered in time")


# --- where the time goes: the same work in-process, engine and API layer apart ---------------
def layer_costs(data_dir: Path, rounds: int = 20) -> dict[str, float]:
    """msgs/s of the engine alone (send_batch, pull of 1000) and of the API layer alone
    (decode + convert a JSON batch; convert + encode a pull), measured back to back."""
    from api import schemas
    from api.bodies import decode, to_send_request
    from api.routes.consume import delivered
    from scheduler.broker import Broker
    from scheduler.config import EngineConfig
    from scheduler.model import SendRequest

    def rate(work: Callable[[], object]) -> float:
        started = time.perf_counter()
        for _ in range(rounds):
            work()
        return round(rounds * BATCH / (time.perf_counter() - started))

    raw = orjson.dumps({"messages": [{"body": "x" * 100, "delayMs": HOUR_MS}] * BATCH})
    later = [SendRequest(topic="t", body=b"x" * 100, delay_ms=HOUR_MS)] * BATCH
    now = [SendRequest(topic="p", body=b"x" * 100)] * BATCH
    encoder = msgspec.json.Encoder()
    with Broker(EngineConfig(data_dir=data_dir, segment_size=256 << 20)) as broker:
        figures = {"engine_send_batch": rate(lambda: broker.send_batch(later))}
        for _ in range(rounds + 1):
            broker.send_batch(now)
        broker.drain()
        offsets = itertools.count(0, BATCH // 2)
        figures["engine_pull"] = rate(lambda: broker.pull("p", next(offsets), MAX_PULL_MESSAGES))
        page = broker.pull("p", 0, MAX_PULL_MESSAGES).messages
    figures["api_decode_batch"] = rate(lambda: [
        to_send_request(m, "t") for m in decode(raw, None, schemas.BatchIn).messages])
    figures["api_encode_pull"] = rate(lambda: encoder.encode(schemas.PullResult(
        messages=[delivered(m) for m in page], next_offset=0)))
    return figures


# --- main --------------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hourglass bench http", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--connections", type=int, default=CONNECTIONS)
    parser.add_argument("--phases", default="single,batch,batch-msgpack,pull")
    parser.add_argument("--prefill", type=int, default=PREFILL,
                        help="messages delivered before the pull phase")
    parser.add_argument("--data-dir", type=Path, help="default: a temporary directory")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--layer-rounds", type=int, default=20,
                        help="batches of 1000 per in-process breakdown figure (0: skip)")
    args = parser.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - {"single", "batch", "batch-msgpack", "pull"}
    if unknown:
        parser.error(f"unknown phase(s): {', '.join(sorted(unknown))}")

    try:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        pass
    token = secrets.token_urlsafe(24)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="hourglass-bench-http-") as tmp:
        data_dir = args.data_dir or Path(tmp) / "data"
        print(f"hourglass bench http: server on 127.0.0.1:{port}, data in {data_dir}, "
              f"{args.connections} connections, {args.duration:g} s per phase",
              file=sys.stderr)
        proc = _start_server(data_dir, port, token, Path(tmp) / "server.log")
        try:
            results = asyncio.run(_run(args, phases, port, token, psutil.Process(proc.pid)))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        layers = (layer_costs(Path(tmp) / "layers", args.layer_rounds)
                  if args.layer_rounds > 0 else {})
    report = {
        "benchmark": "http",
        "load_generator": f"async Python client (raw HTTP/1.1 over asyncio streams, uvloop), "
                          f"{args.connections} keep-alive connections, same machine",
        "server": "hourglass serve: 1 uvicorn worker, uvloop, httptools",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "phases": [asdict(r) for r in results],
        "layers_msgs_per_s": layers,
        "load_average": os.getloadavg(),
    }
    print(f"{'phase':<14} {'req/s':>9} {'msgs/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}"
          f" {'steal %':>8} {'msgs/server CPU-s':>18}")
    for r in results:
        print(f"{r.name:<14} {r.requests_per_s:>9,} {r.messages_per_s:>10,} "
              f"{r.latency_p50_ms:>8} {r.latency_p99_ms:>8} {r.errors:>7} "
              f"{r.cpu.get('steal', float('nan')):>8} {r.messages_per_server_cpu_s:>18,}")
    for name, value in layers.items():
        print(f"in-process {name:<18} {value:>10,.0f} msgs/s")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if all(r.errors == 0 for r in results) else 1


async def _run(args: argparse.Namespace, phases: list[str], port: int,
               token: str, server: psutil.Process | None = None) -> list[PhaseResult]:
    results = []
    single = request_bytes("POST", "/v1/topics/bench.single/messages", token,
                           orjson.dumps({"body": "x" * 100, "delayMs": HOUR_MS}))
    batch_messages = [{"body": "x" * 100, "delayMs": HOUR_MS} for _ in range(BATCH)]
    batch_json = request_bytes("POST", "/v1/topics/bench.batch/messages:batch", token,
                               orjson.dumps({"messages": batch_messages}))
    batch_msgpack = request_bytes("POST", "/v1/topics/bench.batch/messages:batch", token,
                                  msgpack.packb({"messages": batch_messages}),
                                  "application/x-msgpack")
    for phase in phases:
        print(f"phase {phase}", file=sys.stderr)
        make: Callable[[], bytes]
        per_request = BATCH
        if phase == "single":
            make, per_request = itertools.repeat(single).__next__, 1
        elif phase == "batch":
            make = itertools.repeat(batch_json).__next__
        elif phase == "batch-msgpack":
            make = itertools.repeat(batch_msgpack).__next__
        else:  # pull, at random offsets of a pre-filled topic
            print(f"  prefilling {args.prefill:,} delivered messages", file=sys.stderr)
            await asyncio.to_thread(_prefill, port, token, "bench.pull", args.prefill)
            rng = random.Random(7)
            top = max(1, args.prefill - MAX_PULL_MESSAGES)
            make = itertools.cycle([
                request_bytes("GET", f"/v1/topics/bench.pull/messages?offset="
                              f"{rng.randrange(top)}&max={MAX_PULL_MESSAGES}", token)
                for _ in range(4096)]).__next__
            per_request = MAX_PULL_MESSAGES
        results.append(await _run_phase(phase, port, make, per_request, args.warmup,
                                        args.duration, args.connections, server))
    return results


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
