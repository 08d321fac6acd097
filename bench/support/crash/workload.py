"""The crash harness's clients: threads that send (single and batch), cancel, run transactions
and consume, through every kill and restart, writing what they were told into the Ledger.

A request cut off by a kill is "no answer": its sends stay unacknowledged, its cancel is
UNKNOWN and is asked again after the restart (cancel is idempotent), a transaction decision
is re-sent until acknowledged, and a send with a client msgId is sometimes retried (the
server must answer it as a duplicate if the first attempt was stored).
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import httpx

from bench.support.crash.ledger import (
    ALREADY_DELIVERED,
    CANCELLED,
    UNKNOWN,
    Ledger,
    SendRecord,
    TxRecord,
)

TOPICS = ("crash.a", "crash.b", "crash.c")
GROUP = "crash"
PRODUCER_GROUP = "crash-producers"
BATCH_MAX = 1000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Gate:
    """Open while the server is up. Clients wait on it; each opening is a new generation."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open = False
        self.stopped = False
        self.generation = 0

    def open(self) -> None:
        with self._cond:
            self._open = True
            self.generation += 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._open = False

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()

    def wait(self, past: int = 0, timeout_s: float | None = None) -> int | None:
        """The generation once open and newer than ``past`` (None when stopped or timed out)."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self.stopped or (self._open and self.generation > past), timeout_s)
            return None if self.stopped or not ok else self.generation


class Server(Protocol):
    """What the clients need of a server (a ServerProcess, or a test's)."""

    def client(self, timeout_s: float = ...) -> httpx.Client: ...


class Shared:
    """What every client thread sees."""

    def __init__(self, server: Server, ledger: Ledger, max_delay_ms: int) -> None:
        self.server = server
        self.ledger = ledger
        self.max_delay_ms = max_delay_ms
        self.gate = Gate()
        self.finishing = threading.Event()  # no new work; resolve what is open
        self.transactions = False
        self.lock = threading.Lock()
        self.scheduled: collections.deque[SendRecord] = collections.deque(maxlen=20_000)
        self.cancel_retry: list[SendRecord] = []
        self.send_retry: list[SendRecord] = []

    def open_work(self) -> int:
        with self.lock:
            pending = len(self.cancel_retry)
        return pending + sum(t.tx_id is not None and not t.decided for t in self.ledger.txs)


# --- requests ---------------------------------------------------------------------------------
def new_message(shared: Shared, rng: random.Random, topic: str, now: int, *,
                deliver_at: int | None = None) -> tuple[dict[str, Any], SendRecord]:
    """A MessageIn with every way of timing it, and its ledger record."""
    token = shared.ledger.token()
    doc: dict[str, Any] = {"body": token}
    client_id = rng.random() < 0.7
    if client_id:
        doc["msgId"] = token
    longest = shared.max_delay_ms
    r = rng.random()
    if deliver_at is not None:
        doc["deliverAt"] = deliver_at
        due = deliver_at
    elif r < 0.15:
        due = now
    elif r < 0.5:
        doc["delayMs"] = rng.randrange(longest + 1)
        due = now + doc["delayMs"]
    elif r < 0.8:
        doc["deliverAt"] = now + rng.randrange(-1000, longest + 1)
        due = doc["deliverAt"]
    elif r < 0.9:
        doc["delayLevel"] = 1  # "1s"
        due = now + 1000
    else:
        delay = rng.randrange(longest + 1)
        doc["properties"] = {"TIMER_DELAY_MS": str(delay)}
        due = now + delay
    return doc, SendRecord(token=token, topic=topic, msg_id=token if client_id else None,
                           due_ms=max(due, now))


def post_send(client: httpx.Client, shared: Shared, topic: str, docs: list[dict[str, Any]],
              records: list[SendRecord], *, batch: bool) -> None:
    """One send request; the answer goes into the records. TransportError: no answer."""
    ledger = shared.ledger
    if batch:
        r = client.post(f"/v1/topics/{topic}/messages:batch", json={"messages": docs})
    else:
        r = client.post(f"/v1/topics/{topic}/messages", json=docs[0])
    if r.status_code == 503:
        ledger.note_unavailable()
        return
    if r.status_code not in (200, 201):
        ledger.anomaly(f"send to {topic} answered {r.status_code}: {r.text[:200]}")
        return
    results = r.json()["results"] if batch else [r.json()]
    for rec, res in zip(records, results, strict=True):
        if rec.msg_id is not None and res["msgId"] != rec.msg_id:
            ledger.anomaly(f"send of {rec.msg_id} answered msgId {res['msgId']}")
        rec.result_id, rec.deliver_at, rec.handle = res["msgId"], res["deliverAt"], \
            res["cancelHandle"]
        rec.acked = True
        if res["status"] == "SCHEDULED":
            shared.scheduled.append(rec)


def send_new(client: httpx.Client, shared: Shared, rng: random.Random, topic: str, count: int,
             *, deliver_at: int | None = None,
             spread_ms: int = 0) -> list[SendRecord]:
    """Send ``count`` new messages (one request, or batches of up to 1000)."""
    now = now_ms()
    made = [new_message(shared, rng, topic, now, deliver_at=None if deliver_at is None else
                        deliver_at + rng.randrange(spread_ms + 1)) for _ in range(count)]
    records = [rec for _, rec in made]
    shared.ledger.add_sends(records)
    batch = count > 1 or rng.random() < 0.2
    for i in range(0, count, BATCH_MAX):
        chunk = made[i:i + BATCH_MAX]
        try:
            post_send(client, shared, topic, [d for d, _ in chunk], [r for _, r in chunk],
                      batch=batch)
        finally:  # no answer, or 503: a client with msgIds tries again later
            with shared.lock:
                shared.send_retry.extend(r for _, r in chunk
                                         if r.msg_id is not None and not r.acked)
    return records


def cancel(client: httpx.Client, shared: Shared, rec: SendRecord, by_handle: bool) -> None:
    key = rec.key
    assert key is not None and rec.handle is not None
    try:
        r = (client.delete(f"/v1/scheduled/{rec.handle}") if by_handle
             else client.delete(f"/v1/topics/{key[0]}/messages/{key[1]}"))
    except httpx.TransportError:
        _retry_cancel(shared, rec)
        raise
    code = r.json().get("code") if r.status_code >= 400 else None
    if r.status_code == 200 and r.json().get("status") == CANCELLED:
        shared.ledger.cancel_answer(key, CANCELLED)
    elif r.status_code == 409 and code == ALREADY_DELIVERED:
        shared.ledger.cancel_answer(key, ALREADY_DELIVERED)
    elif r.status_code == 503:
        shared.ledger.note_unavailable()
        _retry_cancel(shared, rec)
    else:
        shared.ledger.anomaly(f"cancel of {key[0]}/{key[1]} answered {r.status_code}: "
                              f"{r.text[:200]}")


def _retry_cancel(shared: Shared, rec: SendRecord) -> None:
    assert rec.key is not None
    shared.ledger.cancel_answer(rec.key, UNKNOWN)
    with shared.lock:
        shared.cancel_retry.append(rec)


def decide(client: httpx.Client, shared: Shared, tx: TxRecord) -> None:
    r = client.post(f"/v1/transactions/{tx.tx_id}/{tx.decision}")
    if r.status_code == 200:
        tx.decided = True
    elif r.status_code == 503:
        shared.ledger.note_unavailable()
    else:
        shared.ledger.anomaly(f"{tx.decision} of {tx.tx_id} answered {r.status_code}: "
                              f"{r.text[:200]}")


def prepare(client: httpx.Client, shared: Shared, rng: random.Random, topic: str,
            decision: str) -> tuple[TxRecord, httpx.Response]:
    token = shared.ledger.token()
    delay = rng.randrange(shared.max_delay_ms // 2 + 1)
    tx = TxRecord(token=token, topic=topic, msg_id=token, due_ms=now_ms() + delay,
                  decision=decision)
    shared.ledger.add_tx(tx)
    r = client.post(f"/v1/topics/{topic}/transactions",
                    json={"body": token, "msgId": token, "producerGroup": PRODUCER_GROUP,
                          "delayMs": delay})
    if r.status_code == 201:
        doc = r.json()
        tx.tx_id, tx.msg_id = doc["transactionId"], doc["msgId"]
    return tx, r


def probe_transactions(client: httpx.Client, shared: Shared, rng: random.Random) -> str | None:
    """None when the transaction endpoints work; else why not (the run goes on without)."""
    tx, r = prepare(client, shared, rng, TOPICS[0], "rollback")
    if r.status_code != 201:
        return f"prepareTransaction answered {r.status_code}: {r.text[:160]}"
    decide(client, shared, tx)
    return None if tx.decided else "rollbackTransaction did not answer 200"


# --- the client threads -----------------------------------------------------------------------
Step = Callable[[httpx.Client, random.Random, bool], None]


class Client(threading.Thread):
    """Runs ``step(client, rng, fresh)`` while the server is up; ``fresh`` is True on the
    first step after a (re)start."""

    def __init__(self, shared: Shared, name: str, seed: int, step: Step, pause_s: float) -> None:
        super().__init__(name=name, daemon=True)
        self.shared, self.seed, self.step, self.pause_s = shared, seed, step, pause_s

    def run(self) -> None:
        rng = random.Random(self.seed)
        seen = 0
        with self.shared.server.client() as client:
            while True:
                generation = self.shared.gate.wait()
                if generation is None:
                    return
                try:
                    self.step(client, rng, generation != seen)
                    seen = generation
                except httpx.TransportError:  # killed: wait for the next start
                    self.shared.gate.wait(past=generation, timeout_s=1.0)
                except Exception as exc:  # a bug here must fail the run, not hide
                    self.shared.ledger.anomaly(f"client {self.name} crashed: {exc!r}")
                    return
                if self.pause_s:
                    time.sleep(rng.uniform(0, self.pause_s))


def sender(shared: Shared) -> Step:
    def step(client: httpx.Client, rng: random.Random, fresh: bool) -> None:
        if shared.finishing.is_set():
            return
        with shared.lock:
            retry = shared.send_retry.pop() if shared.send_retry and rng.random() < 0.3 \
                else None
        if retry is not None:  # the same request again: answered as a duplicate if stored
            doc = {"body": retry.token, "msgId": retry.msg_id, "deliverAt": retry.due_ms}
            post_send(client, shared, retry.topic, [doc], [retry], batch=False)
            return
        count = 1 if rng.random() < 0.5 else rng.randint(2, 100)
        send_new(client, shared, rng, rng.choice(TOPICS), count)
    return step


def canceller(shared: Shared) -> Step:
    def step(client: httpx.Client, rng: random.Random, fresh: bool) -> None:
        with shared.lock:
            rec = shared.cancel_retry.pop() if shared.cancel_retry else None
        if rec is None and not shared.finishing.is_set() and shared.scheduled:
            now = now_ms()
            pick = shared.scheduled[rng.randrange(len(shared.scheduled))]
            if pick.deliver_at is not None and pick.deliver_at > now - 300:
                rec = pick  # due soon or just now: races the delivery stage
        if rec is not None:
            cancel(client, shared, rec, by_handle=rng.random() < 0.5)
    return step


def consumer(shared: Shared) -> Step:
    turn = [0]

    def step(client: httpx.Client, rng: random.Random, fresh: bool) -> None:
        ledger = shared.ledger
        if fresh:  # committed group offsets survive the kill
            for topic in TOPICS:
                r = client.get(f"/v1/topics/{topic}/groups/{GROUP}/offset")
                if r.status_code == 200 and r.json()["offset"] < ledger.group_commits[topic]:
                    ledger.anomaly(f"group offset of {topic} went back from "
                                   f"{ledger.group_commits[topic]} to {r.json()['offset']}")
        topic = TOPICS[turn[0] % len(TOPICS)]
        turn[0] += 1
        r = client.get(f"/v1/topics/{topic}/messages",
                       params={"group": GROUP, "max": 500, "waitMs": 200})
        if r.status_code != 200:
            if r.status_code != 503:
                ledger.anomaly(f"pull of {topic} answered {r.status_code}: {r.text[:200]}")
            return
        doc = r.json()
        for m in doc["messages"]:
            ledger.consumed_at(topic, m["offset"], m["msgId"])
            if m["storedAt"] < m["deliverAt"]:
                ledger.anomaly(f"{topic}/{m['msgId']} consumed before its deliverAt")
        if doc["messages"]:
            c = client.put(f"/v1/topics/{topic}/groups/{GROUP}/offset",
                           json={"offset": doc["nextOffset"]})
            if c.status_code == 200:
                ledger.group_commits[topic] = max(ledger.group_commits[topic],
                                                  doc["nextOffset"])
    return step


def transactor(shared: Shared) -> Step:
    def step(client: httpx.Client, rng: random.Random, fresh: bool) -> None:
        if not shared.transactions:
            return
        open_txs = [t for t in shared.ledger.txs if t.tx_id is not None and not t.decided]
        if open_txs:
            decide(client, shared, open_txs[0])
            return
        if shared.finishing.is_set():
            return
        tx, r = prepare(client, shared, rng, rng.choice(TOPICS),
                        "commit" if rng.random() < 0.6 else "rollback")
        if r.status_code == 503:
            shared.ledger.note_unavailable()
        elif r.status_code != 201:
            shared.ledger.anomaly(f"prepare answered {r.status_code}: {r.text[:200]}")
            return
        time.sleep(rng.uniform(0, 0.2))  # a local transaction running
        if tx.tx_id is not None:
            decide(client, shared, tx)
    return step


def start_clients(shared: Shared, seed: int, senders: int) -> list[Client]:
    clients = [Client(shared, f"sender-{i}", seed + i, sender(shared), 0.02)
               for i in range(senders)]
    clients += [
        Client(shared, "canceller", seed + 100, canceller(shared), 0.02),
        Client(shared, "consumer", seed + 101, consumer(shared), 0.0),
        Client(shared, "transactor", seed + 102, transactor(shared), 0.05),
    ]
    for c in clients:
        c.start()
    return clients
