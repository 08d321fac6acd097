"""Storage faults over real HTTP: CommitLog appends and RocksDB writes failing at random while
clients send, cancel, run transactions and consume (the crash harness's clients). Every
failure must be a 503 UNAVAILABLE problem; nothing acknowledged may be lost or doubled;
nothing unacknowledged may be half there; /readyz must say 503 while delivery is blocked
and 200 once it is not.

The engine-level cases (back-off, replay after a failed RocksDB commit, bounded memory while
blocked) are tests/scheduler/test_faults.py; this is the same under load, end to end.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable

import httpx
import pytest

from bench.support.crash.ledger import Ledger
from bench.support.crash.verify import check, check_statuses, read_logs
from bench.support.crash.workload import TOPICS, Shared, now_ms, start_clients
from tests.faults.conftest import FaultyServer

STORM_MIN_S, STORM_MAX_S = 5.0, 45.0  # storm until enough happened (a loaded machine is slow)


def _enough(ledger: Ledger) -> bool:
    c = ledger.counts()
    return (c["acked"] >= 300 and c["unavailable"] >= 20 and c["cancelled"] >= 5
            and c["txCommitted"] >= 3 and c["consumed"] >= 100)


def _inject(server: FaultyServer, rng: random.Random, stop: threading.Event) -> None:
    """Arm a burst of failures now and then: appends, RocksDB writes, or nothing."""
    while not stop.wait(rng.uniform(0.05, 0.3)):
        r = rng.random()
        if r < 0.4:
            server.log.fail_appends = rng.randint(1, 30)
        elif r < 0.8:
            server.store.fail_writes = rng.randint(1, 30)


def _sample_readiness(server: FaultyServer, seen: Counter[int], stop: threading.Event) -> None:
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        while not stop.wait(0.02):
            seen[client.get("/readyz").status_code] += 1


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.slow  # a storm of at least STORM_MIN_S on the real clock, then the last due times
def test_random_storage_faults_under_load_lose_nothing_acknowledged(
        faulty_server: FaultyServer) -> None:
    server = faulty_server
    ledger = Ledger()
    shared = Shared(server, ledger, max_delay_ms=1500)
    shared.transactions = True
    rng = random.Random(20240607)
    shared.gate.open()
    clients = start_clients(shared, rng.randrange(2**30), senders=2)
    stop = threading.Event()
    readiness: Counter[int] = Counter()
    helpers = [threading.Thread(target=_inject, args=(server, rng, stop)),
               threading.Thread(target=_sample_readiness, args=(server, readiness, stop))]
    for t in helpers:
        t.start()
    time.sleep(STORM_MIN_S)  # the storm runs in the client and injector threads
    _wait_for(lambda: _enough(ledger), STORM_MAX_S - STORM_MIN_S)
    stop.set()
    for t in helpers:
        t.join()
    server.clear_faults()

    shared.finishing.set()  # resolve unanswered cancels and decisions, then stop
    assert _wait_for(lambda: shared.open_work() == 0, 60)
    shared.gate.stop()
    for c in clients:
        c.join()
    time.sleep(max(0.0, (ledger.latest_due_ms() - now_ms()) / 1000))
    server.broker.drain(timeout_s=60)
    assert _wait_for(lambda: server.broker.ready, 10)

    with server.client() as client:
        assert client.get("/readyz").status_code == 200
        logs = read_logs(client, TOPICS)
        assert check(ledger, logs) == []
        assert check_statuses(client, ledger, logs, sample=300) == []
        offsets = {(t, e["msgId"]): e["offset"] for t, es in logs.items() for e in es}
        for s in ledger.sends:  # unacknowledged: absent, or there completely
            if s.acked or s.msg_id is None:
                continue
            r = client.get(f"/v1/topics/{s.topic}/messages/{s.msg_id}")
            if (s.topic, s.msg_id) in offsets:
                assert r.json()["status"] == "DELIVERED", r.text
                assert r.json()["offset"] == offsets[(s.topic, s.msg_id)]
            else:
                assert r.status_code == 404, r.text
    counts = ledger.counts()
    print(counts, dict(readiness), server.broker.metrics.retries.value)
    assert _enough(ledger), counts  # the faults were hit (503s) while every path ran
    assert readiness[503] > 0 and readiness[200] > 0
    assert set(readiness) <= {200, 503}
    assert server.broker.metrics.retries.value > 0  # delivery was blocked and retried


def test_a_failed_mixed_batch_leaves_none_of_it_visible(faulty_server: FaultyServer) -> None:
    server = faulty_server
    batch = {"messages": [{"body": "now", "msgId": "now-1"},
                          {"body": "later", "msgId": "later-1", "delayMs": 60_000}]}
    with server.client() as client:
        server.store.fail_writes = 1  # the append works, the one RocksDB write fails
        r = client.post(f"/v1/topics/{TOPICS[0]}/messages:batch", json=batch)
        assert r.status_code == 503 and r.json()["code"] == "UNAVAILABLE"
        assert r.headers["Retry-After"] == "1"  # (a storage fault passes: try again later)
        client.post(f"/v1/topics/{TOPICS[1]}/messages", json={"body": "x"})  # any write
        states = [client.get(f"/v1/topics/{TOPICS[0]}/messages/{m}").status_code
                  for m in ("now-1", "later-1")]
        assert states == [404, 404], states  # none of it: the due-now half was revoked
        pulled = client.get(f"/v1/topics/{TOPICS[0]}/messages", params={"offset": 0})
        assert pulled.json()["messages"] == []
        # the client's retry of the same batch is stored once, whole
        r = client.post(f"/v1/topics/{TOPICS[0]}/messages:batch", json=batch)
        assert r.status_code == 201, r.text
        assert [(x["msgId"], x["status"], x.get("duplicate", False))
                for x in r.json()["results"]] == [("now-1", "DELIVERED", False),
                                                  ("later-1", "SCHEDULED", False)]
        pulled = client.get(f"/v1/topics/{TOPICS[0]}/messages", params={"offset": 0}).json()
        assert [(m["msgId"], m["offset"]) for m in pulled["messages"]] == [("now-1", 0)]
