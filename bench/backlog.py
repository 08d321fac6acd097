"""``hourglass bench backlog``: what ingest costs as the pending backlog grows, RocksDB's
background work included.

In process, on the server's defaults (2 timer shards, 256 MiB RocksDB budget): sends of 1000
msgpack-encoded messages (client msgIds, 100-byte bodies) through the path HTTP sends take
(``Broker.send_columns``), each due at random within an hour that starts 10 minutes on (nothing
comes due during the run). Every ``--slice`` messages it reports the send rate and the CPU
per message of the Python threads (the sending one: with nothing due, the engine's own
threads sleep) and of RocksDB's threads (flushes and compactions, ``rocksdb:*``), read from
/proc per thread: the share of an ingest that its compactions cost,
and how it grows with what is already pending. Sends due at random make every L0 file span
the whole key range, so each compaction out of L0 rewrites what it overlaps at the level
below (docs/performance.md at f86b3f2, section 10). Ends by waiting (up to ``--settle`` s) for the
background work the ingest left behind, counted apart::

    hourglass bench backlog --messages 6000000 --slice 500000 --json bench/results/backlog.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from bench.http import cpu_shares, cpu_times
from scheduler.broker import Broker
from scheduler.clock import SystemClock
from scheduler.config import EngineConfig
from scheduler.model import SendRequest

TOPIC = "backlog"
BATCH = 1000
_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads so far: RocksDB's (``rocksdb:*``) and the rest.
    From each thread's ``schedstat`` (nanoseconds on a CPU), where the kernel has it: the
    ticks of ``stat`` (10 ms) read 0 for a slice that takes 10 ms."""
    out = {"rocksdb": 0.0, "python": 0.0}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            kind = "rocksdb" if name.startswith("rocksdb") else "python"
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    out[kind] += int(f.read().split()[0]) / 1e9
            except (FileNotFoundError, IndexError, ValueError):  # (no schedstats)
                fields = stat[stat.rindex(")") + 2:].split()
                out[kind] += (int(fields[11]) + int(fields[12])) / _TICK
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return out


def batches(n: int, first: int, now_ms: int, rng: random.Random) -> list[bytes]:
    """``n`` messages from number ``first`` on, as msgpack request bodies of ``BATCH``."""
    return [msgpack.packb({"messages": [
        {"msgId": f"b{i:010d}", "body": rng.randbytes(50).hex(),
         "deliverAt": now_ms + 600_000 + rng.randrange(3_600_000)}
        for i in range(start, min(start + BATCH, first + n))]})
        for start in range(first, first + n, BATCH)]


def run(data_dir: Path, messages: int, slice_: int, settle_s: float) -> dict[str, Any]:
    broker = Broker(EngineConfig(data_dir=data_dir, timer_shards=2), SystemClock())
    broker.start()
    try:
        rng = random.Random(11)
        now = broker.clock.now_ms()
        # the topic's first send takes the general path; the columns path then knows it
        broker.send_batch([SendRequest(topic=TOPIC, body=b"x", deliver_at=now + 600_000)])
        slices = []
        for first in range(0, messages, slice_):
            sent = min(slice_, messages - first)
            bodies = batches(sent, first, now, rng)  # (made before the clock starts)
            machine, before, began = cpu_times(), thread_cpu(), time.perf_counter()
            for body in bodies:
                if broker.send_columns(TOPIC, body, max_count=BATCH) is None:
                    raise RuntimeError("a send left the columns path: the figures would mix two")
            wall = time.perf_counter() - began
            after = thread_cpu()
            row = {"pending": first + sent, "sent": sent, "msgs_per_s": sent / wall,
                   "python_us": (after["python"] - before["python"]) / sent * 1e6,
                   "rocksdb_us": (after["rocksdb"] - before["rocksdb"]) / sent * 1e6,
                   "steal_pct": cpu_shares(machine, cpu_times()).get("steal")}
            slices.append(row)
            print(f"pending {row['pending']:>10,}: {row['msgs_per_s'] / 1000:6.0f} k msgs/s, "
                  f"CPU per message: sending {row['python_us']:.2f} µs, RocksDB background "
                  f"{row['rocksdb_us']:.2f} µs (CPU steal {row['steal_pct']} %)", flush=True)
        store = broker.parts.store
        assert store is not None
        before, began = thread_cpu(), time.monotonic()
        while time.monotonic() - began < settle_s and any(
                store.property_int(cf, "rocksdb.estimate-pending-compaction-bytes")
                for cf in store.timer_cf_names()):
            time.sleep(0.25)
        time.sleep(1.0)  # a flush or compaction started as the estimate fell to 0
        settle = thread_cpu()["rocksdb"] - before["rocksdb"]
        pending = broker.stats().pending
    finally:
        broker.close()
    total_bg = sum(r["rocksdb_us"] * r["sent"] for r in slices) / 1e6 + settle
    return {"messages": messages, "slice": slice_, "slices": slices,
            "settle_rocksdb_cpu_s": settle, "pending_after": pending,
            "rocksdb_us_per_message": total_bg / messages * 1e6}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["slices"]
    x = [r["pending"] / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [r["python_us"] for r in rows], "o-", label="sending thread")
    ax.plot(x, [r["rocksdb_us"] for r in rows], "s-", label="RocksDB flushes + compactions")
    ax.set_xlabel("messages pending at the end of the slice (millions)")
    ax.set_ylabel("CPU per message sent (µs)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Ingest of messages due at random, as the backlog grows")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="hourglass bench backlog", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=2_000_000, help="messages to send")
    ap.add_argument("--slice", type=int, default=200_000, help="report every this many")
    ap.add_argument("--settle", type=float, default=60.0,
                    help="seconds at most to wait for the background work left at the end")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    ap.add_argument("--plot", type=Path, default=None, help="draw them here (PNG)")
    args = ap.parse_args(argv)
    if args.messages < 1 or args.slice < BATCH or args.slice % BATCH:
        ap.error(f"--messages must be >= 1 and --slice a multiple of {BATCH}")
    if args.settle < 0:
        ap.error("--settle must be >= 0")
    root = Path(tempfile.mkdtemp(prefix="hourglass-backlog-"))
    try:
        result = run(root / "data", args.messages, args.slice, args.settle)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"RocksDB background CPU per message over the whole ingest (settling included): "
          f"{result['rocksdb_us_per_message']:.2f} µs")
    if args.json:
        args.json.write_text(json.dumps({"command": "hourglass bench backlog " + " ".join(
            argv), **result}, indent=2) + "\n")
    if args.plot:
        plot(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
