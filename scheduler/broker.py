"""The engine: one Broker object that the API and the CLI drive.

INTERFACE STUB — being implemented (issue 3). Signatures are the contract for api/ and app/.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from scheduler.clock import Clock
from scheduler.config import EngineConfig
from scheduler.model import (
    CancelResult,
    MessageInfo,
    PullResult,
    SendRequest,
    SendResult,
    TransactionCheck,
    TransactionResult,
)


class Broker:
    def __init__(self, config: EngineConfig, clock: Clock | None = None) -> None:
        raise NotImplementedError

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Open storage, recover (replay the log past the applied position), start threads."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop intake, drain or hand back in-memory work, flush, close storage."""
        raise NotImplementedError

    @property
    def ready(self) -> bool:
        """Storage open, recovery done, delivery stage not blocked by failures."""
        raise NotImplementedError

    def drain(self, timeout_s: float = 30.0) -> None:
        """Block until every message due at the clock's current time is in the log."""
        raise NotImplementedError

    # --- producing ------------------------------------------------------------------------
    def send(self, request: SendRequest) -> SendResult:
        """Raises InvalidArgument / DelayTooLong / Unavailable (storage.errors)."""
        raise NotImplementedError

    def send_batch(self, requests: Sequence[SendRequest]) -> list[SendResult]:
        """All requests are validated before anything is stored; one atomic write."""
        raise NotImplementedError

    def cancel_by_handle(self, handle: str) -> CancelResult:
        """Raises NotFound, AlreadyDelivered."""
        raise NotImplementedError

    def cancel(self, topic: str, msg_id: str) -> CancelResult:
        """Raises NotFound, AlreadyDelivered."""
        raise NotImplementedError

    def status(self, topic: str, msg_id: str) -> MessageInfo:
        """Raises NotFound."""
        raise NotImplementedError

    def list_scheduled(
        self, topic: str, *, from_ms: int | None, to_ms: int | None, limit: int,
        cursor: str | None,
    ) -> tuple[list[MessageInfo], str | None]:
        """Pending messages of ``topic`` by deliver time; returns (page, next cursor or None)."""
        raise NotImplementedError

    # --- consuming ------------------------------------------------------------------------
    def pull(self, topic: str, offset: int, max_messages: int) -> PullResult:
        raise NotImplementedError

    def end_offset(self, topic: str) -> int:
        """The next queue offset of ``topic`` (number of messages delivered to it)."""
        raise NotImplementedError

    def add_delivery_listener(self, listener: Callable[[Collection[str]], None]) -> None:
        """``listener(topics)`` is called from the delivery thread after each commit."""
        raise NotImplementedError

    def get_group_offset(self, topic: str, group: str) -> int:
        raise NotImplementedError

    def commit_group_offset(self, topic: str, group: str, offset: int) -> int:
        raise NotImplementedError

    # --- transactions (issue 5) -------------------------------------------------------------
    def prepare_transaction(
        self, request: SendRequest, *, producer_group: str,
        check_immunity_seconds: str | float | None = None,
    ) -> TransactionResult:
        """Store a half message (invisible to consumers). RocketMQ immunity rule:
        max(check_immunity_seconds parsed as RocketMQ does, transaction timeout)."""
        raise NotImplementedError

    def commit_transaction(self, transaction_id: str) -> TransactionResult:
        """Idempotent; raises NotFound, Conflict (after a rollback)."""
        raise NotImplementedError

    def rollback_transaction(self, transaction_id: str) -> TransactionResult:
        """Idempotent; raises NotFound, Conflict (after a commit)."""
        raise NotImplementedError

    def poll_transaction_checks(self, producer_group: str, max_checks: int) -> list[TransactionCheck]:
        """Prepared messages of the group whose immunity passed and next check is due; each
        returned check counts; past the maximum the message is DISCARDED."""
        raise NotImplementedError

    def snapshot(self) -> dict[str, Any]:
        """RocksDB checkpoint + manifest: {"snapshotId", "path", "createdAt"}."""
        raise NotImplementedError

    # --- operations -----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Pending count, delivered/cancelled totals, watermarks, delivery lag, log sizes."""
        raise NotImplementedError
