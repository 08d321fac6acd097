"""A poll reads its own group's due range and nothing else: RocksDB's own counters show it
steps over neither other groups' keys nor the tombstones of finished checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from storage.timer_store import TimerStore

from .conftest import Harness, prepare

SKIP = "rocksdb.number.iter.skip"  # internal entries (tombstones, shadowed values) stepped over
NEXT = "rocksdb.number.db.next"  # live entries iterated
N = 2_000
T = TypeVar("T")


def _moved(store: TimerStore, action: Callable[[], T]) -> tuple[int, int, T]:
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
    while broker.poll_transaction_checks("busy", 1000):
        pass
    for tx in busy:
        broker.commit_transaction(tx)
    prepare(broker, "live", group="busy")
    clock.advance(6_000)


def test_polls_skip_finished_checks_and_other_groups(harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(flaky=True)  # (flaky: the harness keeps the store; nothing fails)
    store = harness.store
    assert store is not None
    _fill(broker, clock)
    skipped, nexts, checks = _moved(store, lambda: broker.poll_transaction_checks("busy", 10))
    assert [c.msg_id for c in checks] == ["live"]
    assert skipped < 50, skipped  # not the 2 N tombstones below the group's floor
    assert nexts <= 5, nexts  # and none of the N keys of "idle"

    # the contrast: a restarted broker does not know the floor yet; its first poll steps over
    # the tombstones once (until compaction drops them), and learns the floor
    broker.close()
    broker = harness.open(flaky=True)
    store = harness.store
    assert store is not None
    clock.advance(30_000)
    skipped, _, checks = _moved(store, lambda: broker.poll_transaction_checks("busy", 10))
    assert [c.msg_id for c in checks] == ["live"]
    assert skipped >= N, skipped
    clock.advance(30_000)
    skipped, _, checks = _moved(store, lambda: broker.poll_transaction_checks("busy", 10))
    assert [c.msg_id for c in checks] == ["live"]
    assert skipped < 50, skipped
