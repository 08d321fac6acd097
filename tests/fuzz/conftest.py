"""Fixtures and settings of the bad-input suites.

``fuzz_live``: the real app over real HTTP on a real Broker (SystemClock, so scheduled
messages fall due and cancels race deliveries while the fuzzers run), one per test module
(``fuzz_server`` makes one on another clock).
When the module is done and the server stopped, ``hourglass verify`` must find the data
directory consistent: fuzzing may be refused, never corrupt anything.

``FUZZ_SCALE`` (environment) multiplies every example budget here and switches
derandomisation off: ``FUZZ_SCALE=20 pytest tests/fuzz`` is a long exploratory run; the
default is a bounded, reproducible run for CI.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, settings

from app import verify_cli
from scheduler.clock import Clock, SystemClock
from tests.support.live import Live, make_settings, serve

SCALE = int(os.environ.get("FUZZ_SCALE", "1"))
CONTRACT_CODES = frozenset({
    "INVALID_ARGUMENT", "TOPIC_INVALID", "DELAY_TOO_LONG", "PAYLOAD_TOO_LARGE", "NOT_FOUND",
    "ALREADY_DELIVERED", "CONFLICT", "UNAUTHORIZED", "FORBIDDEN", "TOO_MANY_REQUESTS",
    "UNAVAILABLE",
})


#: Hypothesis's explain phase re-runs a failing example under ``sys.settrace``, which on
#: Python 3.11 made one failing stateful run outlast the 300 s test timeout: the timeout then
#: hid the failure itself. Shrinking stays; the failure is reported as found and shrunk.
PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)


def fuzz_settings(examples: int, **kw: Any) -> settings:
    return settings(max_examples=examples * SCALE, deadline=None, derandomize=SCALE == 1,
                    phases=PHASES, print_blob=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large],
                    **kw)


@contextlib.contextmanager
def fuzz_server(tmp_path_factory: pytest.TempPathFactory, clock: Clock) -> Iterator[Live]:
    """A served Broker on a new data directory, checked with ``hourglass verify`` after."""
    data = tmp_path_factory.mktemp("fuzz") / "data"
    with serve(make_settings(data), clock=clock) as live:
        yield live
    assert verify_cli.main(["--data-dir", str(data)]) == 0, "the data directory is corrupt"


@pytest.fixture(scope="module")
def fuzz_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with fuzz_server(tmp_path_factory, SystemClock()) as live:
        yield live


def assert_problem(response: httpx.Response) -> dict[str, Any]:
    """A 4xx answer is a problem document with one of the contract's codes; no 5xx at all."""
    assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
    assert 400 <= response.status_code, response.status_code
    assert response.headers["content-type"].startswith("application/problem+json"), \
        response.headers["content-type"]
    doc: dict[str, Any] = response.json()
    assert set(doc) == {"type", "title", "status", "detail", "code"}, doc
    assert doc["status"] == response.status_code and doc["code"] in CONTRACT_CODES, doc
    assert re.fullmatch(r"urn:hourglass:problem:[a-z-]+", doc["type"]), doc
    return doc
