"""``python -m bench.stream_commit_cost``: what a delivery commit spends on parked streams.

In process, no server: ``--streams`` streams of one topic parked with the pusher
(api/push.py) over socket pairs whose other ends a thread drains, and ``--commits`` commits
of ``--per-commit`` 100-byte messages, each followed by the delivery listener
(``StreamPusher.on_delivery``) as the committing thread runs it; frames encoded as the
stream route encodes JSON. Prints the time the committing thread spent in the listener per
commit (what every other topic of its shard waits for). ``--inline N`` sets how many
streams a commit writes itself before the writer thread takes a topic (default: the
pusher's own).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import selectors
import statistics
import sys
import threading
import time
from typing import Any

import msgspec

from api.push import ParkedStream, StreamPusher
from api.routes.consume import pull_result
from bench.support.push_streams import park_streams
from scheduler.codec import log_payload

TOPIC = "fan"
_json = msgspec.json.Encoder()


def _encode(payloads: list[bytes], at: int) -> bytes:
    return _json.encode(pull_result(payloads, at)) + b"\n"


def measure(*, streams: int, commits: int, per_commit: int,
            inline: int | None) -> dict[str, Any]:
    landed: list[bytes] = []
    loop = asyncio.new_event_loop()
    pusher = StreamPusher()
    if inline is not None:
        pusher.inline_streams = inline
    # (older pushers take no encoding)
    shares = "encoding" in inspect.signature(ParkedStream.__init__).parameters
    parked = park_streams(pusher, loop, streams, topic=TOPIC, encode=_encode,
                          read=lambda _t, o, k: landed[o:o + k], max_messages=1000,
                          encoding="json" if shares else None)
    stop = threading.Event()

    def drain() -> None:
        selector = selectors.DefaultSelector()
        for sock in parked.theirs:
            selector.register(sock, selectors.EVENT_READ)
        while not stop.is_set():
            for key, _ in selector.select(0.05):
                try:
                    key.fileobj.recv(1 << 20)  # type: ignore[union-attr]
                except BlockingIOError:
                    pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    times = []
    try:
        for _ in range(commits):
            for _ in range(per_commit):
                n = len(landed)
                landed.append(log_payload(TOPIC, f"m{n}", n, b"x" * 100, None, (), {},
                                          1, 2, 3, 0))
            started = time.perf_counter()
            pusher.on_delivery([TOPIC])
            times.append((time.perf_counter() - started) * 1000)
            time.sleep(0.004)  # (the default scan interval between commits)
        time.sleep(0.5)  # the writer thread's last pass
    finally:
        stop.set()
        reader.join(timeout=5)
        pusher.close()
        parked.close()
        loop.close()
    times.sort()
    return {"streams": streams, "commits": commits,
            "listener_p50_ms": round(statistics.median(times), 3),
            "listener_p99_ms": round(times[max(int(len(times) * 0.99) - 1, 0)], 3),
            "listener_mean_ms": round(statistics.mean(times), 3),
            "frames_pushed": pusher.totals()[0],
            "writer_passes": getattr(pusher, "writer_passes", None)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_commit_cost",
                                     description=__doc__)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--per-commit", type=int, default=4)
    parser.add_argument("--inline", type=int, default=None)
    args = parser.parse_args(argv)
    print(json.dumps(measure(streams=args.streams, commits=args.commits,
                             per_commit=args.per_commit, inline=args.inline)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
