"""``python -m bench.stream_fanout``: delivery lateness with many standing streams of one topic.

Every delivery commit to a topic writes the frames of its parked streams on the committing
thread (api/push.py): hundreds of streams on one topic made each commit read, encode and
write hundreds of times, and every topic of that timer shard waited. This starts ``hourglass
serve``, opens ``--streams`` streams of topic ``fan`` (read by one client thread that takes
every byte), then sends ``--rate`` messages a second for ``--seconds``, alternately to
``fan`` and to ``other`` (no stream), each due ``--delay-ms`` after it is sent, so each is
delivered by the scheduler at its due time. Lateness is ``storedAt - deliverAt`` of every
message, read back by pulls afterwards, per topic: what the committing thread's stream work
costs every delivery.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import selectors
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.http import _free_port, _start_server

TOPICS = ("fan", "other")


def _open_streams(port: int, token: str, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(f"GET /v1/topics/fan/messages:stream?durationMs=3600000 HTTP/1.1\r\n"
                     f"Host: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
        sock.setblocking(False)
        socks.append(sock)
    return socks


def _read_all(socks: list[socket.socket], stop: threading.Event, got: list[int]) -> None:
    """Take every byte of every stream until ``stop``; ``got[0]``: bytes read (a stream that
    was refused, 429 or 503, would read a few hundred: see ``stream_mib_read``)."""
    selector = selectors.DefaultSelector()
    for sock in socks:
        selector.register(sock, selectors.EVENT_READ)
    while not stop.is_set():
        for key, _ in selector.select(0.1):
            try:
                data = key.fileobj.recv(1 << 20)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            got[0] += len(data)
    selector.close()


def _lateness(client: httpx.Client, topic: str) -> list[int]:
    out, offset = [], 0
    while True:
        page = client.get(f"/v1/topics/{topic}/messages",
                          params={"offset": offset, "max": 1000}).json()
        out += [m["storedAt"] - m["deliverAt"] for m in page["messages"]]
        if not page["messages"]:
            return out
        offset = page["nextOffset"]


def _summary(values: list[int]) -> dict[str, float]:
    values = sorted(values)
    return {"messages": len(values), "p50_ms": statistics.median(values),
            "p99_ms": values[max(int(len(values) * 0.99) - 1, 0)], "max_ms": values[-1]}


def measure(*, streams: int, rate: int, seconds: float, delay_ms: int) -> dict[str, object]:
    token = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="hourglass-fanout-") as tmp:
        port = _free_port()
        # (one token opens every stream: past its default 64 it would get 429)
        os.environ["HOURGLASS_MAX_LONG_POLLS_PER_TOKEN"] = str(max(streams, 64))
        proc = _start_server(Path(tmp) / "data", port, token, Path(tmp) / "server.log")
        stop = threading.Event()
        got = [0]
        socks = _open_streams(port, token, streams)
        reader = threading.Thread(target=_read_all, args=(socks, stop, got), daemon=True)
        reader.start()
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}",
                              headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
                time.sleep(1.0)  # (the streams parked)
                batch = max(rate // 100, 1)  # a batch per topic every 2*10 ms
                began = time.monotonic()
                sent = 0
                while time.monotonic() - began < seconds:
                    for topic in TOPICS:
                        r = c.post(f"/v1/topics/{topic}/messages:batch", json={"messages": [
                            {"body": "x" * 100, "delayMs": delay_ms}
                            for _ in range(batch // 2 or 1)]})
                        r.raise_for_status()
                        sent += batch // 2 or 1
                    next_at = began + sent / rate
                    time.sleep(max(next_at - time.monotonic(), 0))
                time.sleep(delay_ms / 1000 + 1.0)  # the last ones delivered
                result: dict[str, object] = {"streams": streams, "rate": rate,
                                             "seconds": seconds, "delay_ms": delay_ms}
                for topic in TOPICS:
                    result[topic] = _summary(_lateness(c, topic))
                seen, quiet_since = -1, time.monotonic()
                while time.monotonic() - quiet_since < 1.0:  # the streams' last bytes read
                    if got[0] != seen:
                        seen, quiet_since = got[0], time.monotonic()
                    time.sleep(0.1)
                metrics = c.get("/metrics").text
                for name in ("frames_pushed", "handbacks"):
                    result[name] = next(
                        (float(line.split()[-1]) for line in metrics.splitlines()
                         if line.startswith(f"hourglass_stream_{name}_total")), None)
                result["stream_mib_read"] = round(got[0] / (1 << 20), 1)
                # delivery listener calls over their budget (scheduler/listeners.py), by name
                result["listener_overruns"] = {
                    line.split('"')[1]: float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith("hourglass_delivery_listener_overruns_total{")}
        finally:
            stop.set()
            reader.join(timeout=10)
            for sock in socks:
                sock.close()
            proc.terminate()
            proc.wait(timeout=60)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_fanout", description=__doc__)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--rate", type=int, default=1000, help="messages a second, in all")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--delay-ms", type=int, default=200)
    args = parser.parse_args(argv)
    print(json.dumps(measure(streams=args.streams, rate=args.rate, seconds=args.seconds,
                             delay_ms=args.delay_ms)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
