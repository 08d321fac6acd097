"""Long polling: wake waiting pulls when the engine delivers to their topic.

The engine calls ``on_delivery(topics)`` from its delivery thread after each commit. That
hands over to the event loop with ``call_soon_threadsafe`` (only when someone is waiting, so
an idle server pays nothing per delivery), and the loop resolves the futures of the pulls
waiting on those topics. A pull registers its future *before* it reads, so a delivery that
lands between the read and the wait still wakes it: no lost wake-ups, no sleep loop.

Who wakes. Every pull (by offset) waiting on the topic: each reads its own offsets. Of a
consumer group's members, competing for the same messages, only the one that has waited
longest: waking them all would send all but one back to sleep with nothing, each after a
receive of its own (at 2 k msg/s and ~250 commits a second, half the receives were that).
A member that takes a full batch, and so may have left messages behind, or that is woken
but leaves without receiving, hands the wake on to the next member (``hand_on``).

Slots. A waiting pull, a waiting receive and a standing stream each hold one of the server's
``max_polls`` slots (past them: 503 with ``Retry-After``), and one of its token's
``max_per_owner`` (past them: 429 ``TOO_MANY_REQUESTS``, so that one token cannot take every
slot of the server). The token is the request's caller (``CALLER``, set when the request
authenticates: api/context.py), unless the caller of ``slot`` names another owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Collection, Iterator
from typing import Any

from api.errors import Overloaded, TooManyLongPolls

#: the principal of the request being served (api/context.py sets it when the request
#: authenticates): the owner of the long-poll slots it takes
CALLER: contextvars.ContextVar[Any] = contextvars.ContextVar("hourglass_caller", default=None)

#: resolved with the topic of the delivery that woke it, or None (timed out, or closing)
Waiter = asyncio.Future[str | None]
#: a waiter's group: None for a pull, which every delivery to its topic wakes
Waiters = dict[str | None, dict[Waiter, None]]  # futures in arrival order


def _expire(future: Waiter) -> None:
    if not future.done():
        future.set_result(None)


def woken_by(future: Waiter) -> str | None:
    """The topic whose delivery woke ``future`` (also when its waiter was cancelled after)."""
    if future.done() and not future.cancelled():
        return future.result()
    return None


class DeliveryNotifier:
    def __init__(self, max_polls: int = 512, max_per_owner: int = 64) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[str, Waiters] = {}  # topic -> group -> futures
        self._closed = False
        self.max_polls = max_polls
        self.max_per_owner = max_per_owner
        self.polls = 0  # long polls in progress (event loop only)
        self._owned: dict[Any, int] = {}  # owner (a token's principal) -> its slots held

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
            for group in list(self._waiters.get(topic, ())):
                self._release(topic, group, everyone=group is None)

    def hand_on(self, topic: str, group: str) -> None:
        """Wake the member of ``group`` that has waited longest on ``topic``, if any."""
        self._release(topic, group, everyone=False)

    def _release(self, topic: str, group: str | None, *, everyone: bool) -> None:
        futures = self._waiters.get(topic, {}).get(group, {})
        while futures:
            future = next(iter(futures))
            del futures[future]
            if not future.done():
                future.set_result(topic)  # (what woke it: a member hands on from there)
                if not everyone:
                    break
        self._prune(topic, group)

    def _prune(self, topic: str, group: str | None) -> None:
        by_group = self._waiters.get(topic)
        if by_group is not None and not by_group.get(group, True):  # present and empty
            del by_group[group]
            if not by_group:
                del self._waiters[topic]

    def register(self, topic: str, group: str | None = None,
                 future: Waiter | None = None) -> Waiter:
        """A future resolved with ``topic`` at the next delivery to it (or with None at
        close); for a member of ``group``, at a delivery when it is the group's longest
        waiter (or handed on). ``future``: one registered under another topic already (a
        member waits on its topic and its group's retry topic with one future)."""
        if future is None:
            future = asyncio.get_running_loop().create_future()
        if self._closed:
            if not future.done():
                future.set_result(None)
        elif not future.done():
            self._waiters.setdefault(topic, {}).setdefault(group, {})[future] = None
        return future

    def unregister(self, topic: str, future: Waiter, group: str | None = None) -> None:
        self._waiters.get(topic, {}).get(group, {}).pop(future, None)
        self._prune(topic, group)

    @contextlib.contextmanager
    def slot(self, owner: Any = None) -> Iterator[None]:
        """Hold one of the ``max_polls`` long-poll slots and one of ``owner``'s (default: the
        request's caller, ``CALLER``; none: only the server's); Overloaded (503, Retry-After)
        when the server's are all taken, TooManyLongPolls (429) when the owner's are."""
        if owner is None:
            owner = CALLER.get()
        owned = self._owned
        held = owned.get(owner, 0) if owner is not None else 0
        if held >= self.max_per_owner:
            raise TooManyLongPolls(f"this token holds {held} long polls and streams already "
                                   f"(at most {self.max_per_owner}); end one, or poll "
                                   "without waitMs")
        if self.polls >= self.max_polls:
            raise Overloaded(f"{self.max_polls} long polls are waiting already; try again "
                             "shortly or poll without waitMs")
        self.polls += 1
        if owner is not None:
            owned[owner] = held + 1
        try:
            yield
        finally:
            self.polls -= 1
            if owner is not None:
                left = owned[owner] - 1
                if left:
                    owned[owner] = left
                else:
                    del owned[owner]

    def close(self) -> None:
        """Release every waiting pull and member (server shutdown): they answer with what
        they have."""
        self._closed = True
        for topic in list(self._waiters):
            for group in list(self._waiters.get(topic, ())):
                self._release(topic, group, everyone=True)

    @staticmethod
    async def wait(future: Waiter, timeout_s: float) -> str | None:
        """The topic whose delivery woke ``future``; None when ``timeout_s`` passed first (or
        at close). One timer and the future itself, no task or set around them as
        ``asyncio.wait`` makes: a steady trickle waits ~250 times a second.

        A cancelled wait cancels ``future`` too (it is awaited directly), so a caller that
        hands a wake on checks ``woken_by`` first."""
        if not future.done():
            timer = asyncio.get_running_loop().call_later(max(timeout_s, 0.0), _expire, future)
            try:
                await future
            finally:
                timer.cancel()
        return future.result()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def waiting(self) -> int:
        return sum(len(f) for w in self._waiters.values() for f in w.values())
