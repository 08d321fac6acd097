"""What the contract suites of the compiled hot paths share (tests/storage/test_native.py,
tests/scheduler/test_native.py, tests/api/test_native.py): records to encode, damage to do
to their bytes."""

from __future__ import annotations

from hypothesis import strategies as st

from storage.records import LogRecord, MessageRecord

texts = st.text(max_size=40)
ids = st.text(min_size=1, max_size=30).filter(lambda s: "\x00" not in s)
ints = st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
props = st.dictionaries(texts, texts, max_size=3) | st.just({})
messages = st.builds(
    MessageRecord, body=st.binary(max_size=400) | st.text(max_size=80).map(str.encode),
    tags=st.none() | texts, keys=st.lists(texts, max_size=4).map(tuple),
    properties=st.just({}) | props, born_at=ints, deliver_at=ints, flags=ints)
log_records = st.builds(
    LogRecord, topic=ids, msg_id=ids, queue_offset=ints,
    body=st.binary(max_size=400) | st.text(max_size=300).map(str.encode),
    tags=st.none() | texts, keys=st.lists(texts, max_size=20).map(tuple),
    properties=props | st.dictionaries(texts, texts, min_size=15, max_size=20),
    born_at=ints, deliver_at=ints, stored_at=ints, flags=ints)


def fits_int64(*values: int) -> bool:
    return all(-(1 << 63) <= v < (1 << 63) for v in values)


def mutations(data: bytes) -> st.SearchStrategy[bytes]:
    """``data`` with a byte changed, cut short or lengthened."""
    return st.one_of(
        st.tuples(st.integers(0, max(len(data) - 1, 0)), st.integers(0, 255)).map(
            lambda t: data[:t[0]] + bytes([t[1]]) + data[t[0] + 1:]),
        st.integers(0, len(data)).map(lambda n: data[:n]),
        st.binary(min_size=1, max_size=3).map(lambda b: data + b))
