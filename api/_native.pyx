# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Compiled twins of the HTTP layer's wire encoders: delivered messages (pulls, receives)
transcoded from their LogRecord payloads to msgpack, a pull's whole answer in one buffer,
the send answer of a batch just scheduled (msgpack or JSON).

Built from source by pip (setup.py) when a C compiler is there; api/native.py picks these
or the pure-Python functions (api/routes/consume.py, api/routes/groups.py,
api/routes/messages.py) and hands over the keys, built from api/schemas.py's Structs;
tests/api/test_native.py checks that both give the same bytes. What it does not recognise
exactly it leaves to the Python path (``None``).
"""

from cpython.bytes cimport (PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE,
                            _PyBytes_Resize)
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

from scheduler._handles cimport _handle
from storage._msgpack cimport (K_NIL, Item, _body_tags_keys, _head, _int, _put_u32be, _str,
                               _str_map, _utf8, _w_head, _w_int, _w_raw, _w_str)

# --- pull: LogRecord payload -> the Delivered document (api/schemas.py) in msgpack ---------
# The keys this module writes come from api/schemas.py: api/wire_keys.py builds them from the
# Structs' fields, and this module takes them at import (at the end of this file), after
# checking that the Structs list their fields in the order written here (else ImportError:
# api/native.py then runs the pure-Python twins).
#: ``Received``'s fields (``Delivered``'s and a lease's three), in the order ``_delivered``
#: writes them
DELIVERED_FIELDS = ("offset", "msg_id", "topic", "tags", "keys", "properties", "body_base64",
                    "body", "born_at", "deliver_at", "stored_at", "receipt", "delivery_count",
                    "reconsume_times")
#: ``PullResult``'s, as ``pull_frame`` writes them
PULL_FIELDS = ("messages", "next_offset")
#: ``SendResult``'s that ``scheduled_answer`` writes (``cancel`` is left out: unset)
SEND_FIELDS = ("msg_id", "topic", "deliver_at", "status", "cancel_handle", "duplicate")

cdef bytes _K_OFFSET, _K_MSGID, _K_TOPIC, _K_TAGS, _K_KEYS, _K_PROPS, _K_B64, _K_BODY
cdef bytes _K_BORN, _K_DELIVER, _K_STORED, _K_RECEIPT, _K_COUNT, _K_RECONSUMED
cdef bytes _PULL_HEAD, _K_NEXT
# the send answer's fixed pieces, msgpack and JSON (see use_keys)
# a Delivered document's bytes besides its payload's (2n): the keys, the header and ints
cdef Py_ssize_t _room = 0


cdef _use_keys(tuple delivered, bytes pull_head, bytes next_offset, tuple send_msgpack,
               tuple send_json):
    """The encoded keys, from api/wire_keys.py: ``delivered``: one per DELIVERED_FIELDS (its
    msgpack str); ``pull_head``: ``{"messages": `` in msgpack (the map's header and its
    first key); ``next_offset``: the second key; ``send_msgpack`` (6) and ``send_json`` (7):
    the fixed pieces of the send answer between its values, which must be the ones
    ``scheduled_answer`` writes (SEND_MSGPACK, SEND_JSON)."""
    global _K_OFFSET, _K_MSGID, _K_TOPIC, _K_TAGS, _K_KEYS, _K_PROPS, _K_B64, _K_BODY
    global _K_BORN, _K_DELIVER, _K_STORED, _K_RECEIPT, _K_COUNT, _K_RECONSUMED
    global _PULL_HEAD, _K_NEXT, _room
    if len(delivered) != len(DELIVERED_FIELDS):
        raise ImportError("one key per field")
    if send_msgpack != SEND_MSGPACK or send_json != SEND_JSON:
        raise ImportError("the send answer's keys are not the schemas' (api/wire_keys.py)")
    for key in delivered:
        if type(key) is not bytes or len(key) > 40:
            raise ImportError("a key is bytes of at most 40")
    (_K_OFFSET, _K_MSGID, _K_TOPIC, _K_TAGS, _K_KEYS, _K_PROPS, _K_B64, _K_BODY, _K_BORN,
     _K_DELIVER, _K_STORED, _K_RECEIPT, _K_COUNT, _K_RECONSUMED) = delivered
    _PULL_HEAD = pull_head
    _K_NEXT = next_offset
    _room = 64 + sum(len(k) for k in delivered)


cdef inline Py_ssize_t _w_key(uint8_t* o, bytes key) noexcept:
    memcpy(o, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
    return PyBytes_GET_SIZE(key)


cdef int64_t _INT64_MAX = 0x7FFFFFFFFFFFFFFF


cdef struct LogFields:
    # the parts of a LogRecord payload the answers copy, as ``Item``s of the payload
    Item topic, msg_id, qo, body, tags, keys, props, born, deliver, stored
    Py_ssize_t keys_end, props_end  # where the keys array and the properties map end
    bint text  # the body is UTF-8 text (also sent as ``body``)


cdef bint _log_fields(const uint8_t* p, Py_ssize_t n, LogFields* f) noexcept:
    """Read the LogRecord payload ``p[:n]`` into ``f``; False for one the Python path must
    do. [version, topic, msg_id, queue_offset, body, tags, keys, properties, born_at,
    deliver_at, stored_at, flags], as written."""
    cdef Item it
    cdef Py_ssize_t i
    if n < 1 or p[0] != 0x9C:
        return False
    i = _int(p, n, 1, &it)
    if i >= 0:
        i = _str(p, n, i, &f.topic)
    if i >= 0:
        i = _str(p, n, i, &f.msg_id)
    if i >= 0:
        i = _int(p, n, i, &f.qo)
    if i >= 0:
        i = _body_tags_keys(p, n, i, &f.body, &f.tags, &f.keys)
    if i < 0:
        return False
    f.keys_end = i
    i = _str_map(p, n, i, &f.props, 16)
    if i < 0:
        return False
    f.props_end = i
    i = _int(p, n, i, &f.born)
    if i >= 0:
        i = _int(p, n, i, &f.deliver)
    if i >= 0:
        i = _int(p, n, i, &f.stored)
    if i >= 0:
        i = _int(p, n, i, &it)  # flags
    if i != n:
        return False
    f.text = _utf8(p + f.body.data, f.body.size)
    return True


cdef struct Split:
    # a body ``_delivered`` left out of its document (``pull_pieces``)
    Py_ssize_t min_size  # bodies of at least this many bytes are left out (given)
    Py_ssize_t at  # where its bytes belong in the document: after the header written there
    Py_ssize_t data, size  # where they are in the payload; size -1: none left out


cdef Py_ssize_t _delivered(const uint8_t* p, Py_ssize_t n, uint8_t* o, bint once, bint leased,
                           const char* receipt, Py_ssize_t receipt_size,
                           int64_t delivery_count, int64_t* queue_offset,
                           Split* split=NULL) noexcept:
    """Write the ``Delivered`` document of the LogRecord payload ``p[:n]`` (with ``leased``,
    the ``Received`` one) at ``o``, which has room for 2n + _room bytes (+ receipt_size + 64
    when leased); returns its length and sets ``queue_offset``, or -1 for a payload the
    Python path must do. With ``split`` and ``once``: a body of at least ``split.min_size``
    bytes is not copied (only its header is written); ``split`` says where it belongs."""
    cdef LogFields f
    cdef Py_ssize_t w
    if not _log_fields(p, n, &f):
        return -1
    # 10 fields and ``body`` if text (once: one of the two bodies); a leased message's 3 more
    o[0] = 0x80 | ((11 if f.text and not once else 10) + (3 if leased else 0))
    w = 1
    w += _w_key(o + w, _K_OFFSET)
    w += _w_int(o + w, f.qo.value)
    w += _w_key(o + w, _K_MSGID)
    w += _w_raw(o + w, p, f.msg_id.start, f.msg_id.data + f.msg_id.size)
    w += _w_key(o + w, _K_TOPIC)
    w += _w_raw(o + w, p, f.topic.start, f.topic.data + f.topic.size)
    w += _w_key(o + w, _K_TAGS)
    w += _w_raw(o + w, p, f.tags.start, f.keys.start)
    w += _w_key(o + w, _K_KEYS)
    w += _w_raw(o + w, p, f.keys.start, f.keys_end)
    w += _w_key(o + w, _K_PROPS)
    w += _w_raw(o + w, p, f.props.start, f.props_end)
    if split != NULL:
        split.size = -1
    if split != NULL and once and f.body.size >= split.min_size:  # (one body: left out)
        if f.text:
            w += _w_key(o + w, _K_BODY)
            w += _w_head(o + w, f.body.size, 0xA0, 31, 0xD9, 0xDA, 0xDB)
        else:
            w += _w_key(o + w, _K_B64)
            w += _w_raw(o + w, p, f.body.start, f.body.data)  # (the bin's header)
        split.at, split.data, split.size = w, f.body.data, f.body.size
    else:
        if not (once and f.text):
            w += _w_key(o + w, _K_B64)
            w += _w_raw(o + w, p, f.body.start, f.body.data + f.body.size)
        if f.text:
            w += _w_key(o + w, _K_BODY)
            w += _w_str(o + w, <const char*>p + f.body.data, f.body.size)
    w += _w_key(o + w, _K_BORN)
    w += _w_int(o + w, f.born.value)
    w += _w_key(o + w, _K_DELIVER)
    w += _w_int(o + w, f.deliver.value)
    w += _w_key(o + w, _K_STORED)
    w += _w_int(o + w, f.stored.value)
    if leased:
        w += _w_key(o + w, _K_RECEIPT)
        w += _w_str(o + w, receipt, receipt_size)
        w += _w_key(o + w, _K_COUNT)
        w += _w_int(o + w, delivery_count)
        w += _w_key(o + w, _K_RECONSUMED)
        o[w] = 0
        w += 1
    queue_offset[0] = f.qo.value
    return w


cdef inline Py_ssize_t _room_of(bint json, Py_ssize_t n, bint leased,
                                Py_ssize_t receipt_size) noexcept:
    """The bytes a ``Delivered`` (``leased``: ``Received``) document of a payload of ``n``
    bytes may take at most: msgpack 2n (a text body twice), JSON 8n (escapes, base64)."""
    if json:
        return 8 * n + _jroom + (6 * receipt_size + 64 if leased else 0)
    return 2 * n + _room + (receipt_size + 64 if leased else 0)


cdef tuple _delivered_docs(list payloads, list receipts, list counts, bint once, bint json):
    """``delivered_msgpack`` / ``delivered_json``: one writer, the encoding switched."""
    cdef Py_ssize_t count = PyList_GET_SIZE(payloads), k, n, w, receipt_size = 0
    cdef list out = [None] * count
    cdef list queue_offsets = [None] * count
    cdef const char* receipt = NULL
    cdef int64_t delivery_count = 0, qo = 0
    cdef bint leased = receipts is not None
    cdef uint8_t* o
    if leased and (counts is None or PyList_GET_SIZE(receipts) != count
                   or PyList_GET_SIZE(counts) != count):
        raise ValueError("receipts and counts: one of each per payload")
    for k in range(count):
        payload = <object>PyList_GET_ITEM(payloads, k)
        if type(payload) is not bytes:
            continue
        if leased:
            r = <object>PyList_GET_ITEM(receipts, k)
            c = <object>PyList_GET_ITEM(counts, k)
            if type(r) is not str or type(c) is not int or not 0 <= c < (1 << 63):
                continue
            receipt = PyUnicode_AsUTF8AndSize(r, &receipt_size)
            delivery_count = c
        n = PyBytes_GET_SIZE(payload)
        buf = PyBytes_FromStringAndSize(NULL, _room_of(json, n, leased, receipt_size))
        o = <uint8_t*>PyBytes_AS_STRING(buf)
        w = _doc(json, <const uint8_t*>PyBytes_AS_STRING(payload), n, o, once, leased,
                 receipt, receipt_size, delivery_count, &qo)
        if w < 0:
            continue
        out[k] = buf[:w]
        queue_offsets[k] = qo
    return out, queue_offsets


def delivered_msgpack(list payloads, list receipts=None, list counts=None, bint once=False):
    """For each LogRecord payload: the msgpack of its ``Delivered`` document (what
    ``msgspec.msgpack.encode(api.routes.consume.delivered(decode_log_record(p), once))``
    gives), or None where the Python path must do it; and the queue offset of each. With
    ``receipts`` and ``counts`` (one each per payload): a leased message's ``Received``
    document instead, its receipt, delivery count and ``reconsumeTimes`` 0 after the
    fields of ``Delivered`` (scheduler/groups.py, a message shown as stored). ``once``: the
    body only once, as ``body`` when it is UTF-8 text, else as ``bodyBase64``
    (``Prefer: body=once``, api/schemas.py ``body_fields``)."""
    return _delivered_docs(payloads, receipts, counts, once, False)


def received_msgpack(list payloads, list receipts, list counts, bint once=False,
                     bytes head=b"", bytes tail=b""):
    """A receive's answer in msgpack when every message is shown as stored, in one buffer:
    ``head``, the array header, each message's ``Received`` document (as
    ``delivered_msgpack`` writes it with its receipt and count), ``tail``; no bytes object
    per message, no join. None when any payload is one ``delivered_msgpack`` leaves to
    Python (the caller then goes that way)."""
    return _received(payloads, receipts, counts, once, head, tail, False)


def pull_pieces(list payloads, bint once, Py_ssize_t min_size):
    """``pull_frame(payloads, once)`` as pieces for one ``writev`` (api/push.py): their
    bytes joined are the frame's, and each body of at least ``min_size`` bytes (``once``
    only: a message carries one body) is its own piece, a memoryview of its payload, not a
    copy. None where ``pull_frame`` gives None."""
    cdef Py_ssize_t count = PyList_GET_SIZE(payloads), k, n, w, size, prev
    cdef int64_t qo = 0
    cdef uint8_t* o
    cdef Split split
    cdef PyObject* raw
    if count == 0 or not once:
        return None
    size = _pull_size(payloads, False)
    if size < 0:
        return None
    buf = PyBytes_FromStringAndSize(NULL, size)
    o = <uint8_t*>PyBytes_AS_STRING(buf)
    w = _w_key(o, _PULL_HEAD)
    w += _w_array(o + w, count)
    split.min_size = min_size if min_size > 0 else 1
    cuts = []  # (where in buf, payload index, data, size) of each body left out
    for k in range(count):
        payload = <object>PyList_GET_ITEM(payloads, k)
        n = _delivered(<const uint8_t*>PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload),
                       o + w, once, False, NULL, 0, 0, &qo, &split)
        if n < 0:
            return None
        if split.size >= 0:
            cuts.append((w + split.at, k, split.data, split.size))
        w += n
    if qo == _INT64_MAX:
        return None
    w += _w_key(o + w, _K_NEXT)
    w += _w_int(o + w, qo + 1)
    raw = <PyObject*>buf  # cut to w in place (_pull)
    Py_INCREF(buf)
    buf = None
    _PyBytes_Resize(&raw, w)
    frame = <object>raw
    Py_XDECREF(raw)
    if not cuts:
        return [frame]
    view = memoryview(frame)
    pieces = []
    prev = 0
    for at, k, data, n in cuts:
        pieces.append(view[prev:at])
        pieces.append(memoryview(<object>PyList_GET_ITEM(payloads, k))[data:data + n])
        prev = at
    pieces.append(view[prev:w])
    return pieces


def pull_frame(list payloads, bint once=False):
    """The msgpack of a pull answer of ``payloads`` (``{"messages": [...], "nextOffset":
    n}``, the bytes api/routes/consume.py ``pull_msgpack_py`` gives) written into one
    buffer: no bytes object per message, no join. None when there are none, or when any
    payload is one ``delivered_msgpack`` leaves to Python (the caller then goes that way)."""
    return _pull(payloads, once, False)


cdef bint _json_safe(const char* s, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    cdef uint8_t ch
    for i in range(n):
        ch = <uint8_t>s[i]
        if ch < 0x20 or ch >= 0x7F or ch == 0x22 or ch == 0x5C:
            return False
    return True


cdef inline Py_ssize_t _w_lit(uint8_t* o, const char* s, Py_ssize_t n) noexcept:
    memcpy(o, s, n)
    return n


cdef inline Py_ssize_t _w_dec(uint8_t* o, int64_t v) noexcept:
    cdef char tmp[24]
    cdef Py_ssize_t n = 0, k
    cdef uint64_t u
    cdef bint neg = v < 0
    u = <uint64_t>(-(v + 1)) + 1 if neg else <uint64_t>v
    while True:
        tmp[n] = 48 + <char>(u % 10)
        n += 1
        u //= 10
        if u == 0:
            break
    k = 0
    if neg:
        o[0] = 45
        k = 1
    while n:
        n -= 1
        o[k] = tmp[n]
        k += 1
    return k


# The fixed pieces of the send answer, as scheduled_answer writes them below: C literals of a
# known length (a memcpy of a constant size: a move or two), which a key taken at run time
# would make ~10 % slower. Not a second definition left to drift: this module does not load
# unless api/wire_keys.py builds exactly these from the schemas (_use_keys), and
# tests/api/test_columns_send.py compares the answers with msgspec's.
SEND_MSGPACK = (b"\x81\xa7results", b"\x86\xa5msgId", b"\xa5topic", b"\xa9deliverAt",
                b"\xa6status\xa9SCHEDULED\xaccancelHandle", b"\xa9duplicate\xc2")
SEND_JSON = (b'{"results":[', b'{"msgId":"', b'","topic":"', b'","deliverAt":',
             b',"status":"SCHEDULED","cancelHandle":"', b'","duplicate":false}', b"]}")


def scheduled_answer(list msg_ids, str topic, list deliver_ats, list timer_keys, bint msgpack):
    """The send answer ``{"results": [SendResult, ...]}`` of messages just SCHEDULED (none a
    duplicate), as msgspec encodes it: msgpack, or JSON. None when a string would need
    escaping in JSON (never for the API's msgIds and topics): the caller encodes the Structs."""
    cdef Py_ssize_t count = PyList_GET_SIZE(msg_ids), k, n, tn, w = 0, bound
    cdef const char* t = PyUnicode_AsUTF8AndSize(topic, &tn)
    cdef const char* s
    cdef char hdl[808]
    cdef Py_ssize_t hn
    cdef uint8_t* o
    if not msgpack and not _json_safe(t, tn):
        return None
    bound = 16
    for k in range(count):
        bound += 160 + tn + 2 * len(<str>PyList_GET_ITEM(msg_ids, k)) + 4 * len(
            <bytes>PyList_GET_ITEM(timer_keys, k))
    out = PyBytes_FromStringAndSize(NULL, bound)
    o = <uint8_t*>PyBytes_AS_STRING(out)
    if msgpack:
        w = _w_lit(o, b"\x81\xa7results", 9)
        w += _w_head(o + w, count, 0x90, 15, 0, 0xDC, 0xDD)
    else:
        w = _w_lit(o, b'{"results":[', 12)
    for k in range(count):
        s = PyUnicode_AsUTF8AndSize(<str>PyList_GET_ITEM(msg_ids, k), &n)
        hn = _handle(hdl, <object>PyList_GET_ITEM(timer_keys, k))
        if msgpack:
            w += _w_lit(o + w, b"\x86\xa5msgId", 7)
            w += _w_str(o + w, s, n)
            w += _w_lit(o + w, b"\xa5topic", 6)
            w += _w_str(o + w, t, tn)
            w += _w_lit(o + w, b"\xa9deliverAt", 10)
            w += _w_int(o + w, <int64_t>(<object>PyList_GET_ITEM(deliver_ats, k)))
            w += _w_lit(o + w, b"\xa6status\xa9SCHEDULED\xaccancelHandle", 30)
            w += _w_str(o + w, hdl, hn)
            w += _w_lit(o + w, b"\xa9duplicate\xc2", 11)
        else:
            if not _json_safe(s, n):
                return None
            if k:
                o[w] = 44
                w += 1
            w += _w_lit(o + w, b'{"msgId":"', 10)
            w += _w_lit(o + w, s, n)
            w += _w_lit(o + w, b'","topic":"', 11)
            w += _w_lit(o + w, t, tn)
            w += _w_lit(o + w, b'","deliverAt":', 14)
            w += _w_dec(o + w, <int64_t>(<object>PyList_GET_ITEM(deliver_ats, k)))
            w += _w_lit(o + w, b',"status":"SCHEDULED","cancelHandle":"', 38)
            w += _w_lit(o + w, hdl, hn)
            w += _w_lit(o + w, b'","duplicate":false}', 20)
    if not msgpack:
        w += _w_lit(o + w, b"]}", 2)
    return out[:w]


# --- pull and receive in JSON: LogRecord payload -> the Delivered document ------------------
# The same documents as above, as msgspec.json writes them: the keys (``"offset":`` ...) from
# api/wire_keys.py (``json_keys``), strings escaped as msgspec escapes them, the body's bytes
# in base64 (standard alphabet, padded).
cdef tuple _JK = ()  # DELIVERED_FIELDS' keys, each ``"name":``
cdef bytes _J_PULL_HEAD = b""  # ``{"messages":[``
cdef bytes _J_NEXT = b""  # ``],"nextOffset":``
cdef Py_ssize_t _jroom = 0  # a Delivered document's bytes besides its strings' (escaped)
cdef const char* _B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
cdef const char* _HEX = b"0123456789abcdef"
cdef const char* _ESC = b"btn?fr"  # the short escapes of 8-13 (11 has none)


cdef _use_json_keys(tuple delivered, bytes pull_head, bytes next_offset):
    global _JK, _J_PULL_HEAD, _J_NEXT, _jroom
    if len(delivered) != len(DELIVERED_FIELDS):
        raise ImportError("one JSON key per field")
    for key in delivered:
        if type(key) is not bytes or len(key) > 40:
            raise ImportError("a JSON key is bytes of at most 40")
    _JK, _J_PULL_HEAD, _J_NEXT = delivered, pull_head, next_offset
    _jroom = 128 + sum(len(k) + 1 for k in delivered)


cdef inline Py_ssize_t _w_jkey(uint8_t* o, Py_ssize_t k) noexcept:
    """``,"name":`` of field ``k`` (the first without its comma)."""
    cdef bytes key = <bytes>_JK[k]
    if k:
        o[0] = 44
        memcpy(o + 1, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
        return 1 + PyBytes_GET_SIZE(key)
    memcpy(o, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
    return PyBytes_GET_SIZE(key)


cdef Py_ssize_t _w_jstr(uint8_t* o, const uint8_t* s, Py_ssize_t n) noexcept:
    """A JSON string of the (valid UTF-8) ``s[:n]`` as msgspec writes it: the quote and the
    backslash escaped, the controls below 0x20 by their short escape (b t n f r) or as u00xx,
    the rest as is; at most 6n + 2 bytes. Eight bytes at a time where none of them is to be
    escaped (a word test: any byte below 0x20, a quote or a backslash; exact as a yes/no)."""
    cdef Py_ssize_t i = 0, w = 1, end
    cdef uint8_t c
    cdef uint64_t x, q, b
    o[0] = 34
    while i < n:
        if i + 8 <= n:
            memcpy(&x, s + i, 8)
            q = x ^ 0x2222222222222222ULL
            b = x ^ 0x5C5C5C5C5C5C5C5CULL
            if (((x - 0x2020202020202020ULL) & ~x) | ((q - 0x0101010101010101ULL) & ~q)
                    | ((b - 0x0101010101010101ULL) & ~b)) & 0x8080808080808080ULL == 0:
                memcpy(o + w, s + i, 8)
                w += 8
                i += 8
                continue
            end = i + 8
        else:
            end = n
        while i < end:
            c = s[i]
            i += 1
            if c >= 0x20 and c != 0x22 and c != 0x5C:
                o[w] = c
                w += 1
            elif c == 0x22 or c == 0x5C:
                o[w] = 0x5C
                o[w + 1] = c
                w += 2
            elif c == 8 or c == 9 or c == 10 or c == 12 or c == 13:
                o[w] = 0x5C
                o[w + 1] = _ESC[c - 8]
                w += 2
            else:
                memcpy(o + w, b"\\u00", 4)
                o[w + 4] = _HEX[c >> 4]
                o[w + 5] = _HEX[c & 15]
                w += 6
    o[w] = 34
    return w + 1


cdef Py_ssize_t _w_b64(uint8_t* o, const uint8_t* s, Py_ssize_t n) noexcept:
    """``"base64"`` of ``s[:n]``, padded: 4 * ceil(n / 3) + 2 bytes."""
    cdef Py_ssize_t i = 0, w = 1
    cdef uint32_t v
    o[0] = 34
    while i + 3 <= n:
        v = (<uint32_t>s[i] << 16) | (<uint32_t>s[i + 1] << 8) | s[i + 2]
        o[w] = _B64[v >> 18]
        o[w + 1] = _B64[(v >> 12) & 63]
        o[w + 2] = _B64[(v >> 6) & 63]
        o[w + 3] = _B64[v & 63]
        w += 4
        i += 3
    if n - i == 1:
        v = <uint32_t>s[i] << 16
        o[w] = _B64[v >> 18]
        o[w + 1] = _B64[(v >> 12) & 63]
        o[w + 2] = 61
        o[w + 3] = 61
        w += 4
    elif n - i == 2:
        v = (<uint32_t>s[i] << 16) | (<uint32_t>s[i + 1] << 8)
        o[w] = _B64[v >> 18]
        o[w + 1] = _B64[(v >> 12) & 63]
        o[w + 2] = _B64[(v >> 6) & 63]
        o[w + 3] = 61
        w += 4
    o[w] = 34
    return w + 1


cdef Py_ssize_t _w_jitem(uint8_t* o, const uint8_t* p, Py_ssize_t n, Py_ssize_t i,
                         Py_ssize_t* w) noexcept:
    """The str at ``p[i]`` (checked by the caller) as a JSON string at ``o + w[0]``;
    returns the index past it."""
    cdef Item it
    i = _head(p, n, i, &it)
    w[0] += _w_jstr(o + w[0], p + it.data, it.size)
    return i + it.size


cdef Py_ssize_t _delivered_json(const uint8_t* p, Py_ssize_t n, uint8_t* o, bint once,
                                bint leased, const char* receipt, Py_ssize_t receipt_size,
                                int64_t delivery_count, int64_t* queue_offset) noexcept:
    """``_delivered`` in JSON: at ``o``, which has room for 8n + _jroom bytes (+ 6 *
    receipt_size + 64 when leased); -1 for a payload the Python path must do."""
    cdef LogFields f
    cdef Item it
    cdef Py_ssize_t i, w, k, count
    if not _log_fields(p, n, &f):
        return -1
    o[0] = 123
    w = 1
    w += _w_jkey(o + w, 0)
    w += _w_dec(o + w, f.qo.value)
    w += _w_jkey(o + w, 1)
    w += _w_jstr(o + w, p + f.msg_id.data, f.msg_id.size)
    w += _w_jkey(o + w, 2)
    w += _w_jstr(o + w, p + f.topic.data, f.topic.size)
    w += _w_jkey(o + w, 3)
    if f.tags.kind == K_NIL:
        memcpy(o + w, b"null", 4)
        w += 4
    else:
        w += _w_jstr(o + w, p + f.tags.data, f.tags.size)
    w += _w_jkey(o + w, 4)
    o[w] = 91
    w += 1
    i = _head(p, n, f.keys.start, &it)
    count = it.size
    for k in range(count):
        if k:
            o[w] = 44
            w += 1
        i = _w_jitem(o, p, n, i, &w)
    o[w] = 93
    w += 1
    w += _w_jkey(o + w, 5)
    o[w] = 123
    w += 1
    i = _head(p, n, f.props.start, &it)
    count = it.size
    for k in range(count):
        if k:
            o[w] = 44
            w += 1
        i = _w_jitem(o, p, n, i, &w)
        o[w] = 58
        w += 1
        i = _w_jitem(o, p, n, i, &w)
    o[w] = 125
    w += 1
    if not (once and f.text):
        w += _w_jkey(o + w, 6)
        w += _w_b64(o + w, p + f.body.data, f.body.size)
    if f.text:
        w += _w_jkey(o + w, 7)
        w += _w_jstr(o + w, p + f.body.data, f.body.size)
    w += _w_jkey(o + w, 8)
    w += _w_dec(o + w, f.born.value)
    w += _w_jkey(o + w, 9)
    w += _w_dec(o + w, f.deliver.value)
    w += _w_jkey(o + w, 10)
    w += _w_dec(o + w, f.stored.value)
    if leased:
        w += _w_jkey(o + w, 11)
        w += _w_jstr(o + w, <const uint8_t*>receipt, receipt_size)
        w += _w_jkey(o + w, 12)
        w += _w_dec(o + w, delivery_count)
        w += _w_jkey(o + w, 13)
        o[w] = 48
        w += 1
    o[w] = 125
    queue_offset[0] = f.qo.value
    return w + 1


def delivered_json(list payloads, list receipts=None, list counts=None, bint once=False):
    """``delivered_msgpack`` in JSON: each payload's document as
    ``msgspec.json.encode(api.routes.consume.delivered(decode_log_record(p), once))`` gives
    it (with ``receipts`` and ``counts``: the ``Received`` one), or None where the Python
    path must do it; and the queue offset of each."""
    return _delivered_docs(payloads, receipts, counts, once, True)


def pull_frame_json(list payloads, bint once=False):
    """``pull_frame`` in JSON: ``{"messages":[...],"nextOffset":n}`` as
    ``msgspec.json.encode(api.routes.consume.pull_result(...))`` gives it, in one buffer;
    None when there are none, or when any payload is one ``delivered_json`` leaves to
    Python."""
    return _pull(payloads, once, True)


def received_json(list payloads, list receipts, list counts, bint once=False,
                  bytes head=b"", bytes tail=b""):
    """The ``Received`` documents of leased messages (``delivered_json`` with receipts and
    counts) joined by commas in one buffer (a receive answer's messages), after ``head`` and
    before ``tail`` (the answer's other pieces: one buffer, no join); None when any is one
    ``delivered_json`` leaves to Python (the caller then goes that way)."""
    return _received(payloads, receipts, counts, once, head, tail, True)


cdef inline Py_ssize_t _doc(bint json, const uint8_t* p, Py_ssize_t n, uint8_t* o,
                            bint once, bint leased, const char* receipt,
                            Py_ssize_t receipt_size, int64_t delivery_count,
                            int64_t* queue_offset) noexcept:
    if json:
        return _delivered_json(p, n, o, once, leased, receipt, receipt_size, delivery_count,
                               queue_offset)
    return _delivered(p, n, o, once, leased, receipt, receipt_size, delivery_count,
                      queue_offset)


cdef inline Py_ssize_t _w_array(uint8_t* o, Py_ssize_t count) noexcept:
    """A msgpack array header, as msgspec writes it."""
    if count < 16:
        o[0] = 0x90 | count
        return 1
    if count < 0x10000:
        o[0] = 0xDC
        o[1] = (count >> 8) & 0xFF
        o[2] = count & 0xFF
        return 3
    o[0] = 0xDD
    _put_u32be(o + 1, <uint32_t>count)
    return 5


cdef Py_ssize_t _pull_size(list payloads, bint json) except -2:
    """The room a pull frame of ``payloads`` needs (``_pull``, ``pull_pieces``); -1 when any
    payload is not bytes (the caller then goes Python's way)."""
    cdef Py_ssize_t k, size = 32 + PyBytes_GET_SIZE(_J_PULL_HEAD if json else _PULL_HEAD) \
        + PyBytes_GET_SIZE(_J_NEXT if json else _K_NEXT)
    for k in range(PyList_GET_SIZE(payloads)):
        payload = <object>PyList_GET_ITEM(payloads, k)
        if type(payload) is not bytes:
            return -1
        size += _room_of(json, PyBytes_GET_SIZE(payload), False, 0) + 1
    return size


cdef object _pull(list payloads, bint once, bint json):
    """``pull_frame`` / ``pull_frame_json``: one writer, the encoding switched."""
    cdef Py_ssize_t count = PyList_GET_SIZE(payloads), k, n, w, size
    cdef int64_t qo = 0
    cdef uint8_t* o
    cdef PyObject* raw
    if count == 0:
        return None
    size = _pull_size(payloads, json)
    if size < 0:
        return None
    buf = PyBytes_FromStringAndSize(NULL, size)
    o = <uint8_t*>PyBytes_AS_STRING(buf)
    if json:
        w = _w_key(o, _J_PULL_HEAD)
    else:
        w = _w_key(o, _PULL_HEAD)
        w += _w_array(o + w, count)
    for k in range(count):
        payload = <object>PyList_GET_ITEM(payloads, k)
        if json and k:
            o[w] = 44
            w += 1
        n = _doc(json, <const uint8_t*>PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload),
                 o + w, once, False, NULL, 0, 0, &qo)
        if n < 0:
            return None
        w += n
    if qo == _INT64_MAX:  # the next offset would not be an int64 (msgspec: a uint64)
        return None
    if json:
        w += _w_key(o + w, _J_NEXT)
        w += _w_dec(o + w, qo + 1)
        o[w] = 125
        w += 1
        return buf[:w]  # (a copy: cheaper here than shrinking the buffer of 8n in place)
    w += _w_key(o + w, _K_NEXT)
    w += _w_int(o + w, qo + 1)
    # cut to w in place, as _received does: buf[:w] copied the whole frame (2 % of a 16 KiB
    # bodies' drain, perf)
    raw = <PyObject*>buf
    Py_INCREF(buf)
    buf = None
    _PyBytes_Resize(&raw, w)  # on failure it drops raw itself and raises
    out = <object>raw
    Py_XDECREF(raw)
    return out


cdef object _received(list payloads, list receipts, list counts, bint once, bytes head,
                      bytes tail, bint json):
    """``received_msgpack`` / ``received_json``: one writer, the encoding switched."""
    cdef Py_ssize_t count = PyList_GET_SIZE(payloads), k, n, w, size, receipt_size
    cdef int64_t qo = 0
    cdef uint8_t* o
    cdef const char* receipt
    cdef PyObject* raw
    if PyList_GET_SIZE(receipts) != count or PyList_GET_SIZE(counts) != count:
        raise ValueError("receipts and counts: one of each per payload")
    size = PyBytes_GET_SIZE(head) + PyBytes_GET_SIZE(tail) + 5
    for k in range(count):
        payload = <object>PyList_GET_ITEM(payloads, k)
        r = <object>PyList_GET_ITEM(receipts, k)
        c = <object>PyList_GET_ITEM(counts, k)
        if type(payload) is not bytes or type(r) is not str or type(c) is not int \
                or not 0 <= c < (1 << 63):
            return None
        PyUnicode_AsUTF8AndSize(r, &receipt_size)
        size += _room_of(json, PyBytes_GET_SIZE(payload), True, receipt_size) + 1
    buf = PyBytes_FromStringAndSize(NULL, size)
    o = <uint8_t*>PyBytes_AS_STRING(buf)
    w = PyBytes_GET_SIZE(head)
    memcpy(o, PyBytes_AS_STRING(head), w)
    if not json:
        w += _w_array(o + w, count)
    for k in range(count):
        payload = <object>PyList_GET_ITEM(payloads, k)
        receipt = PyUnicode_AsUTF8AndSize(<str>PyList_GET_ITEM(receipts, k), &receipt_size)
        if json and k:
            o[w] = 44
            w += 1
        n = _doc(json, <const uint8_t*>PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload),
                 o + w, once, True, receipt, receipt_size,
                 <int64_t>(<object>PyList_GET_ITEM(counts, k)), &qo)
        if n < 0:
            return None
        w += n
    memcpy(o + w, PyBytes_AS_STRING(tail), PyBytes_GET_SIZE(tail))
    w += PyBytes_GET_SIZE(tail)
    if json:
        return buf[:w]  # (a copy: cheaper here than shrinking the buffer of 8n in place)
    raw = <PyObject*>buf  # cut to w in place: no copy, as buf[:w] would make
    Py_INCREF(buf)
    buf = None
    _PyBytes_Resize(&raw, w)  # on failure it drops raw itself and raises
    out = <object>raw
    Py_XDECREF(raw)
    return out


# --- the keys, from the schemas ----------------------------------------------------------------
from api.wire_keys import key_table as _key_table

_table = _key_table()
if not _table.fits(DELIVERED_FIELDS, PULL_FIELDS, SEND_FIELDS):
    raise ImportError("api/schemas.py lists a document's fields otherwise than api/_native.pyx "
                      "writes them")
_use_keys(_table.keys[0], _table.keys[1], _table.keys[2], _table.keys[3], _table.keys[4])
_use_json_keys(_table.json_keys[0], _table.json_keys[1], _table.json_keys[2])
del _table
