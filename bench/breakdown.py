"""``hourglass bench breakdown``: CPU microseconds per message, stage by stage, in process.

Where a message's server CPU goes on the two hot paths, with the HTTP server's own work
(parsing, the event loop, sockets) left out, which ``hourglass bench http`` and the peers
comparison include. Each stage runs ``--rounds`` times on batches of 1000 messages (100-byte
bodies, client msgIds, as the side-by-side sends them) and is timed in CPU time of the calling
thread (``time.thread_time``): what that stage costs whatever the neighbours do, which
wall-clock rates on a shared machine cannot show. RocksDB's background flushes and
compactions run on their own threads and are not in these figures.

ingest   decode the JSON (or msgpack) batch, turn it into engine requests, ``Intake.prepare``,
         the send path's store (idempotency look-up, encoding, one RocksDB write), encode
         the JSON (or msgpack) answer.
drain    the scanner's read of 1000 due keys, the delivery commit (log payloads, CommitLog
         append, one RocksDB write), a pull of 1000 (consume queue + log reads + decoding),
         encode it as JSON (or msgpack).
wal      the send path's RocksDB write of 1000 timer + 1000 index entries (the store's own
         options), with its WAL and without: what the WAL adds per message. RocksDB computes
         each WAL record's CRC32C; whether its build does that with the CPU's instruction
         ("Fast CRC32 supported" in its LOG) decides most of it (docs/performance.md, 15).
requests CPU µs per REQUEST through the whole ASGI application (middleware, routing, auth,
         the route), called in process without a socket: the fixed cost every request pays
         on top of its messages, which decides the CPU of a steady trickle (W3).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import orjson

BATCH = 1000
BODY = "x" * 100
START_MS = 1_700_000_000_000


def _per_message_us(work: Callable[[int], object], rounds: int) -> float:
    """Median CPU µs per message of ``work(round)`` over ``rounds`` calls (each one batch)."""
    samples = []
    for i in range(rounds):
        started = time.thread_time()
        work(i)
        samples.append((time.thread_time() - started) * 1e6 / BATCH)
    return round(statistics.median(samples), 3)


def breakdown(data_dir: Path, rounds: int) -> dict[str, dict[str, float]]:
    from api import schemas
    from api.bodies import decode, to_send_request
    from api.routes.consume import delivered, pull_msgpack
    from scheduler.broker import Broker
    from scheduler.clock import FakeClock
    from scheduler.committer import ScanBatch
    from scheduler.config import EngineConfig
    from scheduler.timer_index import TimerIndex
    from storage.keys import time_bound

    json_out, msgpack_out = msgspec.json.Encoder(), msgspec.msgpack.Encoder()
    due = START_MS + 3_600_000
    bodies = [orjson.dumps({"messages": [
        {"msgId": f"r{r}m{i}", "body": BODY, "deliverAt": due} for i in range(BATCH)]})
        for r in range(rounds)]
    packed = [msgspec.msgpack.encode(orjson.loads(b)) for b in bodies]
    clock = FakeClock(START_MS)  # stands still: nothing falls due while the stages run
    config = EngineConfig(data_dir=data_dir, timer_shards=1, segment_size=256 << 20)
    out: dict[str, dict[str, float]] = {"ingest": {}, "drain": {}}
    with Broker(config, clock) as broker:
        intake, writes = broker.parts.intake, broker.parts.writes  # the benchmark looks inside
        assert writes is not None
        ingest = out["ingest"]
        decoded: list[Any] = [None] * rounds
        requests: list[Any] = [None] * rounds
        prepared: list[Any] = [None] * rounds
        results: list[Any] = [None] * rounds

        def decode_json(r: int) -> None:
            decoded[r] = decode(bodies[r], None, schemas.BatchIn)

        def convert(r: int) -> None:
            requests[r] = [to_send_request(m, "t", i) for i, m in enumerate(decoded[r].messages)]

        def prepare(r: int) -> None:
            prepared[r] = [intake.prepare(q, START_MS) for q in requests[r]]

        def store(r: int) -> None:
            results[r] = writes.submit(prepared[r])

        ingest["decode JSON batch"] = _per_message_us(decode_json, rounds)
        ingest["decode msgpack batch (opt-in)"] = _per_message_us(
            lambda r: decode(packed[r], "application/x-msgpack", schemas.BatchIn), rounds)
        ingest["to engine requests"] = _per_message_us(convert, rounds)
        ingest["Intake.prepare"] = _per_message_us(prepare, rounds)
        ingest["store: look-up + encode + RocksDB write + results"] = _per_message_us(
            store, rounds)
        ingest["encode JSON answer"] = _per_message_us(
            lambda r: json_out.encode({"results": results[r]}), rounds)
        ingest["encode msgpack answer (opt-in)"] = _per_message_us(
            lambda r: msgpack_out.encode({"results": results[r]}), rounds)

        drain = out["drain"]
        store_ = broker.parts.store
        committer = broker.parts.committer
        assert store_ is not None
        timers = TimerIndex(store_)
        scans: list[Any] = [None] * rounds
        cursor = [time_bound(0)]

        def scan(r: int) -> None:
            items = timers.read_due("timer.0", cursor[0], time_bound(due + 1), BATCH).items
            end = items[-1][0] + b"\x00"
            scans[r] = ScanBatch(shard=0, start=cursor[0], end=end, items=items)
            cursor[0] = end

        pages: list[Any] = [None] * rounds
        drain["scan 1000 due keys"] = _per_message_us(scan, rounds)
        drain["commit: payloads + CommitLog append + RocksDB write"] = _per_message_us(
            lambda r: committer.commit_due([scans[r]]), rounds)

        def pull(r: int) -> None:
            pages[r] = broker.pull("t", r * BATCH, BATCH).messages

        drain["pull 1000: consume queue + log read + decode"] = _per_message_us(pull, rounds)
        drain["encode JSON pull"] = _per_message_us(
            lambda r: json_out.encode(schemas.PullResult(
                messages=[delivered(m) for m in pages[r]], next_offset=0)), rounds)
        drain["encode msgpack pull (opt-in)"] = _per_message_us(
            lambda r: msgpack_out.encode(schemas.PullResult(
                messages=[delivered(m) for m in pages[r]], next_offset=0)), rounds)
        drain["pull 1000 as msgpack: read + answer (opt-in)"] = _per_message_us(
            lambda r: pull_msgpack(broker.read("t", r * BATCH, BATCH), r * BATCH), rounds)
    for figures in out.values():
        figures["total (JSON)"] = round(sum(v for k, v in figures.items()
                                            if "opt-in" not in k), 3)
    return out


def request_costs(data_dir: Path, rounds: int) -> dict[str, float]:
    """CPU µs per request of small requests through the ASGI app (no socket, no uvicorn)."""
    import asyncio

    from api.auth import Role, TokenSpec
    from app.settings import load_settings
    from app.wiring import build_app
    from scheduler.clock import FakeClock
    from scheduler.model import SendRequest

    token = "bench-token-0123456789"
    settings = load_settings(cli={"data_dir": str(data_dir)})
    settings = replace(settings, tokens=(TokenSpec(token=token, role=Role.ADMIN, name="a"),))
    clock = FakeClock(START_MS)
    app = build_app(settings, clock=clock)
    broker = app.state.ctx.broker
    auth = (b"authorization", f"Bearer {token}".encode())
    send_40 = orjson.dumps({"messages": [{"body": BODY, "delayMs": 1000}] * 40})

    def scope(method: str, path: str, query: bytes = b"",
              ctype: bytes = b"application/json") -> dict[str, Any]:
        return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
                "query_string": query, "root_path": "", "client": ("127.0.0.1", 1),
                "server": ("127.0.0.1", 7740),
                "headers": [auth, (b"content-type", ctype), (b"host", b"127.0.0.1")]}

    async def call(sc: dict[str, Any], body: bytes) -> tuple[int, bytes]:
        status, answer = 0, []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            else:
                answer.append(message.get("body", b""))

        await app(sc, receive, send)
        return status, b"".join(answer)

    async def timed(sc: dict[str, Any], body: bytes, expect: int) -> tuple[float, bytes]:
        started = time.thread_time()
        status, answer = await call(sc, body)
        spent = (time.thread_time() - started) * 1e6
        if status != expect:
            raise RuntimeError(f"{sc['method']} {sc['path']} answered {status}")
        return spent, answer

    async def per_request(sc: dict[str, Any], body: bytes, expect: int) -> float:
        samples = [(await timed(sc, body, expect))[0] for _ in range(rounds)]
        return round(statistics.median(samples), 1)

    async def receive_acking(n: int) -> float:
        """A member's loop: ``n`` new messages each round, received with the previous
        round's receipts acknowledged in the same request."""
        samples, receipts = [], []
        for _ in range(rounds):
            broker.send_batch([SendRequest(topic="r", body=BODY.encode())] * n)
            ask = {"max": 1000, **({"ack": receipts} if receipts else {})}
            spent, answer = await timed(scope("POST", "/v1/topics/r/groups/g:receive"),
                                        orjson.dumps(ask), 200)
            samples.append(spent)
            receipts = [m["receipt"] for m in orjson.loads(answer)["messages"]]
            if len(receipts) != n:
                raise RuntimeError(f"received {len(receipts)} messages, not {n}")
        return round(statistics.median(samples), 1)

    async def send_as_the_peers_bench(r: int) -> float:
        """A batch as bench/peers sends it: msgpack, 40 client msgIds, spread deliverAt."""
        body = msgspec.msgpack.encode({"messages": [
            {"msgId": f"p{r}-{i}", "body": BODY, "deliverAt": START_MS + 1000 + (r * 40 + i) % 2000}
            for i in range(40)]})
        return (await timed(scope("POST", "/v1/topics/p/messages:batch",
                                  ctype=b"application/x-msgpack"), body, 201))[0]

    async def run() -> dict[str, float]:
        out = {}
        out["POST batch of 40"] = await per_request(
            scope("POST", "/v1/topics/t/messages:batch"), send_40, 201)
        out["POST batch of 40, msgpack, client msgIds"] = round(statistics.median(
            [await send_as_the_peers_bench(r) for r in range(rounds)]), 1)
        broker.send_batch([SendRequest(topic="t", body=b"x")])
        out["GET pull of 1"] = await per_request(
            scope("GET", "/v1/topics/t/messages", b"offset=0&max=1"), b"", 200)
        out["PUT group offset"] = await per_request(
            scope("PUT", "/v1/topics/t/groups/g/offset"), b'{"offset": 1}', 200)
        out["POST receive of 10, acking the previous 10"] = await receive_acking(10)
        out["GET /healthz"] = await per_request(scope("GET", "/healthz"), b"", 200)
        return out

    broker.start()
    try:
        return asyncio.run(run())
    finally:
        broker.close()


def wal_cost(data_dir: Path, rounds: int) -> dict[str, Any]:
    """CPU µs per message of RocksDB's write of a send batch (1000 timer + 1000 index
    entries, as the send path stores them) with the WAL and without, alternating; the WAL
    bytes each arm wrote; and whether RocksDB says its CRC32C uses the CPU's instruction."""
    import rocksdict

    from storage.constants import CF_INDEX, timer_cf
    from storage.keys import encode_timer_key, index_key
    from storage.records import (
        IndexEntry,
        MessageRecord,
        MessageStatus,
        encode_index,
        encode_message,
    )
    from storage.rocks import RocksStore

    store = RocksStore(data_dir, timer_shards=1)
    try:
        db = store._live_db()  # the benchmark looks inside: RocksDB's own write, two ways
        timer, index = store._handles[timer_cf(0)], store._handles[CF_INDEX]
        value = encode_message(MessageRecord(body=BODY.encode(), born_at=START_MS,
                                             deliver_at=START_MS))
        entry = encode_index(IndexEntry(status=MessageStatus.SCHEDULED, deliver_at=START_MS,
                                        updated_at=START_MS))
        plain, unlogged = rocksdict.WriteOptions(), rocksdict.WriteOptions()
        unlogged.disable_wal = True

        rng = random.Random(11)

        def batch(r: int, arm: str, timer: Any, index: Any) -> rocksdict.WriteBatch:
            """Due at random over an hour, each family's entries in key order (as the send
            path puts them); every batch its own instants, so no arm warms the other's."""
            wb = rocksdict.WriteBatch(raw_mode=True)
            ids = [f"{arm}{r}m{i}" for i in range(BATCH)]
            for key in sorted(encode_timer_key(START_MS + rng.randrange(3_600_000), "t", m)
                              for m in ids):
                wb.put(key, value, timer)
            for msg_id in sorted(ids):
                wb.put(index_key("t", msg_id), entry, index)
            return wb

        def wal_bytes() -> int:
            return sum(f.stat().st_size for f in data_dir.glob("*.log"))

        samples: dict[str, list[float]] = {"with WAL": [], "without WAL": []}
        written = dict.fromkeys(samples, 0)
        for r in range(rounds):
            arms = (("with WAL", plain), ("without WAL", unlogged))
            for arm, opts in arms if r % 2 else arms[::-1]:  # either first, in turn
                wb = batch(r, arm[:2], timer, index)
                before = wal_bytes()
                started = time.thread_time()
                db.write(wb, opts)
                samples[arm].append((time.thread_time() - started) * 1e6 / BATCH)
                written[arm] += wal_bytes() - before
        del db, timer, index
    finally:
        store.close()
    log = (data_dir / "LOG").read_text(errors="replace") if (data_dir / "LOG").exists() else ""
    crc = next((line.split("Fast CRC32 supported:", 1)[1].strip()
                for line in log.splitlines() if "Fast CRC32 supported:" in line), "unknown")
    us = {arm: round(statistics.median(v), 3) for arm, v in samples.items()}
    return {"us_per_message": {**us, "the WAL": round(us["with WAL"] - us["without WAL"], 3)},
            "wal_bytes_per_message": {arm: round(b / (rounds * BATCH), 1)
                                      for arm, b in written.items()},
            "fast_crc32": crc}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hourglass bench breakdown", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=50, help="batches of 1000 per stage")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    with tempfile.TemporaryDirectory(prefix="hourglass-breakdown-") as tmp:
        figures = breakdown(Path(tmp) / "engine", args.rounds)
        requests = request_costs(Path(tmp) / "app", args.rounds * 10)
        wal = wal_cost(Path(tmp) / "wal", args.rounds)
    for path, stages in figures.items():
        print(f"{path}: CPU µs per message (median of {args.rounds} batches of {BATCH})")
        for stage, us in stages.items():
            print(f"  {stage:<55} {us:8.2f}")
    print(f"requests: CPU µs per request through the ASGI app (median of {args.rounds * 10})")
    for what, us in requests.items():
        print(f"  {what:<55} {us:8.1f}")
    print(f"wal: CPU µs per message of RocksDB's write of a send batch (median of "
          f"{args.rounds}; RocksDB's 'Fast CRC32 supported': {wal['fast_crc32']})")
    for arm, us in wal["us_per_message"].items():
        print(f"  {arm:<55} {us:8.3f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"rounds": args.rounds, "us_per_message": figures,
                                         "us_per_request": requests, "wal": wal},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
