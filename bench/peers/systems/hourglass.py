"""hourglass over HTTP, written against the v1 HTTP contract (docs/api.md).

- send: ``POST /v1/topics/{topic}/messages:batch`` with up to 1000 ``MessageIn``
  (``msgId`` = message id, ``body`` = the 100 ASCII bytes, ``deliverAt`` = due epoch ms)
  and, unless ``--hourglass-answer full``, ``Prefer: return=minimal`` (the answer is a count
  and the duplicates' positions, as the peers' ``ZADD`` and ``COPY`` answer); 201 expected.
  ``msgId`` makes the send idempotent server-side (the peers do without that).
- consumers (``--hourglass-consume receive``, the default): ``--consumers`` threads, competing
  members of one group, as many as the peers run: ``POST /v1/topics/{topic}/groups/G:receive``
  with ``max=1000, waitMs=1000`` and ``ack`` = the previous batch's receipts (acknowledged
  before the receive, one request per batch); the last batch with ``POST …/groups/G:ack``.
  ``--hourglass-consume pull`` (the mode before competing consumers): one thread per topic (a
  topic is one ordered log, like a Kafka partition):
  ``GET /v1/topics/{topic}/messages?group=G&max=1000&waitMs=1000``, then
  ``PUT /v1/topics/{topic}/groups/G/offset`` with ``nextOffset``. Each delivered message
  carries ``storedAt - deliverAt``: its lateness as the server measured it.

The server: with ``--hourglass-url`` an already running server is used (its memory and disk
cannot be measured then); otherwise the harness starts ``.venv/bin/hourglass serve --data-dir
DIR --host 127.0.0.1 --port P`` with ``HOURGLASS_ADMIN_TOKEN`` and waits for ``/readyz``.

Guarantee: exactly-once into the topic log (design guarantee 2), at-least-once to a consumer
that acknowledges (or commits its offset) after processing. Durability: RocksDB WAL +
CommitLog under the server's ``flush_policy`` / ``flush_interval_ms`` / ``sync_writes``
(defaults, or what ``--hourglass-env HOURGLASS_FLUSH_POLICY=sync`` etc. set), stated in the
report.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import msgpack
import msgspec
import orjson
import psutil
import urllib3

from ..common import (
    Batch,
    ManagedProcess,
    dir_size,
    free_port,
    log,
    now_ms,
    tree_memory,
    wait_until,
)
from .base import Sink, System, SystemUnavailable

REPO = Path(__file__).resolve().parents[3]
PULL_MAX = 1000
WAIT_MS = 1000
MSGPACK = "application/x-msgpack"
MSGPACK_BODY = {"Content-Type": MSGPACK}
JSON_BODY = {"Content-Type": "application/json"}


class _Message(msgspec.Struct, rename="camel"):
    """What the consumers read of a delivered message (the rest of it is skipped)."""

    msg_id: str
    deliver_at: int
    stored_at: int
    receipt: str = ""


class _Page(msgspec.Struct, rename="camel"):
    messages: list[_Message]
    next_offset: int = 0


#: decode msgpack and JSON answers into typed structs, as a generated client would (4-5x less
#: client CPU than a dict per message in msgpack, ~2.8x in JSON (a stream frame of 1000 with
#: both bodies: 0.35 against 0.97 ms with orjson's dicts): the consumers share the load
#: generator's interpreter)
_read_page = msgspec.msgpack.Decoder(_Page).decode
_read_page_json = msgspec.json.Decoder(_Page).decode


class _Frames:
    """The frames of a msgpack stream (one msgpack map each, back to back) as ``_Page``s:
    msgpack's Unpacker finds where each ends (``skip``), msgspec decodes it."""

    def __init__(self) -> None:
        self._bounds = msgpack.Unpacker()
        self._buf = bytearray()
        self._base = 0  # the Unpacker's position of self._buf[0]

    def feed(self, chunk: bytes) -> list[_Page]:
        self._bounds.feed(chunk)
        self._buf += chunk
        pages, start = [], 0
        while True:
            try:
                self._bounds.skip()
            except msgpack.OutOfData:
                break
            end = self._bounds.tell() - self._base
            pages.append(_read_page(self._buf[start:end]))
            start = end
        del self._buf[:start]
        self._base += start
        return pages


LEASE_MS = 60_000
STREAM_MS = 2_000  # a consumer's stream is renewed this often (it then sees its stop)


def _text(r: urllib3.BaseHTTPResponse) -> str:
    """The start of an error answer, for the message of the exception it raises."""
    return r.data[:300].decode("utf-8", "replace")


def _find_hourglass() -> str | None:
    for cand in (REPO / ".venv" / "bin" / "hourglass", Path(sys.executable).parent / "hourglass"):
        if cand.exists() and os.access(cand, os.X_OK):
            return str(cand)
    return None


def _find_number(doc: Any, names: tuple[str, ...]) -> int | None:
    """First integer under one of ``names`` anywhere in a JSON document (stats are loose)."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in names and isinstance(v, int | float) and not isinstance(v, bool):
                return int(v)
        for v in doc.values():
            found = _find_number(v, names)
            if found is not None:
                return found
    elif isinstance(doc, list):
        for v in doc:
            found = _find_number(v, names)
            if found is not None:
                return found
    return None


class HourglassSystem(System):
    name = "hourglass"
    label = "hourglass (HTTP)"
    guarantee = "exactly-once into the log; at-least-once to a committing consumer"
    durability = "RocksDB WAL + CommitLog, server flush policy"

    def __init__(self, options: dict) -> None:
        super().__init__(options)
        self.url: str | None = options.get("hourglass_url")
        self.token: str = options.get("token") or f"bench-{uuid.uuid4().hex}"
        self.cmd: str | None = options.get("hourglass_cmd")
        self.extra_env: dict[str, str] = dict(options.get("hourglass_env") or {})
        self.src: Path | None = options.get("hourglass_src")
        self.proc: ManagedProcess | None = None
        self.datadir: Path | None = None
        self.base = ""
        self.topic = "bench"
        self.group = "bench"
        self.http: urllib3.HTTPConnectionPool | None = None
        self.stats_doc: dict = {}
        self.msgpack = options.get("hourglass_encoding", "msgpack") == "msgpack"
        # ``Prefer: return=minimal``: the answer to a batch is a count and the duplicates'
        # positions, not a SendResult per message (22 bytes instead of ~137 KB a batch)
        self.send_headers = {**(MSGPACK_BODY if self.msgpack else JSON_BODY),
                             **({"Prefer": "return=minimal"}
                                if options.get("hourglass_answer", "minimal") == "minimal"
                                else {})}
        # ``Prefer: body=once``: a delivered message carries its 100-byte body once, not
        # twice (``body`` and ``bodyBase64``): ~110 bytes less per message in msgpack
        self.consume_headers = ({"Prefer": "body=once"}
                                if options.get("hourglass_body", "once") == "once" else {})
        self.consume_mode: str = options.get("hourglass_consume") or "stream"
        if self.consume_mode not in ("receive", "pull", "stream"):
            raise ValueError(f"hourglass_consume is 'receive', 'pull' or 'stream', not "
                             f"{self.consume_mode!r}")

    def consumer_threads(self) -> int:
        if self.consume_mode in ("pull", "stream"):
            return 1  # one ordered log per topic: one offset reader per group and topic
        return self.consumers

    def durability_settings(self) -> dict[str, str]:
        """flush_policy, flush_interval_ms, sync_writes as the started server has them: the
        ``HOURGLASS_*`` env given with ``--hourglass-env``, else the engine's defaults."""
        if self.url:
            return {}
        defaults: dict[str, str] = {}
        try:
            from scheduler.config import EngineConfig

            d = EngineConfig(data_dir=Path("."))
            defaults = {"flush_policy": str(d.flush_policy),
                        "flush_interval_ms": str(d.flush_interval_ms),
                        "sync_writes": str(d.sync_writes).lower()}
        except Exception:
            pass
        for k in ("flush_policy", "flush_interval_ms", "sync_writes"):
            v = self.extra_env.get(f"HOURGLASS_{k.upper()}")
            if v is not None:
                defaults[k] = v
        return defaults

    def describe(self) -> dict[str, object]:
        d = super().describe()
        st = self.durability_settings()
        if st:
            sync_wal = st.get("sync_writes", "false").lower() in ("1", "true", "yes", "on")
            log_part = ("CommitLog msync per delivery batch" if st.get("flush_policy") == "sync"
                        else f"CommitLog msync every {st.get('flush_interval_ms', '?')} ms")
            wal_part = ("RocksDB WAL fsync per write" if sync_wal
                        else "RocksDB WAL written per request, not fsynced")
            d["durability"] = f"{wal_part}; {log_part}" + (
                "" if sync_wal else " (acked sends survive a process crash, not an OS crash)")
        return d

    def config(self) -> dict[str, str]:
        cfg = {
            "server": self.url or "started by the harness: hourglass serve",
            **({"code": f"commit {self.options.get('hourglass_rev')}"}
               if self.src is not None else {}),
            **self.durability_settings(),
            **self.extra_env,
            "send": ("POST …/messages:batch, 1000 per request, msgId + body + deliverAt"
                     + ("; Prefer: return=minimal" if "Prefer" in self.send_headers else "")),
            "consumer": (f"1 thread: GET …/messages?group&max={PULL_MAX}&waitMs={WAIT_MS}"
                         "&offset=<previous nextOffset>&commit=true (pull + offset commit in "
                         "one request)" if self.consume_mode == "pull" else
                         f"1 thread: GET …/messages:stream?offset&max={PULL_MAX}&durationMs="
                         f"{STREAM_MS} (a frame per delivery), the group's offset PUT once a "
                         "second" if self.consume_mode == "stream" else
                         f"{self.consumers} members of one group: POST …:receive max={PULL_MAX}"
                         f" waitMs={WAIT_MS} ack=<the previous batch's receipts> (ack + "
                         "receive in one request)")
                        + ("; Prefer: body=once" if self.consume_headers else ""),
            "bodies": ("msgpack batches, pulls and receives (Content-Type / Accept "
                       "application/x-msgpack)" if self.msgpack else "JSON"),
        }
        shards = _find_number(self.stats_doc, ("timerShards",))
        if shards is not None:
            cfg["timerShards"] = str(shards)
        return cfg

    # --- lifecycle -------------------------------------------------------------------------
    def start(self, workdir: Path) -> None:
        if self.url:
            self.base = self.url.rstrip("/")
            # an external server keeps its data: a fresh topic per run keeps runs apart
            self.topic = f"bench-{uuid.uuid4().hex[:12]}"
        else:
            exe = self.cmd or _find_hourglass()
            if exe is None:
                raise SystemUnavailable("hourglass command not found (.venv/bin/hourglass)")
            self.datadir = workdir / "hourglass-data"
            self.datadir.mkdir(parents=True, exist_ok=True)
            port = free_port()
            self.base = f"http://127.0.0.1:{port}"
            argv = [exe, "serve", "--data-dir", str(self.datadir), "--host", "127.0.0.1",
                    "--port", str(port)]
            env = {**self.extra_env, "HOURGLASS_ADMIN_TOKEN": self.token}
            cwd = REPO
            if self.src is not None:
                # the server's code from a frozen copy of one commit, ahead of the editable install
                env["PYTHONPATH"] = str(self.src)
                cwd = self.src
            self.proc = ManagedProcess("hourglass", argv, workdir / "hourglass.log", env=env,
                                       stop_signal=signal.SIGTERM, cwd=cwd)
        # urllib3 (what openapi-generator's Python clients are built on): a pull of 1000
        # costs this client 1.1-1.5 ms less CPU than through httpx (bench/peers/README.md)
        self.http = urllib3.connection_from_url(
            self.base, maxsize=32, timeout=urllib3.Timeout(60.0), retries=False,
            headers={"Authorization": f"Bearer {self.token}"})

        def ready() -> bool:
            try:
                return self._call("GET", "/readyz", timeout=2.0).status == 200
            except urllib3.exceptions.HTTPError:
                return False

        try:
            wait_until(ready, 90, "hourglass", self.proc, interval=0.25)
        except RuntimeError as exc:
            tail = self.proc.log_tail(40) if self.proc is not None else ""
            last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), str(exc))
            if tail:
                log(f"hourglass server output:\n{tail}")
            self.stop()
            how = self.url or "hourglass serve"
            raise SystemUnavailable(f"hourglass server did not start ({how}): {last}") from exc
        self._refresh_stats()

    def stop(self) -> None:
        self.stop_consumers()
        if self.http is not None and self.proc is not None:
            self._log_stream_counters()
        if self.http is not None:
            self.http.close()
            self.http = None
        if self.proc is not None:
            self.proc.stop(timeout=60)
            self.proc = None

    def _log_stream_counters(self) -> None:
        """Log the server's stream push counters (``/metrics``: frames the committing
        thread wrote, hand-backs to the loop) before it stops; nothing if it cannot tell."""
        try:
            r = self._call("GET", "/metrics", timeout=5)
        except urllib3.exceptions.HTTPError:
            return
        if r.status != 200:
            return
        names = ("hourglass_stream_frames_pushed_total", "hourglass_stream_handbacks_total")
        found = [line for line in r.data.decode(errors="replace").splitlines()
                 if line.startswith(names)]
        if found:
            log("hourglass streams: " + ", ".join(found))

    def compacted_disk(self) -> int | None:
        """Stop the server, compact its RocksDB (every column family, down to the bottommost
        level: what background compaction reaches in time; bench/footprint.py does the same)
        and measure the data dir. None with ``--hourglass-url``."""
        if self.proc is None or self.datadir is None:
            return None
        self.stop()
        env = {**os.environ, **self.extra_env,
               "PYTHONPATH": str(self.src if self.src is not None else REPO)}
        # (a frozen --hourglass-rev from before compact_rocksdb had it as _compact)
        code = ("import sys; from pathlib import Path\n"
                "try:\n    from bench.footprint import compact_rocksdb\n"
                "except ImportError:\n    from bench.footprint import _compact as compact_rocksdb\n"
                "compact_rocksdb(Path(sys.argv[1]))")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code, str(self.datadir / "rocksdb")], env=env,
                       cwd=self.src or REPO, check=True, timeout=1800)
        log(f"hourglass: server stopped, RocksDB compacted in {time.perf_counter() - t0:.1f} s")
        return dir_size(self.datadir)

    def _refresh_stats(self) -> dict:
        try:
            r = self._call("GET", "/v1/admin/stats", timeout=30.0)
            if r.status == 200:
                self.stats_doc = orjson.loads(r.data)
        except urllib3.exceptions.HTTPError:
            pass
        return self.stats_doc

    def _call(self, method: str, path: str, body: bytes | None = None,
              headers: dict[str, str] | None = None,
              timeout: float | None = None, preload_content: bool = True
              ) -> urllib3.BaseHTTPResponse:
        """One request on the pool's keep-alive connections (``headers`` beside the token);
        ``preload_content`` False: the body is read as it comes (``stream``)."""
        assert self.http is not None
        return self.http.urlopen(
            method, path, body=body, headers={**self.http.headers, **(headers or {})},
            timeout=urllib3.Timeout(timeout) if timeout is not None else None,
            retries=False, preload_content=preload_content)

    # --- producing -------------------------------------------------------------------------
    def send(self, batch: Batch) -> None:
        payload = {"messages": [
            {"msgId": i, "body": b, "deliverAt": d}
            for i, d, b in zip(batch.ids, batch.due_ms, batch.bodies, strict=True)
        ]}
        r = self._call("POST", f"/v1/topics/{self.topic}/messages:batch",
                       msgpack.packb(payload) if self.msgpack else orjson.dumps(payload),
                       self.send_headers)
        if r.status != 201:
            raise RuntimeError(f"hourglass send: HTTP {r.status}: {_text(r)}")

    # --- consuming -------------------------------------------------------------------------
    def consume_loop(self, k: int, sink: Sink, stop: threading.Event) -> None:
        if self.consume_mode == "pull":
            self._pull_loop(sink, stop)
        elif self.consume_mode == "stream":
            self._stream_loop(sink, stop)
        else:
            self._receive_loop(sink, stop)

    def _receive_loop(self, sink: Sink, stop: threading.Event) -> None:
        """Receive, hand the batch to the sink, and acknowledge it with the next receive
        (``ack`` in the request body: one request per batch); the last batch with ``:ack``."""
        group = f"/v1/topics/{self.topic}/groups/{self.group}"
        ask = {"max": PULL_MAX, "waitMs": WAIT_MS, "leaseMs": LEASE_MS}
        headers = {**(MSGPACK_BODY | {"Accept": MSGPACK} if self.msgpack else JSON_BODY),
                   **self.consume_headers}
        pack = msgpack.packb if self.msgpack else orjson.dumps
        read = _read_page if self.msgpack else _read_page_json
        receipts: list[str] = []  # the previous batch's, acknowledged with the next receive
        while not stop.is_set():
            body = {**ask, "ack": receipts} if receipts else ask
            r = self._call("POST", f"{group}:receive", pack(body), headers)
            if r.status != 200:
                raise RuntimeError(f"hourglass receive: HTTP {r.status}: {_text(r)}")
            t = now_ms()
            page = read(r.data).messages
            receipts = [m.receipt for m in page]
            if page:
                sink([m.msg_id for m in page], t, [m.stored_at - m.deliver_at for m in page])
        if receipts:
            a = self._call("POST", f"{group}:ack", pack({"receipts": receipts}), headers)
            if a.status != 200:
                raise RuntimeError(f"hourglass ack: HTTP {a.status}: {_text(a)}")

    def _pull_loop(self, sink: Sink, stop: threading.Event) -> None:
        path = (f"/v1/topics/{self.topic}/messages?"
                f"{urlencode({'group': self.group, 'max': PULL_MAX, 'waitMs': WAIT_MS})}")
        accept = {**({"Accept": MSGPACK} if self.msgpack else {}), **self.consume_headers}
        offset: int | None = None  # where the previous batch ended: committed with the next pull
        while not stop.is_set():
            url = path if offset is None else f"{path}&offset={offset}&commit=true"
            r = self._call("GET", url, headers=accept)
            if r.status != 200:
                raise RuntimeError(f"hourglass pull: HTTP {r.status}: {_text(r)}")
            t = now_ms()
            page = (_read_page if self.msgpack else _read_page_json)(r.data)
            if page.messages:
                sink([m.msg_id for m in page.messages], t,
                     [m.stored_at - m.deliver_at for m in page.messages])
                offset = page.next_offset

    def _stream_loop(self, sink: Sink, stop: threading.Event) -> None:
        """One standing stream (GET …/messages:stream), a frame per delivery, renewed every
        STREAM_MS (so ``stop`` is seen); the group's offset committed once a second and at
        the end, as RocketMQ's push consumer persists its offsets every few seconds."""
        offsets = f"/v1/topics/{self.topic}/groups/{self.group}/offset"
        start = self._call("GET", offsets)
        if start.status != 200:
            raise RuntimeError(f"hourglass offset: HTTP {start.status}: {_text(start)}")
        offset = orjson.loads(start.data)["offset"]
        committed, last_commit = offset, time.monotonic()
        headers = {**({"Accept": MSGPACK} if self.msgpack else {}), **self.consume_headers}
        while not stop.is_set():
            query = urlencode({"offset": offset, "max": PULL_MAX, "durationMs": STREAM_MS})
            r = self._call("GET", f"/v1/topics/{self.topic}/messages:stream?{query}",
                           headers=headers, preload_content=False)
            if r.status != 200:
                raise RuntimeError(f"hourglass stream: HTTP {r.status}: {_text(r)}")
            frames = _Frames()
            rest = b""  # NDJSON: the start of a frame whose line has not ended yet
            for chunk in r.stream(1 << 20):
                t = now_ms()
                if self.msgpack:
                    for page in frames.feed(chunk):
                        if page.messages:
                            sink([m.msg_id for m in page.messages], t,
                                 [m.stored_at - m.deliver_at for m in page.messages])
                        offset = page.next_offset
                else:
                    lines = (rest + chunk).split(b"\n")
                    rest = lines.pop()
                    for page in map(_read_page_json, filter(None, lines)):
                        if page.messages:
                            sink([m.msg_id for m in page.messages], t,
                                 [m.stored_at - m.deliver_at for m in page.messages])
                        offset = page.next_offset
                if offset != committed and time.monotonic() - last_commit >= 1.0:
                    self._commit(offsets, offset)
                    committed, last_commit = offset, time.monotonic()
            r.release_conn()
        if offset != committed:
            self._commit(offsets, offset)

    def _commit(self, path: str, offset: int) -> None:
        r = self._call("PUT", path, orjson.dumps({"offset": offset}), JSON_BODY)
        if r.status != 200:
            raise RuntimeError(f"hourglass offset commit: HTTP {r.status}: {_text(r)}")

    # --- inspection ------------------------------------------------------------------------
    def server_processes(self) -> list[psutil.Process]:
        return self.proc.tree() if self.proc else []

    def pending_count(self) -> int | None:
        doc = self._refresh_stats()
        return _find_number(doc, ("pending", "pendingCount", "scheduled", "scheduledCount"))

    def delivered_count(self) -> int:
        """From the same stats document as the last ``pending_count``."""
        return _find_number(self.stats_doc, ("delivered", "deliveredCount")) or 0

    def footprint(self) -> dict[str, int | None]:
        import time

        time.sleep(1.5)
        self._refresh_stats()
        if self.proc is None or self.datadir is None:
            return {"memory": None, "disk": None}
        mem = tree_memory(self.proc.tree())
        return {"memory": mem["rss"], "process_pss": mem["pss"], "disk": dir_size(self.datadir)}

