"""DeliveryNotifier on its own (api/longpoll.py): a wait is one future and one timer; it
answers the topic that woke it or None; a future registered under several topics is woken by
any of them; a waiter that timed out or was cancelled never takes a wake meant for another;
one woken and then cancelled still says who woke it, so that the wake can be handed on."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

from api.longpoll import DeliveryNotifier, woken_by


def run(test: Callable[[DeliveryNotifier], Awaitable[None]]) -> None:
    async def main() -> None:
        notifier = DeliveryNotifier()
        notifier.bind(asyncio.get_running_loop())
        await test(notifier)
        assert notifier.waiting == 0  # nothing left registered

    asyncio.run(main())


def test_a_delivery_from_another_thread_wakes_the_wait_with_its_topic() -> None:
    async def test(notifier: DeliveryNotifier) -> None:
        future = notifier.register("orders", "g")
        loop = asyncio.get_running_loop()
        threading.Timer(0.02, notifier.on_delivery, (["orders"],)).start()
        began = loop.time()
        assert await notifier.wait(future, 5.0) == "orders"
        assert loop.time() - began < 2.0  # woken, not timed out
        notifier.unregister("orders", future, "g")

    run(test)


def test_a_wait_that_times_out_answers_none_and_takes_no_later_wake() -> None:
    async def test(notifier: DeliveryNotifier) -> None:
        first = notifier.register("orders", "g")
        assert await notifier.wait(first, 0.01) is None
        second = notifier.register("orders", "g")  # while the first is still registered
        notifier._wake(("orders",))
        assert woken_by(second) == "orders"  # the wake went to the one still waiting
        assert woken_by(first) is None
        for future in (first, second):
            notifier.unregister("orders", future, "g")

    run(test)


def test_one_future_under_two_topics_is_woken_by_either() -> None:
    async def test(notifier: DeliveryNotifier) -> None:
        for woke in ("orders", "%RETRY%g"):
            future = None
            for topic in ("orders", "%RETRY%g"):
                future = notifier.register(topic, "g", future)
            assert future is not None and notifier.waiting == 2
            notifier.on_delivery([woke])
            assert await notifier.wait(future, 5.0) == woke
            for topic in ("orders", "%RETRY%g"):
                notifier.unregister(topic, future, "g")

    run(test)


def test_woken_then_cancelled_says_who_woke_it_and_a_cancelled_wait_takes_nothing() -> None:
    async def test(notifier: DeliveryNotifier) -> None:
        first = notifier.register("orders", "g")
        second = notifier.register("orders", "g")
        waits = [asyncio.create_task(notifier.wait(f, 5.0)) for f in (first, second)]
        await asyncio.sleep(0)  # both wait
        notifier._wake(("orders",))  # the longest waiter: the first
        waits[0].cancel()  # gone before it ran again
        waits[1].cancel()  # gone while waiting
        for task in waits:
            try:
                await task
            except asyncio.CancelledError:
                pass
        assert woken_by(first) == "orders"  # to hand on (api/routes/groups.py)
        assert second.cancelled() and woken_by(second) is None
        third = notifier.register("orders", "g")
        notifier._wake(("orders",))  # not taken by the cancelled one
        assert woken_by(third) == "orders"
        for future in (first, second, third):
            notifier.unregister("orders", future, "g")

    run(test)


def test_close_wakes_every_waiter_and_a_later_register_is_done_at_once() -> None:
    async def test(notifier: DeliveryNotifier) -> None:
        futures = [notifier.register("orders", g) for g in ("a", "a", None)]
        notifier.close()
        assert all(f.done() for f in futures)
        late = notifier.register("orders", "a")
        assert await notifier.wait(late, 5.0) is None
        for future, g in zip(futures, ("a", "a", None), strict=True):
            notifier.unregister("orders", future, g)

    run(test)
