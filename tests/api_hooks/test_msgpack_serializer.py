"""The schemathesis run's msgpack serializer (tests/api/schemathesis_hooks.py): integers
beyond msgpack's 64 bits go as bignum extensions the server refuses with 400, everything else
exactly as msgpack packs it.

The hooks module registers global schemathesis hooks and patches Hypothesis when imported, so
it is only ever imported in a subprocess (as the schemathesis run does), never here."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from scheduler.clock import FakeClock
from tests.support.live import T0, Live, make_settings, serve

REPO = Path(__file__).resolve().parents[2]
TOPIC = "orders.hooks"
BIGINT_EXT = 1
_PACK = ("import json, sys\nfrom tests.api.schemathesis_hooks import packb\n"
         "sys.stdout.buffer.write(packb(json.load(sys.stdin)))")


def hooks_packb(payload: Any) -> bytes:
    """packb of the hooks module, run in a process of its own."""
    done = subprocess.run([sys.executable, "-c", _PACK], input=json.dumps(payload).encode(),
                          capture_output=True, cwd=REPO, timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return done.stdout


def _bigint(code: int, data: bytes) -> Any:
    assert code == BIGINT_EXT
    return ("bigint", int.from_bytes(data, "big", signed=True))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    data = tmp_path_factory.mktemp("hooks") / "data"
    with serve(make_settings(data), clock=FakeClock(T0)) as server:
        yield server


def test_what_msgpack_can_hold_is_packed_unchanged() -> None:
    payload = {"messages": [{"body": "x", "delayMs": 2**64 - 1, "keys": ["a", "b"]},
                            {"deliverAt": -(2**63), "flag": True, "none": None, "f": 1.5}]}
    assert hooks_packb(payload) == msgpack.packb(payload)


def test_integers_beyond_64_bits_become_bignum_extensions() -> None:
    huge = [2**64, -(2**63) - 1, 10**40, -(10**40), 2**127 - 1]
    packed = hooks_packb({"messages": [{"deliverAt": n} for n in huge], "n": 7})
    decoded = msgpack.unpackb(packed, ext_hook=_bigint)
    assert [m["deliverAt"] for m in decoded["messages"]] == [("bigint", n) for n in huge]
    assert decoded["n"] == 7


@pytest.mark.parametrize("value", [10**30, -(2**70), 2**64])
def test_the_server_refuses_a_bignum_and_stores_nothing(live: Live, value: int) -> None:
    msg_id = f"big-{value % 1000}"
    body = hooks_packb({"messages": [{"body": "ok", "msgId": msg_id},
                                     {"body": "big", "deliverAt": value}]})
    with live.client() as c:
        r = c.post(f"/v1/topics/{TOPIC}/messages:batch", content=body,
                   headers={"Content-Type": "application/x-msgpack"})
        assert r.status_code == 400, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert "deliverAt" in r.json()["detail"]
        assert c.get(f"/v1/topics/{TOPIC}/messages/{msg_id}").status_code == 404
        # the same batch with an integer msgpack can hold is accepted
        fine = hooks_packb({"messages": [{"body": "ok", "msgId": msg_id},
                                         {"body": "big", "deliverAt": T0 + 60_000}]})
        accepted = c.post(f"/v1/topics/{TOPIC}/messages:batch", content=fine,
                          headers={"Content-Type": "application/x-msgpack"})
        assert accepted.status_code == 201, accepted.text
        assert c.get(f"/v1/topics/{TOPIC}/messages/{msg_id}").status_code == 200
