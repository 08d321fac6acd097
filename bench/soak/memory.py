"""Memory of the server under soak: its RssAnon from /proc, and (with small RocksDB
buffers) a launcher that runs ``hourglass serve`` with shrunk memtables and block cache and
logs each second what RocksDB says it holds and Python's allocated blocks."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

MIB = 1 << 20

SMALL_BUFFERS = {  # StoreTuning for --rocksdb-buffers small: caches in steady state in a minute
    "block_cache_bytes": 16 * MIB, "db_write_buffer_bytes": 32 * MIB,
    "timer_write_buffer_bytes": 4 * MIB, "index_write_buffer_bytes": 2 * MIB,
    "other_write_buffer_bytes": 2 * MIB,
    "max_total_wal_bytes": 64 * MIB,
}


MEMORY_LOG_ENV = "SOAK_MEMORY_LOG"  # the launcher appends one JSON line per second there
ROCKSDB_MEMORY = ("rocksdb.cur-size-all-mem-tables", "rocksdb.estimate-table-readers-mem")
#: column families whose size the soak follows: the index, the ledger (in meta), the
#: status-retention expiry entries and the consume queues
SIZED_CFS = ("index", "meta", "expiry", "cq")


def log_memory(path: Path, stores: list[Any]) -> None:
    """In the server: what RocksDB says it holds (memtables, table readers, block cache) and
    Python's allocated blocks, each second, so the soak can attribute the RssAnon it sees."""
    from storage.rocks_options import all_cf_names

    while True:
        time.sleep(1.0)
        if not stores or stores[-1].closed:
            continue
        store = stores[-1]
        try:
            cfs = all_cf_names(store.timer_shards)
            doc = {name: sum(store.property_int(cf, name) or 0 for cf in cfs)
                   for name in ROCKSDB_MEMORY}
            doc["rocksdb.block-cache-usage"] = store.property_int("meta",
                                                                  "rocksdb.block-cache-usage")
        except Exception:  # closing: the server is stopping
            return
        try:  # the column families that must stop growing under a steady flow (retention)
            doc["cf"] = {cf: {"sst": store.property_int(cf, "rocksdb.total-sst-files-size") or 0,
                              "mem": store.property_int(cf, "rocksdb.cur-size-all-mem-tables")
                              or 0,
                              "keys": store.property_int(cf, "rocksdb.estimate-num-keys") or 0}
                         for cf in SIZED_CFS}
        except Exception:
            return
        doc["t"] = time.time()
        doc["python_blocks"] = sys.getallocatedblocks()
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(doc) + "\n")


def serve_small_buffers() -> int:
    """``hourglass serve`` (app/server.py) with SMALL_BUFFERS as the store's tuning, which
    the server's settings do not expose; run as a subprocess by the soak."""
    import logging

    from app.server import Server, ensure_admin_token, parse_args
    from app.settings import load_settings
    from app.wiring import build_app, uvicorn_config
    from scheduler.broker import Broker
    from scheduler.config import EngineConfig
    from storage.rocks import RocksStore, StoreTuning

    args = parse_args(sys.argv[1:])
    settings = ensure_admin_token(load_settings(
        cli={"data_dir": str(args.data_dir), "host": args.host, "port": args.port},
        env=os.environ))
    logging.basicConfig(level=settings.log_level.upper())
    tuning = StoreTuning(**SMALL_BUFFERS)
    stores: list[RocksStore] = []

    def store_factory(directory: Path, cfg: EngineConfig) -> RocksStore:
        store = RocksStore(directory, timer_shards=cfg.timer_shards, sync_writes=cfg.sync_writes,
                           tuning=tuning)
        stores.append(store)
        return store

    if os.environ.get(MEMORY_LOG_ENV):
        threading.Thread(target=log_memory, args=(Path(os.environ[MEMORY_LOG_ENV]), stores),
                         daemon=True).start()

    app = build_app(settings, broker=Broker(settings.engine, store_factory=store_factory))
    server = Server(uvicorn_config(app, settings), on_shutdown=app.state.ctx.notifier.close)
    server.run()
    return 0


def anon_mib(pid: int) -> float:
    """RssAnon of ``pid`` in MiB (Linux); RSS - shared elsewhere."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    info = psutil.Process(pid).memory_info()
    return (info.rss - getattr(info, "shared", 0)) / MIB


class MemoryLog:
    """The server's latest line of ``log_memory`` (nothing when it does not write one)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.latest = path, 0, None

    def read(self) -> dict[str, Any] | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                f.seek(self.offset)
                lines = f.readlines()
                self.offset = f.tell()
        except FileNotFoundError:
            return None
        complete = [line for line in lines if line.endswith("\n")]
        if complete:
            self.latest = json.loads(complete[-1])
        return self.latest
