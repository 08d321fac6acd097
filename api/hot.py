"""The hot routes, served before anything of FastAPI or Starlette runs.

A request through the whole stack (uvicorn's proxy-headers middleware, FastAPI's telemetry
and body-limit middleware, Starlette's error and exception middleware, ours for metrics and
unexpected errors, then the router matching ~25 routes one by one) cost ~80 µs of CPU before
its endpoint ran (``hourglass bench breakdown``): as much as storing 10 messages, and most of
what a steady trickle of small pulls and offset commits costs (W3 of bench/peers).

The hot routes' endpoints take only the ``Request`` and parse, validate and authenticate
themselves, so ``HourglassApp.__call__`` (the FastAPI app's own entry point) matches method
and path against their compiled patterns first and calls them directly, doing here what the
skipped layers did for them: the HTTP metrics, known errors as problem documents
(``api.problems.known_problem``, the one mapping), anything else as a logged 500 problem.
FastAPI keeps the same routes for the OpenAPI document and as the path for everything else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from api.metrics import HttpMetrics
from api.problems import known_problem, problem_response

log = logging.getLogger("hourglass.api")

#: operationIds served ahead of FastAPI: their endpoints take only the Request
HOT_OPERATIONS = frozenset({"sendMessage", "sendBatch", "pullMessages", "commitGroupOffset",
                            "streamMessages"})


class HourglassApp(FastAPI):
    """FastAPI, with the hot routes answered before its middleware stack."""

    _hot: tuple[tuple[APIRoute, frozenset[str]], ...] = ()
    _metrics: HttpMetrics | None = None
    forwarder: Any = None  # cluster mode: api/forward.py's Forwarder (writes to the leader)

    def serve_hot(self, metrics: HttpMetrics, operations: Collection[str] = HOT_OPERATIONS
                  ) -> None:
        """Serve the routes of ``operations`` ahead of the stack (call after adding routes)."""
        self._hot = tuple((r, frozenset(r.methods or ())) for r in self.routes
                          if isinstance(r, APIRoute) and r.operation_id in operations)
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            forwarder = self.forwarder
            if forwarder is not None and forwarder.wants(scope):
                await forwarder(scope, receive, send)
                return
            path, method = scope["path"], scope["method"]
            for route, methods in self._hot:
                if method in methods:
                    match = route.path_regex.match(path)
                    if match is not None:
                        scope["app"] = self
                        scope["path_params"] = match.groupdict()
                        scope["route"] = route
                        await self._serve(route, scope, receive, send)
                        return
        await super().__call__(scope, receive, send)

    async def _serve(self, route: APIRoute, scope: Scope, receive: Receive, send: Send) -> None:
        metrics = self._metrics
        assert metrics is not None
        started = time.perf_counter()
        metrics.in_flight.inc()
        status = 500
        try:
            try:
                response: Response = await route.endpoint(Request(scope, receive))
            except ClientDisconnect:
                return  # nobody to answer
            except Exception as exc:
                problem = known_problem(exc)
                if problem is None:
                    log.exception("unexpected error in %s %s", scope["method"], scope["path"])
                    problem = problem_response("INTERNAL",
                                               "unexpected server error; see the server log")
                response = problem
            status = response.status_code
            await response(scope, receive, send)
        finally:
            metrics.in_flight.dec()
            metrics.observe(scope["method"], route.path, status, time.perf_counter() - started)
