"""W2 alone with competing members: the CPU of its drain, the server's and this process's
(the consumers'), from the due time until every message is in hand.

The side-by-side's W2 reports CPU over the ingest and the drain together; on a shared
machine its drain time moves with the other work there (``bench.peers.burst_cpu`` does one
burst to a stream, by server thread). This starts a server as the
side-by-side does, starts the adapter's consumers (``--mode receive``: ``--consumers``
members of one group; ``pull`` / ``stream``), sends ``--n`` messages due at one instant
``--lead-ms`` after the start, and prints the drain (due -> last message in hand), when the
last one was in the log (the server's ``storedAt``), the CPU of the drain window, and the
receive requests the server answered and their mean time in it (``/metrics``)::

    .venv/bin/python -m bench.peers.members_burst --n 200000 --encoding json

``--hourglass-rev REV`` serves a frozen copy of REV (as ``bench.peers.run``'s), for runs in
turns against another commit with the same client.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from storage.native import PURE_PYTHON_ENV

from .common import Batch, Tracker, msg_id, now_ms, random_bodies
from .run import freeze_source, frozen_unbuilt
from .systems.hourglass import HourglassSystem


def _cpu(procs: list[psutil.Process]) -> float:
    return sum(t.user + t.system for t in (p.cpu_times() for p in procs))


def _receives(system: HourglassSystem) -> tuple[float, float]:
    """(receive requests answered, their seconds in the server) so far, from /metrics."""
    lines = [line for line in system._call("GET", "/metrics").data.decode().splitlines()
             if ":receive" in line]

    def metric(name: str) -> float:
        return sum(float(line.split()[-1]) for line in lines if line.startswith(name))

    return (metric("hourglass_http_requests_total"),
            metric("hourglass_http_request_duration_seconds_sum"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers.members_burst",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("receive", "pull", "stream"), default="receive")
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--consumers", type=int, default=2, help="group members (receive)")
    ap.add_argument("--encoding", choices=("msgpack", "json"), default="msgpack")
    ap.add_argument("--lead-ms", type=int, default=6_000,
                    help="the messages are due this long after the first send")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="give up this many seconds after the due time")
    ap.add_argument("--hourglass-rev", default=None, metavar="REV",
                    help="run the server from a frozen copy of this git commit (as "
                         "bench.peers.run's), to pair runs against another commit")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="hourglass-burst-"))
    options: dict[str, object] = {"hourglass_consume": args.mode, "consumers": args.consumers,
                                  "hourglass_encoding": args.encoding}
    if args.hourglass_rev:
        src, commit = freeze_source(args.hourglass_rev, work)
        options["hourglass_src"] = src
        if frozen_unbuilt(src):
            options["hourglass_env"] = {PURE_PYTHON_ENV: "1"}
        print(f"server at {commit[:12]}")
    system = HourglassSystem(options)
    system.start(work)
    try:
        tracker = Tracker(args.n)
        system.start_consumers(tracker.record)
        due = int(now_ms()) + args.lead_ms
        bodies = random_bodies(1000)
        for start in range(0, args.n, 1000):
            stop = min(start + 1000, args.n)
            system.send(Batch([msg_id(i) for i in range(start, stop)], [due] * (stop - start),
                              bodies[:stop - start]))
        if now_ms() >= due:
            raise SystemExit("the ingest outlasted --lead-ms: give it more")
        server, me = system.server_processes(), psutil.Process()
        while now_ms() < due - 500:
            time.sleep(0.01)
        before = _receives(system)  # (the receives long-polling until the due time are in)
        while now_ms() < due:
            time.sleep(0.001)
        server0, client0 = _cpu(server), _cpu([me])
        while tracker.distinct < args.n and now_ms() < due + args.timeout * 1000:
            time.sleep(0.002)
        server1, client1 = _cpu(server), _cpu([me])
        if tracker.distinct < args.n:
            raise SystemExit(f"only {tracker.distinct:,} of {args.n:,} messages in hand")
        requests, took = np.subtract(_receives(system), before)
        print(f"{args.mode}, {args.encoding}: drain {(np.nanmax(tracker.recv) - due) / 1000:.3f} s"
              f" (all in the log by {np.nanmax(tracker.server_late) / 1000:.3f} s); CPU of the "
              f"drain: server {server1 - server0:.2f} s, client {client1 - client0:.2f} s; "
              f"{requests:.0f} receive requests answered after the due time (those long-polling "
              f"until it included), {took / max(requests, 1) * 1000:.2f} ms each in the server "
              f"(first byte in to last byte out)")
    finally:
        system.stop_consumers()
        system.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
