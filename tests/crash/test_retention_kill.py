"""kill -9 of the real server while the log's retention deletes segments (scheduler/retention.py):
tiny segments, a 1 s retention and a round every 100 ms, so deletions run all the time under
a steady send load over many topics. After each kill the stopped data directory verifies
(``hourglass verify``: no consume-queue entry points into a missing segment), and after each
restart every topic reads without a gap from its first offset, which never moves back, and
every offset still holds the message it held before the kill."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import httpx

from app.verify_cli import verify
from tests.support.server_process import ServerProcess

TOKEN = "retention-kill-admin-token-0123456789"
TOPICS = [f"ret.{i}" for i in range(20)]
KILLS = 8


def _read_from_first(client: httpx.Client, topic: str) -> tuple[int, list[tuple[int, str]]]:
    """(first offset, [(offset, msgId)] from it to the end); restarts at the new first offset
    when retention overtakes the reader (410)."""
    while True:
        first = client.get(f"/v1/topics/{topic}").json()["firstOffset"]
        out: list[tuple[int, str]] = []
        offset = first
        while True:
            r = client.get(f"/v1/topics/{topic}/messages", params={"offset": offset,
                                                                  "max": 1000})
            if r.status_code == 410:
                break
            r.raise_for_status()
            page = r.json()["messages"]
            if not page:
                return first, out
            out += [(m["offset"], m["msgId"]) for m in page]
            offset = r.json()["nextOffset"]


def test_kills_during_deletions_leave_a_store_that_verifies(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data, token=TOKEN, log_path=tmp_path / "server.log", settings={
        "segment_size": "64KiB", "max_body_bytes": "16KiB", "flush_interval_ms": "20ms",
        "commitlog_retention_ms": "1s", "cleanup_interval_ms": "100ms",
        "disk_clean_ratio": "1.0"})
    rng = random.Random(31)
    stop = threading.Event()
    counter = iter(range(10**9))
    seen: dict[tuple[str, int], str] = {}  # (topic, offset) -> msgId, as read before a kill
    firsts: dict[str, int] = dict.fromkeys(TOPICS, 0)

    def send() -> None:
        with server.client() as c:
            while not stop.is_set():
                topic = rng.choice(TOPICS)
                body = {"messages": [{"body": "x" * 500, "msgId": f"k{next(counter)}"}
                                     for _ in range(40)]}
                try:
                    c.post(f"/v1/topics/{topic}/messages:batch", json=body)
                except httpx.TransportError:
                    return  # killed

    try:
        for kill in range(KILLS):
            server.start(ready="/readyz")
            with server.client() as c:
                for topic in TOPICS:
                    first, entries = _read_from_first(c, topic)
                    assert first >= firsts[topic], (topic, first, firsts[topic])
                    firsts[topic] = first
                    offsets = [o for o, _ in entries]
                    assert offsets == list(range(first, first + len(offsets))), topic
                    for offset, msg_id in entries:
                        assert seen.setdefault((topic, offset), msg_id) == msg_id
            stop.clear()
            sender = threading.Thread(target=send)
            sender.start()
            time.sleep(rng.uniform(1.2, 2.5))  # rounds delete what is older than 1 s
            server.kill()
            stop.set()
            sender.join()
            report = verify(data)
            assert report.problem_count == 0, (kill, report.problems)
        server.start(ready="/readyz")
        with server.client() as c:
            metrics = c.get("/metrics").text
        assert max(firsts.values()) > 0  # deletions did happen between the kills
        assert "hourglass_commitlog_segments_deleted_total" in metrics
    finally:
        stop.set()
        server.kill()
