"""``hourglass bench footprint``: memory and disk of a real ``hourglass serve`` on its embedded
defaults, fresh and with millions of messages pending.

1. Start ``hourglass serve`` on a new data directory with nothing but an admin token (the
   defaults a new user gets); once ``/readyz`` answers, read its RSS and the data directory's
   allocated size (``du``, blocks).
2. Send ``--messages`` messages (100-byte bodies of random base64, as bench/peers sends, so
   compression cannot flatter; client msgIds; due in 1-2 days, so all stay pending) over
   HTTP in msgpack batches of 1000 from two connections, then read the RSS again (RocksDB's
   memtables and block cache are bounded by ``rocksdb_memory_bytes``).
3. Stop the server, compact every column family of its RocksDB (what RocksDB's background
   compaction reaches in time) and read the disk per million pending messages.

Targets: fresh RSS <= 150 MB and data dir <= 64 MB; RSS <= 400 MB with 5 M
pending; <= 150 MB of disk per million pending messages once compacted.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psutil

from bench.peers.common import dir_size, free_port
from bench.peers.systems.hourglass import _find_hourglass

BATCH = 1000
MB = 1_000_000
TARGETS = {"fresh_rss_mb": 150, "fresh_disk_mb": 64, "pending_rss_mb": 400,
           "compacted_disk_mb_per_million": 150}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _wait_ready(base: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"hourglass serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("hourglass serve did not become ready")


def _send_all(base: str, token: str, n: int, connections: int = 2) -> float:
    """Send n messages in msgpack batches of 1000 from ``connections`` threads; msgs/s."""
    now = int(time.time() * 1000)
    encode = msgspec.msgpack.encode
    batches = list(range(0, n, BATCH))
    sent = [0]
    lock = threading.Lock()
    errors: list[str] = []

    def worker(k: int) -> None:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-msgpack"}
        with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
            for start in batches[k::connections]:
                count = min(BATCH, n - start)
                payload = encode({"messages": [
                    {"msgId": f"m{start + i}", "body": base64.b64encode(os.urandom(75)).decode(),
                     "deliverAt": now + 86_400_000 + (start + i) % 86_400_000}
                    for i in range(count)]})
                r = client.post("/v1/topics/footprint/messages:batch", content=payload)
                if r.status_code != 201:
                    errors.append(f"HTTP {r.status_code}: {r.text[:200]}")
                    return
                with lock:
                    sent[0] += count

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(connections)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(2)
        say(f"  footprint: sent {sent[0]:,}/{n:,}")
    if errors:
        raise RuntimeError(errors[0])
    return n / (time.perf_counter() - started)


def compact_rocksdb(rocks_dir: Path) -> None:
    """Open the (stopped) server's RocksDB and compact every column family down to its
    bottommost level, as RocksDB's background compaction would in time."""
    import rocksdict

    from storage.rocks import RocksStore

    store = RocksStore(rocks_dir, timer_shards=None)
    try:
        opts = rocksdict.CompactOptions()
        opts.set_bottommost_level_compaction(rocksdict.BottommostLevelCompaction.force())
        for name in store._families:  # the benchmark looks inside on purpose
            with store._gate:
                store._cf(name).compact_range(None, None, opts)
    finally:
        store.close()


def run(messages: int, root: Path) -> dict[str, Any]:
    data = root / "data"
    token = secrets.token_hex(16)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HOURGLASS_ADMIN_TOKEN": token}
    argv = [_find_hourglass() or "hourglass", "serve", "--data-dir", str(data),
            "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out: dict[str, Any] = {"messages": messages, "targets": TARGETS}
    try:
        _wait_ready(base, proc)
        time.sleep(1.0)  # let start-up settle (threads, first flush)
        server = psutil.Process(proc.pid)
        out["fresh_rss_mb"] = round(server.memory_info().rss / MB, 1)
        out["fresh_disk_mb"] = round(dir_size(data) / MB, 1)
        say(f"  fresh: RSS {out['fresh_rss_mb']} MB, data dir {out['fresh_disk_mb']} MB")
        if messages:
            out["ingest_msgs_per_s"] = round(_send_all(base, token, messages))
            time.sleep(2.0)
            out["pending_rss_mb"] = round(server.memory_info().rss / MB, 1)
            out["pending_disk_mb"] = round(dir_size(data) / MB, 1)
            stats = httpx.get(f"{base}/v1/admin/stats", timeout=30,
                              headers={"Authorization": f"Bearer {token}"}).json()
            out["pending"] = stats["pending"]
            say(f"  {messages:,} pending: RSS {out['pending_rss_mb']} MB, data dir "
                f"{out['pending_disk_mb']} MB")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    if messages:
        compact_rocksdb(data / "rocksdb")
        rocks = dir_size(data / "rocksdb")
        out["compacted_rocksdb_mb"] = round(rocks / MB, 1)
        out["compacted_disk_mb_per_million"] = round(rocks / MB * 1_000_000 / messages, 1)
        say(f"  compacted RocksDB: {out['compacted_rocksdb_mb']} MB = "
            f"{out['compacted_disk_mb_per_million']} MB per million pending")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hourglass bench footprint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=5_000_000,
                        help="messages to leave pending (0: only the fresh server)")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the data")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if args.messages < 0:
        parser.error("--messages must be >= 0")
    with tempfile.TemporaryDirectory(prefix="hourglass-footprint-", dir=args.dir) as tmp:
        figures = run(args.messages, Path(tmp))
    for name, target in TARGETS.items():
        if name in figures:
            ok = "✔" if figures[name] <= target else "✘"
            print(f"{name:<32} {figures[name]:>10}  target <= {target} {ok}")
    if "ingest_msgs_per_s" in figures:
        print(f"{'ingest_msgs_per_s':<32} {figures['ingest_msgs_per_s']:>10}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
