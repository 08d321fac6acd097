"""Every operation against arbitrary Authorization headers (random text, random bytes, other
schemes, near-misses of real tokens, real tokens of every role and topic pattern).

- ``Bearer <a configured token>`` is never 401; a header holding no configured token is
  always 401 with ``WWW-Authenticate`` (the open endpoints answer regardless);
- the admin token is never 403; a token whose role or topic patterns do not allow the call
  is 403 FORBIDDEN, never anything worse;
- nothing is ever 5xx, and every refusal is a problem document of the contract.
(tests/api/test_auth.py has the role table for the exact tokens; this goes wide.)
"""

from __future__ import annotations

from typing import Any

import httpx
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.conftest import assert_problem, fuzz_settings
from tests.support.live import ADMIN, CONSUMER, PRODUCER, PRODUCER_ALL, Live

TOKENS = (ADMIN, PRODUCER, CONSUMER, PRODUCER_ALL)
HANDLE = "AQAAAaIAhHi0dDEAYTE"  # well-formed, names nothing stored

# (method, path, JSON body); topics "orders.eu" (inside the restricted tokens' orders.*) and
# "other" (outside)
OPERATIONS: list[tuple[str, str, Any]] = [
    (m, p.format(t=t), b)
    for t in ("orders.eu", "other")
    for m, p, b in (
        ("POST", "/v1/topics/{t}/messages", {"body": "x", "delayMs": 3_600_000}),
        ("POST", "/v1/topics/{t}/messages:batch", {"messages": [{"body": "x",
                                                                 "delayMs": 3_600_000}]}),
        ("DELETE", "/v1/topics/{t}/messages/m1", None),
        ("GET", "/v1/topics/{t}/messages/m1", None),
        ("GET", "/v1/topics/{t}/scheduled", None),
        ("GET", "/v1/topics/{t}/messages?offset=0", None),
        ("GET", "/v1/topics/{t}/groups/g/offset", None),
        ("PUT", "/v1/topics/{t}/groups/g/offset", {"offset": 0}),
        ("POST", "/v1/topics/{t}/transactions", {"body": "x", "producerGroup": "pg"}),
    )
] + [
    ("DELETE", f"/v1/scheduled/{HANDLE}", None),
    ("POST", "/v1/transactions/no-such-tx/commit", None),
    ("POST", "/v1/transactions/no-such-tx/rollback", None),
    ("GET", "/v1/producer-groups/pg/transaction-checks", None),
    ("GET", "/v1/producer-groups/pg/check-callback", None),
    ("DELETE", "/v1/producer-groups/pg/check-callback", None),
    ("GET", "/v1/admin/stats", None),
]
OPEN = [("GET", "/healthz", None), ("GET", "/readyz", None), ("GET", "/metrics", None),
        ("GET", "/openapi.json", None)]

printable = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
# bytes an HTTP field value may hold (RFC 9110: VCHAR, SP, HTAB, obs-text); a value with
# control characters is not HTTP at all (uvicorn answers 400 before the app sees it)
field_bytes = st.binary(max_size=60).map(
    lambda b: bytes(c for c in b if c == 9 or 0x20 <= c <= 0x7E or c >= 0x80))


def near_misses(token: str) -> list[str]:
    return [f"Bearer {token}x", f"Bearer {token[:-1]}", f"Bearer x{token}", token,
            f"Bearer {token}{token}", f"Bearer {token} {token}", f"Bearer {token.upper()}"]


headers = st.one_of(
    st.none(),
    st.text(printable, max_size=60),
    field_bytes,
    st.tuples(st.sampled_from(["Bearer", "bearer", "BEARER", "Basic", "Token", "", "Bearer:"]),
              st.sampled_from(["", " ", "  ", "\t"]),
              st.one_of(st.sampled_from(TOKENS), st.text(printable, max_size=60))
              ).map("".join),
    st.sampled_from(TOKENS).map(lambda t: f"Bearer {t}"),
    st.sampled_from(TOKENS).flatmap(lambda t: st.sampled_from(near_misses(t))),
).map(lambda h: h.strip() if isinstance(h, str) else h.strip(b" \t") if h is not None else None)


def _call(client: httpx.Client, op: tuple[str, str, Any],
          header: str | bytes | None) -> httpx.Response:
    method, path, body = op
    if header is None:
        return client.request(method, path, json=body)
    value = header if isinstance(header, bytes) else header.encode("latin-1")
    return client.request(method, path, json=body, headers=[(b"Authorization", value)])


@fuzz_settings(300)
@given(op=st.sampled_from(OPERATIONS + OPEN), header=headers)
def test_any_authorization_header_is_answered_by_the_contract(
        fuzz_live: Live, op: tuple[str, str, Any], header: str | bytes | None) -> None:
    with fuzz_live.client(token=None) as client:
        r = _call(client, op, header)
    assert r.status_code < 500, f"{op} with {header!r}: {r.status_code} {r.text[:300]}"
    if op in OPEN:
        assert r.status_code == 200, (op, r.status_code)
        return
    text = header.decode("latin-1") if isinstance(header, bytes) else header or ""
    exact = text in {f"Bearer {t}" for t in TOKENS}
    if r.status_code >= 400:
        doc = assert_problem(r)
        if r.status_code == 401:
            assert not exact, f"{op}: a configured token was refused: {doc}"
            assert doc["code"] == "UNAUTHORIZED"
            assert r.headers["www-authenticate"].startswith("Bearer")
        if r.status_code == 403:
            assert doc["code"] == "FORBIDDEN"
            assert text != f"Bearer {ADMIN}", f"{op}: the admin token was forbidden"
    if not any(t in text for t in TOKENS):
        assert r.status_code == 401, f"{op} with {header!r} answered {r.status_code}"
