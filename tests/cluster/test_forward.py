"""The forwarding of writes by a follower (api/forward.py) when there is no leader to forward
to, and for a request already forwarded once; cluster settings."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from api.forward import Forwarder
from app.settings import load_settings
from storage.errors import InvalidArgument


def _forwarder(role: str, leader_url: str | None) -> Forwarder:
    broker: Any = SimpleNamespace(role=role, cluster=SimpleNamespace(leader_url=leader_url))
    return Forwarder(broker)


async def _call(fwd: Forwarder, method: str, path: str,
                headers: dict[str, str] | None = None) -> httpx.Response:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert fwd.wants(scope)
        await fwd(scope, receive, send)

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://node") as c:
        return await c.request(method, path, headers=headers or {}, json={"body": "x"})


def test_what_a_follower_forwards() -> None:
    fwd = _forwarder("follower", "http://leader")
    scope = {"type": "http", "method": "POST", "path": "/v1/topics/t/messages"}
    assert fwd.wants(scope)
    assert fwd.wants({**scope, "method": "GET", "path": "/v1/producer-groups/g/transaction-checks"})
    assert not fwd.wants({**scope, "method": "GET", "path": "/v1/topics/t/messages"})
    assert not fwd.wants({**scope, "path": "/healthz"})
    assert not _forwarder("leader", None).wants(scope)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_no_leader_or_a_second_hop_answers_503_with_retry_after(anyio_backend: str) -> None:
    r = await _call(_forwarder("follower", None), "POST", "/v1/topics/t/messages")
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert r.json()["code"] == "UNAVAILABLE"
    r = await _call(_forwarder("follower", "http://127.0.0.1:9"), "POST",
                    "/v1/topics/t/messages", headers={"hourglass-forwarded": "1"})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    # the leader does not answer: 503 too, never a hang or a 500
    r = await _call(_forwarder("follower", "http://127.0.0.1:9"), "POST", "/v1/topics/t/messages")
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"


def test_cluster_settings() -> None:
    s = load_settings(cli={"cluster": "nats://a:4222, nats://b:4222", "node_id": "n1"},
                      env={"HOURGLASS_PORT": "7745"})
    assert s.cluster_urls == ["nats://a:4222", "nats://b:4222"]
    assert s.advertised_url == "http://127.0.0.1:7745"
    assert s.cluster_lease_ms == 2000 and s.cluster_max_ready_lag_ms == 1000
    env = {"HOURGLASS_CLUSTER": "nats://a:4222", "HOURGLASS_NODE_ID": "n2",
           "HOURGLASS_ADVERTISE": "http://10.0.0.2:7740", "HOURGLASS_CLUSTER_LEASE_MS": "3s"}
    s = load_settings(env=env)
    assert (s.node_id, s.advertised_url, s.cluster_lease_ms) == ("n2", "http://10.0.0.2:7740",
                                                                 3000)
    with pytest.raises(InvalidArgument, match="node-id"):
        load_settings(cli={"cluster": "nats://a:4222"})
    with pytest.raises(InvalidArgument):
        load_settings(cli={"cluster": "nats://a:4222", "node_id": "bad id!"})
    with pytest.raises(InvalidArgument):
        load_settings(env={**env, "HOURGLASS_CLUSTER_LEASE_MS": "100"})
