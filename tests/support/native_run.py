"""Run one engine scenario and print a digest of what it wrote and what pulls answer.

``python -m tests.support.native_run DATA_DIR`` in a process of its own: tests/storage/
test_native.py runs it with and without HOURGLASS_PURE_PYTHON and compares the two digests
(the compiled and the pure-Python hot paths must write the same log and answer the same
bytes). Deterministic: a FakeClock, client msgIds, one timer shard (one delivery order)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from api.native import native as api_native
from api.routes.consume import pull_msgpack, pull_result
from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.model import SendRequest
from scheduler.native import native as scheduler_native
from storage.constants import COMMITLOG_DIR
from storage.native import native
from tests.support.engine import make_config

T0 = 1_800_000_000_000


def requests() -> list[SendRequest]:
    out = []
    for i in range(600):
        body = bytes([0xFF, i % 256]) if i % 17 == 0 else f"body {i} " .encode() * (i % 5 + 1)
        props = {"k": str(i)} if i % 3 == 0 else {}
        if i % 11 == 0:
            props = {**props, "TIMER_X": "1"}  # cleared on delivery
        out.append(SendRequest(
            topic=f"topic-{i % 3}", body=body, tags=None if i % 2 else f"tag{i % 4}",
            keys=tuple(f"key{j}" for j in range(i % 3)), properties=props,
            msg_id=f"m-{i:04d}", delay_ms=0 if i % 7 == 0 else 1000 + 37 * (i % 50)))
    return out


def main(data_dir: Path) -> None:
    clock = FakeClock(T0)
    broker = Broker(make_config(data_dir, timer_shards=1), clock)
    broker.start()
    try:
        sent = requests()
        for k in range(0, len(sent), 100):
            broker.send_batch(sent[k:k + 100])
        clock.advance(10_000)
        broker.drain()
        answers, pulled = hashlib.sha256(), 0
        for topic in sorted({r.topic for r in sent}):
            offset = 0
            while True:
                payloads = broker.read(topic, offset, 64)
                answers.update(pull_msgpack(payloads, offset))
                page = pull_result(payloads, offset)
                if not page.messages:
                    break
                pulled += len(page.messages)
                offset = page.next_offset
        broker.close()
    except BaseException:
        broker.close()
        raise
    log = hashlib.sha256()
    for segment in sorted((data_dir / COMMITLOG_DIR).glob("0*")):
        log.update(segment.read_bytes().rstrip(b"\0"))
    # every layer's extension in use (True), none (False), or some ("some")
    compiled = {m is not None for m in (native, scheduler_native, api_native)}
    print(json.dumps({"native": compiled.pop() if len(compiled) == 1 else "some",
                      "pulled": pulled, "log": log.hexdigest(), "pulls": answers.hexdigest()}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
