"""Check-back by callback: per-producer-group check URLs, and the thread that POSTs due checks.

An admin registers a URL for a producer group (its host must be on
``EngineConfig.transaction_callback_allowed_hosts``). The :class:`CheckbackDispatcher` thread
sleeps on the clock until the earliest next check of any group with a URL (or until woken by
a registration or a prepare), claims the due checks exactly as a poll does (each counts, the
next is due one check interval later, past the maximum the message is discarded), POSTs each
to the group's URL from a small worker pool, and applies the answer: COMMIT, ROLLBACK, or
UNKNOWN (nothing to do: the next check is already scheduled). A timeout, a connection error,
a non-2xx status or an unreadable answer counts as UNKNOWN. The payload is in
docs/transactions.md.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import logging
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import msgpack
import orjson

from scheduler.clock import Clock
from scheduler.model import TransactionCheck
from scheduler.tx_records import check_group, prefix_end
from storage.constants import CF_TX, TX_CALLBACK_PREFIX
from storage.errors import CorruptionError, InvalidArgument, NotFound
from storage.rocks import RocksStore

log = logging.getLogger(__name__)

MAX_UNANSWERED_PER_ROUND = 1000  # unanswered checks claimed per dispatch round at most
SIGNATURE_HEADER = "X-Hourglass-Signature"
TIMESTAMP_HEADER = "X-Hourglass-Timestamp"
_FORMAT_VERSION = 1


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


@dataclass(frozen=True, kw_only=True, slots=True)
class CallbackRegistration:
    producer_group: str
    url: str
    secret: str | None = None  # when set, each POST carries an HMAC-SHA256 signature
    registered_at: int = 0


# --- URL policy -----------------------------------------------------------------------------
DEFAULT_PORTS = frozenset({80, 443})
MAX_ANSWER_BYTES = 64 << 10  # a producer's answer is a few bytes; more is not read, neither
#                              on the wire (compressed) nor decoded
ACCEPT_ENCODING = "gzip, deflate"  # what _Inflater decodes, within MAX_ANSWER_BYTES


def _split_entry(entry: str) -> tuple[str, str | None]:
    """An allow-list entry as (host pattern, port or "*" or None): ``orders.internal``,
    ``*.example.com``, ``10.0.0.7:8080``, ``localhost:*``, ``[::1]:8443``."""
    entry = entry.lower().rstrip(".")
    head, sep, tail = entry.rpartition(":")
    if sep and (tail == "*" or (tail.isascii() and tail.isdigit())) and (
            ":" not in head or head.endswith("]")):
        return head.strip("[]"), tail if tail == "*" else str(int(tail))
    return entry.strip("[]"), None


def _host_matches(host: str, pattern: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def host_allowed(host: str, allowed_hosts: tuple[str, ...]) -> bool:
    """``host`` equals an entry's host (case-insensitively), or is a subdomain of a
    ``*.domain`` one."""
    host = host.lower().rstrip(".")
    return any(_host_matches(host, _split_entry(e)[0]) for e in allowed_hosts)


def port_allowed(host: str, port: int, allowed_hosts: tuple[str, ...]) -> bool:
    """80, 443, a port that an entry matching ``host`` names (``10.0.0.7:8080`` opens 8080
    on 10.0.0.7 only, not on the list's other hosts), or any port of a host whose entry says
    ``:*``."""
    if port in DEFAULT_PORTS:
        return True
    host = host.lower().rstrip(".")
    for pattern, entry_port in map(_split_entry, allowed_hosts):
        if entry_port in (str(port), "*") and _host_matches(host, pattern):
            return True
    return False


def url_refusal(url: str, allowed_hosts: tuple[str, ...]) -> str | None:
    """Why ``url`` may not be called back (its host or port), or None."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if not host_allowed(host, allowed_hosts):
        allowed = ", ".join(allowed_hosts) or "none: callbacks are disabled"
        return f"host {host!r} is not on the check-callback allow-list ({allowed})"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if not port_allowed(host, port, allowed_hosts):
        return (f"port {port} is not allowed for check callbacks (80, 443 and the ports "
                f"named in transaction_callback_allowed_hosts are)")
    return None


def validate_callback_url(url: str, allowed_hosts: tuple[str, ...]) -> str:
    """The URL if it is an absolute http(s) URL without credentials whose host is allowed;
    else InvalidArgument with the reason."""
    if not isinstance(url, str) or not url or len(url) > 2048:
        raise InvalidArgument("url must be a non-empty string of at most 2048 characters")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        raise InvalidArgument(f"url is not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise InvalidArgument("url must use http or https")
    if not parts.hostname:
        raise InvalidArgument("url must name a host")
    if parts.username is not None or parts.password is not None:
        raise InvalidArgument("url must not carry credentials")
    if parts.fragment:
        raise InvalidArgument("url must not have a fragment")
    del port
    refusal = url_refusal(url, allowed_hosts)
    if refusal is not None:
        raise InvalidArgument(refusal)
    return url


# --- the registry (tx column family, c/ + group) ----------------------------------------------
def _registration_key(group: str) -> bytes:
    return TX_CALLBACK_PREFIX + group.encode("utf-8")


def _encode_registration(reg: CallbackRegistration) -> bytes:
    return msgpack.packb((_FORMAT_VERSION, reg.url, reg.secret, reg.registered_at),
                         use_bin_type=True)


def _decode_registration(group: str, raw: bytes) -> CallbackRegistration:
    try:
        values = msgpack.unpackb(raw, raw=False, use_list=False)
        return CallbackRegistration(producer_group=group, url=values[1], secret=values[2],
                                    registered_at=values[3])
    except Exception as exc:  # garbage in a value: a corruption, not a crash
        raise CorruptionError(f"cannot decode the callback of group {group!r}: {exc}") from exc


class CallbackRegistry:
    """Persistent group -> URL map with an in-memory copy (read on every dispatch round)."""

    def __init__(self, store: RocksStore, allowed_hosts: tuple[str, ...], clock: Clock) -> None:
        self._store = store
        self._allowed_hosts = allowed_hosts
        self._clock = clock
        self._lock = threading.Lock()
        self._by_group: dict[str, CallbackRegistration] = {}
        for key, value in store.scan(CF_TX, TX_CALLBACK_PREFIX, prefix_end(TX_CALLBACK_PREFIX)):
            group = key[len(TX_CALLBACK_PREFIX):].decode("utf-8")
            self._by_group[group] = _decode_registration(group, value)

    def register(self, group: str, url: str, secret: str | None = None) -> CallbackRegistration:
        check_group(group)
        validate_callback_url(url, self._allowed_hosts)
        if secret is not None and not (isinstance(secret, str) and 16 <= len(secret) <= 256):
            raise InvalidArgument("secret must be a string of 16 to 256 characters")
        reg = CallbackRegistration(producer_group=group, url=url, secret=secret,
                                   registered_at=self._clock.now_ms())
        batch = self._store.batch()
        batch.put(CF_TX, _registration_key(group), _encode_registration(reg))
        with self._lock:
            self._store.write(batch)
            self._by_group[group] = reg
        return reg

    def get(self, group: str) -> CallbackRegistration:
        check_group(group)
        with self._lock:
            reg = self._by_group.get(group)
        if reg is None:
            raise NotFound(f"producer group {group!r} has no check callback")
        return reg

    def delete(self, group: str) -> CallbackRegistration:
        reg = self.get(group)
        batch = self._store.batch()
        batch.delete(CF_TX, _registration_key(group))
        with self._lock:
            self._store.write(batch)
            self._by_group.pop(group, None)
        return reg

    def snapshot(self) -> dict[str, CallbackRegistration]:
        with self._lock:
            return dict(self._by_group)

    def active(self) -> dict[str, CallbackRegistration]:
        """The registrations whose host and port the current allow-list still allows (the
        list may have shrunk since a URL was registered)."""
        return {group: reg for group, reg in self.snapshot().items()
                if url_refusal(reg.url, self._allowed_hosts) is None}

    def has(self, group: str) -> bool:
        with self._lock:
            return group in self._by_group


# --- the HTTP client ----------------------------------------------------------------------------
def check_payload(check: TransactionCheck) -> dict[str, Any]:
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

    def ask(self, reg: CallbackRegistration, check: TransactionCheck, now_ms: int) -> CheckAnswer:
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


# --- the dispatcher -----------------------------------------------------------------------------
class CheckSource(Protocol):
    """What the dispatcher needs from the transaction manager."""

    def poll_checks(self, producer_group: str, max_checks: int) -> list[TransactionCheck]: ...

    def next_check_at(self, producer_group: str) -> int | None: ...

    def apply_answer(self, transaction_id: str, answer: CheckAnswer) -> None: ...

    def claim_unanswered(self, limit: int) -> int | None: ...


class CheckbackDispatcher:
    """One thread that sleeps on the clock until a callback group's next check is due, then
    claims and hands the checks to ``workers`` POSTing threads (at most ``2 * workers`` in
    flight: claiming more would only make them older before they are sent)."""

    def __init__(self, source: CheckSource, registry: CallbackRegistry, clock: Clock, *,
                 timeout_ms: int, workers: int, client: CheckbackClient | None = None,
                 on_answer: Callable[[CheckAnswer], None] | None = None) -> None:
        if workers < 1:
            raise InvalidArgument("transaction_callback_workers must be >= 1")
        self._source = source
        self._registry = registry
        self._clock = clock
        self._client = client or CheckbackClient(timeout_ms=timeout_ms, workers=workers)
        self._on_answer = on_answer
        self._max_in_flight = 2 * workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="checkback")
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._in_flight = 0
        self._started = 0  # dispatch rounds begun
        self._idle_round = 0  # last round that ended with nothing due and nothing in flight
        self._rotation = 0
        self._thread = threading.Thread(target=self._run, name="checkback-dispatcher",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    def join(self, timeout_s: float = 30.0) -> None:
        """Block until a dispatch round that began after this call ended with no check due
        at the clock's time and no POST in flight (tests call it after advancing the clock)."""
        with self._cond:
            target = self._started + 1  # the next round to begin reads the clock after now
        self._wake.set()
        with self._cond:
            if not self._cond.wait_for(
                    lambda: self._idle_round >= target or self._stop.is_set(), timeout_s):
                raise TimeoutError("check-back dispatcher did not become idle")

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            with self._cond:
                self._started += 1
                number = self._started
            try:
                deadline, idle = self._round()
            except Exception:  # storage trouble: keep the thread, retry after a pause
                log.exception("check-back dispatch round failed")
                deadline, idle = self._clock.now_ms() + 1000, False
            with self._cond:
                if idle:
                    self._idle_round = number
                self._cond.notify_all()
            self._clock.wait(self._wake, deadline)

    def _round(self) -> tuple[int | None, bool]:
        """Claim and submit due checks; returns (when to look again, idle)."""
        now = self._clock.now_ms()
        deadline: int | None = None
        regs = sorted(self._registry.active().items())
        if regs:  # start at a different group each round: one busy group cannot starve others
            self._rotation = (self._rotation + 1) % len(regs)
            regs = regs[self._rotation:] + regs[:self._rotation]
        for group, reg in regs:
            room = self._room()
            if room > 0:
                for check in self._source.poll_checks(group, room):
                    self._submit(reg, check)
            next_at = self._source.next_check_at(group)
            if next_at is not None:
                deadline = next_at if deadline is None else min(deadline, next_at)
        unanswered = self._source.claim_unanswered(MAX_UNANSWERED_PER_ROUND)
        if unanswered is not None:  # the other groups' checks nobody takes
            deadline = unanswered if deadline is None else min(deadline, unanswered)
            if unanswered <= now:  # more than one round's worth: go again now
                return now, False
        if deadline is not None and deadline <= now:  # more due than there was room for
            # with room left (discards freed it), go again now; else a finishing POST wakes us
            return (now if self._room() > 0 else None), False
        with self._cond:
            return deadline, self._in_flight == 0

    def _room(self) -> int:
        with self._cond:
            return self._max_in_flight - self._in_flight

    def _submit(self, reg: CallbackRegistration, check: TransactionCheck) -> None:
        with self._cond:
            self._in_flight += 1
        self._pool.submit(self._ask, reg, check)

    def _ask(self, reg: CallbackRegistration, check: TransactionCheck) -> None:
        try:
            answer = self._client.ask(reg, check, self._clock.now_ms())
            if self._on_answer is not None:
                self._on_answer(answer)
            self._source.apply_answer(check.transaction_id, answer)
        except Exception:
            log.exception("applying the check-back answer of %s failed", check.transaction_id)
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()
            self._wake.set()

