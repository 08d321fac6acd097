"""The FastAPI application: ``create_app(broker, auth=..., limits=...)`` puts routes, problem
handlers, metrics and the OpenAPI document over an engine it is given (app/wiring.py builds
the engine from the settings). The lifespan owns the Broker's start and close."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, GCCollector
from starlette.concurrency import run_in_threadpool

from api.auth import Authenticator
from api.context import ApiContext, ApiLimits
from api.hot import HOT_OPERATIONS, HourglassApp
from api.longpoll import DeliveryNotifier
from api.metrics import (
    ClusterCollector,
    EngineCollector,
    HttpMetrics,
    HttpMetricsMiddleware,
    StreamPushCollector,
)
from api.openapi import install_openapi
from api.problems import UnexpectedErrors, install_problem_handlers
from api.push import StreamPusher
from api.routes import (
    check_callbacks,
    consume,
    dashboard,
    docs,
    groups,
    messages,
    operations,
    stream,
    transactions,
    ui,
)
from scheduler.broker import Broker

log = logging.getLogger("hourglass.api")

DESCRIPTION = """\
A durable server for delayed, scheduled and transactional messages.

Send a message for later (an absolute time, a delay, or a RocketMQ 4.x delay level), cancel
it, or send it as a half message inside a local transaction; consumers read each topic's
ordered log by offset or by group. Errors are RFC 9457 problem documents
(`application/problem+json`) with a stable `code`.
"""


def _version() -> str:
    try:
        return metadata.version("hourglass")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def create_app(engine: Broker, *, auth: Authenticator, limits: ApiLimits) -> FastAPI:
    """The HTTP app over ``engine``, authenticating with ``auth``, enforcing ``limits``.
    Starting the app starts the engine; stopping it closes the engine."""
    notifier = DeliveryNotifier(max_polls=limits.max_long_polls,
                                max_per_owner=limits.max_long_polls_per_token)
    pusher = StreamPusher()  # streams' frames written by the committing thread
    ctx = ApiContext(limits=limits, broker=engine, auth=auth, notifier=notifier,
                     pusher=pusher)
    registry = CollectorRegistry(auto_describe=True)
    http_metrics = HttpMetrics(registry)
    registry.register(EngineCollector(engine.metrics, ready=lambda: engine.ready,
                                      refresh=engine.recount_applied))
    registry.register(StreamPushCollector(pusher.totals))
    GCCollector(registry=registry)  # python_gc_*: the process's cyclic collections

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        notifier.bind(asyncio.get_running_loop())
        pusher.open()
        engine.add_delivery_listener(pusher.on_delivery)
        engine.add_delivery_listener(notifier.on_delivery)
        await run_in_threadpool(engine.start)  # recovery may replay the log: keep the loop free
        log.info("hourglass ready, data in %s", engine.config.data_dir)
        try:
            yield
        finally:
            ctx.release_waiters()  # first, so shutdown does not wait on them
            await run_in_threadpool(engine.close)
            if app.forwarder is not None:
                await app.forwarder.close()

    app = HourglassApp(
        title="hourglass", version=_version(), description=DESCRIPTION, lifespan=lifespan,
        # /docs is api/routes/docs.py: Swagger UI pinned, under a strict CSP
        openapi_url="/openapi.json", docs_url=None, redoc_url=None,
        # /metrics is the telemetry; FastAPI's OpenTelemetry hooks cost a check per request
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.ctx = ctx
    if engine.cluster is not None:  # cluster mode: writes reaching a follower go to the leader
        from api.forward import Forwarder

        app.forwarder = Forwarder(engine)
        cluster = engine.cluster
        registry.register(ClusterCollector(lambda: engine.role, lambda: engine.applied_seq,
                                           lambda: cluster.lag_ms,
                                           getattr(cluster, "apply_lag_ms", None)))
    install_problem_handlers(app)
    # one flat router, hot routes first: every included router costs a level of matching
    messages.add_routes(app.router, ctx)
    consume.add_routes(app.router, ctx)
    groups.add_routes(app.router, ctx)
    stream.add_routes(app.router, ctx)
    transactions.add_routes(app.router, ctx)
    operations.add_routes(app.router, ctx, registry)
    dashboard.add_routes(app.router, ctx)  # the dashboard: its API and its page
    ui.add_routes(app.router)
    docs.add_routes(app.router, app.title)
    app.include_router(check_callbacks.build_router(ctx))
    install_openapi(app)
    app.serve_hot(http_metrics, HOT_OPERATIONS | groups.HOT)  # api/hot.py: ahead of the rest
    app.add_middleware(HttpMetricsMiddleware, metrics=http_metrics)  # sees every other request
    app.add_middleware(UnexpectedErrors)  # outermost
    return app
