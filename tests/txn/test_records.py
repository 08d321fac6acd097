"""Pure parts of transactions: RocketMQ's immunity rule, the codecs, transaction ids."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.tx_records import (
    HalfMessage,
    TransactionEntry,
    TransactionState,
    decode_entry,
    decode_half,
    encode_entry,
    encode_half,
    group_key,
    group_prefix,
    immunity_ms,
    is_transaction_id,
    new_transaction_id,
    parse_java_long,
)
from storage.errors import CorruptionError, InvalidArgument
from storage.keys import encode_timer_key

TIMEOUT = 6_000


@pytest.mark.parametrize(
    ("value", "expected_ms"),
    [
        # RocketMQ's own cases
        ("1", 6_000),
        ("7", 7_000),
        ("-1", 6_000),
        ("100.5", 6_000),
        (None, 6_000),
        # more of Long.parseLong's behaviour
        ("0", 6_000),
        ("+8", 8_000),
        ("6", 6_000),
        ("3600", 3_600_000),
        ("", 6_000),
        (" 7", 6_000),  # parseLong does not trim
        ("7s", 6_000),
        ("1e3", 6_000),
        ("9223372036854775808", 6_000),  # one past Long.MAX_VALUE: NumberFormatException
        # numbers are taken as the integer they are; a fraction is not a long
        (7, 7_000),
        (1, 6_000),
        (100.5, 6_000),
        (7.0, 7_000),  # how a float-typed JSON field decodes 7
        (float("nan"), 6_000),
        (float("inf"), 6_000),
        (True, 6_000),
    ],
)
def test_immunity_follows_rocketmq(value: str | int | float | None, expected_ms: int) -> None:
    assert immunity_ms(value, TIMEOUT) == expected_ms


def test_immunity_is_capped() -> None:
    assert immunity_ms("9223372036854775807", TIMEOUT, max_ms=10_000) == 10_000
    assert immunity_ms("9", TIMEOUT, max_ms=10_000) == 9_000


def test_immunity_follows_the_configured_timeout() -> None:
    assert immunity_ms("7", 10_000) == 10_000
    assert immunity_ms(None, 2_000) == 2_000
    assert immunity_ms("3", 2_000) == 3_000


@given(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1))
def test_parse_java_long_round_trips(value: int) -> None:
    assert parse_java_long(str(value)) == value


def test_transaction_ids_are_unique_opaque_and_time_ordered() -> None:
    ids = [new_transaction_id(1_700_000_000_000 + i // 100) for i in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(is_transaction_id(i) and len(i) == 26 for i in ids)
    # the time prefix orders ids of different milliseconds
    assert new_transaction_id(1_700_000_000_000) < new_transaction_id(1_700_000_000_001)
    assert not is_transaction_id("not-a-transaction")
    assert not is_transaction_id(ids[0].lower())


_text = st.text(max_size=20)
_opt_int = st.none() | st.integers(min_value=0, max_value=(1 << 63) - 1)


@given(
    tx_id=st.just(new_transaction_id(0)), group=_text, body=st.binary(max_size=200),
    tags=st.none() | _text, keys=st.lists(_text, max_size=3).map(tuple),
    properties=st.dictionaries(_text, _text, max_size=3), deliver_at=_opt_int,
    delay_ms=_opt_int, delay_level=st.none() | st.integers(1, 18), prepared_at=_opt_int,
)
def test_half_message_round_trip(**fields: object) -> None:
    fields["prepared_at"] = fields["prepared_at"] or 0
    half = HalfMessage(producer_group=fields.pop("group"), **fields)  # type: ignore[arg-type]
    assert decode_half(encode_half(half)) == half


@given(state=st.sampled_from(TransactionState), check_times=st.integers(0, 100),
       deliver_at=_opt_int, now=st.integers(0, 1 << 62))
def test_entry_round_trip(state: TransactionState, check_times: int, deliver_at: int | None,
                          now: int) -> None:
    entry = TransactionEntry(
        topic="orders", msg_id="m-1", producer_group="pg", state=state, prepared_at=now,
        immunity_ms=6_000, next_check_at=now + 6_000, check_times=check_times,
        deliver_at=deliver_at, updated_at=now,
    )
    decoded = decode_entry(encode_entry(entry))
    assert decoded == entry
    assert type(decoded.state) is TransactionState


def test_decoders_accept_newer_and_older_records() -> None:
    entry = TransactionEntry(topic="t", msg_id="m", producer_group="g",
                             state=TransactionState.PREPARED, prepared_at=1, immunity_ms=6_000,
                             next_check_at=6_001, check_times=2, deliver_at=None, updated_at=3)
    values = msgpack.unpackb(encode_entry(entry), use_list=True)
    newer = msgpack.packb([*values, "a field from the future"], use_bin_type=True)
    assert decode_entry(newer) == entry
    older = msgpack.packb(values[:9], use_bin_type=True)  # no deliver_at / updated_at yet
    assert decode_entry(older).deliver_at is None
    assert decode_entry(older).check_times == 2


@pytest.mark.parametrize("raw", [b"", b"\xc1", msgpack.packb({"a": 1}), msgpack.packb(["x"]),
                                 msgpack.packb([1, "t", "m", "g", "NOT_A_STATE", 0, 0, 0])])
def test_garbage_is_a_corruption_error(raw: bytes) -> None:
    with pytest.raises(CorruptionError):
        decode_entry(raw)
    if raw != msgpack.packb([1, "t", "m", "g", "NOT_A_STATE", 0, 0, 0]):
        with pytest.raises(CorruptionError):
            decode_half(raw)


def test_group_keys_keep_groups_apart_and_sort_by_time() -> None:
    a_late = group_key("a", encode_timer_key(2_000, "t", "m"))
    a_early = group_key("a", encode_timer_key(1_000, "t", "z"))
    ab = group_key("a.b", encode_timer_key(0, "t", "m"))
    assert a_early < a_late
    assert a_early.startswith(group_prefix("a")) and a_late.startswith(group_prefix("a"))
    assert not ab.startswith(group_prefix("a"))
    with pytest.raises(InvalidArgument):
        from scheduler.tx_records import check_group
        check_group("bad\x00group")
