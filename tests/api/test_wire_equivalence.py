"""The send routes answer with the engine's ``SendResult`` as it is (no copy per message):
its encoding must be byte for byte the API schema's, in JSON and msgpack."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from api import schemas
from scheduler import model
from storage.records import MessageStatus

names = st.text(max_size=20)


@given(msg_id=names, topic=names, deliver_at=st.integers(0, 2**63),
       status=st.sampled_from([MessageStatus.SCHEDULED, MessageStatus.DELIVERED]),
       handle=names, duplicate=st.booleans(),
       cancel=st.none() | st.tuples(names, st.sampled_from(["CANCELLED", "NOT_FOUND"])))
def test_the_engine_result_encodes_as_the_schema(msg_id: str, topic: str, deliver_at: int,
                                                 status: MessageStatus, handle: str,
                                                 duplicate: bool,
                                                 cancel: tuple[str, str] | None) -> None:
    fields = {"msg_id": msg_id, "topic": topic, "deliver_at": deliver_at, "status": status,
              "cancel_handle": handle, "duplicate": duplicate}
    engine, wire = model.SendOutcome(**fields), schemas.SendResult(**fields)
    if cancel is not None:  # a cancel marker's result
        engine = model.SendOutcome(**fields, cancel=model.CancelMarkerEffect(
            msg_id=cancel[0], status=cancel[1]))
        wire = schemas.SendResult(**fields, cancel=schemas.CancelOutcome(
            msg_id=cancel[0], status=cancel[1]))
    for encode in (msgspec.json.encode, msgspec.msgpack.encode):
        assert encode(engine) == encode(wire)
        assert encode({"results": [engine]}) == encode(schemas.BatchResult(results=[wire]))


def test_the_two_declare_the_same_fields() -> None:
    assert model.SendOutcome.__struct_fields__ == schemas.SendResult.__struct_fields__
    assert model.SendOutcome.__struct_encode_fields__ == schemas.SendResult.__struct_encode_fields__
