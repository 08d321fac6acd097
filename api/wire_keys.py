"""The keys of the wire documents api/_native.pyx writes in C, built from api/schemas.py's
Structs (their fields' names on the wire, in their order): the one definition, which the
compiled encoders take at import and the pure-Python paths use too (``PULL_HEAD``,
``NEXT_OFFSET``, their JSON twins and ``RECEIVE_JSON``: api/routes/consume.py and groups.py).
A renamed field changes both paths alike; a Struct that lists its fields otherwise than
the extension writes them keeps the extension from loading (api/native.py then runs the
twins). tests/api/test_native.py holds this."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from api import schemas
from storage.records import MessageStatus

_mp = msgspec.msgpack.encode
_js = msgspec.json.encode


def _names(struct: type[msgspec.Struct]) -> dict[str, str]:
    """Field name -> its name on the wire, in the Struct's order."""
    return {f.name: f.encode_name for f in msgspec.structs.fields(struct)}


def _map_header(n: int) -> bytes:
    assert n < 16
    return bytes((0x80 | n,))


_pull = _names(schemas.PullResult)
#: the start of a pull answer in msgpack, ``{"messages": `` (the map's header and first key)
PULL_HEAD = _map_header(len(_pull)) + _mp(_pull["messages"])
#: its second key, ``nextOffset``
NEXT_OFFSET = _mp(_pull["next_offset"])
#: the same two in JSON: ``{"messages":[`` and ``],"nextOffset":`` (the value and ``}`` follow)
PULL_HEAD_JSON = b"{" + _js(_pull["messages"]) + b":["
NEXT_OFFSET_JSON = b"]," + _js(_pull["next_offset"]) + b":"
_receive = _names(schemas.ReceiveResult)
#: a receive answer's pieces in JSON: ``{"messages":[`` before its messages,
#: ``],"leaseUntil":`` after them, then with an ``ack``: ``,"acked":`` and ``,"stale":``
#: (each followed by its value; then ``}``)
RECEIVE_JSON = (b"{" + _js(_receive["messages"]) + b":[",
                b"]," + _js(_receive["lease_until"]) + b":",
                     b"," + _js(_receive["acked"]) + b":", b"," + _js(_receive["stale"]) + b":")


@dataclass(frozen=True)
class KeyTable:
    """What api/_native.pyx writes, from the schemas: each document's fields in the
    schema's order (to compare with the extension's), and the keys themselves."""

    delivered_fields: tuple[str, ...]
    pull_fields: tuple[str, ...]
    send_fields: tuple[str, ...]
    keys: tuple[tuple[bytes, ...], bytes, bytes, tuple[bytes, ...], tuple[bytes, ...]]
    #: the JSON encoders': each Received key as ``"name":``, PULL_HEAD_JSON, NEXT_OFFSET_JSON
    json_keys: tuple[tuple[bytes, ...], bytes, bytes]

    def fits(self, delivered: tuple[str, ...], pull: tuple[str, ...],
             send: tuple[str, ...]) -> bool:
        """Whether the extension writes the fields (its ``DELIVERED_FIELDS``, ``PULL_FIELDS``
        and ``SEND_FIELDS``) in the schemas' order."""
        return (self.delivered_fields, self.pull_fields, self.send_fields) == (
            delivered, pull, send)


def key_table() -> KeyTable:
    """The keys api/_native.pyx writes, built from the schemas."""
    received = _names(schemas.Received)
    send = _names(schemas.SendResult)
    results = _names(schemas.BatchResult)["results"]
    scheduled = MessageStatus.SCHEDULED
    written = ("msg_id", "topic", "deliver_at", "status", "cancel_handle", "duplicate")
    send_msgpack = (
        _map_header(len(_names(schemas.BatchResult))) + _mp(results),
        _map_header(len(written)) + _mp(send["msg_id"]),
        _mp(send["topic"]),
        _mp(send["deliver_at"]),
        _mp(send["status"]) + _mp(scheduled) + _mp(send["cancel_handle"]),
        _mp(send["duplicate"]) + _mp(False),
    )
    send_json = (
        b"{" + _js(results) + b":[",
        b"{" + _js(send["msg_id"]) + b':"',
        b'",' + _js(send["topic"]) + b':"',
        b'",' + _js(send["deliver_at"]) + b":",
        b"," + _js(send["status"]) + b":" + _js(scheduled) + b"," + _js(send["cancel_handle"])
        + b':"',
        b'",' + _js(send["duplicate"]) + b":" + _js(False) + b"}",
        b"]}",
    )
    return KeyTable(
        delivered_fields=tuple(received), pull_fields=tuple(_pull),
        send_fields=tuple(f for f in send if f in written),
        keys=(tuple(_mp(wire) for wire in received.values()), PULL_HEAD, NEXT_OFFSET,
              send_msgpack, send_json),
        json_keys=(tuple(_js(wire) + b":" for wire in received.values()), PULL_HEAD_JSON,
                   NEXT_OFFSET_JSON))
