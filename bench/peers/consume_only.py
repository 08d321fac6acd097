"""How fast the hourglass adapter's consumers read messages that are already in the log.

W2 measures scans, delivery commits and consumers together. This takes the commits out: it
starts a server (as the side-by-side does), sends ``--n`` messages due at once (each is
appended to the log on arrival), waits until every one is delivered, then starts the
adapter's consumers (``--mode receive``: two members of one group; ``pull``: one reader)
and times them until every message is in hand, with the CPU the server and this process
spent meanwhile::

    .venv/bin/python -m bench.peers.consume_only --mode receive --n 200000
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from .common import Batch, Tracker, msg_id, now_ms, random_bodies
from .systems.hourglass import HourglassSystem


@contextlib.contextmanager
def server_with_messages(n: int, options: dict) -> Iterator[HourglassSystem]:
    """A server started as the side-by-side starts it, holding ``n`` messages sent due at
    once and all delivered into the log; stopped and its data removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix="hourglass-bench-"))
    system = HourglassSystem(options)
    system.start(work)
    try:
        due = int(now_ms())
        for start in range(0, n, 1000):
            stop = min(start + 1000, n)
            system.send(Batch([msg_id(i) for i in range(start, stop)], [due] * (stop - start),
                              random_bodies(stop - start)))
        while system.pending_count() or system.delivered_count() < n:
            time.sleep(0.2)
        yield system
    finally:
        system.stop()
        shutil.rmtree(work, ignore_errors=True)


def _cpu(procs: list[psutil.Process]) -> float:
    return sum(t.user + t.system for t in (p.cpu_times() for p in procs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers.consume_only",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("receive", "pull", "stream"), default="receive")
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--consumers", type=int, default=2, help="group members (receive)")
    ap.add_argument("--body", choices=("once", "both"), default="once",
                    help="`Prefer: body=once` on the pulls and receives, or not (both bodies)")
    ap.add_argument("--encoding", choices=("msgpack", "json"), default="msgpack",
                    help="answers in msgpack (the API's opt-in) or JSON (its default)")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="give up when not every message is in hand after this many seconds")
    args = ap.parse_args(argv)
    options = {"hourglass_consume": args.mode, "consumers": args.consumers,
               "hourglass_body": args.body, "hourglass_encoding": args.encoding}
    with server_with_messages(args.n, options) as system:
        tracker = Tracker(args.n)
        server, me = system.server_processes(), psutil.Process()
        server0, client0 = _cpu(server), _cpu([me])
        began = time.perf_counter()
        system.start_consumers(tracker.record)
        while tracker.distinct < args.n:
            if time.perf_counter() - began > args.timeout:
                system.stop_consumers()
                raise SystemExit(f"only {tracker.distinct:,} of {args.n:,} messages in hand "
                                 f"after {args.timeout:.0f} s")
            time.sleep(0.002)
        elapsed = time.perf_counter() - began
        server1, client1 = _cpu(server), _cpu([me])
        system.stop_consumers()
        print(f"{args.mode}, body {args.body}, {args.encoding}: {args.n:,} messages in hand "
              f"in {elapsed:.3f} s "
              f"({args.n / elapsed:,.0f} msg/s); CPU: server {server1 - server0:.2f} s, "
              f"client {client1 - client0:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
