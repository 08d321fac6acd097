"""The HTTP transport: every use of uvicorn's internals, and the HTTP/1.1 chunk framing.

- :mod:`api.transport.connection`: what a response writer may know of its connection
  (:class:`Connection`, :func:`connection_of`), :func:`chunk` (:func:`chunk_pieces`),
  :func:`unsent_bytes`.
- :mod:`api.transport.limits`: :class:`ConnectionLimits` (the guards, the protocol factory
  and ``uvicorn_options``), :func:`check_internals` (are uvicorn's internals still there?).
- :mod:`api.transport.uvicorn_httptools`: the guarded protocol; the one module that imports
  uvicorn's private ``httptools_impl`` (tests/api/test_transport.py holds every other module
  of api to that), imported only once the check passed.
"""

from api.transport.connection import (
    SOCKET_EXTENSION,
    Connection,
    chunk,
    chunk_pieces,
    connection_of,
    unsent_bytes,
)
from api.transport.limits import TESTED_UVICORN, ConnectionLimits, check_internals

__all__ = ["SOCKET_EXTENSION", "TESTED_UVICORN", "Connection", "ConnectionLimits",
           "check_internals", "chunk", "chunk_pieces", "connection_of", "unsent_bytes"]
