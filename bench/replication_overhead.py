"""Single-node cost of cluster mode's hooks (storage/replication.py: one ``is None`` test per
RocksDB write and CommitLog append, a Batch that captures nothing): in process, 100 send
batches of 1000 scheduled messages, then 50 of 1000 due now; main-thread CPU, best of 9.
Run it on two checkouts side by side (docs/cluster.md, "Measured"):

    PYTHONPATH=. .venv/bin/python -m bench.replication_overhead LABEL
"""

from __future__ import annotations

import pathlib
import sys
import tempfile
import time

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.config import EngineConfig
from scheduler.model import SendRequest


def run() -> tuple[float, float]:
    data = pathlib.Path(tempfile.mkdtemp())
    broker = Broker(EngineConfig(data_dir=data, scan_interval_ms=0), FakeClock(1_700_000_000_000))
    broker.start()
    scheduled = [[SendRequest(topic="t", body=b"x" * 100, msg_id=f"m{j}-{i}",
                              delay_ms=60_000 + i) for i in range(1000)] for j in range(100)]
    due = [[SendRequest(topic="u", body=b"x" * 100, msg_id=f"n{j}-{i}") for i in range(1000)]
           for j in range(50)]
    t0 = time.thread_time()
    for batch in scheduled:
        broker.send_batch(batch)
    t1 = time.thread_time()
    for batch in due:
        broker.send_batch(batch)
    t2 = time.thread_time()
    broker.close()
    return t1 - t0, t2 - t1


def main(argv: list[str]) -> int:
    runs = [run() for _ in range(9)]
    scheduled, due = min(r[0] for r in runs), min(r[1] for r in runs)
    print(argv[0] if argv else "", f"scheduled 100k: {scheduled:.3f} s, due-now 50k: {due:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
