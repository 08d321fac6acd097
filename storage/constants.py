"""Every column-family name, key prefix and system topic of hourglass, in one place."""

from __future__ import annotations

import re

# --- a data directory ---------------------------------------------------------------------
ROCKSDB_DIR = "rocksdb"  # data_dir / ROCKSDB_DIR: the RocksStore (storage/rocks.py)
COMMITLOG_DIR = "commitlog"  # data_dir / COMMITLOG_DIR: the CommitLog segments
SNAPSHOTS_DIR = "snapshots"  # data_dir / SNAPSHOTS_DIR: one directory per snapshot

# --- limits of the contract -----------------------------------------------------------------
MAX_BATCH_MESSAGES = 1000  # messages in one batch send
MAX_PULL_MESSAGES = 1000  # messages in one pull or one group receive

# --- column families --------------------------------------------------------------------
#: Delayed messages, sharded: ``timer.0`` .. ``timer.{n-1}``. Key = timer key (see keys.py),
#: value = encoded MessageRecord. Shard = CRC-32 of the topic modulo n (keys.topic_shard): a
#: topic lives in one shard.
CF_TIMER_PREFIX = "timer."
#: Half (transactional) messages, keyed by next-check time + topic + msgId (same codec as timers).
CF_HALF = "half"
#: Message index: index key (topic NUL msgId) -> encoded IndexEntry.
CF_INDEX = "index"
#: Consume queues: topic NUL 8-byte big-endian first queue offset -> a run of (8-byte log
#: position + 4-byte size), one per offset from the first (consume_queue.py).
CF_CQ = "cq"
#: Final-state expiry: 8-byte expiresAt + topic NUL msgId -> b"" (retention clean-up order).
CF_EXPIRY = "expiry"
#: Transactions: transaction id -> encoded transaction entry.
CF_TX = "tx"
#: Metadata: watermarks, applied log position, group offsets (prefixes below).
CF_META = "meta"


def timer_cf(shard: int) -> str:
    return f"{CF_TIMER_PREFIX}{shard}"


# --- metadata keys (CF_META) --------------------------------------------------------------
META_APPLIED_POSITION = b"applied_position"  # 8-byte BE: CommitLog position applied to RocksDB
META_WATERMARK_PREFIX = b"wm/"  # + shard number as text -> scan frontier: a timer key (its
#                                  first 8 bytes: the watermark ms); below it all is delivered
META_GROUP_OFFSET_PREFIX = b"group/"  # + topic NUL group -> 8-byte BE committed offset
META_FORMAT_VERSION = b"format_version"
META_SHARDS = b"timer_shards"  # the shard count the data was written with
# consumer groups with competing members (scheduler/groups.py); a group's committed offset in
# each log it reads (its topic's, its retry topic's, and its dead-letter cursor) is a
# META_GROUP_OFFSET_PREFIX key of that log's topic
META_GROUP_ACK_PREFIX = b"gack/"  # + log topic NUL group NUL 8-byte BE offset -> b"" (acked
#                                   above the committed offset: the gaps not yet filled)
META_GROUP_RECEIPT_KEY = b"greceipt_key"  # -> 32 random bytes: the HMAC key of group receipts
META_GROUP_STATE_PREFIX = b"gstate/"  # + topic NUL group -> 8-byte BE retries outstanding
META_PARKED_PREFIX = b"parked/"  # + timer key -> [reason, stored value] (scheduler/poison.py)
# CommitLog retention (scheduler/retention.py)
META_LOG_FIRST_POSITION = b"log_first_position"  # 8-byte BE: no consume-queue entry points
#                                                  below it; segments that end at or below it
#                                                  are deleted (or about to be)
META_TOPIC_FIRST_PREFIX = b"qfirst/"  # + topic -> 8-byte BE first offset still in the log
META_GROUP_EXPIRED_PREFIX = b"gexp/"  # + topic NUL group -> 8-byte BE messages the group lost
#                                       to retention (committed offset below firstOffset)

# cluster mode (storage/replication.py): written with every record a node applies
META_CLUSTER_SEQ = b"cluster/seq"  # 8-byte BE: the write-ahead stream sequence applied
META_CLUSTER_LOG_END = b"cluster/log_end"  # 8-byte BE: the CommitLog's end after that record
# The delivery ledger (scheduler/ledger.py): + 2-byte BE shard + a scan's end key -> the
# scan's first log position, record count and commit time. "dl" is *d*elivery *l*edger, NOT
# dead letters (those are topics, TOPIC_DLQ_PREFIX). The bytes stay as they are: every data
# directory, snapshot and cluster stream written so far holds them, and a new prefix would
# need a format-version bump and a migration on open to say the same thing.
META_LEDGER_PREFIX = b"dl/"
# the backlog's counts, persisted (scheduler/backlog_store.py)
META_BACKLOG_DELTA_PREFIX = b"bld/"  # + 8-byte BE id -> msgpack [sign, {topic: deliverAt
#                                       values, int64 LE}, {level: n}]: one write's change
META_BACKLOG_BASE_PREFIX = b"blb/"  # + topic NUL 4-byte BE hour -> msgpack {minute: n}: the
#                                      folded counts (topic "": all topics), read at start
META_BACKLOG_SECONDS_PREFIX = b"bls/"  # + topic NUL 4-byte BE hour -> msgpack {second: n}:
#                                         the same hour per second, read when a query needs it
META_BACKLOG_LEVELS = b"bll"  # -> msgpack {level: n}: the folded counts per delay level
META_BACKLOG_FOLDED = b"blw"  # 8-byte BE: every delta id below it is folded into the base
#                               (absent: a data directory from before; counted by a scan)

# --- transaction keys (CF_TX; see scheduler/tx_records.py) ------------------------------------
TX_ENTRY_PREFIX = b"t/"  # + transaction id -> encoded TransactionEntry
TX_GROUP_PREFIX = b"g/"  # + producer group NUL + half key -> transaction id (per-group check order)
TX_CALLBACK_PREFIX = b"c/"  # + producer group -> encoded check-callback registration

# --- topics ---------------------------------------------------------------------------------
# Each name pattern as the contract and JSON Schema (ECMA-262) write it, where ^...$ anchors
# the whole string, and compiled for Python with \Z instead: Python's $ also matches before a
# final newline, which would let "orders\n" through.
TOPIC_REGEX = r"^[A-Za-z0-9_.-]{1,127}$"
MSG_ID_REGEX = r"^[A-Za-z0-9_.:-]{1,128}$"
GROUP_REGEX = r"^[A-Za-z0-9_.:-]{1,128}$"


def whole_string(regex: str) -> str:
    """``^...$`` (ECMA-262) as a Python pattern that matches the whole string only."""
    return regex.removesuffix("$") + r"\Z"


TOPIC_PATTERN = re.compile(whole_string(TOPIC_REGEX))
MSG_ID_PATTERN = re.compile(whole_string(MSG_ID_REGEX))
GROUP_PATTERN = re.compile(whole_string(GROUP_REGEX))

TOPIC_SCHEDULE = "SCHEDULE_TOPIC_XXXX"
TOPIC_TRANS_CHECK_MAX_TIME = "TRANS_CHECK_MAX_TIME_TOPIC"
SYSTEM_TOPICS = frozenset({TOPIC_SCHEDULE, TOPIC_TRANS_CHECK_MAX_TIME})
SYSTEM_TOPIC_PREFIXES = ("rmq_sys_", "__")
# a consumer group's retry and dead-letter topics (RocketMQ's %RETRY%group and %DLQ%group):
# prefix + 32 hex digits of a hash of (topic, group), since a group name may hold ":" and
# topic + group may be longer than a topic name may be (scheduler/groups.py)
TOPIC_RETRY_PREFIX = "__retry."
TOPIC_DLQ_PREFIX = "__dlq."


def is_system_topic(topic: str) -> bool:
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIXES)


# --- RocketMQ property names ------------------------------------------------------------------
PROP_DELAY_LEVEL = "DELAY"
PROP_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROP_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROP_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
# RocketMQ 5 (RIP-43): a message carrying it cancels the timer message it names, and is never
# delivered itself; its value is the target's msgId, or "topic+msgId"
PROP_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
PROP_TIMER_PREFIX = "TIMER_"  # with DELAY: the properties cleared on delivery
PROP_CHECK_IMMUNITY_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"  # a half message's immunity
# set on a half message discarded into TOPIC_TRANS_CHECK_MAX_TIME, as RocketMQ names them
PROP_REAL_TOPIC = "REAL_TOPIC"
PROP_UNIQ_KEY = "UNIQ_KEY"
PROP_PRODUCER_GROUP = "PGROUP"
PROP_TRANSACTION_ID = "__transactionId__"
PROP_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
# set on a consumer group's retries and dead letters, as RocketMQ names them; a receive shows
# the message with its own msgId, topic, offset and properties again (without these)
PROP_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROP_RECONSUME_TIME = "RECONSUME_TIME"
PROP_ORIGIN_OFFSET = "ORIGIN_OFFSET"  # the message's offset in its topic's log
PROP_ORIGIN_BORN_AT = "ORIGIN_BORN_AT"

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
