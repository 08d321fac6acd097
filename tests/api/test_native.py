"""The HTTP layer's compiled wire encoders (api/_native.pyx) keep the contract with their
pure-Python twins (tests/support/twins.py); the keys they write are the schemas'."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api import schemas
from api.native import native
from api.routes.consume import (
    _pull_json_native,
    _pull_msgpack_native,
    delivered,
    pull_json_py,
    pull_msgpack_py,
)
from api.routes.groups import (
    _receive_json_native,
    _receive_msgpack_native,
    receive_json_py,
    receive_msgpack_py,
)
from api.wire_keys import (
    NEXT_OFFSET,
    NEXT_OFFSET_JSON,
    PULL_HEAD,
    PULL_HEAD_JSON,
    RECEIVE_JSON,
    key_table,
)
from scheduler.groups import AckCounts, LeasedBatch, LeasedMessage
from storage.errors import CorruptionError
from storage.records import (
    LogRecord,
    MessageStatus,
    decode_log_record,
    encode_log_record,
)
from tests.support import twins
from tests.support.native_strategies import (
    fits_int64,
    log_records,
    mutations,
)
from tests.support.twins import holds, or_none, outcome

needs_native = twins.needs_native("api")


def python_delivered(payload: bytes, once: bool = False) -> bytes | None:
    return or_none(lambda: msgspec.msgpack.encode(delivered(decode_log_record(payload), once)))


@needs_native
@settings(max_examples=200)
@given(record=log_records, data=st.data(), once=st.booleans())
def test_delivered_msgpack(record: LogRecord, data: st.DataObject, once: bool) -> None:
    """``once``: ``Prefer: body=once`` (one body: the text, else the bytes)."""
    assert native is not None
    payload = encode_log_record(record)
    payloads = [payload, data.draw(mutations(payload))]
    out, offsets = native.delivered_msgpack(payloads, once=once)
    takes = len(record.properties) <= 16 and fits_int64(
        record.queue_offset, record.born_at, record.deliver_at, record.stored_at, record.flags)
    holds(out[0], python_delivered(payload, once), takes=takes)
    if takes:
        assert offsets[0] == record.queue_offset
    if out[1] is not None:  # (only then is Python's answer asked for)
        holds(out[1], python_delivered(payloads[1], once), takes=None)


@needs_native
@settings(max_examples=100)
@given(records=st.lists(log_records, max_size=20), offset=st.integers(0, 1 << 40),
       once=st.booleans())
def test_pull_answer(records: list[LogRecord], offset: int, once: bool) -> None:
    payloads = [encode_log_record(r) for r in records]
    assert outcome(_pull_msgpack_native, payloads, offset, once) == outcome(
        pull_msgpack_py, payloads, offset, once)


@needs_native
@settings(max_examples=100)
@given(records=st.lists(log_records, min_size=1, max_size=20), data=st.data(),
       once=st.booleans())
def test_pull_frame_in_one_buffer(records: list[LogRecord], data: st.DataObject,
                                  once: bool) -> None:
    """The whole answer written by C in one buffer is Python's answer, byte for byte; a
    payload C leaves to Python anywhere (here: one damaged) leaves the whole frame to it."""
    assert native is not None
    payloads = [encode_log_record(r) for r in records]
    frame = native.pull_frame(payloads, once)
    takes = all(len(r.properties) <= 16 and fits_int64(r.queue_offset, r.born_at, r.deliver_at,
                                                       r.stored_at, r.flags) for r in records) \
        and records[-1].queue_offset < (1 << 63) - 1
    holds(frame, pull_msgpack_py(payloads, 0, once) if takes else None, takes=takes)
    k = data.draw(st.integers(0, len(payloads) - 1))
    damaged = [*payloads[:k], data.draw(mutations(payloads[k])), *payloads[k + 1:]]
    frame = native.pull_frame(damaged, once)
    if frame is not None:  # (only then is Python's answer asked for: it may raise)
        holds(frame, pull_msgpack_py(damaged, 0, once), takes=None)
    assert native.pull_frame([], once) is None


@needs_native
@settings(max_examples=100)
@given(records=st.lists(log_records, min_size=1, max_size=20), data=st.data(),
       min_size=st.integers(0, 64))
def test_pull_pieces_join_to_the_frame(records: list[LogRecord], data: st.DataObject,
                                       min_size: int) -> None:
    """A stream's frame as pieces (api/push.py): joined, the bytes of ``pull_frame``; each
    body of ``min_size`` bytes or more a view of its payload (not copied); None where
    ``pull_frame`` gives None (here also: a damaged payload anywhere)."""
    assert native is not None
    payloads = [encode_log_record(r) for r in records]
    pieces = native.pull_pieces(payloads, True, min_size)
    frame = native.pull_frame(payloads, True)
    if frame is None:
        assert pieces is None
    else:
        assert pieces is not None and b"".join(pieces) == frame
        views = [p for p in pieces if isinstance(p, memoryview) and p.obj is not None
                 and any(p.obj is payload for payload in payloads)]
        assert len(views) == sum(len(r.body) >= max(min_size, 1) for r in records)
        assert all(len(v) >= max(min_size, 1) for v in views)
    k = data.draw(st.integers(0, len(payloads) - 1))
    damaged = [*payloads[:k], data.draw(mutations(payloads[k])), *payloads[k + 1:]]
    pieces = native.pull_pieces(damaged, True, min_size)
    frame = native.pull_frame(damaged, True)
    assert (pieces is None) == (frame is None)
    if pieces is not None:
        assert b"".join(pieces) == frame
    assert native.pull_pieces([], True, min_size) is None
    assert native.pull_pieces(payloads, False, min_size) is None  # (two bodies: not split)


@needs_native
def test_pull_answer_of_many_messages() -> None:
    """array16 header past 15 messages, and a payload C leaves to Python."""
    payloads = [encode_log_record(LogRecord(topic="t", msg_id=f"m{i}", queue_offset=i,
                                            body=b"x" * i, properties={"p": "q"} if i % 5
                                            else {str(k): "v" for k in range(20)}))
                for i in range(40)]
    assert _pull_msgpack_native(payloads, 0) == pull_msgpack_py(payloads, 0)
    with pytest.raises(CorruptionError):
        _pull_msgpack_native([payloads[0][:-1]], 0)


@needs_native
@settings(max_examples=100)
@given(rows=st.lists(st.tuples(log_records, st.booleans(), st.text(max_size=20),
                               st.integers(1, 50), st.just(0) | st.integers(0, 16)),
                     max_size=20),
       lease_until=st.integers(0, 1 << 62),
       acked=st.none() | st.tuples(st.integers(0, 1000), st.lists(st.text(max_size=10),
                                                                  max_size=3)),
       once=st.booleans())
def test_receive_answer(rows: list[tuple[LogRecord, bool, str, int, int]], lease_until: int,
                        acked: tuple[int, list[str]] | None, once: bool) -> None:
    """A receive's msgpack answer: messages shown as stored (their bytes transcoded in C)
    mixed with retries shown as their original (no bytes: encoded from the document)."""
    result = LeasedBatch(lease_until=lease_until, messages=[
        LeasedMessage(receipt, count, times, encode_log_record(record)) if stored
        else LeasedMessage(receipt, count, times, shown=record)
        for record, stored, receipt, count, times in rows])
    ack = None if acked is None else AckCounts(acked=acked[0], stale=acked[1])
    assert outcome(_receive_msgpack_native, result, ack, once) == outcome(
        receive_msgpack_py, result, ack, once)


# --- the same in JSON ---------------------------------------------------------------------
def python_delivered_json(payload: bytes, once: bool = False) -> bytes | None:
    return or_none(lambda: msgspec.json.encode(delivered(decode_log_record(payload), once)))


def takes_record(record: LogRecord) -> bool:
    """Whether C writes ``record``'s document (else it leaves it to Python: None)."""
    return len(record.properties) <= 16 and fits_int64(
        record.queue_offset, record.born_at, record.deliver_at, record.stored_at, record.flags)


@needs_native
@settings(max_examples=300)
@given(record=log_records, data=st.data(), once=st.booleans())
def test_delivered_json(record: LogRecord, data: st.DataObject, once: bool) -> None:
    """Every string escaped as msgspec escapes it (quotes, backslashes, controls, non-ASCII
    text), the body's bytes in base64, the text body beside it unless ``once``."""
    assert native is not None
    payload = encode_log_record(record)
    payloads = [payload, data.draw(mutations(payload))]
    out, offsets = native.delivered_json(payloads, once=once)
    takes = takes_record(record)
    holds(out[0], python_delivered_json(payload, once), takes=takes)
    if takes:
        assert offsets[0] == record.queue_offset
    if out[1] is not None:
        holds(out[1], python_delivered_json(payloads[1], once), takes=None)


@needs_native
def test_text_bodies_around_the_eight_byte_ascii_check() -> None:
    """Whether a body is text (sent as ``body``) or bytes (``bodyBase64``) is decided in
    C eight ASCII bytes at a time (storage/_msgpack.pxd ``_utf8``): a non-ASCII character,
    valid or not (a lone continuation byte, a truncated sequence, a surrogate, an overlong
    form), at every place before, across and after a word boundary, in bodies of every
    length around a word's, decides as Python's strict decoder does, in both encodings."""
    assert native is not None
    odd = [b"\xc3\xa9", b"\xe2\x80\xa8", b"\xf0\x9f\x98\x80", b"\x80", b"\xc3", b"\xe2\x80",
           b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xff"]
    bodies = [b"a" * n for n in range(0, 34)]
    bodies += [b"a" * at + c + b"b" * after for c in odd for at in range(0, 18)
               for after in (0, 1, 7, 8, 9)]
    bodies.append(b"x" * 16384 + b"\x80")  # a long text run, then one bad byte at the end
    bodies.append(b"x" * 16384)
    for body in bodies:
        payload = encode_log_record(LogRecord(topic="t", msg_id="m", queue_offset=1,
                                              body=body))
        for once in (False, True):
            holds(native.delivered_msgpack([payload], once=once)[0][0],
                  python_delivered(payload, once), takes=True)
            holds(native.delivered_json([payload], once=once)[0][0],
                  python_delivered_json(payload, once), takes=True)


@needs_native
def test_json_strings_and_bodies_of_every_byte() -> None:
    """Each byte value below 0x80 in a string and in a text body, and base64 of bodies of
    every length modulo 3, as msgspec writes them."""
    assert native is not None
    every = "".join(map(chr, range(0x80))) + "\u00e9\u2028\U0001f600"
    records = [LogRecord(topic="t", msg_id=every[1:], queue_offset=n, body=every.encode()[:n],
                         tags=every, keys=(every, ""), properties={every: every, "": ""})
               for n in range(0, 140, 7)]
    records += [LogRecord(topic="t", msg_id="m", queue_offset=1, body=bytes(range(256))[:n])
                for n in range(7)]
    for once in (False, True):
        for record in records:
            payload = encode_log_record(record)
            holds(native.delivered_json([payload], once=once)[0][0],
                  python_delivered_json(payload, once), takes=True)


@needs_native
@pytest.mark.parametrize("special", ['"', "\\", "\x00", "\x1f", "\n", "\x7f", "\u00e9",
                                     "\U0001f600"])
def test_a_byte_to_escape_or_decode_at_every_place_of_an_eight_byte_word(special: str) -> None:
    """Strings and text bodies are passed eight bytes at a time where nothing in them is
    escaped (``_w_jstr``) or not ASCII (``_utf8``): a byte that is, at each place of a
    word and in the bytes left after the last whole word, is written as msgspec writes it,
    and an invalid UTF-8 byte there makes the body binary."""
    assert native is not None
    for n in range(0, 26):
        for at in range(n + 1):
            text = "a" * at + special + "b" * (n - at)
            bodies = [text.encode(), ("a" * at).encode() + b"\xff" + b"b" * (n - at)]
            for body in bodies:
                record = LogRecord(topic="t", msg_id="m", queue_offset=1, body=body, tags=text,
                                   properties={text: text})
                payload = encode_log_record(record)
                for once in (False, True):
                    holds(native.delivered_json([payload], once=once)[0][0],
                          python_delivered_json(payload, once), takes=True)
                    holds(native.delivered_msgpack([payload], once=once)[0][0],
                          python_delivered(payload, once), takes=True)


@needs_native
@settings(max_examples=100)
@given(records=st.lists(log_records, max_size=20), offset=st.integers(0, 1 << 40),
       once=st.booleans())
def test_pull_answer_json(records: list[LogRecord], offset: int, once: bool) -> None:
    payloads = [encode_log_record(r) for r in records]
    assert outcome(_pull_json_native, payloads, offset, once) == outcome(
        pull_json_py, payloads, offset, once)


@needs_native
@settings(max_examples=100)
@given(records=st.lists(log_records, min_size=1, max_size=20), data=st.data(),
       once=st.booleans())
def test_pull_frame_json_in_one_buffer(records: list[LogRecord], data: st.DataObject,
                                       once: bool) -> None:
    """``test_pull_frame_in_one_buffer`` in JSON."""
    assert native is not None
    payloads = [encode_log_record(r) for r in records]
    frame = native.pull_frame_json(payloads, once)
    takes = all(map(takes_record, records)) and records[-1].queue_offset < (1 << 63) - 1
    holds(frame, pull_json_py(payloads, 0, once) if takes else None, takes=takes)
    k = data.draw(st.integers(0, len(payloads) - 1))
    damaged = [*payloads[:k], data.draw(mutations(payloads[k])), *payloads[k + 1:]]
    frame = native.pull_frame_json(damaged, once)
    if frame is not None:
        holds(frame, pull_json_py(damaged, 0, once), takes=None)
    assert native.pull_frame_json([], once) is None


@needs_native
def test_pull_answer_json_of_many_messages() -> None:
    """A payload C leaves to Python (21 properties) among those it writes; a damaged one."""
    payloads = [encode_log_record(LogRecord(topic="t", msg_id=f"m{i}", queue_offset=i,
                                            body=b"x" * i, properties={"p": "q"} if i % 5
                                            else {str(k): "v" for k in range(21)}))
                for i in range(40)]
    assert _pull_json_native(payloads, 0) == pull_json_py(payloads, 0)
    with pytest.raises(CorruptionError):
        _pull_json_native([payloads[0][:-1]], 0)


@needs_native
@settings(max_examples=100)
@given(rows=st.lists(st.tuples(log_records, st.booleans(), st.text(max_size=20),
                               st.integers(1, 50), st.just(0) | st.integers(0, 16)),
                     max_size=20),
       lease_until=st.integers(0, 1 << 62),
       acked=st.none() | st.tuples(st.integers(0, 1000), st.lists(st.text(max_size=10),
                                                                  max_size=3)),
       once=st.booleans())
def test_receive_answer_json(rows: list[tuple[LogRecord, bool, str, int, int]],
                             lease_until: int, acked: tuple[int, list[str]] | None,
                             once: bool) -> None:
    """``test_receive_answer`` in JSON (receipts with characters to escape too), all shown
    as stored (one buffer) or mixed with retries."""
    result = LeasedBatch(lease_until=lease_until, messages=[
        LeasedMessage(receipt, count, times, encode_log_record(record)) if stored
        else LeasedMessage(receipt, count, times, shown=record)
        for record, stored, receipt, count, times in rows])
    ack = None if acked is None else AckCounts(acked=acked[0], stale=acked[1])
    assert outcome(_receive_json_native, result, ack, once) == outcome(
        receive_json_py, result, ack, once)


@needs_native
@settings(max_examples=100)
@given(rows=st.lists(st.tuples(log_records, st.text(max_size=20), st.integers(1, 50)),
                     max_size=40),
       lease_until=st.integers(0, 1 << 62),
       acked=st.none() | st.tuples(st.integers(0, 1000), st.lists(st.text(max_size=10),
                                                                  max_size=3)),
       once=st.booleans())
def test_receive_answer_of_columns(rows: list[tuple[LogRecord, str, int]], lease_until: int,
                                   acked: tuple[int, list[str]] | None, once: bool) -> None:
    """The usual receive, kept as columns (payloads, receipts, counts: no object per
    message), is written in one buffer in C (``received_msgpack``, ``received_json``): the
    bytes of the Python twins, also past 15 messages (array16) and for a record C leaves to
    Python (then the whole answer goes the other way)."""
    payloads = [encode_log_record(record) for record, _, _ in rows]
    result = LeasedBatch(lease_until=lease_until, payloads=payloads,
                         receipts=[r for _, r, _ in rows], counts=[c for _, _, c in rows])
    assert result.columns is not None and len(result) == len(rows)
    ack = None if acked is None else AckCounts(acked=acked[0], stale=acked[1])
    for native_answer, python_answer in ((_receive_msgpack_native, receive_msgpack_py),
                                         (_receive_json_native, receive_json_py)):
        assert outcome(native_answer, result, ack, once) == outcome(
            python_answer, result, ack, once)


def test_a_leased_batch_is_messages_or_three_columns_of_one_length() -> None:
    """Columns make their LeasedMessage when asked for; columns of unequal lengths, or
    none at all, are refused."""
    record = LogRecord(topic="t", msg_id="m", queue_offset=3, body=b"b")
    batch = LeasedBatch(lease_until=9, payloads=[encode_log_record(record)], receipts=["r"],
                        counts=[2])
    (m,) = batch.messages
    assert (m.receipt, m.delivery_count, m.reconsume_times, m.record) == ("r", 2, 0, record)
    assert LeasedBatch(lease_until=9, messages=[m]).columns is None
    for bad in ({"payloads": [b""], "receipts": [], "counts": [1]}, {}):
        with pytest.raises(ValueError):
            LeasedBatch(lease_until=9, **bad)


# --- the keys: one definition, the schemas ----------------------------------------------------
def test_the_keys_are_the_schemas() -> None:
    """api/wire_keys.py builds every key the encoders write from the Structs: the pull
    answer's head and tail are msgspec's bytes of a PullResult, each Delivered/Received key
    is its field's name on the wire, and the send answer's pieces are the ones msgspec
    writes around a SendResult's values."""
    table = key_table()
    empty = msgspec.msgpack.encode(schemas.PullResult(messages=[], next_offset=5))
    assert empty == PULL_HEAD + b"\x90" + NEXT_OFFSET + b"\x05"
    assert table.keys[0] == tuple(msgspec.msgpack.encode(f.encode_name)
                                  for f in msgspec.structs.fields(schemas.Received))
    result = schemas.BatchResult(results=[schemas.SendResult(
        msg_id="I", topic="T", deliver_at=7, status=MessageStatus.SCHEDULED,
        cancel_handle="H", duplicate=False)])
    assert answer(table.keys[3], (b"\xa1I", b"\xa1T", b"\x07", b"\xa1H"),
                  b"\x91") == msgspec.msgpack.encode(result)
    assert answer(table.keys[4], (b"I", b"T", b"7", b"H")) == msgspec.json.encode(result)
    assert msgspec.json.encode(schemas.PullResult(messages=[], next_offset=5)) == \
        PULL_HEAD_JSON + NEXT_OFFSET_JSON + b"5}"
    assert table.json_keys[0] == tuple(msgspec.json.encode(f.encode_name) + b":"
                                       for f in msgspec.structs.fields(schemas.Received))
    head, lease, acked, stale = RECEIVE_JSON
    receive = schemas.ReceiveResult(messages=[], lease_until=3)
    assert msgspec.json.encode(receive) == head + lease + b"3}"
    receive.acked, receive.stale = 1, ["r"]
    assert msgspec.json.encode(receive) == head + lease + b"3" + acked + b"1" + stale + \
        b'["r"]}'


def answer(pieces: tuple[bytes, ...], values: tuple[bytes, ...], array: bytes = b"") -> bytes:
    """The send answer of one result as scheduled_answer writes it: the pieces with the
    values between them (``array``: msgpack's array header after the first)."""
    head, first, *rest = pieces
    out = head + array + first
    for value, piece in zip(values, rest, strict=False):  # (JSON: its tail is left)
        out += value + piece
    return out + b"".join(rest[len(values):])


def test_a_schema_listing_its_fields_otherwise_keeps_the_extension_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The extension writes each document's fields in an order of its own; were a Struct to
    list them otherwise, its keys would no longer fit it, and it does not load
    (api/_native.pyx checks ``fits`` at import, api/native.py then runs the twins)."""
    table = key_table()
    order = (table.delivered_fields, table.pull_fields, table.send_fields)
    if native is not None:
        assert order == (native.DELIVERED_FIELDS, native.PULL_FIELDS, native.SEND_FIELDS)
        assert (native.SEND_MSGPACK, native.SEND_JSON) == table.keys[3:]

    class Swapped(msgspec.Struct, rename="camel", kw_only=True):
        msg_id: str
        offset: int

    monkeypatch.setattr(schemas, "Received", Swapped)
    assert not key_table().fits(*order)
    assert table.fits(*order)
