"""``hourglass bench timeline``: ``GET /v1/admin/timeline`` with 10 M messages pending.

1. Writes ``--messages`` timer keys and their backlog counts straight into the RocksStore (as
   a send stores them; no index entries, which the timeline does not read), over 8 topics,
   deliverAt from the analysis workload's mixture (support/analysis_workload.py: 10 %
   in one burst second 30 min ahead, 40 % within the hour, 30 % within the day, 20 % within
   7 days).
2. Starts ``hourglass serve`` on that store (it reads the stored counts) and times
   start-up to ready, and the server's memory.
3. Times the endpoint over real HTTP: each window (all topics and one topic; from 1 h to 10
   years, 1 to 1000 buckets) ``--rounds`` times, after one warm-up call.
4. In process: what keeping the counts costs per batch of 1000 (``TimelineCounts.add``), for a
   batch due in one second and for one spread over 1000 seconds.

The target: every answer within 200 ms.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.http import _call, _free_port, _start_server
from bench.support.analysis_workload import WorkloadSpec, _future_delay
from scheduler.backlog_store import BacklogStore
from scheduler.codec import message_value
from scheduler.config import EngineConfig
from scheduler.timeline import DAY, HOUR, Loader, TimelineCounts
from storage.constants import ROCKSDB_DIR, timer_cf
from storage.keys import encode_timer_key, topic_shard
from storage.rocks import RocksStore

TOPICS = tuple(f"topic-{i}" for i in range(8))
WRITE_BATCH = 10_000
TARGET_MS = 200


def write_pending(data_dir: Path, messages: int, now: int, seed: int = 17, *,
                  lead_ms: int = 0) -> float:
    """``messages`` pending timer keys in the store of ``data_dir``, due ``lead_ms`` and more
    from ``now``, and their persisted backlog counts (as sends store them: a start reads
    them, no scan); returns seconds taken."""
    rng = random.Random(seed)
    spec = WorkloadSpec()
    started = time.perf_counter()
    shards = EngineConfig(data_dir=data_dir).timer_shards  # what the server will open
    store = RocksStore(data_dir / ROCKSDB_DIR, timer_shards=shards)
    try:
        cfs = {t: timer_cf(topic_shard(t, shards)) for t in TOPICS}
        value = message_value(b"0123456789abcdef", None, (), {}, now, now, 0)
        loader = Loader()
        for lo in range(0, messages, WRITE_BATCH):
            by_cf: dict[str, list[tuple[bytes, bytes]]] = {}
            for i in range(lo, min(lo + WRITE_BATCH, messages)):
                topic = TOPICS[i % len(TOPICS)]
                key = encode_timer_key(now + lead_ms + _future_delay(rng, spec), topic,
                                       f"m-{i:09d}")
                by_cf.setdefault(cfs[topic], []).append((key, value))
                loader.prefixes[topic.encode()].append(key[:8])
            loader.flush()
            batch = store.batch()
            for cf, items in by_cf.items():
                batch.put_many(cf, sorted(items))
            store.write(batch)
        timeline = TimelineCounts()
        loader.into(timeline)
        BacklogStore(store).initialise(timeline.series(), {})
        store.flush()
    finally:
        store.close()
    return time.perf_counter() - started


def time_queries(port: int, token: str, now: int, rounds: int) -> list[dict[str, Any]]:
    windows = [  # (label, from, to, buckets, topic)
        ("1 h in 1000 buckets, all", now, now + HOUR, 1000, None),
        ("24 h in 60 buckets, all", now, now + DAY, 60, None),
        ("24 h in 1000 buckets, all", now, now + DAY, 1000, None),
        ("7 d in 1000 buckets, all", now, now + 7 * DAY, 1000, None),
        ("7 d in 1000 buckets, one topic", now, now + 7 * DAY, 1000, TOPICS[3]),
        ("10 years in 1000 buckets, all", now, now + 3_650 * DAY, 1000, None),
        ("10 years in 1 bucket, one topic", now, now + 3_650 * DAY, 1, TOPICS[5]),
    ]
    out = []
    for label, start, end, buckets, topic in windows:
        path = f"/v1/admin/timeline?from={start}&to={end}&buckets={buckets}"
        if topic:
            path += f"&topic={topic}"
        status, body = _call(port, "GET", path, token)  # warm-up
        if status != 200:
            raise RuntimeError(f"{path}: {status} {body[:200]!r}")
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            status, body = _call(port, "GET", path, token)
            times.append((time.perf_counter() - t0) * 1000)
            assert status == 200
        doc = json.loads(body)
        times.sort()
        out.append({"window": label, "buckets": len(doc["counts"]), "bucketMs": doc["bucketMs"],
                    "inWindow": sum(doc["counts"]), "pending": doc["pending"],
                    "p50_ms": round(statistics.median(times), 2),
                    "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 2),
                    "max_ms": round(times[-1], 2)})
    return out


def update_cost(rounds: int = 2_000) -> dict[str, float]:
    """µs per batch of 1000 messages of one topic kept in the counts (``TimelineCounts.add``, and
    the folds that count what it buffers, the last one by a read): due in one second / in
    1000 seconds of the next hour, a different 1000 each batch."""
    now = int(time.time() * 1000)
    rng = random.Random(3)
    out = {}
    for label, batch in (("one_second", lambda: [now + 5_000] * 1000),
                         ("1000_seconds", lambda: [now + 1_000 * rng.randrange(3_600)
                                                   for _ in range(1000)])):
        batches = [batch() for _ in range(rounds)]
        timeline = TimelineCounts()
        t0 = time.perf_counter()
        for ats in batches:
            timeline.add(TOPICS[0], ats)
        timeline.pending()  # folds what is left
        out[f"add_1000_{label}_us"] = round((time.perf_counter() - t0) / rounds * 1e6, 1)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hourglass bench timeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=50, help="calls per window")
    parser.add_argument("--dir", type=Path, default=None,
                        help="work directory (default: a temporary one, removed after)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hg-timeline-", dir=args.dir) as tmp:
        data_dir = Path(tmp) / "data"
        now = int(time.time() * 1000)
        print(f"writing {args.messages:,} pending messages ...", flush=True)
        write_s = write_pending(data_dir, args.messages, now)
        port, token = _free_port(), secrets.token_urlsafe(24)
        t0 = time.perf_counter()
        proc = _start_server(data_dir, port, token, Path(tmp) / "server.log", timeout_s=1800)
        try:
            ready_s = time.perf_counter() - t0
            rss = psutil.Process(proc.pid).memory_info().rss
            print(f"written in {write_s:.1f} s; server ready in {ready_s:.1f} s "
                  f"(start-up scan), RSS {rss / 2**20:.0f} MiB", flush=True)
            queries = time_queries(port, token, now, args.rounds)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    result = {"messages": args.messages, "write_s": round(write_s, 1),
              "ready_s": round(ready_s, 1), "server_rss_mib": round(rss / 2**20),
              "queries": queries, "update": update_cost(),
              "target_ms": TARGET_MS,
              "met": all(q["max_ms"] <= TARGET_MS for q in queries)}
    for q in queries:
        print(f"  {q['window']:<34} {q['buckets']:>5} x {q['bucketMs'] / 1000:>9,.0f} s  "
              f"p50 {q['p50_ms']:7.2f} ms  p99 {q['p99_ms']:7.2f} ms  max {q['max_ms']:7.2f} ms"
              f"  ({q['inWindow']:,} of {q['pending']:,})")
    print(f"  keeping the counts, per batch of 1000: {result['update']}")
    print(f"target: every answer <= {TARGET_MS} ms: {'met' if result['met'] else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["met"] else 1


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
