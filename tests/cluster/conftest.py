"""The cluster tests' set-ups, once: a loopback cluster (3 NATS servers, 3 hourglass nodes,
started here, stopped by PID) and, without NATS, a leader engine shipping to an in-memory
stream beside a follower's storage applying it.

A test that needs other settings for its cluster says so with a marker, for instance
``@pytest.mark.cluster(lease_ms=6000, cluster_snapshot_records="20")`` (keyword arguments
of ``HourglassCluster``: ``lease_ms``, or any hourglass setting as a string).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.support.hourglass_cluster import HourglassCluster
from bench.support.nats_cluster import NatsCluster
from scheduler.clock import FakeClock
from tests.support.replication import FollowerNode, MemoryStream, Pair, open_leader


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cluster(**settings): the settings of the loopback cluster fixture")


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HourglassCluster]:
    """3 NATS servers and 3 hourglass nodes on 127.0.0.1 (settings: the ``cluster`` mark)."""
    mark = request.node.get_closest_marker("cluster")
    settings: dict[str, Any] = {} if mark is None else dict(mark.kwargs)
    with NatsCluster(tmp_path / "nats") as nats, HourglassCluster(tmp_path, nats,
                                                                  **settings) as hc:
        yield hc


@pytest.fixture
def pair(tmp_path: Path, clock: FakeClock) -> Iterator[Pair]:
    """A ``Pair``, closed after the test."""
    yield from _pair(tmp_path, clock)


def _pair(tmp_path: Path, clock: FakeClock, **leader_kw: Any) -> Iterator[Pair]:
    stream = MemoryStream()
    leader, reps = open_leader(tmp_path / "leader", clock, stream, **leader_kw)
    follower = FollowerNode(tmp_path / "follower")
    pair = Pair(stream, leader, reps, follower)
    try:
        yield pair
    finally:
        pair.close()


@pytest.fixture
def small_messages_pair(tmp_path: Path, clock: FakeClock) -> Iterator[Pair]:
    """A ``pair`` whose leader cuts records into stream messages of at most 16 KiB."""
    for p in _pair(tmp_path, clock, max_message_bytes=16 << 10):
        p.stream.max_bytes = 16 << 10
        yield p
