"""``python -m bench.soak --minutes 5``: the real server under a steady load for a bounded
time, its memory and the delivery lateness sampled every second.

Load: producers send ``--rate`` messages/s (every 100 ms a batch and two single sends) due
100 ms - 3 s later; a canceller cancels ~2 % of them before they are due;
one consumer long-polls each topic by group and commits its offsets. Sampled each second:
the server's RSS and its anonymous part (RssAnon: heap, RocksDB memtables and block cache;
without the CommitLog's mapped segment files, which are page cache the kernel can drop), its
CPU, and the lateness (storedAt - deliverAt, as the server measured it) of what was
consumed in that second.

Memory is attributed: with ``--rocksdb-buffers small`` (the default) the server runs with
RocksDB's memtables and block cache shrunk (SMALL_BUFFERS), so those bounded caches reach
their steady state within a minute instead of filling for tens of minutes, and it logs each
second what RocksDB says it holds (memtables, table readers, block cache) and Python's
allocated blocks; the soak plots RssAnon, RocksDB's share, and the rest.

Verdict (exit code 1 when broken): the rest (RssAnon minus RocksDB's accounted memory; all
of RssAnon without that log) grows from the first third of the run to the last by at most
``--max-growth`` (relative) or ``--max-growth-mib``, whichever is larger; lateness p99 <=
``--p99-ms``; every acknowledged, uncancelled message consumed exactly once, none early,
nothing cancelled consumed. A PNG (``--plot``) shows memory, lateness and rates.
"""

from __future__ import annotations

from bench.soak.harness import SoakConfig, SoakReport, run
from bench.soak.plot import plot

__all__ = ["SoakConfig", "SoakReport", "plot", "run"]
