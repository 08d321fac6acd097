"""Long polling: wake waiting pulls when the engine delivers to their topic.

The engine calls ``on_delivery(topics)`` from its delivery thread after each commit. That
hands over to the event loop with ``call_soon_threadsafe`` (only when someone is waiting, so
an idle server pays nothing per delivery), and the loop resolves the futures of the pulls
waiting on those topics. A pull registers its future *before* it reads, so a delivery that
lands between the read and the wait still wakes it: no lost wake-ups, no sleep loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Iterator

from api.errors import Overloaded


class DeliveryNotifier:
    def __init__(self, max_polls: int = 512) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._closed = False
        self.max_polls = max_polls
        self.polls = 0  # long polls in progress (event loop only)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Attach to the server's event loop (called by the lifespan on start)."""
        self._loop = loop
        self._closed = False

    # --- delivery thread ------------------------------------------------------------------
    def on_delivery(self, topics: Collection[str]) -> None:
        loop = self._loop
        if not self._waiters or loop is None or loop.is_closed():
            return  # nobody waits; a pull registering right now reads after this commit
        try:
            loop.call_soon_threadsafe(self._wake, tuple(topics))
        except RuntimeError:  # the loop closed between the check and the call
            pass

    # --- event loop -------------------------------------------------------------------------
    def _wake(self, topics: tuple[str, ...]) -> None:
        for topic in topics:
            for future in self._waiters.pop(topic, ()):
                if not future.done():
                    future.set_result(None)

    def register(self, topic: str) -> asyncio.Future[None]:
        """A future resolved at the next delivery to ``topic`` (or at close)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._closed:
            future.set_result(None)
        else:
            self._waiters.setdefault(topic, set()).add(future)
        return future

    def unregister(self, topic: str, future: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(topic)
        if waiters is not None:
            waiters.discard(future)
            if not waiters:
                del self._waiters[topic]

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one of the ``max_polls`` long-poll slots; Overloaded (503, Retry-After) when
        they are all taken."""
        if self.polls >= self.max_polls:
            raise Overloaded(f"{self.max_polls} long polls are waiting already; try again "
                             "shortly or poll without waitMs")
        self.polls += 1
        try:
            yield
        finally:
            self.polls -= 1

    def close(self) -> None:
        """Release every waiting pull (server shutdown): they answer with what they have."""
        self._closed = True
        self._wake(tuple(self._waiters))

    async def wait(self, future: asyncio.Future[None], timeout_s: float) -> bool:
        """True when woken, False when ``timeout_s`` passed first."""
        done, _ = await asyncio.wait((future,), timeout=max(timeout_s, 0.0))
        return bool(done)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())
