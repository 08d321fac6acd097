"""The dashboard's operations: the due timeline (maintained counts, scheduler/timeline.py),
the overview (stats + scheduler/overview.py) and the caller's identity."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from msgspec import UNSET
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from api import dashboard_schemas as ds
from api.auth import ROLE_PERMISSIONS, Permission
from api.context import ApiContext, Authenticated, respond
from api.openapi import operation
from api.schemas import TOPIC_REGEX
from scheduler.metrics import HistogramSnapshot
from scheduler.timeline import HOUR, MAX_BUCKETS, RESOLUTION_MS
from storage.errors import InvalidArgument

DEFAULT_BUCKETS = 60
DEFAULT_WINDOW_MS = 24 * HOUR
_EPOCH_MAX = 2**63 - 1
TIMELINE_PARAMETERS = frozenset({"from", "to", "buckets", "topic"})


def add_routes(router: APIRouter, ctx: ApiContext) -> None:
    broker = ctx.broker

    @router.get("/v1/admin/timeline", **operation(
        "getTimeline", tag="operations",
        summary="Pending messages by deliver time, per topic or in all (maintained counts)",
        result="Timeline", errors=(503,),
    ))
    async def timeline(
        request: Request, principal: Authenticated,
        from_ms: Annotated[int | None, Query(
            alias="from", ge=0, le=_EPOCH_MAX,
            description="Start of the window, epoch ms (default: now). The first bucket "
                        "starts here rounded down to its width's unit (a second, minute or "
                        "hour).")] = None,
        to_ms: Annotated[int | None, Query(
            alias="to", ge=0, le=_EPOCH_MAX,
            description="End of the window (exclusive), epoch ms (default: from + 24 h); "
                        "to - from is at most 3660 days.")] = None,
        buckets: Annotated[int, Query(
            ge=1, le=MAX_BUCKETS,
            description="At most this many buckets; the width is the narrowest of 1, 2, 5, "
                        "10, 15, 30 s / min, 1, 2, 3, 6, 12 h, 1, 2, 7, 14, 30, ... days "
                        "that fits.")] = DEFAULT_BUCKETS,
        topic: Annotated[str | None, Query(
            max_length=127, json_schema_extra={"pattern": TOPIC_REGEX},
            description="One topic (default: every topic).")] = None,
    ) -> Response:
        ctx.allow(principal, Permission.ADMIN, topic)
        unknown = set(request.query_params) - TIMELINE_PARAMETERS
        if unknown:  # a misspelt "form=" must not answer another window
            raise InvalidArgument(f"unknown query parameter(s) {sorted(unknown)}; known: "
                                  f"{sorted(TIMELINE_PARAMETERS)}")
        now = broker.clock.now_ms()
        start = now if from_ms is None else from_ms
        end = start + DEFAULT_WINDOW_MS if to_ms is None else to_ms
        view = broker.timeline(start, end, buckets, topic)  # from memory: on the loop
        return respond(ds.Timeline(
            topic=UNSET if view.topic is None else view.topic, start=view.start, end=view.end,
            bucket_ms=view.width_ms, resolution_ms=RESOLUTION_MS, counts=view.counts,
            pending=view.pending, now=now))

    @router.get("/v1/admin/overview", **operation(
        "getOverview", tag="operations",
        summary="What the dashboard shows: counters, lateness, disk use, topics, groups, "
                "transactions waiting for a check",
        result="Overview", errors=(503,),
    ))
    async def overview(principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.ADMIN)
        stats = await run_in_threadpool(broker.stats)
        extra = await run_in_threadpool(broker.overview)  # RocksDB seeks, a disk walk
        topics = sorted(set(extra.pending_by_topic) | set(extra.delivered_by_topic))
        groups = []
        for name, state in sorted(stats.groups.items()):
            topic, _, group = name.partition("/")
            groups.append(ds.GroupOverview(
                topic=topic, group=group, backlog=state.backlog, leased=state.leased,
                retrying=state.retrying, dead_lettered=state.dead_lettered))
        return respond(ds.Overview(
            now=broker.clock.now_ms(), ready=stats.ready,
            delivery_blocked=bool(broker.metrics.blocked.value), pending=stats.pending,
            scheduled=stats.scheduled, delivered=stats.delivered, cancelled=stats.cancelled,
            retries=stats.retries, parked=stats.parked,
            delivery_queue_batches=stats.delivery_queue_batches,
            delivery_queue_messages=stats.delivery_queue_messages,
            watermark_lag_ms=stats.watermark_lag_ms,
            transactions_prepared=stats.transactions_prepared,
            lateness=lateness(broker.metrics.lateness_ms.snapshot()),
            disk=ds.DiskUse(rocksdb_bytes=extra.disk_bytes["rocksdb"],
                            commitlog_bytes=extra.disk_bytes["commitlog"],
                            used_ratio=UNSET if extra.disk_used_ratio is None
                            else extra.disk_used_ratio,
                            free_bytes=UNSET if extra.disk_free_bytes is None
                            else extra.disk_free_bytes),
            topics=[_topic(t, extra.pending_by_topic.get(t), extra.delivered_by_topic.get(t, 0),
                           extra.first_by_topic.get(t, 0))
                    for t in topics],
            groups=groups,
            transactions=[ds.WaitingTransactions(producer_group=g, prepared=w.prepared,
                                                 due=w.due, next_check_at=w.next_check_at)
                          for g, w in extra.transactions.items()],
            transactions_truncated=extra.transactions_truncated))

    @router.get("/v1/whoami", **operation(
        "getCaller", tag="operations",
        summary="The bearer token's name, role, topic patterns and permissions",
        result="Caller",
    ))
    async def whoami(principal: Authenticated) -> Response:
        return respond(ds.Caller(
            name=principal.name, role=principal.role.value, topics=list(principal.patterns),
            permissions=sorted(p.value for p in ROLE_PERMISSIONS[principal.role])))


def lateness(snap: HistogramSnapshot) -> ds.Lateness:
    finite = [b for b in snap.buckets if b[0] != float("inf")]
    return ds.Lateness(
        count=snap.count, sum_ms=snap.sum,
        p50_ms=_finite(snap.quantile(0.5)) if snap.count else None,
        p99_ms=_finite(snap.quantile(0.99)) if snap.count else None,
        buckets=[*(ds.LatenessBucket(le=le, count=n) for le, n in finite),
                 ds.LatenessBucket(count=snap.count)])


def _finite(value: float) -> float | None:
    return None if value == float("inf") else value


def _topic(topic: str, pending: tuple[int, int] | None, delivered: int,
           first: int = 0) -> ds.TopicOverview:
    if pending is None:
        return ds.TopicOverview(topic=topic, pending=0, delivered=delivered,
                                first_offset=min(first, delivered))
    return ds.TopicOverview(topic=topic, pending=pending[0], oldest_pending_at=pending[1],
                            delivered=delivered, first_offset=min(first, delivered))
