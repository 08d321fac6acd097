"""The scheduler's compiled hot paths (scheduler/_native.pyx: the codec and intake loops) give
exactly what their pure-Python twins give, and leave to them (None) whatever they do not
recognise exactly; the rules it keeps its own copy of equal their Python definitions."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.codec import (
    cancel_handles_py,
    delivered_index_values_py,
    log_payload_from_value,
    log_payloads_py,
    message_value,
    scheduled_values_py,
    split_due_py,
)
from scheduler.group_state import receipt_offsets_py
from scheduler.native import native
from scheduler.timeline import _per_second_py
from storage.errors import CorruptionError, HourglassError
from storage.keys import encode_timer_key
from storage.native import PURE_PYTHON_ENV
from storage.records import (
    MessageRecord,
    encode_message,
)
from tests.support.native_strategies import (
    fits_int64,
    ids,
    ints,
    messages,
    mutations,
    props,
    texts,
)

REPO = Path(__file__).resolve().parents[2]
needs_native = pytest.mark.skipif(native is None, reason="scheduler/_native is not built")


def test_the_extension_is_built() -> None:
    """pip builds it (setup.py); without it hourglass runs, slower, on the twins."""
    if os.environ.get(PURE_PYTHON_ENV):
        pytest.skip(f"{PURE_PYTHON_ENV} is set: the pure-Python twins are in use")
    assert native is not None, ("scheduler/_native is not built: pip install -e . (needs a C "
                                "compiler; Cython is fetched by the build)")


def python_payload(value: bytes, at: int) -> bytes | None:
    try:
        return log_payload_from_value(value, "topic", "id", 7, at, at + 1)
    except HourglassError:
        return None


@needs_native
@settings(max_examples=200)
@given(record=messages, at=st.integers(0, 1 << 62), data=st.data())
def test_log_payloads(record: MessageRecord, at: int, data: st.DataObject) -> None:
    """Valid values: the same bytes, or None (properties). Damaged ones: the same bytes,
    or None where the Python path raises (a poison value) or could decide otherwise."""
    assert native is not None
    value = encode_message(record)
    values = [value, data.draw(mutations(value)), data.draw(mutations(value))]
    out = native.log_payloads(values, ["topic"] * 3, ["id"] * 3, [7] * 3, [at] * 3, at + 1)
    if record.properties or not fits_int64(record.born_at, record.deliver_at, record.flags):
        assert out[0] is None  # left to Python: properties to filter, a uint64 past int64
    else:
        assert out[0] == python_payload(value, at) is not None
    for value, payload in zip(values, out, strict=True):
        if payload is not None:
            assert payload == python_payload(value, at)


@needs_native
def test_log_payloads_fills_in_what_c_leaves() -> None:
    """The committer's entry point: C where it can, Python for the rest, same list."""
    from scheduler.codec import _log_payloads_native

    values = [message_value(b"a", None, (), {}, 1, 2, 0),
              message_value(b"b", "t", ("k",), {"DELAY": "3", "x": "y"}, 1, 2, 0)]
    args = (values, ["t1", "t2"], ["i1", "i2"], [0, 1], [5, 6], 9)
    assert _log_payloads_native(*args) == log_payloads_py(*args)
    with pytest.raises(CorruptionError):
        _log_payloads_native([b"\x98junk"], ["t"], ["i"], [0], [5], 9)


@needs_native
@settings(max_examples=200)
@given(keys=st.lists(st.tuples(st.integers(0, (1 << 64) - 1), st.sampled_from(["t", "tö", "u"]),
                               ids), max_size=30),
       junk=st.sampled_from([b"", b"short", b"\x00" * 8 + b"no-nul", b"\x00" * 8 + b"t\x00\xff"]))
def test_split_due(keys: list[tuple[int, str, str]], junk: bytes) -> None:
    assert native is not None
    items = [(encode_timer_key(at, topic, msg_id), b"v%d" % i)
             for i, (at, topic, msg_id) in enumerate(keys)]
    assert native.split_due(items) == split_due_py(items)
    bad = [*items, (junk, b"v")]
    if junk.endswith(b"\xff"):  # a msgId that is not UTF-8: both raise
        with pytest.raises(UnicodeDecodeError):
            split_due_py(bad)
        with pytest.raises(UnicodeDecodeError):
            native.split_due(bad)
    else:  # not deliverAt + topic + NUL + msgId: C hands it to Python, which raises
        with pytest.raises((ValueError, struct.error)):
            split_due_py(bad)
        assert native.split_due(bad) is None


@needs_native
@settings(max_examples=200)
@given(rows=st.lists(st.tuples(ints, ints, ints), max_size=30), now=st.integers(0, 1 << 62))
def test_delivered_index_values(rows: list[tuple[int, int, int]], now: int) -> None:
    assert native is not None
    ats, offsets, positions = ([r[i] for r in rows] for i in range(3))
    got = native.delivered_index_values(ats, now, offsets, positions)
    expected = delivered_index_values_py(ats, now, offsets, positions, [None] * len(rows))
    if fits_int64(*ats, *offsets, *positions):
        assert got == expected
    else:
        assert got is None


@needs_native
@settings(max_examples=200)
@given(keys=st.lists(st.binary(max_size=200), max_size=20))
def test_cancel_handles(keys: list[bytes]) -> None:
    assert native is not None
    assert native.cancel_handles(keys) == cancel_handles_py(keys)


@needs_native
@settings(max_examples=200)
@given(ats=st.lists(st.integers(-(1 << 40), 1 << 62), max_size=60)
       | st.lists(st.sampled_from([0, 999, 1000, 1001, -1, -1000, -1001, 5_000_000]),
                  max_size=60))
def test_per_second(ats: list[int]) -> None:
    """Counts per second (floor division, also below zero), runs or spread."""
    assert native is not None
    assert native.per_second(ats, 1000) == dict(_per_second_py(ats))
    assert native.per_second(sorted(ats), 1000) == dict(_per_second_py(sorted(ats)))


prepared = st.builds(
    SimpleNamespace, body=st.binary(max_size=300), tags=st.none() | texts,
    keys=st.lists(texts, max_size=20).map(tuple), properties=st.just({}) | props,
    born_at=ints, deliver_at=st.integers(0, 1 << 62), flags=st.integers(0, 1 << 20),
    tx_id=st.none() | texts)


@needs_native
@settings(max_examples=300)
@given(messages=st.lists(prepared, max_size=8), at=st.integers(0, 1 << 62))
def test_scheduled_values(messages: list[SimpleNamespace], at: int) -> None:
    """The same values, or a refusal (properties, a value past int64) that sends the batch
    to the Python path."""
    assert native is not None
    expected = scheduled_values_py(messages, at)
    try:
        got = native.scheduled_values(messages, at)
    except (TypeError, OverflowError):
        assert any(m.properties or not fits_int64(m.born_at) for m in messages
                   if m.deliver_at > at)
    else:
        assert got == expected


suffixes = st.one_of(
    st.integers(0, (1 << 64) - 1).map(lambda v: f"{v:x}"),  # as receipts write them
    st.text("0123456789abcdefABCDEF_\n x", max_size=18),  # anything near it
)


@needs_native
@settings(max_examples=300)
@given(prefix=st.from_regex(r"\A1[01][0-9a-f]{1,16}\.[0-9a-f]{12}\.\Z"),
       rows=st.lists(st.tuples(st.booleans(), suffixes), min_size=1, max_size=12))
def test_receipt_offsets(prefix: str, rows: list[tuple[bool, str]]) -> None:
    """A lease's receipts (``prefix`` + offset in hex), or some of another lease, or with an
    offset written otherwise: C and Python agree on the offsets, or on None."""
    assert native is not None
    receipts = [(prefix if own else "10ab.000000000000.") + suffix for own, suffix in rows]
    got = native.receipt_offsets(receipts, prefix)
    assert got == receipt_offsets_py(receipts, prefix)
    if all(own and re.fullmatch(r"0|[1-9a-f][0-9a-f]{0,15}", s) for own, s in rows):
        assert got == [int(s, 16) for _, s in rows]
    else:
        assert got is None
