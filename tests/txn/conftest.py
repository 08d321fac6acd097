"""Fixtures of the transaction tests: a Broker of the engine harness (tests/conftest.py) that
may call back to loopback producers, and a helper to prepare a transaction."""

from __future__ import annotations

import pytest

from scheduler.broker import Broker
from scheduler.model import SendRequest, TransactionOutcome
from tests.support.engine import Harness


@pytest.fixture
def broker(harness: Harness) -> Broker:
    return harness.open(transaction_callback_allowed_hosts=("127.0.0.1:*",),
                        transaction_callback_timeout_ms=500)


def prepare(broker: Broker, msg_id: str, *, topic: str = "orders", group: str = "pg",
            immunity: str | int | None = None, body: bytes | None = None,
            deliver_at: int | None = None, delay_ms: int | None = None,
            delay_level: int | None = None) -> TransactionOutcome:
    return broker.transactions.prepare(
        SendRequest(topic=topic, body=body if body is not None else msg_id.encode(),
                    msg_id=msg_id, deliver_at=deliver_at, delay_ms=delay_ms,
                    delay_level=delay_level),
        producer_group=group, check_immunity_seconds=immunity)
