"""Transactions (half messages): prepare, commit, roll back, check-back polling.

Commit, rollback and check-back polling name no topic in their path: commit and rollback
need the producer role on the transaction's topic (a transaction of a topic the token may not
use is 404, as if unknown: nothing is revealed), and a check-back poll hands the caller only
checks of topics it may send to (docs/api.md).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from msgspec import UNSET
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from api import schemas
from api.auth import Permission, Principal, Role
from api.bodies import decode, read_body, to_send_request
from api.context import ApiContext, Authenticated, respond
from api.openapi import operation
from api.schemas import Topic
from scheduler import model
from scheduler.transactions import MAX_CHECKS_PER_POLL
from storage.constants import GROUP_REGEX
from storage.errors import NotFound

TransactionId = Annotated[str, Path(alias="transactionId", min_length=1, max_length=256,
                                    description="From the prepare result.")]


def transaction_result(result: model.TransactionOutcome) -> schemas.TransactionResult:
    out = schemas.TransactionResult(transaction_id=result.transaction_id, msg_id=result.msg_id,
                                    topic=result.topic, status=result.status,
                                    duplicate=result.duplicate)
    if result.deliver_at is not None:
        out.deliver_at = result.deliver_at
    if result.cancel is not None:
        out.cancel = schemas.CancelOutcome(msg_id=result.cancel.msg_id,
                                           status=result.cancel.status)
    return out


def transaction_check(check: model.PendingCheck) -> schemas.TransactionCheck:
    return schemas.TransactionCheck(
        transaction_id=check.transaction_id, msg_id=check.msg_id, topic=check.topic,
        producer_group=check.producer_group, check_times=check.check_times,
        prepared_at=check.prepared_at, tags=check.tags, keys=list(check.keys),
        properties=dict(check.properties), body_base64=check.body,
        body=schemas.utf8_text(check.body),
    )


def add_routes(router: APIRouter, ctx: ApiContext) -> None:
    broker = ctx.broker

    def check_owner(principal: Principal, transaction_id: str) -> None:
        """NotFound, exactly as for an unknown id, unless the token may use the topic."""
        ctx.allow(principal, Permission.TRANSACT)
        if not principal.may_use_topic(broker.transactions.get(transaction_id).topic):
            raise NotFound(f"unknown transaction {transaction_id!r}")

    @router.post("/v1/topics/{topic}/transactions", **operation(
        "prepareTransaction", tag="transactions", ok=201,
        summary="Prepare a half message (invisible until committed)",
        result="TransactionResult", body="TransactionIn", errors=(503,),
    ))
    async def prepare_transaction(topic: Topic, request: Request,
                                  principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.SEND, topic, sending=True)
        raw = await read_body(request, ctx.limits.max_request_bytes)
        body = decode(raw, request.headers.get("content-type"), schemas.TransactionIn)
        immunity = None if body.check_immunity_seconds is UNSET else body.check_immunity_seconds
        result = await ctx.write(lambda: broker.transactions.prepare(
            to_send_request(body, topic), producer_group=body.producer_group,
            check_immunity_seconds=immunity,
        ))
        return respond(transaction_result(result), 200 if result.duplicate else 201)

    @router.post("/v1/transactions/{transactionId}/commit", **operation(
        "commitTransaction", tag="transactions",
        summary="Commit: the message is scheduled by its own timing",
        result="TransactionResult", errors=(404, 409, 503),
    ))
    async def commit_transaction(transaction_id: TransactionId,
                                 principal: Authenticated) -> Response:
        check_owner(principal, transaction_id)
        return respond(transaction_result(
            await ctx.write(broker.transactions.commit, transaction_id)))

    @router.post("/v1/transactions/{transactionId}/rollback", **operation(
        "rollbackTransaction", tag="transactions", summary="Roll back: never delivered",
        result="TransactionResult", errors=(404, 409, 503),
    ))
    async def rollback_transaction(transaction_id: TransactionId,
                                   principal: Authenticated) -> Response:
        check_owner(principal, transaction_id)
        return respond(transaction_result(
            await ctx.write(broker.transactions.rollback, transaction_id)))

    @router.get("/v1/producer-groups/{group}/transaction-checks", **operation(
        "pollTransactionChecks", tag="transactions",
        summary="Check-back: prepared messages whose producer must decide",
        result="TransactionChecks", errors=(503,),
    ))
    async def poll_transaction_checks(
        group: Annotated[str, Path(pattern=GROUP_REGEX, description="Producer group.")],
        principal: Authenticated,
        max_checks: Annotated[int, Query(alias="max", ge=1, le=MAX_CHECKS_PER_POLL)]
        = schemas.DEFAULT_PULL,
    ) -> Response:
        ctx.allow(principal, Permission.TRANSACT)
        # a poll scans the group's checks under the commit lock: keep the event loop free
        may_see = None if principal.role is Role.ADMIN else principal.may_use_topic
        checks = await run_in_threadpool(broker.transactions.poll_checks, group, max_checks,
                                         may_see=may_see)
        return respond(schemas.TransactionChecks(checks=[transaction_check(c) for c in checks]))

