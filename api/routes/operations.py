"""Operations: liveness, readiness, Prometheus metrics, engine stats, snapshots."""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import APIRouter
from prometheus_client import CollectorRegistry
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from api import schemas
from api.auth import Permission
from api.context import ApiContext, Authenticated, respond
from api.metrics import CONTENT_TYPE, render
from api.openapi import operation
from storage.errors import Unavailable


def camel_case(value: Any) -> Any:
    """An engine record as the wire writes it: a Struct's fields renamed to camelCase
    (``lateness_p50_ms`` -> ``latenessP50Ms``), in order, recursively; mapping keys (topics,
    groups, shard numbers) as they are."""
    if isinstance(value, msgspec.Struct):
        return {_camel(name): camel_case(getattr(value, name))
                for name in value.__struct_fields__}
    if isinstance(value, dict):
        return {key: camel_case(item) for key, item in value.items()}
    return value


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


def add_routes(router: APIRouter, ctx: ApiContext, registry: CollectorRegistry) -> None:
    broker = ctx.broker

    @router.get("/healthz", **operation(
        "getHealth", tag="operations", summary="Liveness: the process answers",
        result="Health", auth=False,
    ))
    async def healthz() -> Response:
        return respond(schemas.Health(status="ok"))

    @router.get("/readyz", **operation(
        "getReadiness", tag="operations",
        summary="Readiness: storage open and taking writes, recovery done, delivery not blocked",
        result="Health", auth=False, errors=(503,),
    ))
    async def readyz() -> Response:
        # off the event loop: while a full disk refuses writes, the check may reopen RocksDB
        if not await run_in_threadpool(lambda: broker.ready):
            raise Unavailable("the engine is not ready (starting, recovering, writes refused "
                              "for a full disk, or delivery blocked by storage failures)")
        return respond(schemas.Health(status="ready"))

    # no security requirement in the document: open unless the server says otherwise (a
    # requirement of "none or a token" makes schemathesis expect a 401 without one)
    @router.get("/metrics", **operation(
        "getMetrics", tag="operations", summary="Prometheus metrics (text format)",
        auth=False, errors=(401, 403), extra_responses={200: {
            "description": "Prometheus text exposition format 0.0.4. Open to anyone (it "
                           "names topics and groups) unless the server's "
                           "metrics_require_token is on: then an admin token only.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }},
    ))
    async def metrics(request: Request) -> Response:
        if ctx.limits.metrics_require_token:  # topic and group names are in the labels
            ctx.allow(ctx.caller(request), Permission.ADMIN)
        body = await run_in_threadpool(render, registry)  # engine stats may touch RocksDB
        return Response(body, media_type=CONTENT_TYPE)

    @router.get("/v1/admin/stats", **operation(
        "getStats", tag="operations",
        summary="Pending count, delivered/cancelled totals, watermarks, lag, log sizes",
        result="Stats", errors=(503,),
    ))
    async def stats(principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.ADMIN)
        return respond(camel_case(await run_in_threadpool(broker.stats)))

    @router.get("/v1/cluster", **operation(
        "getCluster", tag="operations",
        summary="This node's cluster role, the leader, applied sequence and lag of each node",
        result="ClusterView", errors=(503,),
    ))
    async def cluster(principal: Authenticated) -> Response:
        view = await run_in_threadpool(broker.cluster_view)  # reads the node bucket in NATS
        leader = view["leader"]
        return respond(schemas.ClusterView(
            node_id=view["nodeId"], role=view["role"], applied_seq=view["appliedSeq"],
            leader=None if leader is None else schemas.ClusterLeader(
                node_id=leader["nodeId"], url=leader["url"]),
            nodes=[schemas.ClusterMember(node_id=n["nodeId"], url=n["url"], role=n["role"],
                                         applied_seq=n["appliedSeq"], lag_ms=n["lagMs"])
                   for n in view["nodes"]]))

    @router.get("/v1/admin/parked", **operation(
        "listParked", tag="operations",
        summary="Due messages parked as undeliverable for a reason of their own",
        result="ParkedMessages", errors=(503,),
    ))
    async def list_parked(principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.ADMIN)
        parked = await run_in_threadpool(broker.quarantine.messages)
        return respond(schemas.ParkedMessages(messages=[schemas.ParkedMessage(
            topic=p.topic, msg_id=p.msg_id, deliver_at=p.deliver_at, reason=p.reason,
            size=p.size) for p in parked]))

    @router.post("/v1/admin/parked:redrive", **operation(
        "redriveParked", tag="operations",
        summary="Schedule every parked message again, due now (once the cause is fixed)",
        result="Redriven", errors=(503,),
    ))
    async def redrive_parked(principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.ADMIN)
        return respond(schemas.Redriven(redriven=await run_in_threadpool(
            broker.quarantine.redrive)))

    @router.post("/v1/admin/snapshots", **operation(
        "createSnapshot", tag="operations", ok=201,
        summary="Consistent RocksDB checkpoint for analytics",
        result="Snapshot", errors=(503,),
    ))
    async def create_snapshot(principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.ADMIN)
        return respond(await run_in_threadpool(broker.snapshot), 201)

