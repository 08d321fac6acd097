"""kill -9 of the real server while it schedules, cancels and delivers: the backlog's
persisted counts (scheduler/backlog_store.py) that the next start reads are exactly what a
full scan of the pending keys finds, after every kill."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import httpx
import pytest

from bench.support.server_process import ServerProcess
from scheduler.backlog import Backlog
from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.config import EngineConfig
from storage.constants import timer_cf

TOKEN = "backlog-kill-admin-token-0123456789"
TOPICS = ("orders", "mails", "jobs")


def load(base_url: str, stop: threading.Event, seed: int) -> None:
    """Batches of 20 to the topics: due at once, within 1.5 s (delivered while it runs),
    within a minute, in hours, or at a delay level; a cancel now and then."""
    rng = random.Random(seed)
    sent: list[tuple[str, str]] = []
    n = 0
    with httpx.Client(base_url=base_url, timeout=10.0,
                      headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        while not stop.is_set():
            try:
                topic = rng.choice(TOPICS)
                now = int(time.time() * 1000)
                messages = []
                for _ in range(20):
                    n += 1
                    msg: dict[str, object] = {"body": "x", "msgId": f"s{seed}-{n}"}
                    kind = rng.random()
                    if kind < 0.1:
                        msg["delayLevel"] = rng.randint(1, 3)
                    else:
                        msg["deliverAt"] = now + rng.choice(
                            (0, rng.randrange(1500), rng.randrange(60_000),
                             rng.randrange(10_800_000)))
                    messages.append(msg)
                r = c.post(f"/v1/topics/{topic}/messages:batch", json={"messages": messages})
                if r.status_code == 201:
                    sent += [(topic, str(m["msgId"])) for m in messages]
                if sent and rng.random() < 0.3:
                    t, m = rng.choice(sent)
                    c.delete(f"/v1/topics/{t}/messages/{m}")
            except httpx.TransportError:
                return  # the server died under us


def check_counts(data: Path) -> int:
    """Open the data directory as the next start does, on a clock at 0 (nothing falls due):
    the counts it loaded (base + deltas, after replaying the log) against a full scan."""
    broker = Broker(EngineConfig(data_dir=data), FakeClock(0))
    broker.start()
    try:
        store = broker.parts.store
        assert store is not None
        scan = Backlog(store, [timer_cf(s) for s in range(store.timer_shards)], top=50)
        pending = scan.rebuild()
        kept = broker.parts.backlog
        assert kept.by_topic() == scan.by_topic()
        assert kept.by_level() == scan.by_level()
        assert kept.timeline.series() == scan.timeline.series()
        assert broker.stats().pending == pending
        return pending
    finally:
        broker.close()


@pytest.mark.slow
def test_counts_after_kill_9_under_load_match_a_full_scan(tmp_path: Path) -> None:
    rng = random.Random(35)
    data = tmp_path / "data"
    server = ServerProcess(data, token=TOKEN, log_path=tmp_path / "server.log")
    try:
        for round_ in range(4):
            server.start(ready="/readyz")
            stop = threading.Event()
            senders = [threading.Thread(target=load, args=(server.base_url, stop,
                                                            round_ * 10 + i)) for i in range(2)]
            for t in senders:
                t.start()
            time.sleep(rng.uniform(1.0, 3.0))  # mid-request, mid-delivery, mid-fold
            server.kill()
            stop.set()
            for t in senders:
                t.join(timeout=60)
            assert check_counts(data) > 0
    finally:
        server.kill()
