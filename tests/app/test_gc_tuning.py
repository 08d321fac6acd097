"""``hourglass serve`` collects the young generation every 10 000 net container allocations,
not CPython's 700 (app.server.tune_gc): a burst falling due holds scan batches of (key,
value) tuples in flight, and at 700 it set off a young collection every few scans, each
walking and promoting them. Seen from outside: the process's own ``python_gc_*`` counts
in ``/metrics``, around a real burst over real HTTP."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx

from bench.support.server_process import ServerProcess

TOKEN = "gc-tuning-test-token-0123456789"
TOPIC = "burst"
BATCHES, PER_BATCH = 30, 1000


def young_collections(client: httpx.Client) -> int:
    text = client.get("/metrics").text
    found = re.search(r'^python_gc_collections_total\{generation="0"\} (\S+)$', text, re.M)
    assert found is not None, "no python_gc_collections_total in /metrics"
    return int(float(found.group(1)))


def test_a_burst_falling_due_sets_off_few_young_collections(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", token=TOKEN, log_path=tmp_path / "server.log")
    server.start()
    try:
        with server.client(timeout_s=30.0) as c:
            due = int(time.time() * 1000) + 3_000  # all due at once, after the sends
            for _ in range(BATCHES):
                r = c.post(f"/v1/topics/{TOPIC}/messages:batch",
                           headers={"Prefer": "return=minimal"},
                           json={"messages": [{"body": "x" * 100, "deliverAt": due}
                                              for _ in range(PER_BATCH)]})
                assert r.status_code == 201, r.text
            before = young_collections(c)
            assert int(time.time() * 1000) < due, "the sends overran the due time"
            offset, deadline = 0, time.monotonic() + 60
            while offset < BATCHES * PER_BATCH and time.monotonic() < deadline:
                r = c.get(f"/v1/topics/{TOPIC}/messages",
                          params={"offset": offset, "max": 1000, "waitMs": 5000})
                assert r.status_code == 200, r.text
                offset = r.json()["nextOffset"]
            after = young_collections(c)
        assert offset == BATCHES * PER_BATCH  # every message of the burst was delivered
        # 30 k delivered and read back: ~60 young collections at CPython's 700 (a scan
        # batch of 1000 tuples and more in flight), 3 at 10 000
        assert after - before <= 10, f"{after - before} young collections during the burst"
    finally:
        server.stop()
