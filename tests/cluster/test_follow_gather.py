"""How often a follower reads the write-ahead stream (scheduler/cluster/node.py): after a fetch
that brought fewer records than it asked for (it reached the stream's end) the next one waits
until ``FOLLOW_GATHER_MS`` after it, so records arriving meanwhile come in one fetch; after a
full fetch (it trails) or an empty one (the fetch itself waited) it fetches again at once.
On a fake clock, with stand-ins for the NATS link, the broker and the node's stop event."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from scheduler.broker import FOLLOWER
from scheduler.clock import FakeClock
from scheduler.cluster.node import FOLLOW_BATCH, FOLLOW_GATHER_MS, ClusterNode
from tests.support.engine import START_MS

LEASE_MS = 1500
HOLDER = json.dumps({"nodeId": "h0", "url": "http://h0"}).encode()


class FakeLink:
    """A stream that hands each fetch the number of records queued for it."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sizes: list[int] = []  # what each next fetch returns
        self.fetched_at: list[int] = []

    def fetch(self, from_seq: int, max_records: int, wait_s: float) -> list[Any]:
        self.fetched_at.append(self.clock.now_ms())
        n = min(self.sizes.pop(0) if self.sizes else 0, max_records)
        now = int(time.time() * 1000)
        return [(from_seq + i, b"R", now) for i in range(n)]

    def lease_holder(self) -> tuple[bytes, int] | None:
        return HOLDER, 1

    def first_seq(self) -> int:
        return 1


class FakeBroker:
    role = FOLLOWER
    consumed_seq = 0
    applied_seq = 0

    def apply(self, seq: int, data: bytes) -> None:
        self.consumed_seq = self.applied_seq = seq


class FakeStop:
    """The node's stop event: waiting advances the fake clock instead of sleeping."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.waited_ms: list[int] = []

    def wait(self, timeout_s: float) -> bool:
        ms = round(timeout_s * 1000)
        self.waited_ms.append(ms)
        self.clock.advance(ms)
        return False

    def is_set(self) -> bool:
        return False


def test_a_follower_at_the_streams_end_gathers_records_between_fetches() -> None:
    clock = FakeClock(START_MS)
    link = FakeLink(clock)
    node = ClusterNode(link, node_id="h1", url="http://h1", clock=clock,  # type: ignore[arg-type]
                       lease_ms=LEASE_MS)
    stop = FakeStop(clock)
    node._stop = stop  # type: ignore[assignment]
    broker: Any = FakeBroker()

    link.sizes = [FOLLOW_BATCH, FOLLOW_BATCH, 3, 1, 0, 2]
    for _ in range(6):
        node._follow(broker)
    at = link.fetched_at
    gaps = [b - a for a, b in itertools.pairwise(at)]
    # trailing: at once; after 3 and after 1 record: FOLLOW_GATHER_MS after that fetch; after
    # an empty one (the fetch waited for records itself): at once
    assert gaps == [0, 0, FOLLOW_GATHER_MS, FOLLOW_GATHER_MS, 0]
    assert broker.consumed_seq == 2 * FOLLOW_BATCH + 3 + 1 + 2

    # time spent applying counts: a fetch that came late already waits no more
    link.sizes = [1, 1]
    node._follow(broker)  # (after the partial 2: waits, then brings 1)
    clock.advance(FOLLOW_GATHER_MS + 5)  # applying took longer than the gather interval
    waits = len(stop.waited_ms)
    node._follow(broker)
    assert len(stop.waited_ms) == waits
