# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Compiled twins of the scheduler's per-message loops: the send path's intake (a column
batch straight from the request), the codec (stored value -> log payload, index entries,
cancel handles), a commit's columns, receipts, the due timeline's counts.

Built from source by pip (setup.py) when a C compiler is there; scheduler/native.py picks
these or the pure-Python functions (scheduler/codec.py, scheduler/intake.py,
scheduler/group_state.py, scheduler/timeline.py), and tests/scheduler/test_native.py checks
that both give the same bytes. What it does not recognise exactly it leaves to the Python
path (``None``), which then decodes with every check and raises where it must. The rules
it needs its own copy of (the msgId pattern, a body-only message's timing) are held equal to
their Python definitions by tests/scheduler/test_native.py (``msg_id_ok``, ``due_later``).
"""

from cpython.bytes cimport (PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize,
                            PyBytes_GET_SIZE,
                            _PyBytes_Resize)
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport (PyUnicode_AsUTF8AndSize, PyUnicode_DecodeASCII,
                              PyUnicode_DecodeUTF8)
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

from scheduler._handles cimport _handle
from storage._msgpack cimport (K_ARRAY, K_BIN, K_MAP, Item, _be, _body_tags_keys, _head, _int,
                               _same, _str, _utf8, _w_bin, _w_head, _w_int, _w_raw, _w_str)

# --- delivery: stored MessageRecord value -> LogRecord payload -----------------------------
def log_payloads(list values, list topics, list ikeys, list offsets, list deliver_ats,
                 int64_t stored_at):
    """For each stored MessageRecord value (== scheduler.codec.log_payloads_py): its
    LogRecord payload, its msgId copied from its index key (topic NUL msgId) as bytes, never
    made a str; or None where the Python path must do it (properties to filter, a msgId
    that is not ASCII, an index key of another topic, anything not exactly as msgspec
    writes it)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(values), k, n, i, tsize, msize, end_keys, kn, j
    cdef list out = [None] * count
    cdef const uint8_t* p
    cdef const char* t
    cdef const char* m
    cdef const char* kp
    cdef Item it, body, tags, keys, born, flags
    cdef uint8_t* o
    cdef Py_ssize_t w
    cdef int64_t offset, deliver_at
    cdef PyObject* raw
    cdef bint ascii
    if not (PyList_GET_SIZE(topics) == PyList_GET_SIZE(ikeys) == PyList_GET_SIZE(offsets)
            == PyList_GET_SIZE(deliver_ats) == count):
        raise ValueError("log_payloads: columns of different lengths")
    for k in range(count):
        value = <object>PyList_GET_ITEM(values, k)
        ikey = <object>PyList_GET_ITEM(ikeys, k)
        if type(value) is not bytes or type(ikey) is not bytes:
            continue
        p = <const uint8_t*>PyBytes_AS_STRING(value)
        n = PyBytes_GET_SIZE(value)
        # [version, body, tags, keys, properties, born_at, deliver_at, flags], as written
        if n < 1 or p[0] != 0x98:
            continue
        i = _int(p, n, 1, &it)  # version: any int
        if i < 0:
            continue
        i = _body_tags_keys(p, n, i, &body, &tags, &keys)
        if i < 0:
            continue
        end_keys = i
        if i >= n or p[i] != 0x80:  # properties: only none here (delivered_properties)
            continue
        i = _int(p, n, i + 1, &born)
        if i < 0:
            continue
        i = _int(p, n, i, &it)  # the stored deliver_at: the key's is the one used
        if i < 0:
            continue
        i = _int(p, n, i, &flags)
        if i != n:
            continue
        t = PyUnicode_AsUTF8AndSize(<object>PyList_GET_ITEM(topics, k), &tsize)
        kp = PyBytes_AS_STRING(ikey)
        kn = PyBytes_GET_SIZE(ikey)
        if kn <= tsize or kp[tsize] != 0 or memcmp(kp, t, tsize) != 0:
            continue
        m = kp + tsize + 1
        msize = kn - tsize - 1
        ascii = True
        for j in range(msize):
            if <uint8_t>m[j] >= 0x80:
                ascii = False
                break
        if not ascii:  # (UTF-8 is the Python path's to check)
            continue
        offset = <object>PyList_GET_ITEM(offsets, k)
        deliver_at = <object>PyList_GET_ITEM(deliver_ats, k)
        buf = PyBytes_FromStringAndSize(NULL, n + tsize + msize + 64)
        o = <uint8_t*>PyBytes_AS_STRING(buf)
        o[0] = 0x9C  # 12 fields
        o[1] = 0x01  # FORMAT_VERSION
        w = 2
        w += _w_str(o + w, t, tsize)
        w += _w_str(o + w, m, msize)
        w += _w_int(o + w, offset)
        w += _w_raw(o + w, p, body.start, end_keys)  # body, tags, keys as stored
        o[w] = 0x80
        w += 1
        w += _w_int(o + w, born.value)
        w += _w_int(o + w, deliver_at)
        w += _w_int(o + w, stored_at)
        w += _w_int(o + w, flags.value)
        # buf[:w] without copying the record again (a 16 KiB body: 16 KiB more a message):
        # cut in place (realloc), which needs ``raw`` to hold the only reference
        raw = <PyObject*>buf
        Py_INCREF(buf)
        buf = None
        _PyBytes_Resize(&raw, w)  # on failure it drops raw itself and raises
        out[k] = <object>raw
        Py_XDECREF(raw)
    return out


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object)


def same_receipts(list given, list issued):
    """== scheduler.group_state.same_receipts_py: whether ``given`` is exactly the str of
    ``issued`` (receipts as issued: ASCII), in order, compared in a time that does not
    depend on where they differ (their tags are secret): eight bytes at a time, no join.
    None when an item of ``given`` is not an ASCII str."""
    cdef Py_ssize_t count = PyList_GET_SIZE(given), k, n, m, i
    cdef const char* a
    cdef const char* b
    cdef uint64_t diff = 0, x, y
    for k in range(count):
        item = <object>PyList_GET_ITEM(given, k)
        if type(item) is not str or not PyUnicode_IS_ASCII(item):
            return None
    if count != PyList_GET_SIZE(issued):
        return False
    for k in range(count):
        other = <object>PyList_GET_ITEM(issued, k)
        if type(other) is not str or not PyUnicode_IS_ASCII(other):
            return None
        a = PyUnicode_AsUTF8AndSize(<object>PyList_GET_ITEM(given, k), &n)
        b = PyUnicode_AsUTF8AndSize(other, &m)
        if n != m:  # (a length is no secret: every receipt's tag has the same one)
            diff |= 1
            continue
        i = 0
        while i + 8 <= n:
            memcpy(&x, a + i, 8)
            memcpy(&y, b + i, 8)
            diff |= x ^ y
            i += 8
        while i < n:
            diff |= <uint8_t>a[i] ^ <uint8_t>b[i]
            i += 1
    return diff == 0


def receipt_offsets(list receipts, str prefix):
    """== scheduler.group_state.receipt_offsets_py: the offsets of receipts that all start
    with ``prefix``, each followed by an offset in lowercase hex (``0``, or 1-16 digits
    without a leading zero); None when one is otherwise (or not a str)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(receipts), k, n, plen, i
    cdef const char* pre = PyUnicode_AsUTF8AndSize(prefix, &plen)
    cdef const char* r
    cdef list out = [None] * count
    cdef uint64_t u
    cdef char ch
    for k in range(count):
        item = <object>PyList_GET_ITEM(receipts, k)
        if type(item) is not str:
            return None
        r = PyUnicode_AsUTF8AndSize(item, &n)
        if n <= plen or n - plen > 16 or memcmp(r, pre, plen) != 0:
            return None
        if r[plen] == 48 and n - plen > 1:  # a leading zero
            return None
        u = 0
        for i in range(plen, n):
            ch = r[i]
            if 48 <= ch <= 57:
                u = (u << 4) | <uint64_t>(ch - 48)
            elif 97 <= ch <= 102:
                u = (u << 4) | <uint64_t>(ch - 87)
            else:
                return None
        out[k] = u
    return out


def split_due(list items):
    """(index keys, values, deliverAts, topics) of scanned (timer key, value) pairs, as
    scheduler/codec.py's ``split_due_py`` gives them; None when a key is not
    ``deliverAt(8) + topic + NUL + msgId`` (that path then raises). The msgIds stay in the
    index keys (``log_payloads`` copies them from there)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(items), k, n, j
    cdef list ikeys = [None] * count, values = [None] * count, ats = [None] * count
    cdef list topics = [None] * count
    cdef const uint8_t* p
    cdef const uint8_t* nul
    cdef uint64_t at
    cdef bytes last_raw = None
    cdef object last_topic = None
    cdef object last_at = None  # a burst's keys share their deliverAt: one int object
    cdef uint64_t last_at_value = 0
    for k in range(count):
        pair = <object>PyList_GET_ITEM(items, k)
        if type(pair) is not tuple or PyTuple_GET_SIZE(pair) != 2:
            return None
        key = <object>PyTuple_GET_ITEM(pair, 0)
        if type(key) is not bytes:
            return None
        p = <const uint8_t*>PyBytes_AS_STRING(key)
        n = PyBytes_GET_SIZE(key)
        if n < 9:
            return None
        nul = NULL
        for j in range(8, n):
            if p[j] == 0:
                nul = p + j
                break
        if nul == NULL:
            return None
        _be(p, 8, &at)
        if last_at is None or at != last_at_value:
            last_at = at
            last_at_value = at
        ats[k] = last_at
        ikeys[k] = PyBytes_FromStringAndSize(<const char*>p + 8, n - 8)
        values[k] = <object>PyTuple_GET_ITEM(pair, 1)
        j = nul - p
        if last_raw is None or PyBytes_GET_SIZE(last_raw) != j - 8 or not _same(
                <const uint8_t*>PyBytes_AS_STRING(last_raw), p + 8, j - 8):
            last_raw = PyBytes_FromStringAndSize(<const char*>p + 8, j - 8)
            last_topic = PyUnicode_DecodeUTF8(<const char*>p + 8, j - 8, "strict")
        topics[k] = last_topic
    return ikeys, values, ats, topics


def delivered_index_values(list deliver_ats, int64_t updated_at, list offsets,
                           list positions):
    """== [scheduler.codec.index_value("DELIVERED", at, updated_at, offset, position)
    for ...] (no transaction id); None where a value does not fit int64."""
    cdef Py_ssize_t count = PyList_GET_SIZE(deliver_ats), k, w
    cdef list out = [None] * count
    cdef uint8_t tmp[64]
    try:
        _index_values(deliver_ats, updated_at, offsets, positions, out, count, tmp)
    except OverflowError:  # a value past int64: msgspec writes it as uint64 (Python path)
        return None
    return out


cdef _index_values(list deliver_ats, int64_t updated_at, list offsets, list positions,
                   list out, Py_ssize_t count, uint8_t* tmp):
    cdef Py_ssize_t k, w
    for k in range(count):
        tmp[0] = 0x97
        tmp[1] = 0x01
        memcpy(tmp + 2, b"\xa9DELIVERED", 10)
        w = 12
        w += _w_int(tmp + w, <int64_t>(<object>PyList_GET_ITEM(deliver_ats, k)))
        w += _w_int(tmp + w, updated_at)
        w += _w_int(tmp + w, <int64_t>(<object>PyList_GET_ITEM(offsets, k)))
        w += _w_int(tmp + w, <int64_t>(<object>PyList_GET_ITEM(positions, k)))
        tmp[w] = 0xC0
        out[k] = PyBytes_FromStringAndSize(<const char*>tmp, w + 1)


# --- send path: stored values, cancel handles ----------------------------------------------
cdef inline Py_ssize_t _w_opt_str(uint8_t* o, object s) except -1:
    cdef const char* u
    cdef Py_ssize_t n
    if s is None:
        o[0] = 0xC0
        return 1
    if type(s) is not str:
        raise TypeError("str expected")
    u = PyUnicode_AsUTF8AndSize(s, &n)
    return _w_str(o, u, n)


cdef Py_ssize_t _str_bound(object s) except -1:
    """Bytes that ``_w_opt_str`` may write for ``s``."""
    if s is None:
        return 1
    if type(s) is not str:
        raise TypeError("str expected")
    return 5 + 4 * len(<str>s)


def scheduled_values(list messages, int64_t at):
    """== scheduler.codec.scheduled_values for messages without properties; raises
    (TypeError, OverflowError, UnicodeEncodeError) for anything else, and that path then
    does the whole batch."""
    cdef Py_ssize_t count = PyList_GET_SIZE(messages), k, j, w, bound, nkeys
    cdef list out = [None] * count
    cdef int64_t deliver_at
    cdef uint8_t* o
    cdef tuple keys
    cdef bytes body
    cdef uint8_t index[80]
    for k in range(count):
        m = <object>PyList_GET_ITEM(messages, k)
        deliver_at = m.deliver_at
        if deliver_at <= at:
            continue
        if m.properties:
            raise TypeError("properties: the Python path encodes them")
        body = m.body
        keys = m.keys
        tags = m.tags
        nkeys = len(keys)
        bound = 64 + PyBytes_GET_SIZE(body) + _str_bound(tags)
        for j in range(nkeys):
            bound += _str_bound(keys[j])
        value = PyBytes_FromStringAndSize(NULL, bound)
        o = <uint8_t*>PyBytes_AS_STRING(value)
        o[0] = 0x98
        o[1] = 0x01
        w = 2 + _w_bin(o + 2, <const uint8_t*>PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body))
        w += _w_opt_str(o + w, tags)
        w += _w_head(o + w, nkeys, 0x90, 15, 0, 0xDC, 0xDD)
        for j in range(nkeys):
            w += _w_opt_str(o + w, keys[j])
        o[w] = 0x80
        w += 1
        w += _w_int(o + w, m.born_at)
        w += _w_int(o + w, deliver_at)
        w += _w_int(o + w, m.flags)
        index[0] = 0x97
        index[1] = 0x01
        memcpy(index + 2, b"\xa9SCHEDULED", 10)
        j = 12
        j += _w_int(index + j, deliver_at)
        j += _w_int(index + j, at)
        index[j] = 0xC0
        index[j + 1] = 0xC0
        j += 2
        tx_id = m.tx_id
        if tx_id is None:
            index[j] = 0xC0
            entry = PyBytes_FromStringAndSize(<const char*>index, j + 1)
        else:
            entry = PyBytes_FromStringAndSize(<const char*>index, j) + _str_value(tx_id)
        out[k] = (value[:w], entry)
    return out


cdef bytes _str_value(object s):
    cdef uint8_t tmp[8]
    cdef const char* u
    cdef Py_ssize_t n, h
    if type(s) is not str:
        raise TypeError("str expected")
    u = PyUnicode_AsUTF8AndSize(s, &n)
    h = _w_head(tmp, n, 0xA0, 31, 0xD9, 0xDA, 0xDB)
    return PyBytes_FromStringAndSize(<const char*>tmp, h) + PyBytes_FromStringAndSize(u, n)



def cancel_handles(list timer_keys):
    """== [scheduler.codec.cancel_handle(k) for k in timer_keys]: URL-safe base64 of the
    version byte 1 + the timer key, without padding."""
    cdef Py_ssize_t count = PyList_GET_SIZE(timer_keys), k, w
    cdef list out = [None] * count
    cdef char dst[808]
    for k in range(count):
        w = _handle(dst, <object>PyList_GET_ITEM(timer_keys, k))
        out[k] = PyUnicode_DecodeUTF8(dst, w, NULL)
    return out


def key_tails(list keys, Py_ssize_t skip):
    """== [k[skip:].decode("ascii") for k in keys]: a column batch's msgIds from its index
    keys (``ColumnBatch.ids``); ValueError for a key not longer than ``skip``,
    UnicodeDecodeError for one not ASCII past it."""
    cdef Py_ssize_t count = PyList_GET_SIZE(keys), k, n
    cdef list out = [None] * count
    for k in range(count):
        key = <object>PyList_GET_ITEM(keys, k)
        if not PyBytes_CheckExact(key):
            raise TypeError(f"a key must be bytes, not {type(key).__name__}")
        n = PyBytes_GET_SIZE(key)
        if n <= skip:
            raise ValueError(f"a key of {n} bytes has nothing past {skip}")
        out[k] = PyUnicode_DecodeASCII(PyBytes_AS_STRING(key) + skip, n - skip, NULL)
    return out


# --- send path: a column batch, straight from the decoded request ---------------------------
cdef const char* _HEX = b"0123456789ABCDEF"


cdef class _Columns:
    """The columns of a column batch as they are built (``batch_columns``, ``msgpack_columns``)."""
    cdef list msg_ids, deliver_ats, timer_keys, index_keys, values, entries, given
    cdef bytes prefix
    cdef int64_t now
    cdef char idbuf[28]
    cdef object counter

    def __cinit__(self, Py_ssize_t count, bytes prefix, int64_t now, str id_prefix,
                  object counter, bint keep_ids=True):
        """``keep_ids`` False: no msgId str is made (``columns`` gives None for them: each is
        in its index key, ``ColumnBatch.ids``), as a summary answer needs none."""
        cdef Py_ssize_t n
        cdef const char* idp = PyUnicode_AsUTF8AndSize(id_prefix, &n)
        if n != 20:
            raise ValueError("a msgId prefix is 20 characters")
        memcpy(self.idbuf, idp, 20)
        self.msg_ids = [None] * count if keep_ids else None
        self.deliver_ats = [None] * count
        self.timer_keys = [None] * count
        self.index_keys = [None] * count
        self.values = [None] * count
        self.entries = [None] * count
        self.given = []
        self.prefix = prefix
        self.now = now
        self.counter = counter

    cdef add(self, Py_ssize_t k, const char* body, Py_ssize_t n, int64_t at, object msg_id,
             const char* raw_id=NULL, Py_ssize_t raw_len=0):
        """Message ``k``: its body, deliverAt and msgId (None: ``raw_id``, its ``raw_len``
        bytes of a valid msgId, else a new one, generated)."""
        cdef Py_ssize_t plen = PyBytes_GET_SIZE(self.prefix), idlen, w
        cdef const char* idp
        cdef uint64_t c
        cdef uint8_t* o
        cdef uint8_t entry[48]
        cdef int j
        cdef int64_t now = self.now
        cdef PyObject* raw
        if msg_id is None and raw_id != NULL:
            idp = raw_id
            idlen = raw_len
            if self.msg_ids is not None:
                msg_id = PyUnicode_DecodeUTF8(raw_id, raw_len, NULL)
        elif msg_id is None:
            c = <uint64_t>(next(self.counter)) & 0xFFFFFFFF
            for j in range(8):
                self.idbuf[27 - j] = _HEX[(c >> (4 * j)) & 15]
            if self.msg_ids is not None:
                msg_id = PyUnicode_DecodeUTF8(self.idbuf, 28, NULL)
            idp = self.idbuf
            idlen = 28
        else:
            idp = PyUnicode_AsUTF8AndSize(msg_id, &idlen)
        idkey = PyBytes_FromStringAndSize(NULL, plen + idlen)
        o = <uint8_t*>PyBytes_AS_STRING(idkey)
        memcpy(o, PyBytes_AS_STRING(self.prefix), plen)
        memcpy(o + plen, idp, idlen)
        if idp != self.idbuf:
            self.given.append(idkey)
        tkey = PyBytes_FromStringAndSize(NULL, 8 + plen + idlen)
        o = <uint8_t*>PyBytes_AS_STRING(tkey)
        for j in range(8):
            o[j] = (<uint64_t>at >> (56 - 8 * j)) & 0xFF
        memcpy(o + 8, PyBytes_AS_STRING(idkey), plen + idlen)
        value = PyBytes_FromStringAndSize(NULL, n + 48)
        o = <uint8_t*>PyBytes_AS_STRING(value)
        o[0] = 0x98
        o[1] = 0x01
        w = 2 + _w_bin(o + 2, <const uint8_t*>body, n)
        o[w] = 0xC0  # tags
        o[w + 1] = 0x90  # keys
        o[w + 2] = 0x80  # properties
        w += 3
        w += _w_int(o + w, now)  # bornAt
        w += _w_int(o + w, at)
        o[w] = 0x00  # flags
        entry[0] = 0x97
        entry[1] = 0x01
        memcpy(entry + 2, b"\xa9SCHEDULED", 10)
        j = 12
        j += _w_int(entry + j, at)
        j += _w_int(entry + j, now)
        entry[j] = 0xC0
        entry[j + 1] = 0xC0
        entry[j + 2] = 0xC0
        if self.msg_ids is not None:
            self.msg_ids[k] = msg_id
        self.deliver_ats[k] = at
        self.timer_keys[k] = tkey
        self.index_keys[k] = idkey
        # value[:w + 1] without a second allocation and copy: cut in place (realloc),
        # which needs ``raw`` to hold the only reference
        raw = <PyObject*>value
        Py_INCREF(value)
        value = None
        _PyBytes_Resize(&raw, w + 1)  # on failure it drops raw itself and raises
        self.values[k] = <object>raw
        Py_XDECREF(raw)
        self.entries[k] = PyBytes_FromStringAndSize(<const char*>entry, j + 3)

    cdef tuple columns(self):
        return (self.msg_ids, self.deliver_ats, self.timer_keys, self.index_keys, self.values,
                self.entries, self.given)


cdef int64_t _due_later(object given_at, object given_delay, object absent, int64_t now,
                        int64_t max_delay) except? -2:
    """The deliverAt of a body-only message from its deliverAt or its delayMs (``absent``: the
    value of the one not given): after ``now`` and at most ``max_delay`` ahead. -1 when it
    is not body-only: both or neither given (neither: due now, which the general path delivers
    at once), not an int, out of range, or due by now. OverflowError past int64."""
    cdef int64_t at, delay
    if given_at is not absent:
        if given_delay is not absent or type(given_at) is not int:
            return -1
        at = given_at
        if at < 0 or at > now + max_delay:
            return -1
    elif given_delay is not absent:
        if type(given_delay) is not int:
            return -1
        delay = given_delay
        if delay < 0 or delay > max_delay:
            return -1
        at = now + delay
    else:
        return -1
    return at if at > now else -1


def batch_columns(list messages, bytes prefix, int64_t now, int64_t max_delay,
                Py_ssize_t max_body, object unset, str id_prefix, object counter):
    """The columns a send batch stores, built from the decoded request (api.schemas.MessageIn:
    ``unset`` for an absent field) when every message in it is *body-only*: a body (text or
    base64) of at most ``max_body`` bytes; no tags, keys, properties nor delay level; due
    after ``now`` by ``deliverAt`` (at most ``max_delay`` ahead) or ``delayMs`` (at most
    ``max_delay``); a msgId or none. None for any other batch: the general path
    (scheduler.intake.Intake.prepare) takes it and says what is wrong, if anything.

    ``prefix``: the topic's index-key part (topic NUL); ``id_prefix`` and ``counter``: the
    engine's msgId generator (scheduler.intake.MessageIdGenerator) for messages without one.
    Returns (msg_ids, deliver_ats, timer_keys, index_keys, values, entries, given): the
    stored value (== scheduler.codec.message_value) and the SCHEDULED index entry at ``now``
    (== scheduler.codec.index_value) of each message, born at ``now``; ``given``: the index
    keys of the msgIds the client chose (the ones to look up for idempotency)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(messages), k, n
    cdef const char* u
    cdef int64_t at
    cdef _Columns out = _Columns(count, prefix, now, id_prefix, counter)
    try:
        for k in range(count):
            m = <object>PyList_GET_ITEM(messages, k)
            if (m.tags is not unset or m.delay_level is not unset
                    or (m.keys is not unset and len(m.keys))
                    or (m.properties is not unset and len(m.properties))):
                return None
            text = m.body
            raw = m.body_base64
            if text is not unset:
                if raw is not unset or type(text) is not str:
                    return None
                u = PyUnicode_AsUTF8AndSize(text, &n)
            elif type(raw) is bytes:
                u = PyBytes_AS_STRING(raw)
                n = PyBytes_GET_SIZE(raw)
            else:
                return None
            if n > max_body:
                return None
            at = _due_later(m.deliver_at, m.delay_ms, unset, now, max_delay)
            if at < 0:
                return None
            msg_id = m.msg_id
            if msg_id is unset:
                msg_id = None
            elif type(msg_id) is not str:
                return None
            out.add(k, u, n, at, msg_id)
    except (OverflowError, UnicodeEncodeError):  # past int64, a lone surrogate: not body-only
        return None
    return out.columns()


def request_columns(list requests, dict known, int64_t now, int64_t max_delay,
                   Py_ssize_t max_body, str id_prefix, object counter):
    """``batch_columns`` for the engine's own requests (scheduler.model.SendRequest: bytes
    body; None, () or {} for an absent field): the in-process ``Broker.send_batch``. Their
    topics may differ, each one sent to before (``known``: topic -> (key prefix, shard), as
    scheduler.intake.Intake caches them). A msgId must match storage.constants.MSG_ID_REGEX
    here (the API's decoder has not checked it); None for anything else, as there. Returns
    the columns and, when the batch holds more than one topic, each message's topic and
    shard (else None, None)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(requests), k, n
    cdef const char* u
    cdef int64_t at
    cdef _Columns out
    cdef list topics = None, shards = None
    if count == 0:
        return None
    first = (<object>PyList_GET_ITEM(requests, 0)).topic
    if type(first) is not str:
        return None
    entry = known.get(first)
    if entry is None:
        return None
    out = _Columns(count, entry[0], now, id_prefix, counter)
    shard = entry[1]
    current = first
    try:
        for k in range(count):
            m = <object>PyList_GET_ITEM(requests, k)
            if (m.tags is not None or m.delay_level is not None or len(m.keys)
                    or len(m.properties)):
                return None
            t = m.topic
            if t is not current and t != current:
                entry = known.get(t)
                if entry is None:
                    return None
                if topics is None:
                    topics = [first] * k
                    shards = [shard] * k
                out.prefix = entry[0]
                shard = entry[1]
                current = t
            if topics is not None:
                topics.append(current)
                shards.append(shard)
            body = m.body
            if type(body) is not bytes:
                return None
            n = PyBytes_GET_SIZE(body)
            if n > max_body:
                return None
            at = _due_later(m.deliver_at, m.delay_ms, None, now, max_delay)
            if at < 0:
                return None
            msg_id = m.msg_id
            if msg_id is not None:
                if type(msg_id) is not str:
                    return None
                u = PyUnicode_AsUTF8AndSize(msg_id, &n)
                if not _msg_id_ok(<const uint8_t*>u, n):
                    return None
            out.add(k, PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body), at, msg_id)
    except (OverflowError, UnicodeEncodeError, TypeError):  # (TypeError: a topic not a str)
        return None
    return out.columns(), topics, shards


cdef bint _msg_id_ok(const uint8_t* s, Py_ssize_t n) noexcept:
    """storage.constants.MSG_ID_REGEX: 1-128 of [A-Za-z0-9_.:-]."""
    cdef Py_ssize_t i
    cdef uint8_t c
    if n < 1 or n > 128:
        return False
    for i in range(n):
        c = s[i]
        if not ((48 <= c <= 58) or (65 <= c <= 90) or (97 <= c <= 122) or c == 95 or c == 46
                or c == 45):
            return False
    return True


def msg_id_ok(str msg_id):
    """``_msg_id_ok`` on ``msg_id``'s UTF-8 (tests hold it equal to
    storage.constants.MSG_ID_PATTERN)."""
    cdef Py_ssize_t n
    cdef const char* u = PyUnicode_AsUTF8AndSize(msg_id, &n)
    return _msg_id_ok(<const uint8_t*>u, n)


def due_later(given_at, given_delay, absent, int64_t now, int64_t max_delay):
    """``_due_later`` (tests hold it equal to scheduler.intake's timing rules)."""
    return _due_later(given_at, given_delay, absent, now, max_delay)


cdef enum:
    F_BODY = 1
    F_B64 = 2
    F_ID = 4
    F_AT = 8
    F_DELAY = 16


def msgpack_columns(bytes raw, Py_ssize_t max_count, bytes prefix, int64_t now,
                  int64_t max_delay, Py_ssize_t max_body, str id_prefix, object counter):
    """``batch_columns`` straight from a msgpack request body (``{"messages": [...]}``, at
    most ``max_count`` of them), without decoding it into MessageIn first. Takes only what
    is body-only and written as msgpack writes it (canonical headers; per message the keys
    ``body`` (str) or ``bodyBase64`` (bin), ``msgId`` (a valid one), ``deliverAt`` or
    ``delayMs`` (ints >= 0), each once); None for anything else, which the schema's decoder
    then reads and checks. Its msgIds column is None: each msgId is in its index key
    (``ColumnBatch.ids``), and no str is made for a summary answer."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(raw)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(raw), i, k, count, fields, f, j
    cdef Item it, key, body, msg_id, num
    cdef int seen, flag
    cdef int64_t at
    cdef _Columns out
    if n < 10 or p[0] != 0x81 or memcmp(p + 1, b"\xa8messages", 9) != 0:
        return None
    i = _head(p, n, 10, &it)
    if i < 0 or it.kind != K_ARRAY or it.size < 1 or it.size > max_count:
        return None
    count = it.size
    out = _Columns(count, prefix, now, id_prefix, counter, False)  # (msgIds: index keys)
    for k in range(count):
        i = _head(p, n, i, &it)
        if i < 0 or it.kind != K_MAP:
            return None
        fields = it.size
        seen = 0
        for f in range(fields):
            j = _str(p, n, i, &key)
            if j < 0:
                return None
            i = j
            flag = 0
            if key.size == 4 and memcmp(p + key.data, b"body", 4) == 0:
                flag = F_BODY
                i = _str(p, n, i, &body)
            elif key.size == 10 and memcmp(p + key.data, b"bodyBase64", 10) == 0:
                flag = F_B64
                i = _head(p, n, i, &body)
                if i >= 0 and (body.kind != K_BIN or i + body.size > n):
                    i = -1
                elif i >= 0:
                    body.data = i
                    i += body.size
            elif key.size == 5 and memcmp(p + key.data, b"msgId", 5) == 0:
                flag = F_ID
                i = _str(p, n, i, &msg_id)
                if i >= 0 and not _msg_id_ok(p + msg_id.data, msg_id.size):
                    i = -1
            elif key.size == 9 and memcmp(p + key.data, b"deliverAt", 9) == 0:
                flag = F_AT
                i = _int(p, n, i, &num)
            elif key.size == 7 and memcmp(p + key.data, b"delayMs", 7) == 0:
                flag = F_DELAY
                i = _int(p, n, i, &num)
            if flag == 0 or i < 0 or seen & flag:
                return None
            seen |= flag
        if (seen & (F_BODY | F_B64)) not in (F_BODY, F_B64):
            return None
        if (seen & (F_AT | F_DELAY)) not in (F_AT, F_DELAY) or num.value < 0:
            return None
        if body.size > max_body:
            return None
        if seen & F_AT:
            at = num.value
            if at > now + max_delay:
                return None
        else:
            if num.value > max_delay:
                return None
            at = now + num.value
        if at <= now:
            return None
        if seen & F_ID:
            out.add(k, <const char*>p + body.data, body.size, at, None,
                    <const char*>p + msg_id.data, msg_id.size)
        else:
            out.add(k, <const char*>p + body.data, body.size, at, None)
    if i != n:
        return None
    return out.columns()


# --- the same from a JSON request body ------------------------------------------------------
cdef struct _JMsg:
    Py_ssize_t body, body_size, msg_id, msg_id_size
    int64_t at


cdef inline Py_ssize_t _jws(const uint8_t* p, Py_ssize_t n, Py_ssize_t i) noexcept:
    """Past JSON's whitespace at ``i``."""
    while i < n and (p[i] == 32 or p[i] == 10 or p[i] == 13 or p[i] == 9):
        i += 1
    return i


cdef inline Py_ssize_t _jstr(const uint8_t* p, Py_ssize_t n, Py_ssize_t i, Py_ssize_t* start,
                             Py_ssize_t* size) noexcept:
    """A JSON string at ``i`` without escapes or control characters (its content is then
    its bytes): the index past it, else -1 (the schema's decoder reads the rest)."""
    cdef Py_ssize_t j
    if i >= n or p[i] != 34:
        return -1
    j = i + 1
    while j < n and p[j] != 34:
        if p[j] == 92 or p[j] < 32:
            return -1
        j += 1
    if j >= n:
        return -1
    start[0] = i + 1
    size[0] = j - i - 1
    return j + 1


cdef inline Py_ssize_t _jint(const uint8_t* p, Py_ssize_t n, Py_ssize_t i,
                             int64_t* value) noexcept:
    """A JSON integer >= 0 of at most 18 digits at ``i`` (no fraction, no exponent): the
    index past it, else -1."""
    cdef Py_ssize_t j = i
    cdef int64_t v = 0
    while j < n and 48 <= p[j] <= 57 and j - i < 19:
        v = v * 10 + (p[j] - 48)
        j += 1
    if j == i or j - i > 18 or (p[i] == 48 and j - i > 1):
        return -1
    if j < n and (p[j] == 46 or p[j] == 101 or p[j] == 69 or 48 <= p[j] <= 57):
        return -1
    value[0] = v
    return j


def json_columns(bytes raw, Py_ssize_t max_count, bytes prefix, int64_t now, int64_t max_delay,
                 Py_ssize_t max_body, str id_prefix, object counter):
    """``msgpack_columns`` from a JSON request body (``{"messages": [...]}``, at most
    ``max_count`` of them, at most 1000), without decoding it into MessageIn first. Takes
    only body-only messages written without escapes: per message the keys ``body`` (valid UTF-8, no
    escape), ``msgId`` (a valid one), ``deliverAt`` or ``delayMs`` (integers >= 0 in
    digits), each once, no key but ``messages`` around them; None for anything else
    (``bodyBase64``, an escaped string, ``null``, a number written otherwise...), which the
    schema's decoder then reads and checks."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(raw)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(raw), i, k, count = 0, ks, kn, vs, vn
    cdef int seen, flag
    cdef int64_t num = 0, at
    cdef _JMsg msgs[1000]
    cdef _JMsg* m
    cdef _Columns out
    if max_count > 1000:
        max_count = 1000
    i = _jws(p, n, 0)
    if i >= n or p[i] != 123:
        return None
    i = _jstr(p, n, _jws(p, n, i + 1), &ks, &kn)
    if i < 0 or kn != 8 or memcmp(p + ks, b"messages", 8) != 0:
        return None
    i = _jws(p, n, i)
    if i >= n or p[i] != 58:
        return None
    i = _jws(p, n, i + 1)
    if i >= n or p[i] != 91:
        return None
    i = _jws(p, n, i + 1)
    while True:  # a message, then "," or "]"
        if count >= max_count or i >= n or p[i] != 123:
            return None
        m = &msgs[count]
        count += 1
        seen = 0
        i = _jws(p, n, i + 1)
        while True:  # a key, its value, then "," or "}"
            i = _jstr(p, n, i, &ks, &kn)
            if i < 0:
                return None
            i = _jws(p, n, i)
            if i >= n or p[i] != 58:
                return None
            i = _jws(p, n, i + 1)
            flag = 0
            if kn == 4 and memcmp(p + ks, b"body", 4) == 0:
                flag = F_BODY
                i = _jstr(p, n, i, &m.body, &m.body_size)
                if i >= 0 and not _utf8(p + m.body, m.body_size):
                    i = -1
            elif kn == 5 and memcmp(p + ks, b"msgId", 5) == 0:
                flag = F_ID
                i = _jstr(p, n, i, &vs, &vn)
                if i >= 0 and not _msg_id_ok(p + vs, vn):
                    i = -1
                m.msg_id, m.msg_id_size = vs, vn
            elif kn == 9 and memcmp(p + ks, b"deliverAt", 9) == 0:
                flag = F_AT
                i = _jint(p, n, i, &num)
            elif kn == 7 and memcmp(p + ks, b"delayMs", 7) == 0:
                flag = F_DELAY
                i = _jint(p, n, i, &num)
            if flag == 0 or i < 0 or seen & flag:
                return None
            seen |= flag
            i = _jws(p, n, i)
            if i < n and p[i] == 44:
                i = _jws(p, n, i + 1)
                continue
            if i < n and p[i] == 125:
                break
            return None
        if not seen & F_BODY or (seen & (F_AT | F_DELAY)) not in (F_AT, F_DELAY):
            return None
        if m.body_size > max_body:
            return None
        if seen & F_AT:
            at = num
            if at > now + max_delay:
                return None
        else:
            if num > max_delay:
                return None
            at = now + num
        if at <= now:
            return None
        m.at = at
        if not seen & F_ID:
            m.msg_id = -1
        i = _jws(p, n, i + 1)
        if i < n and p[i] == 44:
            i = _jws(p, n, i + 1)
            continue
        if i < n and p[i] == 93:
            break
        return None
    i = _jws(p, n, i + 1)
    if i >= n or p[i] != 125 or _jws(p, n, i + 1) != n:
        return None
    out = _Columns(count, prefix, now, id_prefix, counter, False)  # (msgIds: index keys)
    for k in range(count):
        m = &msgs[k]
        if m.msg_id >= 0:
            out.add(k, <const char*>p + m.body, m.body_size, m.at, None,
                    <const char*>p + m.msg_id, m.msg_id_size)
        else:
            out.add(k, <const char*>p + m.body, m.body_size, m.at, None)
    return out.columns()


# --- consumer groups: the receipts' tags (scheduler/group_state.py Seal) ------------------
# BLAKE2s (RFC 7693) keyed, 8 bytes of digest, written from the RFC: what
# ``hashlib.blake2s(data, key=key, digest_size=8).hexdigest()`` gives.
cdef const char* _hex = b"0123456789abcdef"  # (hexdigest's and format's digits)
cdef uint32_t _B2S_IV[8]
_B2S_IV[:] = [0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C,
              0x1F83D9AB, 0x5BE0CD19]
cdef uint8_t _B2S_SIGMA[10][16]
_B2S_SIGMA[0][:] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
_B2S_SIGMA[1][:] = [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3]
_B2S_SIGMA[2][:] = [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4]
_B2S_SIGMA[3][:] = [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8]
_B2S_SIGMA[4][:] = [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13]
_B2S_SIGMA[5][:] = [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9]
_B2S_SIGMA[6][:] = [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11]
_B2S_SIGMA[7][:] = [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10]
_B2S_SIGMA[8][:] = [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5]
_B2S_SIGMA[9][:] = [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0]


cdef inline uint32_t _rotr(uint32_t x, int n) noexcept nogil:
    return (x >> n) | (x << (32 - n))


cdef void _b2s_compress(uint32_t* h, const uint8_t* block, uint64_t t, bint last) noexcept nogil:
    """RFC 7693 3.2, F: ``h`` takes the 64-byte ``block``; ``t`` bytes so far."""
    cdef uint32_t v[16]
    cdef uint32_t m[16]
    cdef int i, r
    cdef const uint8_t* s
    for i in range(16):
        m[i] = (<uint32_t>block[4 * i] | (<uint32_t>block[4 * i + 1] << 8)
                | (<uint32_t>block[4 * i + 2] << 16) | (<uint32_t>block[4 * i + 3] << 24))
    for i in range(8):
        v[i] = h[i]
        v[i + 8] = _B2S_IV[i]
    v[12] ^= <uint32_t>t
    v[13] ^= <uint32_t>(t >> 32)
    if last:
        v[14] = ~v[14]
    for r in range(10):
        s = _B2S_SIGMA[r]
        _b2s_g(v, 0, 4, 8, 12, m[s[0]], m[s[1]])
        _b2s_g(v, 1, 5, 9, 13, m[s[2]], m[s[3]])
        _b2s_g(v, 2, 6, 10, 14, m[s[4]], m[s[5]])
        _b2s_g(v, 3, 7, 11, 15, m[s[6]], m[s[7]])
        _b2s_g(v, 0, 5, 10, 15, m[s[8]], m[s[9]])
        _b2s_g(v, 1, 6, 11, 12, m[s[10]], m[s[11]])
        _b2s_g(v, 2, 7, 8, 13, m[s[12]], m[s[13]])
        _b2s_g(v, 3, 4, 9, 14, m[s[14]], m[s[15]])
    for i in range(8):
        h[i] ^= v[i] ^ v[i + 8]


cdef inline void _b2s_g(uint32_t* v, int a, int b, int c, int d, uint32_t x,
                        uint32_t y) noexcept nogil:
    v[a] = v[a] + v[b] + x
    v[d] = _rotr(v[d] ^ v[a], 16)
    v[c] = v[c] + v[d]
    v[b] = _rotr(v[b] ^ v[c], 12)
    v[a] = v[a] + v[b] + y
    v[d] = _rotr(v[d] ^ v[a], 8)
    v[c] = v[c] + v[d]
    v[b] = _rotr(v[b] ^ v[c], 7)


cdef void _b2s_keyed(uint32_t* h, const uint8_t* key, Py_ssize_t key_size,
                     uint32_t digest_size=8) noexcept nogil:
    """The state after the key's block (``key_size`` 1..32), digest of ``digest_size``
    bytes (8: a version 3 tag; 32: the four tags of a version 4 quad)."""
    cdef uint8_t block[64]
    cdef int i
    for i in range(8):
        h[i] = _B2S_IV[i]
    h[0] ^= 0x01010000 ^ (<uint32_t>key_size << 8) ^ digest_size
    memset(block, 0, 64)
    memcpy(block, key, key_size)
    _b2s_compress(h, block, 64, False)


cdef void _b2s_final(const uint32_t* keyed, const uint8_t* data, Py_ssize_t n,
                     uint32_t* h) noexcept nogil:
    """The keyed digest (state ``keyed``) of ``data[:n]``, n >= 1, as its state ``h``."""
    cdef uint8_t block[64]
    cdef uint64_t t = 64
    memcpy(h, keyed, 32)
    while n > 64:
        t += 64
        _b2s_compress(h, data, t, False)
        data += 64
        n -= 64
    memset(block, 0, 64)
    memcpy(block, data, n)
    _b2s_compress(h, block, t + n, True)


cdef inline void _b2s_hex8(const uint32_t* h, int first, char* out) noexcept nogil:
    """The 16 hex digits of the digest's bytes ``first`` .. ``first + 7``."""
    cdef int i, b
    for i in range(8):
        b = first + i
        out[2 * i] = _hex[(h[b >> 2] >> (8 * (b & 3) + 4)) & 15]
        out[2 * i + 1] = _hex[(h[b >> 2] >> (8 * (b & 3))) & 15]


cdef void _b2s_tag(const uint32_t* keyed, const uint8_t* data, Py_ssize_t n,
                   char* out) noexcept nogil:
    """The 16 hex digits of the keyed digest (state ``keyed``) of ``data[:n]``, n >= 1."""
    cdef uint32_t h[8]
    _b2s_final(keyed, data, n, h)
    _b2s_hex8(h, 0, out)


cdef inline int _w_hex(uint64_t v, char* hexed) noexcept nogil:
    """``v`` in hex as format writes it, at the end of ``hexed`` (16 bytes); its first
    digit's index."""
    cdef int d = 16
    while True:
        d -= 1
        hexed[d] = _hex[v & 15]
        v >>= 4
        if v == 0:
            return d


from hashlib import blake2s as _blake2s


cdef int _key_state(bytes key, uint32_t* keyed, uint32_t digest_size) except -1:
    """``keyed``: the BLAKE2s state after ``key``'s block (1-32 bytes; ValueError else)."""
    if not 1 <= PyBytes_GET_SIZE(key) <= 32:
        raise ValueError("a key of 1 to 32 bytes")
    _b2s_keyed(keyed, <const uint8_t*>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key),
               digest_size)
    return 0


cdef bytes _receipt_buffer(const char* head, Py_ssize_t hn):
    """A receipt's room: ``head``, ".", 16 bytes for the tag, ".", 16 for the offset."""
    buf = PyBytes_FromStringAndSize(NULL, hn + 34)
    cdef char* o = PyBytes_AS_STRING(buf)
    memcpy(o, head, hn)
    o[hn] = 46
    o[hn + 17] = 46
    return buf


def seal_receipts(bytes key, str head, list offsets):
    """``Seal.receipts`` (scheduler/group_state.py): ``head.tag.offset`` for each offset
    (an int >= 0, written in hex), the tag keyed by ``key`` (1-32 bytes)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(offsets), k, hn, n
    cdef uint32_t keyed[8]
    cdef const char* hp = PyUnicode_AsUTF8AndSize(head, &hn)
    cdef uint64_t v
    cdef char hexed[16]
    cdef char* o
    cdef int d
    cdef list out = [None] * count
    _key_state(key, keyed, 8)
    buf = _receipt_buffer(hp, hn)
    o = PyBytes_AS_STRING(buf)
    for k in range(count):
        v = <object>PyList_GET_ITEM(offsets, k)  # (OverflowError below 0 or past 64 bits)
        d = _w_hex(v, hexed)
        n = 16 - d
        _b2s_tag(keyed, <const uint8_t*>hexed + d, n, o + hn + 1)
        memcpy(o + hn + 18, hexed + d, n)
        out[k] = PyUnicode_DecodeASCII(o, hn + 18 + n, NULL)
    return out


def seal_tags(bytes key, list hexes):
    """``Seal.tags``: the tag of each offset as written (a str, UTF-8 encoded)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(hexes), k, n
    cdef uint32_t keyed[8]
    cdef const char* s
    cdef char tag[16]
    cdef list out = [None] * count
    _key_state(key, keyed, 8)
    for k in range(count):
        s = PyUnicode_AsUTF8AndSize(<str>PyList_GET_ITEM(hexes, k), &n)
        if n == 0:  # (the key's block is the last: never a receipt's, which parse first)
            out[k] = _blake2s(key=key, digest_size=8).hexdigest()
            continue
        _b2s_tag(keyed, <const uint8_t*>s, n, tag)
        out[k] = PyUnicode_DecodeASCII(tag, 16, NULL)
    return out


# Version 4 tags (scheduler/group_state.py Seal): the offsets 4q .. 4q + 3 share ONE keyed
# BLAKE2s-256 of q in hex; offset o's tag is bytes 8 (o & 3) .. 8 (o & 3) + 7 of it. A
# receive of 1000 offsets compresses 250 blocks, not 1000.
def seal_receipts4(bytes key, str head, list offsets):
    """``Seal.receipts`` of a version 4 head: ``head.tag.offset`` for each offset (an int
    >= 0, written in hex), its tag a quarter of the keyed (``key``: 1-32 bytes) BLAKE2s-256
    of offset >> 2 in hex."""
    cdef Py_ssize_t count = PyList_GET_SIZE(offsets), k, hn, n
    cdef uint32_t keyed[8]
    cdef uint32_t h[8]
    cdef const char* hp = PyUnicode_AsUTF8AndSize(head, &hn)
    cdef uint64_t v, q = 0
    cdef bint have = False
    cdef char hexed[16]
    cdef char qhex[16]
    cdef char* o
    cdef int d, qd
    cdef list out = [None] * count
    _key_state(key, keyed, 32)
    buf = _receipt_buffer(hp, hn)
    o = PyBytes_AS_STRING(buf)
    for k in range(count):
        v = <object>PyList_GET_ITEM(offsets, k)  # (OverflowError below 0 or past 64 bits)
        if not have or v >> 2 != q:
            q = v >> 2
            qd = _w_hex(q, qhex)
            _b2s_final(keyed, <const uint8_t*>qhex + qd, 16 - qd, h)
            have = True
        _b2s_hex8(h, 8 * <int>(v & 3), o + hn + 1)
        d = _w_hex(v, hexed)
        n = 16 - d
        memcpy(o + hn + 18, hexed + d, n)
        out[k] = PyUnicode_DecodeASCII(o, hn + 18 + n, NULL)
    return out


def seal_tags4(bytes key, list hexes):
    """``Seal.tags`` of a version 4 head: the tag of each offset written in hex (a str of
    1-16 hex digits, as a parsed receipt holds; ValueError otherwise)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(hexes), k, n, i
    cdef uint32_t keyed[8]
    cdef uint32_t h[8]
    cdef const char* s
    cdef char tag[16]
    cdef char qhex[16]
    cdef uint64_t v, q = 0
    cdef bint have = False
    cdef int qd
    cdef char c
    cdef list out = [None] * count
    _key_state(key, keyed, 32)
    for k in range(count):
        s = PyUnicode_AsUTF8AndSize(<str>PyList_GET_ITEM(hexes, k), &n)
        if not 1 <= n <= 16:
            raise ValueError("an offset of 1 to 16 hex digits")
        v = 0
        for i in range(n):
            c = s[i]
            if 48 <= c <= 57:
                v = (v << 4) | <uint64_t>(c - 48)
            elif 97 <= c <= 102:
                v = (v << 4) | <uint64_t>(c - 87)
            else:
                raise ValueError("an offset of 1 to 16 hex digits")
        if not have or v >> 2 != q:
            q = v >> 2
            qd = _w_hex(q, qhex)
            _b2s_final(keyed, <const uint8_t*>qhex + qd, 16 - qd, h)
            have = True
        _b2s_hex8(h, 8 * <int>(v & 3), tag)
        out[k] = PyUnicode_DecodeASCII(tag, 16, NULL)
    return out


# --- the due timeline: counts per second ---------------------------------------------------
cdef inline int64_t _floor_div(int64_t v, int64_t d) noexcept:
    return v // d if v >= 0 else -((-v + d - 1) // d)


cdef dict _tally(int64_t* units, uint32_t* weights, Py_ssize_t count):
    """{unit: total weight} of ``count`` units (``weights`` NULL: 1 each), in ascending
    unit order when they are counted in an array over their span: where it is narrow (a
    fold's thousands of messages over an hour: a slot a second); else in runs of equal
    units, a dict step per run."""
    cdef dict out = {}
    cdef Py_ssize_t k
    cdef int64_t lo, hi, unit, run_unit = 0
    cdef uint64_t span, w, run = 0
    cdef uint64_t* slots
    if count == 0:
        return out
    lo = hi = units[0]
    for k in range(1, count):
        if units[k] < lo:
            lo = units[k]
        elif units[k] > hi:
            hi = units[k]
    span = <uint64_t>hi - <uint64_t>lo + 1  # (0 only for the whole int64 range: wrapped)
    if span != 0 and span <= <uint64_t>(2 * count + 1024):
        slots = <uint64_t*>PyMem_Calloc(<size_t>span, sizeof(uint64_t))
        if slots == NULL:
            raise MemoryError()
        try:
            for k in range(count):
                slots[<uint64_t>units[k] - <uint64_t>lo] += 1 if weights == NULL else weights[k]
            for w in range(span):
                if slots[w]:
                    out[<int64_t>(<uint64_t>lo + w)] = slots[w]
        finally:
            PyMem_Free(slots)
        return out
    for k in range(count):
        unit = units[k]
        if run and unit == run_unit:
            run += 1 if weights == NULL else weights[k]
            continue
        if run:
            out[run_unit] = out.get(run_unit, 0) + run
        run_unit = unit
        run = 1 if weights == NULL else weights[k]
    if run:
        out[run_unit] = out.get(run_unit, 0) + run
    return out


def per_second(list deliver_ats, int64_t resolution):
    """== scheduler.timeline._per_second (as a dict): how many values fall in each
    ``resolution`` (floor division); OverflowError past int64 (that path then counts).
    A dict step per distinct second where they are few (``_tally``), not per value: a
    fold of 65 536 sends due at random over an hour ~0.4 ms instead of ~5."""
    cdef Py_ssize_t count = PyList_GET_SIZE(deliver_ats), k
    cdef int64_t* units = <int64_t*>PyMem_Malloc((count + 1) * sizeof(int64_t))
    if units == NULL:
        raise MemoryError()
    try:
        for k in range(count):
            units[k] = _floor_div(<object>PyList_GET_ITEM(deliver_ats, k), resolution)
        return _tally(units, NULL, count)
    finally:
        PyMem_Free(units)


def per_unit(dict counts, int64_t ratio):
    """== scheduler.timeline._coarser's level of ``ratio`` (as a dict): the ``counts`` per
    second summed per ``ratio`` seconds (floor division); OverflowError past int64 or for a
    count past 32 bits (the Python path then sums)."""
    cdef Py_ssize_t count = len(counts), k = 0
    cdef int64_t* units = <int64_t*>PyMem_Malloc((count + 1) * sizeof(int64_t))
    cdef uint32_t* weights = <uint32_t*>PyMem_Malloc((count + 1) * sizeof(uint32_t))
    cdef int64_t n
    try:
        if units == NULL or weights == NULL:
            raise MemoryError()
        for second, value in counts.items():
            n = value
            if n < 0 or n > 0xFFFFFFFF:
                raise OverflowError("a count past 32 bits")
            units[k] = _floor_div(second, ratio)
            weights[k] = <uint32_t>n
            k += 1
        return _tally(units, weights, k)
    finally:
        PyMem_Free(units)
        PyMem_Free(weights)
