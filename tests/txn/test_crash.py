"""Crash safety: a commit or a discard whose CommitLog append succeeded but whose RocksDB
write did not is finished by the log replay, at run time or on restart, and never
appended twice."""

from __future__ import annotations

import pytest

from scheduler.clock import FakeClock
from storage.constants import TOPIC_TRANS_CHECK_MAX_TIME
from storage.errors import Conflict, StorageError
from storage.records import MessageStatus
from tests.support.engine import Harness, read_topic

from .conftest import prepare


def _fail_the_write_after_the_next_append(harness: Harness) -> None:
    store, log = harness.store, harness.log
    assert store is not None and log is not None

    def arm(_positions: list[int]) -> None:
        store.fail_writes = 1
        log.after_append = None

    log.after_append = arm


@pytest.mark.parametrize("restart", [False, True])
def test_a_commit_that_reached_only_the_log_is_finished_not_repeated(
        harness: Harness, clock: FakeClock, restart: bool) -> None:
    broker = harness.open(flaky=True)
    tx = prepare(broker, "m")
    _fail_the_write_after_the_next_append(harness)
    with pytest.raises(StorageError):
        broker.transactions.commit(tx.transaction_id)  # the message is due now: log append
    if restart:
        broker.close()
        broker = harness.open(flaky=True)
    # the retried commit answers COMMITTED and appends nothing; a rollback now conflicts
    assert broker.transactions.commit(tx.transaction_id).status == "COMMITTED"
    with pytest.raises(Conflict):
        broker.transactions.rollback(tx.transaction_id)
    clock.advance(3_600_000)
    assert broker.transactions.poll_checks("pg", 10) == []
    broker.drain()
    assert [m.msg_id for m in read_topic(broker, "orders")] == ["m"]
    assert broker.status("orders", "m").status is MessageStatus.DELIVERED
    assert broker.stats().transactions_prepared == 0


def test_a_rollback_after_a_half_written_commit_conflicts(
        harness: Harness, clock: FakeClock) -> None:
    """The producer never saw its commit acknowledged and rolls back: the log says the
    message is delivered, so the rollback must not claim otherwise."""
    broker = harness.open(flaky=True)
    tx = prepare(broker, "m")
    _fail_the_write_after_the_next_append(harness)
    with pytest.raises(StorageError):
        broker.transactions.commit(tx.transaction_id)
    with pytest.raises(Conflict):
        broker.transactions.rollback(tx.transaction_id)
    assert broker.transactions.get(tx.transaction_id).status == "COMMITTED"
    assert [m.msg_id for m in read_topic(broker, "orders")] == ["m"]


@pytest.mark.parametrize("restart", [False, True])
def test_a_discard_that_reached_only_the_log_is_finished_not_repeated(
        harness: Harness, clock: FakeClock, restart: bool) -> None:
    broker = harness.open(flaky=True, transaction_check_max=0)
    tx = prepare(broker, "m")
    clock.advance(6_000)
    _fail_the_write_after_the_next_append(harness)
    with pytest.raises(StorageError):
        broker.transactions.poll_checks("pg", 10)  # discards at once: check maximum 0
    if restart:
        broker.close()
        broker = harness.open(flaky=True, transaction_check_max=0)
    assert broker.transactions.poll_checks("pg", 10) == []
    assert broker.transactions.get(tx.transaction_id).status == "DISCARDED"
    assert broker.status("orders", "m").status is MessageStatus.DISCARDED
    with pytest.raises(Conflict):
        broker.transactions.commit(tx.transaction_id)
    broker.drain()
    assert [m.msg_id for m in read_topic(broker, TOPIC_TRANS_CHECK_MAX_TIME)] == \
        [tx.transaction_id]
    assert read_topic(broker, "orders") == []


def test_a_failed_prepare_or_rollback_changes_nothing(harness: Harness) -> None:
    broker = harness.open(flaky=True)
    store = harness.store
    assert store is not None
    store.fail_writes = 1
    with pytest.raises(StorageError):
        prepare(broker, "a")
    assert broker.metrics.tx_prepared.value == 0
    tx = prepare(broker, "a")  # the msgId is free: nothing of the failed prepare stayed
    store.fail_writes = 1
    with pytest.raises(StorageError):
        broker.transactions.rollback(tx.transaction_id)
    assert broker.transactions.get(tx.transaction_id).status == "PREPARED"
    assert broker.transactions.rollback(tx.transaction_id).status == "ROLLED_BACK"
