"""Where waiting messages would sit with another number of timer shards.

The engine places a topic whole in one shard, ``storage.keys.topic_shard(topic, shards)``
(crc32 of the name modulo the shard count: what ``scheduler.intake`` uses), so a topic's
due messages leave in deliver-time order. The what-if below applies that same function to
the measured messages per topic for each candidate shard count: the busiest shard's
messages and its ratio to the mean shard. A topic holding a share ``s`` of the messages
puts at least ``s x shards`` times the mean into its shard whatever the count: when one
topic is most of the load, more shards only add idle ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from storage.keys import topic_shard

CANDIDATE_SHARDS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def placement(counts: Mapping[str, int], shards: int) -> list[int]:
    """Messages per shard with ``shards`` shards, by the engine's placement function."""
    per_shard = [0] * shards
    for topic, n in counts.items():
        per_shard[topic_shard(topic, shards)] += n
    return per_shard


def shard_what_if(counts: Mapping[str, int], current: int) -> list[dict[str, Any]]:
    """For each candidate shard count (and the current one): the busiest shard's messages,
    busiest / mean, and the floor the biggest topic sets on that ratio."""
    total = sum(counts.values())
    biggest = max(counts.values(), default=0)
    out = []
    for shards in sorted({*CANDIDATE_SHARDS, max(current, 1)}):
        per_shard = placement(counts, shards)
        mean = total / shards
        out.append({"shards": shards, "busiestShardMessages": max(per_shard),
                    "maxToMean": max(per_shard) / mean if total else 0.0,
                    "biggestTopicFloor": biggest / mean if total else 0.0,
                    "current": shards == current})
    return out
