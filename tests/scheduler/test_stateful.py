"""The engine against a simple in-memory model (hypothesis RuleBasedStateMachine):
send (one or a batch, with past, present and future deliver times, re-using msgIds),
cancel, advance the clock (then drain), restart. After every step the log, the statuses
and the pending count must be exactly what the model says."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.model import SendRequest
from storage.errors import AlreadyDelivered, NotFound
from storage.records import MessageStatus
from tests.support.engine import START_MS, make_config, read_topic

TOPICS = ("a", "b", "c")
IDS = tuple(f"m{i}" for i in range(8))
DELAYS = (-50, 0, 1, 2, 5, 30)


@dataclass
class Expected:
    deliver_at: int
    status: MessageStatus


class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="hourglass-stateful-"))
        self.clock = FakeClock(START_MS)
        self.broker = self._open()
        self.model: dict[tuple[str, str], Expected] = {}
        self.log: dict[str, list[str]] = {t: [] for t in TOPICS}

    def _open(self) -> Broker:
        broker = Broker(make_config(self.dir, timer_shards=2, scan_batch_size=3,
                                    delivery_batch_max=4, delivery_queue_batches=2),
                        self.clock)
        broker.start()
        return broker

    def teardown(self) -> None:
        self.broker.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _expect_send(self, topic: str, msg_id: str, delay: int) -> tuple[bool, int, str]:
        key = (topic, msg_id)
        known = self.model.get(key)
        if known is not None:
            return True, known.deliver_at, ("DELIVERED" if known.status is
                                            MessageStatus.DELIVERED else "SCHEDULED")
        at = self.clock.now_ms() + delay
        if delay <= 0:
            self.model[key] = Expected(at, MessageStatus.DELIVERED)
            self.log[topic].append(msg_id)
            return False, at, "DELIVERED"
        self.model[key] = Expected(at, MessageStatus.SCHEDULED)
        return False, at, "SCHEDULED"

    @rule(topic=st.sampled_from(TOPICS), msg_id=st.sampled_from(IDS),
          delay=st.sampled_from(DELAYS))
    def send(self, topic: str, msg_id: str, delay: int) -> None:
        result = self.broker.send(SendRequest(topic=topic, body=msg_id.encode(), msg_id=msg_id,
                                              deliver_at=self.clock.now_ms() + delay))
        assert (result.duplicate, result.deliver_at, result.status.value) == \
            self._expect_send(topic, msg_id, delay)

    @rule(items=st.lists(st.tuples(st.sampled_from(TOPICS), st.sampled_from(IDS),
                                   st.sampled_from(DELAYS)), min_size=1, max_size=5))
    def send_batch(self, items: list[tuple[str, str, int]]) -> None:
        now = self.clock.now_ms()
        results = self.broker.send_batch([
            SendRequest(topic=t, body=m.encode(), msg_id=m, deliver_at=now + d)
            for t, m, d in items])
        for (t, m, d), result in zip(items, results, strict=True):
            assert (result.duplicate, result.deliver_at, result.status.value) == \
                self._expect_send(t, m, d)

    @rule(topic=st.sampled_from(TOPICS), msg_id=st.sampled_from(IDS))
    def cancel(self, topic: str, msg_id: str) -> None:
        expected = self.model.get((topic, msg_id))
        try:
            self.broker.cancel(topic, msg_id)
            outcome = "CANCELLED"
        except NotFound:
            outcome = "NOT_FOUND"
        except AlreadyDelivered:
            outcome = "DELIVERED"
        if expected is None:
            assert outcome == "NOT_FOUND"
        elif expected.status is MessageStatus.DELIVERED:
            assert outcome == "DELIVERED"
        else:
            assert outcome == "CANCELLED"
            expected.status = MessageStatus.CANCELLED

    @rule(ms=st.sampled_from((1, 2, 5, 40)))
    def advance(self, ms: int) -> None:
        now = self.clock.advance(ms)
        self.broker.drain(timeout_s=60)
        due = sorted((e.deliver_at, t, m) for (t, m), e in self.model.items()
                     if e.status is MessageStatus.SCHEDULED and e.deliver_at <= now)
        for _, t, m in due:
            self.model[(t, m)].status = MessageStatus.DELIVERED
            self.log[t].append(m)

    @rule()
    def restart(self) -> None:
        self.broker.close()
        self.broker = self._open()

    @invariant()
    def log_and_statuses_match_the_model(self) -> None:
        for topic in TOPICS:
            got = read_topic(self.broker, topic)
            assert [m.msg_id for m in got] == self.log[topic]
            assert all(m.stored_at >= m.deliver_at for m in got)  # never early
        for (topic, msg_id), expected in self.model.items():
            info = self.broker.status(topic, msg_id)
            assert (info.status, info.deliver_at) == (expected.status, expected.deliver_at)
        pending = sum(e.status is MessageStatus.SCHEDULED for e in self.model.values())
        assert self.broker.stats().pending == pending


EngineMachine.TestCase.settings = settings(
    max_examples=20, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestEngineStateful = pytest.mark.slow(EngineMachine.TestCase)
