"""A PostgreSQL 15 job table, the classic ``FOR UPDATE SKIP LOCKED`` delay queue.

Schema::

    CREATE TABLE jobs (id bigserial PRIMARY KEY, topic text NOT NULL, msg_id text NOT NULL,
                       body bytea NOT NULL, run_at bigint NOT NULL);   -- run_at: epoch ms
    CREATE INDEX jobs_run_at ON jobs (run_at);

- send: one ``COPY jobs (topic, msg_id, body, run_at) FROM STDIN`` (binary) per batch, one
  transaction (and so one WAL flush, ``synchronous_commit = on``) per batch; each producer
  thread has its own connection. No unique index on ``msg_id``: sends are not idempotent.
- consumers (threads, one connection each), in one transaction::

    DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE run_at <= $now
                                  ORDER BY run_at LIMIT 1000 FOR UPDATE SKIP LOCKED)
    RETURNING msg_id, run_at, body;  COMMIT

  when nothing is due, ``SELECT min(run_at)`` and sleep until then (1 ms to 50 ms). The
  consumers get each body, as Redis's (``id|body`` members) and hourglass's do;
  ``--no-postgres-bodies`` returns only ``msg_id, run_at`` (as before 2026-11-27: W2 with
  16 KiB bodies then delivered 20 k msgIds, not 330 MB).

The server: ``initdb`` into the run's directory, started as the ``postgres`` user when the
harness runs as root, on 127.0.0.1 and a free port. fsync, synchronous_commit and
wal_sync_method stay at their defaults (on, on, fdatasync); shared_buffers and max_wal_size
are raised (see ``SETTINGS``) as any deployment on a 24 GiB machine would.

Guarantee: exactly-once inside the database (a row is claimed and deleted in one transaction);
at-least-once to the consumer if it did its work before COMMIT and crashed before the COMMIT
returned. Durability: WAL fsync at every commit.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import psutil

from ..common import (
    Batch,
    ManagedProcess,
    chown_tree,
    dir_size,
    free_port,
    now_ms,
    tree_memory,
    wait_until,
)
from .base import Sink, System, SystemUnavailable

SETTINGS = {
    "shared_buffers": "1GB",
    "max_wal_size": "4GB",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
}
CLAIM_BATCH = 1000
IDLE_SLEEP_S = 0.05
MIN_SLEEP_S = 0.001  # a 1 ms floor: no busy loop while messages trickle in
TOPIC = "bench"

SCHEMA = """
CREATE TABLE jobs (
    id bigserial PRIMARY KEY,
    topic text NOT NULL,
    msg_id text NOT NULL,
    body bytea NOT NULL,
    run_at bigint NOT NULL
);
CREATE INDEX jobs_run_at ON jobs (run_at);
"""

CLAIM_SQL = """
DELETE FROM jobs WHERE id IN (
    SELECT id FROM jobs WHERE run_at <= %s ORDER BY run_at LIMIT %s FOR UPDATE SKIP LOCKED
) RETURNING msg_id, run_at
"""
#: the consumers get the bodies too (the default; ``CLAIM_SQL`` never reads them)
CLAIM_BODIES_SQL = CLAIM_SQL.replace("RETURNING msg_id, run_at", "RETURNING msg_id, run_at, body")


def _pg_bin(tool: str) -> str:
    found = shutil.which(tool)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{tool}"))
    if not candidates:
        raise SystemUnavailable(f"{tool} not found (apt-get install postgresql)")
    return candidates[-1]


class PostgresSystem(System):
    name = "postgres"
    label = "PostgreSQL job table"
    guarantee = ("exactly-once in the DB (claim+delete in 1 txn); "
                 "at-least-once to the consumer")
    durability = "WAL fsync per commit (synchronous_commit=on, fsync=on)"

    def __init__(self, options: dict) -> None:
        super().__init__(options)
        try:
            import psycopg
        except ImportError as exc:
            raise SystemUnavailable(f"python package psycopg missing: {exc}") from exc
        self._psycopg = psycopg
        self.proc: ManagedProcess | None = None
        self.datadir: Path | None = None
        self.port = 0
        self.version = ""
        self._local = threading.local()
        self._conns: list = []
        self._conns_lock = threading.Lock()
        self.bodies = bool(options.get("postgres_bodies", True))
        self.claim_sql = CLAIM_BODIES_SQL if self.bodies else CLAIM_SQL

    def config(self) -> dict[str, str]:
        return {
            "postgres": self.version or "?",
            **SETTINGS,
            "table": "jobs(id bigserial pk, topic, msg_id, body bytea, run_at bigint ms), "
                     "btree on run_at",
            "send": "binary COPY of the batch, 1 transaction per batch",
            "consumers": f"{self.consumers} threads: DELETE … WHERE id IN (SELECT … "
                         f"FOR UPDATE SKIP LOCKED LIMIT {CLAIM_BATCH}) RETURNING msg_id, "
                         f"run_at{', body' if self.bodies else ''}, "
                         f"idle sleep ≤ {int(IDLE_SLEEP_S * 1000)} ms",
        }

    # --- lifecycle -------------------------------------------------------------------------
    @staticmethod
    def _user() -> str | None:
        """postgres refuses to run as root: run its programs as the ``postgres`` user then."""
        return "postgres" if os.geteuid() == 0 else None

    def start(self, workdir: Path) -> None:
        initdb, postgres = _pg_bin("initdb"), _pg_bin("postgres")
        root = workdir / "pg"
        root.mkdir(parents=True, exist_ok=True)
        self.datadir = root / "data"
        sockdir = root / "sock"
        sockdir.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            # postgres refuses to run as root: hand the directory to the postgres user and make
            # the path to it traversable
            chown_tree(root, "postgres")
            for p in (workdir, *workdir.parents):
                if p == Path("/"):
                    break
                os.chmod(p, os.stat(p).st_mode | 0o011)
        res = subprocess.run(
            [initdb, "-D", str(self.datadir), "-U", "bench", "--auth=trust",
             "-E", "UTF8", "--locale=C", "--no-instructions"],
            capture_output=True, text=True, check=False, user=self._user(), group=self._user(),
            cwd=root,
        )
        if res.returncode != 0:
            raise SystemUnavailable(f"initdb failed: {res.stderr.strip()[-800:]}")
        self.port = free_port()
        argv = [postgres, "-D", str(self.datadir), "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={sockdir}"]
        for k, v in SETTINGS.items():
            argv += ["-c", f"{k}={v}"]
        # SIGINT = "fast" shutdown: roll back sessions, checkpoint, exit
        self.proc = ManagedProcess("postgres", argv, workdir / "postgres.log",
                                   stop_signal=signal.SIGINT, user=self._user(), cwd=root)

        def ready() -> bool:
            with self._connect() as c:
                self.version = str(c.execute("SHOW server_version").fetchone()[0])
            return True

        wait_until(ready, 60, "postgres", self.proc, interval=0.2)
        with self._connect() as c:
            c.execute(SCHEMA)
            c.commit()

    def _connect(self):  # -> psycopg.Connection
        return self._psycopg.connect(host="127.0.0.1", port=self.port, user="bench",
                                     dbname="postgres", connect_timeout=5)

    def _conn(self):
        """This thread's connection (producers and consumers each get their own)."""
        c = getattr(self._local, "conn", None)
        if c is None or c.closed:
            c = self._connect()
            self._local.conn = c
            with self._conns_lock:
                self._conns.append(c)
        return c

    def stop(self) -> None:
        self.stop_consumers()
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.close()
            except Exception:
                pass
        self._local = threading.local()
        if self.proc is not None:
            self.proc.stop(timeout=60)
            self.proc = None

    # --- producing -------------------------------------------------------------------------
    def send(self, batch: Batch) -> None:
        c = self._conn()
        with c.cursor() as cur:
            with cur.copy("COPY jobs (topic, msg_id, body, run_at) FROM STDIN "
                          "WITH (FORMAT BINARY)") as cp:
                cp.set_types(["text", "text", "bytea", "int8"])
                for i, d, b in zip(batch.ids, batch.due_ms, batch.bodies, strict=True):
                    cp.write_row((TOPIC, i, b.encode("ascii"), d))
        c.commit()

    # --- consuming -------------------------------------------------------------------------
    def consume_loop(self, k: int, sink: Sink, stop: threading.Event) -> None:
        c = self._connect()
        with self._conns_lock:
            self._conns.append(c)
        while not stop.is_set():
            with c.cursor() as cur:
                cur.execute(self.claim_sql, (int(now_ms()), CLAIM_BATCH))
                rows = cur.fetchall()
                t = now_ms()
                if rows:
                    sink([r[0] for r in rows], t, None)
                    c.commit()
                    continue
                c.commit()
                cur.execute("SELECT min(run_at) FROM jobs")
                nxt = cur.fetchone()[0]
                c.commit()
            wait = IDLE_SLEEP_S
            if nxt is not None:
                wait = min(max((nxt - now_ms()) / 1000, MIN_SLEEP_S), wait)
            stop.wait(wait)

    # --- inspection ------------------------------------------------------------------------
    def server_processes(self) -> list[psutil.Process]:
        return self.proc.tree() if self.proc else []

    def pending_count(self) -> int | None:
        with self._connect() as c:
            return int(c.execute("SELECT count(*) FROM jobs").fetchone()[0])

    def footprint(self) -> dict[str, int | None]:
        assert self.proc is not None and self.datadir is not None
        with self._connect() as c:
            rel, idx, heap, wal_lsn = c.execute(
                "SELECT pg_total_relation_size('jobs'), pg_indexes_size('jobs'), "
                "pg_table_size('jobs'), pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        mem = tree_memory(self.proc.tree())
        return {
            "memory": mem["pss"],        # PSS: shared buffers counted once across backends
            "process_rss": mem["rss"],
            "relation": int(rel),        # heap + indexes + TOAST
            "table": int(heap),
            "indexes": int(idx),
            "wal_written": int(wal_lsn),  # WAL bytes generated since initdb
            "pg_wal_dir": dir_size(self.datadir / "pg_wal"),
            "disk": dir_size(self.datadir),
        }
