"""The check-back HTTP client: POSTs one check to a producer group's URL and reads the answer.

The payload is the check as the polling API returns it (docs/transactions.md), signed with
HMAC-SHA256 when the group registered a secret. The answer is COMMIT, ROLLBACK or UNKNOWN
(RocketMQ's LocalTransactionState names are accepted too). A timeout, a connection error, a
non-2xx status or an unreadable answer is UNKNOWN, and so is an answer over
``MAX_ANSWER_BYTES`` on the wire or decoded, or slower than the timeout as a whole; redirects
are not followed (they could leave the allow-list). The client never raises for HTTP trouble.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import logging
import threading
import time
import zlib
from typing import TYPE_CHECKING, Any

import orjson

from scheduler.checkback.registry import CallbackRegistration
from scheduler.model import PendingCheck

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Hourglass-Signature"
TIMESTAMP_HEADER = "X-Hourglass-Timestamp"
MAX_ANSWER_BYTES = 64 << 10  # a producer's answer is a few bytes; more is not read, neither
#                              on the wire (compressed) nor decoded
ACCEPT_ENCODING = "gzip, deflate"  # what _Inflater decodes, within MAX_ANSWER_BYTES


class CheckAnswer(enum.StrEnum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


# RocketMQ's LocalTransactionState names are accepted too
_ANSWERS = {
    "COMMIT": CheckAnswer.COMMIT, "COMMIT_MESSAGE": CheckAnswer.COMMIT,
    "ROLLBACK": CheckAnswer.ROLLBACK, "ROLLBACK_MESSAGE": CheckAnswer.ROLLBACK,
    "UNKNOWN": CheckAnswer.UNKNOWN, "UNKNOW": CheckAnswer.UNKNOWN,
}


def check_payload(check: PendingCheck) -> dict[str, Any]:
    """The JSON object POSTed for one check (camelCase, as the polling API returns it)."""
    payload: dict[str, Any] = {
        "transactionId": check.transaction_id, "msgId": check.msg_id, "topic": check.topic,
        "producerGroup": check.producer_group, "checkTimes": check.check_times,
        "preparedAt": check.prepared_at, "tags": check.tags, "keys": list(check.keys),
        "properties": dict(check.properties),
        "bodyBase64": base64.b64encode(check.body).decode("ascii"),
    }
    try:
        payload["body"] = check.body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    return payload


def parse_answer(response: httpx.Response) -> CheckAnswer:
    """COMMIT / ROLLBACK / UNKNOWN from a 2xx answer ``{"status": ...}`` (or a plain-text
    status); anything else is UNKNOWN."""
    if not response.is_success:
        return CheckAnswer.UNKNOWN
    text = response.text.strip()
    status: object = text
    if text.startswith("{"):
        try:
            status = orjson.loads(text).get("status")
        except (orjson.JSONDecodeError, AttributeError):
            return CheckAnswer.UNKNOWN
    if not isinstance(status, str):
        return CheckAnswer.UNKNOWN
    return _ANSWERS.get(status.strip().upper(), CheckAnswer.UNKNOWN)


def signature(secret: str, timestamp_ms: int, body: bytes) -> str:
    """``sha256=`` + hex HMAC-SHA256 over ``"<timestamp>." + body`` (the receiver recomputes
    it with the shared secret and may refuse stale timestamps)."""
    mac = hmac.new(secret.encode("utf-8"), str(timestamp_ms).encode("ascii") + b"." + body,
                   hashlib.sha256)
    return "sha256=" + mac.hexdigest()


class AnswerRefused(Exception):
    """The answer is over MAX_ANSWER_BYTES on the wire or decoded, or in a coding not
    offered: it is not read further (UNKNOWN)."""


class _Inflater:
    """Decodes an answer's Content-Encoding (none, gzip or deflate) chunk by chunk without
    ever holding more than ``limit`` decoded bytes: httpx's decoders inflate a whole chunk
    read off the socket at once (64 KiB of gzip can be 64 MiB), and count nothing."""

    def __init__(self, content_encoding: str, limit: int) -> None:
        codings = [c.strip().lower() for c in content_encoding.split(",")]
        codings = [c for c in codings if c and c != "identity"]
        if len(codings) > 1 or (codings and codings[0] not in ("gzip", "x-gzip", "deflate")):
            raise AnswerRefused(f"content-encoding {content_encoding!r} was not offered")
        self._coding = codings[0] if codings else None
        self._limit = limit
        self._size = 0
        self._raw_deflate = False
        self._inflate: Any = self._decompressor()

    def _decompressor(self) -> Any:
        if self._coding in ("gzip", "x-gzip"):
            return zlib.decompressobj(zlib.MAX_WBITS | 16)
        return zlib.decompressobj(-zlib.MAX_WBITS if self._raw_deflate else zlib.MAX_WBITS)

    def _count(self, out: bytes) -> bytes:
        self._size += len(out)
        if self._size > self._limit:
            raise AnswerRefused(f"more than {self._limit} bytes decoded")
        return out

    def feed(self, data: bytes) -> bytes:
        if self._coding is None:
            return self._count(data)
        room = self._limit - self._size + 1  # one byte past the limit tells it is too much
        try:
            out = self._inflate.decompress(data, room)
        except zlib.error:
            if self._coding != "deflate" or self._raw_deflate or self._size:
                raise
            # "deflate" is meant to be zlib-wrapped; some servers send raw deflate
            self._raw_deflate = True
            self._inflate = self._decompressor()
            out = self._inflate.decompress(data, room)
        return self._count(out)  # past the limit when decompress stopped at ``room``

    def finish(self) -> bytes:
        # all input was consumed below the limit: what is left in zlib is a few bytes at most
        return b"" if self._coding is None else self._count(self._inflate.flush())


class CheckbackClient:
    """POSTs one check and returns the producer's answer; never raises for HTTP trouble."""

    def __init__(self, *, timeout_ms: int, workers: int,
                 transport: httpx.BaseTransport | None = None) -> None:
        self._timeout_ms, self._workers, self._transport = timeout_ms, workers, transport
        self._http_client: httpx.Client | None = None  # made on the first check (TLS set-up
        self._lock = threading.Lock()  #                  costs ~0.1 s, most groups never need it)

    @property
    def _http(self) -> httpx.Client:
        import httpx  # here, not at import: ~0.1 s of every start, most never check back

        with self._lock:
            if self._http_client is None:
                self._http_client = httpx.Client(
                    timeout=httpx.Timeout(self._timeout_ms / 1000.0),
                    limits=httpx.Limits(max_connections=max(self._workers, 1)),
                    follow_redirects=False,  # a redirect could leave the allow-list
                    transport=self._transport,
                    headers={"User-Agent": "hourglass-checkback/1"},
                )
            return self._http_client

    def ask(self, reg: CallbackRegistration, check: PendingCheck, now_ms: int) -> CheckAnswer:
        import httpx

        body = orjson.dumps(check_payload(check))
        headers = {"Content-Type": "application/json", "Accept-Encoding": ACCEPT_ENCODING}
        if reg.secret is not None:
            headers[TIMESTAMP_HEADER] = str(now_ms)
            headers[SIGNATURE_HEADER] = signature(reg.secret, now_ms, body)
        deadline = time.monotonic() + self._timeout_ms / 1000.0
        try:
            with self._http.stream("POST", reg.url, content=body, headers=headers) as response:
                # whole answer within the deadline (a reply dripping byte by byte resets no
                # timeout here) and within MAX_ANSWER_BYTES both as sent (compressed) and
                # decoded; each read waits timeout_ms at most
                inflater = _Inflater(response.headers.get("content-encoding", ""),
                                     MAX_ANSWER_BYTES)
                answer, wire = bytearray(), 0
                for chunk in response.iter_raw():
                    wire += len(chunk)
                    if wire > MAX_ANSWER_BYTES:
                        raise AnswerRefused(f"more than {MAX_ANSWER_BYTES} bytes sent")
                    answer += inflater.feed(chunk)
                    if time.monotonic() > deadline:
                        log.info("check-back of %s to %s: the answer is too slow; UNKNOWN",
                                 check.transaction_id, reg.url)
                        return CheckAnswer.UNKNOWN
                answer += inflater.finish()
        except AnswerRefused as exc:
            log.info("check-back of %s to %s: the answer is refused (%s); UNKNOWN",
                     check.transaction_id, reg.url, exc)
            return CheckAnswer.UNKNOWN
        except zlib.error as exc:
            log.info("check-back of %s to %s: the answer does not decode (%s); UNKNOWN",
                     check.transaction_id, reg.url, exc)
            return CheckAnswer.UNKNOWN
        except httpx.HTTPError as exc:  # timeouts, refused connections, protocol errors
            log.info("check-back of %s to %s failed: %s", check.transaction_id, reg.url, exc)
            return CheckAnswer.UNKNOWN
        return parse_answer(httpx.Response(response.status_code, content=bytes(answer)))

    def close(self) -> None:
        with self._lock:
            if self._http_client is not None:
                self._http_client.close()
