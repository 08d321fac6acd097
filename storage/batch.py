"""Batch: the operations one ``RocksStore.write`` applies atomically (one RocksDB WriteBatch).

A Batch holds the store's handle table itself (not a copy) and looks a handle up inside the
store's Gate (storage/gate.py) for each operation, so it always uses the handles of the DB
the store has open: across a reopen an operation waits, then uses the new DB's handles (a
WriteBatch names column families by id, which a reopen keeps), and no handle of the old DB
outlives the reopen. The ``*_many`` methods take lists (or iterables that do not call the
store: the gate does not nest), so hot paths pay one gate entry per call, not per record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import rocksdict

from storage.errors import InvalidArgument, StorageError
from storage.gate import Gate
from storage.native import native


def put_sorted_py(put: Callable[[bytes, bytes, Any], object], keys: list[bytes],
                  values: list[bytes], handle: Any, distinct: bool = False
                  ) -> bytes | Literal[False] | None:
    """``put(key, value, handle)`` for each (keys[i], values[i]) in the keys' bytes order,
    equal keys in list order; returns the first key put (None: none). ``distinct``: False,
    and nothing put, when a key is there twice. The twin of storage/_native.pyx's
    ``put_sorted``."""
    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys but {len(values)} values")
    order = sorted(range(len(keys)), key=keys.__getitem__)
    if distinct and len(set(keys)) != len(keys):
        return False
    for i in order:
        put(keys[i], values[i], handle)
    return keys[order[0]] if order else None


_put_sorted = put_sorted_py if native is None else native.put_sorted


#: operation codes of a captured batch (``Batch.ops``; storage/replication.py ships them)
OP_PUT, OP_DELETE, OP_DELETE_RANGE, OP_PUT_SORTED = 0, 1, 2, 3


class Batch:
    """Operations applied atomically by ``RocksStore.write``; written once (using it after
    ``write`` raises ``InvalidArgument``).

    With ``capture`` (cluster mode: a store with a replicator attached) every operation is
    also kept in ``ops`` as ``(OP_*, cf, a, b)``, so the write can be shipped to replicas;
    without it ``ops`` is None and the hot paths pay one ``is None`` test."""

    __slots__ = ("_gate", "_handles", "_wb", "ops")

    def __init__(self, handles: dict[str, Any], gate: Gate, *, capture: bool = False) -> None:
        self._handles = handles
        self._gate = gate
        self._wb: rocksdict.WriteBatch | None = rocksdict.WriteBatch(raw_mode=True)
        self.ops: list[tuple[int, str, Any, Any]] | None = [] if capture else None

    def _target(self, cf: str) -> tuple[rocksdict.WriteBatch, Any]:
        """The WriteBatch and the handle of ``cf`` (call inside the gate)."""
        wb = self._wb
        if wb is None:
            raise InvalidArgument("this batch was already written; make a new one")
        try:
            return wb, self._handles[cf]
        except KeyError:
            if not self._handles:  # dropped: the store is closed (or could not reopen)
                raise StorageError("the store is closed") from None
            raise InvalidArgument(f"unknown column family {cf!r}") from None

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        with self._gate:
            wb, handle = self._target(cf)
            wb.put(key, value, handle)
        if self.ops is not None:
            self.ops.append((OP_PUT, cf, key, value))

    def delete(self, cf: str, key: bytes) -> None:
        with self._gate:
            wb, handle = self._target(cf)
            wb.delete(key, handle)
        if self.ops is not None:
            self.ops.append((OP_DELETE, cf, key, None))

    def delete_range(self, cf: str, begin: bytes, end: bytes) -> None:
        with self._gate:
            wb, handle = self._target(cf)
            wb.delete_range(begin, end, handle)
        if self.ops is not None:
            self.ops.append((OP_DELETE_RANGE, cf, begin, end))

    def put_many(self, cf: str, items: Iterable[tuple[bytes, bytes]]) -> None:
        if self.ops is not None:
            items = list(items)
            self.ops.extend((OP_PUT, cf, key, value) for key, value in items)
        with self._gate:
            wb, handle = self._target(cf)
            put = wb.put
            for key, value in items:
                put(key, value, handle)

    def put_sorted(self, cf: str, keys: list[bytes], values: list[bytes], *,
                   distinct: bool = False) -> bytes | Literal[False] | None:
        """Put (keys[i], values[i]) in key order. RocksDB inserts a WriteBatch into its
        memtable (a skip list) in batch order, and an insert next to the previous one finds
        its path in the CPU caches (1000 keys due at random over an hour: ~2.9 instead of
        ~3.7 ms a write; docs/performance.md). Sorted in C where storage/_native is built,
        and no (key, value) tuple is made: a send batch's 1000 timer and 1000 index entries
        0.40 -> 0.32 µs a message against pairs zipped, sorted and put from Python.
        ``distinct``: False, with nothing put, when a key is there twice (found by the sort,
        not by a set of the keys)."""
        with self._gate:
            wb, handle = self._target(cf)
            first: bytes | Literal[False] | None = _put_sorted(wb.put, keys, values, handle,
                                                               distinct)
        if first is not False and self.ops is not None:
            self.ops.append((OP_PUT_SORTED, cf, list(keys), list(values)))
        return first

    def delete_many(self, cf: str, keys: Iterable[bytes]) -> None:
        if self.ops is not None:
            keys = list(keys)
            self.ops.extend((OP_DELETE, cf, key, None) for key in keys)
        with self._gate:
            wb, handle = self._target(cf)
            delete = wb.delete
            for key in keys:
                delete(key, handle)

    def __len__(self) -> int:
        return 0 if self._wb is None else int(self._wb.len())

    def _take(self) -> rocksdict.WriteBatch:
        wb = self._wb
        if wb is None:
            raise InvalidArgument("this batch was already written; make a new one")
        self._wb = None
        return wb
