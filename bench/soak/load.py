"""The soak's clients: producers at a fixed rate, a canceller, one consumer per topic; what
they were told goes into ``Totals``."""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.support.server_process import ServerProcess

TOPICS = ("soak.a", "soak.b")
GROUP = "soak"
TICK_S = 0.1  # producers send every tick
SINGLES = 2  # of each tick's messages, this many go as single sends, the rest as one batch
CANCEL_SHARE = 0.02  # of the rate, cancelled before due


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Totals:
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    acked: set[tuple[str, str]] = field(default_factory=set)
    cancelled: set[tuple[str, str]] = field(default_factory=set)
    consumed: list[tuple[str, str]] = field(default_factory=list)
    lateness: deque[int] = field(default_factory=deque)  # drained by the sampler each second
    all_lateness: list[int] = field(default_factory=list)
    early: int = 0
    errors: list[str] = field(default_factory=list)
    sent_window: int = 0


class Load:
    def __init__(self, server: ServerProcess, rate: int, totals: Totals) -> None:
        self.server, self.rate, self.totals = server, rate, totals
        self.stop_sending = threading.Event()
        self.stop_consuming = threading.Event()
        self.recent: deque[tuple[str, str, str, int]] = deque(maxlen=5000)  # topic, id, handle, due
        self.last_due = 0

    def produce(self, seed: int, producers: int) -> None:
        """This thread's share of the rate, paced in ticks of TICK_S (fixed rate: when it
        falls behind it does not burst to catch up; the achieved rate is reported)."""
        rng = random.Random(seed)
        per_tick, carry, n = self.rate * TICK_S / producers, 0.0, 0
        next_tick = time.monotonic()
        with self.server.client() as client:
            while not self.stop_sending.is_set():
                carry += per_tick
                count = int(carry)
                carry -= count
                messages = []
                for _ in range(count):
                    n += 1
                    messages.append({"body": f"soak {seed}-{n}", "msgId": f"s{seed}-{n}",
                                     "delayMs": rng.randrange(100, 3000)})
                topic = rng.choice(TOPICS)
                singles, batch = messages[:SINGLES], messages[SINGLES:]
                for m in singles:
                    self._send(client, topic, [m], single=True)
                if batch:
                    self._send(client, topic, batch, single=False)
                next_tick += TICK_S
                delay = next_tick - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    next_tick = time.monotonic()

    def _send(self, client: httpx.Client, topic: str, messages: list[dict[str, Any]],
              single: bool) -> None:
        try:
            r = (client.post(f"/v1/topics/{topic}/messages", json=messages[0]) if single else
                 client.post(f"/v1/topics/{topic}/messages:batch", json={"messages": messages}))
        except httpx.HTTPError as exc:
            self.totals.errors.append(f"send: {exc!r}")
            return
        if r.status_code != 201:
            self.totals.errors.append(f"send answered {r.status_code}: {r.text[:200]}")
            return
        results = [r.json()] if single else r.json()["results"]
        with self.totals.lock:
            for res in results:
                self.totals.acked.add((topic, res["msgId"]))
                self.recent.append((topic, res["msgId"], res["cancelHandle"], res["deliverAt"]))
                self.last_due = max(self.last_due, res["deliverAt"])
            self.totals.sent_window += len(results)

    def cancel(self, seed: int) -> None:
        rng = random.Random(seed)
        with self.server.client() as client:
            while not self.stop_sending.wait(1 / max(1, self.rate * CANCEL_SHARE)):
                with self.totals.lock:
                    pick = self.recent[rng.randrange(len(self.recent))] if self.recent else None
                if pick is None or pick[3] < now_ms() + 50:
                    continue
                r = client.delete(f"/v1/scheduled/{pick[2]}")
                if r.status_code == 200:
                    with self.totals.lock:
                        self.totals.cancelled.add((pick[0], pick[1]))
                elif r.status_code != 409:
                    self.totals.errors.append(f"cancel answered {r.status_code}: {r.text[:200]}")

    def consume(self, topic: str) -> None:
        with self.server.client(timeout_s=30) as client:
            while not self.stop_consuming.is_set():
                r = client.get(f"/v1/topics/{topic}/messages",
                               params={"group": GROUP, "max": 1000, "waitMs": 500})
                if r.status_code != 200:
                    self.totals.errors.append(f"pull answered {r.status_code}: {r.text[:200]}")
                    continue
                doc = r.json()
                with self.totals.lock:
                    for m in doc["messages"]:
                        late = m["storedAt"] - m["deliverAt"]
                        self.totals.early += late < 0
                        self.totals.lateness.append(late)
                        self.totals.all_lateness.append(late)
                        self.totals.consumed.append((topic, m["msgId"]))
                if doc["messages"]:
                    client.put(f"/v1/topics/{topic}/groups/{GROUP}/offset",
                               json={"offset": doc["nextOffset"]})
