"""The check-callback registry: producer group -> URL (and optional signing secret).

Persisted in the ``tx`` column family under ``c/`` + group (scheduler/tx_records.py), with an
in-memory copy the dispatcher reads on every round. A URL is checked against the allow-list
(scheduler/checkback/policy.py) when it is registered; ``active`` drops the ones the current
list no longer allows.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import msgpack

from scheduler.checkback.policy import url_refusal, validate_callback_url
from scheduler.clock import Clock
from scheduler.tx_records import check_group, prefix_end
from storage.constants import CF_TX, TX_CALLBACK_PREFIX
from storage.errors import CorruptionError, InvalidArgument, NotFound
from storage.rocks import RocksStore

_FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class CallbackRegistration:
    producer_group: str
    url: str
    secret: str | None = None  # when set, each POST carries an HMAC-SHA256 signature
    registered_at: int = 0


def _registration_key(group: str) -> bytes:
    return TX_CALLBACK_PREFIX + group.encode("utf-8")


def _encode_registration(reg: CallbackRegistration) -> bytes:
    out: bytes = msgpack.packb((_FORMAT_VERSION, reg.url, reg.secret, reg.registered_at),
                               use_bin_type=True)
    return out


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
