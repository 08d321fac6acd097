"""Transaction throughput, in process (not a test: ``python -m tests.txn.bench_transactions``).

Real RocksDB and CommitLog in a temporary directory, a FakeClock for the due times, one
client thread (each call is one acknowledged RocksDB write, like an HTTP request):

- prepare: half messages stored;
- commit (due now): each is a CommitLog append + one RocksDB write;
- commit (delayed): each schedules the message (timer key) in one RocksDB write;
- rollback;
- check-back poll: claims per second, polls of 1000;
- discard: due checks past the maximum, appended to TRANS_CHECK_MAX_TIME_TOPIC;
- callbacks: checks POSTed to a local HTTP server answering COMMIT, applied (4 workers).

Prints ops/s (wall clock), ops per CPU-second of this process (less sensitive to other
processes on a shared machine) and per-call p50/p99 latency; ``--json PATH`` writes them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.config import EngineConfig
from scheduler.model import SendRequest
from tests.txn.callback_server import Producer, producer_endpoint

START_MS = 1_700_000_000_000
BODY = b"x" * 100


def _timed(label: str, items: Sequence[Any], call: Callable[[Any], object],
           per_call: int = 1) -> dict[str, float]:
    latencies = []
    started, cpu_started = time.perf_counter(), time.process_time()
    for item in items:
        t0 = time.perf_counter()
        call(item)
        latencies.append(time.perf_counter() - t0)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    done = len(items) * per_call
    lat = sorted(latencies)
    figures = {"ops_per_s": round(done / elapsed), "ops_per_cpu_s": round(done / cpu),
               "p50_ms": round(statistics.median(lat) * 1000, 3),
               "p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1000, 3)}
    print(f"{label:<26} {figures['ops_per_s']:>8,} /s  ({figures['ops_per_cpu_s']:>7,} per "
          f"CPU-s)  p50 {figures['p50_ms']:.3f} ms  p99 {figures['p99_ms']:.3f} ms", flush=True)
    return figures


def _prepare_many(broker: Broker, prefix: str, n: int, group: str = "pg",
                  delay_ms: int | None = None) -> list[str]:
    return [broker.transactions.prepare(
        SendRequest(topic="orders", body=BODY, msg_id=f"{prefix}{i}", delay_ms=delay_ms),
        producer_group=group).transaction_id for i in range(n)]


def run(n: int, workdir: Path) -> dict[str, Any]:
    clock = FakeClock(START_MS)
    config = EngineConfig(data_dir=workdir, transaction_callback_allowed_hosts=("127.0.0.1:*",),
                          transaction_check_max=1)
    broker = Broker(config, clock)
    broker.start()
    out: dict[str, Any] = {"n": n}
    try:
        msg_ids = [f"p{i}" for i in range(n)]
        txs: list[str] = []
        out["prepare"] = _timed("prepare", msg_ids, lambda m: txs.append(
            broker.transactions.prepare(SendRequest(topic="orders", body=BODY, msg_id=m),
                                       producer_group="pg").transaction_id))
        out["commit_now"] = _timed("commit (due now)", txs[: n // 2], broker.transactions.commit)
        delayed = _prepare_many(broker, "d", n // 2, delay_ms=3_600_000)
        out["commit_delayed"] = _timed("commit (delayed)", delayed, broker.transactions.commit)
        out["rollback"] = _timed("rollback", txs[n // 2:], broker.transactions.rollback)

        _prepare_many(broker, "c", n, group="poll")
        clock.advance(6_000)
        out["poll_claims"] = _timed("poll (claims, max 1000)", range(n // 1000),
                                    lambda _: broker.transactions.poll_checks("poll", 1000),
                                    per_call=1000)
        clock.advance(30_000)  # check maximum 1: the next due poll discards
        out["discard"] = _timed("discard (polls of 1000)", range(n // 1000),
                                lambda _: broker.transactions.poll_checks("poll", 1000),
                                per_call=1000)

        producer = Producer(default="COMMIT")
        with producer_endpoint(producer) as url:
            broker.transactions.register_callback("cb", url)
            _prepare_many(broker, "cb", n // 4, group="cb")
            started = time.perf_counter()
            clock.advance(6_000)
            broker.transactions.dispatcher.join(timeout_s=600)
            elapsed = time.perf_counter() - started
        committed = sum(1 for _ in producer.received)
        out["callbacks"] = {"checks": committed, "ops_per_s": round(committed / elapsed)}
        print(f"{'callbacks (POST + commit)':<26} {out['callbacks']['ops_per_s']:>8,} /s  "
              f"({committed} checks answered COMMIT)", flush=True)
    finally:
        broker.close()
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.txn.bench_transactions")
    parser.add_argument("-n", type=int, default=20_000, help="transactions per phase")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if args.n < 4_000:
        parser.error("-n must be at least 4000")
    with tempfile.TemporaryDirectory(prefix="hourglass-tx-bench-") as tmp:
        figures = run(args.n, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
