"""Run as a child process by test_kill.py. Acknowledges each transaction operation on stdout
(one JSON line, printed after the call returned) and then dies by SIGKILL:

- ``commit``: right after the CommitLog append of a commit of a message due now (before its
  RocksDB write);
- ``discard``: right after the append of a discard into TRANS_CHECK_MAX_TIME_TOPIC;
- ``random``: never on purpose; the parent kills it at a random moment of a random mix of
  prepares, commits, rollbacks and check polls (SystemClock, delays of a few ms).
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

from scheduler.broker import Broker
from scheduler.clock import Clock, FakeClock, SystemClock
from scheduler.committer import Log
from scheduler.config import EngineConfig
from scheduler.engine import open_commitlog
from scheduler.model import SendRequest
from storage.errors import Conflict
from tests.scheduler.crash_child import DieAfterAppend

START_MS = 1_700_000_000_000


def config(data_dir: Path, *, transaction_check_max: int = 15) -> EngineConfig:
    return EngineConfig(data_dir=data_dir, segment_size=1 << 20, max_body_bytes=512 << 10,
                        timer_shards=2,
                        transaction_check_max=transaction_check_max)


def ack(op: str, tx: str, msg: str = "") -> None:
    print(json.dumps({"op": op, "tx": tx, "msg": msg}), flush=True)


def main(data_dir: str, mode: str) -> None:
    holder: list[DieAfterAppend] = []

    def factory(directory: Path, cfg: EngineConfig) -> Log:
        holder.append(DieAfterAppend(open_commitlog(directory, cfg)))
        return holder[0]

    clock: Clock = SystemClock() if mode == "random" else FakeClock(START_MS)
    broker = Broker(config(Path(data_dir), transaction_check_max=0 if mode == "discard" else 15),
                    clock, log_factory=factory)
    broker.start()

    def prepare(msg_id: str, delay_ms: int | None = None) -> str:
        tx = broker.transactions.prepare(
            SendRequest(topic="orders", body=msg_id.encode(), msg_id=msg_id, delay_ms=delay_ms),
            producer_group="pg").transaction_id
        ack("prepare", tx, msg_id)
        return tx

    if mode == "random":
        rng = random.Random(int.from_bytes(os.urandom(4), "big"))
        prepared: list[str] = []
        for i in range(100_000):
            roll = rng.random()
            if roll < 0.4 or not prepared:
                prepared.append(prepare(f"m{i}", delay_ms=rng.choice((0, 0, 5, 50))))
            elif roll < 0.95:
                tx = prepared.pop(rng.randrange(len(prepared)))
                op = "commit" if roll < 0.75 else "rollback"
                try:
                    getattr(broker.transactions, op)(tx)
                except Conflict:
                    raise SystemExit(f"{op} of a prepared transaction conflicted") from None
                ack(op, tx)
            else:
                broker.transactions.poll_checks("pg", 10)
        raise SystemExit("NOT KILLED")

    txs = [prepare(f"m{i}") for i in range(20)]
    for tx in txs[:5]:
        broker.transactions.commit(tx)
        ack("commit", tx)
    for tx in txs[5:10]:
        broker.transactions.rollback(tx)
        ack("rollback", tx)
    holder[0].armed = True
    if mode == "commit":
        print(json.dumps({"op": "dying", "tx": txs[10], "msg": ""}), flush=True)
        broker.transactions.commit(txs[10])
    else:
        assert isinstance(clock, FakeClock)
        clock.advance(6_000)
        broker.transactions.poll_checks("pg", 1)  # discards the oldest prepared one
    print("NOT KILLED", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
