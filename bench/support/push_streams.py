"""Streams parked with the pusher (api/push.py) over socket pairs, in process and without a
server: what ``python -m bench.stream_commit_cost`` times and tests/api/test_stream_push.py
checks (one commit's reads, encodes and writes for every stream of a topic)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.push import ParkedStream, StreamPusher


class Drained:
    """A transport with nothing queued: the pusher then writes on the socket itself."""

    @staticmethod
    def is_closing() -> bool:
        return False

    @staticmethod
    def get_write_buffer_size() -> int:
        return 0


@dataclass
class SocketStreams:
    """Parked streams, each writing on ``ours[i]``; ``theirs[i]`` is its client's end."""

    streams: list[ParkedStream] = field(default_factory=list)
    ours: list[socket.socket] = field(default_factory=list)
    theirs: list[socket.socket] = field(default_factory=list)

    def close(self) -> None:
        for stream in self.streams:
            stream.close()
        for sock in self.ours + self.theirs:
            sock.close()


def park_streams(pusher: StreamPusher, loop: asyncio.AbstractEventLoop, n: int, *,
                 topic: str, encode: Callable[[list[bytes], int], bytes],
                 read: Callable[[str, int, int], list[bytes]], max_messages: int,
                 encoding: Any = None, client_timeout: float = 0.0) -> SocketStreams:
    """``n`` streams of ``topic`` at offset 0, parked over socket pairs (nothing read yet);
    ``encoding``: as ParkedStream takes it (streams with equal ones share an encode);
    ``client_timeout``: of the client ends (0: non-blocking)."""
    out = SocketStreams()
    extra = {} if encoding is None else {"encoding": encoding}
    for _ in range(n):
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        theirs.settimeout(client_timeout)
        out.ours.append(ours)
        out.theirs.append(theirs)
        stream = ParkedStream(pusher, topic=topic, offset=0, max_messages=max_messages,
                              encode=encode, read=read, transport=Drained(),
                              fd=ours.fileno(), loop=loop, **extra)
        stream.park(0, loop.create_future())
        out.streams.append(stream)
    return out
