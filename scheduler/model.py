"""The engine's public records: what the API and CLI send in and get back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from storage.records import MessageStatus


@dataclass(frozen=True, kw_only=True, slots=True)
class SendRequest:
    """A validated ``MessageIn``. At most one of deliver_at / delay_ms / delay_level is set;
    when none is, the RocketMQ properties DELAY, TIMER_DELIVER_MS, TIMER_DELAY_MS,
    TIMER_DELAY_SEC are honoured (a level wins over the timer properties); else: now."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    msg_id: str | None = None  # None: the engine generates one
    deliver_at: int | None = None
    delay_ms: int | None = None
    delay_level: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class SendResult:
    msg_id: str
    topic: str
    deliver_at: int
    status: MessageStatus  # SCHEDULED or DELIVERED
    cancel_handle: str
    duplicate: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class CancelResult:
    msg_id: str
    topic: str
    status: MessageStatus  # CANCELLED; ALREADY_DELIVERED is raised as errors.AlreadyDelivered


@dataclass(frozen=True, kw_only=True, slots=True)
class MessageInfo:
    msg_id: str
    topic: str
    status: MessageStatus
    deliver_at: int
    offset: int | None = None  # queue offset once delivered


@dataclass(frozen=True, kw_only=True, slots=True)
class Delivered:
    offset: int
    msg_id: str
    topic: str
    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    properties: Mapping[str, str]
    born_at: int
    deliver_at: int
    stored_at: int


@dataclass(frozen=True, kw_only=True, slots=True)
class PullResult:
    messages: list[Delivered]
    next_offset: int


@dataclass(frozen=True, kw_only=True, slots=True)
class TransactionResult:
    transaction_id: str
    msg_id: str
    topic: str
    status: str  # PREPARED, COMMITTED, ROLLED_BACK, DISCARDED
    deliver_at: int | None = None  # set once committed
    duplicate: bool = False  # a re-sent prepare of the same (topic, msgId): the first result


@dataclass(frozen=True, kw_only=True, slots=True)
class TransactionCheck:
    """A prepared message whose producer must say COMMIT, ROLLBACK or UNKNOWN."""

    transaction_id: str
    msg_id: str
    topic: str
    producer_group: str
    check_times: int
    prepared_at: int
    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    properties: Mapping[str, str]
