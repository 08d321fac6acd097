"""Wire schemas of the dashboard's operations (api/routes/dashboard.py): the due timeline, the
overview and the caller's identity. msgspec Structs like api/schemas.py, and OpenAPI
components through ``DASHBOARD_COMPONENTS`` (api/openapi.py adds them)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType

from api.schemas import EpochMs, _Out

Count = Annotated[int, Meta(ge=0)]


class Timeline(_Out, kw_only=True):
    """Pending messages by deliver time: ``counts[i]`` messages are due in
    [from + i * bucketMs, from + (i+1) * bucketMs)."""

    topic: str | UnsetType = UNSET  # absent: every topic
    start: EpochMs = msgspec.field(name="from")
    end: EpochMs = msgspec.field(name="to")
    bucket_ms: Annotated[int, Meta(ge=1_000, description="Width of a bucket, ms.")]
    resolution_ms: Annotated[int, Meta(description="Counts are kept per this much deliverAt.")]
    counts: list[Count]
    pending: Annotated[int, Meta(description="Pending messages of the topic (or of every "
                                             "topic), inside the window or not.")]
    now: Annotated[int, Meta(description="The server's clock, epoch ms.")]


class LatenessBucket(_Out, kw_only=True):
    """Cumulative: ``count`` deliveries were at most ``le`` ms late (absent: no bound)."""

    le: float | UnsetType = UNSET
    count: Count


class Lateness(_Out, kw_only=True):
    """storedAt - deliverAt of the messages delivered since the server started."""

    count: Count
    sum_ms: float
    p50_ms: float | None
    p99_ms: float | None
    buckets: list[LatenessBucket]


class TopicOverview(_Out, kw_only=True):
    topic: str
    pending: Count
    oldest_pending_at: EpochMs | UnsetType = UNSET
    delivered: Annotated[int, Meta(ge=0, description="Messages in the topic's log: its end "
                                                     "offset.")]
    first_offset: Annotated[int, Meta(ge=0, description=(
        "The first offset the log still holds (its retention deleted those below)."))] = 0


class GroupOverview(_Out, kw_only=True):
    topic: str
    group: str
    backlog: Count
    leased: Count
    retrying: Count
    dead_lettered: Count


class WaitingTransactions(_Out, kw_only=True):
    producer_group: str
    prepared: Count
    due: Annotated[int, Meta(ge=0, description="Of which are due for a check-back now.")]
    next_check_at: EpochMs


class DiskUse(_Out, kw_only=True):
    rocksdb_bytes: Count
    commitlog_bytes: Count
    used_ratio: Annotated[float, Meta(ge=0, le=1, description=(
        "Used / size of the data directory's file system; past disk_clean_ratio the oldest "
        "CommitLog segments are deleted early."))] | UnsetType = UNSET
    free_bytes: Count | UnsetType = UNSET


class Overview(_Out, kw_only=True):
    """Everything the dashboard shows besides the timeline; the counters are those of
    ``getStats`` (totals since the server started: rates are their differences)."""

    now: EpochMs
    ready: bool
    delivery_blocked: bool
    pending: Count
    scheduled: Count
    delivered: Count
    cancelled: Count
    retries: Count
    parked: Count
    delivery_queue_batches: Count
    delivery_queue_messages: Count
    watermark_lag_ms: float
    transactions_prepared: Count
    lateness: Lateness
    disk: DiskUse
    topics: list[TopicOverview]
    groups: list[GroupOverview]
    transactions: list[WaitingTransactions]
    transactions_truncated: bool


class Caller(_Out, kw_only=True):
    """Who the bearer token is, and what it may do (the dashboard offers only that)."""

    name: str
    role: Annotated[str, Meta(examples=["producer"])]
    topics: list[str]
    permissions: list[str]


DASHBOARD_COMPONENTS: tuple[Any, ...] = (Timeline, Overview, Caller)

__all__ = ["DASHBOARD_COMPONENTS", "Caller", "DiskUse", "GroupOverview", "Lateness",
           "LatenessBucket", "Overview", "Timeline", "TopicOverview", "WaitingTransactions"]
