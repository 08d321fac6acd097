"""Long polling: a pull with waitMs returns as soon as a message is delivered (woken by the
engine's delivery listener, driven here by the FakeClock and broker.drain), not at its timeout."""

from __future__ import annotations

import threading
import time

import httpx

from tests.support.live import Live

TOPIC = "orders.poll"


def start_pull(live: Live, **params: object) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        with live.client() as c:
            started = time.monotonic()
            out["response"] = c.get(f"/v1/topics/{TOPIC}/messages", params=params)
            out["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def wait_for_waiters(live: Live, count: int) -> None:
    notifier = live.app.state.ctx.notifier
    deadline = time.monotonic() + 10
    while notifier.waiting < count:  # the pull has reached its wait: now make the delivery
        assert time.monotonic() < deadline, "the pull never started waiting"
        time.sleep(0.005)


def test_long_poll_wakes_on_delivery(live: Live) -> None:
    with live.client() as c:
        c.post(f"/v1/topics/{TOPIC}/messages", json={"body": "later", "delayMs": 60_000})
    thread, out = start_pull(live, waitMs=30_000)
    wait_for_waiters(live, 1)
    live.advance(60_000)  # due now: the delivery thread commits it and notifies
    thread.join(timeout=20)
    assert not thread.is_alive()
    response: httpx.Response = out["response"]
    assert [m["body"] for m in response.json()["messages"]] == ["later"]
    assert out["seconds"] < 15  # far from the 30 s timeout


def test_long_poll_ignores_other_topics_and_times_out_empty(live: Live) -> None:
    thread, out = start_pull(live, waitMs=300)
    wait_for_waiters(live, 1)
    with live.client() as c:
        c.post("/v1/topics/orders.other/messages", json={"body": "elsewhere"})
    live.broker.drain()
    thread.join(timeout=20)
    assert out["response"].json() == {"messages": [], "nextOffset": 0}
    assert out["seconds"] >= 0.3
    assert live.app.state.ctx.notifier.waiting == 0  # nothing left registered


def test_long_poll_from_a_later_offset_keeps_waiting(live: Live) -> None:
    with live.client() as c:
        c.post(f"/v1/topics/{TOPIC}/messages", json={"body": "first"})
        live.broker.drain()
        c.post(f"/v1/topics/{TOPIC}/messages", json={"body": "second", "delayMs": 1_000})
    thread, out = start_pull(live, offset=1, waitMs=30_000)
    wait_for_waiters(live, 1)
    live.advance(1_000)
    thread.join(timeout=20)
    assert [m["body"] for m in out["response"].json()["messages"]] == ["second"]


def test_shutdown_releases_waiting_pulls(live: Live) -> None:
    thread, out = start_pull(live, waitMs=30_000)
    wait_for_waiters(live, 1)
    live.app.state.ctx.notifier.close()
    thread.join(timeout=20)
    assert out["response"].status_code == 200
    assert out["seconds"] < 15
