"""The CommitLog reader against random segment files: random bytes, and valid records mixed
with garbage, zeros, end-of-segment markers, bad CRCs, impossible lengths and flipped bits,
in segments whose names may not line up, with any checkpoint file.

Whatever is on disk: opening raises only the documented errors (StorageError,
CorruptionError, InvalidArgument) or succeeds; ``verify()`` never raises; ``iter_from`` and
``read`` return only records whose frame and CRC32C check out against the bytes on disk
(recomputed here, independently) or raise CorruptionError / InvalidArgument; nothing loops
forever (a per-example alarm). A read-write open that succeeds with ``full_check`` leaves a
log that verifies clean and takes appends that survive a reopen.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import struct
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from storage.commitlog import CHECKPOINT_NAME, CommitLog
from storage.errors import CorruptionError, InvalidArgument, OffsetExpired, StorageError
from storage.log_format import CRC_SEED, EOS_MAGIC, HEADER, HEADER_SIZE, RECORD_MAGIC
from storage.segment import segment_name

DOCUMENTED = (StorageError, CorruptionError, InvalidArgument)
TIME_LIMIT_S = 5  # one example; a walk that loops forever fails here, not at pytest's timeout
FUZZ = settings(max_examples=100, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise TimeoutError(f"the CommitLog reader ran for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def frame(payload: bytes, *, crc_delta: int = 0, length: int | None = None) -> bytes:
    n = len(payload) if length is None else length
    crc = (crc32c(payload, len(payload) ^ CRC_SEED) + crc_delta) & 0xFFFFFFFF
    return HEADER.pack(RECORD_MAGIC, n, crc) + payload


chunks = st.one_of(
    st.binary(max_size=60).map(frame),  # a valid record
    st.binary(max_size=60).map(frame),
    st.binary(min_size=1, max_size=40).map(lambda p: frame(p, crc_delta=1)),  # bad CRC
    st.integers(61, 2**32 - 1).map(lambda n: frame(b"x", length=n)),  # impossible length
    st.integers(0, 2**32 - 1).map(lambda n: HEADER.pack(EOS_MAGIC, n, 0)),  # padding marker
    st.binary(min_size=1, max_size=40).map(lambda p: frame(p)[: max(1, len(p) // 2)]),  # torn
    st.integers(1, 48).map(bytes),  # zeros
    st.binary(min_size=1, max_size=48),  # garbage
)


@st.composite
def segment_files(draw: st.DrawFn) -> tuple[list[tuple[int, bytes]], bytes | None]:
    """[(base, contents)] and the checkpoint file's bytes (None: no file)."""
    segments = []
    base = draw(st.sampled_from([0, 0, 64, 1 << 32]))
    for _ in range(draw(st.integers(1, 3))):
        size = draw(st.sampled_from([64, 100, 256, 512]))
        if draw(st.integers(0, 7)) == 0:
            content = draw(st.binary(min_size=1, max_size=size))  # pure noise
        else:  # valid records, then whatever damage
            valid = draw(st.lists(st.binary(max_size=40).map(frame), max_size=8))
            content = b"".join(valid + draw(st.lists(chunks, max_size=6)))
        flipped = bytearray((content + bytes(size))[:size])
        for flip in draw(st.lists(st.integers(0, size * 8 - 1), max_size=2)):
            flipped[flip // 8] ^= 1 << flip % 8
        segments.append((base, bytes(flipped)))
        base += size if draw(st.integers(0, 9)) else draw(st.integers(1, 300))  # misaligned
    checkpoint = draw(st.one_of(
        st.none(), st.binary(max_size=16),
        st.integers(0, base + 64).map(lambda p: (raw := struct.pack("<Q", p))
                                      + struct.pack("<I", crc32c(raw))),
    ))
    return segments, checkpoint


def write_log(directory: Path, segments: list[tuple[int, bytes]], checkpoint: bytes | None) -> None:
    directory.mkdir(parents=True)
    for base, content in segments:
        (directory / segment_name(base)).write_bytes(content)
    if checkpoint is not None:
        (directory / CHECKPOINT_NAME).write_bytes(checkpoint)


def assert_valid_record(directory: Path, position: int, payload: bytes) -> None:
    """The record the reader returned really is on disk at ``position``, CRC and all. The
    reader uses the chain of segments that line up from the first one; so does this."""
    chain: list[tuple[int, bytes]] = []
    for path in sorted(p for p in directory.iterdir() if p.name.isdigit()):
        raw = path.read_bytes()
        if chain and int(path.name) != chain[-1][0] + len(chain[-1][1]):
            break
        chain.append((int(path.name), raw))
    base, raw = next((b, r) for b, r in chain if b <= position < b + len(r))
    off = position - base
    magic, length, crc = HEADER.unpack_from(raw, off)
    assert magic == RECORD_MAGIC, f"record at {position}: magic 0x{magic:08x}"
    assert length == len(payload) and raw[off + HEADER_SIZE:off + HEADER_SIZE + length] == payload
    assert crc32c(payload, length ^ CRC_SEED) == crc, f"record at {position}: CRC mismatch"


@FUZZ
@given(layout=segment_files(), probes=st.lists(st.integers(0, (1 << 32) + 2048), max_size=8))
# found here: a checkpoint at 1 past a zeroed segment; the reader refused it, verify said ok
@example(layout=([(0, bytes(64))], b"\x01\x00\x00\x00\x00\x00\x00\x00\xad\xcf\x14\xc5"),
         probes=[])
def test_read_only_reader_survives_any_bytes(tmp_path_factory: pytest.TempPathFactory,
                                             layout: tuple[list[tuple[int, bytes]], bytes | None],
                                             probes: list[int]) -> None:
    directory = tmp_path_factory.mktemp("ro") / "log"
    write_log(directory, *layout)
    first = layout[0][0][0]
    with time_limit(TIME_LIMIT_S):
        try:
            log = CommitLog(directory, read_only=True)
        except DOCUMENTED:
            return
        try:
            report = log.verify()
            seen = seen_bytes = 0
            refused = False
            try:
                for position, payload in log.iter_from(first):
                    assert_valid_record(directory, position, bytes(payload))
                    seen += 1
                    seen_bytes += len(payload)
                    assert seen <= sum(len(c) for _, c in layout[0]) // HEADER_SIZE + 1
            except (CorruptionError, InvalidArgument):
                refused = True
            # verify walks every readable record (and on past damage); the reader stops at
            # the first damage, which verify reports
            assert seen <= report.records and seen_bytes <= report.bytes
            if refused:
                assert not report.ok
            for position in [first, *probes]:  # (below the first segment: OffsetExpired)
                with contextlib.suppress(CorruptionError, InvalidArgument, OffsetExpired):
                    assert_valid_record(directory, position, bytes(log.read(position)))
        finally:
            log.close()
    shutil.rmtree(directory.parent)


@FUZZ
@given(layout=segment_files(), full_check=st.booleans(),
       appended=st.lists(st.binary(max_size=40), min_size=1, max_size=4))
def test_recovery_leaves_a_clean_log_or_refuses(tmp_path_factory: pytest.TempPathFactory,
                                                layout: tuple[list[tuple[int, bytes]],
                                                              bytes | None],
                                                full_check: bool,
                                                appended: list[bytes]) -> None:
    directory = tmp_path_factory.mktemp("rw") / "log"
    write_log(directory, *layout)
    first = layout[0][0][0]
    with time_limit(TIME_LIMIT_S):
        try:
            log = CommitLog(directory, segment_size=64, flush_interval_ms=3_600_000,
                            full_check=full_check)
        except DOCUMENTED:
            return
        try:
            kept: list[bytes] = []
            try:
                kept = [bytes(p) for _, p in log.iter_from(first)]
            except CorruptionError:
                # trusted below the checkpoint (not re-read on open): what is bad there is
                # refused when read, never returned
                assert not full_check, "a full-check recovery left a bad record"
            if full_check:
                assert log.verify().ok, log.verify().errors
            positions = log.append_batch(appended)
            assert [bytes(log.read(p)) for p in positions] == appended
        finally:
            log.close()
        if full_check:
            reopened = CommitLog(directory, segment_size=64, flush_interval_ms=3_600_000)
            try:
                assert [bytes(p) for _, p in reopened.iter_from(first)] == [*kept, *appended]
            finally:
                reopened.close()
    shutil.rmtree(directory.parent)
