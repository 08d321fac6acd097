"""``python -m bench.receive_cost``: what a competing member's request costs the engine,
without HTTP: a group receive of 1000, its JSON answer (``Prefer: body=once``) and the ack of
its receipts, each in thread CPU.

In process, no server: ``--messages`` 100-byte messages due at once to one topic of a Broker
on a fake clock are delivered, then each of ``--groups`` groups drains the topic, receive
(``max`` 1000), answer (api/routes/groups.py ``receive_json``), ack, batch after batch.
Prints, per step, the median and the 10th percentile over every batch (µs); run it against
an older build (``PYTHONPATH=<a checkout>``) in turns for a before/after::

    .venv/bin/python -m bench.receive_cost --messages 100000 --groups 8
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from api.routes.groups import receive_json
from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.config import EngineConfig
from scheduler.model import SendRequest

START_MS = 1_700_000_000_000
BODY = bytes(range(48, 58)) * 10  # 100 ASCII bytes: shown as text (``body``)
LEASE_MS = 60_000


def _quantiles(ns: list[int]) -> str:
    ordered = sorted(ns)
    return f"{statistics.median(ordered) / 1e3:.0f} / {ordered[len(ordered) // 10] / 1e3:.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.receive_cost",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--groups", type=int, default=8, help="groups draining the topic in turn")
    args = ap.parse_args(argv)
    data = Path(tempfile.mkdtemp(prefix="hourglass-receive-cost-"))
    clock = FakeClock(START_MS)
    broker = Broker(EngineConfig(data_dir=data, segment_size=256 << 20), clock)
    broker.start()
    try:
        due = START_MS + 1_000
        for start in range(0, args.messages, 1000):
            broker.send_batch([SendRequest(topic="t", body=BODY, msg_id=f"m{i}", deliver_at=due)
                               for i in range(start, min(start + 1000, args.messages))])
        clock.set(due)
        broker.drain(timeout_s=600)
        groups = broker.groups
        steps: dict[str, list[int]] = {"receive": [], "answer": [], "ack": []}
        for k in range(args.groups):
            group = f"g{k}"
            while True:
                t0 = time.thread_time_ns()
                leased = groups.receive("t", group, 1000, LEASE_MS)
                t1 = time.thread_time_ns()
                if not len(leased):
                    break
                receive_json(leased, None, True)
                t2 = time.thread_time_ns()
                receipts = (leased.receipts if leased.receipts is not None
                            else [m.receipt for m in leased.messages])
                groups.ack("t", group, receipts)
                t3 = time.thread_time_ns()
                steps["receive"].append(t1 - t0)
                steps["answer"].append(t2 - t1)
                steps["ack"].append(t3 - t2)
        print(f"{len(steps['receive'])} batches of up to 1000, thread CPU µs (median / p10): "
              + ", ".join(f"{name} {_quantiles(ns)}" for name, ns in steps.items()))
    finally:
        broker.close()
        shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
