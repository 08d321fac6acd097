"""The HTTP layer's compiled wire encoders (api/_native.pyx) give exactly what their
pure-Python twins give, and leave to them (None) whatever they do not recognise exactly;
the keys they write are the schemas'."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.native import native
from api.routes.consume import _pull_msgpack_native, delivered, pull_msgpack_py
from api.routes.groups import _receive_msgpack_native, receive_msgpack_py
from scheduler.groups import AckResult, Received, ReceiveResult
from storage.errors import CorruptionError, HourglassError
from storage.native import PURE_PYTHON_ENV
from storage.records import (
    LogRecord,
    decode_log_record,
    encode_log_record,
)
from tests.support.native_strategies import (
    fits_int64,
    log_records,
    mutations,
)

REPO = Path(__file__).resolve().parents[2]
needs_native = pytest.mark.skipif(native is None, reason="api/_native is not built")


def test_the_extension_is_built() -> None:
    """pip builds it (setup.py); without it hourglass runs, slower, on the twins."""
    if os.environ.get(PURE_PYTHON_ENV):
        pytest.skip(f"{PURE_PYTHON_ENV} is set: the pure-Python twins are in use")
    assert native is not None, ("api/_native is not built: pip install -e . (needs a C "
                                "compiler; Cython is fetched by the build)")


def python_delivered(payload: bytes, once: bool = False) -> bytes | None:
    try:
        return msgspec.msgpack.encode(delivered(decode_log_record(payload), once))
    except HourglassError:
        return None


@needs_native
@settings(max_examples=200)
@given(record=log_records, data=st.data(), once=st.booleans())
def test_delivered_msgpack(record: LogRecord, data: st.DataObject, once: bool) -> None:
    """``once``: ``Prefer: body=once`` (one body: the text, else the bytes)."""
    assert native is not None
    payload = encode_log_record(record)
    payloads = [payload, data.draw(mutations(payload))]
    out, offsets = native.delivered_msgpack(payloads, once=once)
    if len(record.properties) <= 16 and fits_int64(
            record.queue_offset, record.born_at, record.deliver_at, record.stored_at,
            record.flags):
        assert out[0] == python_delivered(payload, once) is not None
        assert offsets[0] == record.queue_offset
    else:
        assert out[0] is None
    if out[1] is not None:
        assert out[1] == python_delivered(payloads[1], once)


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
    if all(len(r.properties) <= 16 and fits_int64(r.queue_offset, r.born_at, r.deliver_at,
                                                   r.stored_at, r.flags) for r in records) \
            and records[-1].queue_offset < (1 << 63) - 1:
        assert frame == pull_msgpack_py(payloads, 0, once)
    else:
        assert frame is None
    k = data.draw(st.integers(0, len(payloads) - 1))
    damaged = [*payloads[:k], data.draw(mutations(payloads[k])), *payloads[k + 1:]]
    frame = native.pull_frame(damaged, once)
    if frame is not None:
        assert frame == pull_msgpack_py(damaged, 0, once)
    assert native.pull_frame([], once) is None


def outcome(fn: Callable[..., bytes], *args: object) -> bytes | type[BaseException]:
    """What ``fn`` returns, or the type of what it raises (a next offset past uint64)."""
    try:
        return fn(*args)
    except (OverflowError, HourglassError) as exc:
        return type(exc)


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
    result = ReceiveResult(lease_until=lease_until, messages=[
        Received(receipt, count, times, encode_log_record(record)) if stored
        else Received(receipt, count, times, shown=record)
        for record, stored, receipt, count, times in rows])
    ack = None if acked is None else AckResult(acked=acked[0], stale=acked[1])
    assert outcome(_receive_msgpack_native, result, ack, once) == outcome(
        receive_msgpack_py, result, ack, once)
