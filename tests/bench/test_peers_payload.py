"""The side-by-side's body size (``--payload``) and its disk figure once compacted."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pytest

from bench.peers.common import Batch, random_bodies
from bench.peers.run import parse_args
from bench.peers.systems.base import System
from bench.peers.systems.hourglass import HourglassSystem
from bench.peers.workloads import Params, RssPeak, w1_ingest
from storage.rocks import RocksStore


class Recorder(System):
    """A system that stores nothing: it records the bodies it is sent."""

    name = "recorder"

    def __init__(self, compacted: int | None) -> None:
        super().__init__({})
        self.bodies: list[str] = []
        self.lock = threading.Lock()
        self.compacted = compacted
        self.disk = 1000

    def start(self, workdir: Path) -> None:
        pass

    def stop(self) -> None:
        pass

    def send(self, batch: Batch) -> None:
        with self.lock:
            self.bodies.extend(batch.bodies)
            self.disk += sum(len(b) for b in batch.bodies) * 2

    def pending_count(self) -> int | None:
        return len(self.bodies)

    def footprint(self) -> dict[str, int | None]:
        return {"memory": None, "disk": self.disk}

    def compacted_disk(self) -> int | None:
        return self.compacted


def test_random_bodies_have_the_size_asked_for() -> None:
    for size in (1, 3, 4, 100, 16384):
        bodies = random_bodies(5, size)
        assert [len(b) for b in bodies] == [size] * 5
        if size >= 16:  # (1-byte bodies repeat by chance: 64 symbols)
            assert len(set(bodies)) == 5  # random, not one body repeated
    assert [len(b) for b in random_bodies(3)] == [100] * 3  # the default stays 100 bytes


def test_payload_option_reaches_every_body_sent() -> None:
    args = parse_args(["--payload", "777", "--systems", "redis"])
    assert args.payload == 777
    with pytest.raises(SystemExit):
        parse_args(["--payload", "0"])
    system = Recorder(compacted=None)
    res = w1_ingest(system, Params(n=2500, batch=1000, producers=2, payload=777), {})
    assert len(system.bodies) == 2500
    assert {len(b) for b in system.bodies} == {777}
    assert res["payload"] == 777
    assert res["disk_compacted"] is None and "disk_compacted" not in res["per_million_pending"]
    assert res["per_million_pending"]["disk"] == pytest.approx(777 * 2 * 1e6)


def test_w1_reports_the_compacted_disk_beside_the_disk_after_ingest() -> None:
    system = Recorder(compacted=1000 + 500_000)
    res = w1_ingest(system, Params(n=1000, batch=500, producers=1, payload=100), {})
    per_million = res["per_million_pending"]
    assert per_million["disk"] == pytest.approx(200 * 1e6)  # 2 bytes a body byte, as sent
    assert per_million["disk_compacted"] == pytest.approx(500 * 1e6)


def test_hourglass_compacted_disk_stops_the_server_and_keeps_every_message(
        tmp_path: Path) -> None:
    system = HourglassSystem({})
    system.start(tmp_path)
    try:
        res = w1_ingest(system, Params(n=3000, batch=1000, producers=2, payload=4096), {})
        assert system.proc is None  # stopped, to compact its RocksDB
    finally:
        system.stop()
    assert res["correctness"]["pending"] == 3000
    compacted = res["disk_compacted"]
    assert compacted is not None and compacted > 3000 * 4096 * 0.7  # the bodies are in there
    assert res["per_million_pending"]["disk_compacted"] == pytest.approx(
        (compacted - res["footprint_before"]["disk"]) * 1e6 / 3000)
    store = RocksStore(tmp_path / "hourglass-data" / "rocksdb", timer_shards=None)
    try:
        timers = sum(1 for cf in store.timer_cf_names() for _ in store.scan(cf))
    finally:
        store.close()
    assert timers == 3000  # compaction kept every pending message


class ThisProcess(Recorder):
    def server_processes(self) -> list[psutil.Process]:
        return [psutil.Process()]


def test_rss_peak_sees_memory_taken_and_given_back_between_marks() -> None:
    rss = RssPeak(ThisProcess(compacted=None), interval_s=0.005)
    big = bytearray(64 << 20)  # touched: zero pages of a bytearray are written
    for i in range(0, len(big), 4096):
        big[i] = 1
    rss.mark("held")
    while (rss.peak is None or rss.start_rss is None
           or rss.peak["rss"] < rss.start_rss["rss"] + (60 << 20)):
        time.sleep(0.01)  # the sampler's next round sees it (no bound on when: not timed)
    del big
    res = rss.result()
    start, held, peak = res["start"], res["held"], res["peak"]
    assert start is not None and held is not None and peak is not None
    assert held["rss"] >= start["rss"] + (60 << 20)
    assert peak["rss"] >= held["rss"] - (4 << 20)
    assert held["anon"] >= start["anon"] + (60 << 20)  # a bytearray: anonymous memory
    assert peak["anon"] >= held["anon"] - (4 << 20)
    assert set(peak) == {"rss", "anon", "file"}


def test_rss_peak_is_none_without_server_processes() -> None:
    res = RssPeak(Recorder(compacted=None), interval_s=0.005).result()
    assert res == {"start": None, "peak": None}
