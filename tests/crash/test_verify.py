"""The crash verdict catches every kind of broken guarantee (so a clean crash run means
something): one clean ledger + logs, then one mutation per guarantee."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from bench.support.crash.ledger import (
    ALREADY_DELIVERED,
    CANCELLED,
    UNKNOWN,
    Ledger,
    SendRecord,
    TxRecord,
)
from bench.support.crash.verify import check

T = "crash.a"
Logs = dict[str, list[dict[str, Any]]]


def entry(offset: int, msg_id: str, body: str, deliver_at: int = 100,
          stored_at: int = 105) -> dict[str, Any]:
    return {"offset": offset, "msgId": msg_id, "body": body, "deliverAt": deliver_at,
            "storedAt": stored_at}


def baseline() -> tuple[Ledger, Logs]:
    """m0 acked; m1 acked, cancelled (200); m2 acked, cancel answered 409; m3 never answered
    but stored; m4 never answered, not stored; m5 acked, cancel unanswered, cancelled;
    t0 committed, t1 rolled back; a consumer read offsets 0-1."""
    ledger = Ledger()

    def sent(token: str, acked: bool) -> SendRecord:
        return SendRecord(token=token, topic=T, msg_id=token, due_ms=100, acked=acked,
                          result_id=token if acked else None,
                          deliver_at=100 if acked else None, handle="h" if acked else None)

    ledger.sends = [sent("m0", True), sent("m1", True), sent("m2", True), sent("m3", False),
                    sent("m4", False), sent("m5", True)]
    ledger.cancels = {(T, "m1"): [UNKNOWN, CANCELLED], (T, "m2"): [ALREADY_DELIVERED],
                      (T, "m5"): [UNKNOWN]}
    ledger.txs = [TxRecord(token="t0", topic=T, due_ms=100, decision="commit", tx_id="x0",
                           msg_id="t0", decided=True),
                  TxRecord(token="t1", topic=T, due_ms=100, decision="rollback", tx_id="x1",
                           msg_id="t1", decided=True)]
    logs = {T: [entry(0, "m0", "m0"), entry(1, "m2", "m2"), entry(2, "m3", "m3"),
                entry(3, "t0", "t0")]}
    ledger.consumed = {(T, 0): "m0", (T, 1): "m2"}
    ledger.torn_ids = [(T, "torn-1")]
    return ledger, logs


def test_the_baseline_is_clean() -> None:
    assert check(*baseline()) == []


def _drop(logs: Logs, msg_id: str) -> None:
    logs[T] = [e for e in logs[T] if e["msgId"] != msg_id]
    for i, e in enumerate(logs[T]):
        e["offset"] = i


def _append(logs: Logs, msg_id: str, body: str | None = None, **kw: Any) -> None:
    logs[T].append(entry(len(logs[T]), msg_id, body or msg_id, **kw))


MUTATIONS: dict[str, tuple[Callable[[Ledger, Logs], None], str]] = {
    "lost": (lambda lg, logs: _drop(logs, "m0"),
             "acknowledged but lost"),
    "duplicate": (lambda lg, logs: _append(logs, "m0", "m0-again"), "duplicate msgId"),
    "duplicate unacknowledged": (lambda lg, logs: _append(logs, "m3x", "m3"),
                                 "duplicate body"),
    "early": (lambda lg, logs: logs[T][0].update(storedAt=99), "early"),
    "cancelled delivered": (lambda lg, logs: _append(logs, "m1"), "cancelled but delivered"),
    "409 not delivered": (lambda lg, logs: _drop(logs, "m2"),
                          "409 ALREADY_DELIVERED but not in the log"),
    "contradiction": (lambda lg, logs: lg.cancels[(T, "m2")].append(CANCELLED),
                      "contradictory cancel answers"),
    "committed lost": (lambda lg, logs: _drop(logs, "t0"), "committed but lost"),
    "rolled back delivered": (lambda lg, logs: _append(logs, "t1"),
                              "rolled back but delivered"),
    "phantom": (lambda lg, logs: _append(logs, "zz"), "phantom"),
    "torn delivered": (lambda lg, logs: _append(logs, "torn-1", "torn"),
                       "torn record delivered"),
    "offset moved": (lambda lg, logs: lg.consumed.update({(T, 1): "m3"}),
                     "consumed offset changed"),
    "offset gap": (lambda lg, logs: logs[T][2].update(offset=7), "offset gap"),
    "wrong deliverAt": (lambda lg, logs: logs[T][0].update(deliverAt=90), "wrong deliverAt"),
    "wrong body": (lambda lg, logs: logs[T][0].update(body="m4"), "wrong body"),
    "contract": (lambda lg, logs: lg.anomaly("send answered 500"), "contract"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_broken_guarantee_is_reported(name: str) -> None:
    ledger, logs = baseline()
    logs = copy.deepcopy(logs)
    mutate, kind = MUTATIONS[name]
    mutate(ledger, logs)
    problems = check(ledger, logs)
    assert any(line.startswith(f"{kind}: ") for line in problems), problems


def test_an_unanswered_cancel_excuses_absence_but_not_a_duplicate() -> None:
    ledger, logs = baseline()
    _append(logs, "m5")
    _append(logs, "m5", "m5")
    assert any(line.startswith("duplicate msgId: ") for line in check(ledger, logs))
