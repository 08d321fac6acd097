"""Stream frames written by the committing thread (api/push.py), over real HTTP: the same
frames the event loop writes; a reader too slow for the socket gets every message once and
in order after the pusher hands its stream back; a stream whose client left is no longer
lent; the socket the pusher writes on is its own descriptor."""

from __future__ import annotations

import asyncio
import base64
import errno
import os
import socket
import threading
import time
from typing import Any

import httpx
import msgpack
import pytest

from api.push import ParkedStream, StreamPusher, _writev
from api.routes.stream import PIECE_MIN_BYTES
from bench.support.hourglass_cluster import until
from bench.support.push_streams import Drained, park_streams
from scheduler.codec import log_payload
from tests.api.test_stream import STREAM, TOPIC, Frames, pulled, send, wait_until_no_polls
from tests.support.live import ADMIN, CONSUMER, Live

MSGPACK = {"Accept": "application/x-msgpack", "Prefer": "body=once"}


def wait_parked(live: Live, n: int) -> None:
    """The server parks a stream right after its last read found nothing (asynchronously)."""
    pusher = live.app.state.ctx.pusher
    deadline = time.monotonic() + 10
    while pusher.parked != n:
        assert time.monotonic() < deadline, f"{pusher.parked} streams parked, not {n}"
        time.sleep(0.005)


def send_big(c: httpx.Client, ids: range, size: int, delay_ms: int) -> None:
    body = base64.b64encode(os.urandom(size))[:size].decode()  # (incompressible text)
    r = c.post(f"/v1/topics/{TOPIC}/messages:batch", headers={
        "Content-Type": "application/x-msgpack"}, content=msgpack.packb({"messages": [
            {"msgId": f"m{i:03d}", "body": body, "delayMs": delay_ms} for i in ids]}))
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("pushing", [True, False])
def test_frames_are_what_the_loop_writes_whoever_writes_them(live: Live,
                                                             pushing: bool) -> None:
    pusher = live.app.state.ctx.pusher
    pusher.enabled = pushing
    with live.client(CONSUMER) as consumer, live.client(ADMIN) as c, consumer.stream(
            "GET", STREAM, params={"durationMs": 30_000, "max": 2}, headers=MSGPACK) as r:
        frames = Frames(r)
        assert frames.next() == {"messages": [], "nextOffset": 0}
        got = []
        for step in range(3):
            wait_parked(live, 1 if pushing else 0)
            send(c, range(step * 3, step * 3 + 3), delay_ms=1000)
            live.advance(1000)  # committed by the engine's thread; 3 messages, max 2 a frame
            for at in (step * 3, step * 3 + 2):
                frame = frames.next()
                assert frame == pulled(c, at, MSGPACK, 2)  # what a pull of max 2 answers
                got.append(frame)
        assert [f["nextOffset"] for f in got] == [2, 3, 5, 6, 8, 9]
        assert [m["msgId"] for f in got for m in f["messages"]] == [f"m{i}" for i in range(9)]
    pushed, handed_back = pusher.totals()[:2]
    assert (pushed >= 6) if pushing else (pushed == 0)  # (the pusher wrote them, or none)
    assert handed_back == 0


def test_a_reader_slower_than_the_socket_gets_everything_once_in_order(live: Live) -> None:
    pusher = live.app.state.ctx.pusher
    size, per_send = 256 << 10, 16  # 4 MiB a send: more than a loopback socket holds
    with live.client(CONSUMER) as consumer, live.client(ADMIN) as c, consumer.stream(
            "GET", STREAM, params={"durationMs": 60_000}, headers=MSGPACK) as r:
        frames = Frames(r)
        assert frames.next()["nextOffset"] == 0
        wait_parked(live, 1)
        for k in range(3):  # the client reads nothing meanwhile
            send_big(c, range(k * per_send, (k + 1) * per_send), size, 1000)
            live.advance(1000)
        received: list[dict[str, Any]] = []
        while len(received) < 3 * per_send:
            frame = frames.next()
            assert frame["nextOffset"] == len(received) + len(frame["messages"])
            received.extend(frame["messages"])
        assert [m["offset"] for m in received] == list(range(3 * per_send))
        assert [m["msgId"] for m in received] == [f"m{i:03d}" for i in range(3 * per_send)]
        assert all(len(m["body"]) == size for m in received)
        _, handed_back = pusher.totals()[:2]
        assert handed_back >= 1  # the socket took part of a frame: the loop wrote the rest
        wait_parked(live, 1)  # caught up: lent to the pusher again
        pushed_before = pusher.totals()[0]
        send(c, range(100, 102), delay_ms=1000)
        live.advance(1000)
        assert [m["msgId"] for m in frames.next()["messages"]] == ["m100", "m101"]
        assert pusher.totals()[0] == pushed_before + 1


def test_large_bodies_go_out_as_views_of_their_payloads_in_the_frames_a_pull_answers(
        live: Live) -> None:
    """Bodies of ``PIECE_MIN_BYTES`` or more are written as pieces of their payloads (api/
    push.py), more pieces than one ``writev`` takes: the frames are still what a pull
    answers, byte for byte."""
    pusher = live.app.state.ctx.pusher
    n, size = 700, PIECE_MIN_BYTES + 10  # 1 400 bodies and headers: past IOV_MAX (1 024)
    with live.client(CONSUMER) as consumer, live.client(ADMIN) as c, consumer.stream(
            "GET", STREAM, params={"durationMs": 60_000}, headers=MSGPACK) as r:
        frames = Frames(r)
        assert frames.next()["nextOffset"] == 0
        wait_parked(live, 1)
        send_big(c, range(n), size, 1000)
        live.advance(1000)
        received: list[dict[str, Any]] = []
        while len(received) < n:
            frame = frames.next()
            assert frame == pulled(c, len(received), MSGPACK, len(frame["messages"]))
            received.extend(frame["messages"])
        assert [m["msgId"] for m in received] == [f"m{i:03d}" for i in range(n)]
        assert pusher.totals()[0] >= 1  # (the pusher wrote, not only the loop)


def test_writev_of_more_pieces_than_iov_max() -> None:
    ours, theirs = socket.socketpair()
    pieces = tuple(b"%05d" % i for i in range(3000))
    got = bytearray()

    def drain() -> None:
        while len(got) < 15_000:
            got.extend(theirs.recv(65536))
    reader = threading.Thread(target=drain)
    reader.start()
    try:
        assert _writev(ours.fileno(), pieces) == 15_000
        reader.join(10)
        assert bytes(got) == b"".join(pieces)
    finally:
        ours.close()
        theirs.close()


def test_a_stream_whose_client_left_is_no_longer_lent(live: Live) -> None:
    notifier, pusher = live.app.state.ctx.notifier, live.app.state.ctx.pusher
    consumer = live.client(CONSUMER)
    response = consumer.send(consumer.build_request("GET", STREAM, headers=MSGPACK),
                             stream=True)
    frames = Frames(response)  # (kept: dropping its reader would close the stream)
    frames.next()
    wait_parked(live, 1)
    response.close()
    consumer.close()
    wait_until_no_polls(notifier)
    assert pusher.parked == 0 and pusher.streams == 0  # (its descriptor closed with it)
    with live.client(ADMIN) as c:  # deliveries to the topic go on, written to nobody
        send(c, range(3), delay_ms=1000)
        live.advance(1000)
        assert c.get("/v1/topics/orders.stream/messages", params={"offset": 0}).json()[
            "nextOffset"] == 3
    assert pusher.totals()[:2] == (0, 0)


def test_what_landed_between_the_last_read_and_the_park_is_written_at_the_park() -> None:
    """The race no HTTP test can time: a commit lands after the loop's read found nothing
    and before the stream is parked; its listener call finds no stream to write. The park
    itself must write it, or it waits for the next delivery or heartbeat."""
    loop = asyncio.new_event_loop()
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.settimeout(10)
    landed: list[bytes] = []
    pusher = StreamPusher()
    stream = ParkedStream(pusher, topic=TOPIC, offset=0, max_messages=10,
                          encode=lambda payloads, at: b"frame %d+%d" % (at, len(payloads)),
                          read=lambda _t, offset, n: landed[offset:offset + n],
                          transport=Drained(), fd=ours.fileno(), loop=loop)
    try:
        landed.append(log_payload(TOPIC, "m0", 0, b"body", None, (), {}, 1, 2, 3, 0))
        pusher.on_delivery([TOPIC])  # the commit's listener: nothing parked yet
        stream.park(0, loop.create_future())
        assert theirs.recv(100) == b"9\r\nframe 0+1\r\n"  # one HTTP/1.1 chunk
        assert stream.offset == 1 and pusher.totals()[:2] == (1, 0)
        landed.append(log_payload(TOPIC, "m1", 1, b"body", None, (), {}, 1, 2, 3, 0))
        pusher.on_delivery([TOPIC])  # parked: the commit's own thread writes it
        assert theirs.recv(100) == b"9\r\nframe 1+1\r\n"
        assert stream.unpark() == (2, b"")
    finally:
        stream.close()
        ours.close()
        theirs.close()
        loop.close()


def test_a_stream_whose_socket_cannot_be_duplicated_is_written_by_the_loop(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """No descriptor left (EMFILE) for the pusher's own: the stream goes on, as before."""
    pusher = live.app.state.ctx.pusher

    def no_descriptor_left(fd: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "dup", no_descriptor_left)
    with live.client(CONSUMER) as consumer, live.client(ADMIN) as c, consumer.stream(
            "GET", STREAM, params={"durationMs": 30_000}, headers=MSGPACK) as r:
        frames = Frames(r)
        assert frames.next() == {"messages": [], "nextOffset": 0}
        monkeypatch.undo()  # (the stream has tried and given up)
        assert pusher.streams == 0
        send(c, range(2), delay_ms=1000)
        live.advance(1000)
        assert [m["msgId"] for m in frames.next()["messages"]] == ["m0", "m1"]
    assert pusher.totals()[:2] == (0, 0)


@pytest.mark.parametrize(("n", "by_writer"), [(3, False), (20, True)])
def test_a_commit_reads_and_encodes_once_for_all_streams_and_writes_a_bounded_number(
        n: int, by_writer: bool) -> None:
    """One read and encode per commit and offset for every stream of a topic (not one per
    stream); past ``inline_streams`` (16) the writer thread writes them, not the commit."""
    loop = asyncio.new_event_loop()
    pusher = StreamPusher()
    landed: list[bytes] = []
    encodes: list[tuple[int, bool]] = []
    committing = threading.current_thread()

    def encode(payloads: list[bytes], at: int) -> bytes:
        encodes.append((at, threading.current_thread() is not committing))
        return b"frame %d+%d" % (at, len(payloads))

    parked = park_streams(pusher, loop, n, topic=TOPIC, encode=encode,
                          read=lambda _t, offset, k: landed[offset:offset + k],
                          max_messages=10, encoding="same", client_timeout=10)
    try:
        landed.append(log_payload(TOPIC, "m0", 0, b"body", None, (), {}, 1, 2, 3, 0))
        pusher.on_delivery([TOPIC])
        for sock in parked.theirs:
            assert sock.recv(100) == b"9\r\nframe 0+1\r\n"
        # the writer thread moves a stream's offset (and counts its pass) after its write
        until(lambda: all(s.offset == 1 for s in parked.streams)
              and pusher.writer_passes == int(by_writer), 10, "the pass is done")
        assert encodes == [(0, by_writer)]  # once for all of them, by the writer or not
    finally:
        pusher.close()
        parked.close()
        loop.close()


def test_twenty_streams_of_a_topic_get_every_message_once_and_in_order(live: Live) -> None:
    """Past the commit's budget (the writer thread writes them), over real HTTP."""
    n = 20
    with live.client(ADMIN) as c:
        clients = [live.client(CONSUMER) for _ in range(n)]
        responses = [cl.send(cl.build_request("GET", STREAM, params={"durationMs": 30_000},
                                              headers=MSGPACK), stream=True)
                     for cl in clients]
        try:
            readers = [Frames(r) for r in responses]
            for reader in readers:
                assert reader.next() == {"messages": [], "nextOffset": 0}
            wait_parked(live, n)
            for step in range(3):
                send(c, range(step * 4, step * 4 + 4), delay_ms=1000)
                live.advance(1000)
            for reader in readers:
                got: list[int] = []
                while len(got) < 12:
                    got += [m["offset"] for m in reader.next()["messages"]]
                assert got == list(range(12))
            # (a pass is counted once it wrote every stream: the last frame may come first)
            until(lambda: live.app.state.ctx.pusher.writer_passes >= 1, 10, "a writer pass")
        finally:
            for r, cl in zip(responses, clients, strict=True):
                r.close()
                cl.close()


def test_a_failed_push_is_logged_counted_and_handed_back(
        caplog: pytest.LogCaptureFixture) -> None:
    """It used to be swallowed without a trace: a refused read (or a bug) is a WARNING with
    its trace, a socket error (the client left) an INFO line; both are counted
    (``hourglass_stream_push_failures_total``) and hand the stream back to the loop."""
    from prometheus_client import CollectorRegistry, generate_latest

    from api.metrics import StreamPushCollector

    loop = asyncio.new_event_loop()
    pusher = StreamPusher()
    registry = CollectorRegistry()
    registry.register(StreamPushCollector(pusher.totals))
    landed = [log_payload(TOPIC, "m0", 0, b"body", None, (), {}, 1, 2, 3, 0)]

    def refused(_t: str, _offset: int, _n: int) -> list[bytes]:
        raise RuntimeError("the engine refuses the read")

    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    streams = [ParkedStream(pusher, topic=TOPIC, offset=0, max_messages=10,
                            encode=lambda payloads, at: b"frame", read=refused,
                            transport=Drained(), fd=ours.fileno(), loop=loop)]
    theirs.close()  # the client left: writing on the socket fails (EPIPE)
    streams.append(ParkedStream(pusher, topic=TOPIC, offset=0, max_messages=10,
                                encode=lambda payloads, at: b"frame",
                                read=lambda _t, o, n: landed[o:o + n], transport=Drained(),
                                fd=ours.fileno(), loop=loop))
    try:
        with caplog.at_level("INFO", logger="hourglass.api"):
            for stream in streams:
                wake = loop.create_future()
                stream.park(0, wake)  # (writes what landed: fails)
                loop.run_until_complete(asyncio.wait_for(wake, 5))  # handed back, woken
                assert not stream.parked
        assert pusher.totals() == (0, 2, 2, 0)
        refusal, broken = [r for r in caplog.records if "write failed" in r.getMessage()]
        assert refusal.levelname == "WARNING" and refusal.exc_info is not None
        assert "RuntimeError" in refusal.getMessage()
        assert broken.levelname == "INFO" and not broken.exc_info
        assert "BrokenPipeError" in broken.getMessage()
        assert b"hourglass_stream_push_failures_total 2.0" in generate_latest(registry)
    finally:
        for stream in streams:
            stream.close()
        ours.close()
        loop.close()


def _tcp_pair(client_buffer: int) -> tuple[socket.socket, socket.socket]:
    """A connected pair of loopback TCP sockets (the server's end first), the client's
    receive buffer ``client_buffer`` bytes (what it holds of a frame it has not read)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, client_buffer)
        client.connect(listener.getsockname())
        server, _ = listener.accept()
    return server, client


def test_a_large_frame_is_written_whole_while_its_client_has_not_read_yet() -> None:
    """A stream whose frames are large (16 KiB bodies: ~4 MiB a commit) asks for a send
    buffer of ``SEND_BUFFER_BYTES``: a frame that fits it is taken whole by the socket while
    the client is busy elsewhere, not handed back to the loop after a part (which then
    writes the rest, waits for the socket to drain and reads the log again itself). Small
    frames leave the buffer as the kernel sizes it."""
    from api.push import LARGE_FRAME_BYTES, SEND_BUFFER_BYTES

    ours, theirs = _tcp_pair(64 << 10)
    with socket.socket() as probe:  # what the kernel grants for that ask (wmem_max caps it)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        granted = probe.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    default = ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    # more than the kernel's own sizing lets a socket hold (net.ipv4.tcp_wmem's maximum,
    # 4 MiB by default; the client's buffer holds 64 KiB), less than what was asked for
    size = granted * 5 // 8
    if size <= max(default, 4 << 20) + (64 << 10) or size < LARGE_FRAME_BYTES:
        pytest.skip(f"net.core.wmem_max grants a send buffer of {granted} bytes only")
    ours.setblocking(False)
    loop = asyncio.new_event_loop()
    landed: list[bytes] = []
    frames = {1: b"s" * 100, 2: b"L" * size}  # by offset: a small frame, then a large one
    pusher = StreamPusher()
    stream = ParkedStream(pusher, topic=TOPIC, offset=0, max_messages=1,
                          encode=lambda payloads, at: frames[len(landed)],
                          read=lambda _t, offset, n: landed[offset:offset + n],
                          transport=Drained(), fd=ours.fileno(), loop=loop)
    try:
        stream.park(0, loop.create_future())
        landed.append(log_payload(TOPIC, "m0", 0, b"body", None, (), {}, 1, 2, 3, 0))
        pusher.on_delivery([TOPIC])
        assert ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == default
        landed.append(log_payload(TOPIC, "m1", 1, b"body", None, (), {}, 1, 2, 3, 0))
        pusher.on_delivery([TOPIC])  # nobody reads meanwhile
        assert pusher.totals()[:2] == (2, 0)  # both written by the pusher, none handed back
        assert stream.unpark() == (2, b"")
        assert ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == granted
        expected = b"%x\r\n%s\r\n" % (100, frames[1]) + b"%x\r\n%s\r\n" % (size, frames[2])
        got = bytearray()
        theirs.settimeout(10)
        while len(got) < len(expected):
            got += theirs.recv(1 << 20)
        assert bytes(got) == expected
    finally:
        stream.close()
        ours.close()
        theirs.close()
        loop.close()
