"""The scheduler's compiled hot paths (scheduler/_native.pyx: the codec and intake loops) keep
the contract with their pure-Python twins (tests/support/twins.py); the rules C keeps its own
copy of equal their Python definitions."""

from __future__ import annotations

import hashlib
import os
import re
import struct
from collections import Counter
from collections.abc import Callable, Mapping
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.codec import (
    cancel_handles_py,
    delivered_index_values_py,
    ikey_msg_id,
    log_payload_from_value,
    log_payloads_py,
    message_value,
    scheduled_values_py,
    split_due_py,
)
from scheduler.group_state import Seal, receipt_offsets_py, same_receipts_py
from scheduler.levels import DelayLevels
from scheduler.native import native
from scheduler.timeline import _coarser_native, _coarser_py, _per_second_py
from scheduler.timing import resolve_timing
from storage.constants import MSG_ID_PATTERN
from storage.errors import CorruptionError, HourglassError
from storage.keys import encode_timer_key
from storage.records import (
    MessageRecord,
    decode_log_record,
    encode_message,
)
from tests.support import twins
from tests.support.native_strategies import (
    fits_int64,
    ids,
    ints,
    messages,
    mutations,
    props,
    texts,
)
from tests.support.twins import both, holds, or_none

needs_native = twins.needs_native("scheduler")


def python_payload(value: bytes, at: int) -> bytes | None:
    return or_none(log_payload_from_value, value, "topic", "id", 7, at, at + 1)


@needs_native
@settings(max_examples=200)
@given(record=messages, at=st.integers(0, 1 << 62), data=st.data())
def test_log_payloads(record: MessageRecord, at: int, data: st.DataObject) -> None:
    """Valid values: the same bytes, or None (properties). Damaged ones: the same bytes,
    or None where the Python path raises (a poison value) or could decide otherwise."""
    assert native is not None
    value = encode_message(record)
    values = [value, data.draw(mutations(value)), data.draw(mutations(value))]
    out = native.log_payloads(values, ["topic"] * 3, [b"topic\x00id"] * 3, [7] * 3, [at] * 3,
                              at + 1)
    # left to Python: properties to filter, a uint64 past int64
    holds(out[0], python_payload(value, at), takes=not record.properties and fits_int64(
        record.born_at, record.deliver_at, record.flags))
    for value, payload in zip(values, out, strict=True):
        if payload is not None:  # (only then is Python's answer asked for)
            holds(payload, python_payload(value, at), takes=None)


@needs_native
def test_log_payloads_fills_in_what_c_leaves() -> None:
    """The committer's entry point: C where it can, Python for the rest, same list."""
    from scheduler.codec import _log_payloads_native

    values = [message_value(b"a", None, (), {}, 1, 2, 0),
              message_value(b"b", "t", ("k",), {"DELAY": "3", "x": "y"}, 1, 2, 0)]
    args = (values, ["t1", "t2"], [b"t1\x00i1", b"t2\x00i2"], [0, 1], [5, 6], 9)
    assert _log_payloads_native(*args) == log_payloads_py(*args)
    with pytest.raises(CorruptionError):
        _log_payloads_native([b"\x98junk"], ["t"], [b"t\x00i"], [0], [5], 9)


@needs_native
@settings(max_examples=200)
@given(topic=st.sampled_from(["t", "tö", "orders"]), msg_id=st.text(max_size=12),
       other=st.sampled_from([None, "u", "t"]))
def test_log_payloads_read_each_msg_id_from_its_index_key(topic: str, msg_id: str,
                                                          other: str | None) -> None:
    """The msgId comes from the index key (topic NUL msgId), copied as bytes in C where it
    is ASCII and the key is of the record's topic; the rest is left to the Python path."""
    assert native is not None
    from scheduler.codec import _log_payloads_native

    value = message_value(b"body", None, (), {}, 1, 2, 0)
    ikey = (other if other is not None else topic).encode() + b"\x00" + msg_id.encode()
    args = ([value], [topic], [ikey], [3], [4], 5)
    twin = log_payloads_py(*args)
    assert decode_log_record(twin[0]).msg_id == ikey_msg_id(ikey)
    holds(native.log_payloads(*args)[0], twin[0],
          takes=(other is None or other == topic) and msg_id.isascii())
    assert _log_payloads_native(*args) == twin
    not_utf8 = ([value], [topic], [topic.encode() + b"\x00id\xff"], [3], [4], 5)
    assert native.log_payloads(*not_utf8) == [None]
    with pytest.raises(UnicodeDecodeError):  # a poison message (scheduler/poison.py)
        _log_payloads_native(*not_utf8)
    with pytest.raises(ValueError):
        native.log_payloads([value], [topic], [], [3], [4], 5)


@needs_native
def test_log_payloads_of_large_bodies_are_whole_and_owned_once() -> None:
    """Records cut to size in place (no copy of a 16 KiB body) are the Python twin's bytes,
    and the answer's list holds the only reference to each (none leaked, none shared)."""
    import sys

    assert native is not None
    bodies = [os.urandom(size) for size in (0, 1, 100, 16_384, 70_000, 1 << 20)]
    values = [message_value(b, "tag", ("k1", "k2"), {}, 11, 12, 0) for b in bodies]
    n = len(values)
    args = (values, ["topic"] * n, [b"topic\x00id%d" % i for i in range(n)], list(range(n)),
            [1 << 40] * n, (1 << 40) + 5)
    out = native.log_payloads(*args)
    assert out == log_payloads_py(*args)
    for i, body in enumerate(bodies):
        assert type(out[i]) is bytes and body in out[i]
        refs = sys.getrefcount(out[i])
        assert refs == 2  # the list's and the call's argument


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
    if junk.endswith(b"\xff"):  # a msgId that is not UTF-8: split alike, left in the key
        assert native.split_due(bad) == split_due_py(bad)
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
    holds(got, expected, takes=fits_int64(*ats, *offsets, *positions))


@needs_native
@settings(max_examples=200)
@given(keys=st.lists(st.binary(max_size=200), max_size=20))
def test_cancel_handles(keys: list[bytes]) -> None:
    assert native is not None
    holds(native.cancel_handles(keys), cancel_handles_py(keys), takes=True)


def per_second_c(ats: list[int]) -> Mapping[int, int]:
    assert native is not None
    counts: Mapping[int, int] = native.per_second(ats, 1000)
    return counts


@pytest.mark.parametrize("per_second", both("scheduler", per_second_c, _per_second_py))
@settings(max_examples=200)
@given(ats=st.lists(st.integers(-(1 << 40), 1 << 62), max_size=60)
       | st.lists(st.sampled_from([0, 999, 1000, 1001, -1, -1000, -1001, 5_000_000]),
                  max_size=60))
def test_per_second(per_second: Callable[[list[int]], Mapping[int, int]],
                    ats: list[int]) -> None:
    """Counts per second (floor division, also below zero), runs or spread."""
    expected = Counter(at // 1000 for at in ats)
    assert dict(per_second(ats)) == expected
    assert dict(per_second(sorted(ats))) == expected


@pytest.mark.parametrize("per_second", both("scheduler", per_second_c, _per_second_py))
@settings(max_examples=100)
@given(base=st.integers(-(1 << 45), 1 << 45), width=st.sampled_from([1, 3_600_000, 1 << 40]),
       spread=st.lists(st.floats(0, 1), min_size=1, max_size=3000))
def test_per_second_many(per_second: Callable[[list[int]], Mapping[int, int]], base: int,
                         width: int, spread: list[float]) -> None:
    """A fold's thousands of values, over a narrow span of seconds (the compiled twin counts
    them in an array) or a wide one, around 0 or not: counts per second (floor division)."""
    ats = [base + int(f * width) for f in spread]
    assert dict(per_second(ats)) == Counter(at // 1000 for at in ats)


@pytest.mark.parametrize("coarser", both("scheduler", _coarser_native, _coarser_py))
@settings(max_examples=200)
@given(counts=st.dictionaries(st.integers(-(1 << 40), 1 << 40) | st.integers(-5000, 5000),
                              st.integers(1, 1 << 20), max_size=300))
def test_coarser(coarser: Callable[[Mapping[int, int]], tuple[Mapping[int, int], ...]],
                 counts: dict[int, int]) -> None:
    """Counts per second summed per minute and per hour (floor division, also below 0)."""
    minutes, hours = coarser(counts)
    for got, ratio in ((minutes, 60), (hours, 3600)):
        expected: Counter[int] = Counter()
        for second, n in counts.items():
            expected[second // ratio] += n
        assert dict(got) == dict(expected)


@needs_native
@settings(max_examples=200)
@given(prefix=st.binary(max_size=20),
       ids=st.lists(st.text(alphabet="abcXYZ019_.:-", min_size=1, max_size=40), max_size=50))
def test_key_tails(prefix: bytes, ids: list[str]) -> None:
    """A column batch's msgIds read back from its index keys (``ColumnBatch.ids``): what is
    past the topic's prefix, as ASCII; nothing past it is refused."""
    assert native is not None
    keys = [prefix + i.encode() for i in ids]
    assert native.key_tails(keys, len(prefix)) == ids
    with pytest.raises(ValueError):
        native.key_tails([*keys, prefix], len(prefix))


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


@settings(max_examples=300)
@given(issued=st.lists(st.from_regex(r"\A4[01][0-9a-f]{1,16}\.[0-9a-f]{16}\.[0-9a-f]{1,5}\Z"),
                       min_size=1, max_size=8),
       edits=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 40),
                                st.sampled_from(["0", "f", ".", "\n", "\u00e9", "", "\ud800"])),
                      max_size=2),
       drop=st.booleans())
def test_same_receipts(issued: list[str], edits: list[tuple[int, int, str]],
                       drop: bool) -> None:
    """The usual ack's check (scheduler/group_state.py ``same_receipts``): the receipts as
    issued, or one changed by a character (replaced, inserted, removed: also non-ASCII or a
    lone surrogate), one missing, or split otherwise at "\\n": the compiled check answers
    the twin's, or None (not ASCII) and leaves it to the twin."""
    given_ = list(issued)
    for at, pos, ch in edits:
        at %= len(given_)
        r = given_[at]
        pos %= len(r) + 1
        given_[at] = r[:pos] + ch + r[pos + 1:]
    if drop and len(given_) > 1:
        given_.pop()
    expected = same_receipts_py(given_, issued)
    assert expected == (given_ == issued)
    if native is not None:
        assert native.same_receipts(given_, issued) in (expected, None)
        if all(r.isascii() for r in given_):
            assert native.same_receipts(given_, issued) is expected


def test_same_receipts_is_per_receipt_not_of_the_join() -> None:
    """Receipts that join to the same text but are split otherwise are not the same."""
    issued = ["40a.0123456789abcdef.1", "40a.0123456789abcdef.2"]
    moved = ["40a.0123456789abcdef.1\n40a", ".0123456789abcdef.2"]
    assert not same_receipts_py(moved, issued)
    assert same_receipts_py(list(issued), issued)
    assert not same_receipts_py([1, 2], issued)  # type: ignore[list-item]
    if native is not None:
        assert native.same_receipts(moved, issued) is False
        assert native.same_receipts(list(issued), issued) is True
        assert native.same_receipts([1, 2], issued) is None


@pytest.mark.parametrize("receipt_offsets",
                         both("scheduler", "receipt_offsets", receipt_offsets_py))
@settings(max_examples=300)
@given(prefix=st.from_regex(r"\A1[01][0-9a-f]{1,16}\.[0-9a-f]{12}\.\Z"),
       rows=st.lists(st.tuples(st.booleans(), suffixes), min_size=1, max_size=12))
def test_receipt_offsets(receipt_offsets: Callable[[list[str], str], list[int] | None],
                         prefix: str, rows: list[tuple[bool, str]]) -> None:
    """A lease's receipts (``prefix`` + offset in hex), or some of another lease, or with an
    offset written otherwise: each twin reads the offsets, or answers None."""
    receipts = [(prefix if own else "10ab.000000000000.") + suffix for own, suffix in rows]
    got = receipt_offsets(receipts, prefix)
    if all(own and re.fullmatch(r"0|[1-9a-f][0-9a-f]{0,15}", s) for own, s in rows):
        assert got == [int(s, 16) for _, s in rows]
    else:
        assert got is None


@needs_native
@settings(max_examples=200)
@given(key=st.binary(min_size=1, max_size=32), head=st.from_regex(r"\A3[01][0-9a-f]{1,16}\Z"),
       offsets=st.lists(st.integers(0, (1 << 64) - 1), max_size=40))
def test_seal_receipts(key: bytes, head: str, offsets: list[int]) -> None:
    """BLAKE2s keyed, written in C from RFC 7693: the receipts hashlib's seals, for offsets
    of every width in hex (1-16 digits)."""
    assert native is not None
    seal = Seal(key, "t", "g")
    lease_key = seal.lease_key(head)
    assert native.seal_receipts(lease_key, head, offsets) == [  # version 3's (still verified)
        f"{head}.{tag}.{o:x}" for o, tag in zip(offsets, seal.tags_py(
            head, [f"{o:x}" for o in offsets]), strict=True)]
    assert native.seal_receipts(key, head, offsets) == [
        f"{head}.{tag}.{o:x}" for o, tag in zip(offsets, native.seal_tags(
            key, [f"{o:x}" for o in offsets]), strict=True)]


@needs_native
@settings(max_examples=200)
@given(key=st.binary(min_size=1, max_size=32), offsets=st.lists(st.text(max_size=200).filter(
    lambda t: "\n" not in t), max_size=10))
def test_seal_tags(key: bytes, offsets: list[str]) -> None:
    """Any text as the offset (a forged receipt's), of one block, several or none."""
    assert native is not None
    want = [hashlib.blake2s(o.encode(), key=key, digest_size=8).hexdigest() for o in offsets]
    assert native.seal_tags(key, offsets) == want
    seal = Seal(key, "t", "g")
    assert native.seal_tags(seal.lease_key("30a"), offsets) == seal.tags_py("30a", offsets)


@needs_native
@settings(max_examples=200)
@given(key=st.binary(min_size=1, max_size=32), head=st.from_regex(r"\A4[01][0-9a-f]{1,16}\Z"),
       offsets=st.lists(st.one_of(st.integers(0, (1 << 64) - 1), st.integers(0, 40)),
                        max_size=40))
def test_seal_receipts4(key: bytes, head: str, offsets: list[int]) -> None:
    """Version 4: the quarter ``o & 3`` of a keyed BLAKE2s-256 of ``o >> 2`` in hex, as
    hashlib seals it, for offsets of every width, in and out of order (one digest serves the
    offsets of a quad in a row); ``seal_tags4`` verifies what ``seal_receipts4`` issued."""
    assert native is not None
    seal = Seal(key, "t", "g")
    lease_key = seal.lease_key(head)
    got = native.seal_receipts4(lease_key, head, offsets)
    assert got == seal.receipts_py(head, offsets)
    assert got == [f"{head}.{hashlib.blake2s(f'{o >> 2:x}'.encode(), key=lease_key, digest_size=32).hexdigest()[16 * (o & 3):16 * (o & 3) + 16]}.{o:x}"  # noqa: E501
                   for o in offsets]
    hexes = [f"{o:x}" for o in offsets]
    tags = [r.split(".")[1] for r in got]
    assert native.seal_tags4(lease_key, hexes) == tags == seal.tags_py(head, hexes)
    assert seal.tags(head, hexes) == tags


@needs_native
def test_seal_tags4_refuses_what_is_not_an_offset_in_hex() -> None:
    """A parsed receipt's offset is 1-16 lowercase hex digits; anything else is refused."""
    assert native is not None
    for bad in ("", "A", "1g", "0" * 17, " 1"):
        with pytest.raises(ValueError):
            native.seal_tags4(b"k", [bad])


# --- the rules C keeps its own copy of, held equal to their one definition in Python --------
@needs_native
def test_the_msg_id_rule_is_msg_id_pattern() -> None:
    """request_columns and msgpack_columns check a msgId in C (``_msg_id_ok``); it accepts
    exactly what storage.constants.MSG_ID_PATTERN matches: every character alone, at the
    edges of the allowed lengths, and in longer ids."""
    assert native is not None

    def c_accepts(msg_id: str) -> bool:
        try:
            return bool(native.msg_id_ok(msg_id))
        except UnicodeEncodeError:  # a lone surrogate: C leaves it to the general path
            return False

    samples = [chr(c) for c in range(0x3000)] + ["\U0001f600", "\ud800", "\x00"]
    samples += [c * n for c in ("a", ":", "-", "é", " ") for n in (0, 1, 2, 127, 128, 129, 300)]
    samples += [f"order-{c}-42" for c in map(chr, range(0x80))]
    wrong = [s for s in samples if c_accepts(s) != bool(MSG_ID_PATTERN.match(s))]
    assert wrong == []


NOW = 1_800_000_000_000
MAX_DELAY = 40 * 86_400_000
LEVELS = DelayLevels.parse("1s 5s")
AT_SAMPLES = [None, -1, 0, 1, NOW - 1, NOW, NOW + 1, NOW + MAX_DELAY - 1, NOW + MAX_DELAY,
              NOW + MAX_DELAY + 1, (1 << 63) - 1, 1 << 63, 1 << 64, True, False, 1.5, "5"]
DELAY_SAMPLES = [None, -1, 0, 1, 999, MAX_DELAY - 1, MAX_DELAY, MAX_DELAY + 1,
                 (1 << 63) - 1, 1 << 63, True, 1.0, "1"]


def python_due_later(at: object, delay: object) -> int:
    """What the general path (scheduler.timing.resolve_timing) makes of a deliverAt and a
    delayMs: the deliverAt of a message the columns path may take (one of the two given, due
    later), else -1."""
    if (at is None) == (delay is None):  # neither (due now) or both (refused)
        return -1
    try:
        timing = resolve_timing(now_ms=NOW, levels=LEVELS, max_delay_ms=MAX_DELAY,
                                deliver_at=at, delay_ms=delay)  # type: ignore[arg-type]
    except HourglassError:
        return -1
    return timing.deliver_at if timing.deliver_at > NOW else -1


def c_due_later(at: object, delay: object) -> int:
    assert native is not None
    try:
        return int(native.due_later(at, delay, None, NOW, MAX_DELAY))
    except OverflowError:  # past int64: the columns paths catch it and leave the message
        return -1


@needs_native
def test_the_timing_rule_is_resolve_timing() -> None:
    """A body-only message's deliverAt, computed in C (``_due_later``), is the general path's
    (resolve_timing), and C takes no message that path would refuse or deliver at once."""
    wrong = [(at, delay, c_due_later(at, delay), python_due_later(at, delay))
             for at in AT_SAMPLES for delay in DELAY_SAMPLES
             if c_due_later(at, delay) != python_due_later(at, delay)]
    assert wrong == []


@needs_native
@settings(max_examples=300)
@given(at=st.none() | st.integers(-(1 << 64), 1 << 65)
       | st.integers(NOW - 10, NOW + MAX_DELAY + 10),
       delay=st.none() | st.integers(-(1 << 64), 1 << 65) | st.integers(-10, MAX_DELAY + 10))
def test_the_timing_rule_on_any_ints(at: int | None, delay: int | None) -> None:
    assert c_due_later(at, delay) == python_due_later(at, delay)
