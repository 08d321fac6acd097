"""StoreTuning.for_budget: what RocksDB is given, seen from RocksDB (real store)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from storage.constants import CF_INDEX, timer_cf
from storage.rocks import RocksStore
from storage.rocks_options import MIB, TIMER_WRITE_BUFFER_CAP, StoreTuning


@pytest.mark.parametrize("budget_mib", [16, 64, 256, 1024])
def test_the_budget_is_split_and_timer_buffers_are_capped(budget_mib: int) -> None:
    tuning = StoreTuning.for_budget(budget_mib * MIB)
    memtables = budget_mib * MIB - budget_mib * MIB // 4
    assert tuning.block_cache_bytes + tuning.db_write_buffer_bytes == budget_mib * MIB
    assert tuning.other_write_buffer_bytes == memtables // 8
    assert tuning.timer_write_buffer_bytes == min(memtables // 8, TIMER_WRITE_BUFFER_CAP)
    assert tuning.timer_write_buffer_bytes <= tuning.other_write_buffer_bytes


def test_a_timer_memtable_is_switched_at_the_cap_and_the_index_one_is_not(
        tmp_path: Path) -> None:
    """12 MiB of random keys into a timer CF and into the index CF, with the 256 MiB
    default's tuning: the timer CF's memtable was switched (immutable, or flushed already),
    the index CF's (24 MiB) was not."""
    tuning = StoreTuning.for_budget(256 * MIB)
    assert tuning.timer_write_buffer_bytes == 8 * MIB < tuning.other_write_buffer_bytes
    store = RocksStore(tmp_path / "db", timer_shards=1, tuning=tuning)
    rng = random.Random(7)
    try:
        for _ in range(12):  # 12 writes of 1 MiB into each CF
            batch = store.batch()
            keys = [rng.randbytes(16) for _ in range(4096)]
            batch.put_many(timer_cf(0), [(k, b"v" * 240) for k in keys])
            batch.put_many(CF_INDEX, [(k, b"v" * 240) for k in keys])
            store.write(batch)

        def switched(cf: str) -> int:
            return ((store.property_int(cf, "rocksdb.num-immutable-mem-table") or 0)
                    + (store.property_int(cf, "rocksdb.num-files-at-level0") or 0))

        assert switched(timer_cf(0)) >= 1
        assert switched(CF_INDEX) == 0
    finally:
        store.close()
