"""Stream frames written by the thread that committed the delivery, not by the event loop.

A standing stream (api/routes/stream.py) that has caught up waits for the next delivery to
its topic. Woken through the event loop, every delivery commit costs two thread wake-ups and
a GIL hand-over: the committing thread signals the loop (``call_soon_threadsafe``), the loop
wakes, waits for the GIL the committing thread still holds, and then reads, frames and
writes. At a steady 2 k msg/s (W3 of bench/peers, a 2 ms scan interval) the event loop used
0.07 of the server's ~0.16 core, 0.04 of it without these hand-overs (the rest is W3's
sends): ~2.3 context switches of the loop per delivery, and the scanner preempted by the
thread it woke.

So a caught-up stream *lends* itself to the :class:`StreamPusher` while it waits
(:meth:`ParkedStream.park`): after each commit the committing thread, already awake and
holding the GIL, reads what landed from the stream's offset, frames it exactly as the loop
would (the same encoder, the same HTTP/1.1 chunk: ``api.transport.chunk``) and writes it
to the socket itself with one ``writev`` (made without the GIL). The event loop is not
woken at all. It takes the stream back (:meth:`ParkedStream.unpark`) when its own wait
ends: a heartbeat or the stream's end is due, the client left, the server is closing, or
the pusher handed it back.

The pusher hands a stream back instead of writing when writing would not keep the bytes in
order or bounded: the transport has bytes queued (uvloop is still writing earlier ones: the
client reads slowly), the socket takes only part of a frame (the rest goes back to the loop,
which writes it first and then waits for the socket to drain, as uvicorn's flow control
does), the engine refuses the read, or the socket fails. A stream is written either by the
loop or by the pusher, never both: the stream's lock orders them, and the loop writes only
while the stream is not parked.

What a commit costs its thread: per parked stream of the topic, one ``writev`` of the frames
of what landed, as long as the socket takes them (a reader far behind gets the rest from the
loop, after a hand-back). The frames are read and encoded once per commit, offset and
encoding, and shared by every stream at that offset (``push(shared)``): caught-up streams of
a topic all wait at its end, so N streams of a topic cost one read, one encode and N
``writev``s, not N of each. And a commit writes at most ``inline_streams`` (16) streams
itself: a topic with more parked streams than the commit's budget has left is handed to the
pusher's writer thread (started at first need), which writes them the same way, so a
commit's work for streams is bounded whatever their number and the other topics of the
shard are not delivered late behind them (a topic queued for the writer while it waits is
written once: commits coalesce). The committing thread's time in this listener per commit,
200 streams of a topic (``python -m bench.stream_commit_cost``, p50 / p99): every stream
read, encoded and written 3.4-3.8 / 15-29 ms; shared frames 0.9-1.0 / 17-18 ms; handed
to the writer 0.02 / 0.16-1.1 ms. Delivery lateness over HTTP: ``python -m
bench.stream_fanout`` (docs/api.md).

A push that fails (the socket breaks, the engine refuses the read, a bug) is logged (a
socket error at INFO, anything else at WARNING with its trace), counted
(``hourglass_stream_push_failures``) and hands the stream back to the loop, which meets the
same condition and ends the stream, or goes on.

Large bodies. A msgpack stream with ``Prefer: body=once`` gives the pusher its frames as
pieces too (``api._native.pull_pieces``): each body of ``PIECE_MIN_BYTES`` (4 KiB, api/routes/
stream.py) or more is a memoryview of its payload between the pieces of one buffer holding
the rest, so ``writev`` copies it straight into the socket, without a copy into the frame
(``_writev``: IOV_MAX pieces a call). And the payloads a caught-up stream reads after a
commit are the ones the commit appended (``CommitLog.read_many``: the last append's records),
not copies read back from the log: a 16 KiB body is copied once into the log file and once
into the socket on its way out of the committing thread. A stream whose frame reaches
``LARGE_FRAME_BYTES`` (1 MiB) asks for a send buffer of ``SEND_BUFFER_BYTES`` (8 MiB; the
kernel caps the ask at ``net.core.wmem_max``, 4 MiB here, and doubles it): the kernel's own
sizing holds at most 4 MiB (``net.ipv4.tcp_wmem``), about one commit's frame of 16 KiB
bodies, so a client a moment late took part of the next frame and the stream went back to
the loop, which wrote the rest, waited for the socket to drain and read the log again
itself (a 20 k burst of 16 KiB bodies: 5-9 hand-backs, 0-1 with it). Small frames leave the
buffer as the kernel sizes it (a stream of small messages holds no more kernel memory).

The socket. The pusher writes on a duplicate of the connection's descriptor, taken once per
stream and closed when the stream ends: if the loop closed the connection meanwhile, the
descriptor's number could belong to a new connection by then, and a frame must never reach
the wrong client. Streams over TLS (no plain socket) are written by the loop, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from api.transport import chunk, chunk_pieces
from storage.records import log_record_offsets

log = logging.getLogger("hourglass.api")

Encode = Callable[[list[bytes], int], bytes]
#: a frame as pieces for ``writev`` (large bodies as views of their payloads), or None
Pieces = Callable[[list[bytes], int], "list[bytes | memoryview] | None"]
Read = Callable[[str, int, int], list[bytes]]
#: a frame made once per commit: (HTTP/1.1 chunks, their size, next offset, read was full)
Frame = tuple[tuple["bytes | memoryview", ...], int, int, bool]
_NOTHING: Frame = ((), 0, 0, False)
#: streams one commit writes on its own thread, at most (module doc)
INLINE_STREAMS = 16
#: pieces one ``writev`` takes at most (Linux's IOV_MAX)
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
#: a frame this large makes its stream ask for a send buffer of ``SEND_BUFFER_BYTES`` (module
#: doc, Large bodies)
LARGE_FRAME_BYTES = 1 << 20
SEND_BUFFER_BYTES = 8 << 20


def _enlarge_send_buffer(fd: int, size: int) -> None:
    """Ask for a send buffer of ``size`` bytes on the socket ``fd`` (the kernel caps it at
    ``net.core.wmem_max`` and doubles that for its own bookkeeping); errors are ignored."""
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=fd)
        try:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) < size:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        finally:
            sock.detach()  # the descriptor stays the stream's


def _writev(fd: int, chunks: tuple[bytes | memoryview, ...]) -> int:
    """``os.writev(fd, chunks)`` for any number of pieces (IOV_MAX a call): the bytes the
    socket took, stopping at the first call it took only part of."""
    if len(chunks) <= _IOV_MAX:
        return os.writev(fd, chunks)
    sent = 0
    for at in range(0, len(chunks), _IOV_MAX):
        group = chunks[at:at + _IOV_MAX]
        try:
            took = os.writev(fd, group)  # (releases the GIL)
        except BlockingIOError:
            return sent
        sent += took
        if took < sum(map(len, group)):
            return sent
    return sent


def _resolve(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_result(None)


class ParkedStream:
    """One stream's state shared between the event loop and the committing threads."""

    __slots__ = ("_encode", "_fd", "_large", "_lock", "_loop", "_max", "_pieces", "_pusher",
                 "_read", "_transport", "_wake", "encoding", "offset", "parked", "pending",
                 "topic", "wrote_at")

    def __init__(self, pusher: StreamPusher, *, topic: str, offset: int, max_messages: int,
                 encode: Encode, read: Read, transport: asyncio.Transport, fd: int,
                 loop: asyncio.AbstractEventLoop, encoding: Any = None,
                 pieces: Pieces | None = None) -> None:
        """``transport``: the connection's transport (to see whether it has bytes queued);
        ``fd``: its socket's descriptor, duplicated here (module doc); ``encoding``: a key
        equal for streams whose ``encode`` makes the same bytes (None: shared with none);
        ``pieces``: the same frame as pieces, its large bodies not copied (None: ``encode``
        only; it may answer None too)."""
        self._pusher, self.topic, self._max = pusher, topic, max_messages
        self.encoding = encoding if encoding is not None else object()
        self._encode, self._read, self._transport, self._loop = encode, read, transport, loop
        self._pieces = pieces
        self._fd: int | None = os.dup(fd)
        self._large = False  # its send buffer was enlarged for large frames (push)
        self._lock = threading.Lock()
        self._wake: asyncio.Future[Any] | None = None
        self.offset = offset
        self.parked = False
        self.pending = b""  # bytes of a frame the socket did not take (the loop writes them)
        self.wrote_at = 0.0  # time.monotonic() of the last frame the pusher wrote
        pusher.adopt(self)

    # --- event loop ----------------------------------------------------------------------------
    def park(self, offset: int, wake: asyncio.Future[Any]) -> None:
        """Lend the stream, caught up to ``offset``, to the pusher until ``wake`` resolves
        (the pusher resolves it when it hands the stream back). What landed since the
        caller's last read is written at once: no delivery falls between that read and the
        registration unseen."""
        with self._lock:
            self.offset, self._wake, self.parked = offset, wake, True
        if not self._pusher.add(self):  # closing: nothing is lent any more
            with self._lock:
                self.parked = False
            _resolve(wake)
            return
        self.push()

    def unpark(self) -> tuple[int, bytes]:
        """Take the stream back: its offset and the bytes the loop must write first."""
        self._pusher.remove(self)
        with self._lock:
            self.parked, self._wake = False, None
            pending, self.pending = self.pending, b""
            return self.offset, pending

    def close(self) -> None:
        """The stream ended: give the descriptor back (after any write in progress)."""
        self._pusher.remove(self)
        with self._lock:
            self.parked = False
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        self._pusher.retire(self)

    def give_back(self) -> None:
        """Hand the stream back to the loop if it is parked (server shutdown)."""
        with self._lock:
            if self.parked:
                self._hand_back()

    # --- committing threads ------------------------------------------------------------------
    def push(self, shared: dict[Any, Any] | None = None) -> None:
        """Write the frames of what landed since ``offset`` (any thread). ``shared``: the
        frames already made during this commit, by (offset, max, encoding); what this stream
        makes goes there too (the streams of a topic are mostly at the same offset: one read
        and one encode serve them all)."""
        with self._lock:
            if not self.parked or self._fd is None:
                return
            try:
                while True:
                    key = (self.offset, self._max, self.encoding)
                    made = shared.get(key) if shared is not None else None
                    if made is None:
                        made = self._make()
                        if shared is not None:
                            shared[key] = made
                    chunks, size, next_offset, full = made
                    if not size:
                        return
                    if size >= LARGE_FRAME_BYTES and not self._large:
                        self._large = True
                        _enlarge_send_buffer(self._fd, SEND_BUFFER_BYTES)
                    transport = self._transport
                    if transport.is_closing() or transport.get_write_buffer_size():
                        sent = 0  # uvloop is still writing: these bytes go after its own
                    else:
                        try:
                            sent = _writev(self._fd, chunks)  # (releases the GIL)
                        except BlockingIOError:
                            sent = 0
                    self.offset = next_offset
                    self.wrote_at = time.monotonic()
                    if sent < size:
                        self.pending = b"".join(chunks)[sent:]
                        self._hand_back()
                        return
                    self._pusher.count(pushed=1)
                    if not full:
                        return  # the next commit pushes again
            except OSError as exc:  # the socket failed (the client left): the loop meets
                self._fail(logging.INFO, exc, with_trace=False)  # the same and ends it
            except Exception as exc:  # the engine refused the read, a bug: handed back, the
                self._fail(logging.WARNING, exc, with_trace=True)  # loop reads for itself

    def _make(self) -> Frame:
        """The frame of what landed from ``offset``: (chunks, their size, the next offset,
        whether the read was full); size 0 when nothing landed."""
        payloads = self._read(self.topic, self.offset, self._max)
        if not payloads:
            return _NOTHING
        pieces = None if self._pieces is None else self._pieces(payloads, self.offset)
        chunks: tuple[bytes | memoryview, ...]
        if pieces is not None:
            chunks = chunk_pieces(pieces)
        else:
            chunks = chunk(self._encode(payloads, self.offset))
        return (chunks, sum(map(len, chunks)), log_record_offsets(payloads[-1:])[0] + 1,
                len(payloads) >= self._max)

    def _fail(self, level: int, exc: Exception, *, with_trace: bool) -> None:
        """Lock held: a push failed; logged, counted, and the stream handed back."""
        log.log(level, "stream of %s at offset %d: the committing thread's write failed "
                "(%s: %s); handed back to the event loop", self.topic, self.offset,
                type(exc).__name__, exc, exc_info=with_trace)
        self._pusher.count(failed=1)
        self._hand_back()

    def _hand_back(self) -> None:
        """Lock held: stop pushing and wake the loop."""
        self.parked = False
        self._pusher.count(handed_back=1)
        wake = self._wake
        if wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody to wake
                self._loop.call_soon_threadsafe(_resolve, wake)


def _push_all(streams: list[ParkedStream]) -> None:
    """Push ``streams`` (of one topic), one read and encode per offset, not per stream."""
    shared: dict[Any, Frame] = {}
    for stream in streams:
        stream.push(shared)


class StreamPusher:
    """The parked streams by topic; ``on_delivery`` is a Broker delivery listener."""

    def __init__(self, *, enabled: bool = True, inline_streams: int = INLINE_STREAMS) -> None:
        self._lock = threading.Lock()
        self._streams: dict[str, dict[ParkedStream, None]] = {}  # parked, by topic
        self._live: set[ParkedStream] = set()  # every stream that may park
        self._pushed = 0  # frames the committing threads wrote
        self._handed_back = 0  # streams they gave back to the loop
        self._failed = 0  # pushes that failed (a socket error, a refused read, a bug)
        self._stalled = 0  # streams ended because their client took no bytes (stream.py)
        self._by_writer = 0  # topic passes of the writer thread
        #: streams a commit writes itself, at most (the rest: the writer thread)
        self.inline_streams = inline_streams
        self._due: dict[str, None] = {}  # topics for the writer thread, in order
        self._due_ready = threading.Condition(self._lock)
        self._writer: threading.Thread | None = None
        self._closed = False
        self.enabled = enabled  # False: every stream is written by the loop (tests compare)

    def adopt(self, stream: ParkedStream) -> None:
        with self._lock:
            self._live.add(stream)

    def retire(self, stream: ParkedStream) -> None:
        with self._lock:
            self._live.discard(stream)

    def count(self, *, pushed: int = 0, handed_back: int = 0, failed: int = 0,
              stalled: int = 0, by_writer: int = 0) -> None:
        with self._lock:
            self._pushed += pushed
            self._handed_back += handed_back
            self._failed += failed
            self._stalled += stalled
            self._by_writer += by_writer

    @property
    def writer_passes(self) -> int:
        """Topics the writer thread wrote (a pass each) since the start."""
        with self._lock:
            return self._by_writer

    def totals(self) -> tuple[int, int, int, int]:
        """Since the start: frames the pusher wrote, times it handed a stream back, pushes
        that failed, streams ended because their client took no bytes."""
        with self._lock:
            return self._pushed, self._handed_back, self._failed, self._stalled

    def add(self, stream: ParkedStream) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._streams.setdefault(stream.topic, {})[stream] = None
            return True

    def remove(self, stream: ParkedStream) -> None:
        with self._lock:
            streams = self._streams.get(stream.topic)
            if streams is not None:
                streams.pop(stream, None)
                if not streams:
                    del self._streams[stream.topic]

    def on_delivery(self, topics: Collection[str]) -> None:
        """After a commit, in the committing thread: write the parked streams' frames, up
        to ``inline_streams`` of them; the topics past that go to the writer thread."""
        if not self._streams:
            return
        budget = self.inline_streams
        for topic in topics:
            with self._lock:
                streams = list(self._streams.get(topic, ()))
                if len(streams) > budget:  # past the commit's budget: the writer's
                    self._due[topic] = None
                    self._wake_writer()
                    continue
            budget -= len(streams)
            _push_all(streams)

    def _wake_writer(self) -> None:
        """Lock held: the writer thread has topics to write (started at first need)."""
        if self._writer is None or not self._writer.is_alive():
            self._writer = threading.Thread(target=self._write_due, daemon=True,
                                             name="hourglass-stream-writer")
            self._writer.start()
        self._due_ready.notify()

    def _write_due(self) -> None:
        """The writer thread: the parked streams of the topics handed to it, topic by
        topic, each from what is in the log when it gets there (a commit during a pass
        hands its topic over again)."""
        while True:
            with self._lock:
                while not self._due and not self._closed:
                    self._due_ready.wait()
                if self._closed:
                    self._due.clear()
                    self._writer = None
                    return
                topic = next(iter(self._due))
                del self._due[topic]
                streams = list(self._streams.get(topic, ()))
            self.count(by_writer=1)
            _push_all(streams)

    def close(self) -> None:
        """Server shutdown (on the loop): hand every parked stream back; lend none again
        (the writer thread ends)."""
        with self._lock:
            self._closed = True
            self._due_ready.notify_all()
            streams = [s for by_topic in self._streams.values() for s in by_topic]
            self._streams.clear()
        for stream in streams:
            stream.give_back()

    def open(self) -> None:
        """(Re)start lending (the app's start)."""
        with self._lock:
            self._closed = False

    @property
    def streams(self) -> int:
        """Streams that may park (not ended)."""
        with self._lock:
            return len(self._live)

    @property
    def parked(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._streams.values())
