"""A live server for tests: the API served by a real uvicorn on 127.0.0.1 (a free port, in a
thread of this process) over a real Broker, so tests can drive its FakeClock and call
``broker.drain()``; the tokens of each role, and settings for test servers."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from api.auth import Role, TokenSpec
from app.settings import Settings, load_settings
from app.wiring import build_app
from scheduler.broker import Broker
from scheduler.clock import Clock, FakeClock
from tests.support.uvicorn_thread import serve_in_thread

ADMIN = "admin-token-0123456789abcdef"
PRODUCER = "producer-orders-0123456789"  # producer, topics orders.*
CONSUMER = "consumer-orders-0123456789"  # consumer, topics orders.*
PRODUCER_ALL = "producer-all-0123456789ab"  # producer, every topic

TOKENS = (
    TokenSpec(token=ADMIN, role=Role.ADMIN, name="admin"),
    TokenSpec(token=PRODUCER, role=Role.PRODUCER, topics=("orders.*",), name="producer"),
    TokenSpec(token=CONSUMER, role=Role.CONSUMER, topics=("orders.*",), name="consumer"),
    TokenSpec(token=PRODUCER_ALL, role=Role.PRODUCER, name="producer-all"),
)
T0 = 1_700_000_000_000


@dataclass
class Live:
    base_url: str
    app: FastAPI
    broker: Broker
    clock: Clock
    settings: Settings

    def client(self, token: str | None = ADMIN, headers: dict[str, str] | None = None,
               **kwargs: Any) -> httpx.Client:
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base_url, headers={**auth, **(headers or {})},
                            timeout=30.0, **kwargs)

    @property
    def fake_clock(self) -> FakeClock:
        assert isinstance(self.clock, FakeClock)
        return self.clock

    def advance(self, ms: int) -> None:
        """Move fake time on and wait until everything due is in the log."""
        self.fake_clock.advance(ms)
        self.broker.drain()


TEST_SEGMENT_SIZE = 64 << 20  # fallocating the default 1 GiB segment costs ~1 s per server


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    settings = load_settings(cli={"data_dir": str(data_dir)})
    settings = replace(settings, engine=replace(settings.engine,
                                                segment_size=TEST_SEGMENT_SIZE))
    return replace(settings, **{"tokens": TOKENS, **overrides})


@contextmanager
def serve(settings: Settings, clock: Clock, *,
          tune_gc: bool = False) -> Iterator[Live]:
    """The app over a new Broker driven by ``clock``, served in a thread."""
    app = build_app(settings, clock=clock)
    with serve_in_thread(app, settings, tune_gc=tune_gc) as base_url:
        yield Live(base_url=base_url, app=app, broker=app.state.ctx.broker, clock=clock,
                   settings=settings)


@contextmanager
def serve_twins(root: Path) -> Iterator[tuple[Live, Live]]:
    """Two servers on fake clocks at T0 (data in ``root``/a and ``root``/b) that generate
    the same msgIds: fed the same requests, they answer and store the same."""
    with serve(make_settings(root / "a"), FakeClock(T0)) as a, \
            serve(make_settings(root / "b"), FakeClock(T0)) as b:
        for live in (a, b):
            ids = live.broker.parts.intake._ids
            ids._instance, ids._counter = "0123ABCD", itertools.count()
        yield a, b
