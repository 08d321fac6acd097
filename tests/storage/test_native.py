"""Storage's compiled hot paths (storage/_native.pyx: CRC32C, CommitLog framing and record
reads, a LogRecord's head, sorted puts) keep the contract with their pure-Python twins
(tests/support/twins.py); a whole engine writes and answers the same with every layer's
extension and with none."""

from __future__ import annotations

import json
import os
import platform
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.batch import put_sorted_py
from storage.commitlog import CommitLog
from storage.consume_queue import cq_run_py
from storage.errors import CorruptionError, HourglassError
from storage.log_format import CRC_SEED, RECORD_MAGIC, frame_headers_py, frame_py
from storage.native import PURE_PYTHON_ENV, native
from storage.records import (
    LogRecord,
    encode_log_record,
    log_record_offsets,
    log_record_offsets_py,
)
from tests.support import twins
from tests.support.native_strategies import (
    fits_int64,
    log_records,
    mutations,
)
from tests.support.twins import both, holds, or_none

REPO = Path(__file__).resolve().parents[2]
needs_native = twins.needs_native("storage")


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
def test_crc32c_of_long_buffers_in_three_lanes() -> None:
    """Buffers long enough for the instruction's three lanes (1536 bytes a stretch, joined
    through the tables of 512 zero bytes), at every length around a stretch's end and with
    a tail of every size, from any running value, agree with the tables and the package."""
    assert native is not None
    data = bytes((i * 131 + (i >> 7) * 29) & 0xFF for i in range(3 * 1536 + 40))
    lengths = [n for base in (1536, 3072, 4608) for n in range(base - 9, base + 17)]
    lengths += [0, 7, 511, 512, 1535, 16384]
    long = (data * 4)[:16384]
    hardware = native.crc32c_hardware()
    try:
        for n in lengths:
            piece = (long if n == 16384 else data)[:n]
            for value in (0, 1, 0xFFFFFFFF, 0x9E3779B9):
                expected = crc32c(piece, value)
                for use in (True, False):
                    native.crc32c_hardware(use)
                    assert native.crc32c(piece, value) == expected, (n, value, use)
                    # resumed in the middle: CRC(a + b) == CRC(b) from CRC(a)
                    half = native.crc32c(piece[:n // 3], value)
                    assert native.crc32c(piece[n // 3:], half) == expected
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
    holds(native.frame(payloads, lengths, start, RECORD_MAGIC, CRC_SEED),
          frame_py(payloads, lengths, start), takes=True)


@needs_native
@settings(max_examples=200)
@given(payloads=st.lists(st.binary(max_size=600), max_size=40), start=st.integers(0, 1 << 40))
def test_frame_headers(payloads: list[bytes], start: int) -> None:
    """The headers of a gathered write: each header of ``frame``, and its positions."""
    assert native is not None
    lengths = [len(p) for p in payloads]
    headers, positions = frame_headers_py(payloads, lengths, start)
    holds(native.frame_headers(payloads, start, RECORD_MAGIC, CRC_SEED),
          (headers, positions), takes=True)
    framed, framed_positions = frame_py(payloads, lengths, start)
    assert framed_positions == positions
    assert framed == b"".join(headers[12 * i:12 * i + 12] + p for i, p in enumerate(payloads))


@needs_native
@settings(max_examples=300)
@given(entries=st.lists(st.tuples(st.integers(-2, (1 << 64) + 2), st.integers(-2, (1 << 32) + 2)),
                        max_size=40), extra=st.booleans())
def test_cq_run(entries: list[tuple[int, int]], extra: bool) -> None:
    """A consume-queue run's value: the twin's bytes where every position and size is in
    range, None (the Python path raises) where one is not or the columns differ in length."""
    assert native is not None
    positions, sizes = [p for p, _ in entries], [s for _, s in entries]
    if extra:
        sizes.append(1)
    try:
        twin: bytes | None = cq_run_py(positions, sizes)
    except struct.error:
        twin = None
    holds(native.cq_run(positions, sizes), None if extra else twin,
          takes=not extra and twin is not None)
    assert native.cq_run([1.0], [1]) is None and native.cq_run([True], [1]) is None


def recorder() -> tuple[list[tuple[bytes, bytes, int]], Callable[..., None]]:
    calls: list[tuple[bytes, bytes, int]] = []
    return calls, lambda k, v, h: calls.append((k, v, h))


@pytest.mark.parametrize("put_sorted", both("storage", "put_sorted", put_sorted_py))
@settings(max_examples=300)
@given(keys=st.lists(st.binary(max_size=6), max_size=40), handle=st.integers())
def test_put_sorted(put_sorted: Callable[..., bytes | None], keys: list[bytes],
                    handle: int) -> None:
    """Each twin puts in bytes order, a prefix before what extends it, equal keys (which the
    engine never has) in list order, and returns the first key put; nothing put for bad
    input."""
    values = [b"v%d" % i for i in range(len(keys))]
    calls, put = recorder()
    assert put_sorted(put, keys, values, handle) == (min(keys) if keys else None)
    assert calls == sorted(zip(keys, values, [handle] * len(keys), strict=True),
                           key=lambda t: t[0])
    calls, put = recorder()
    with pytest.raises(ValueError):
        put_sorted(put, keys, [*values, b"one too many"], handle)
    assert calls == []
    if keys:
        calls, put = recorder()
        with pytest.raises(TypeError):
            put_sorted(put, [*keys, "not bytes"], [*values, b"v"], handle)
        assert calls == []


@pytest.mark.parametrize("put_sorted", both("storage", "put_sorted", put_sorted_py))
@settings(max_examples=200)
@given(stem=st.binary(max_size=10),
       tails=st.lists(st.binary(max_size=12), max_size=300),
       extra=st.lists(st.integers(min_value=0, max_value=299), max_size=20))
def test_put_sorted_shared_prefix(put_sorted: Callable[..., bytes | None], stem: bytes,
                                  tails: list[bytes], extra: list[int]) -> None:
    """Keys that share a prefix (a timer CF's time, an index CF's topic) and differ past it,
    some shorter than 8 bytes past it, some repeated, in lists long enough for the compiled
    twin's merge passes: put in bytes order, equal keys in list order."""
    keys = [stem + t for t in tails]
    keys += [keys[i] for i in extra if i < len(keys)]
    values = [b"v%d" % i for i in range(len(keys))]
    calls, put = recorder()
    assert put_sorted(put, keys, values, 7) == (min(keys) if keys else None)
    assert calls == sorted(zip(keys, values, [7] * len(keys), strict=True), key=lambda t: t[0])
    # distinct: the same, or False with nothing put when a key is there twice
    distinct, put = recorder()
    if len(set(keys)) == len(keys):
        assert put_sorted(put, keys, values, 7, True) == (min(keys) if keys else None)
        assert distinct == calls
    else:
        assert put_sorted(put, keys, values, 7, True) is False
        assert distinct == []


def python_offsets(payloads: list[bytes]) -> list[int] | None:
    return or_none(log_record_offsets_py, payloads)


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
    takes = all(len(r.properties) <= 16 and fits_int64(r.queue_offset, r.born_at, r.deliver_at,
                                                       r.stored_at, r.flags) for r in records)
    holds(offsets, python_offsets(payloads), takes=takes)
    if takes:
        assert offsets == [r.queue_offset for r in records]
    k = data.draw(st.integers(0, len(payloads) - 1))
    damaged = [*payloads[:k], data.draw(mutations(payloads[k])), *payloads[k + 1:]]
    offsets = native.record_offsets(damaged)
    if offsets is not None:
        holds(offsets, python_offsets(damaged), takes=None)
    elif python_offsets(damaged) is None:
        with pytest.raises(HourglassError):
            log_record_offsets(damaged)


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
