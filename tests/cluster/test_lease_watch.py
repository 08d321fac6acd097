"""How often a follower looks at the lease (scheduler/cluster/node.py), on a fake clock with a
stand-in for the NATS link: every third of a lease while the leader renews it; every
``LEASE_POLL_MS`` once a look finds it not renewed since the last one (the leader may be
gone: it is taken within that of lapsing), and at every step while it is free."""

from __future__ import annotations

import json
from typing import Any

from scheduler.broker import FOLLOWER
from scheduler.clock import FakeClock
from scheduler.cluster.node import LEASE_POLL_MS, ClusterNode
from tests.support.engine import START_MS

LEASE_MS = 1500
HOLDER = json.dumps({"nodeId": "h0", "url": "http://h0"}).encode()


class FakeLink:
    """What a follower's step asks of NATS: the stream (empty reads) and the lease."""

    def __init__(self) -> None:
        self.holder: tuple[bytes, int] | None = (HOLDER, 1)
        self.last = 0
        self.acquired: list[bytes] = []

    def fetch(self, from_seq: int, max_records: int, wait_s: float) -> list[Any]:
        return []

    def first_seq(self) -> int:
        return 1

    def lease_holder(self) -> tuple[bytes, int] | None:
        return self.holder

    def last_seq(self) -> int:
        return self.last

    def lease_acquire(self, value: bytes) -> int | None:
        self.acquired.append(value)
        return None  # someone else was quicker


class FakeBroker:
    role = FOLLOWER
    consumed_seq = 0
    applied_seq = 0


def test_a_follower_looks_at_an_unrenewed_lease_often_and_at_a_free_one_at_every_step() -> None:
    clock = FakeClock(START_MS)
    link = FakeLink()
    node = ClusterNode(link, node_id="h1", url="http://h1", clock=clock,  # type: ignore[arg-type]
                       lease_ms=LEASE_MS)
    broker: Any = FakeBroker()

    node._follow(broker)  # first look: renewed since (none before)
    assert node._next_lease_ms == clock.now_ms() + LEASE_MS // 3
    assert node.leader_url == "http://h0"
    clock.advance(LEASE_MS // 3)
    link.holder = (HOLDER, 2)
    node._follow(broker)  # renewed: the usual pace
    assert node._next_lease_ms == clock.now_ms() + LEASE_MS // 3

    clock.advance(LEASE_MS // 3)
    node._follow(broker)  # revision 2 again: a renewal missed
    assert node._next_lease_ms == clock.now_ms() + LEASE_POLL_MS
    clock.advance(LEASE_POLL_MS)
    node._follow(broker)  # still not renewed: still often
    assert node._next_lease_ms == clock.now_ms() + LEASE_POLL_MS

    clock.advance(LEASE_POLL_MS)
    link.holder, link.last = None, 5  # lapsed; this follower has not applied 1..5 yet
    node._follow(broker)
    assert node.leader_url is None and link.acquired == []  # not at the stream's end
    assert node._next_lease_ms == clock.now_ms()  # looked at again at the next step
    broker.consumed_seq = 5
    node._follow(broker)
    assert len(link.acquired) == 1  # at the end: it tries to take it (another was quicker)
    assert node._next_lease_ms == clock.now_ms()

    clock.advance(10)
    link.holder = (json.dumps({"nodeId": "h2", "url": "http://h2"}).encode(), 7)
    node._follow(broker)  # the new holder, known at once: where writes are forwarded
    assert node.leader_url == "http://h2"
    assert node._next_lease_ms == clock.now_ms() + LEASE_MS // 3
