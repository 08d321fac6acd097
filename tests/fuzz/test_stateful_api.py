"""schemathesis' stateful fuzzing over the whole API: the document's operations chained by
Open API links, so generated sends are followed by status reads, cancels by id and by
handle, pulls and listings of their topic; prepares by commits and rollbacks (and a
rollback after a commit); offset commits by offset reads and group pulls; check-callback
registrations by reads and deletes. Every response goes through schemathesis' checks (no
5xx, documented status codes, content types, headers and schemas, auth enforced) and ours
(every refusal a problem document of the contract).

tests/api/test_schemathesis.py is the stateless run of every operation; this one reaches
the states only a sequence of calls reaches (cancel after send, commit after prepare, ...).
"""

from __future__ import annotations

import itertools
import warnings
import zlib
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import schemathesis
    from schemathesis.specs.openapi.checks import use_after_free

    import tests.api.schemathesis_hooks  # noqa: F401  (hypothesis-jsonschema shim, waitMs cap)

from scheduler.clock import FakeClock
from tests.fuzz.conftest import assert_problem, fuzz_server, fuzz_settings
from tests.support.live import ADMIN, T0, Live

M = "/v1/topics/{topic}/messages"
MSG = "/v1/topics/{topic}/messages/{msgId}"
TX = "/v1/topics/{topic}/transactions"
OFFSET = "/v1/topics/{topic}/groups/{group}/offset"
CALLBACK = "/v1/producer-groups/{group}/check-callback"
topic_of_result = {"path.topic": "$response.body#/topic"}
message_of_result = {**topic_of_result, "path.msgId": "$response.body#/msgId"}
same_topic = {"path.topic": "$request.path.topic"}

# (source, method, status, target, method, parameters). schemathesis names a link's rule
# after its target and status only, so each (target, status) may appear once: a second one
# would silently replace the first, and its source's bundle would never be drained.
LINKS: list[tuple[str, str, str, str, str, dict[str, str]]] = [
    (M, "POST", "201", MSG, "GET", message_of_result),
    (M, "POST", "201", MSG, "DELETE", message_of_result),
    (M, "POST", "201", M, "GET", topic_of_result),
    (M + ":batch", "POST", "201", "/v1/scheduled/{cancelHandle}", "DELETE",
     {"path.cancelHandle": "$response.body#/results/0/cancelHandle"}),
    (M + ":batch", "POST", "201", "/v1/topics/{topic}/scheduled", "GET", same_topic),
    (MSG, "DELETE", "200", MSG, "GET", message_of_result),
    (TX, "POST", "201", "/v1/transactions/{transactionId}/commit", "POST",
     {"path.transactionId": "$response.body#/transactionId"}),
    (TX, "POST", "201", "/v1/transactions/{transactionId}/rollback", "POST",
     {"path.transactionId": "$response.body#/transactionId"}),
    (TX, "POST", "201", "/v1/producer-groups/{group}/transaction-checks", "GET",
     {"path.group": "$request.body#/producerGroup"}),
    ("/v1/transactions/{transactionId}/commit", "POST", "200",
     "/v1/transactions/{transactionId}/rollback", "POST",
     {"path.transactionId": "$request.path.transactionId"}),
    (OFFSET, "PUT", "200", OFFSET, "GET",
     {**same_topic, "path.group": "$request.path.group"}),
    (OFFSET, "PUT", "200", M, "GET", {**same_topic, "query.group": "$request.path.group"}),
    (CALLBACK, "PUT", "200", CALLBACK, "GET", {"path.group": "$request.path.group"}),
    (CALLBACK, "PUT", "200", CALLBACK, "DELETE", {"path.group": "$request.path.group"}),
    # the check-back poll of a group followed by a commit of one of its checks, and
    # the parked messages' listing after a redrive
    ("/v1/producer-groups/{group}/transaction-checks", "GET", "200",
     "/v1/transactions/{transactionId}/commit", "POST",
     {"path.transactionId": "$response.body#/checks/0/transactionId"}),
    ("/v1/admin/parked:redrive", "POST", "200", "/v1/admin/parked", "GET", {}),
]
assert len({(t, m, s) for _, _, s, t, m, _ in LINKS}) == len(LINKS)
_examples = itertools.count()


def _scoped(name: Any, prefix: str) -> Any:
    """``name`` inside this example's own namespace (idempotent)."""
    if not isinstance(name, str) or name.startswith(prefix):
        return name
    return prefix + name


def _fit(value: Any) -> Any:
    """msgpack holds 64-bit integers; the fuzzer makes bigger ones. Clamp them (the server's
    answer to a huge number is tested in JSON, where it can be written)."""
    if isinstance(value, bool) or not isinstance(value, int | list | dict):
        return value
    if isinstance(value, int):
        return max(-(1 << 63), min(value, (1 << 64) - 1))
    if isinstance(value, list):
        return [_fit(v) for v in value]
    return {k: _fit(v) for k, v in value.items()}


@schemathesis.serializer("application/x-msgpack")
class MsgpackSerializer:  # replaces the hooks module's, which raises on such integers
    def as_requests(self, context: Any, payload: Any) -> dict[str, Any]:
        return {"data": msgpack.packb(_fit(payload))}

    def as_werkzeug(self, context: Any, payload: Any) -> dict[str, Any]:
        return self.as_requests(context, payload)


TIMING = ("deliverAt", "delayMs", "delayLevel")


def _sendable(message: Any) -> Any:
    """A generated MessageIn with exactly one of body/bodyBase64 and at most one timing field
    (rules the document cannot express), so that sends succeed and links get followed."""
    if not isinstance(message, dict):
        return message
    m = dict(message)
    if ("body" in m) == ("bodyBase64" in m):
        m.pop("bodyBase64", None)
        m.setdefault("body", "x")
    for extra in [k for k in TIMING if k in m][1:]:
        del m[extra]
    return m


def _map_body(context: Any, body: Any) -> Any:
    """Three generated bodies in four made sendable; the fourth stays as generated."""
    op = context.operation
    if op is None or op.method.upper() != "POST" or zlib.crc32(repr(body).encode()) % 4 == 0:
        return body
    if op.path.endswith(":batch") and isinstance(body, dict) and isinstance(
            body.get("messages"), list):
        return {**body, "messages": [_sendable(m) for m in body["messages"]]}
    if op.path.endswith(("/messages", "/transactions")):
        return _sendable(body)
    return body


def _problem_documents(ctx: Any, response: Any, case: Any) -> None:
    if response.status_code >= 400:
        assert_problem(response)  # a requests.Response: the same API as httpx's here


MESSAGE_PATH = "/v1/topics/{topic}/messages/{msgId}"


def _cancelled_earlier(case: Any) -> bool:
    """Was this message cancelled (a 2xx DELETE of the same path) earlier in the chain?"""
    source = case.source
    while source is not None:
        earlier = source.case
        if (earlier.operation.method.lower() == "delete" and 200 <= source.response.status_code
                < 300 and earlier.formatted_path == case.formatted_path):
            return True
        source = earlier.source
    return False


def _after_delete(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis's use-after-free check wants a 404 for anything read after its DELETE.
    A DELETE of a message is a cancel, and the contract keeps a cancelled message readable,
    status CANCELLED, for the retention period: after a cancel, that is what a read must
    say. Any other deletion keeps schemathesis's check."""
    if (case.operation.method.lower() == "get" and case.operation.path == MESSAGE_PATH
            and _cancelled_earlier(case)):
        assert response.status_code == 200, f"{response.status_code} after a cancel"
        assert response.json()["status"] == "CANCELLED", response.text
        return None
    return use_after_free(ctx, response, case)


@pytest.fixture(scope="module")
def frozen_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """On a clock that never moves: whether a message is due cannot change between a run
    of an example and its replay while Hypothesis shrinks it."""
    with fuzz_server(tmp_path_factory, FakeClock(T0)) as live:
        yield live


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:jsonschema.RefResolver is deprecated:DeprecationWarning")
def test_stateful_fuzzing_of_the_whole_api(frozen_live: Live) -> None:
    schemathesis.experimental.OPEN_API_3_1.enable()
    schema = schemathesis.from_uri(f"{frozen_live.base_url}/openapi.json",
                                   base_url=frozen_live.base_url)
    schema.hook("map_body")(_map_body)
    for source, s_method, status, target, t_method, parameters in LINKS:
        schema.add_link(source=schema[source][s_method], target=schema[target][t_method],
                        status_code=status, parameters=parameters)

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            # topics and groups of this example only; fixed width, so that a name near the
            # length limit is valid (or not) in every replay alike
            self.prefix = f"x{next(_examples) % 10**6:06d}."

        def before_call(self, case: Any) -> None:
            """Authenticate, and keep each example's topics and groups apart from the others'
            so that an example replayed while shrinking meets the same server state."""
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {ADMIN}"}
            for name in ("topic", "group"):
                if case.path_parameters and name in case.path_parameters:
                    case.path_parameters[name] = _scoped(case.path_parameters[name], self.prefix)
            if case.query and "group" in case.query:
                case.query["group"] = _scoped(case.query["group"], self.prefix)
            if isinstance(case.body, dict) and "producerGroup" in case.body:
                case.body = {**case.body,
                             "producerGroup": _scoped(case.body["producerGroup"], self.prefix)}

        def _add_results_to_targets(self, targets: Any, results: list[Any]) -> None:
            """Hypothesis 6.170 renamed ``_add_result_to_targets`` (one result) to this; the
            override schemathesis 3.39 relies on to put a response into its link's bundle
            never runs, every result lands in ``catch_all``, and no link is ever followed.
            This is that override again, under the new name."""
            for result in results:
                target = None if result is None else self._get_target_for_result(result)
                if target is not None:
                    super()._add_results_to_targets((target,), [result])

        def validate_response(self, response: Any, case: Any,
                              additional_checks: tuple[Any, ...] = ()) -> None:
            checks = tuple(_after_delete if c is use_after_free else c for c in additional_checks)
            super().validate_response(response, case,
                                      additional_checks=(*checks, _problem_documents))

    Workflow.TestCase.settings = fuzz_settings(30, stateful_step_count=10)
    Workflow.TestCase().runTest()
