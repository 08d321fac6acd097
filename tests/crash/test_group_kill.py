"""kill -9 of the real server during receive / ack / nack storms of competing members: every
acknowledged message stays acknowledged, every nack answered 200 yields exactly one retry,
nothing is lost (scheduler/groups.py)."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from bench.support.server_process import ServerProcess
from scheduler.broker import Broker
from scheduler.clock import SystemClock
from scheduler.config import EngineConfig
from scheduler.group_state import retry_topic
from storage.constants import PROP_ORIGIN_MESSAGE_ID, PROP_RECONSUME_TIME
from tests.support.engine import read_topic

TOKEN = "group-kill-admin-token-0123456789"
TOPIC, GROUP = "jobs", "workers"
G = f"/v1/topics/{TOPIC}/groups/{GROUP}"
TOTAL = 1500
MEMBERS = 3
LEASE_MS = 30_000  # long beside a storm; what a killed member held waits this long in the drain


class Ledger:
    """What the members were told, in one global order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, str, int]] = []  # (kind, msgId, reconsumeTimes)

    def add(self, kind: str, items: list[tuple[str, int]]) -> None:
        with self.lock:
            self.events.extend((kind, m, r) for m, r in items)


def fails(msg_id: str, reconsume_times: int) -> bool:
    """Members nack a third of the messages, twice at most."""
    return int(msg_id[1:]) % 3 == 0 and reconsume_times < 2


def member(base_url: str, ledger: Ledger, stop: threading.Event, *, nack: bool) -> None:
    with httpx.Client(base_url=base_url, timeout=10.0,
                      headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        while not stop.is_set():
            try:
                r = c.post(f"{G}:receive", json={"max": 40, "waitMs": 200, "leaseMs": LEASE_MS})
                got = r.json()["messages"]
                ledger.add("received", [(m["msgId"], m["reconsumeTimes"]) for m in got])
                bad = [m for m in got if nack and fails(m["msgId"], m["reconsumeTimes"])]
                good = [m for m in got if m not in bad]
                if good:
                    r = c.post(f"{G}:ack", json={"receipts": [m["receipt"] for m in good]})
                    assert r.status_code == 200, r.text
                    assert r.json()["acked"] == len(good), r.text
                    ledger.add("acked", [(m["msgId"], m["reconsumeTimes"]) for m in good])
                if bad:
                    r = c.post(f"{G}:nack", json={"receipts": [m["receipt"] for m in bad],
                                                  "delayMs": 0})
                    assert r.status_code == 200, r.text
                    assert r.json()["retrying"] == len(bad), r.text
                    ledger.add("nacked", [(m["msgId"], m["reconsumeTimes"]) for m in bad])
                if not got and not nack:
                    state = c.get(G).json()
                    if state["committedOffset"] == TOTAL and state["retrying"] == 0:
                        return
            except httpx.TimeoutException:
                if nack:
                    return  # the server died under us
                # the drain's server lives: a slow answer on a loaded machine, ask again
            except (httpx.TransportError, ValueError):
                return  # the server died under us


def storm(server: ServerProcess, ledger: Ledger, seconds: float, *, nack: bool) -> None:
    stop = threading.Event()
    threads = [threading.Thread(target=member, args=(server.base_url, ledger, stop),
                                kwargs={"nack": nack}) for _ in range(MEMBERS)]
    for t in threads:
        t.start()
    if nack:
        time.sleep(seconds)  # the storm runs on real time; the kill lands mid-request
        server.kill()
    for t in threads:  # (the drain waits out the leases the last kill left)
        t.join(timeout=LEASE_MS / 1000 + 120)
    stop.set()
    assert nack or not any(t.is_alive() for t in threads), "the drain did not end in time"


@pytest.mark.slow
def test_kill_9_during_receive_ack_nack_storms(tmp_path: Path) -> None:
    rng = random.Random(14)
    data = tmp_path / "data"
    server = ServerProcess(data, token=TOKEN, log_path=tmp_path / "server.log",
                           settings={"segment_size": "4MiB", "max_body_bytes": "1MiB"})
    ledger = Ledger()
    server.start()
    try:
        with httpx.Client(base_url=server.base_url, timeout=30.0,
                          headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            for start in range(0, TOTAL, 500):
                r = c.post(f"/v1/topics/{TOPIC}/messages:batch", json={"messages": [
                    {"body": f"m{i}", "msgId": f"m{i}"} for i in range(start, start + 500)]})
                assert r.status_code == 201, r.text
        for _ in range(3):
            storm(server, ledger, rng.uniform(0.5, 2.0), nack=True)
            server.start()
        storm(server, ledger, 0, nack=False)  # drain: ack everything that is left
        server.stop()
    finally:
        server.kill()

    events = ledger.events
    acked = [(m, r) for kind, m, r in events if kind == "acked"]
    nacked = [(m, r) for kind, m, r in events if kind == "nacked"]
    assert len(nacked) > 0 and len(acked) >= TOTAL
    # an acknowledged message is never handed to the group again
    last_ack = {m: i for i, (kind, m, _) in enumerate(events) if kind == "acked"}
    first_ack = {}
    for i, (kind, m, _) in enumerate(events):
        if kind == "acked":
            first_ack.setdefault(m, i)
    for i, (kind, m, _) in enumerate(events):
        if kind == "received":
            assert i < first_ack[m], f"{m} was handed out again after its ack was answered"
    assert set(last_ack) == {f"m{i}" for i in range(TOTAL)}  # nothing lost
    assert Counter(m for m, _ in acked).most_common(1)[0][1] == 1  # one ack answered each

    broker = Broker(EngineConfig(data_dir=data, segment_size=4 << 20, max_body_bytes=1 << 20),
                    SystemClock())
    broker.start()
    try:
        retries = Counter((r.properties[PROP_ORIGIN_MESSAGE_ID],
                           int(r.properties[PROP_RECONSUME_TIME]))
                          for r in read_topic(broker, retry_topic(TOPIC, GROUP)))
        assert max(retries.values()) == 1  # no nack ever made two retries
        for m, r in nacked:  # every nack answered 200 made its retry
            assert retries[(m, r + 1)] == 1, (m, r)
        state = broker.groups.state(TOPIC, GROUP)
        assert (state.committed_offset, state.retrying, state.leased) == (TOTAL, 0, 0)
        assert broker.groups.receive(TOPIC, GROUP, 1000, 30_000).messages == []
    finally:
        broker.close()
