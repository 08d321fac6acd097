"""How long the leader waits for one write-ahead publish, alone: a 3-server JetStream cluster
on loopback (bench/support's ``NatsCluster``, R3 stream, ``GOMAXPROCS=1``), records of
``--bytes`` published one at a time with the expected last sequence, as the leader does,
by each way in turn (rounds alternated):

- ``nats-py``: ``NatsLink.publish`` (the coroutine handed to the link's event loop thread);
- ``direct``: ``DirectPublisher`` on whatever server it reaches first;
- ``direct-leader``: ``DirectPublisher`` on the server leading the stream's RAFT group.

``--busy`` threads spin in Python meanwhile (the leader's HTTP loop and scanners want the
GIL too). Prints p50/p90/p99/max of each way's publishes, in ms, and this process's CPU per
publish.

    PYTHONPATH=. .venv/bin/python -m bench.publish_latency [--records 2000] [--rounds 3]
        [--bytes 1100] [--busy 1]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.support.nats_cluster import NatsCluster
from scheduler.cluster.link import ClusterNames, NatsLink
from scheduler.cluster.publisher import DirectPublisher


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bytes", type=int, default=1100)
    ap.add_argument("--busy", type=int, default=0, help="threads spinning in Python")
    ap.add_argument("--ways", default="nats-py,direct,direct-leader")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hg-publish-latency-"))
    cluster = NatsCluster(root)
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            for _ in range(1000):
                x += 1

    link = None
    try:
        cluster.start()
        cluster.wait_listening()
        link = NatsLink(cluster.urls, direct_publish=False)  # (its publish: nats-py's)
        link.connect()
        leader = link.stream_leader()
        subject = ClusterNames().wal_subject
        record = bytes(args.bytes)
        for _ in range(args.busy):
            threading.Thread(target=spin, daemon=True).start()
        times: dict[str, list[float]] = {}
        cpu: dict[str, float] = {}
        seq = link.last_seq()
        for _ in range(args.rounds):
            for way in args.ways.split(","):
                pub = None
                publish: Callable[[bytes, int], int]
                if way == "nats-py":
                    publish = link.publish
                else:
                    pub = DirectPublisher(cluster.urls, subject)
                    got = pub.connect(leader if way == "direct-leader" else None)
                    if way == "direct-leader" and got != leader:
                        print(f"(no connection to the stream's leader {leader}: {got})")
                    publish = pub.publish
                out = times.setdefault(way, [])
                c0 = time.process_time()
                for _ in range(args.records):
                    t0 = time.perf_counter()
                    seq = publish(record, seq)
                    out.append((time.perf_counter() - t0) * 1000)
                cpu[way] = cpu.get(way, 0.0) + time.process_time() - c0
                if pub is not None:
                    pub.close()
        for way, ms in times.items():
            a = np.array(ms)
            print(f"{way:14s} p50 {np.percentile(a, 50):.3f} p90 {np.percentile(a, 90):.3f} "
                  f"p99 {np.percentile(a, 99):.3f} max {a.max():.2f} ms; CPU "
                  f"{cpu[way] / len(a) * 1e6:.0f} µs a publish (this process, "
                  f"{args.busy} busy threads)")
    finally:
        stop.set()
        if link is not None:
            link.close()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
