"""Partial aggregates of the timer shards' slim rows, computed with numpy inside each task.

The report needs aggregates, not rows: each task (the hourglass_timers reader with the
``aggregate`` option, or ``mapInArrow`` over a Parquet export's rows) folds its rows into a
few small rows of ``AGG_SCHEMA``; Spark sums them by (kind, shard, topic, key) and the driver
derives every logical figure from the result (spark_jobs/logical_figures.py). Kinds:

- ``shard``: per shard and ``key`` 1 (at or above its watermark: waiting) / 0 (below:
  delivered, not yet deleted): rows ``n``, value bytes ``bytes``, key bytes ``low``;
- ``overdue``: waiting messages due before now: ``n``, ``bytes``, oldest deliverAt ``low``;
- ``second``: waiting messages due at or after now, per wall-clock second ``key``;
- ``delay``: a mergeable quantile summary of deliverAt - now of those: every distinct delay
  with its count when a task holds at most ``QUANTILE_POINTS`` of them, else the delays at
  ``QUANTILE_POINTS`` evenly spaced ranks, each weighted by the rows up to it (rank error at
  most 1 / QUANTILE_POINTS of the task's rows; the largest delay is always kept, exactly);
- ``size``: waiting messages per exact value size ``key`` (percentiles, histogram and blob
  shares follow exactly);
- ``topic``: waiting messages and bytes per topic.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

QUANTILE_POINTS = 20_000

AGG_SCHEMA = pa.schema([
    ("kind", pa.string()),
    ("shard", pa.int32()),
    ("topic", pa.string()),
    ("key", pa.int64()),
    ("n", pa.int64()),
    ("bytes", pa.int64()),
    ("low", pa.int64()),
])
AGG_DDL = "kind STRING, shard INT, topic STRING, key BIGINT, n BIGINT, bytes BIGINT, low BIGINT"


def _rows(kind: str, n: int, *, key: Any = None, count: Any, size: Any,
          shard: Any = None, topic: Any = None, low: Any = None) -> pa.RecordBatch:
    def column(value: Any, dtype: pa.DataType) -> pa.Array:
        if isinstance(value, pa.Array | pa.ChunkedArray):
            return value.cast(dtype) if isinstance(value, pa.Array) else \
                pa.concat_arrays(value.cast(dtype).chunks)
        if isinstance(value, np.ndarray):
            return pa.array(value, dtype)
        return pa.array([value] * n, dtype)

    return pa.RecordBatch.from_arrays(
        [column(kind, pa.string()), column(shard, pa.int32()), column(topic, pa.string()),
         column(key, pa.int64()), column(count, pa.int64()), column(size, pa.int64()),
         column(low, pa.int64())], schema=AGG_SCHEMA)


def _quantile_summary(delays: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """(values, weights) standing for ``delays``: exact under ``points`` values."""
    if delays.size <= points:
        return np.unique(delays, return_counts=True)
    ordered = np.sort(delays)
    ranks = (np.arange(1, points + 1, dtype=np.int64) * ordered.size) // points - 1
    weights = np.diff(ranks, prepend=-1)
    return ordered[ranks], weights


def aggregate(batches: Iterable[pa.RecordBatch], now_ms: int, watermarks: Mapping[int, int],
              points: int = QUANTILE_POINTS) -> Iterator[pa.RecordBatch]:
    """Fold slim timer rows (shard, deliver_at, topic, key_size, value_size and, when the
    reader knew the scan frontiers, pending) into AGG rows. A key is waiting when it is at or
    above its shard's frontier; without ``pending``, when its deliverAt is at or above the
    shard's watermark (the frontier's millisecond)."""
    batches = list(batches)
    if not batches:  # an empty partition: mapInArrow hands over no batch at all
        return
    table = pa.Table.from_batches(batches)
    if table.num_rows == 0:
        return
    shard = table.column("shard").to_numpy()
    at = table.column("deliver_at").to_numpy()
    key_size = table.column("key_size").to_numpy().astype(np.int64)
    value_size = table.column("value_size").to_numpy().astype(np.int64)
    pending = table.column("pending") if "pending" in table.column_names else None
    if pending is not None and pending.null_count == 0:  # set from the frontier keys
        waiting = pending.to_numpy()
    else:  # no frontier: by the watermark's millisecond
        marks = np.zeros(int(shard.max()) + 1, dtype=np.int64)
        for s, w in watermarks.items():
            if 0 <= s < marks.size:
                marks[s] = w
        waiting = at >= marks[shard]
    # shard: waiting (key 1) or below the watermark (key 0)
    group = shard.astype(np.int64) * 2 + waiting
    groups, inverse = np.unique(group, return_inverse=True)
    yield _rows("shard", groups.size, shard=groups // 2, key=groups % 2,
                count=np.bincount(inverse), size=np.bincount(inverse, value_size).astype(np.int64),
                low=np.bincount(inverse, key_size).astype(np.int64))
    at, value_size = at[waiting], value_size[waiting]
    topics = table.column("topic").filter(pa.array(waiting))
    past = at < now_ms
    if past.any():
        yield _rows("overdue", 1, count=int(past.sum()), size=int(value_size[past].sum()),
                    low=int(at[past].min()))
    future_at, future_size = at[~past], value_size[~past]
    if future_at.size:
        seconds, inverse = np.unique(future_at // 1000, return_inverse=True)
        yield _rows("second", seconds.size, key=seconds, count=np.bincount(inverse),
                    size=np.bincount(inverse, future_size).astype(np.int64))
        values, weights = _quantile_summary(future_at - now_ms, points)
        yield _rows("delay", values.size, key=values, count=weights, size=0)
    if at.size:
        sizes, counts = np.unique(value_size, return_counts=True)
        yield _rows("size", sizes.size, key=sizes, count=counts, size=sizes * counts)
        per_topic = pa.table({"topic": topics, "v": pa.array(value_size)}).group_by(
            "topic", use_threads=False).aggregate([("v", "count"), ("v", "sum")])
        yield _rows("topic", per_topic.num_rows, topic=per_topic.column("topic"),
                    count=per_topic.column("v_count"), size=per_topic.column("v_sum"))


def decode_watermarks(text: str) -> dict[int, int]:
    """The ``watermarks`` option: ``shard:ms,shard:ms``."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        shard, _, mark = part.partition(":")
        out[int(shard)] = int(mark)
    return out


def encode_watermarks(watermarks: Mapping[int, int]) -> str:
    return ",".join(f"{s}:{w}" for s, w in sorted(watermarks.items()))
