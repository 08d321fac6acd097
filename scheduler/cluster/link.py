"""NatsLink: the blocking face of a nats-py connection that lives on its own event loop.

nats-py is asyncio; the engine's writers are threads (and the HTTP event loop). The link
runs one asyncio loop on a daemon thread and every method here submits a coroutine to it
and waits for the answer with a timeout, so any thread can publish or read the lease.

JetStream objects (names from ``ClusterNames``):
- the write-ahead stream (``wal``, one subject, ``replicas`` copies, file storage): the
  leader publishes with ``Nats-Expected-Last-Sequence`` (``publish``), which JetStream
  refuses once anyone else appended: the fencing of storage/replication.py's leader;
- the lease bucket (KV, history 1, max age = the lease): ``create`` takes the lease when
  nobody holds it, ``update`` with the revision renews it; unrenewed, its one message ages
  out and the key is free again;
- the node bucket (KV, max age a few leases): each node's role, URL and applied sequence,
  for ``GET /v1/cluster``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import nats
import nats.js.errors
from nats.js import api
from nats.js.errors import APIError, BadRequestError, KeyNotFoundError, NotFoundError

from scheduler.cluster.publisher import DirectPublisher, DirectPublisherUnsupported
from storage.errors import NotLeader, Unavailable

log = logging.getLogger(__name__)
T = TypeVar("T")
EXPECTED_LAST_SEQ = "Nats-Expected-Last-Sequence"
WRONG_LAST_SEQUENCE = 10071  # JetStream's error code
#: consumers made (and deleted) at most to get one on the NATS server this node is connected to
LOCAL_CONSUMER_TRIES = 6
LOCAL_CONSUMER_S = 1.0  # ... and for at most so long (then the last one made is kept)
FRESH_CONSUMER_S = 2.0  # a consumer so young that answers "no responders" is waited for


class SnapshotMoved(Exception):
    """A snapshot download that stalled or read other bytes than the object's digest: the
    leader replaced the snapshot (and its chunks went) while it was read."""


@dataclass(frozen=True, slots=True)
class ClusterNames:
    wal: str = "HOURGLASS_WAL"
    lease_bucket: str = "hourglass-lease"
    node_bucket: str = "hourglass-nodes"
    snapshot_bucket: str = "hourglass-snapshots"
    lease_key: str = "leader"
    snapshot_key: str = "latest"

    @property
    def wal_subject(self) -> str:
        return f"hourglass.wal.{self.wal}"


class NatsLink:
    def __init__(self, urls: list[str], *, names: ClusterNames | None = None,
                 replicas: int = 3, lease_ms: int = 2000, timeout_s: float = 2.0,
                 name: str = "hourglass", direct_publish: bool = True,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.urls = urls
        self.names = names or ClusterNames()
        self.replicas = replicas
        self.lease_ms = lease_ms
        self.timeout_s = timeout_s
        self._node_ttl_s = max(10.0, 5 * lease_ms / 1000)  # of a status in the node bucket
        self._monotonic = monotonic
        self._nodes_seen: tuple[float, dict[str, bytes]] | None = None  # (monotonic s, listing)
        self.snapshot_stall_s = 5.0  # no snapshot chunk for so long: read it again
        self.local_consumer_tries = LOCAL_CONSUMER_TRIES  # (1: wherever JetStream puts it)
        self.consumer_placement: tuple[str | None, str | None, int] | None = None
        self._name = name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="nats-link",
                                        daemon=True)
        self._thread.start()
        self._nc: Any = None
        self._js: Any = None
        self._lease_kv: Any = None
        self._node_kv: Any = None
        self._objects: Any = None
        #: the leader's publishes, on a blocking socket of their own (None: through nats-py)
        self._publisher: DirectPublisher | None = None
        if direct_publish:
            try:
                self._publisher = DirectPublisher(urls, self.names.wal_subject,
                                                  timeout_s=timeout_s, name=f"{name}-publisher")
            except DirectPublisherUnsupported as exc:
                log.info("publishing through nats-py: %s", exc)
        self._sub: Any = None
        self._sub_next = 0  # the sequence the subscription delivers next
        self._sub_made = 0.0  # when its consumer was made (the link loop's time)

    # --- plumbing ---------------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout_s if timeout_s is not None else self.timeout_s + 1)
        except TimeoutError:
            future.cancel()
            raise Unavailable("NATS did not answer in time") from None
        except (APIError, nats.errors.Error) as exc:  # no JetStream leader now, no connection
            raise Unavailable(f"NATS: {exc}") from exc

    def connect(self, *, attempts_s: float = 30.0) -> None:
        """Connect, then make the stream and the buckets (retried until the JetStream
        cluster has a meta leader, at most ``attempts_s``)."""
        self._run(self._connect(attempts_s), attempts_s + 5)

    async def _connect(self, attempts_s: float) -> None:
        self._nc = await nats.connect(
            servers=self.urls, name=self._name, max_reconnect_attempts=-1,
            reconnect_time_wait=0.2, connect_timeout=1, allow_reconnect=True,
            error_cb=self._quiet, disconnected_cb=self._noop, reconnected_cb=self._noop)
        self._js = self._nc.jetstream(timeout=self.timeout_s)
        deadline = self._loop.time() + attempts_s
        while True:
            try:
                await self._setup()
                return
            except Exception as exc:
                if self._loop.time() > deadline:
                    raise Unavailable(f"JetStream not ready: {exc}") from exc
                await asyncio.sleep(0.2)

    @staticmethod
    async def _quiet(exc: Exception) -> None:
        log.debug("nats: %s", exc)

    @staticmethod
    async def _noop() -> None:
        return None

    async def _setup(self) -> None:
        n = self.names
        try:
            await self._js.stream_info(n.wal)
        except NotFoundError:
            await self._js.add_stream(api.StreamConfig(
                name=n.wal, subjects=[n.wal_subject], num_replicas=self.replicas,
                storage=api.StorageType.FILE, allow_direct=True, max_msg_size=-1))
        lease_s = self.lease_ms / 1000
        try:
            self._lease_kv = await self._js.key_value(n.lease_bucket)
        except (NotFoundError, APIError):
            self._lease_kv = await self._js.create_key_value(api.KeyValueConfig(
                bucket=n.lease_bucket, history=1, ttl=lease_s, replicas=self.replicas))
        try:
            self._objects = await self._js.object_store(n.snapshot_bucket)
        except (NotFoundError, APIError, nats.js.errors.BucketNotFoundError):
            self._objects = await self._js.create_object_store(
                n.snapshot_bucket, config=api.ObjectStoreConfig(
                    replicas=self.replicas, storage=api.StorageType.FILE))
        try:
            self._node_kv = await self._js.key_value(n.node_bucket)
        except (NotFoundError, APIError):
            self._node_kv = await self._js.create_key_value(api.KeyValueConfig(
                bucket=n.node_bucket, history=1, ttl=self._node_ttl_s,
                replicas=self.replicas))

    def close(self) -> None:
        self.drop_publisher()
        if self._nc is not None:
            try:
                self._run(self._close(), 5)
            except Exception:  # closing: nothing to tell
                log.debug("closing the NATS connection", exc_info=True)
        try:
            self._run(self._cancel_the_rest(), 5)
        except Exception:
            log.debug("cancelling the link's tasks", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()

    async def _close(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:
                pass
        await self._nc.close()

    async def _cancel_the_rest(self) -> None:
        """Cancel what a cancelled call left behind (a KV watcher's message task, say), so the
        loop closes with no task pending."""
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    # --- the write-ahead stream ---------------------------------------------------------------
    def publish(self, record: bytes, expected_last_seq: int) -> int:
        """Append ``record`` if the stream ends at ``expected_last_seq``; its sequence.
        NotLeader when JetStream refuses it (someone else appended: fenced). On the
        ``DirectPublisher`` when there is one (scheduler/cluster/publisher.py), else on
        nats-py's connection."""
        publisher = self._publisher
        if publisher is not None:
            if publisher.server_name is None:  # not connected: to the stream's leader first
                with contextlib.suppress(Unavailable):  # (none now: the first that answers)
                    self.place_publisher()
            try:
                return publisher.publish(record, expected_last_seq)
            except DirectPublisherUnsupported as exc:  # (raised before anything was sent)
                log.warning("publishing through nats-py from now on: %s", exc)
                self._publisher = None
        return self._run(self._publish(record, expected_last_seq))

    def place_publisher(self) -> str | None:
        """Connect the publisher to the NATS server leading the stream's RAFT group, unless
        it is on it already: from another server every publish and its ack cross a route
        (two more processes to be scheduled on a delivery's way); and answer the server's
        PINGs of an idle connection. That server's name, or None (no leader now, no direct
        publisher: nothing changed)."""
        publisher = self._publisher
        if publisher is None:
            return None
        publisher.keepalive()
        leader = self.stream_leader()
        if leader is None or publisher.server_name == leader:
            return leader
        try:
            got = publisher.connect(leader)
        except DirectPublisherUnsupported as exc:
            log.warning("publishing through nats-py from now on: %s", exc)
            self._publisher = None
            return None
        log.debug("the publisher is on %s (the stream's leader: %s)", got, leader)
        return got

    def drop_publisher(self) -> None:
        """Close the publisher's connection (a follower publishes nothing)."""
        if self._publisher is not None:
            self._publisher.close()

    async def _publish(self, record: bytes, expected_last_seq: int) -> int:
        try:
            ack = await self._js.publish(
                self.names.wal_subject, record, stream=self.names.wal,
                headers={EXPECTED_LAST_SEQ: str(expected_last_seq)})
        except BadRequestError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                raise NotLeader(f"the write-ahead stream refused the append: {exc}") from exc
            raise
        return int(ack.seq)

    def stream_leader(self) -> str | None:
        """The name of the NATS server leading the stream's RAFT group (None: none now)."""
        return self._run(self._stream_leader())

    async def _stream_leader(self) -> str | None:
        info = await self._js.stream_info(self.names.wal)
        return None if info.cluster is None else info.cluster.leader

    def message(self, seq: int) -> bytes | None:
        """The stream's message ``seq`` (None: there is none)."""
        return self._run(self._message(seq))

    async def _message(self, seq: int) -> bytes | None:
        try:
            msg = await self._js.get_msg(self.names.wal, seq)
        except NotFoundError:
            return None
        return None if msg.data is None else bytes(msg.data)

    def last_seq(self) -> int:
        """The stream's last sequence (0: empty)."""
        return self._run(self._last_seq())

    async def _last_seq(self) -> int:
        info = await self._js.stream_info(self.names.wal)
        return int(info.state.last_seq)

    def first_seq(self) -> int:
        return self._run(self._first_seq())

    async def _first_seq(self) -> int:
        info = await self._js.stream_info(self.names.wal)
        return int(info.state.first_seq)

    def fetch(self, from_seq: int, max_records: int = 256,
              wait_s: float = 0.25) -> list[tuple[int, bytes, int]]:
        """(sequence, message, when the stream stored it in epoch ms) from ``from_seq`` on,
        in order (at most ``max_records``; [] when none came within ``wait_s``). A pull
        consumer is kept across calls while they go on in order."""
        return self._run(self._fetch(from_seq, max_records, wait_s), wait_s + self.timeout_s + 0.5)

    async def _fetch(self, from_seq: int, max_records: int,
                     wait_s: float) -> list[tuple[int, bytes, int]]:
        if self._sub is None or self._sub_next != from_seq:
            await self._drop_sub()
            self._sub = await asyncio.wait_for(self._subscribe(from_seq), self.timeout_s)
            self._sub_next = from_seq
            self._sub_made = self._loop.time()
        try:
            msgs = await self._sub.fetch(max_records, timeout=wait_s)
        except nats.errors.TimeoutError:
            return []
        except nats.js.errors.ServiceUnavailableError:
            # no responders: a consumer just made on another server whose interest has not
            # reached this one yet (kept a while), or one that is gone (made again)
            if self._loop.time() - self._sub_made < FRESH_CONSUMER_S:
                await asyncio.sleep(min(wait_s, 0.05))
                return []
            self._sub = None
            raise
        except BaseException:  # (a cancelled call too): a new consumer next time
            self._sub = None
            raise
        out: list[tuple[int, bytes, int]] = []
        for msg in msgs:
            meta = msg.metadata
            seq = int(meta.sequence.stream)
            if seq != self._sub_next:  # a gap or a repeat: start again from where we are
                await self._drop_sub()
                break
            out.append((seq, bytes(msg.data), int(meta.timestamp.timestamp() * 1000)))
            self._sub_next = seq + 1
        return out

    async def _subscribe(self, from_seq: int) -> Any:
        """A pull consumer of the stream from ``from_seq`` (no acks, in memory, one replica),
        hosted by the NATS server this connection reaches if it can be: JetStream puts a
        one-replica consumer on one of the stream's servers at random, and from another one
        every message it delivers crosses a route first (one more copy of each record for
        two servers). So a consumer placed elsewhere is deleted and made again, at most
        ``LOCAL_CONSUMER_TRIES`` times within ``LOCAL_CONSUMER_S`` (then the last one made
        is kept: a remote consumer costs CPU, not correctness)."""
        # nats-py keeps the server's INFO only in a private attribute: without it (another
        # nats-py), the first consumer made is kept, wherever it is
        here = (getattr(self._nc, "_server_info", None) or {}).get("server_name")
        n = self.names
        tries = max(1, self.local_consumer_tries)
        deadline = self._loop.time() + LOCAL_CONSUMER_S
        for attempt in range(1, tries + 1):
            name = uuid.uuid4().hex
            info = await self._js.add_consumer(n.wal, config=api.ConsumerConfig(
                name=name, filter_subject=n.wal_subject,
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=from_seq,
                ack_policy=api.AckPolicy.NONE, inactive_threshold=30.0,
                max_ack_pending=-1, mem_storage=True, num_replicas=1))
            there = None if info.cluster is None else info.cluster.leader
            if (attempt == tries or here is None or there is None or there == here
                    or self._loop.time() > deadline):
                break
            with contextlib.suppress(Exception):  # (unused, it goes after 30 s anyway)
                await self._js.delete_consumer(n.wal, name)
        self.consumer_placement = (there, here, attempt)  # (its server, ours, consumers made)
        log.debug("stream consumer on %s (connected to %s) after %d tries", there, here, attempt)
        return await self._js.pull_subscribe_bind(consumer=name, stream=n.wal)

    async def _drop_sub(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception:
                pass

    def trim(self, below_seq: int) -> None:
        """Drop the stream's messages below ``below_seq`` (a snapshot holds what they did)."""
        self._run(self._js.purge_stream(self.names.wal, seq=below_seq))

    # --- snapshots ----------------------------------------------------------------------------
    def put_snapshot(self, archive: Path, seq: int, timeout_s: float = 300.0) -> None:
        """Keep ``archive`` (a node's data at sequence ``seq``) as the cluster's snapshot."""
        self._run(self._put_snapshot(archive, seq), timeout_s)

    async def _put_snapshot(self, archive: Path, seq: int) -> None:
        with archive.open("rb") as f:
            await self._objects.put(self.names.snapshot_key, f, meta=api.ObjectMeta(
                name=self.names.snapshot_key, description=str(seq)))

    def snapshot_seq(self) -> int | None:
        """The sequence of the cluster's snapshot (None: there is none)."""
        return self._run(self._snapshot_seq())

    async def _snapshot_seq(self) -> int | None:
        info = await self._snapshot_info()
        return None if info is None else int(info.description)

    async def _snapshot_info(self) -> Any:
        try:
            info = await self._objects.get_info(self.names.snapshot_key)
        except (NotFoundError, nats.js.errors.ObjectNotFoundError):
            return None
        if info is None or getattr(info, "deleted", False):
            return None
        return info

    def get_snapshot(self, dest: Path, timeout_s: float = 300.0) -> int | None:
        """Write the cluster's snapshot to ``dest``; its sequence (None: there is none).

        The leader replaces the snapshot while others may read it, and JetStream's object
        store then purges the old one's chunks: a reader that looked the object up just
        before waits for chunks that will never come (nats-py's own ``get`` waits forever).
        So a download that receives no chunk for ``snapshot_stall_s`` (or whose digest does
        not match) starts again from the object's current description, until ``timeout_s``."""
        return self._run(self._get_snapshot(dest, timeout_s), timeout_s + 5)

    async def _get_snapshot(self, dest: Path, timeout_s: float) -> int | None:
        deadline = self._loop.time() + timeout_s
        while True:
            info = await self._snapshot_info()
            if info is None:
                return None
            try:
                await self._download(info, dest)
                return int(info.description)
            except SnapshotMoved as exc:
                if self._loop.time() > deadline:
                    raise Unavailable(f"the cluster's snapshot could not be read: {exc}") from exc
                log.info("the snapshot at sequence %s moved while read (%s); reading it again",
                         info.description, exc)

    async def _download(self, info: Any, dest: Path) -> None:
        """The chunks of the object ``info`` into ``dest`` (a stalled or mismatched read
        raises SnapshotMoved; the subscription goes in any case)."""
        subject = f"$O.{self.names.snapshot_bucket}.C.{info.nuid}"
        digest = hashlib.sha256()
        size = 0
        sub = await self._js.subscribe(subject, ordered_consumer=True)
        try:
            with dest.open("wb") as f:
                for _ in range(int(info.chunks or 0)):
                    try:
                        msg = await sub.next_msg(timeout=self.snapshot_stall_s)
                    except nats.errors.TimeoutError:
                        raise SnapshotMoved(f"no chunk in {self.snapshot_stall_s} s after "
                                            f"{size} of {info.size} bytes") from None
                    f.write(msg.data)
                    digest.update(msg.data)
                    size += len(msg.data)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        wanted = str(info.digest or "").split("=", 1)[-1]  # "SHA-256=<base64url>"
        if size != info.size or base64.urlsafe_b64decode(wanted + "==") != digest.digest():
            raise SnapshotMoved(f"{size} bytes read of {info.size}, or not the digest stored")

    # --- the lease ----------------------------------------------------------------------------
    def lease_holder(self) -> tuple[bytes, int] | None:
        """(value, revision) of the lease, or None while nobody holds it."""
        return self._run(self._lease_holder())

    async def _lease_holder(self) -> tuple[bytes, int] | None:
        try:
            entry = await self._lease_kv.get(self.names.lease_key)
        except KeyNotFoundError:
            return None
        if entry.value is None or entry.operation in ("DEL", "PURGE"):
            return None
        return bytes(entry.value), int(entry.revision)

    def lease_acquire(self, value: bytes) -> int | None:
        """Take the lease if nobody holds it: its revision, or None."""
        return self._run(self._lease_acquire(value))

    async def _lease_acquire(self, value: bytes) -> int | None:
        try:
            return int(await self._lease_kv.create(self.names.lease_key, value))
        except (BadRequestError, APIError):
            return None

    def lease_renew(self, value: bytes, revision: int) -> int | None:
        """Renew the lease held at ``revision``: the new revision, or None (lost)."""
        return self._run(self._lease_renew(value, revision))

    async def _lease_renew(self, value: bytes, revision: int) -> int | None:
        try:
            return int(await self._lease_kv.update(self.names.lease_key, value, last=revision))
        except (BadRequestError, APIError):
            return None

    def lease_release(self, revision: int) -> None:
        self._run(self._lease_release(revision))

    async def _lease_release(self, revision: int) -> None:
        try:
            await self._lease_kv.delete(self.names.lease_key, last=revision)
        except (BadRequestError, APIError):
            pass

    # --- the nodes ----------------------------------------------------------------------------
    def put_node(self, node_id: str, value: bytes) -> None:
        self._run(self._node_kv.put(node_id, value))

    def nodes(self) -> dict[str, bytes]:
        """Every node's last status in the node bucket. When the listing fails (a NATS
        election, a busy server: it takes a watcher and a read per key), the last listing
        that succeeded, as long as the bucket would still hold it."""
        try:
            found = self._run(self._nodes())
        except Exception:  # any failure: the last good listing
            found = {}
        now = self._monotonic()
        if found:
            self._nodes_seen = (now, found)
            return dict(found)
        if self._nodes_seen is None or now - self._nodes_seen[0] >= self._node_ttl_s:
            return {}
        return dict(self._nodes_seen[1])

    async def _nodes(self) -> dict[str, bytes]:
        try:
            keys = await self._node_kv.keys()
        except nats.js.errors.NoKeysError:
            return {}
        out: dict[str, bytes] = {}
        for key in keys:
            try:
                entry = await self._node_kv.get(key)
            except KeyNotFoundError:
                continue
            if entry.value:
                out[key] = bytes(entry.value)
        return out
