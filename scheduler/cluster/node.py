"""ClusterNode: one hourglass node's part in a cluster (docs/cluster.md).

One thread drives the node on the engine's Clock:

- as a **follower** it reads the write-ahead stream from its applied sequence + 1 and
  applies each record (``Broker.apply``); every third of a lease it looks at the lease: held,
  it notes the leader (where writes are forwarded); free, and this node has applied the
  stream to its end, it takes it (``kv.create``) and becomes leader: ``Broker.become`` opens
  the engine again as leader, whose first write is an empty record published with the
  expected last sequence = what it applied (it fences out the old leader, or is refused);
- as the **leader** it renews the lease every third of a lease (``kv.update`` with the
  revision). A renewal refused (someone else holds it), no renewal for a whole lease (NATS
  unreachable), or a refused publish (``Broker.deposed``) makes it a follower again. The
  sink refuses to publish once the lease this node last renewed may have lapsed, so a paused
  leader (SIGSTOP) that wakes up cannot append even before it notices.

Every node publishes its role, URL, applied sequence and lag in the node bucket about once a
second; ``view`` (``GET /v1/cluster``) reads them.
"""

from __future__ import annotations

import json
import logging
import shutil
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from scheduler.broker import FOLLOWER, LEADER, STARTING, Broker
from scheduler.clock import Clock
from scheduler.cluster.link import NatsLink
from scheduler.metrics import Histogram
from storage.constants import COMMITLOG_DIR, ROCKSDB_DIR
from storage.errors import HourglassError, NotLeader, StorageError, Unavailable

log = logging.getLogger(__name__)

STATUS_INTERVAL_MS = 1000
# a node whose last status is older than this has stopped telling the cluster: the view
# shows it UNREACHABLE, not as the role it last had (a killed leader's entry outlives it by
# up to the node bucket's TTL, >= 10 s)
SILENT_MS = 3 * STATUS_INTERVAL_MS
UNREACHABLE = "unreachable"
APPLY_LAG_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
RETRY_PUBLISH_S = 0.05
#: how often a follower looks at the lease once its holder missed a renewal, or it is free
LEASE_POLL_MS = 100
#: a follower that read what the stream held (fewer records than it asked for) fetches
#: again this long after its last fetch, not at once: each fetch costs nats-py and NATS
#: ~0.5 ms whatever it carries, and at the stream's end under W1 most carried one record
#: (bench/nats_cluster_cost.py --pauses-ms; docs/cluster.md, "Measured"). It bounds how much
#: later than now a follower applies a record, not how late it is when it must lead.
FOLLOW_GATHER_MS = 20
FOLLOW_BATCH = 256  # records a fetch asks for
#: how often a leader looks where the stream's RAFT leader is (NatsLink.place_publisher)
PUBLISHER_CHECK_MS = 2000


def restore_snapshot(link: NatsLink, data_dir: Path, *, wipe: bool = False) -> int | None:
    """Fill ``data_dir``'s RocksDB and CommitLog from the cluster's snapshot; its sequence,
    or None when there is none. ``wipe``: what they held goes first."""
    data_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".cluster-restore-", dir=data_dir))
    try:
        archive = work / "snapshot.tar.gz"
        seq = link.get_snapshot(archive)
        if seq is None:
            return None
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(work / "data", filter="data")
        for name in (ROCKSDB_DIR, COMMITLOG_DIR):
            if wipe:
                shutil.rmtree(data_dir / name, ignore_errors=True)
            (work / "data" / name).rename(data_dir / name)
        log.info("restored %s from the cluster's snapshot at sequence %d", data_dir, seq)
        return seq
    finally:
        shutil.rmtree(work, ignore_errors=True)


class LeaseSink:
    """The write-ahead stream as the leader's replicator sees it: publishes only while the
    lease this node last renewed is still valid by the local clock."""

    def __init__(self, link: NatsLink, clock: Clock) -> None:
        self._link = link
        self._clock = clock
        self.valid_until_ms = 0

    def check_leading(self) -> None:
        if self._clock.now_ms() >= self.valid_until_ms:
            raise NotLeader("this node's lease may have lapsed: it no longer leads")

    def publish(self, record: bytes, expected_last_seq: int) -> int:
        """Publish; while the lease holds, a publish without an answer (a NATS server lost,
        a stream leader being elected) is tried again: the expected last sequence makes
        that safe, and a refusal after an unanswered try is looked into (the message at
        the next sequence is ours: it landed the first time)."""
        unanswered = 0
        while True:
            self.check_leading()
            try:
                return self._link.publish(record, expected_last_seq)
            except NotLeader:
                if unanswered and self._link.message(expected_last_seq + 1) == record:
                    return expected_last_seq + 1
                raise
            except Unavailable as exc:
                unanswered += 1
                log.log(logging.WARNING if unanswered == 1 else logging.DEBUG,
                        "publishing record %d: %s; trying again", expected_last_seq + 1,
                        exc.detail or exc)
                time.sleep(RETRY_PUBLISH_S)


class ClusterNode:
    def __init__(self, link: NatsLink, *, node_id: str, url: str, clock: Clock,
                 lease_ms: int = 2000, max_ready_lag_ms: int = 1000,
                 snapshot_records: int = 100_000) -> None:
        self.link = link
        self.node_id = node_id
        self.url = url
        self._clock = clock
        self.lease_ms = lease_ms
        self.max_ready_lag_ms = max_ready_lag_ms
        self.snapshot_records = snapshot_records  # a snapshot every so many records (0: none)
        self._snapshot_seq = 0  # of the last snapshot this node took or restored from
        self.snapshots = self.restores = 0
        self._snapshotting: threading.Thread | None = None
        self._trimmed = 0  # the stream holds nothing at or below it (this node trimmed it)
        self._sink = LeaseSink(link, clock)
        self._broker: Broker | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._revision: int | None = None  # of the lease, while this node holds it
        self._renewed_ms = 0
        self._next_lease_ms = 0
        self._next_status_ms = 0
        self._caught_up_ms = clock.now_ms()  # when this follower last was at the stream's end
        self._next_fetch_ms: int | None = None  # (FOLLOW_GATHER_MS after a partial fetch)
        self._leader: dict[str, str] | None = None
        self._seen_revision: int | None = None  # of the lease at this follower's last look
        self._free_seen_ms: int | None = None  # when this follower saw the lease free
        self._led_since_ms = 0  # when this node last became leader
        self._next_place_ms = 0  # when this leader looks where the stream's leader is next
        self.promotions = 0
        #: from the stream storing a message to this follower applying it (wall clocks: the
        #: NATS server's and this node's)
        self.apply_lag_ms = Histogram(
            "cluster_apply_lag_ms", "From the stream storing a record to its apply here (ms)",
            APPLY_LAG_BUCKETS)

    # --- ClusterControl -------------------------------------------------------------------
    def prepare(self, data_dir: Path) -> None:
        self.link.connect()
        if not (data_dir / ROCKSDB_DIR / "CURRENT").exists():  # a new (or wiped) node
            self._snapshot_seq = restore_snapshot(self.link, data_dir, wipe=True) or 0
            if self._snapshot_seq:
                self.restores += 1

    def start(self, broker: Broker) -> None:
        self._broker = broker
        self._thread = threading.Thread(target=self._run, name="cluster-node", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
        if self._snapshotting is not None:
            self._snapshotting.join(30)
        # no more publishing (the engine closes after this), then hand the lease on at once
        self._give_up_lease()
        self.link.close()

    @property
    def role(self) -> str:
        return STARTING if self._broker is None else self._broker.role

    @property
    def lag_ms(self) -> int:
        if self.role == LEADER:
            return 0
        return max(0, self._clock.now_ms() - self._caught_up_ms)

    @property
    def ready(self) -> bool:
        if self.role == LEADER:
            return True
        return self.role == FOLLOWER and self.lag_ms < self.max_ready_lag_ms

    @property
    def leader_url(self) -> str | None:
        if self.role == LEADER:
            return self.url
        return None if self._leader is None else self._leader.get("url")

    def view(self) -> dict[str, Any]:
        broker = self._broker
        leader = None
        if self.role == LEADER:
            leader = {"nodeId": self.node_id, "url": self.url}
        elif self._leader is not None:
            leader = {"nodeId": self._leader["nodeId"], "url": self._leader["url"]}
        nodes = []
        found = self.link.nodes()  # (NATS unreachable long enough: none, this node's own only)
        found[self.node_id] = json.dumps(self._status()).encode()
        now = self._clock.now_ms()
        for node_id in sorted(found):
            try:
                info = json.loads(found[node_id])
            except ValueError:
                continue
            silent = now - int(info.get("at", now)) > SILENT_MS
            nodes.append({"nodeId": node_id, "url": info.get("url"),
                          "role": UNREACHABLE if silent else info.get("role", STARTING),
                          "appliedSeq": int(info.get("appliedSeq", 0)),
                          "lagMs": int(info.get("lagMs", 0))})
        return {"nodeId": self.node_id, "role": self.role, "leader": leader,
                "appliedSeq": 0 if broker is None else broker.applied_seq, "nodes": nodes}

    # --- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except HourglassError as exc:  # NATS unreachable or without a leader: retried
                log.warning("%s: %s; retrying", self.node_id, exc.detail or exc)
                self._stop.wait(0.1)
            except Exception:
                log.exception("cluster step failed; retrying")
                self._stop.wait(0.2)

    def _step(self) -> None:
        broker = self._broker
        assert broker is not None
        now = self._clock.now_ms()
        if now >= self._next_status_ms:
            self._next_status_ms = now + STATUS_INTERVAL_MS
            try:
                self.link.put_node(self.node_id, json.dumps(self._status()).encode())
                if (broker.role == LEADER and now - self._led_since_ms >= self.lease_ms
                        and (self._snapshotting is None or not self._snapshotting.is_alive())):
                    self._trim()  # (not in its first lease as leader: its writes go first)
            except Exception:
                log.debug("publishing this node's status, trimming", exc_info=True)
        if broker.role == LEADER:
            self._lead(broker, now)
        elif broker.role == FOLLOWER:
            self._follow(broker)
        else:  # a failed become: try as a follower again
            self._stop.wait(0.2)
            self._become(broker, FOLLOWER)

    def _status(self) -> dict[str, Any]:
        broker = self._broker
        return {"url": self.url, "role": self.role,
                "appliedSeq": 0 if broker is None else broker.applied_seq,
                "lagMs": self.lag_ms, "at": self._clock.now_ms()}

    def _follow(self, broker: Broker) -> None:
        if self._next_fetch_ms is not None:
            wait_ms = self._next_fetch_ms - self._clock.now_ms()
            self._next_fetch_ms = None
            if wait_ms > 0:
                self._stop.wait(min(wait_ms, FOLLOW_GATHER_MS) / 1000)
        fetched_ms = self._clock.now_ms()
        records = self.link.fetch(broker.consumed_seq + 1, FOLLOW_BATCH,
                                  wait_s=min(0.1, self.lease_ms / 3000))
        if 0 < len(records) < FOLLOW_BATCH:
            self._next_fetch_ms = fetched_ms + FOLLOW_GATHER_MS
        for seq, data, stored_ms in records:
            try:
                broker.apply(seq, data)
            except StorageError:
                # its log may hold the record, its RocksDB not (or, reopened without a WAL,
                # less than it applied): open it again, cut back to what RocksDB holds
                log.exception("%s: applying record %d failed: opening the engine again",
                              self.node_id, seq)
                self._stop.wait(0.2)
                self._become(broker, FOLLOWER)
                return
            self.apply_lag_ms.observe(max(0, int(time.time() * 1000) - stored_ms))
        now = self._clock.now_ms()
        if len(records) < FOLLOW_BATCH:
            self._caught_up_ms = now
        if now < self._next_lease_ms or self._stop.is_set():
            return
        self._next_lease_ms = now + self.lease_ms // 3
        if not records and broker.consumed_seq + 1 < (first := self.link.first_seq()):
            kept = self.link.snapshot_seq()  # what it misses was trimmed: from a snapshot
            if kept is not None and kept + 1 >= first:
                self._restore(broker)
            else:
                log.error("%s: the stream starts at %d, after what this node applied (%d), "
                          "and no snapshot reaches it (%s)", self.node_id, first,
                          broker.consumed_seq, kept)
            return
        holder = self.link.lease_holder()
        if holder is not None:
            try:
                self._leader = json.loads(holder[0])
            except ValueError:
                self._leader = None
            if holder[1] == self._seen_revision:  # not renewed since the last look: it may
                self._next_lease_ms = now + LEASE_POLL_MS  # lapse soon, look more often
            self._seen_revision = holder[1]
            return
        # the lease is free: looked at again at every step until someone holds it
        self._next_lease_ms = now
        if self._leader is not None or self._free_seen_ms is None:
            self._free_seen_ms = now
            log.info("%s: the lease is free (it was %s's); applied %d", self.node_id,
                     None if self._leader is None else self._leader.get("nodeId"),
                     broker.consumed_seq)
        self._leader = None
        last = self.link.last_seq()
        if broker.consumed_seq != last:
            return  # not at the stream's end yet: the next look, once caught up
        value = json.dumps({"nodeId": self.node_id, "url": self.url}).encode()
        revision = self.link.lease_acquire(value)
        if revision is None:
            return
        started = self._clock.now_ms()
        self._revision, self._renewed_ms = revision, started
        self._sink.valid_until_ms = started + self.lease_ms
        log.info("%s took the lease (revision %d) at applied sequence %d, %d ms after it "
                 "saw it free", self.node_id, revision, broker.applied_seq,
                 started - (self._free_seen_ms or started))
        self._free_seen_ms = self._seen_revision = None
        if self._become(broker, LEADER, last):
            self.promotions += 1
            self._next_lease_ms = self._led_since_ms = self._clock.now_ms()  # renew at once
            self._next_place_ms = 0  # and place the publisher
            log.info("%s leads, %d ms after it took the lease", self.node_id,
                     self._next_lease_ms - started)
        else:
            self._give_up_lease()

    def _lead(self, broker: Broker, now: int) -> None:
        if (self.snapshot_records and broker.deposed is None
                and now - self._led_since_ms >= self.lease_ms  # its first writes go first
                and broker.applied_seq - self._snapshot_seq >= self.snapshot_records
                and (self._snapshotting is None or not self._snapshotting.is_alive())):
            # beside this thread, which must go on renewing the lease meanwhile
            self._snapshotting = threading.Thread(target=self._snapshot_quietly, args=(broker,),
                                                  name="cluster-snapshot", daemon=True)
            self._snapshotting.start()
        if broker.deposed is not None:
            log.warning("%s deposed (%s): following again", self.node_id, broker.deposed)
            self._give_up_lease()
            self._become(broker, FOLLOWER)
            return
        if now >= self._next_lease_ms:
            self._next_lease_ms = now + self.lease_ms // 3
            value = json.dumps({"nodeId": self.node_id, "url": self.url}).encode()
            revision = None
            assert self._revision is not None
            try:
                revision = self.link.lease_renew(value, self._revision)
                lost = revision is None
            except HourglassError:  # NATS did not answer: keep trying while the lease holds
                lost = now - self._renewed_ms >= self.lease_ms
            if revision is not None:
                self._revision, self._renewed_ms = revision, now
                self._sink.valid_until_ms = now + self.lease_ms
            elif lost:
                log.warning("%s lost the lease: following again", self.node_id)
                self._sink.valid_until_ms = 0
                self._revision = None
                self._become(broker, FOLLOWER)
                return
        if now >= self._next_place_ms:
            self._next_place_ms = now + PUBLISHER_CHECK_MS
            try:
                self.link.place_publisher()
            except Exception:  # (NATS busy, electing): the publishes go as they did
                log.debug("placing the publisher", exc_info=True)
        self._stop.wait(0.02)

    def _snapshot_quietly(self, broker: Broker) -> None:
        try:
            self._snapshot(broker)
        except Exception:  # (it lost the lead meanwhile, NATS did not answer): tried again
            log.warning("%s: no snapshot this time", self.node_id, exc_info=True)
            self._snapshot_seq = broker.applied_seq  # not at once again: after as many

    def _snapshot(self, broker: Broker) -> None:
        """Keep a snapshot of this leader's data in the cluster, then trim the stream behind
        what every node still needs (the snapshot, and each live follower's position)."""
        data_dir = broker.config.data_dir
        work = Path(tempfile.mkdtemp(prefix=".cluster-snapshot-", dir=data_dir))
        try:
            seq = broker.cluster_checkpoint(work / "data")
            archive = work / "snapshot.tar.gz"
            with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
                for name in (ROCKSDB_DIR, COMMITLOG_DIR):
                    tar.add(work / "data" / name, arcname=name)
            # a leader paused while it packed must not put an older snapshot over a newer
            # one (the stream may be trimmed past it already): only while it still leads
            if (broker.role != LEADER or broker.deposed is not None
                    or self._clock.now_ms() >= self._sink.valid_until_ms):
                raise NotLeader("no longer the leader: the snapshot is dropped")
            kept = self.link.snapshot_seq()
            if kept is not None and kept >= seq:
                raise NotLeader(f"the cluster keeps a snapshot at {kept} already")
            self.link.put_snapshot(archive, seq)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        self._snapshot_seq = seq
        self.snapshots += 1
        log.info("%s kept a snapshot at sequence %d", self.node_id, seq)
        self._trim()

    def _trim(self) -> None:
        """Drop the stream's records that no node needs: those the last snapshot holds and
        every follower (as the node bucket last heard from it) has applied."""
        needed = self._snapshot_seq
        if needed <= self._trimmed:
            return
        for node_id, raw in self.link.nodes().items():
            try:
                info = json.loads(raw)
            except ValueError:
                continue
            if node_id != self.node_id:  # (an old leader just killed too: it comes back)
                needed = min(needed, int(info.get("appliedSeq", 0)))
        if needed > self._trimmed:
            self.link.trim(needed + 1)
            self._trimmed = needed
            log.info("%s trimmed the stream: it now starts after %d", self.node_id, needed)

    def _restore(self, broker: Broker) -> None:
        log.warning("%s: the stream no longer holds what follows sequence %d: restoring "
                    "from the cluster's snapshot", self.node_id, broker.consumed_seq)

        def replace(data_dir: Path) -> None:
            seq = restore_snapshot(self.link, data_dir, wipe=True)
            if seq is None:
                raise Unavailable("the stream was trimmed and there is no snapshot")
            self._snapshot_seq = seq

        try:
            broker.become(FOLLOWER, replace=replace)
            self.restores += 1
        except Exception:
            log.exception("%s could not restore from the snapshot", self.node_id)

    def _give_up_lease(self) -> None:
        self._sink.valid_until_ms = 0
        revision, self._revision = self._revision, None
        if revision is not None:
            try:
                self.link.lease_release(revision)
            except Exception:
                log.debug("releasing the lease", exc_info=True)

    def _become(self, broker: Broker, role: str, last_seq: int | None = None) -> bool:
        try:
            broker.become(role, self._sink if role == LEADER else None, last_seq)
        except Exception:
            log.exception("%s could not become %s", self.node_id, role)
            return False
        if role == FOLLOWER:
            self._caught_up_ms = self._clock.now_ms() - self.max_ready_lag_ms  # not ready yet
            self.link.drop_publisher()
        log.info("%s is now %s at applied sequence %d", self.node_id, role, broker.applied_seq)
        return True
