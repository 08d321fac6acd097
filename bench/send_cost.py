"""``python -m bench.send_cost``: what a send batch costs the engine, stage by stage, without
HTTP: ``Broker.send_columns`` of msgpack request bodies as the side by side's W1 (or W2) sends
them, in thread CPU per message.

In process, no server: ``--batches`` request bodies of 1000 messages (100-byte random base64
bodies, msgIds ``m0``, ``m1``..., deliverAt at random 1 min to 1 h ahead, or with ``--at-once``
all at one instant, as W2's) go through ``Broker.send_columns`` on a fake clock, one after the
other. Each stage is timed where the send path calls it: decoding the body into columns
(``Intake.columns``), building the WriteBatch (``Batch.put_sorted``), the msgId look-up
(``RocksStore.multi_get``), the counts' staging (``BacklogStore.put``), the backlog and due
timeline (``Backlog.scheduled_at``, with the timeline's folds) and RocksDB's write
(``RocksStore.write``). RocksDB's flushes and compactions run on their own threads and are
not in these figures. Run it against another checkout (``PYTHONPATH=<a checkout>``) in turns
for a before/after::

    .venv/bin/python -m bench.send_cost --batches 200
"""

from __future__ import annotations

import argparse
import base64
import collections
import functools
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from scheduler.backlog import Backlog
from scheduler.backlog_store import BacklogStore
from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.config import EngineConfig
from scheduler.intake import Intake
from scheduler.model import SendRequest
from storage.batch import Batch
from storage.rocks import RocksStore

START_MS = 1_700_000_000_000
BATCH = 1000
TOPIC = "bench"

#: (class, method, label): the stages timed, as the send path calls them
STAGES: tuple[tuple[type, str, str], ...] = (
    (Intake, "columns", "decode into columns (Intake.columns)"),
    (Batch, "put_sorted", "WriteBatch (Batch.put_sorted)"),
    (RocksStore, "multi_get", "msgId look-up (RocksStore.multi_get)"),
    (BacklogStore, "put", "counts' staging (BacklogStore.put)"),
    (Backlog, "scheduled_at", "backlog + timeline (Backlog.scheduled_at)"),
    (RocksStore, "write", "RocksDB write (RocksStore.write)"),
)


def _bodies(batches: int, at_once: bool, seed: int) -> list[bytes]:
    rng = random.Random(seed)

    def due() -> int:
        return START_MS + (600_000 if at_once else rng.randrange(60_000, 3_600_000))

    return [msgpack.packb({"messages": [
        {"msgId": f"m{b * BATCH + i}", "body": base64.b64encode(os.urandom(75)).decode(),
         "deliverAt": due()} for i in range(BATCH)]}) for b in range(batches)]


def _timed(spent: collections.Counter[str], label: str,
           call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time_ns()
        try:
            return call(*args, **kwargs)
        finally:
            spent[label] += time.thread_time_ns() - started
    return timed


def run(data_dir: Path, batches: int, at_once: bool, seed: int) -> dict[str, float]:
    """CPU µs per message of the whole ``send_columns`` and of each stage."""
    bodies = _bodies(batches, at_once, seed)
    spent: collections.Counter[str] = collections.Counter()
    saved = [(cls, name, getattr(cls, name)) for cls, name, _ in STAGES]
    for cls, name, label in STAGES:
        setattr(cls, name, _timed(spent, label, getattr(cls, name)))
    try:
        with Broker(EngineConfig(data_dir=data_dir, timer_shards=2),
                    FakeClock(START_MS)) as broker:
            broker.send(SendRequest(topic=TOPIC, body=b"x", delay_ms=3_600_000))  # (known)
            spent.clear()
            total = 0
            for raw in bodies:
                started = time.thread_time_ns()
                taken = broker.send_columns(TOPIC, raw, max_count=BATCH)
                total += time.thread_time_ns() - started
                if taken is None:
                    raise RuntimeError("the batch did not take the columns path")
    finally:
        for cls, name, call in saved:
            setattr(cls, name, call)
    n = batches * BATCH
    out = {"send_columns": round(total / n / 1e3, 3)}
    out.update({label: round(spent[label] / n / 1e3, 3) for _, _, label in STAGES})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.send_cost",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=200, help="send batches of 1000")
    ap.add_argument("--at-once", action="store_true",
                    help="every message due at one instant (W2's sends), not at random")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    data = Path(tempfile.mkdtemp(prefix="hg-send-cost-"))
    try:
        figures = run(data, args.batches, args.at_once, args.seed)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    print(f"CPU µs a message, {args.batches} batches of {BATCH}"
          f"{' due at once' if args.at_once else ' due at random over an hour'}:")
    for label, us in figures.items():
        print(f"  {label:45s} {us:6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
