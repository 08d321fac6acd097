"""``python -m bench.loop_lag``: how long the worst requests stall the others.

Starts ``hourglass serve`` (as ``hourglass bench http`` does), fills it with the worst cases
of the two requests that read storage the most: a scheduled listing whose range holds
``--foreign`` keys of another topic and none of its own (one page reads the whole scan
budget), and pulls of ``max=1000`` from a topic of ``--body``-byte messages (each answer is
the 8 MiB bound), or receives of as many by ``--receivers`` members of their own groups
(leases of 1 s: the messages come round again). While ``--listers`` clients list and
``--pullers`` clients pull in a loop, a probe sends ``GET /healthz`` every 10 ms on its own
connection: its latency is the time a request waits behind the others on the event loop
(the figure to keep under 50 ms).

The probe runs in a process of its own: in the clients' process it waited for their GIL
(httpx parsing 18 MiB answers) as much as for the server. The clients read each answer whole
and take ``nextOffset`` from its end (parsing 18 MiB of JSON in four threads of one process
is the client's cost, not the server's).
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import re
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.http import _free_port, _start_server

BATCH = 1000
_NEXT_OFFSET = re.compile(rb'"nextOffset":(\d+)}$')


def _probe(base: str, seconds: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """``GET /healthz`` every 10 ms for ``seconds``: the latencies in ms (its own process)."""
    latencies = []
    with httpx.Client(base_url=base, timeout=120) as probe:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            probe.get("/healthz").raise_for_status()
            latencies.append((time.perf_counter() - started) * 1000)
            time.sleep(0.01)
    out.put(latencies)


def _fill(client: httpx.Client, topic: str, count: int, body: bytes, delay_ms: int) -> None:
    text = base64.b64encode(body).decode()
    for _ in range(count // BATCH):
        r = client.post(f"/v1/topics/{topic}/messages:batch", json={"messages": [
            {"bodyBase64": text, "delayMs": delay_ms} for _ in range(BATCH)]})
        r.raise_for_status()


def measure(*, seconds: float, foreign: int, body: int, pulled: int, listers: int,
            pullers: int, receivers: int = 0) -> dict[str, float]:
    token = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="hourglass-lag-") as tmp:
        port = _free_port()
        proc = _start_server(Path(tmp) / "data", port, token, Path(tmp) / "server.log")
        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {token}"}
        try:
            with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
                _fill(client, "other", foreign, b"f", 3_600_000)  # an hour ahead: pending
                _fill(client, "pulled", pulled, b"p" * body, 0)  # due now: delivered
                while not client.get("/v1/topics/pulled/messages",
                                     params={"offset": pulled - 1}).json()["messages"]:
                    time.sleep(0.2)
            stop = threading.Event()
            counts = {"list": 0, "pull": 0, "receive": 0}
            answered = {"pull": 0, "receive": 0}  # answer bytes

            def load(kind: str, n: int) -> None:
                with httpx.Client(base_url=base, headers=headers, timeout=120) as c:
                    offset = 0
                    while not stop.is_set():
                        if kind == "list":
                            c.get("/v1/topics/mine/scheduled", params={"limit": 1000})
                        elif kind == "pull":
                            r = c.get("/v1/topics/pulled/messages",
                                      params={"offset": offset, "max": 1000})
                            r.raise_for_status()
                            found = _NEXT_OFFSET.search(r.content[-40:])
                            assert found is not None, r.content[-40:]
                            offset = int(found.group(1)) % pulled
                            answered[kind] += len(r.content)
                        else:
                            r = c.post(f"/v1/topics/pulled/groups/g{n}:receive",
                                       json={"max": 1000, "leaseMs": 1000})
                            r.raise_for_status()
                            answered[kind] += len(r.content)
                        counts[kind] += 1

            threads = [threading.Thread(target=load, args=("list", i)) for i in range(listers)]
            threads += [threading.Thread(target=load, args=("pull", i)) for i in range(pullers)]
            threads += [threading.Thread(target=load, args=("receive", i))
                        for i in range(receivers)]
            results: multiprocessing.Queue = multiprocessing.get_context(  # type: ignore[type-arg]
                "spawn").Queue()
            probe = multiprocessing.get_context("spawn").Process(
                target=_probe, args=(base, seconds, results))
            probe.start()
            time.sleep(1.0)  # (the probe's interpreter starting)
            for t in threads:
                t.start()
            latencies = results.get(timeout=seconds + 120)
            probe.join()
            stop.set()
            for t in threads:
                t.join()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    latencies.sort()
    return {"probes": len(latencies), "p50_ms": round(statistics.median(latencies), 2),
            "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 2),
            "max_ms": round(latencies[-1], 2), "listings": counts["list"],
            "pulls": counts["pull"], "receives": counts["receive"],
            "mib_answered": round(sum(answered.values()) / (1 << 20))}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loop_lag", description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--foreign", type=int, default=100_000,
                        help="pending keys of another topic in the listed range")
    parser.add_argument("--body", type=int, default=8192, help="bytes per pulled message")
    parser.add_argument("--pulled", type=int, default=10_000, help="messages to pull from")
    parser.add_argument("--listers", type=int, default=2)
    parser.add_argument("--pullers", type=int, default=4)
    parser.add_argument("--receivers", type=int, default=0)
    args = parser.parse_args(argv)
    result = measure(seconds=args.seconds, foreign=args.foreign, body=args.body,
                     pulled=args.pulled, listers=args.listers, pullers=args.pullers,
                     receivers=args.receivers)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
