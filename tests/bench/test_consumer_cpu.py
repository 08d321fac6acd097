"""bench.peers: the consumer side's CPU is each consumer-side thread's own CPU time, read from
the kernel while it runs and kept once it ends; the harness's other threads are not in it."""

from __future__ import annotations

import threading
import time

from bench.peers.systems.base import ConsumerCpu

BURN_S = 0.2  # CPU seconds a thread burns (its own CPU clock, not wall time)


def _burn(seconds: float, then: threading.Event | None = None,
          hold: threading.Event | None = None) -> None:
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        sum(range(1000))
    if then is not None:
        then.set()
    if hold is not None:
        hold.wait()


def test_a_consumer_threads_cpu_is_counted_while_it_runs_and_after_it_ends() -> None:
    cpu = ConsumerCpu()
    burnt, release = threading.Event(), threading.Event()
    t = cpu.spawn(_burn, (BURN_S, burnt, release), "consumer-under-test")
    assert burnt.wait(60)
    alive = cpu.threads_s()  # read from /proc while the thread lives
    assert BURN_S <= alive < BURN_S + 1.0
    release.set()
    t.join(60)
    ended = cpu.threads_s()  # kept as the thread measured itself at its end
    assert ended >= alive and ended < BURN_S + 1.0


def test_other_threads_are_not_the_consumer_sides() -> None:
    cpu = ConsumerCpu()
    idle = cpu.spawn(lambda: None, (), "idle-consumer")
    idle.join(60)
    other = threading.Thread(target=_burn, args=(BURN_S,))  # a producer, say
    other.start()
    other.join(60)
    assert cpu.threads_s() < BURN_S / 2


def test_the_sink_is_timed_and_still_called() -> None:
    cpu = ConsumerCpu()
    got: list[tuple[list[str], float]] = []

    def sink(ids: object, recv: object, late: object) -> None:
        got.append((list(ids), recv))  # type: ignore[call-overload]
        _burn(BURN_S)

    cpu.timed_sink(sink)(["a", "b"], 1.0, None)
    assert got == [(["a", "b"], 1.0)]
    assert BURN_S <= cpu.sink_s() < BURN_S + 1.0
