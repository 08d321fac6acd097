"""Transaction records: states, codecs and keys of half messages, transaction ids, and
RocketMQ's check-immunity rule.

Storage layout (column families from storage/constants.py):

- ``half``: timer key ``nextCheckAt + topic + NUL + msgId`` -> encoded :class:`HalfMessage`
  (the message as prepared, its timing still unresolved). Invisible to consumers: no scanner
  reads this column family.
- ``tx``: ``t/`` + transaction id -> encoded :class:`TransactionEntry` (state, check count,
  next check time: the entry names the half key, so commit needs no scan);
  ``g/`` + producer group + NUL + half key -> transaction id: the group's prepared messages in
  next-check order, so a poll reads one group's due range and nothing else;
  ``c/`` + producer group -> a check-callback registration (scheduler/checkback/registry.py).

Values are msgpack arrays whose first element is the format version; decoders take arrays
with unknown trailing fields (a newer writer) and default the fields an older writer lacked.
"""

from __future__ import annotations

import enum
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from storage.constants import GROUP_PATTERN, TX_ENTRY_PREFIX, TX_GROUP_PREFIX
from storage.errors import CorruptionError, InvalidArgument
from storage.keys import SEP

FORMAT_VERSION = 1


class TransactionState(enum.StrEnum):
    PREPARED = "PREPARED"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    DISCARDED = "DISCARDED"


@dataclass(frozen=True, kw_only=True, slots=True)
class HalfMessage:
    """Value of the half column family. Topic and msgId are in its key."""

    tx_id: str
    producer_group: str
    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    # timing as the producer gave it; relative forms are resolved at commit (see docs)
    deliver_at: int | None = None
    delay_ms: int | None = None
    delay_level: int | None = None
    prepared_at: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class TransactionEntry:
    """Value of ``t/<transaction id>`` in the tx column family."""

    topic: str
    msg_id: str
    producer_group: str
    state: TransactionState
    prepared_at: int
    immunity_ms: int
    next_check_at: int  # time part of the half key while PREPARED
    check_times: int = 0
    deliver_at: int | None = None  # resolved at commit
    updated_at: int = 0


def encode_half(half: HalfMessage) -> bytes:
    return _packb((
        FORMAT_VERSION, half.tx_id, half.producer_group, half.body, half.tags, list(half.keys),
        dict(half.properties), half.deliver_at, half.delay_ms, half.delay_level,
        half.prepared_at,
    ))


def decode_half(raw: bytes) -> HalfMessage:
    v = _unpackb(raw, "HalfMessage", 11)
    try:
        return HalfMessage(
            tx_id=v[1], producer_group=v[2], body=v[3], tags=v[4], keys=tuple(v[5]),
            properties=dict(v[6]), deliver_at=v[7], delay_ms=v[8], delay_level=v[9],
            prepared_at=v[10],
        )
    except (TypeError, ValueError) as exc:
        raise CorruptionError(f"cannot decode HalfMessage: {exc}") from exc


def encode_entry(entry: TransactionEntry) -> bytes:
    return _packb((
        FORMAT_VERSION, entry.topic, entry.msg_id, entry.producer_group, entry.state.value,
        entry.prepared_at, entry.immunity_ms, entry.next_check_at, entry.check_times,
        entry.deliver_at, entry.updated_at,
    ))


def decode_entry(raw: bytes) -> TransactionEntry:
    v = _unpackb(raw, "TransactionEntry", 11)
    try:
        return TransactionEntry(
            topic=v[1], msg_id=v[2], producer_group=v[3], state=TransactionState(v[4]),
            prepared_at=v[5], immunity_ms=v[6], next_check_at=v[7], check_times=v[8],
            deliver_at=v[9], updated_at=v[10],
        )
    except (TypeError, ValueError) as exc:
        raise CorruptionError(f"cannot decode TransactionEntry: {exc}") from exc


def _packb(values: tuple[Any, ...]) -> bytes:
    out: bytes = msgpack.packb(values, use_bin_type=True)
    return out


def _unpackb(raw: bytes, name: str, length: int) -> tuple[Any, ...]:
    """The record's array padded with None up to ``length`` (fields of a newer version are
    kept but unused; an older one's missing fields default)."""
    try:
        values = msgpack.unpackb(raw, raw=False, use_list=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise CorruptionError(f"cannot decode {name}: {exc}") from exc
    if not isinstance(values, tuple) or not values or not isinstance(values[0], int):
        raise CorruptionError(f"cannot decode {name}: not a versioned record")
    return values + (None,) * (length - len(values))


# --- keys of the tx column family ---------------------------------------------------------------
def entry_key(tx_id: str) -> bytes:
    return TX_ENTRY_PREFIX + tx_id.encode("ascii")


def check_group(group: str) -> None:
    if not isinstance(group, str) or GROUP_PATTERN.match(group) is None:
        raise InvalidArgument(f"producer group {group!r} must match {GROUP_PATTERN.pattern}")


def group_prefix(group: str) -> bytes:
    """Prefix of every per-group check-order key of ``group`` (groups contain no NUL)."""
    return TX_GROUP_PREFIX + group.encode("utf-8") + SEP


def group_key(group: str, half_key: bytes) -> bytes:
    return group_prefix(group) + half_key


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (last byte < 0xff)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


# --- transaction ids --------------------------------------------------------------------------
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
TX_ID_PATTERN = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}\Z")


def new_transaction_id(now_ms: int) -> str:
    """26 characters of Crockford base32: 48 bits of epoch ms, then 80 random bits (a ULID).
    Opaque to clients; unique without coordination (2^-80 collision odds per millisecond);
    roughly time-ordered, which keeps the tx column family's inserts local."""
    value = ((now_ms & ((1 << 48) - 1)) << 80) | secrets.randbits(80)
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def is_transaction_id(text: str) -> bool:
    return TX_ID_PATTERN.match(text) is not None


# --- check immunity (RocketMQ) ----------------------------------------------------------------
# sign, leading zeros, then at most the 19 digits of a long: int() never sees an absurd length
_JAVA_LONG = re.compile(r"([+-]?)0*([0-9]{1,19})")
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


def parse_java_long(text: str) -> int | None:
    """``Long.parseLong(text)``, or None where Java throws NumberFormatException
    (a fraction, blanks, an empty string, out of the signed 64-bit range)."""
    match = _JAVA_LONG.fullmatch(text)
    if match is None:
        return None
    value = int(match[1] + match[2])
    return value if _LONG_MIN <= value <= _LONG_MAX else None


def immunity_ms(check_immunity_seconds: str | int | float | None, transaction_timeout_ms: int,
                *, max_ms: int | None = None) -> int:
    """How long after prepare the first check-back waits, computed as RocketMQ's
    ``TransactionalMessageServiceImpl.getImmunityTime`` does and the contract states:
    ``max(checkImmunitySeconds * 1000, transaction timeout)``, where a value that is not a
    Java long (``"100.5"``, ``"abc"``, missing) counts as -1, i.e. the timeout.

    A number is taken as the integer it is: ``7`` and ``7.0`` (how a float-typed JSON field
    decodes ``7``) are 7 s, while ``100.5``, like "100.5", is not a long.
    ``max_ms`` caps absurd values (the next check time must stay a valid key).
    """
    seconds: int | None
    if check_immunity_seconds is None or isinstance(check_immunity_seconds, bool):
        seconds = None
    elif isinstance(check_immunity_seconds, int):
        seconds = check_immunity_seconds if _LONG_MIN <= check_immunity_seconds <= _LONG_MAX \
            else None
    elif isinstance(check_immunity_seconds, float):
        seconds = (int(check_immunity_seconds) if check_immunity_seconds.is_integer()
                   and _LONG_MIN <= check_immunity_seconds <= _LONG_MAX else None)
    else:
        seconds = parse_java_long(check_immunity_seconds)
    result = transaction_timeout_ms if seconds is None else max(seconds * 1000,
                                                                 transaction_timeout_ms)
    return result if max_ms is None else min(result, max_ms)
