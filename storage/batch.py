"""Batch: the operations one ``TimerStore.write`` applies atomically (one RocksDB WriteBatch).

A Batch holds the store's handle table itself (not a copy), so it always uses the handles
of the DB the store has open: the table is emptied when the store closes or reopens and
refilled after a reopen (a WriteBatch names column families by id, which a reopen keeps).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import rocksdict

from storage.errors import InvalidArgument, StorageError


class Batch:
    """Operations applied atomically by ``TimerStore.write`` (one RocksDB WriteBatch).

    A Batch is written once; using it after ``write`` raises ``InvalidArgument``. The
    ``*_many`` methods take lists so hot paths pay no Python call per record.
    """

    __slots__ = ("_handles", "_wb")

    def __init__(self, handles: dict[str, Any]) -> None:
        self._handles = handles
        self._wb: rocksdict.WriteBatch | None = rocksdict.WriteBatch(raw_mode=True)

    def _target(self, cf: str) -> tuple[rocksdict.WriteBatch, Any]:
        wb = self._wb
        if wb is None:
            raise InvalidArgument("this batch was already written; make a new one")
        try:
            return wb, self._handles[cf]
        except KeyError:
            if not self._handles:  # dropped while the store is closed (or reopening)
                raise StorageError("the store is closed or reopening") from None
            raise InvalidArgument(f"unknown column family {cf!r}") from None

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        wb, handle = self._target(cf)
        wb.put(key, value, handle)

    def delete(self, cf: str, key: bytes) -> None:
        wb, handle = self._target(cf)
        wb.delete(key, handle)

    def delete_range(self, cf: str, begin: bytes, end: bytes) -> None:
        wb, handle = self._target(cf)
        wb.delete_range(begin, end, handle)

    def put_many(self, cf: str, items: Iterable[tuple[bytes, bytes]]) -> None:
        wb, handle = self._target(cf)
        put = wb.put
        for key, value in items:
            put(key, value, handle)

    def delete_many(self, cf: str, keys: Iterable[bytes]) -> None:
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
