"""A real full disk: the real server (a subprocess) on a 48 MiB tmpfs, filled with a ballast
file until the kernel answers ENOSPC, then given its space back.

Two ways the disk is full for hourglass:
- the CommitLog's next segment cannot be allocated (segments are fallocated whole, so a full
  disk is an error at roll-over, never a SIGBUS in the mapping) while RocksDB still has room;
- RocksDB's WAL append fails (ENOSPC).
Either way: sends answer 503 UNAVAILABLE, nothing acknowledged is lost, nothing refused is
visible, /readyz answers 503 while due messages cannot be delivered, and everything works
again once the space is back, without a restart: RocksDB's sticky ENOSPC is cured by a reopen
in place (storage/write_guard.py). Most tests here set ``disk_reserve_bytes`` to 0, so that
RocksDB really meets ENOSPC; the reserve's own test refuses writes before it does.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from bench.support.crash.verify import read_logs
from bench.support.server_process import ServerProcess
from tests.disk import fill_disk
from tests.faults.conftest import TOKEN

TOPIC = "disk.a"
SETTINGS = {"segment_size": "2MiB", "max_body_bytes": "1MiB", "flush_interval_ms": "50ms",
            "retry_max_backoff_ms": "500ms", "disk_reserve_bytes": "0",
            "disk_retry_interval_ms": "200ms"}
KIB = 1024


@contextlib.contextmanager
def serving(small_fs: Path, tmp_path: Path, **settings: str) -> Iterator[ServerProcess]:
    proc = ServerProcess(small_fs / "data", token=TOKEN, log_path=tmp_path / "server.log",
                         settings={**SETTINGS, **settings})
    proc.start(ready="/readyz")
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def server(small_fs: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    with serving(small_fs, tmp_path) as proc:
        yield proc


def wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/\w")


def ready(client: httpx.Client) -> int:
    return client.get("/readyz").status_code


def unavailable(r: httpx.Response) -> bool:
    """A 503 problem that says when to try again, whose detail names no file (the network
    learns no paths)."""
    ok = (r.status_code == 503
          and r.headers["content-type"].startswith("application/problem+json")
          and r.json()["code"] == "UNAVAILABLE")
    if ok:
        assert r.headers.get("Retry-After") == "1", r.headers
    if ok:
        assert ABSOLUTE_PATH.search(r.json()["detail"]) is None, r.json()["detail"]
    return ok


def send(client: httpx.Client, msg_id: str, body: str = "x", **timing: int) -> httpx.Response:
    return client.post(f"/v1/topics/{TOPIC}/messages",
                       json={"body": body, "msgId": msg_id, **timing})


def schedule(client: httpx.Client, prefix: str, count: int, delay_ms: int,
             body: str = "s") -> list[str]:
    ids = [f"{prefix}{i}" for i in range(count)]
    r = client.post(f"/v1/topics/{TOPIC}/messages:batch",
                    json={"messages": [{"body": body, "msgId": i, "delayMs": delay_ms}
                                       for i in ids]})
    assert r.status_code == 201, r.text
    return ids


def delivered_ids(client: httpx.Client) -> list[str]:
    entries = read_logs(client, [TOPIC])[TOPIC]
    assert all(e["storedAt"] >= e["deliverAt"] for e in entries)
    return [e["msgId"] for e in entries]


def test_commitlog_full_disk_is_503_and_delivery_resumes_with_space(
        server: ServerProcess, small_fs: Path) -> None:
    with server.client() as c:
        ballast = fill_disk(small_fs, leave_bytes=1024 * KIB)  # < a segment, > RocksDB needs
        acked, refused = [], None
        for i in range(200):  # 32 KiB bodies: the 2 MiB segment fills, the next cannot be made
            r = send(c, f"n{i}", body="x" * (32 * KIB))
            if r.status_code != 201:
                assert unavailable(r), r.text
                refused = f"n{i}"
                break
            acked.append(f"n{i}")
        assert refused is not None, "the CommitLog never ran out of space"
        assert c.get(f"/v1/topics/{TOPIC}/messages/{refused}").status_code == 404
        # RocksDB has room: scheduled sends are stored (201); none of them fits in the log
        scheduled = schedule(c, "s", 10, delay_ms=300, body="z" * (40 * KIB))
        assert wait_for(lambda: ready(c) == 503), "delivery was blocked, /readyz said ready"
        assert delivered_ids(c) == acked  # nothing of the due batch half-delivered

        ballast.unlink()  # space returns
        assert wait_for(lambda: ready(c) == 200), server.log_tail()
        assert send(c, refused).status_code == 201  # stored now, and not as a duplicate
        ids = delivered_ids(c)
        assert sorted(ids) == sorted([*acked, *scheduled, refused])
        assert len(ids) == len(set(ids))


def fill_rocksdb(c: httpx.Client, small_fs: Path) -> tuple[list[str], list[str], Path]:
    """Schedule 50 messages due soon, fill the disk to the last byte, send until RocksDB's WAL
    append fails. Returns (due soon, stored later, ballast)."""
    soon = schedule(c, "s", 50, delay_ms=1500)
    ballast = fill_disk(small_fs, leave_bytes=0)
    later = []
    for i in range(2000):
        r = send(c, f"w{i}", body="y" * KIB, delayMs=3_600_000)
        if r.status_code != 201:
            assert unavailable(r), r.text
            break
        later.append(f"w{i}")
    else:
        pytest.fail("RocksDB never ran out of space")
    refused = f"w{len(later)}"
    assert c.get(f"/v1/topics/{TOPIC}/messages/{refused}").status_code == 404
    # due now: appended to the log, then the RocksDB write fails; 503, not visible (yet)
    assert unavailable(send(c, "now-1"))
    assert c.get(f"/v1/topics/{TOPIC}/messages/now-1").status_code == 404
    assert wait_for(lambda: ready(c) == 503), "due messages are stuck, /readyz said ready"
    return soon, later, ballast


def test_rocksdb_full_disk_loses_nothing_acknowledged_across_a_restart(
        server: ServerProcess, small_fs: Path) -> None:
    with server.client() as c:
        soon, later, ballast = fill_rocksdb(c, small_fs)
        ballast.unlink()
    server.kill()  # a restart also cures it (the test below: no restart needed)
    server.start(ready="/readyz")
    with server.client() as c:
        # the refused due-now send was in the log: recovery applies it (unacknowledged: it
        # may appear, at most once; a retry with its msgId answers "duplicate")
        assert wait_for(lambda: set(delivered_ids(c)) - {"now-1"} == set(soon))
        ids = delivered_ids(c)
        assert len(ids) == len(set(ids))
        assert all(c.get(f"/v1/topics/{TOPIC}/messages/{m}").json()["status"] == "SCHEDULED"
                   for m in later)
        assert c.get(f"/v1/topics/{TOPIC}/messages/w{len(later)}").status_code == 404
        assert send(c, "after").status_code == 201
        retry = send(c, "now-1")
        assert retry.status_code == (200 if "now-1" in ids else 201), retry.text


def test_rocksdb_full_disk_resumes_when_space_returns(server: ServerProcess,
                                                       small_fs: Path) -> None:
    with server.client() as c:
        soon, later, ballast = fill_rocksdb(c, small_fs)
        ballast.unlink()  # the next attempt (at most every 200 ms) reopens RocksDB in place
        assert wait_for(lambda: send(c, "after").status_code in (200, 201)), server.log_tail()
        assert wait_for(lambda: ready(c) == 200), server.log_tail()
        # the refused due-now send was in the log: the first commit after the reopen applies
        # it (unacknowledged: it may appear, at most once)
        assert wait_for(lambda: set(delivered_ids(c)) - {"now-1"} == {*soon, "after"})
        ids = delivered_ids(c)
        assert len(ids) == len(set(ids))
        assert all(c.get(f"/v1/topics/{TOPIC}/messages/{m}").json()["status"] == "SCHEDULED"
                   for m in later)  # every write acknowledged before ENOSPC survived
        assert c.get(f"/v1/topics/{TOPIC}/messages/w{len(later)}").status_code == 404
        retry = send(c, "now-1")
        assert retry.status_code == (200 if "now-1" in ids else 201), retry.text
        assert ready(c) == 200
        assert "reopened after the I/O error" in server.log_tail(1000)


def test_below_the_reserve_writes_are_refused_before_rocksdb_fails(
        small_fs: Path, tmp_path: Path) -> None:
    """Nothing due, so only the refused writes can make /readyz say 503."""
    with serving(small_fs, tmp_path, disk_reserve_bytes="8MiB") as server, \
            server.client() as c:
        stored = schedule(c, "r", 20, delay_ms=3_600_000)
        ballast = fill_disk(small_fs, leave_bytes=4096 * KIB)  # room left, below the reserve
        for i in range(1000):  # the free space is read at most every 100 ms
            refused = f"b{i}"
            r = send(c, refused, delayMs=3_600_000)
            if r.status_code != 201:
                break
            stored.append(refused)
        assert unavailable(r) and "below the reserve" in r.json()["detail"], r.text
        assert c.get(f"/v1/topics/{TOPIC}/messages/{refused}").status_code == 404
        assert ready(c) == 503  # writes are refused: not ready, though nothing is due
        ballast.unlink()
        assert wait_for(lambda: ready(c) == 200), server.log_tail()
        assert send(c, refused, delayMs=3_600_000).status_code == 201
        assert all(c.get(f"/v1/topics/{TOPIC}/messages/{m}").json()["status"] == "SCHEDULED"
                   for m in [*stored, refused])
        log = server.log_tail(1000)
        assert "below the reserve" in log
        assert "No space left" not in log and "reopened" not in log  # RocksDB never failed
