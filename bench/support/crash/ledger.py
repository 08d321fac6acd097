"""What the crash harness's clients were told: every send attempt (acknowledged or not),
every cancel answer, every transaction decision, every consumed offset.

Each message's body is a token unique to its send attempt (also its msgId when the client
chooses one), so every record in the final logs can be traced to the request that made it,
including sends whose answer was lost in a kill.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from dataclasses import dataclass, field

CANCELLED = "CANCELLED"
ALREADY_DELIVERED = "ALREADY_DELIVERED"
UNKNOWN = "unknown"  # no answer (killed mid-request) or 503: the cancel may or may not be done


@dataclass(kw_only=True, slots=True)
class SendRecord:
    token: str  # unique body text of this send attempt
    topic: str
    msg_id: str | None  # the client's msgId; None: the server generated one
    due_ms: int  # requested deliver time (the final wait goes past the latest)
    acked: bool = False
    result_id: str | None = None  # from the 2xx answer
    deliver_at: int | None = None  # from the 2xx answer
    handle: str | None = None  # cancel handle from the 2xx answer

    @property
    def key(self) -> tuple[str, str] | None:
        msg_id = self.result_id or self.msg_id
        return None if msg_id is None else (self.topic, msg_id)


@dataclass(kw_only=True, slots=True)
class TxRecord:
    token: str
    topic: str
    due_ms: int
    decision: str  # "commit" | "rollback"
    tx_id: str | None = None  # None: the prepare was never acknowledged
    msg_id: str | None = None
    decided: bool = False  # the decision was acknowledged (200)


@dataclass
class Ledger:
    sends: list[SendRecord] = field(default_factory=list)
    txs: list[TxRecord] = field(default_factory=list)
    cancels: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    consumed: dict[tuple[str, int], str] = field(default_factory=dict)  # (topic, offset) -> msgId
    group_commits: Counter[str] = field(default_factory=Counter)  # acked commits, per topic
    anomalies: list[str] = field(default_factory=list)  # answers the contract does not allow
    torn_ids: list[tuple[str, str]] = field(default_factory=list)  # never acknowledged records
    unavailable: int = 0  # 503 answers (allowed: nothing stored, nothing acknowledged)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _counter: itertools.count[int] = field(default_factory=itertools.count, repr=False)

    def token(self) -> str:
        return f"m{next(self._counter):08d}"

    def add_sends(self, records: list[SendRecord]) -> None:
        with self.lock:
            self.sends.extend(records)

    def add_tx(self, record: TxRecord) -> None:
        with self.lock:
            self.txs.append(record)

    def cancel_answer(self, key: tuple[str, str], answer: str) -> None:
        with self.lock:
            self.cancels.setdefault(key, []).append(answer)

    def anomaly(self, text: str) -> None:
        with self.lock:
            self.anomalies.append(text)

    def note_unavailable(self) -> None:
        with self.lock:
            self.unavailable += 1

    def consumed_at(self, topic: str, offset: int, msg_id: str) -> None:
        with self.lock:
            seen = self.consumed.setdefault((topic, offset), msg_id)
        if seen != msg_id:
            self.anomaly(f"{topic} offset {offset} was {seen} and later {msg_id} to a consumer")

    def latest_due_ms(self) -> int:
        with self.lock:
            dues = [s.due_ms for s in self.sends] + [t.due_ms for t in self.txs]
        return max(dues, default=0)

    def counts(self) -> dict[str, int]:
        with self.lock:
            answers = Counter(a for outcome in self.cancels.values() for a in outcome)
            return {
                "sends": len(self.sends),
                "acked": sum(s.acked for s in self.sends),
                "unacked": sum(not s.acked for s in self.sends),
                "cancelled": answers[CANCELLED],
                "alreadyDelivered": answers[ALREADY_DELIVERED],
                "cancelUnknown": answers[UNKNOWN],
                "txCommitted": sum(t.decided and t.decision == "commit" for t in self.txs),
                "txRolledBack": sum(t.decided and t.decision == "rollback" for t in self.txs),
                "txUndecided": sum(not t.decided for t in self.txs),
                "consumed": len(self.consumed),
                "unavailable": self.unavailable,
            }
