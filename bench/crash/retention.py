"""The crash run's retention round: kill -9 of the real server while the log's retention
deletes segments (scheduler/retention.py).

Tiny segments, a 1 s retention and an upkeep round every 100 ms, so deletions run all the
time under a steady send load over many topics (each deletion trims every topic's consume
queue in one RocksDB write, then removes files). After each kill the stopped data directory
must verify (``hourglass verify``: no consume-queue entry points into a missing segment, every
queue runs without a gap from its first offset), and after each restart every topic must read
without a gap from its first offset, which never moves back, and every offset must still hold
the message it held before the kill.

``python -m bench.crash --retention-kills 20``; tests/crash/test_retention_kill.py runs 8.
"""

from __future__ import annotations

import itertools
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from app.verify_cli import verify
from bench.support.server_process import ServerError, ServerProcess
from storage.commitlog import CommitLog
from storage.constants import COMMITLOG_DIR
from storage.errors import HourglassError

TOPICS = tuple(f"ret.{i}" for i in range(20))
SETTINGS = {"segment_size": "64KiB", "max_body_bytes": "16KiB", "flush_interval_ms": "20ms",
            "commitlog_retention_ms": "1s", "cleanup_interval_ms": "100ms",
            "disk_clean_ratio": "1.0"}


@dataclass(kw_only=True)
class RetentionReport:
    seed: int
    kills: int = 0
    deleted_segments: int = 0  # segment files gone by the end (the first base / segment size)
    first_offsets: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        moved = sum(1 for v in self.first_offsets.values() if v > 0)
        return (f"retention round (seed {self.seed}): {self.kills} kill -9 while deleting, "
                f"{self.deleted_segments} segments deleted, {moved}/{len(TOPICS)} topics "
                f"trimmed; VERDICT: " + ("every check held" if self.ok else
                                         "; ".join(self.violations[:10])))


def _read_from_first(client: httpx.Client, topic: str) -> tuple[int, list[tuple[int, str]]]:
    """(first offset, [(offset, msgId)] from it to the end); starts again at the new first
    offset when the retention overtakes the reader (410)."""
    while True:
        first = client.get(f"/v1/topics/{topic}").json()["firstOffset"]
        out: list[tuple[int, str]] = []
        offset = first
        while True:
            r = client.get(f"/v1/topics/{topic}/messages", params={"offset": offset,
                                                                  "max": 1000})
            if r.status_code == 410:
                break
            r.raise_for_status()
            page = r.json()
            if not page["messages"]:
                return first, out
            out += [(m["offset"], m["msgId"]) for m in page["messages"]]
            offset = page["nextOffset"]


def run_retention_kills(workdir: Path, kills: int, seed: int | None = None,
                        progress: Callable[[str], None] = print) -> RetentionReport:
    seed = seed if seed is not None else secrets.randbelow(2**31)
    rng = random.Random(seed)
    report = RetentionReport(seed=seed, first_offsets=dict.fromkeys(TOPICS, 0))
    data = workdir / "data"
    server = ServerProcess(data, token=secrets.token_urlsafe(24),
                           log_path=workdir / "server.log", settings=SETTINGS)
    stop = threading.Event()
    ids = itertools.count()
    seen: dict[tuple[str, int], str] = {}  # (topic, offset) -> msgId, as read before a kill

    def send() -> None:
        local = random.Random(rng.random())
        with server.client() as c:
            while not stop.is_set():
                body = {"messages": [{"body": "x" * 500, "msgId": f"k{next(ids)}"}
                                     for _ in range(40)]}
                try:
                    c.post(f"/v1/topics/{local.choice(TOPICS)}/messages:batch", json=body)
                except httpx.TransportError:
                    return  # killed

    def check_live() -> None:
        with server.client() as c:
            for topic in TOPICS:
                first, entries = _read_from_first(c, topic)
                if first < report.first_offsets[topic]:
                    report.violations.append(f"{topic}: first offset moved back from "
                                             f"{report.first_offsets[topic]} to {first}")
                report.first_offsets[topic] = first
                offsets = [o for o, _ in entries]
                if offsets != list(range(first, first + len(offsets))):
                    report.violations.append(f"{topic}: a gap after the first offset {first}")
                for offset, msg_id in entries:
                    if seen.setdefault((topic, offset), msg_id) != msg_id:
                        report.violations.append(f"{topic}@{offset}: {msg_id}, was "
                                                 f"{seen[(topic, offset)]}")

    try:
        for k in range(kills):
            server.start(ready="/readyz")
            check_live()
            stop.clear()
            sender = threading.Thread(target=send)
            sender.start()
            time.sleep(rng.uniform(1.2, 2.5))  # rounds delete what is older than 1 s
            server.kill()
            report.kills += 1
            stop.set()
            sender.join()
            # what the next start does first: the record a kill tore while it was written
            # (past the flushed position) is dropped; then the store must verify
            try:
                CommitLog(data / COMMITLOG_DIR).close()
            except HourglassError as exc:
                report.violations.append(f"[kill {k + 1}] the log does not open: {exc}")
            checked = verify(data)
            report.violations += [f"[kill {k + 1}] verify: {p}" for p in checked.problems]
            progress(f"kill {k + 1}/{kills}: log from {checked.log_first} to {checked.log_end}, "
                     f"verify {'OK' if not checked.problem_count else checked.problems[:3]}")
        server.start(ready="/readyz")
        check_live()
        report.deleted_segments = _first_base(data) // (64 << 10)
        if report.deleted_segments == 0:
            report.violations.append("no segment was deleted: the round tested nothing")
    except ServerError as exc:
        report.violations.append(f"the server did not come back: {exc}")
    finally:
        stop.set()
        server.kill()
    return report


def _first_base(data: Path) -> int:
    bases = [int(p.name) for p in (data / "commitlog").iterdir() if p.name.isdigit()]
    return min(bases, default=0)


__all__ = ["RetentionReport", "run_retention_kills"]
