"""Run as a child process by test_recovery.py: schedule messages, acknowledge them on
stdout, make them due, and die by SIGKILL right after a CommitLog append (before the RocksDB
commit of that delivery). ``mode`` = "delivery" or "immediate"."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.committer import Log
from scheduler.config import EngineConfig
from scheduler.engine import open_commitlog
from scheduler.model import SendRequest


class DieAfterAppend:
    def __init__(self, inner: Log) -> None:
        self.inner = inner
        self.armed = False

    @property
    def end_position(self) -> int:
        return self.inner.end_position

    def append_batch(self, payloads: Sequence[bytes]) -> list[int]:
        positions = self.inner.append_batch(payloads)
        if self.armed:
            os.kill(os.getpid(), signal.SIGKILL)
        return positions

    def read(self, position: int) -> bytes:
        return self.inner.read(position)

    def read_many(self, positions: Sequence[int], max_bytes: int | None = None) -> list[bytes]:
        return self.inner.read_many(positions, max_bytes)

    def iter_from(self, position: int) -> Iterable[tuple[int, bytes]]:
        return self.inner.iter_from(position)

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()


def main(data_dir: str, mode: str, count: int) -> None:
    holder: list[DieAfterAppend] = []

    def factory(directory: Path, cfg: EngineConfig) -> Log:
        holder.append(DieAfterAppend(open_commitlog(directory, cfg)))
        return holder[0]

    clock = FakeClock(1_700_000_000_000)
    config = EngineConfig(data_dir=Path(data_dir), segment_size=1 << 20,
                          max_body_bytes=512 << 10, timer_shards=2,
                          scan_batch_size=100, delivery_batch_max=300)
    broker = Broker(config, clock, log_factory=factory)
    broker.start()
    for i in range(0, count, 100):
        results = broker.send_batch([
            SendRequest(topic="t", body=f"{j}".encode(), msg_id=f"m{j}", delay_ms=1000)
            for j in range(i, i + 100)])
        print(" ".join(r.msg_id for r in results), flush=True)  # acknowledged
    holder[0].armed = True
    if mode == "immediate":
        broker.send(SendRequest(topic="t", body=b"now", msg_id="now"))
    else:
        clock.advance(1000)
        broker.drain(timeout_s=60)
    print("NOT KILLED", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
