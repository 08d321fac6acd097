"""Bearer-token authentication and role/topic authorisation.

A token has a role (admin, producer, consumer) and topic glob patterns. Missing or unknown
token -> 401 UNAUTHORIZED; a known token whose role or patterns do not allow the call -> 403
FORBIDDEN. Tokens are looked up by their SHA-256 digest and then compared with
``hmac.compare_digest``, so the time taken does not depend on how much of a guess is right.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from api.errors import Unauthorized


class Role(enum.StrEnum):
    ADMIN = "admin"  # everything
    PRODUCER = "producer"  # send, cancel, status, scheduled peek, transactions
    CONSUMER = "consumer"  # pull, group offsets, status


@dataclass(frozen=True, kw_only=True)
class TokenSpec:
    token: str = field(repr=False)
    role: Role
    topics: tuple[str, ...] = ("*",)  # glob patterns (fnmatch, case-sensitive)
    name: str = ""  # a label for logs; never the token itself


class Permission(enum.StrEnum):
    SEND = "send"  # send, batch, prepare transaction
    CANCEL = "cancel"
    READ = "read"  # message status, scheduled peek
    PULL = "pull"
    OFFSETS = "offsets"  # get and commit group offsets
    TRANSACT = "transact"  # commit, rollback, check-back polling
    ADMIN = "admin"  # snapshots, stats


ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.ADMIN: frozenset(Permission),
    Role.PRODUCER: frozenset({Permission.SEND, Permission.CANCEL, Permission.READ,
                              Permission.TRANSACT}),
    Role.CONSUMER: frozenset({Permission.PULL, Permission.OFFSETS, Permission.READ}),
}


@dataclass(frozen=True, kw_only=True)
class Principal:
    name: str
    role: Role
    patterns: tuple[str, ...]
    _topics: re.Pattern[str]

    @classmethod
    def from_spec(cls, spec: TokenSpec) -> Principal:
        regex = "|".join(f"(?:{fnmatch.translate(p)})" for p in spec.topics)
        return cls(name=spec.name, role=spec.role, patterns=spec.topics,
                   _topics=re.compile(regex))

    def may(self, permission: Permission) -> bool:
        return permission in ROLE_PERMISSIONS[self.role]

    def may_use_topic(self, topic: str) -> bool:
        return self.role is Role.ADMIN or self._topics.match(topic) is not None


class Authenticator:
    def __init__(self, tokens: Iterable[TokenSpec]) -> None:
        self._by_digest: dict[bytes, tuple[bytes, Principal]] = {}
        for spec in tokens:
            raw = spec.token.encode("utf-8")
            self._by_digest[hashlib.sha256(raw).digest()] = (raw, Principal.from_spec(spec))

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization: Bearer <token>`` header, else Unauthorized."""
        if not authorization:
            raise Unauthorized("missing Authorization: Bearer <token> header")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("the Authorization header must be 'Bearer <token>'")
        presented = token.strip().encode("utf-8", "surrogateescape")
        found = self._by_digest.get(hashlib.sha256(presented).digest())
        if found is None or not hmac.compare_digest(found[0], presented):
            raise Unauthorized("unknown token")
        return found[1]

