"""The composition root: settings in, a served engine out.

The one place that turns ``Settings`` (app/settings.py) into the parts of a running server:
the engine (``Broker`` over ``settings.engine``), the token table, the HTTP limits, the
FastAPI app over them (api/app.py, which imports nothing from app/) and the uvicorn
configuration. ``hourglass serve`` (app/server.py) and the tests build servers here.
"""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp

from api.app import create_app
from api.auth import Authenticator
from api.context import ApiLimits
from api.transport import ConnectionLimits
from app.settings import Settings
from scheduler.broker import Broker
from scheduler.clock import Clock, SystemClock


def build_app(settings: Settings, *, clock: Clock | None = None,
              broker: Broker | None = None) -> FastAPI:
    """The HTTP app over ``broker`` (default: a new Broker over ``settings.engine`` driven by
    ``clock``, default the system clock). InvalidArgument for a bad engine setting."""
    if not settings.tokens:
        raise ValueError("no token configured: the server would accept nobody "
                         "(app.server generates an admin token when none is set)")
    if broker is not None:
        engine = broker
    elif settings.cluster:
        engine = _cluster_broker(settings, clock or SystemClock())
    else:
        engine = Broker(settings.engine, clock or SystemClock())
    limits = ApiLimits(max_request_bytes=settings.max_request_bytes,
                       max_batch_messages=settings.max_batch_messages,
                       max_long_polls=settings.max_long_polls,
                       metrics_require_token=settings.metrics_require_token,
                       max_long_polls_per_token=settings.max_long_polls_per_token,
                       stream_stall_ms=settings.stream_stall_ms)
    return create_app(engine, auth=Authenticator(settings.tokens), limits=limits)


def _cluster_broker(settings: Settings, clock: Clock) -> Broker:
    """A Broker in cluster mode (imports nats: only here)."""
    from scheduler.cluster.link import NatsLink
    from scheduler.cluster.node import ClusterNode

    link = NatsLink(settings.cluster_urls, lease_ms=settings.cluster_lease_ms,
                    name=f"hourglass-{settings.node_id}")
    node = ClusterNode(link, node_id=settings.node_id, url=settings.advertised_url, clock=clock,
                       lease_ms=settings.cluster_lease_ms,
                       max_ready_lag_ms=settings.cluster_max_ready_lag_ms,
                       snapshot_records=settings.cluster_snapshot_records)
    return Broker(settings.engine, clock, cluster=node)


def uvicorn_config(app: ASGIApp, settings: Settings) -> uvicorn.Config:
    """One uvicorn worker (uvloop + httptools) with the HTTP layer's connection guards."""
    limits = ConnectionLimits(max_connections=settings.max_connections,
                              max_header_bytes=settings.max_header_bytes,
                              header_timeout_ms=settings.header_timeout_ms)
    return uvicorn.Config(
        app, host=settings.host, port=settings.port, loop="uvloop", **limits.uvicorn_options(),
        ws="none", lifespan="on", workers=1, log_level=settings.log_level,
        access_log=settings.access_log, timeout_graceful_shutdown=10,
        server_header=False,
    )
