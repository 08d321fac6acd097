"""RocksDB options of the RocksStore, per column-family kind, with their tunables in one table.

Reasons and measurements: docs/storage.md ("RocksDB options"). In short:
- every Options is ``raw_mode=True`` (rocksdict requires all CFs to match the DB's mode);
- no prefix extractor anywhere: time-ordered CFs are range-scanned across prefixes, and a
  prefix extractor there makes seeks silently return nothing (without ``total_order_seek``);
- whole-key bloom filters only where reads are point look-ups (index, tx, meta);
- one shared LRU block cache and a DB-wide memtable budget, so memory does not grow with
  the number of timer shards;
- LZ4 on the upper levels, ZSTD on the bottommost level (cold, large, rarely rewritten),
  except in the time-ordered CFs: their keys arrive in deliverAt order, not in key order, so
  every L0 file overlaps the whole bottommost level and each compaction rewrites it; their
  data is transient (gone once delivered); LZ4 there halves RocksDB's compaction CPU;
- LZ4 accelerated (``lz4_acceleration``, 8) wherever it compresses: flushes and compactions
  spent most of their CPU in LZ4 on bodies it barely shrinks;
- a deletion-triggered compaction collector on the time-ordered CFs, so SST files full of
  delivered-key tombstones are compacted away without waiting for size triggers.
"""

from __future__ import annotations

from dataclasses import dataclass

import rocksdict

from storage.constants import (
    CF_CQ,
    CF_EXPIRY,
    CF_HALF,
    CF_INDEX,
    CF_META,
    CF_TIMER_PREFIX,
    CF_TX,
    timer_cf,
)

MIB = 1 << 20
TIMER_WRITE_BUFFER_CAP = 8 * MIB  # (StoreTuning.for_budget)
INDEX_WRITE_BUFFER_CAP = 8 * MIB  # (StoreTuning.for_budget)
_DEFAULT_LEVEL = 32767  # RocksDB's CompressionOptions::kDefaultCompressionLevel


@dataclass(frozen=True, kw_only=True)
class StoreTuning:
    # name                                 default      unit / meaning
    block_cache_bytes: int = 256 * MIB  #               shared LRU block cache, all CFs
    db_write_buffer_bytes: int = 512 * MIB  #           memtable budget across all CFs
    timer_write_buffer_bytes: int = TIMER_WRITE_BUFFER_CAP  # memtable of each time-ordered CF
    index_write_buffer_bytes: int = INDEX_WRITE_BUFFER_CAP  # memtable of the index CF
    other_write_buffer_bytes: int = 32 * MIB  #         memtable size of cq/tx/meta
    max_write_buffer_number: int = 4  #                 memtables per CF before stalling writes
    target_file_size_bytes: int = 64 * MIB  #           SST size at L1
    max_bytes_for_level_base: int = 256 * MIB  #        L1 size; x10 per level
    max_background_jobs: int = 2  #                     flush + compaction threads (2 cores)
    bloom_bits_per_key: int = 10  #                 ~1 % false positives (index, tx, meta)
    memtable_bloom_ratio: float = 0.02  #               of a write buffer: bloom of its keys
    block_size: int = 16 * 1024  #                      bytes per data block
    deletion_window: int = 128 * 1024  #                entries per window of the collector
    deletion_trigger: int = 64 * 1024  #                tombstones in a window -> compact file
    bytes_per_sync: int = 1 * MIB  #                    background sync of SST / WAL writes
    max_total_wal_bytes: int = 64 * MIB  #              WAL budget before forcing CF flushes
    #                                                    (what a start after a kill replays)
    timer_bottommost_zstd: bool = False  #              ZSTD, not LZ4, at time-ordered CFs' bottom
    lz4_acceleration: int = 8  #                        LZ4's speed-up (1: its default) wherever
    #                                                    LZ4 compresses: flushes, upper levels,
    #                                                    time-ordered CFs' bottom (cf_options)
    timer_vector_memtable: bool = False  #              timer CFs' memtables: a vector, sorted
    #                                                    when flushed or read (a cluster
    #                                                    follower's, RocksStore.disable_wal)


    @classmethod
    def for_budget(cls, memory_bytes: int) -> StoreTuning:
        """Options that keep RocksDB's memory within ``memory_bytes``: 1/4 shared block
        cache, 3/4 memtables (the DB-wide write-buffer budget; each CF's write buffer 1/8
        of it, so a burst on one CF flushes early instead of growing past the budget).

        A time-ordered CF's write buffer is at most ``TIMER_WRITE_BUFFER_CAP``: its keys
        arrive in no order (deliverAt), and an insert into a large skip list misses the CPU
        caches at every level. Sends of 1000 messages due at random over an hour, through
        ``Broker.send_batch``: 0.88-0.92 ms per RocksDB write with 6 MiB, 0.98 with 8,
        1.09 with 12, 1.46-1.51 with 24 (the 256 MiB default's 1/8), 1.84 with 2 (flushes
        then stall it); docs/performance.md at f86b3f2, section 8.

        So is the index CF's, ``INDEX_WRITE_BUFFER_CAP``: its keys are (topic, msgId), and a
        delivery commit rewrites them in deliverAt order, i.e. at random. 200 k sends, then
        200 k rewrites in batches of 1000: 1.24-1.33 instead of 1.65-1.88 µs a rewrite with
        8 MiB instead of 24, random msgIds sent at 0.87-0.94 instead of 1.21-1.26 µs, and the
        process's CPU with the flushes and compactions after them no higher (2.43-2.49
        against 2.49-2.57 µs a message with sequential msgIds, 3.42-3.47 against
        3.89-3.97 with random ones); docs/performance.md at f86b3f2, section 11."""
        cache = memory_bytes // 4
        memtables = memory_bytes - cache
        return cls(block_cache_bytes=cache, db_write_buffer_bytes=memtables,
                   timer_write_buffer_bytes=min(memtables // 8, TIMER_WRITE_BUFFER_CAP),
                   index_write_buffer_bytes=min(memtables // 8, INDEX_WRITE_BUFFER_CAP),
                   other_write_buffer_bytes=memtables // 8)


def is_time_ordered(cf: str) -> bool:
    """Column families whose keys start with an 8-byte big-endian time."""
    return cf.startswith(CF_TIMER_PREFIX) or cf in (CF_HALF, CF_EXPIRY)


POINT_LOOKUP_CFS = (CF_INDEX, CF_TX, CF_META)
SCANNED_CFS = (CF_CQ,)


def db_options(tuning: StoreTuning, *, create: bool) -> rocksdict.Options:
    """Options of the DB itself (and of the ``default`` CF, which hourglass does not use)."""
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(create)
    opts.create_missing_column_families(create)
    opts.enable_statistics()
    opts.set_max_background_jobs(tuning.max_background_jobs)
    opts.set_db_write_buffer_size(tuning.db_write_buffer_bytes)
    opts.set_max_total_wal_size(tuning.max_total_wal_bytes)
    opts.set_bytes_per_sync(tuning.bytes_per_sync)
    opts.set_wal_bytes_per_sync(tuning.bytes_per_sync)
    opts.set_keep_log_file_num(4)
    opts.set_max_open_files(-1)
    return opts


def cf_options(name: str, tuning: StoreTuning, cache: rocksdict.Cache) -> rocksdict.Options:
    opts = rocksdict.Options(raw_mode=True)
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(cache)
    table.set_block_size(tuning.block_size)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_format_version(5)
    if name in POINT_LOOKUP_CFS:
        table.set_bloom_filter(tuning.bloom_bits_per_key, False)
        opts.set_write_buffer_size(tuning.index_write_buffer_bytes if name == CF_INDEX
                                   else tuning.other_write_buffer_bytes)
        # a send looks up every client msgId it carries, and a new one is in no memtable:
        # a bloom of each memtable's keys answers that without a skip-list search (1000
        # new keys against a 32 MiB memtable: 0.34 instead of 0.79-0.86 ms; the write of
        # them 0.07-0.1 ms dearer; docs/performance.md at f86b3f2, section 6)
        opts.set_memtable_whole_key_filtering(True)
        opts.set_memtable_prefix_bloom_ratio(tuning.memtable_bloom_ratio)
    elif is_time_ordered(name):
        opts.set_write_buffer_size(tuning.timer_write_buffer_bytes)
        opts.add_compact_on_deletion_collector_factory(
            tuning.deletion_window, tuning.deletion_trigger, 0.5
        )
    else:
        opts.set_write_buffer_size(tuning.other_write_buffer_bytes)
    opts.set_block_based_table_factory(table)
    opts.set_max_write_buffer_number(tuning.max_write_buffer_number)
    opts.set_target_file_size_base(tuning.target_file_size_bytes)
    opts.set_max_bytes_for_level_base(tuning.max_bytes_for_level_base)
    opts.set_level_compaction_dynamic_level_bytes(True)
    opts.set_compression_type(rocksdict.DBCompressionType.lz4())
    # time-ordered CFs: LZ4 at the bottom as well, unless asked (module doc; 1 M sends due
    # at random over an hour: compaction 1.8 instead of 3.1 CPU-s, docs/performance.md)
    zstd = not is_time_ordered(name) or tuning.timer_bottommost_zstd
    if tuning.timer_vector_memtable and name.startswith(CF_TIMER_PREFIX):
        # an insert appends (no skip-list search through a memtable of keys in no order);
        # every read of the memtable sorts a copy of it: only where reads are rare (a
        # follower's timer CFs: its recount and listings); the DB needs
        # allow_concurrent_memtable_write off
        opts.set_memtable_factory(rocksdict.MemtableFactory.vector())
    opts.set_bottommost_compression_type(rocksdict.DBCompressionType.zstd() if zstd
                                         else rocksdict.DBCompressionType.lz4())
    # LZ4 accelerated (RocksDB passes a negative level to LZ4 as its acceleration): W1's
    # random 100-byte bodies barely compress, and LZ4 was ~60 % of a flush's CPU and ~30 % of
    # a compaction's. 1 M sends due at random over an hour: RocksDB's background CPU 1.64-1.95
    # instead of 2.38-2.41 µs a message; disk per million pending once compacted 132 instead
    # of 127 MiB (16: 152); docs/performance.md, W1. ZSTD keeps its default level.
    if tuning.lz4_acceleration > 1:
        lz4 = -tuning.lz4_acceleration
        opts.set_compression_options(-14, lz4, 0, 0)  # (window bits, level, strategy, dict)
        opts.set_bottommost_compression_options(-14, _DEFAULT_LEVEL if zstd else lz4, 0, 0,
                                                True)
    return opts


def all_cf_names(timer_shards: int) -> tuple[str, ...]:
    timers = tuple(timer_cf(i) for i in range(timer_shards))
    return (*timers, CF_HALF, CF_EXPIRY, CF_INDEX, CF_CQ, CF_TX, CF_META)
