"""``GET /v1/topics/{topic}/messages:stream`` over real HTTP: a frame at once, then a frame
per delivery, each what a pull from its offset answers (NDJSON or msgpack, ``Prefer:
body=once``); from an offset or the group's committed one; ended by ``durationMs``, by the
client leaving (its long-poll slot given back), by the client taking no bytes for
``stream_stall_ms`` and by server shutdown; at most ``max_long_polls_per_token`` streams and
waiting pulls of one token; bad input refused before the 200, as a pull refuses it."""

from __future__ import annotations

import base64
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import msgpack
import orjson
import pytest

from app.settings import load_settings
from app.wiring import build_app
from scheduler.clock import FakeClock
from storage.errors import InvalidArgument
from tests.support.live import ADMIN, CONSUMER, T0, Live, make_settings, serve

TOPIC = "orders.stream"
STREAM = f"/v1/topics/{TOPIC}/messages:stream"
PULL = f"/v1/topics/{TOPIC}/messages"


def send(c: httpx.Client, ids: range, delay_ms: int = 0) -> None:
    r = c.post(f"/v1/topics/{TOPIC}/messages:batch", json={"messages": [
        {"msgId": f"m{i}", "body": f"body {i}", "delayMs": delay_ms} for i in ids]})
    assert r.status_code == 201, r.text


class Frames:
    """The frames of a streamed response, read as they come (in JSON or msgpack)."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.msgpack = response.headers["content-type"] == "application/x-msgpack"
        self._chunks = response.iter_bytes()
        self._unpacker = msgpack.Unpacker()
        self._rest = b""
        self._ready: list[dict[str, Any]] = []

    def next(self) -> dict[str, Any]:
        while not self._ready:
            chunk = next(self._chunks)  # StopIteration: the stream ended
            if self.msgpack:
                self._unpacker.feed(chunk)
                self._ready.extend(self._unpacker)
            else:
                lines = (self._rest + chunk).split(b"\n")
                self._rest = lines.pop()
                self._ready.extend(orjson.loads(line) for line in lines)
        return self._ready.pop(0)

    def rest(self) -> list[dict[str, Any]]:
        """Every frame until the stream ends."""
        out = []
        while True:
            try:
                out.append(self.next())
            except StopIteration:
                assert not self._rest and not self._ready
                return out


def pulled(c: httpx.Client, offset: int, headers: dict[str, str],
           max_messages: int = 1000) -> dict[str, Any]:
    r = c.get(PULL, params={"offset": offset, "max": max_messages}, headers=headers)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = (msgpack.unpackb(r.content) if r.headers["content-type"]
                           == "application/x-msgpack" else r.json())
    return doc


@pytest.mark.parametrize(("accept", "prefer"), [
    ("application/json", None), ("application/x-msgpack", None),
    ("application/x-msgpack", "body=once")])
def test_a_frame_at_once_then_one_per_delivery(live: Live, accept: str,
                                               prefer: str | None) -> None:
    headers = {"Accept": accept, **({"Prefer": prefer} if prefer else {})}
    with live.client(CONSUMER) as consumer, live.client(ADMIN) as c:
        send(c, range(3))  # due now: in the log already
        with consumer.stream("GET", STREAM, params={"durationMs": 30_000},
                             headers=headers) as r:
            assert r.status_code == 200
            assert r.headers["content-type"] == (
                "application/x-msgpack" if "msgpack" in accept else "application/x-ndjson")
            assert r.headers.get("preference-applied") == prefer
            frames = Frames(r)
            first = frames.next()
            assert first == pulled(c, 0, headers)  # what a pull answers
            assert [m["msgId"] for m in first["messages"]] == ["m0", "m1", "m2"]
            assert first["nextOffset"] == 3
            send(c, range(3, 5), delay_ms=1000)
            send(c, range(5, 8), delay_ms=2000)
            live.advance(1000)
            second = frames.next()
            assert [m["msgId"] for m in second["messages"]] == ["m3", "m4"]
            assert second == pulled(c, 3, headers)
            live.advance(1000)
            third = frames.next()
            assert [m["msgId"] for m in third["messages"]] == ["m5", "m6", "m7"]
            assert third["nextOffset"] == 8
            for m in third["messages"]:  # the bodies as a pull carries them
                if prefer == "body=once":
                    assert "bodyBase64" not in m and m["body"].startswith("body ")
                else:
                    assert m["body"].startswith("body ") and m["bodyBase64"]


def test_from_an_offset_or_the_groups_committed_one_and_max_per_frame(live: Live) -> None:
    with live.client(ADMIN) as c:
        send(c, range(10))
        assert c.put(f"/v1/topics/{TOPIC}/groups/g/offset", json={"offset": 6}).status_code \
            == 200
        with c.stream("GET", STREAM, params={"group": "g", "durationMs": 300}) as r:
            frames = Frames(r).rest()
        assert [m["msgId"] for f in frames for m in f["messages"]] == ["m6", "m7", "m8", "m9"]
        with c.stream("GET", STREAM, params={"offset": 2, "max": 3, "durationMs": 300}) as r:
            frames = Frames(r).rest()
        assert [len(f["messages"]) for f in frames] == [3, 3, 2]  # then nothing new: the end
        assert [f["nextOffset"] for f in frames] == [5, 8, 10]
        # the stream commits nothing: the group is where it was
        assert c.get(f"/v1/topics/{TOPIC}/groups/g/offset").json() == {"offset": 6}


def test_duration_ends_it_and_the_slot_comes_back(live: Live) -> None:
    notifier = live.app.state.ctx.notifier
    with live.client(CONSUMER) as consumer:
        began = time.monotonic()
        with consumer.stream("GET", STREAM, params={"durationMs": 400}) as r:
            frames = Frames(r).rest()
        took = time.monotonic() - began
        assert frames == [{"messages": [], "nextOffset": 0}]  # the first frame only
        assert 0.35 < took < 10
    wait_until_no_polls(notifier)


def wait_until_no_polls(notifier: Any) -> None:
    """The server gives a stream's slot back right after its last write (asynchronously)."""
    deadline = time.monotonic() + 10
    while notifier.polls:
        assert time.monotonic() < deadline, "a stream's slot was never given back"
        time.sleep(0.01)


def test_duration_ends_it_while_messages_keep_coming(live: Live) -> None:
    n = 20_000  # frames of one: writing them all takes far longer than 1 ms (~15 µs each)
    with live.client(ADMIN) as c:
        for first in range(0, n, 1000):
            send(c, range(first, first + 1000))
        with c.stream("GET", STREAM, params={"max": 1, "durationMs": 1}) as r:
            frames = Frames(r).rest()
    assert 1 <= len(frames) < n
    assert [f["nextOffset"] for f in frames] == list(range(1, len(frames) + 1))


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Live]:
    with serve(replace(make_settings(tmp_path / "data"), max_long_polls=1),
               FakeClock(T0)) as live:
        yield live


def test_streams_hold_a_long_poll_slot_until_the_client_leaves(capped: Live) -> None:
    notifier = capped.app.state.ctx.notifier
    first = capped.client(CONSUMER)
    response = first.send(first.build_request("GET", STREAM), stream=True)
    assert response.status_code == 200
    frames = Frames(response)  # (kept: dropping its reader would close the stream)
    frames.next()
    assert notifier.polls == 1
    with capped.client(CONSUMER) as other:
        busy = other.get(STREAM)  # past the cap: 503, as a long poll
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1", busy.text
        assert busy.json()["code"] == "UNAVAILABLE"
        response.close()
        first.close()  # the client leaves: the server notices and gives the slot back
        wait_until_no_polls(notifier)
        with other.stream("GET", STREAM, params={"durationMs": 50}) as r:
            assert r.status_code == 200


def test_server_shutdown_ends_the_stream(tmp_path: Path) -> None:
    frames: list[dict[str, Any]] = []
    ended = threading.Event()
    with serve(make_settings(tmp_path / "data"), FakeClock(T0)) as live:
        started = threading.Event()

        def read() -> None:
            with live.client(CONSUMER) as c, c.stream("GET", STREAM) as r:
                reader = Frames(r)  # durationMs: the default 5 minutes
                frames.append(reader.next())
                started.set()
                frames.extend(reader.rest())
            ended.set()

        threading.Thread(target=read, daemon=True).start()
        assert started.wait(10)
        began = time.monotonic()
    assert ended.wait(10) and time.monotonic() - began < 10
    assert frames == [{"messages": [], "nextOffset": 0}]


@pytest.mark.parametrize(("params", "token", "status"), [
    ({"durationMs": 0}, CONSUMER, 400),
    ({"durationMs": 3_600_001}, CONSUMER, 400),
    ({"offset": -1}, CONSUMER, 400),
    ({"max": 1001}, CONSUMER, 400),
    ({"group": "bad group"}, CONSUMER, 400),
    ({}, None, 401),
])
def test_bad_input_is_refused_before_the_stream_starts(live: Live, params: dict[str, Any],
                                                       token: str | None,
                                                       status: int) -> None:
    with live.client(token) as c:
        r = c.get(STREAM, params=params)
        assert r.status_code == status, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        pull = c.get(PULL, params={k: v for k, v in params.items() if k != "durationMs"})
        if "durationMs" not in params:
            assert pull.status_code == status  # as a pull refuses it
    assert live.app.state.ctx.notifier.polls == 0


def test_a_topic_the_caller_may_not_read_is_refused_as_a_pull_refuses_it(live: Live) -> None:
    with live.client(CONSUMER) as c:  # consumer of orders.* only
        stream = c.get("/v1/topics/payments/messages:stream")
        pull = c.get("/v1/topics/payments/messages")
    assert stream.status_code == pull.status_code and stream.status_code in (403, 404)
    assert stream.json()["code"] == pull.json()["code"]


def test_the_openapi_document_describes_the_frames(live: Live) -> None:
    with live.client(ADMIN) as c:
        doc = c.get("/openapi.json").json()
    op = doc["paths"]["/v1/topics/{topic}/messages:stream"]["get"]
    assert op["operationId"] == "streamMessages"
    content = op["responses"]["200"]["content"]
    assert set(content) == {"application/x-ndjson", "application/x-msgpack"}
    assert content["application/x-ndjson"]["schema"] == {
        "$ref": "#/components/schemas/PullResult"}
    names = {p["name"] for p in op["parameters"]}
    assert {"offset", "group", "max", "durationMs", "Prefer"} <= names


# --- a client that stops reading; one token's share of the slots -------------------------------

def open_raw_stream(live: Live, token: str, rcvbuf: int = 4096,
                    params: str = "durationMs=3600000") -> socket.socket:
    """A stream over a socket with a small receive buffer, its request sent, nothing read."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # (before connect: the window)
    host, port = live.base_url.removeprefix("http://").split(":")
    sock.connect((host, int(port)))
    sock.sendall(f"GET {STREAM}?{params} HTTP/1.1\r\nHost: {host}\r\n"
                 f"Authorization: Bearer {token}\r\n\r\n".encode())
    return sock


def wait_polls(notifier: Any, n: int, within_s: float = 10) -> None:
    deadline = time.monotonic() + within_s
    while notifier.polls != n:
        assert time.monotonic() < deadline, f"{notifier.polls} long polls held, not {n}"
        time.sleep(0.01)


def send_bodies(c: httpx.Client, count: int, size: int, delay_ms: int) -> None:
    body = base64.b64encode(os.urandom(size))[:size].decode()  # (incompressible text)
    r = c.post(f"/v1/topics/{TOPIC}/messages:batch", headers={
        "Content-Type": "application/x-msgpack"}, content=msgpack.packb({"messages": [
            {"body": body, "delayMs": delay_ms} for _ in range(count)]}))
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("pushing", [True, False])
def test_a_stream_whose_client_takes_no_bytes_is_ended_and_its_slot_freed(
        live_factory: Callable[..., Live], pushing: bool) -> None:
    """uvicorn waits for the socket to take a frame without a deadline: a client that never
    reads would hold its slot (and the frame) for the stream's whole hour."""
    live = live_factory(stream_stall_ms=300)
    notifier, pusher = live.app.state.ctx.notifier, live.app.state.ctx.pusher
    pusher.enabled = pushing
    sock = open_raw_stream(live, CONSUMER)
    try:
        wait_polls(notifier, 1)
        with live.client(ADMIN) as c:
            for _ in range(4):  # 16 MiB: more than every buffer on the way holds
                send_bodies(c, 2, 2 << 20, delay_ms=1000)
            began = time.monotonic()
            live.advance(1000)
            wait_polls(notifier, 0, within_s=15)  # ended, the slot back
            # not before the stall time (less 10 ms: libuv's loop time is cached, in ms)
            assert time.monotonic() - began > 0.29
            assert pusher.totals()[3] == 1
            assert "hourglass_streams_stalled_total 1.0" in c.get("/metrics").text
    finally:
        sock.close()


def test_a_slow_reader_that_takes_bytes_is_not_ended(live_factory: Callable[..., Live]) -> None:
    live = live_factory(stream_stall_ms=300)
    notifier, pusher = live.app.state.ctx.notifier, live.app.state.ctx.pusher
    sock = open_raw_stream(live, CONSUMER, params="durationMs=3600000&max=1")
    sock.settimeout(10)
    try:
        wait_polls(notifier, 1)
        with live.client(ADMIN) as c:
            send_bodies(c, 6, 512 << 10, delay_ms=1000)  # 3 MiB
            live.advance(1000)
        got = 0
        while got < 3 << 20:  # ~48 KiB per 50 ms (a stall look is every 75 ms): ~3 s
            time.sleep(0.05)
            for _ in range(12):
                got += len(sock.recv(4096))
        assert notifier.polls == 1 and pusher.totals()[3] == 0  # still streaming
    finally:
        sock.close()
    wait_polls(notifier, 0)


def test_one_token_holds_at_most_max_long_polls_per_token(
        live_factory: Callable[..., Live]) -> None:
    """Streams and waiting pulls and receives of one token share its slots: past them 429,
    while other tokens still get theirs (and the token its own back when one ends)."""
    live = live_factory(max_long_polls_per_token=2)
    notifier = live.app.state.ctx.notifier
    socks = [open_raw_stream(live, CONSUMER) for _ in range(2)]
    try:
        wait_polls(notifier, 2)
        with live.client(CONSUMER) as c:
            refused = [
                c.get(STREAM),
                c.get(PULL, params={"waitMs": 5000}),
                c.post(f"/v1/topics/{TOPIC}/groups/g:receive", json={"waitMs": 5000}),
            ]
            for r in refused:
                assert r.status_code == 429, r.text
                assert r.headers["content-type"].startswith("application/problem+json")
                assert r.json()["code"] == "TOO_MANY_REQUESTS"
                assert r.headers["retry-after"] == "1"
            assert c.get(PULL).status_code == 200  # (a pull that does not wait takes none)
            with live.client(ADMIN) as other, other.stream(
                    "GET", STREAM, params={"durationMs": 50}) as r:
                assert r.status_code == 200  # another token's slots are its own
            socks.pop().close()  # one stream ends: its slot comes back
            wait_polls(notifier, 1)
            assert c.get(PULL, params={"waitMs": 50}).status_code == 200
        assert notifier.polls == 1
    finally:
        for sock in socks:
            sock.close()


def test_the_settings_defaults_environment_and_bad_values() -> None:
    defaults = load_settings()
    assert (defaults.stream_stall_ms, defaults.max_long_polls_per_token) == (30_000, 64)
    s = load_settings(env={"HOURGLASS_STREAM_STALL_MS": "2s",
                           "HOURGLASS_MAX_LONG_POLLS_PER_TOKEN": "5"})
    assert (s.stream_stall_ms, s.max_long_polls_per_token) == (2000, 5)
    for name in ("HOURGLASS_STREAM_STALL_MS", "HOURGLASS_MAX_LONG_POLLS_PER_TOKEN"):
        with pytest.raises(InvalidArgument, match=name):
            load_settings(env={name: "0"})
    app = build_app(replace(s, tokens=make_settings(Path("unused")).tokens))
    ctx = app.state.ctx
    assert (ctx.limits.stream_stall_ms, ctx.notifier.max_per_owner) == (2000, 5)
