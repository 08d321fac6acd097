"""The hot routes (send, batch, pull) served ahead of FastAPI's router.

FastAPI's per-request machinery (route matching through the router, dependency solving,
exception middleware) costs ~25 µs on an idle core and ~100 µs on this loaded one, as much
as storing a single message. The hot routes' endpoints take only the ``Request`` and parse
and authenticate themselves, so this ASGI middleware can call them directly: it matches
method and path with the routes' own compiled patterns, and maps the errors they raise to
problem documents with ``api.problems.known_problem`` (the one mapping). FastAPI keeps the
same routes for the OpenAPI document and as the fallback; anything unexpected propagates to
the app's outer error middleware as usual.
"""

from __future__ import annotations

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from api.problems import known_problem


class HotRoutes:
    def __init__(self, app: ASGIApp, routes: list[APIRoute]) -> None:
        self.app = app
        self.routes = [(route, frozenset(route.methods or ())) for route in routes]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path, method = scope["path"], scope["method"]
            for route, methods in self.routes:
                if method in methods:
                    match = route.path_regex.match(path)
                    if match is not None:
                        scope["path_params"] = match.groupdict()
                        scope["route"] = route  # the metrics label: the route template
                        await self._serve(route, scope, receive, send)
                        return
        await self.app(scope, receive, send)

    @staticmethod
    async def _serve(route: APIRoute, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            response = await route.endpoint(Request(scope, receive))
        except Exception as exc:
            problem = known_problem(exc)
            if problem is None:
                raise
            response = problem
        await response(scope, receive, send)
