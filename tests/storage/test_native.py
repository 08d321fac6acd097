"""The compiled hot paths (storage/_native.pyx) give exactly what their pure-Python twins
give, and leave to them (None) whatever they do not recognise exactly."""

from __future__ import annotations

import json
import os
import platform
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from api.routes.consume import _pull_msgpack_native, delivered, pull_msgpack_py
from api.routes.groups import _receive_msgpack_native, receive_msgpack_py
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
from scheduler.groups import AckResult, Received, ReceiveResult
from scheduler.timeline import _per_second_py
from storage.batch import put_sorted_py
from storage.commitlog import CommitLog
from storage.errors import CorruptionError, HourglassError
from storage.keys import encode_timer_key
from storage.log_format import CRC_SEED, RECORD_MAGIC, frame_py
from storage.native import PURE_PYTHON_ENV, native
from storage.records import (
    LogRecord,
    MessageRecord,
    decode_log_record,
    encode_log_record,
    encode_message,
    log_record_offsets,
    log_record_offsets_py,
)

REPO = Path(__file__).resolve().parents[2]
needs_native = pytest.mark.skipif(native is None, reason="storage/_native is not built")


def test_the_extension_is_built() -> None:
    """pip builds it (setup.py); without it hourglass runs, slower, on the twins."""
    if os.environ.get(PURE_PYTHON_ENV):
        pytest.skip(f"{PURE_PYTHON_ENV} is set: the pure-Python twins are in use")
    assert native is not None, ("storage/_native is not built: pip install -e . (needs a C "
                                "compiler; Cython is fetched by the build)")


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


@needs_native
@settings(max_examples=300)
@given(data=st.binary(max_size=3000), value=st.integers(0, (1 << 32) - 1))
def test_crc32c(data: bytes, value: int) -> None:
    """Both ways C computes it: the CPU's crc32 instruction (where it has SSE4.2) and the
    tables."""
    assert native is not None
    hardware = native.crc32c_hardware()
    try:
        for use in (True, False):
            native.crc32c_hardware(use)
            assert native.crc32c(data, value) == crc32c(data, value)
    finally:
        native.crc32c_hardware(hardware)


@needs_native
def test_crc32c_uses_the_cpu_where_it_can() -> None:
    assert native is not None
    has_sse42 = platform.machine() == "x86_64" and "sse4_2" in Path(
        "/proc/cpuinfo").read_text().split()
    assert native.crc32c_hardware() is has_sse42
    assert native.crc32c_hardware(False) is False
    assert native.crc32c_hardware(True) is has_sse42


@needs_native
@settings(max_examples=200)
@given(payloads=st.lists(st.binary(max_size=600), max_size=40), start=st.integers(0, 1 << 40))
def test_frame(payloads: list[bytes], start: int) -> None:
    assert native is not None
    lengths = [len(p) for p in payloads]
    assert native.frame(payloads, lengths, start, RECORD_MAGIC, CRC_SEED) == frame_py(
        payloads, lengths, start)


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
@settings(max_examples=300)
@given(keys=st.lists(st.binary(max_size=6), max_size=40), handle=st.integers())
def test_put_sorted(keys: list[bytes], handle: int) -> None:
    """The same puts in the same order: bytes order, a prefix before what extends it, equal
    keys (which the engine never has) in list order; nothing put for bad input."""
    assert native is not None
    values = [b"v%d" % i for i in range(len(keys))]

    def recorder() -> tuple[list[tuple[bytes, bytes, int]], Callable[..., None]]:
        calls: list[tuple[bytes, bytes, int]] = []
        return calls, lambda k, v, h: calls.append((k, v, h))

    (py, put_py), (c, put_c) = recorder(), recorder()
    first_py = put_sorted_py(put_py, keys, values, handle)
    first_c = native.put_sorted(put_c, keys, values, handle)
    assert first_c == first_py == (min(keys) if keys else None)
    assert c == py == sorted(zip(keys, values, [handle] * len(keys), strict=True),
                             key=lambda t: t[0])
    for put_sorted in (put_sorted_py, native.put_sorted):
        calls, put = recorder()
        with pytest.raises(ValueError):
            put_sorted(put, keys, [*values, b"one too many"], handle)
        assert calls == []
    if keys:
        calls, put = recorder()
        with pytest.raises(TypeError):
            native.put_sorted(put, [*keys, "not bytes"], [*values, b"v"], handle)
        assert calls == []


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


def python_offsets(payloads: list[bytes]) -> list[int] | None:
    try:
        return log_record_offsets_py(payloads)
    except HourglassError:
        return None


@needs_native
@settings(max_examples=200)
@given(records=st.lists(log_records, min_size=1, max_size=10), data=st.data())
def test_record_offsets(records: list[LogRecord], data: st.DataObject) -> None:
    """The queue offsets read from the records' heads in C are Python's, for every list C
    takes; a damaged record anywhere (a byte changed, cut short, lengthened) leaves the whole
    list to Python, which raises for it."""
    assert native is not None
    payloads = [encode_log_record(r) for r in records]
    offsets = native.record_offsets(payloads)
    if all(len(r.properties) <= 16 and fits_int64(r.queue_offset, r.born_at, r.deliver_at,
                                                   r.stored_at, r.flags) for r in records):
        assert offsets == [r.queue_offset for r in records] == python_offsets(payloads)
    else:
        assert offsets is None
    k = data.draw(st.integers(0, len(payloads) - 1))
    damaged = [*payloads[:k], data.draw(mutations(payloads[k])), *payloads[k + 1:]]
    offsets = native.record_offsets(damaged)
    if offsets is not None:
        assert offsets == python_offsets(damaged)
    elif python_offsets(damaged) is None:
        with pytest.raises(HourglassError):
            log_record_offsets(damaged)


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


def read_both(log: CommitLog, positions: list[int],
              max_bytes: int | None) -> tuple[object, object]:
    """read_many through C and through Python: the payloads or the error."""
    import storage.commitlog as commitlog

    results = []
    for module in (native, None):
        commitlog.native = module
        try:
            results.append(log.read_many(positions, max_bytes))
        except HourglassError as exc:
            results.append((type(exc), str(exc)))
        finally:
            commitlog.native = native
    return results[0], results[1]


@needs_native
def test_read_many_across_segments_and_damage(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "log", segment_size=4096)
    try:
        payloads = [bytes([i]) * (100 + i * 7 % 300) for i in range(60)]
        positions = log.append_batch(payloads[:30]) + log.append_batch(payloads[30:])
        assert len({p // 4096 for p in positions}) > 2  # several segments
        for max_bytes in (None, 0, 500, 5000):
            c, py = read_both(log, positions, max_bytes)
            assert c == py
        assert read_both(log, positions, None)[0] == payloads
        c, py = read_both(log, [positions[3] + 1], None)  # not a record
        assert c == py and c[0].__name__ == "InvalidArgument"  # type: ignore[index]
        seg = log._segments[positions[5] // 4096]
        seg.mm[positions[5] % 4096 + 12] ^= 0xFF  # a payload byte: its CRC fails
        c, py = read_both(log, positions, None)
        assert c == py and c[0] is CorruptionError  # type: ignore[index]
    finally:
        log.close()


def run_scenario(data_dir: Path, pure: bool) -> dict[str, object]:
    env = {**os.environ, PURE_PYTHON_ENV: "1" if pure else ""}
    done = subprocess.run([sys.executable, "-m", "tests.support.native_run", str(data_dir)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@needs_native
def test_the_engine_writes_and_answers_the_same_either_way(tmp_path: Path) -> None:
    """The same sends through a whole engine, compiled and pure: the same CommitLog bytes
    and the same pull answers (tests/support/native_run.py)."""
    compiled = run_scenario(tmp_path / "native", pure=False)
    pure = run_scenario(tmp_path / "pure", pure=True)
    assert (compiled["native"], pure["native"]) == (True, False)
    assert compiled["pulled"] == pure["pulled"] == 600
    assert compiled["log"] == pure["log"]
    assert compiled["pulls"] == pure["pulls"]


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
