"""A cluster follower's CPU per applied record: with RocksDB's WAL ("wal"), without it
("no-wal"), without it and with vector memtables in the timer CFs ("vector", what a
follower does: ``RocksStore.disable_wal(vector_timers=True)``).

A leader engine (in process, an in-memory stream instead of NATS) takes W1-like send
batches (1000 messages of 100 B due at random over the next hour, random msgIds); the
records it ships are then applied by a follower's storage (``FollowerGuard.apply``),
each of the three ways in turn, on a fresh store each time.
The process's CPU (the applying thread plus RocksDB's flush and compaction threads) from
the first apply to the end of a final flush and compaction, per record:

    PYTHONPATH=. .venv/bin/python -m bench.follower_apply [--records 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from bench.support.replicated import open_follower_storage, open_leader_broker
from scheduler.clock import FakeClock
from scheduler.config import EngineConfig
from scheduler.model import SendRequest

NOW_MS = 1_700_000_000_000


class ListSink:
    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.lock = threading.Lock()

    def check_leading(self) -> None:
        """This sink's leader never loses its lease."""

    def publish(self, record: bytes, expected_last_seq: int) -> int:
        with self.lock:
            assert expected_last_seq == len(self.messages)
            self.messages.append(record)
            return len(self.messages)


def config(data_dir: Path) -> EngineConfig:
    return EngineConfig(data_dir=data_dir, scan_interval_ms=0)


def make_stream(records: int, batch: int, seed: int) -> list[bytes]:
    import random

    rng = random.Random(seed)
    sink = ListSink()
    data = Path(tempfile.mkdtemp(prefix="hg-fa-leader-"))
    broker, _ = open_leader_broker(config(data), FakeClock(NOW_MS), sink)
    try:
        for _ in range(records):
            broker.send_batch([SendRequest(
                topic="w1", body=rng.randbytes(100), msg_id=f"{rng.getrandbits(64):016x}",
                delay_ms=rng.randint(60_000, 3_600_000)) for _ in range(batch)])
    finally:
        broker.close()
        shutil.rmtree(data, ignore_errors=True)
    return sink.messages


def apply_all(messages: list[bytes], mode: str) -> tuple[float, float]:
    """(apply CPU of this thread, process CPU incl. flush + compaction) in seconds."""
    data = Path(tempfile.mkdtemp(prefix="hg-fa-follower-"))
    cfg = config(data)
    store, commitlog, guard = open_follower_storage(data, cfg, wal=mode == "wal",
                                                    vector_timers=mode == "vector")
    try:
        p0, t0 = time.process_time(), time.thread_time()
        for seq, message in enumerate(messages, 1):
            guard.apply(seq, message)
        t1 = time.thread_time()
        store.flush()
        for cf in store._families:
            store._cfs[cf].compact_range(None, None)
        p1 = time.process_time()
        return t1 - t0, p1 - p0
    finally:
        commitlog.close()
        store.close()
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=300)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    messages = make_stream(args.records, args.batch, args.seed)
    n = len(messages)
    print(f"{n} records, {sum(map(len, messages)) / n / 1000:.0f} KB each; "
          f"load {os.getloadavg()[0]:.2f}")
    modes = ("wal", "no-wal", "vector")
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            apply_cpu, total = apply_all(messages, mode)
            print(f"round {r} {mode:6s}: apply {apply_cpu / n * 1000:.2f} ms/record, process "
                  f"(with flush+compaction) {total / n * 1000:.2f} ms/record")


if __name__ == "__main__":
    main()
