"""Consumer groups against a simple in-memory model (hypothesis RuleBasedStateMachine):
receive (any max, two lease lengths), ack and nack of any held receipts (current or stale),
advance the clock (leases expire, retries fall due), restart (leases are lost, acks are
not), redrive. After every step the group's state must be exactly what the model says."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.model import SendRequest
from tests.support.engine import START_MS, make_config

TOTAL = 6
MAX_RECONSUME = 2
RETRY_MS = 1_000  # every nack here retries after delayMs 1000
LEASES = (1_000, 3_000)


@dataclass
class Message:
    """The model of one message of the topic, for the group."""

    state: str = "available"  # available | leased | retrying | acked | dead
    reconsumed: int = 0  # reconsumeTimes of its current instance
    deliveries: int = 0  # handed out since its last nack (or since the restart)
    receipt: str | None = None  # of the lease that holds it
    until: int = 0  # when that lease ends
    due: int = 0  # when its retry falls due
    retried: bool = False  # its current instance is a retry (counts in `retrying`)
    epoch: int = 0  # its instance: each nack into a retry, and each redrive, makes a new one


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="hourglass-groups-"))
        self.clock = FakeClock(START_MS)
        self.broker = self._open()
        self.broker.send_batch([SendRequest(topic="t", body=f"m{i}".encode(), msg_id=f"m{i}")
                                for i in range(TOTAL)])
        self.model = {f"m{i}": Message() for i in range(TOTAL)}
        self.receipts: list[tuple[str, str]] = []  # (receipt, msgId): every one handed out
        self.issued: dict[str, tuple[str, int]] = {}  # receipt -> (msgId, epoch)

    def _open(self) -> Broker:
        broker = Broker(make_config(self.dir, max_reconsume_times=MAX_RECONSUME), self.clock)
        broker.start()
        return broker

    def teardown(self) -> None:
        self.broker.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _current(self, receipt: str, msg_id: str) -> bool:
        """Would an ack of ``receipt`` be taken: its message's current instance, not held
        by another lease, not acknowledged or handed back."""
        m = self.model[msg_id]
        if m.state == "leased":
            return m.receipt == receipt
        return m.state == "available" and self.issued[receipt] == (msg_id, m.epoch)

    # --- rules ----------------------------------------------------------------------------
    @rule(n=st.integers(1, 5), lease=st.sampled_from(LEASES))
    def receive(self, n: int, lease: int) -> None:
        got = self.broker.groups.receive("t", "g", n, lease).messages
        available = [k for k, m in self.model.items() if m.state == "available"]
        assert len(got) == min(n, len(available))
        now = self.clock.now_ms()
        for r in got:
            m = self.model[r.record.msg_id]
            assert m.state == "available", (r.record.msg_id, m)
            assert r.reconsume_times == m.reconsumed
            m.deliveries += 1
            assert r.delivery_count == m.deliveries
            m.state, m.receipt, m.until = "leased", r.receipt, now + lease
            self.issued[r.receipt] = (r.record.msg_id, m.epoch)
            self.receipts.append((r.receipt, r.record.msg_id))

    @precondition(lambda self: self.receipts)
    @rule(data=st.data(), nack=st.booleans())
    def settle(self, data: st.DataObject, nack: bool) -> None:
        picked = data.draw(st.lists(st.sampled_from(self.receipts), min_size=1, max_size=4,
                                    unique=True))
        taken: list[tuple[str, str]] = []
        stale: list[str] = []
        for rc, k in picked:  # a second receipt of one message in a request is stale
            if self._current(rc, k) and k not in {t for _, t in taken}:
                taken.append((rc, k))
            else:
                stale.append(rc)
        receipts = [rc for rc, _ in picked]
        if not nack:
            result = self.broker.groups.ack("t", "g", receipts)
            assert (result.acked, result.stale) == (len(taken), stale)
            for _, k in taken:
                self.model[k].state = "acked"
            return
        result = self.broker.groups.nack("t", "g", receipts, delay_ms=RETRY_MS)
        dead = [k for _, k in taken if self.model[k].reconsumed >= MAX_RECONSUME]
        assert (result.retrying, result.dead_lettered, result.stale) == \
            (len(taken) - len(dead), len(dead), stale)
        for _, k in taken:
            m = self.model[k]
            if k in dead:
                m.state, m.retried = "dead", False
            else:
                m.state, m.due, m.reconsumed, m.retried = ("retrying", self.clock.now_ms()
                                                           + RETRY_MS, m.reconsumed + 1, True)
                m.deliveries = 0
                m.epoch += 1

    @rule(ms=st.sampled_from((500, 1_000, 3_000)))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.broker.drain()
        now = self.clock.now_ms()
        for m in self.model.values():
            if m.state == "leased" and m.until <= now:
                m.state, m.receipt = "available", None
            if m.state == "retrying" and m.due <= now:
                m.state = "available"

    @rule()
    def restart(self) -> None:
        self.broker.close()
        self.broker = self._open()
        for m in self.model.values():
            m.deliveries = 0
            if m.state == "leased":
                m.state, m.receipt = "available", None

    @rule()
    def redrive(self) -> None:
        dead = [k for k, m in self.model.items() if m.state == "dead"]
        assert self.broker.groups.redrive("t", "g", 1000) == len(dead)
        self.broker.drain()
        for k in dead:
            m = self.model[k]
            m.state, m.reconsumed, m.deliveries, m.retried = "available", 0, 0, True
            m.epoch += 1

    # --- invariants -----------------------------------------------------------------------
    @invariant()
    def group_state(self) -> None:
        state = self.broker.groups.state("t", "g")
        model = self.model
        committed = 0  # the first message whose first instance is neither acked nor nacked
        while committed < TOTAL and (model[f"m{committed}"].epoch > 0
                                     or model[f"m{committed}"].state in ("acked", "dead")):
            committed += 1
        assert state.committed_offset == committed
        assert state.end_offset == TOTAL
        assert state.leased == sum(m.state == "leased" for m in model.values())
        assert state.retrying == sum(m.retried and m.state in ("available", "leased",
                                                                "retrying")
                                     for m in model.values())
        assert state.dead_lettered == sum(m.state == "dead" for m in model.values())


GroupMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestGroupsStateful = pytest.mark.slow(GroupMachine.TestCase)
