"""Commits racing check-backs, rollbacks and discards, from many threads over many rounds:
every transaction ends in exactly one state, and is delivered exactly when committed."""

from __future__ import annotations

import collections
import random
import sys
import threading
from collections.abc import Iterator

import pytest

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from storage.constants import TOPIC_TRANS_CHECK_MAX_TIME
from storage.errors import Conflict
from tests.support.engine import Harness, read_topic, run_threads

from .conftest import prepare


@pytest.fixture(autouse=True)
def _switch_often() -> Iterator[None]:
    """Threads switch every microsecond instead of every 5 ms: real interleavings."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


def _settle(broker: Broker, tx_ids: list[str], action: str) -> None:
    for tx_id in tx_ids:
        try:
            if action == "commit":
                broker.transactions.commit(tx_id)
            else:
                broker.transactions.rollback(tx_id)
        except Conflict:
            pass  # the other side won; the final check below says who


def _prepare_round(broker: Broker, txs: dict[str, str], rng: random.Random) -> list[str]:
    """Ten new transactions, half of them delayed; recorded in ``txs`` (id -> msgId)."""
    batch = []
    for _ in range(10):
        msg_id = f"m{len(txs)}"
        tx = prepare(broker, msg_id, delay_ms=50 if rng.random() < 0.5 else None)
        txs[tx.transaction_id] = msg_id
        batch.append(tx.transaction_id)
    return batch


def _race_commits(broker: Broker, commit: list[str], *, rollback: list[str],
                  rng: random.Random) -> None:
    """One thread commits ``commit``, one rolls back ``rollback`` (in reverse order, so the
    two meet in the middle), one polls check-backs (claims and discards) until both end."""
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            broker.transactions.poll_checks("pg", rng.randint(1, 4))

    def committer() -> None:
        _settle(broker, commit, "commit")

    def rollbacker() -> None:
        _settle(broker, list(reversed(rollback)), "rollback")

    def settle_both() -> None:
        try:
            run_threads([committer, rollbacker])
        finally:
            done.set()

    run_threads([settle_both, poll])


def _assert_exactly_once(broker: Broker, clock: FakeClock, txs: dict[str, str]) -> None:
    """txs: transaction id -> msgId. Each committed one is in its topic once, each
    discarded one in TRANS_CHECK_MAX_TIME_TOPIC once, nothing else anywhere."""
    clock.advance(24 * 3600 * 1000)  # every committed message is due, every check too
    broker.drain()
    states = {tx_id: broker.transactions.get(tx_id).status for tx_id in txs}
    delivered = collections.Counter(m.msg_id for m in read_topic(broker, "orders"))
    discarded = collections.Counter(m.msg_id for m in read_topic(broker,
                                                                 TOPIC_TRANS_CHECK_MAX_TIME))
    assert max(delivered.values(), default=1) == 1 and max(discarded.values(), default=1) == 1
    assert set(delivered) == {txs[t] for t, s in states.items() if s == "COMMITTED"}
    assert set(discarded) == {t for t, s in states.items() if s == "DISCARDED"}
    assert "PREPARED" not in states.values()
    # nothing is left to check: no half message outlived its transaction
    assert broker.transactions.poll_checks("pg", 1000) == []
    assert broker.stats().transactions_prepared == 0


def _assert_nothing_left_after_restart(harness: Harness, broker: Broker) -> None:
    broker.close()
    reopened = harness.open()  # counts the half messages on disk
    assert reopened.stats().transactions_prepared == 0


def test_commits_race_polls_and_rollbacks(harness: Harness, clock: FakeClock) -> None:
    broker = harness.open()
    rng = random.Random(5)
    txs: dict[str, str] = {}
    for _ in range(40):
        batch = _prepare_round(broker, txs, rng)
        clock.advance(6_000)  # every one is due for a check
        _race_commits(broker, batch, rollback=batch[::2], rng=rng)
        clock.advance(50)
    _assert_exactly_once(broker, clock, txs)
    states = collections.Counter(broker.transactions.get(t).status for t in txs)
    assert states["COMMITTED"] >= 200 and states["COMMITTED"] + states["ROLLED_BACK"] == 400
    _assert_nothing_left_after_restart(harness, broker)


def test_commits_race_discards(harness: Harness, clock: FakeClock) -> None:
    """With a maximum of one check, the second due poll discards: a commit racing it either
    delivers the message to its topic or finds it DISCARDED (Conflict), never both."""
    broker = harness.open(transaction_check_max=1, transaction_check_interval_ms=10)
    txs: dict[str, str] = {}
    rng = random.Random(7)
    for _ in range(40):
        batch = _prepare_round(broker, txs, rng)
        clock.advance(6_000)
        broker.transactions.poll_checks("pg", 100)  # the one allowed check
        clock.advance(10)  # now the next due poll discards them
        _race_commits(broker, batch, rollback=[], rng=rng)
        broker.transactions.poll_checks("pg", 100)  # discard whatever is left
    _assert_exactly_once(broker, clock, txs)
    states = collections.Counter(broker.transactions.get(t).status for t in txs)
    assert states["COMMITTED"] + states["DISCARDED"] == 400
    assert states["COMMITTED"] > 0 and states["DISCARDED"] > 0
    _assert_nothing_left_after_restart(harness, broker)
