"""Early deletion on a real small disk: the real server (a subprocess) on a 48 MiB tmpfs; a
ballast file pushes the file system past ``disk_clean_ratio``, and the oldest CommitLog
segments go, oldest first, though none is old enough for the retention: logged, counted in
/metrics, readers below the new first offset told 410, everything after it still there."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from bench.support.server_process import ServerProcess
from tests.disk import fill_disk
from tests.faults.conftest import TOKEN

TOPIC = "disk.early"
MIB = 1 << 20


def _used(path: Path) -> float:
    st = os.statvfs(path)
    return 1 - st.f_bavail / st.f_blocks


def _segments(data: Path) -> list[int]:
    return sorted(int(p.name) for p in (data / "commitlog").iterdir() if p.name.isdigit())


def test_past_the_ratio_the_oldest_segments_go_early(small_fs: Path, tmp_path: Path) -> None:
    data = small_fs / "data"
    proc = ServerProcess(data, token=TOKEN, log_path=tmp_path / "server.log", settings={
        "segment_size": "2MiB", "max_body_bytes": "1MiB", "flush_interval_ms": "50ms",
        "disk_reserve_bytes": "0", "disk_clean_ratio": "0.7",
        "cleanup_interval_ms": "300ms", "log_level": "info"})
    proc.start(ready="/readyz")
    try:
        with proc.client() as c:
            for k in range(10):  # ~10 MiB: five segments and more
                body = {"messages": [{"body": "x" * 1000, "msgId": f"m{k}-{i}"}
                                     for i in range(1000)]}
                assert c.post(f"/v1/topics/{TOPIC}/messages:batch", json=body).status_code == 201
            before = _segments(data)
            assert len(before) >= 5
            assert _used(small_fs) < 0.7
            assert c.get(f"/v1/topics/{TOPIC}").json()["firstOffset"] == 0
            # the disk passes the ratio: 4 MiB of ballast short of 80 %
            used_before = _used(small_fs)
            ballast = fill_disk(small_fs, leave_bytes=int(0.2 * 48 * MIB))
            st = os.statvfs(small_fs)  # (the server may already have cleaned up: count the ballast)
            assert used_before + ballast.stat().st_size / (st.f_blocks * st.f_frsize) > 0.75
            deadline = time.monotonic() + 20
            while _used(small_fs) > 0.7 and time.monotonic() < deadline:
                time.sleep(0.1)
            after = _segments(data)
            assert _used(small_fs) <= 0.7, (before, after)
            # oldest first: what is left is the newest part of the log, without a gap
            assert after[0] > before[0] and after[-1] >= before[-1]
            assert [b for b in before if b >= after[0]] == after[:len(
                [b for b in before if b >= after[0]])]
            first = c.get(f"/v1/topics/{TOPIC}").json()["firstOffset"]
            assert 0 < first < 10_000
            r = c.get(f"/v1/topics/{TOPIC}/messages", params={"offset": 0})
            assert r.status_code == 410 and r.json()["firstOffset"] == first
            offset, seen = first, []
            while True:
                page = c.get(f"/v1/topics/{TOPIC}/messages",
                             params={"offset": offset, "max": 1000}).json()
                if not page["messages"]:
                    break
                seen += [m["offset"] for m in page["messages"]]
                offset = page["nextOffset"]
            assert seen == list(range(first, 10_000))
            metrics = c.get("/metrics").text
            early = re.search(r"^hourglass_commitlog_early_deletions_total (\S+)$", metrics,
                              re.MULTILINE)
            assert early is not None and float(early.group(1)) >= 1
            assert 'hourglass_commitlog_segments_deleted_total{reason="disk"}' in metrics
            # writes go on
            ballast.unlink()
            assert c.post(f"/v1/topics/{TOPIC}/messages", json={"body": "after"}).status_code \
                == 201
    finally:
        proc.kill()
    log = (tmp_path / "server.log").read_text()
    assert "disk above disk_clean_ratio 0.70: deleted" in log, log[-3000:]
