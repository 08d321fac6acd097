"""What the three NATS servers spend on each write-ahead record, alone: a 3-server JetStream
cluster on loopback (bench/support's ``NatsCluster``, R3 stream), a leader ``NatsLink``
publishing W1 records one at a time (with the expected last sequence, as the leader does)
while two follower links read them (``NatsLink.fetch``, as followers do), concurrently.
Per record: the three nats-server processes' CPU (psutil, from the first publish to the
last record read by both followers), and this process's.

Modes, alternated round by round:
- ``random``: each follower's pull consumer where JetStream puts it (one of the three
  servers at random; from another one than the follower's, every record crosses a route);
- ``local``: made again until it is on the server the follower is connected to
  (``NatsLink.local_consumer_tries``, what followers do);
and ``--gomaxprocs`` runs the servers with that GOMAXPROCS (0: Go's default, the cores).

    PYTHONPATH=. .venv/bin/python -m bench.nats_cluster_cost [--records 300] [--rounds 3]
        [--modes random,local] [--gomaxprocs 0,1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bench.follower_apply import make_stream
from bench.support.nats_cluster import NatsCluster
from scheduler.cluster.link import NatsLink


def nats_cpu(cluster: NatsCluster) -> float:
    total = 0.0
    for proc in cluster.procs:
        if proc is not None:
            t = psutil.Process(proc.pid).cpu_times()
            total += t.user + t.system
    return total


def one_run(messages: list[bytes], local: bool, gomaxprocs: int,
            pause_s: float = 0.0) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="hg-nats-cost-"))
    cluster = NatsCluster(root, gomaxprocs=gomaxprocs or None)  # (no GOMAXPROCS in the env)
    links: list[NatsLink] = []
    try:
        cluster.start()
        for name in ("leader", "f1", "f2"):
            link = NatsLink(cluster.urls, replicas=3, timeout_s=5.0, name=name)
            link.local_consumer_tries = 6 if local else 1
            link.connect()
            links.append(link)
        leader, followers = links[0], links[1:]
        for f in followers:  # make the consumers before measuring
            f.fetch(1, 1, 0.05)
            assert f.consumer_placement is not None
        n = len(messages)
        done = [0, 0]
        fetches = [0, 0]

        def follow(i: int) -> None:
            nxt = 1
            while nxt <= n:
                got = followers[i].fetch(nxt, 256, 0.25)
                fetches[i] += 1
                for seq, _data, _ts in got:
                    nxt = seq + 1
                if pause_s:
                    time.sleep(pause_s)
            done[i] = nxt - 1

        c0, p0, w0 = nats_cpu(cluster), time.process_time(), time.monotonic()
        threads = [threading.Thread(target=follow, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        seq = 0
        for m in messages:
            seq = leader.publish(m, seq)
        for t in threads:
            t.join()
        c1, p1, w1 = nats_cpu(cluster), time.process_time(), time.monotonic()
        placement = [f.consumer_placement for f in followers]
        return {"nats_ms": (c1 - c0) / n * 1000, "client_ms": (p1 - p0) / n * 1000,
                "wall_s": w1 - w0, "fetches": sum(fetches),
                "local": sum(1 for p in placement if p and p[0] == p[1]),
                "placement": placement}
    finally:
        for link in links:
            link.close()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="random,local")
    ap.add_argument("--gomaxprocs", default="0")
    ap.add_argument("--pauses-ms", default="0",
                    help="the followers' pause after each fetch (more records a fetch)")
    args = ap.parse_args()
    messages = make_stream(args.records, 1000, 7)[1:]  # (the first: the leader's start)
    print(f"{len(messages)} records of {sum(map(len, messages)) / len(messages) / 1000:.0f} "
          f"KB; load {os.getloadavg()[0]:.2f}")
    variants = [(mode, int(g), float(p)) for g in args.gomaxprocs.split(",")
                for mode in args.modes.split(",") for p in args.pauses_ms.split(",")]
    for r in range(args.rounds):
        for mode, g, pause in variants if r % 2 == 0 else variants[::-1]:
            out = one_run(messages, mode == "local", g, pause / 1000)
            print(f"round {r} {mode:6s} GOMAXPROCS={g or 'default'} pause {pause:g} ms: NATS "
                  f"{out['nats_ms']:.2f} ms/record, client {out['client_ms']:.2f}, "
                  f"{out['fetches']} fetches, "
                  f"{out['wall_s']:.1f} s, consumers on the follower's server: "
                  f"{out['local']}/2 {out['placement']}; load {os.getloadavg()[0]:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
