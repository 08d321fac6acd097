"""Loaded by the schemathesis run through SCHEMATHESIS_HOOKS (its own process only).

1. Serialise ``application/x-msgpack`` bodies (the batch endpoint's compact encoding).
2. Cap ``waitMs``: the fuzzer's boundary value (30000) would turn every empty pull into a
   30 s wait; long polling has its own tests.
3. A compatibility shim: hypothesis-jsonschema 0.23.1 (the latest) still drives Hypothesis'
   private ``many`` helper through ``more()``, which Hypothesis 6.170 replaced by iteration,
   so every object schema fails with "'many' object has no attribute 'more'". ``more()``
   below is the old contract (one continue/stop decision per call, each element in its own
   span) written over the new class' own steps.
"""

from __future__ import annotations

from typing import Any

import msgpack
import schemathesis
from hypothesis.internal.conjecture import utils as conjecture_utils

MAX_WAIT_MS = 20


@schemathesis.hook
def map_query(context: Any, query: dict[str, Any] | None) -> dict[str, Any] | None:
    if query and isinstance(query.get("waitMs"), int) and query["waitMs"] > MAX_WAIT_MS:
        query["waitMs"] = MAX_WAIT_MS
    return query


@schemathesis.serializer("application/x-msgpack")
class MsgpackSerializer:
    def as_requests(self, context: Any, payload: Any) -> dict[str, Any]:
        return {"data": msgpack.packb(payload)}

    def as_werkzeug(self, context: Any, payload: Any) -> dict[str, Any]:
        return {"data": msgpack.packb(payload)}


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
    conjecture_utils.many.more = _more
