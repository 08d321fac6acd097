"""Cluster mode: a write that reaches a follower is forwarded to the leader (docs/cluster.md).

Any request that changes state (every method but GET/HEAD/OPTIONS, and the GET that counts
transaction checks) is sent on to the leader's advertised URL with the caller's headers
(its Authorization among them) and body, and answered as the leader answered it. With no
leader known (a failover), or the leader unreachable, it answers 503 UNAVAILABLE with
``Retry-After``; a send retried with the same msgId is idempotent. A request forwarded once
is never forwarded again (``hourglass-forwarded``): a node that is no longer the leader
answers 503 instead, so two nodes with stale views cannot bounce it between them.
Reads are served by the node asked, from what it applied. Only built in cluster mode.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

from api.problems import problem_response
from scheduler.broker import LEADER, Broker

log = logging.getLogger("hourglass.api")

FORWARDED = b"hourglass-forwarded"
_READS = frozenset({"GET", "HEAD", "OPTIONS"})
_HOP = frozenset({b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding",
                  b"te", b"upgrade", b"proxy-authorization", b"trailer"})
RETRY_AFTER_S = 1
TIMEOUT_S = 70.0  # above the longest long poll (waitMs <= 60 s) a forwarded receive may hold


class Forwarder:
    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._client: httpx.AsyncClient | None = None
        self.forwarded = 0

    def wants(self, scope: Scope) -> bool:
        """True for a request this node must not serve itself (it is not the leader)."""
        if self._broker.role == LEADER:
            return False
        path: str = scope["path"]
        if not path.startswith("/v1/"):
            return False
        return scope["method"] not in _READS or path.endswith("/transaction-checks")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        cluster = self._broker.cluster
        url = None if cluster is None else cluster.leader_url
        if url is None or any(k.lower() == FORWARDED for k, _ in headers):
            await self._unavailable("no leader now (a failover is under way)", scope, receive,
                                    send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S, connect=1.0))
        query = scope.get("query_string", b"")
        target = url.rstrip("/") + scope["path"] + ("?" + query.decode() if query else "")
        try:
            answer = await self._client.request(
                scope["method"], target, content=bytes(body),
                headers=[*headers, (FORWARDED, b"1")])
        except httpx.HTTPError as exc:
            log.warning("forwarding %s %s to the leader %s failed: %s", scope["method"],
                        scope["path"], url, exc)
            await self._unavailable("the leader did not answer", scope, receive, send)
            return
        self.forwarded += 1
        out: list[Any] = [(k.encode("latin-1"), v.encode("latin-1"))
                          for k, v in answer.headers.multi_items()
                          if k.lower().encode() not in _HOP and k.lower() != "content-encoding"]
        content = answer.content
        out.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": answer.status_code, "headers": out})
        await send({"type": "http.response.body", "body": content})

    @staticmethod
    async def _unavailable(detail: str, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response("UNAVAILABLE", detail, retry_after_s=RETRY_AFTER_S)
        await response(scope, receive, send)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
