"""One adapter per system, all behind :class:`bench.peers.systems.base.System`."""

from __future__ import annotations

from .base import System, SystemUnavailable

SYSTEM_NAMES = ("redis", "bullmq", "postgres", "hourglass", "hourglass-cluster")
#: what a run without ``--systems`` compares (the cluster starts six servers: asked for)
DEFAULT_SYSTEMS = ("redis", "bullmq", "postgres", "hourglass")


def make_system(name: str, options: dict) -> System:
    """Build the adapter for ``name``; imports lazily so a missing client skips one system only."""
    if name == "redis":
        from .redis_zset import RedisZSetSystem

        return RedisZSetSystem(options)
    if name == "bullmq":
        from .bullmq_queue import BullMQSystem

        return BullMQSystem(options)
    if name == "postgres":
        from .postgres import PostgresSystem

        return PostgresSystem(options)
    if name == "hourglass":
        from .hourglass import HourglassSystem

        return HourglassSystem(options)
    if name == "hourglass-cluster":
        from .hourglass_cluster import HourglassClusterSystem

        return HourglassClusterSystem(options)
    raise ValueError(f"unknown system {name!r}; choose from {', '.join(SYSTEM_NAMES)}")


__all__ = ["DEFAULT_SYSTEMS", "SYSTEM_NAMES", "System", "SystemUnavailable", "make_system"]
