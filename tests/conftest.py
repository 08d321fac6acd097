"""Fixtures shared by every test folder: a RocksStore, the engine harness on a FakeClock, and
live servers over real HTTP. Their support code is in tests/support/ (and, shared with the
benchmarks, in support/)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from scheduler.broker import Broker
from scheduler.clock import Clock, FakeClock
from storage.rocks import RocksStore
from tests.support.engine import START_MS, Harness
from tests.support.live import T0, Live, make_settings, serve

with warnings.catch_warnings():
    # schemathesis' pytest plugin imports this lazily inside the first test it runs, where
    # jsonschema's DeprecationWarning would be an error (filterwarnings = error); import it
    # here, outside any test, so every folder also passes when run on its own.
    warnings.simplefilter("ignore")
    import schemathesis._hypothesis  # noqa: F401


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RocksStore]:
    """A real RocksStore with two timer shards under tmp_path."""
    s = RocksStore(tmp_path / "db", timer_shards=2)
    yield s
    s.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START_MS)


@pytest.fixture
def harness(tmp_path: Path, clock: FakeClock) -> Iterator[Harness]:
    h = Harness(tmp_path / "data", clock)
    yield h
    h.close_all()


@pytest.fixture
def broker(harness: Harness) -> Broker:
    return harness.open()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    """A server over a FakeClock-driven Broker."""
    with serve(make_settings(tmp_path / "data"), clock=FakeClock(T0)) as server:
        yield server


@pytest.fixture(scope="module")
def shared_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """One server for a whole module, for tests that do not care about each other's data."""
    data = tmp_path_factory.mktemp("shared") / "data"
    with serve(make_settings(data), clock=FakeClock(T0)) as server:
        yield server


@pytest.fixture
def live_factory(tmp_path: Path) -> Iterator[Callable[..., Live]]:
    """Start servers with custom settings (``overrides``; ``engine``: engine settings), each
    on a data directory of its own unless ``data`` names one (a restart); stopped in reverse
    order at the end of the test."""
    with ExitStack() as stack:
        started = 0

        def start(clock: Clock | None = None, *, data: str | None = None,
                  engine: Mapping[str, Any] | None = None, **overrides: Any) -> Live:
            nonlocal started
            settings = make_settings(tmp_path / (data or f"data{started}"), **overrides)
            if engine:
                settings = replace(settings, engine=replace(settings.engine, **engine))
            started += 1
            return stack.enter_context(serve(settings, clock=clock or FakeClock(T0)))

        yield start
