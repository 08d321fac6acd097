"""Long polling: a pull with waitMs returns as soon as a message is delivered (woken by the
engine's delivery listener, driven here by the FakeClock and broker.drain), not at its timeout."""

from __future__ import annotations

import threading
import time
from typing import Any

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


# --- members of a consumer group: the longest waiter is woken, and hands on a full batch -----

GROUP = f"/v1/topics/{TOPIC}/groups/workers"


def start_receive(live: Live, **body: object) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        with live.client() as c:
            started = time.monotonic()
            # leases outlast the test's clock jumps: nothing comes back to be received twice
            out["response"] = c.post(f"{GROUP}:receive", json={"leaseMs": 3_600_000, **body})
            out["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def later(live: Live, *bodies: str, delay_ms: int = 60_000) -> None:
    """Messages due together in ``delay_ms`` (one delivery commit when the clock gets there)."""
    with live.client() as c:
        r = c.post(f"/v1/topics/{TOPIC}/messages:batch", json={"messages": [
            {"body": b, "delayMs": delay_ms} for b in bodies]})
        assert r.status_code == 201, r.text


def bodies(out: dict) -> list[str]:
    return [m["body"] for m in out["response"].json()["messages"]]


def test_a_delivery_wakes_one_member_of_a_group(live: Live, monkeypatch: Any) -> None:
    groups = live.broker.groups
    receives = []
    plain = groups.receive
    monkeypatch.setattr(groups, "receive", lambda *a: receives.append(a) or plain(*a))
    later(live, "one")
    later(live, "two", delay_ms=120_000)
    first, first_out = start_receive(live, waitMs=30_000)
    wait_for_waiters(live, 2)  # the member waits on the topic and on its retry topic
    second, second_out = start_receive(live, waitMs=30_000)
    wait_for_waiters(live, 4)
    live.advance(60_000)
    first.join(timeout=20)
    assert not first.is_alive() and bodies(first_out) == ["one"]
    # the other member was left asleep (woken, it would have found nothing and waited again)
    assert second.is_alive() and live.app.state.ctx.notifier.waiting == 2
    live.advance(60_000)  # the next delivery is its turn
    second.join(timeout=20)
    assert not second.is_alive() and bodies(second_out) == ["two"]
    assert second_out["seconds"] < 15
    # each member: one receive before it waits, one when woken; none that found nothing
    assert len(receives) == 4


def test_a_member_that_takes_a_full_batch_wakes_the_next(live: Live) -> None:
    later(live, "a", "b", "c")
    members = []
    for waiting in (2, 4):
        members.append(start_receive(live, max=2, waitMs=30_000))
        wait_for_waiters(live, waiting)
    live.advance(60_000)  # one commit of three: the first member takes two, the next one
    for thread, _ in members:
        thread.join(timeout=20)
        assert not thread.is_alive()
    got = [bodies(out) for _, out in members]
    assert sorted(b for batch in got for b in batch) == ["a", "b", "c"]
    assert sorted(map(len, got)) == [1, 2]
    assert all(out["seconds"] < 15 for _, out in members)  # not by their timeouts


def test_a_delivery_wakes_every_pull_and_a_member(live: Live) -> None:
    later(live, "x")
    pulls = [start_pull(live, waitMs=30_000) for _ in range(2)]
    wait_for_waiters(live, 2)
    member, member_out = start_receive(live, waitMs=30_000)
    wait_for_waiters(live, 4)
    live.advance(60_000)
    for thread, out in [*pulls, (member, member_out)]:
        thread.join(timeout=20)
        assert not thread.is_alive()
        assert [m["body"] for m in out["response"].json()["messages"]] == ["x"]
