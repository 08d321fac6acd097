"""A poll reads its own group's due range and nothing else: RocksDB's own counters show it
steps over neither other groups' keys nor the tombstones of finished checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from storage.rocks import RocksStore
from tests.support.engine import Harness

from .conftest import prepare

SKIP = "rocksdb.number.iter.skip"  # internal entries (tombstones, shadowed values) stepped over
NEXT = "rocksdb.number.db.next"  # live entries iterated
N = 2_000
T = TypeVar("T")


def _moved(store: RocksStore, action: Callable[[], T]) -> tuple[int, int, T]:
    before = store.statistics()
    result = action()
    after = store.statistics()
    return after[SKIP] - before[SKIP], after[NEXT] - before[NEXT], result


def _fill(broker: Broker, clock: FakeClock) -> None:
    """N finished transactions of group "busy" (each claimed once, then committed: two
    tombstones each in the group's check order), N prepared ones of group "idle", and one
    prepared "busy" message due at the end."""
    busy = [prepare(broker, f"b{i}", group="busy").transaction_id for i in range(N)]
    for i in range(N):
        prepare(broker, f"i{i}", group="idle")
    clock.advance(6_000)
    while broker.transactions.poll_checks("busy", 1000):
        pass
    for tx in busy:
        broker.transactions.commit(tx)
    prepare(broker, "live", group="busy")
    clock.advance(6_000)


def test_polls_skip_finished_checks_and_other_groups(harness: Harness, clock: FakeClock) -> None:
    # (flaky: the harness keeps the store; nothing fails. "wait": RocksDB's counters are the
    # whole DB's, and the dispatcher must not count rounds of group "idle" meanwhile)
    broker = harness.open(flaky=True, transaction_unanswered_checks="wait")
    store = harness.store
    assert store is not None
    _fill(broker, clock)
    skipped, nexts, checks = _moved(store, lambda: broker.transactions.poll_checks("busy", 10))
    assert [c.msg_id for c in checks] == ["live"]
    assert skipped < 50, skipped  # not the 2 N tombstones below the group's floor
    assert nexts <= 5, nexts  # and none of the N keys of "idle"

    # the contrast: a restarted broker does not know the floor yet; its first poll steps over
    # the tombstones once (until compaction drops them), and learns the floor
    broker.close()
    broker = harness.open(flaky=True, transaction_unanswered_checks="wait")
    store = harness.store
    assert store is not None
    clock.advance(30_000)
    skipped, _, checks = _moved(store, lambda: broker.transactions.poll_checks("busy", 10))
    assert [c.msg_id for c in checks] == ["live"]
    assert skipped >= N, skipped
    clock.advance(30_000)
    skipped, _, checks = _moved(store, lambda: broker.transactions.poll_checks("busy", 10))
    assert [c.msg_id for c in checks] == ["live"]
    assert skipped < 50, skipped


def test_unanswered_rounds_leave_a_polling_groups_due_checks_alone(
        harness: Harness, clock: FakeClock) -> None:
    """RocketMQ's rule (the default) runs a round at each prepare that may be due first: the
    due checks of a group that polls are its poller's, and are not read again every round."""
    broker = harness.open(flaky=True)
    store = harness.store
    assert store is not None
    for i in range(N):
        prepare(broker, f"p{i}", group="polled")
    clock.advance(6_000)
    assert len(broker.transactions.poll_checks("polled", 1)) == 1  # it polls: present
    broker.transactions.dispatcher.join()

    def rounds() -> None:
        for i in range(20):
            prepare(broker, f"o{i}", group="other")
            broker.transactions.dispatcher.join()

    _, nexts, _ = _moved(store, rounds)
    assert nexts < N, nexts  # not the N due keys of "polled" once per round
    assert broker.metrics.tx_checks_unanswered.value == 0
