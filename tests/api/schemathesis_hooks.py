"""Loaded by the schemathesis run through SCHEMATHESIS_HOOKS (its own process only).

1. Serialise ``application/x-msgpack`` bodies (the batch endpoint's compact encoding).
   msgpack has no integer beyond 64 bits, which the fuzzer generates (JSON carries them): such
   an integer goes as a bignum extension (``ExtType(BIGINT_EXT, two's complement, big
   endian)``), which the server does not accept where it expects a number, so it must answer
   400; the case still runs, with every check, instead of failing in the client.
2. Cap ``waitMs`` (a pull's query, a group receive's body): the fuzzer's boundary value
   (30000) would turn every empty pull into a 30 s wait; long polling has its own tests. The
   same for a stream's ``durationMs`` (given or not: its default is 5 minutes).
3. Drop generated queries the client cannot send as generated (``filter_query``).
4. A compatibility shim: hypothesis-jsonschema 0.23.1 (the latest) still drives Hypothesis'
   private ``many`` helper through ``more()``, which Hypothesis 6.170 replaced by iteration,
   so every object schema fails with "'many' object has no attribute 'more'". ``more()``
   below is the old contract (one continue/stop decision per call, each element in its own
   span) written over the new class' own steps.
"""

from __future__ import annotations

from typing import Any, cast

import msgpack
import schemathesis
from hypothesis.internal.conjecture import utils as conjecture_utils

MAX_WAIT_MS = 20
MAX_STREAM_MS = 3_600_000  # api/routes/stream.py MAX_DURATION_MS
BIGINT_EXT = 1  # msgpack extension type code of an integer outside [-2**63, 2**64)
_INT_RANGE = range(-(1 << 63), 1 << 64)


@schemathesis.hook
def map_query(context: Any, query: dict[str, Any] | None) -> dict[str, Any] | None:
    if query and isinstance(query.get("waitMs"), int) and query["waitMs"] > MAX_WAIT_MS:
        query["waitMs"] = MAX_WAIT_MS
    operation = getattr(context, "operation", None)
    if operation is not None and operation.path.endswith(":stream"):
        # a stream lasts durationMs (default 5 minutes): a valid one, or none, becomes 20 ms
        query = dict(query or {})
        duration = query.get("durationMs", MAX_STREAM_MS)
        if isinstance(duration, int) and not isinstance(duration, bool) \
                and MAX_WAIT_MS < duration <= MAX_STREAM_MS:
            query["durationMs"] = MAX_WAIT_MS
    return query


@schemathesis.hook
def filter_query(context: Any, query: dict[str, Any] | None) -> bool:
    """Drop a case whose query holds a value the HTTP client leaves out of the URL (None, an
    empty list): sent, it is another, valid query (negative data for an optional parameter
    of an operation with nothing else to get wrong, GET /v1/admin/timeline, was reported as
    'accepted' that way)."""
    return not query or not any(v is None or v == [] for v in query.values())


@schemathesis.hook
def map_body(context: Any, body: Any) -> Any:
    """The same cap for a group receive, whose ``waitMs`` is in its body."""
    if isinstance(body, dict) and isinstance(body.get("waitMs"), int) \
            and body["waitMs"] > MAX_WAIT_MS:
        body["waitMs"] = MAX_WAIT_MS
    return body


def packb(payload: Any) -> bytes:
    """``payload`` as msgpack, integers msgpack cannot hold as BIGINT_EXT extensions."""
    return cast(bytes, msgpack.packb(_fit(payload)))


def _fit(value: Any) -> Any:
    if isinstance(value, dict):
        return {_fit(k): _fit(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_fit(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and value not in _INT_RANGE:
        size = (value.bit_length() + 8) // 8  # room for the sign bit
        return msgpack.ExtType(BIGINT_EXT, value.to_bytes(size, "big", signed=True))
    return value


@schemathesis.serializer("application/x-msgpack")
class MsgpackSerializer:
    def as_requests(self, context: Any, payload: Any) -> dict[str, Any]:
        return {"data": packb(payload)}

    def as_werkzeug(self, context: Any, payload: Any) -> dict[str, Any]:
        return {"data": packb(payload)}


def _more(self: Any) -> bool:
    if self._depth is None:
        self._depth = self.data.depth
    self._finish_element()
    if not self._decide():
        return False
    self.count += 1
    self._in_element = True
    self._rejected = False
    return True


if not hasattr(conjecture_utils.many, "more"):
    cast(Any, conjecture_utils.many).more = _more
