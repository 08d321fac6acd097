"""The verdict of a crash run: read every topic's whole log by offset, then hold it against
the ledger (design guarantees 1-4):

- never early: every record has storedAt >= deliverAt;
- exactly once: every acknowledged send that was not cancelled (200), and every committed
  transaction, is in its topic's log exactly once, with the deliverAt it was acknowledged with;
- truthful cancel: nothing cancelled with 200 is in the log; every 409 ALREADY_DELIVERED is;
- nothing rolled back is; nothing unacknowledged is there twice; nothing unknown is there at all
  (a phantom, or a torn record that recovery should have dropped);
- stable offsets: every offset a consumer read holds the same message in the final log.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx

from bench.support.crash.ledger import ALREADY_DELIVERED, CANCELLED, UNKNOWN, Ledger
from storage.constants import MAX_PULL_MESSAGES

MAX_REPORTED = 20  # violations listed per kind; the count says how many there were

LogEntry = Mapping[str, Any]  # a ``Delivered`` document of the API


def read_logs(client: httpx.Client, topics: Iterable[str]) -> dict[str, list[LogEntry]]:
    """Every delivered message of each topic, from offset 0 to the end."""
    logs: dict[str, list[LogEntry]] = {}
    for topic in topics:
        entries: list[LogEntry] = []
        while True:
            r = client.get(f"/v1/topics/{topic}/messages",
                           params={"offset": len(entries), "max": MAX_PULL_MESSAGES})
            r.raise_for_status()
            page = r.json()["messages"]
            if not page:
                break
            entries.extend(page)
        logs[topic] = entries
    return logs


class _Violations:
    def __init__(self) -> None:
        self.by_kind: dict[str, list[str]] = {}

    def add(self, kind: str, text: str) -> None:
        self.by_kind.setdefault(kind, []).append(text)

    def lines(self) -> list[str]:
        out = []
        for kind, texts in self.by_kind.items():
            more = f" (+{len(texts) - MAX_REPORTED} more)" if len(texts) > MAX_REPORTED else ""
            out.append(f"{kind}: {len(texts)}{more}")
            out.extend(f"  {t}" for t in texts[:MAX_REPORTED])
        return out


def check(ledger: Ledger, logs: Mapping[str, Sequence[LogEntry]]) -> list[str]:
    """Every broken guarantee, grouped by kind (empty: the run is clean)."""
    v = _Violations()
    where: dict[tuple[str, str], list[LogEntry]] = {}
    bodies: Counter[str] = Counter()
    for topic, entries in logs.items():
        for i, e in enumerate(entries):
            if e["offset"] != i:
                v.add("offset gap", f"{topic}: entry {i} has offset {e['offset']}")
            if e["storedAt"] < e["deliverAt"]:
                v.add("early", f"{topic}/{e['msgId']}: stored {e['storedAt']} < deliverAt "
                               f"{e['deliverAt']}")
            where.setdefault((topic, e["msgId"]), []).append(e)
            bodies[e.get("body") or ""] += 1
    for (topic, msg_id), found in where.items():
        if len(found) > 1:
            v.add("duplicate msgId", f"{topic}/{msg_id} at offsets "
                                     f"{[e['offset'] for e in found]}")
    for body, n in bodies.items():
        if n > 1:
            v.add("duplicate body", f"{body!r} is in the logs {n} times")

    known: set[str] = set()
    for s in ledger.sends:
        known.add(s.token)
        key = s.key
        if not s.acked or key is None:
            continue
        found = where.get(key, [])
        answers = ledger.cancels.get(key, [])
        if CANCELLED in answers and ALREADY_DELIVERED in answers:
            v.add("contradictory cancel answers", f"{key[0]}/{key[1]}: {answers}")
        if CANCELLED in answers:
            if found:
                v.add("cancelled but delivered", f"{key[0]}/{key[1]} (answers {answers})")
            continue
        if not found:
            if ALREADY_DELIVERED in answers:
                v.add("409 ALREADY_DELIVERED but not in the log", f"{key[0]}/{key[1]}")
            elif UNKNOWN not in answers:  # an unanswered cancel may have worked
                v.add("acknowledged but lost", f"{key[0]}/{key[1]} (due {s.deliver_at})")
            continue
        entry = found[0]
        if entry["deliverAt"] != s.deliver_at:
            v.add("wrong deliverAt", f"{key[0]}/{key[1]}: acknowledged {s.deliver_at}, "
                                     f"logged {entry['deliverAt']}")
        if entry.get("body") != s.token:
            v.add("wrong body", f"{key[0]}/{key[1]}: {entry.get('body')!r} != {s.token!r}")

    for t in ledger.txs:
        known.add(t.token)
        found = where.get((t.topic, t.msg_id), []) if t.msg_id else []
        if t.decided and t.decision == "commit" and not found:
            v.add("committed but lost", f"{t.topic}/{t.msg_id} (transaction {t.tx_id})")
        if t.decision == "rollback" and found:
            v.add("rolled back but delivered",
                  f"{t.topic}/{t.msg_id} (transaction {t.tx_id}, acknowledged: {t.decided})")

    for topic, msg_id in ledger.torn_ids:
        if where.get((topic, msg_id)):
            v.add("torn record delivered", f"{topic}/{msg_id}")
    for (topic, msg_id), found in where.items():
        body = found[0].get("body") or ""
        if body not in known and (topic, msg_id) not in ledger.torn_ids:
            v.add("phantom", f"{topic}/{msg_id} with body {body!r} was never sent")

    for (topic, offset), msg_id in ledger.consumed.items():
        entries = logs.get(topic, ())
        now = entries[offset]["msgId"] if offset < len(entries) else None
        if now != msg_id:
            v.add("consumed offset changed", f"{topic} offset {offset}: consumer read "
                                             f"{msg_id}, the log now holds {now}")
    for text in ledger.anomalies:
        v.add("contract", text)
    return v.lines()


def check_statuses(client: httpx.Client, ledger: Ledger, logs: Mapping[str, Sequence[LogEntry]],
                   sample: int) -> list[str]:
    """The index agrees with the logs: GET status of up to ``sample`` acknowledged messages
    answers DELIVERED at their log offset, or CANCELLED."""
    offsets = {(t, e["msgId"]): e["offset"] for t, entries in logs.items() for e in entries}
    acked = [s for s in ledger.sends if s.acked and s.key is not None]
    step = max(1, len(acked) // max(1, sample))
    problems = []
    for s in acked[::step]:
        key = s.key
        assert key is not None
        r = client.get(f"/v1/topics/{key[0]}/messages/{key[1]}")
        doc = r.json() if r.status_code == 200 else {"status": f"HTTP {r.status_code}"}
        if key in offsets:
            expected: dict[str, Any] = {"status": "DELIVERED", "offset": offsets[key]}
        else:
            expected = {"status": "CANCELLED"}
        got = {k: doc.get(k) for k in expected}
        if got != expected:
            problems.append(f"status of {key[0]}/{key[1]}: {got}, expected {expected}")
    return problems[:MAX_REPORTED]
