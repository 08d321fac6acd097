"""What the key space of a snapshot looks like: column-family kinds, and key-range planning.

Pure Python (no Spark): the data sources plan their partitions with it on the driver, and the
analysis uses the same kinds to decide which SSTs are time-ordered.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from storage.constants import CF_CQ, CF_EXPIRY, CF_HALF, CF_INDEX, CF_TIMER_PREFIX

_U64 = struct.Struct(">Q")


class CfKind(enum.StrEnum):
    TIMER = "timer"  # timer.N: 8-byte deliverAt + topic NUL msgId -> MessageRecord
    HALF = "half"  # 8-byte next check time + topic NUL msgId -> MessageRecord
    EXPIRY = "expiry"  # 8-byte expiresAt + topic NUL msgId -> b""
    INDEX = "index"  # topic NUL msgId -> IndexEntry
    CQ = "cq"  # topic NUL 8-byte offset -> log position + size
    OTHER = "other"  # tx, meta, default: sizes only


def cf_kind(cf: str) -> CfKind:
    if cf.startswith(CF_TIMER_PREFIX):
        return CfKind.TIMER
    return {CF_HALF: CfKind.HALF, CF_EXPIRY: CfKind.EXPIRY, CF_INDEX: CfKind.INDEX,
            CF_CQ: CfKind.CQ}.get(cf, CfKind.OTHER)


def is_time_ordered(cf: str) -> bool:
    """Keys start with an 8-byte big-endian time (timer shards, half, expiry)."""
    return cf_kind(cf) in (CfKind.TIMER, CfKind.HALF, CfKind.EXPIRY)


def timer_shard(cf: str) -> int | None:
    if not cf.startswith(CF_TIMER_PREFIX):
        return None
    suffix = cf[len(CF_TIMER_PREFIX):]
    return int(suffix) if suffix.isdigit() else None


def key_time(key: bytes) -> int | None:
    """The leading 8-byte big-endian time of a time-ordered key (None if the key is shorter)."""
    return int(_U64.unpack_from(key)[0]) if len(key) >= 8 else None


def select_cfs(available: Iterable[str], spec: str | None) -> list[str]:
    """Column families chosen by a comma list of names or ``prefix*`` patterns (``timer.*``:
    every shard); a ``!`` before a part excludes what it matches. ``None``/empty, or only
    exclusions, start from all. A part that matches nothing is a ValueError (a typo must not
    quietly read nothing)."""
    names = sorted(available)
    parts = [p.strip() for p in (spec or "").split(",") if p.strip()]
    include = [p for p in parts if not p.startswith("!")]
    exclude = [p[1:].strip() for p in parts if p.startswith("!")]

    def matching(pattern: str) -> list[str]:
        found = ([n for n in names if n.startswith(pattern[:-1])] if pattern.endswith("*")
                 else [n for n in names if n == pattern])
        if not found:
            raise ValueError(f"no column family matches {pattern!r} (have: {', '.join(names)})")
        return found

    chosen: list[str] = []
    for pattern in include or ["*"]:
        chosen.extend(m for m in matching(pattern) if m not in chosen)
    dropped = {m for pattern in exclude for m in matching(pattern)}
    return [c for c in chosen if c not in dropped]


# --- key-range planning ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyRange:
    """Keys of ``cf`` in [start, end); None means unbounded on that side."""

    cf: str
    start: bytes | None
    end: bytes | None
    estimated_rows: int = 0


@dataclass(slots=True)
class RangeGroup:
    """The ranges one Spark partition reads (small column families share a partition)."""

    ranges: list[KeyRange] = field(default_factory=list)
    estimated_rows: int = 0


def _prefix_int(key: bytes) -> int:
    return int.from_bytes(key[:8].ljust(8, b"\x00"), "big")


def split_points(files: Sequence[Mapping[str, Any]], target_rows: int) -> list[tuple[bytes, int]]:
    """Candidate split keys of one column family with the estimated rows from each onward.

    Every SST's start key is a candidate; an SST with more than ``target_rows`` entries is
    also cut at evenly spaced points of its leading 8 bytes (exact for time-ordered keys, a
    fair guess for others)."""
    points: list[tuple[bytes, int]] = []
    for f in files:
        start, end = bytes(f["start_key"]), bytes(f["end_key"])
        rows = max(int(f["num_entries"]) - int(f["num_deletions"]), 0)
        pieces = max(1, math.ceil(rows / max(target_rows, 1)))
        lo, hi = _prefix_int(start), _prefix_int(end)
        if pieces > 1 and hi - lo >= pieces:
            share = rows // pieces
            points.append((start, rows - share * (pieces - 1)))
            points.extend(((lo + (hi - lo) * i // pieces).to_bytes(8, "big"), share)
                          for i in range(1, pieces))
        else:
            points.append((start, rows))
    points.sort(key=lambda p: p[0])
    return points


def plan_cf(cf: str, files: Sequence[Mapping[str, Any]], target_rows: int) -> list[KeyRange]:
    """Contiguous ranges covering the whole key space of ``cf`` (first and last unbounded), so
    every key is read exactly once however rough the estimates are."""
    bounds: list[bytes] = []
    estimates: list[int] = []
    acc = 0
    for key, rows in split_points(files, target_rows):
        if acc and acc + rows > target_rows and (not bounds or key > bounds[-1]):
            bounds.append(key)
            estimates.append(acc)
            acc = 0
        acc += rows
    estimates.append(acc)
    edges: list[bytes | None] = [None, *bounds, None]
    return [KeyRange(cf, edges[i], edges[i + 1], estimates[i]) for i in range(len(estimates))]


def plan_partitions(
    files_by_cf: Mapping[str, Sequence[Mapping[str, Any]]], cfs: Sequence[str], partitions: int,
    min_rows: int = 10_000,
) -> list[RangeGroup]:
    """Split the chosen column families into about ``partitions`` groups of similar size."""
    total = sum(max(int(f["num_entries"]) - int(f["num_deletions"]), 0)
                for cf in cfs for f in files_by_cf.get(cf, ()))
    target = max(min_rows, math.ceil(total / max(partitions, 1)))
    groups: list[RangeGroup] = []
    current = RangeGroup()
    for cf in cfs:
        for rng in plan_cf(cf, files_by_cf.get(cf, ()), target):
            if current.ranges and current.estimated_rows + rng.estimated_rows > target:
                groups.append(current)
                current = RangeGroup()
            current.ranges.append(rng)
            current.estimated_rows += rng.estimated_rows
    if current.ranges:
        groups.append(current)
    return groups
