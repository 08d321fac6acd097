"""Start a loopback cluster (3 NATS servers, 3 hourglass nodes) and keep it up until
interrupted, printing the leader's URL and the token: for running bench/peers against it.

    PYTHONPATH=. .venv/bin/python -m bench.cluster_up /tmp/hg-cluster
    python -m bench.peers.run --n 200000 --systems hourglass \\
        --hourglass-url <leader URL> --token <token> --out bench/peers/results-cluster

Uses the tests' support classes (a source checkout only, as every benchmark)."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from bench.support.hourglass_cluster import TOKEN, HourglassCluster
from bench.support.nats_cluster import NatsCluster


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else "/tmp/hg-cluster")
    root.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with NatsCluster(root / "nats") as nats, HourglassCluster(
            root, nats, lease_ms=2000, log_level="warning") as cluster:
        leader = cluster.leader()
        print(f"leader {leader.base_url} token {TOKEN} nodes "
              f"{' '.join(n.base_url for n in cluster.nodes)}", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
