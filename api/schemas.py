"""The wire schemas of the v1 contract, as msgspec Structs.

One definition serves three purposes: decoding + validating request bodies (JSON or msgpack,
~10x faster than pydantic), encoding responses, and the OpenAPI components (api/openapi.py
turns these Structs into JSON Schema). Field names are snake_case in Python and camelCase on
the wire (``rename="camel"``). Request Structs forbid unknown fields: a misspelt ``delay_ms``
must be a 400, not a message delivered now.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec
from fastapi import Path
from msgspec import UNSET, Meta, UnsetType

from scheduler.group_state import RECEIPTS_MAX
from scheduler.groups import LEASE_MS_MAX, LEASE_MS_MIN
from storage.constants import (
    GROUP_PATTERN,
    MAX_BATCH_MESSAGES,
    MAX_PULL_MESSAGES,
    MSG_ID_PATTERN,
    TOPIC_REGEX,
)
from storage.records import MessageStatus

DEFAULT_PULL = 32
MAX_WAIT_MS = 30_000
DEFAULT_LEASE_MS = 30_000

EpochMs = Annotated[int, Meta(ge=0, description="Epoch milliseconds.",
                              examples=[1767225600000])]
Offset = Annotated[int, Meta(ge=0, description="Queue offset in the topic's log, from 0.",
                             examples=[42])]
#: The topic path parameter: checked by the handler after authentication (so a bad name is
#: TOPIC_INVALID, and an unauthenticated call is 401 whatever the name), documented here.
Topic = Annotated[str, Path(json_schema_extra={"pattern": TOPIC_REGEX},
                            description="Topic name; system topics cannot be sent to.")]
#: The same, for the hot routes that read the topic from the path themselves.
TOPIC_PARAMETER = {"name": "topic", "in": "path", "required": True,
                   "description": "Topic name; system topics cannot be sent to.",
                   "schema": {"type": "string", "pattern": TOPIC_REGEX}}
#: msgspec matches with Python's re: the \Z forms (api/openapi.py documents them as ^...$)
MsgId = Annotated[str, Meta(pattern=MSG_ID_PATTERN.pattern, examples=["order-42"])]
Text = Annotated[str, Meta(max_length=4096)]


class _In(msgspec.Struct, rename="camel", kw_only=True, forbid_unknown_fields=True, gc=False):
    """Base of request bodies."""


class _Out(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True, gc=False):
    """Base of response bodies; UNSET fields are left out. Untracked by the cyclic GC (their
    fields are plain data), so a pull of 1000 does not set off collections."""


class MessageIn(_In, kw_only=True):
    """A message to send: exactly one of `body` / `bodyBase64`, and at most one timing
    field (`deliverAt`, `delayMs`, `delayLevel`). With none, the RocketMQ properties `DELAY`,
    `TIMER_DELIVER_MS`, `TIMER_DELAY_MS`, `TIMER_DELAY_SEC` are honoured; else: now."""

    body: Annotated[str, Meta(description="The body as UTF-8 text.",
                              examples=["hello"])] | UnsetType = UNSET
    body_base64: Annotated[bytes, Meta(description="The body as base64 bytes.",
                                       examples=["aGVsbG8="])] | UnsetType = UNSET
    tags: Annotated[str, Meta(max_length=1024, examples=["TagA"])] | UnsetType = UNSET
    keys: Annotated[list[Annotated[str, Meta(max_length=1024)]],
                    Meta(max_length=64, examples=[["order-42"]])] | UnsetType = UNSET
    properties: Annotated[dict[Annotated[str, Meta(min_length=1, max_length=256)], Text],
                          Meta(max_length=128, description="String to string.",
                               examples=[{"region": "eu"}])] | UnsetType = UNSET
    msg_id: Annotated[MsgId, Meta(
        description="Client id; makes the send idempotent per topic. Generated if absent."
    )] | UnsetType = UNSET
    deliver_at: Annotated[int, Meta(ge=0, description="Deliver at this epoch ms.",
                                    examples=[1767225600000])] | UnsetType = UNSET
    delay_ms: Annotated[int, Meta(ge=0, description="Deliver after this many ms.",
                                  examples=[30000])] | UnsetType = UNSET
    delay_level: Annotated[int, Meta(
        ge=1, description="RocketMQ 4.x delay level, 1-based (above the highest: clamped).",
        examples=[3],
    )] | UnsetType = UNSET


class BatchIn(_In, kw_only=True):
    messages: Annotated[list[MessageIn], Meta(min_length=1, max_length=MAX_BATCH_MESSAGES)]


class TransactionIn(MessageIn, kw_only=True):
    """A half message: `MessageIn` plus the producer group that answers check-backs."""

    producer_group: Annotated[str, Meta(pattern=GROUP_PATTERN.pattern,
                                        examples=["orders-producer"])]
    check_immunity_seconds: Annotated[float | str, Meta(
        description="First check-back no earlier than this many seconds, as RocketMQ's "
                    "CHECK_IMMUNITY_TIME_IN_SECONDS: a number or a string; a value that is not "
                    "a whole number, or below the transaction timeout (6 s), means 6 s.",
        examples=[60, "7"],
    )] | UnsetType = UNSET


class GroupOffsetIn(_In, kw_only=True):
    offset: Offset


class CancelOutcome(_Out, kw_only=True):
    """What a cancel marker did to the message its `TIMER_DEL_UNIQKEY` property names."""

    msg_id: MsgId
    status: Annotated[str, Meta(
        description="As a cancel by id would answer: CANCELLED (it will never be delivered), "
                    "ALREADY_DELIVERED, NOT_FOUND, or CONFLICT (a transactional message).",
        examples=["CANCELLED", "ALREADY_DELIVERED", "NOT_FOUND", "CONFLICT"])]


class SendResult(_Out, kw_only=True):
    msg_id: MsgId
    topic: str
    deliver_at: EpochMs
    status: MessageStatus
    cancel_handle: Annotated[str, Meta(description="Opaque; DELETE /v1/scheduled/{handle}.")]
    duplicate: Annotated[bool, Meta(
        description="True when (topic, msgId) was sent before: this is the first result.")]
    cancel: Annotated[CancelOutcome, Meta(
        description="Only for a cancel marker (a message whose property TIMER_DEL_UNIQKEY "
                    "names a msgId, or topic+msgId, of the same topic): what it did to that "
                    "message. The marker itself is never stored nor delivered (status "
                    "CANCELLED).")] | UnsetType = UNSET


class BatchResult(_Out, kw_only=True):
    results: list[SendResult]


class BatchSummary(_Out, kw_only=True):
    """The answer to a batch sent with `Prefer: return=minimal` (RFC 7240): every message is
    stored, as with `BatchResult`, but the answer names only the duplicates."""

    count: Annotated[int, Meta(ge=1, description="Messages in the batch, all stored.")]
    duplicates: Annotated[list[int], Meta(
        description="0-based positions in the request of the messages whose (topic, msgId) "
                    "was sent before (their first send stands), in ascending order.")]


class CancelResult(_Out, kw_only=True):
    msg_id: MsgId
    topic: str
    status: MessageStatus


class MessageInfo(_Out, kw_only=True):
    msg_id: MsgId
    topic: str
    status: MessageStatus
    deliver_at: EpochMs
    offset: Offset | UnsetType = UNSET


class ScheduledPage(msgspec.Struct, rename="camel", kw_only=True):
    messages: list[MessageInfo]
    next_cursor: Annotated[str | None, Meta(
        description="Pass as `cursor` for the next page; null on the last page.")]


class Delivered(_Out, kw_only=True):
    """(``keys`` and ``properties`` take the stored record's tuple and dict as they are: a
    new list per message would be 1000 GC-tracked objects per pull; same JSON schema.)"""

    offset: Offset
    msg_id: MsgId
    topic: str
    tags: str | None
    keys: tuple[str, ...]
    properties: Mapping[str, str]
    body_base64: Annotated[bytes, Meta(description=(
        "The body's bytes. Absent only when the request asked for `Prefer: body=once` and "
        "the body is UTF-8 text (then `body` carries it)."))] | UnsetType = UNSET
    body: Annotated[str, Meta(description=(
        "Present when the body is valid UTF-8 (with `Prefer: body=once`, instead of "
        "`bodyBase64`)."))] | UnsetType = UNSET
    born_at: EpochMs
    deliver_at: EpochMs
    stored_at: Annotated[int, Meta(ge=0, description="When it was written to the log; "
                                                     "storedAt - deliverAt is its lateness.")]


class PullResult(_Out, kw_only=True):
    messages: list[Delivered]
    next_offset: Offset


class GroupOffset(_Out, kw_only=True):
    offset: Offset


class TopicInfo(_Out, kw_only=True):
    """A topic's log: offsets [firstOffset, endOffset) can be read; below firstOffset the
    log's retention deleted them (a read there is 410 OFFSET_EXPIRED)."""

    topic: Annotated[str, Meta(examples=["orders"])]
    first_offset: Offset
    end_offset: Offset
    pending: Annotated[int, Meta(ge=0, description="Messages waiting to be delivered to it.")]


# --- consumer groups with competing members (api/routes/groups.py) ---------------------------
Receipt = Annotated[str, Meta(min_length=1, max_length=64, description="Opaque, from a receive.")]
Receipts = Annotated[list[Receipt], Meta(min_length=1, max_length=RECEIPTS_MAX)]


class ReceiveIn(_In, kw_only=True):
    max: Annotated[int, Meta(ge=1, le=MAX_PULL_MESSAGES,
                             description="At most this many messages.")] = DEFAULT_PULL
    wait_ms: Annotated[int, Meta(ge=0, le=MAX_WAIT_MS, description=(
        "Wait up to this long for a first message (long poll)."))] = 0
    lease_ms: Annotated[int, Meta(ge=LEASE_MS_MIN, le=LEASE_MS_MAX, description=(
        "How long the messages stay leased to this caller."))] = DEFAULT_LEASE_MS
    ack: Annotated[Receipts, Meta(description=(
        "Acknowledge these receipts first, durably, exactly as `:ack` does, then receive: "
        "a consumer that acknowledges what it processed makes one request per batch. The "
        "answer's `acked` and `stale` say what the acknowledgement did."))] | UnsetType = UNSET


class AckIn(_In, kw_only=True):
    receipts: Receipts


class NackIn(_In, kw_only=True):
    """At most one of `delayLevel` / `delayMs`; with none, RocketMQ's reconsume delay:
    level 3 + reconsumeTimes."""

    receipts: Receipts
    delay_level: Annotated[int, Meta(ge=1, description="RocketMQ 4.x delay level.")] | (
        UnsetType) = UNSET
    delay_ms: Annotated[int, Meta(ge=0, description="Retry after this many ms.")] | (
        UnsetType) = UNSET


class RedriveIn(_In, kw_only=True):
    max: Annotated[int, Meta(ge=1, le=MAX_PULL_MESSAGES,
                             description="At most this many.")] = MAX_PULL_MESSAGES


class Received(Delivered, kw_only=True):
    """A leased message: `Delivered` (as its topic knows it, also when it is a retry) plus
    the receipt to ack or nack it with."""

    receipt: Receipt
    delivery_count: Annotated[int, Meta(ge=1, description=(
        "Times handed out since its last nack (an expired lease counts; a restart resets)."))]
    reconsume_times: Annotated[int, Meta(ge=0, description="Times nacked so far.")]


class ReceiveResult(_Out, kw_only=True):
    messages: list[Received]
    lease_until: EpochMs
    acked: Annotated[int, Meta(ge=0, description=(
        "With `ack` in the request: how many it acknowledged."))] | UnsetType = UNSET
    stale: Annotated[list[str], Meta(description=(
        "With `ack` in the request: receipts that changed nothing."))] | UnsetType = UNSET


class AckResult(msgspec.Struct, rename="camel", kw_only=True):
    acked: Annotated[int, Meta(ge=0)]
    stale: Annotated[list[str], Meta(description=(
        "Receipts that changed nothing: their message was leased again or is acknowledged."))]


class NackResult(msgspec.Struct, rename="camel", kw_only=True):
    retrying: Annotated[int, Meta(ge=0, description="Scheduled back to the group.")]
    dead_lettered: Annotated[int, Meta(ge=0, description="Past maxReconsumeTimes.")]
    stale: list[str]


class GroupState(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    committed_offset: Offset
    end_offset: Offset
    leased: Annotated[int, Meta(ge=0)]
    retrying: Annotated[int, Meta(ge=0)]
    dead_lettered: Annotated[int, Meta(ge=0)]
    expired: Annotated[int, Meta(ge=0, description=(
        "Messages the group lost to the log's retention: its committed offset fell below the "
        "topic's firstOffset and it went on from there (left out while 0)."))] = 0


class DeadLetter(Delivered, kw_only=True):
    reconsume_times: Annotated[int, Meta(ge=0)]


class DeadLetterPage(_Out, kw_only=True):
    messages: list[DeadLetter]
    next_offset: Annotated[int, Meta(ge=0, description="Offset in the dead-letter log.")]


class RedriveResult(msgspec.Struct, rename="camel", kw_only=True):
    redriven: Annotated[int, Meta(ge=0)]


class TransactionResult(_Out, kw_only=True):
    transaction_id: str
    msg_id: MsgId
    topic: str
    status: Annotated[str, Meta(examples=["PREPARED", "COMMITTED", "ROLLED_BACK", "DISCARDED"])]
    deliver_at: EpochMs | UnsetType = UNSET
    duplicate: Annotated[bool, Meta(
        description="True when this prepare repeats an earlier one of the same producer group "
                    "(answered 200 with the first transaction).")] = False
    cancel: Annotated[CancelOutcome, Meta(
        description="The commit of a cancel marker: what it did to the message it names."
    )] | UnsetType = UNSET


class TransactionCheck(_Out, kw_only=True):
    transaction_id: str
    msg_id: MsgId
    topic: str
    producer_group: str
    check_times: Annotated[int, Meta(ge=0)]
    prepared_at: EpochMs
    tags: str | None
    keys: list[str]
    properties: dict[str, str]
    body_base64: bytes
    body: str | UnsetType = UNSET


class TransactionChecks(_Out, kw_only=True):
    checks: list[TransactionCheck]


class Snapshot(msgspec.Struct, rename="camel", kw_only=True):
    snapshot_id: str
    path: str
    created_at: EpochMs


class ParkedMessage(_Out, kw_only=True):
    """A due message that cannot be delivered for a reason of its own (too big for a
    CommitLog segment, undecodable), parked so that the others go on."""

    topic: str
    msg_id: str
    deliver_at: EpochMs
    reason: str
    size: Annotated[int, Meta(ge=0, description="Bytes of the stored message.")]


class ParkedMessages(_Out, kw_only=True):
    messages: list[ParkedMessage]


class Redriven(_Out, kw_only=True):
    redriven: Annotated[int, Meta(ge=0)]


class Health(_Out, kw_only=True):
    status: Annotated[str, Meta(examples=["ok"])]


class ClusterLeader(_Out, kw_only=True):
    node_id: Annotated[str, Meta(examples=["n1"])]
    url: Annotated[str, Meta(examples=["http://127.0.0.1:7741"])]


class ClusterMember(_Out, kw_only=True):
    """A node as it last told the cluster (about once a second); role ``unreachable`` once
    it has been silent for 3 s."""

    node_id: Annotated[str, Meta(examples=["n2"])]
    url: str | None
    role: Annotated[str, Meta(examples=["follower", "unreachable"])]
    applied_seq: int
    lag_ms: int


class ClusterView(_Out, kw_only=True):
    """This node's role, the leader it knows, the write-ahead sequence it applied, and every
    node of the cluster (single-node mode: role leader, no leader, sequence 0, no nodes)."""

    node_id: Annotated[str, Meta(examples=["n1"])]
    role: Annotated[str, Meta(examples=["leader", "follower", "starting"])]
    leader: ClusterLeader | None
    applied_seq: int
    nodes: list[ClusterMember]


class Problem(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An RFC 9457 problem document."""

    type: Annotated[str, Meta(examples=["urn:hourglass:problem:invalid-argument"])]
    title: Annotated[str, Meta(examples=["Invalid argument"])]
    status: Annotated[int, Meta(examples=[400])]
    detail: Annotated[str, Meta(examples=["exactly one of body and bodyBase64 is required"])]
    code: Annotated[str, Meta(examples=["INVALID_ARGUMENT"])]
    firstOffset: Annotated[int, Meta(ge=0, description=(
        "OFFSET_EXPIRED only: the topic's first offset still in the log."))] | UnsetType = UNSET


#: Every Struct that appears in the OpenAPI document (the rest are reached through these).
COMPONENTS: tuple[Any, ...] = (
    MessageIn, BatchIn, TransactionIn, GroupOffsetIn, CancelOutcome, SendResult, BatchResult,
    BatchSummary, CancelResult,
    MessageInfo, ScheduledPage, PullResult, GroupOffset, TopicInfo, TransactionResult,
    TransactionChecks, Snapshot, Health, Problem, ReceiveIn, AckIn, NackIn, RedriveIn,
    ReceiveResult, AckResult, NackResult, GroupState, DeadLetterPage, RedriveResult,
    ParkedMessages, Redriven, ClusterView,
)


def utf8_text(body: bytes) -> str | UnsetType:
    """The body as text when it is valid UTF-8 (for ``body`` beside ``bodyBase64``)."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return UNSET


def body_fields(body: bytes, once: bool = False) -> tuple[bytes | UnsetType, str | UnsetType]:
    """A delivered message's ``body_base64`` and ``body`` (UNSET: left out): the bytes, and
    the text when they are UTF-8; ``once`` (``Prefer: body=once``): the text when they are,
    else the bytes."""
    text = utf8_text(body)
    return (UNSET, text) if once and text is not UNSET else (body, text)
