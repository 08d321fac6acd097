"""StoreTuning.for_budget: what RocksDB is given, seen from RocksDB (real store)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from storage.constants import CF_CQ, CF_EXPIRY, CF_HALF, CF_INDEX, CF_META, CF_TX, timer_cf
from storage.rocks import RocksStore
from storage.rocks_options import (
    INDEX_WRITE_BUFFER_CAP,
    MIB,
    TIMER_WRITE_BUFFER_CAP,
    StoreTuning,
)


@pytest.mark.parametrize("budget_mib", [16, 64, 256, 1024])
def test_the_budget_is_split_and_timer_and_index_buffers_are_capped(budget_mib: int) -> None:
    tuning = StoreTuning.for_budget(budget_mib * MIB)
    memtables = budget_mib * MIB - budget_mib * MIB // 4
    assert tuning.block_cache_bytes + tuning.db_write_buffer_bytes == budget_mib * MIB
    assert tuning.other_write_buffer_bytes == memtables // 8
    assert tuning.timer_write_buffer_bytes == min(memtables // 8, TIMER_WRITE_BUFFER_CAP)
    assert tuning.index_write_buffer_bytes == min(memtables // 8, INDEX_WRITE_BUFFER_CAP)
    assert tuning.timer_write_buffer_bytes <= tuning.other_write_buffer_bytes
    assert tuning.index_write_buffer_bytes <= tuning.other_write_buffer_bytes


def test_timer_and_index_memtables_are_switched_at_the_cap_and_others_are_not(
        tmp_path: Path) -> None:
    """12 MiB of random keys into a timer CF, the index CF and the consume-queue CF, with
    the 256 MiB default's tuning: the timer and index CFs' memtables were switched
    (immutable, or flushed already), the consume queue's (24 MiB) was not."""
    tuning = StoreTuning.for_budget(256 * MIB)
    assert tuning.timer_write_buffer_bytes == 8 * MIB < tuning.other_write_buffer_bytes
    assert tuning.index_write_buffer_bytes == 8 * MIB
    store = RocksStore(tmp_path / "db", timer_shards=1, tuning=tuning)
    rng = random.Random(7)
    try:
        for _ in range(12):  # 12 writes of 1 MiB into each CF
            batch = store.batch()
            keys = [rng.randbytes(16) for _ in range(4096)]
            batch.put_many(timer_cf(0), [(k, b"v" * 240) for k in keys])
            batch.put_many(CF_INDEX, [(k, b"v" * 240) for k in keys])
            batch.put_many(CF_CQ, [(k, b"v" * 240) for k in keys])
            store.write(batch)

        def switched(cf: str) -> int:
            return ((store.property_int(cf, "rocksdb.num-immutable-mem-table") or 0)
                    + (store.property_int(cf, "rocksdb.num-files-at-level0") or 0))

        assert switched(timer_cf(0)) >= 1
        assert switched(CF_INDEX) >= 1
        assert switched(CF_CQ) == 0
    finally:
        store.close()


@pytest.mark.parametrize("timer_zstd", [False, True])
def test_time_ordered_cfs_are_lz4_at_the_bottom_unless_asked(tmp_path: Path,
                                                            timer_zstd: bool) -> None:
    """The bottommost compression of each column family, as RocksDB itself records the
    options it runs with (its OPTIONS file): LZ4 for the timer and expiry CFs, ZSTD for the
    index; ZSTD for all with ``timer_bottommost_zstd``."""
    store = RocksStore(tmp_path / "db", timer_shards=2,
                       tuning=StoreTuning(timer_bottommost_zstd=timer_zstd))
    store.close()
    latest = max((tmp_path / "db").glob("OPTIONS-*"), key=lambda p: int(p.name[8:]))
    bottom: dict[str, str] = {}
    section = None
    for line in latest.read_text().splitlines():
        if line.startswith("[CFOptions "):
            section = line.split('"')[1]
        elif section and line.strip().startswith("bottommost_compression="):
            bottom[section] = line.split("=", 1)[1]
    timers = "kZSTD" if timer_zstd else "kLZ4Compression"
    time_ordered = (timer_cf(0), timer_cf(1), CF_EXPIRY, CF_HALF)
    assert {cf: bottom[cf] for cf in time_ordered} == dict.fromkeys(time_ordered, timers)
    assert {bottom[cf] for cf in (CF_INDEX, CF_CQ, CF_TX, CF_META)} == {"kZSTD"}


def _cf_option_levels(db: Path) -> dict[str, tuple[int, int]]:
    """Per column family, (compression_opts level, bottommost level in force) as RocksDB's
    OPTIONS file records them (the bottommost options count only when enabled)."""
    latest = max(db.glob("OPTIONS-*"), key=lambda p: int(p.name[8:]))
    levels: dict[str, list[int]] = {}
    section = None
    for line in latest.read_text().splitlines():
        line = line.strip()
        if line.startswith("[CFOptions "):
            section = line.split('"')[1]
            levels[section] = [0, 0]
        elif section and line.startswith(("compression_opts={", "bottommost_compression_opts={")):
            fields = dict(f.split("=", 1) for f in line.split("{", 1)[1].rstrip("}").split(";")
                          if "=" in f)
            if line.startswith("compression_opts"):
                levels[section][0] = int(fields["level"])
            else:
                levels[section][1] = int(fields["level"]) if fields["enabled"] == "true" else 0
    return {cf: (upper, bottom or upper) for cf, (upper, bottom) in levels.items()}


@pytest.mark.parametrize("acceleration", [8, 1])
def test_lz4_runs_accelerated_and_zstd_at_its_default_level(tmp_path: Path,
                                                           acceleration: int) -> None:
    """Every LZ4 level (each CF's upper levels, the time-ordered CFs' bottom) compresses with
    ``lz4_acceleration`` (RocksDB hands LZ4 a negative level as its acceleration); the ZSTD
    bottom of the other CFs keeps ZSTD's default level; 1 leaves every level at the default."""
    store = RocksStore(tmp_path / "db", timer_shards=2,
                       tuning=StoreTuning(lz4_acceleration=acceleration))
    store.close()
    levels = _cf_option_levels(tmp_path / "db")
    default = 32767
    lz4 = -acceleration if acceleration > 1 else default
    for cf in (timer_cf(0), timer_cf(1), CF_EXPIRY, CF_HALF):
        assert levels[cf] == (lz4, lz4), cf
    for cf in (CF_INDEX, CF_CQ, CF_TX, CF_META):
        assert levels[cf] == (lz4, default), cf
