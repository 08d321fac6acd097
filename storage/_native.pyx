# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Compiled twins of the per-message loops of the delivery and pull paths.

Built from source by pip (setup.py) when a C compiler is there; storage/native.py picks
these or the pure-Python functions, and tests/storage/test_native.py checks that both give
the same bytes. Each function here reads msgpack written by msgspec (storage/records.py) and
writes what msgspec would write. It never guesses: whatever it does not recognise exactly
(a field of another type, a header in a form msgspec does not write, a string that is not
valid UTF-8, trailing fields, properties to filter) it leaves to the Python path (``None``
for that item), which then decodes it with every check and raises where it must.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

# --- CRC32C (Castagnoli), slicing by 8: the crc32c package's value, same seed convention --
cdef uint32_t _T[8][256]


cdef void _init_table() noexcept:
    cdef uint32_t c, i, k
    for i in range(256):
        c = i
        for k in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        _T[0][i] = c
    for i in range(256):
        c = _T[0][i]
        for k in range(1, 8):
            c = _T[0][c & 0xFF] ^ (c >> 8)
            _T[k][i] = c


_init_table()


# SSE4.2's crc32 instruction computes the same CRC (the same reflected polynomial) 8 bytes
# at a time: ~6x the tables' speed on a record of 200 bytes, which every append frames and
# every read checks. Used when the CPU has it (asked once, at import), else the tables.
cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
    __attribute__((target("sse4.2")))
    static uint32_t hg_crc32c_hw(uint32_t c, const uint8_t* p, Py_ssize_t n) {
        uint64_t c64 = c, v;
        while (n >= 8) {
            memcpy(&v, p, 8);
            c64 = __builtin_ia32_crc32di(c64, v);
            p += 8;
            n -= 8;
        }
        c = (uint32_t)c64;
        while (n > 0) {
            c = __builtin_ia32_crc32qi(c, *p);
            p++;
            n--;
        }
        return c;
    }
    static int hg_crc32c_hw_supported(void) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("sse4.2");
    }
    #else
    static uint32_t hg_crc32c_hw(uint32_t c, const uint8_t* p, Py_ssize_t n) { return c; }
    static int hg_crc32c_hw_supported(void) { return 0; }
    #endif
    """
    uint32_t hg_crc32c_hw(uint32_t c, const uint8_t* p, Py_ssize_t n) nogil
    int hg_crc32c_hw_supported() nogil

cdef bint _hw = hg_crc32c_hw_supported()


def crc32c_hardware(enable=None):
    """Whether CRC32C is computed by the CPU's crc32 instruction (SSE4.2). ``enable``
    False makes it use the tables from now on (tests check both give the same values);
    True uses the instruction again, where the CPU has it. Returns the state after."""
    global _hw
    if enable is not None:
        _hw = bool(enable) and hg_crc32c_hw_supported()
    return bool(_hw)


cdef inline uint32_t _crc32c(uint32_t value, const uint8_t* p, Py_ssize_t n) noexcept nogil:
    cdef uint32_t c = ~value
    cdef uint32_t lo, hi
    if _hw:
        return ~hg_crc32c_hw(c, p, n)
    while n >= 8:
        lo = c ^ (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
                  | (<uint32_t>p[3] << 24))
        hi = (<uint32_t>p[4] | (<uint32_t>p[5] << 8) | (<uint32_t>p[6] << 16)
              | (<uint32_t>p[7] << 24))
        c = (_T[7][lo & 0xFF] ^ _T[6][(lo >> 8) & 0xFF] ^ _T[5][(lo >> 16) & 0xFF]
             ^ _T[4][lo >> 24] ^ _T[3][hi & 0xFF] ^ _T[2][(hi >> 8) & 0xFF]
             ^ _T[1][(hi >> 16) & 0xFF] ^ _T[0][hi >> 24])
        p += 8
        n -= 8
    while n > 0:
        c = _T[0][(c ^ p[0]) & 0xFF] ^ (c >> 8)
        p += 1
        n -= 1
    return ~c


def crc32c(data, uint32_t value=0):
    """== crc32c.crc32c(data, value)."""
    cdef const uint8_t[::1] view = data
    if view.shape[0] == 0:
        return value
    return _crc32c(value, &view[0], view.shape[0])


# --- CommitLog framing (storage/log_format.py) ---------------------------------------------
cdef inline void _put_u32le(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF
    p[2] = (v >> 16) & 0xFF
    p[3] = v >> 24


cdef inline uint32_t _get_u32le(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
            | (<uint32_t>p[3] << 24))


def frame(list payloads, list lengths, Py_ssize_t start, uint32_t magic, uint32_t seed):
    """== log_format.frame: the framed bytes of ``payloads`` and each record's position."""
    cdef Py_ssize_t n = PyList_GET_SIZE(payloads), i, total = 0, size
    cdef object p
    for i in range(n):
        p = <object>PyList_GET_ITEM(payloads, i)
        if type(p) is not bytes:
            raise TypeError(f"a payload is bytes, not {type(p).__name__}")
        total += 12 + PyBytes_GET_SIZE(p)
    buf = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t* out = <uint8_t*>PyBytes_AS_STRING(buf)
    cdef list positions = [None] * n
    cdef Py_ssize_t at = 0
    for i in range(n):
        p = <object>PyList_GET_ITEM(payloads, i)
        size = PyBytes_GET_SIZE(p)
        _put_u32le(out + at, magic)
        _put_u32le(out + at + 4, <uint32_t>size)
        _put_u32le(out + at + 8, _crc32c(<uint32_t>size ^ seed,
                                         <const uint8_t*>PyBytes_AS_STRING(p), size))
        memcpy(out + at + 12, PyBytes_AS_STRING(p), size)
        positions[i] = start + at
        at += 12 + size
    return buf, positions


def read_records(mm, Py_ssize_t base, Py_ssize_t hi, list positions, Py_ssize_t index,
                 list out, Py_ssize_t room, uint32_t magic, uint32_t seed):
    """The loop of CommitLog.read_many over the positions in one segment [base, hi) from
    ``index`` on: appends each checked payload to ``out`` while it fits ``room``. Returns
    (next index, room left, status): status 0 = went on as far as it could (the next
    position is in another segment, or there is none), 1 = ``room`` is used up, 2 = no record
    at positions[next index], 3 = bad length or CRC32C there."""
    cdef const uint8_t[::1] view = mm
    cdef const uint8_t* data = &view[0]
    cdef Py_ssize_t size = view.shape[0]
    cdef Py_ssize_t n = PyList_GET_SIZE(positions), pos, off, length
    while index < n:
        pos = <Py_ssize_t>(<object>PyList_GET_ITEM(positions, index))
        if not base <= pos < hi:
            return index, room, 0
        off = pos - base
        if hi - pos < 12 or _get_u32le(data + off) != magic:
            return index, room, 2
        length = _get_u32le(data + off + 4)
        if length > room and PyList_GET_SIZE(out):
            return index, room, 1
        if off + 12 + length > size or _crc32c(<uint32_t>length ^ seed, data + off + 12,
                                             length) != _get_u32le(data + off + 8):
            return index, room, 3
        room -= length
        out.append(PyBytes_FromStringAndSize(<const char*>data + off + 12, length))
        index += 1
    return index, room, 0


# --- msgpack, the forms msgspec writes -----------------------------------------------------
cdef enum Kind:
    K_BAD = 0
    K_NIL
    K_INT
    K_STR
    K_BIN
    K_ARRAY
    K_MAP
    K_OTHER


cdef struct Item:
    Kind kind
    Py_ssize_t start  # first byte of the element (its header)
    Py_ssize_t data  # first byte of its content (str/bin bytes)
    Py_ssize_t size  # str/bin: byte length; array/map: element count
    int64_t value  # int


cdef inline int _be(const uint8_t* p, int n, uint64_t* out) noexcept nogil:
    cdef uint64_t v = 0
    cdef int k
    for k in range(n):
        v = (v << 8) | p[k]
    out[0] = v
    return 0


cdef int _head(const uint8_t* p, Py_ssize_t n, Py_ssize_t i, Item* it) noexcept nogil:
    """Parse the header at ``i``: ``it`` gets its kind and sizes; returns the index past
    the header (past the whole element for nil and ints), or -1. Only the canonical form
    (the shortest, as msgspec writes it) is accepted; anything else is K_BAD."""
    cdef uint8_t b
    cdef uint64_t u
    cdef int w
    if i >= n:
        return -1
    b = p[i]
    it.start = i
    it.kind = K_BAD
    if b <= 0x7F:
        it.kind = K_INT
        it.value = b
        return i + 1
    if b >= 0xE0:
        it.kind = K_INT
        it.value = <int64_t>b - 256
        return i + 1
    if 0xA0 <= b <= 0xBF:
        it.kind = K_STR
        it.size = b & 0x1F
        it.data = i + 1
        return i + 1
    if 0x90 <= b <= 0x9F:
        it.kind = K_ARRAY
        it.size = b & 0x0F
        return i + 1
    if 0x80 <= b <= 0x8F:
        it.kind = K_MAP
        it.size = b & 0x0F
        return i + 1
    if b == 0xC0:
        it.kind = K_NIL
        return i + 1
    if 0xCC <= b <= 0xCF:  # uint 8/16/32/64
        w = 1 << (b - 0xCC)
        if i + 1 + w > n:
            return -1
        _be(p + i + 1, w, &u)
        if (w == 1 and u < 0x80) or (w == 2 and u < 0x100) or (w == 4 and u < 0x10000) or (
                w == 8 and (u < 0x100000000ULL or u > 0x7FFFFFFFFFFFFFFFULL)):
            return -1  # not the shortest form, or past int64 (the Python path takes it)
        it.kind = K_INT
        it.value = <int64_t>u
        return i + 1 + w
    if 0xD0 <= b <= 0xD3:  # int 8/16/32/64 (negative values only, in canonical form)
        w = 1 << (b - 0xD0)
        if i + 1 + w > n:
            return -1
        _be(p + i + 1, w, &u)
        if w == 1:
            it.value = <int64_t>(<signed char>u)
            if it.value >= -32:
                return -1
        elif w == 2:
            it.value = <int64_t>(<short>u)
            if it.value >= -128:
                return -1
        elif w == 4:
            it.value = <int64_t>(<int>u)
            if it.value >= -32768:
                return -1
        else:
            it.value = <int64_t>u
            if it.value >= -2147483648LL:
                return -1
        it.kind = K_INT
        return i + 1 + w
    if b == 0xD9 or b == 0xC4:  # str8 / bin8
        if i + 2 > n:
            return -1
        it.size = p[i + 1]
        if b == 0xD9 and it.size < 32:
            return -1
        it.kind = K_STR if b == 0xD9 else K_BIN
        it.data = i + 2
        return i + 2
    if b == 0xDA or b == 0xC5 or b == 0xDC or b == 0xDE:  # 16-bit sizes
        if i + 3 > n:
            return -1
        it.size = (<Py_ssize_t>p[i + 1] << 8) | p[i + 2]
        if it.size < (256 if b <= 0xDA else 16):
            return -1
        it.kind = K_STR if b == 0xDA else K_BIN if b == 0xC5 else K_ARRAY if b == 0xDC else K_MAP
        it.data = i + 3
        return i + 3
    if b == 0xDB or b == 0xC6 or b == 0xDD or b == 0xDF:  # 32-bit sizes
        if i + 5 > n:
            return -1
        _be(p + i + 1, 4, &u)
        it.size = <Py_ssize_t>u
        if it.size < 0x10000:
            return -1
        it.kind = K_STR if b == 0xDB else K_BIN if b == 0xC6 else K_ARRAY if b == 0xDD else K_MAP
        it.data = i + 5
        return i + 5
    it.kind = K_OTHER
    return -1


cdef bint _utf8(const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """Valid UTF-8 as Python's strict decoder sees it (no surrogates, no overlongs)."""
    cdef Py_ssize_t i = 0
    cdef uint8_t c, c1
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if c < 0xC2 or c > 0xF4:
            return False
        if c < 0xE0:
            if i + 1 >= n or (s[i + 1] & 0xC0) != 0x80:
                return False
            i += 2
            continue
        if i + 1 >= n:
            return False
        c1 = s[i + 1]
        if c < 0xF0:
            if i + 2 >= n or (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80:
                return False
            if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F):
                return False
            i += 3
            continue
        if i + 3 >= n or (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80 or (
                s[i + 3] & 0xC0) != 0x80:
            return False
        if (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 > 0x8F):
            return False
        i += 4
    return True


cdef Py_ssize_t _str(const uint8_t* p, Py_ssize_t n, Py_ssize_t i, Item* it) noexcept nogil:
    """A valid str at ``i``: the index past it, else -1."""
    i = _head(p, n, i, it)
    if i < 0 or it.kind != K_STR or i + it.size > n or not _utf8(p + i, it.size):
        return -1
    return i + it.size


cdef Py_ssize_t _opt_str(const uint8_t* p, Py_ssize_t n, Py_ssize_t i, Item* it) noexcept nogil:
    """nil or a valid str."""
    if i < n and p[i] == 0xC0:
        it.kind = K_NIL
        it.start = i
        return i + 1
    return _str(p, n, i, it)


cdef Py_ssize_t _int(const uint8_t* p, Py_ssize_t n, Py_ssize_t i, Item* it) noexcept nogil:
    i = _head(p, n, i, it)
    if i < 0 or it.kind != K_INT:
        return -1
    return i


cdef Py_ssize_t _str_array(const uint8_t* p, Py_ssize_t n, Py_ssize_t i,
                           Item* it) noexcept nogil:
    """An array of valid str (``keys``)."""
    cdef Py_ssize_t k, count
    cdef Item s
    i = _head(p, n, i, it)
    if i < 0 or it.kind != K_ARRAY:
        return -1
    count = it.size
    for k in range(count):
        i = _str(p, n, i, &s)
        if i < 0:
            return -1
    return i


cdef Py_ssize_t _str_map(const uint8_t* p, Py_ssize_t n, Py_ssize_t i, Item* it,
                         int max_entries) noexcept nogil:
    """A map of valid str to valid str with distinct keys and at most ``max_entries``."""
    cdef Py_ssize_t k, j, count
    cdef Item key, val
    cdef Py_ssize_t starts[16]
    cdef Py_ssize_t sizes[16]
    i = _head(p, n, i, it)
    if i < 0 or it.kind != K_MAP or it.size > max_entries or it.size > 16:
        return -1
    count = it.size
    for k in range(count):
        i = _str(p, n, i, &key)
        if i < 0:
            return -1
        for j in range(k):  # a decoded dict would keep one of two equal keys
            if sizes[j] == key.size and _same(p + starts[j], p + key.data, key.size):
                return -1
        starts[k] = key.data
        sizes[k] = key.size
        i = _str(p, n, i, &val)
        if i < 0:
            return -1
    return i


cdef inline bint _same(const uint8_t* a, const uint8_t* b, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t k
    for k in range(n):
        if a[k] != b[k]:
            return False
    return True


cdef Py_ssize_t _body_tags_keys(const uint8_t* p, Py_ssize_t n, Py_ssize_t i, Item* body,
                                Item* tags, Item* keys) noexcept nogil:
    """The body (bin), tags (nil or str) and keys (array of str) that both record formats
    hold in a row: the index past them, else -1."""
    i = _head(p, n, i, body)
    if i < 0 or body.kind != K_BIN or i + body.size > n:
        return -1
    i = _opt_str(p, n, i + body.size, tags)
    if i < 0:
        return -1
    return _str_array(p, n, i, keys)


# --- writing -------------------------------------------------------------------------------
cdef inline Py_ssize_t _w_int(uint8_t* o, int64_t v) noexcept nogil:
    cdef int w, k
    cdef uint64_t u
    if 0 <= v < 128:
        o[0] = <uint8_t>v
        return 1
    if -32 <= v < 0:
        o[0] = <uint8_t>(v & 0xFF)
        return 1
    if v > 0:
        if v < 0x100:
            o[0] = 0xCC
            w = 1
        elif v < 0x10000:
            o[0] = 0xCD
            w = 2
        elif v < 0x100000000LL:
            o[0] = 0xCE
            w = 4
        else:
            o[0] = 0xCF
            w = 8
    else:
        if v >= -128:
            o[0] = 0xD0
            w = 1
        elif v >= -32768:
            o[0] = 0xD1
            w = 2
        elif v >= -2147483648LL:
            o[0] = 0xD2
            w = 4
        else:
            o[0] = 0xD3
            w = 8
    u = <uint64_t>v
    for k in range(w):
        o[w - k] = (u >> (8 * k)) & 0xFF
    return 1 + w


cdef inline Py_ssize_t _w_head(uint8_t* o, Py_ssize_t size, uint8_t fix, Py_ssize_t fix_max,
                               uint8_t b8, uint8_t b16, uint8_t b32) noexcept nogil:
    if size <= fix_max:
        o[0] = fix | <uint8_t>size
        return 1
    if b8 and size < 0x100:
        o[0] = b8
        o[1] = <uint8_t>size
        return 2
    if size < 0x10000:
        o[0] = b16
        o[1] = (size >> 8) & 0xFF
        o[2] = size & 0xFF
        return 3
    o[0] = b32
    _put_u32be(o + 1, <uint32_t>size)
    return 5


cdef inline void _put_u32be(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v >> 24
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF


cdef inline Py_ssize_t _w_str(uint8_t* o, const char* s, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t h = _w_head(o, n, 0xA0, 31, 0xD9, 0xDA, 0xDB)
    memcpy(o + h, s, n)
    return h + n


cdef inline Py_ssize_t _w_bin(uint8_t* o, const uint8_t* s, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t h
    if n < 0x100:
        o[0] = 0xC4
        o[1] = <uint8_t>n
        h = 2
    elif n < 0x10000:
        o[0] = 0xC5
        o[1] = (n >> 8) & 0xFF
        o[2] = n & 0xFF
        h = 3
    else:
        o[0] = 0xC6
        _put_u32be(o + 1, <uint32_t>n)
        h = 5
    memcpy(o + h, s, n)
    return h + n


cdef inline Py_ssize_t _w_raw(uint8_t* o, const uint8_t* p, Py_ssize_t a,
                              Py_ssize_t b) noexcept nogil:
    memcpy(o, p + a, b - a)
    return b - a


# --- delivery: stored MessageRecord value -> LogRecord payload -----------------------------
def log_payloads(list values, list topics, list msg_ids, list offsets, list deliver_ats,
                 int64_t stored_at):
    """For each stored MessageRecord value (== scheduler.codec.log_payload_from_value):
    its LogRecord payload, or None where the Python path must do it (properties to filter,
    or anything not exactly as msgspec writes it)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(values), k, n, i, tsize, msize, end_keys
    cdef list out = [None] * count
    cdef const uint8_t* p
    cdef const char* t
    cdef const char* m
    cdef Item it, body, tags, keys, born, flags
    cdef uint8_t* o
    cdef Py_ssize_t w
    cdef int64_t offset, deliver_at
    for k in range(count):
        value = <object>PyList_GET_ITEM(values, k)
        if type(value) is not bytes:
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
        m = PyUnicode_AsUTF8AndSize(<object>PyList_GET_ITEM(msg_ids, k), &msize)
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
        out[k] = buf[:w]
    return out


# --- pull: LogRecord payload -> the Delivered document (api/schemas.py) in msgpack ---------
cdef bytes _K_OFFSET = b"\xa6offset"
cdef bytes _K_MSGID = b"\xa5msgId"
cdef bytes _K_TOPIC = b"\xa5topic"
cdef bytes _K_TAGS = b"\xa4tags"
cdef bytes _K_KEYS = b"\xa4keys"
cdef bytes _K_PROPS = b"\xaaproperties"
cdef bytes _K_B64 = b"\xaabodyBase64"
cdef bytes _K_BODY = b"\xa4body"
cdef bytes _K_BORN = b"\xa6bornAt"
cdef bytes _K_DELIVER = b"\xa9deliverAt"
cdef bytes _K_STORED = b"\xa8storedAt"
cdef bytes _K_RECEIPT = b"\xa7receipt"
cdef bytes _K_COUNT = b"\xaddeliveryCount"
cdef bytes _K_RECONSUMED = b"\xaereconsumeTimes"


cdef inline Py_ssize_t _w_key(uint8_t* o, bytes key) noexcept:
    memcpy(o, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
    return PyBytes_GET_SIZE(key)


cdef bytes _K_NEXT = b"\xaanextOffset"
cdef bytes _PULL_HEAD = b"\x82\xa8messages"  # {"messages": [...], "nextOffset": n}
cdef int64_t _INT64_MAX = 0x7FFFFFFFFFFFFFFF


cdef Py_ssize_t _delivered(const uint8_t* p, Py_ssize_t n, uint8_t* o, bint once, bint leased,
                           const char* receipt, Py_ssize_t receipt_size,
                           int64_t delivery_count, int64_t* queue_offset) noexcept:
    """Write the ``Delivered`` document of the LogRecord payload ``p[:n]`` (with ``leased``,
    the ``Received`` one) at ``o``, which has room for 2n + 160 bytes (+ receipt_size + 64
    when leased); returns its length and sets ``queue_offset``, or -1 for a payload the
    Python path must do."""
    cdef Item it, topic, msg_id, qo, body, tags, keys, props, born, deliver, stored
    cdef Py_ssize_t i, w, keys_end, props_end
    cdef bint text
    # [version, topic, msg_id, queue_offset, body, tags, keys, properties, born_at,
    #  deliver_at, stored_at, flags], as written
    if n < 1 or p[0] != 0x9C:
        return -1
    i = _int(p, n, 1, &it)
    if i < 0:
        return -1
    i = _str(p, n, i, &topic)
    if i < 0:
        return -1
    i = _str(p, n, i, &msg_id)
    if i < 0:
        return -1
    i = _int(p, n, i, &qo)
    if i < 0:
        return -1
    i = _body_tags_keys(p, n, i, &body, &tags, &keys)
    if i < 0:
        return -1
    keys_end = i
    i = _str_map(p, n, i, &props, 16)
    if i < 0:
        return -1
    props_end = i
    i = _int(p, n, i, &born)
    if i < 0:
        return -1
    i = _int(p, n, i, &deliver)
    if i < 0:
        return -1
    i = _int(p, n, i, &stored)
    if i < 0:
        return -1
    i = _int(p, n, i, &it)  # flags
    if i != n:
        return -1
    text = _utf8(p + body.data, body.size)
    # 10 fields and ``body`` if text (once: one of the two bodies); a leased message's 3 more
    o[0] = 0x80 | ((11 if text and not once else 10) + (3 if leased else 0))
    w = 1
    w += _w_key(o + w, _K_OFFSET)
    w += _w_int(o + w, qo.value)
    w += _w_key(o + w, _K_MSGID)
    w += _w_raw(o + w, p, msg_id.start, msg_id.data + msg_id.size)
    w += _w_key(o + w, _K_TOPIC)
    w += _w_raw(o + w, p, topic.start, topic.data + topic.size)
    w += _w_key(o + w, _K_TAGS)
    w += _w_raw(o + w, p, tags.start, keys.start)
    w += _w_key(o + w, _K_KEYS)
    w += _w_raw(o + w, p, keys.start, keys_end)
    w += _w_key(o + w, _K_PROPS)
    w += _w_raw(o + w, p, props.start, props_end)
    if not (once and text):
        w += _w_key(o + w, _K_B64)
        w += _w_raw(o + w, p, body.start, body.data + body.size)
    if text:
        w += _w_key(o + w, _K_BODY)
        w += _w_str(o + w, <const char*>p + body.data, body.size)
    w += _w_key(o + w, _K_BORN)
    w += _w_int(o + w, born.value)
    w += _w_key(o + w, _K_DELIVER)
    w += _w_int(o + w, deliver.value)
    w += _w_key(o + w, _K_STORED)
    w += _w_int(o + w, stored.value)
    if leased:
        w += _w_key(o + w, _K_RECEIPT)
        w += _w_str(o + w, receipt, receipt_size)
        w += _w_key(o + w, _K_COUNT)
        w += _w_int(o + w, delivery_count)
        w += _w_key(o + w, _K_RECONSUMED)
        o[w] = 0
        w += 1
    queue_offset[0] = qo.value
    return w


def delivered_msgpack(list payloads, list receipts=None, list counts=None, bint once=False):
    """For each LogRecord payload: the msgpack of its ``Delivered`` document (what
    ``msgspec.msgpack.encode(api.routes.consume.delivered(decode_log_record(p), once))``
    gives), or None where the Python path must do it; and the queue offset of each. With
    ``receipts`` and ``counts`` (one each per payload): a leased message's ``Received``
    document instead, its receipt, delivery count and ``reconsumeTimes`` 0 after the
    fields of ``Delivered`` (scheduler/groups.py, a message shown as stored). ``once``: the
    body only once, as ``body`` when it is UTF-8 text, else as ``bodyBase64``
    (``Prefer: body=once``, api/schemas.py ``body_fields``)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(payloads), k, n, w, receipt_size = 0
    cdef list out = [None] * count
    cdef list queue_offsets = [None] * count
    cdef const char* receipt = NULL
    cdef int64_t delivery_count = 0, qo = 0
    cdef bint leased = receipts is not None
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
        buf = PyBytes_FromStringAndSize(NULL, 2 * n + 160 + (receipt_size + 64 if leased else 0))
        w = _delivered(<const uint8_t*>PyBytes_AS_STRING(payload), n,
                       <uint8_t*>PyBytes_AS_STRING(buf), once, leased, receipt, receipt_size,
                       delivery_count, &qo)
        if w < 0:
            continue
        out[k] = buf[:w]
        queue_offsets[k] = qo
    return out, queue_offsets


def pull_frame(list payloads, bint once=False):
    """The msgpack of a pull answer of ``payloads`` (``{"messages": [...], "nextOffset":
    n}``, the bytes api/routes/consume.py ``pull_msgpack_py`` gives) written into one
    buffer: no bytes object per message, no join. None when there are none, or when any
    payload is one ``delivered_msgpack`` leaves to Python (the caller then goes that way)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(payloads), k, n, w, size = 32
    cdef int64_t qo = 0
    cdef uint8_t* o
    if count == 0:
        return None
    for k in range(count):
        payload = <object>PyList_GET_ITEM(payloads, k)
        if type(payload) is not bytes:
            return None
        size += 2 * PyBytes_GET_SIZE(payload) + 160
    buf = PyBytes_FromStringAndSize(NULL, size)
    o = <uint8_t*>PyBytes_AS_STRING(buf)
    w = _w_key(o, _PULL_HEAD)
    if count < 16:  # the array header as msgspec writes it
        o[w] = 0x90 | count
        w += 1
    elif count < 0x10000:
        o[w] = 0xDC
        o[w + 1] = (count >> 8) & 0xFF
        o[w + 2] = count & 0xFF
        w += 3
    else:
        o[w] = 0xDD
        _put_u32be(o + w + 1, <uint32_t>count)
        w += 5
    for k in range(count):
        payload = <object>PyList_GET_ITEM(payloads, k)
        n = _delivered(<const uint8_t*>PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload),
                       o + w, once, False, NULL, 0, 0, &qo)
        if n < 0:
            return None
        w += n
    if qo == _INT64_MAX:  # the next offset would not be an int64 (msgspec: a uint64)
        return None
    w += _w_key(o + w, _K_NEXT)
    w += _w_int(o + w, qo + 1)
    return buf[:w]


# --- delivery: the columns of a commit, and its index entries ------------------------------
from cpython.unicode cimport PyUnicode_DecodeUTF8


def record_offsets(list payloads):
    """== storage.records.log_record_offsets: the queue offset of each LogRecord payload,
    read from its head (version, topic, msgId, queue offset), or None for the whole list
    when one is not a record as written (the Python path then decodes them and raises)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(payloads), k, n, i
    cdef list out = [None] * count
    cdef const uint8_t* p
    cdef Item it, qo, body, tags, keys
    for k in range(count):
        payload = <object>PyList_GET_ITEM(payloads, k)
        if type(payload) is not bytes:
            return None
        p = <const uint8_t*>PyBytes_AS_STRING(payload)
        n = PyBytes_GET_SIZE(payload)
        if n < 1 or p[0] != 0x9C:
            return None
        # the whole record is parsed (msgspec reads past the head too, and raises on a
        # damaged tail): [version, topic, msg_id, queue_offset, body, tags, keys,
        # properties, born_at, deliver_at, stored_at, flags]
        i = _int(p, n, 1, &it)
        if i >= 0:
            i = _str(p, n, i, &it)
        if i >= 0:
            i = _str(p, n, i, &it)
        if i >= 0:
            i = _int(p, n, i, &qo)
        if i >= 0:
            i = _body_tags_keys(p, n, i, &body, &tags, &keys)
        if i >= 0:
            i = _str_map(p, n, i, &it, 16)
        for _ in range(4):
            if i >= 0:
                i = _int(p, n, i, &it)
        if i != n:
            return None
        out[k] = qo.value
    return out


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
    """(index keys, values, deliverAts, topics, msgIds) of scanned (timer key, value) pairs,
    as scheduler/committer.py's ``_split_due_py`` gives them; None when a key is not
    ``deliverAt(8) + topic + NUL + msgId`` (that path then raises)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(items), k, n, j
    cdef list ikeys = [None] * count, values = [None] * count, ats = [None] * count
    cdef list topics = [None] * count, msg_ids = [None] * count
    cdef const uint8_t* p
    cdef const uint8_t* nul
    cdef uint64_t at
    cdef bytes last_raw = None
    cdef object last_topic = None
    for k in range(count):
        pair = <object>PyList_GET_ITEM(items, k)
        key = pair[0]
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
        ats[k] = at
        ikeys[k] = PyBytes_FromStringAndSize(<const char*>p + 8, n - 8)
        values[k] = pair[1]
        j = nul - p
        if last_raw is None or PyBytes_GET_SIZE(last_raw) != j - 8 or not _same(
                <const uint8_t*>PyBytes_AS_STRING(last_raw), p + 8, j - 8):
            last_raw = PyBytes_FromStringAndSize(<const char*>p + 8, j - 8)
            last_topic = PyUnicode_DecodeUTF8(<const char*>p + 8, j - 8, "strict")
        topics[k] = last_topic
        msg_ids[k] = PyUnicode_DecodeUTF8(<const char*>nul + 1, n - j - 1, "strict")
    return ikeys, values, ats, topics, msg_ids


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


cdef const char* _B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


cdef Py_ssize_t _handle(char* dst, object key) except -1:
    """Write the cancel handle of ``key`` (URL-safe base64 of the version byte 1 + the timer
    key, without padding) to ``dst`` (room for 800); returns its length."""
    cdef Py_ssize_t n, total, i, w
    cdef uint8_t src[600]
    cdef uint32_t v
    if type(key) is not bytes or PyBytes_GET_SIZE(key) > 598:
        raise TypeError("a timer key is bytes of at most 598")
    n = PyBytes_GET_SIZE(key)
    src[0] = 1
    memcpy(src + 1, PyBytes_AS_STRING(key), n)
    total = n + 1
    w = 0
    i = 0
    while i + 3 <= total:
        v = (<uint32_t>src[i] << 16) | (<uint32_t>src[i + 1] << 8) | src[i + 2]
        dst[w] = _B64[v >> 18]
        dst[w + 1] = _B64[(v >> 12) & 63]
        dst[w + 2] = _B64[(v >> 6) & 63]
        dst[w + 3] = _B64[v & 63]
        w += 4
        i += 3
    if total - i == 1:
        v = <uint32_t>src[i] << 16
        dst[w] = _B64[v >> 18]
        dst[w + 1] = _B64[(v >> 12) & 63]
        w += 2
    elif total - i == 2:
        v = (<uint32_t>src[i] << 16) | (<uint32_t>src[i + 1] << 8)
        dst[w] = _B64[v >> 18]
        dst[w + 1] = _B64[(v >> 12) & 63]
        dst[w + 2] = _B64[(v >> 6) & 63]
        w += 3
    return w


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


# --- send path: a plain batch, straight from the decoded request ---------------------------
cdef const char* _HEX = b"0123456789ABCDEF"


cdef class _Plain:
    """The columns of a plain batch as they are built (``plain_batch``, ``plain_msgpack``)."""
    cdef list msg_ids, deliver_ats, timer_keys, index_keys, values, entries, given
    cdef bytes prefix
    cdef int64_t now
    cdef char idbuf[28]
    cdef object counter

    def __cinit__(self, Py_ssize_t count, bytes prefix, int64_t now, str id_prefix,
                  object counter):
        cdef Py_ssize_t n
        cdef const char* idp = PyUnicode_AsUTF8AndSize(id_prefix, &n)
        if n != 20:
            raise ValueError("a msgId prefix is 20 characters")
        memcpy(self.idbuf, idp, 20)
        self.msg_ids = [None] * count
        self.deliver_ats = [None] * count
        self.timer_keys = [None] * count
        self.index_keys = [None] * count
        self.values = [None] * count
        self.entries = [None] * count
        self.given = []
        self.prefix = prefix
        self.now = now
        self.counter = counter

    cdef add(self, Py_ssize_t k, const char* body, Py_ssize_t n, int64_t at, object msg_id):
        """Message ``k``: its body, deliverAt and msgId (None: a new one, generated)."""
        cdef Py_ssize_t plen = PyBytes_GET_SIZE(self.prefix), idlen, w
        cdef const char* idp
        cdef uint64_t c
        cdef uint8_t* o
        cdef uint8_t entry[48]
        cdef int j
        cdef int64_t now = self.now
        if msg_id is None:
            c = <uint64_t>(next(self.counter)) & 0xFFFFFFFF
            for j in range(8):
                self.idbuf[27 - j] = _HEX[(c >> (4 * j)) & 15]
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
        self.msg_ids[k] = msg_id
        self.deliver_ats[k] = at
        self.timer_keys[k] = tkey
        self.index_keys[k] = idkey
        self.values[k] = value[:w + 1]
        self.entries[k] = PyBytes_FromStringAndSize(<const char*>entry, j + 3)

    cdef tuple columns(self):
        return (self.msg_ids, self.deliver_ats, self.timer_keys, self.index_keys, self.values,
                self.entries, self.given)


cdef int64_t _due_later(object given_at, object given_delay, object absent, int64_t now,
                        int64_t max_delay) except? -2:
    """The deliverAt of a plain message from its deliverAt or its delayMs (``absent``: the
    value of the one not given): after ``now`` and at most ``max_delay`` ahead. -1 when it
    is not plain: both or neither given (neither: due now, which the general path delivers
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


def plain_batch(list messages, bytes prefix, int64_t now, int64_t max_delay,
                Py_ssize_t max_body, object unset, str id_prefix, object counter):
    """The columns a send batch stores, built from the decoded request (api.schemas.MessageIn:
    ``unset`` for an absent field) when every message in it is *plain*: a body (text or
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
    cdef _Plain out = _Plain(count, prefix, now, id_prefix, counter)
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
    except (OverflowError, UnicodeEncodeError):  # past int64, a lone surrogate: not plain
        return None
    return out.columns()


def plain_requests(list requests, dict known, int64_t now, int64_t max_delay,
                   Py_ssize_t max_body, str id_prefix, object counter):
    """``plain_batch`` for the engine's own requests (scheduler.model.SendRequest: bytes
    body; None, () or {} for an absent field): the in-process ``Broker.send_batch``. Their
    topics may differ, each one sent to before (``known``: topic -> (key prefix, shard), as
    scheduler.intake.Intake caches them). A msgId must match storage.constants.MSG_ID_REGEX
    here (the API's decoder has not checked it); None for anything else, as there. Returns
    the columns and, when the batch holds more than one topic, each message's topic and
    shard (else None, None)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(requests), k, n
    cdef const char* u
    cdef int64_t at
    cdef _Plain out
    cdef list topics = None, shards = None
    if count == 0:
        return None
    first = (<object>PyList_GET_ITEM(requests, 0)).topic
    if type(first) is not str:
        return None
    entry = known.get(first)
    if entry is None:
        return None
    out = _Plain(count, entry[0], now, id_prefix, counter)
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


cdef enum:
    F_BODY = 1
    F_B64 = 2
    F_ID = 4
    F_AT = 8
    F_DELAY = 16


def plain_msgpack(bytes raw, Py_ssize_t max_count, bytes prefix, int64_t now,
                  int64_t max_delay, Py_ssize_t max_body, str id_prefix, object counter):
    """``plain_batch`` straight from a msgpack request body (``{"messages": [...]}``, at
    most ``max_count`` of them), without decoding it into MessageIn first. Takes only what
    is plain and written as msgpack writes it (canonical headers; per message the keys
    ``body`` (str) or ``bodyBase64`` (bin), ``msgId`` (a valid one), ``deliverAt`` or
    ``delayMs`` (ints >= 0), each once); None for anything else, which the schema's decoder
    then reads and checks."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(raw)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(raw), i, k, count, fields, f, j
    cdef Item it, key, body, msg_id, num
    cdef int seen, flag
    cdef int64_t at
    cdef _Plain out
    if n < 10 or p[0] != 0x81 or memcmp(p + 1, b"\xa8messages", 9) != 0:
        return None
    i = _head(p, n, 10, &it)
    if i < 0 or it.kind != K_ARRAY or it.size < 1 or it.size > max_count:
        return None
    count = it.size
    out = _Plain(count, prefix, now, id_prefix, counter)
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
        out.add(k, <const char*>p + body.data, body.size, at,
                PyUnicode_DecodeUTF8(<const char*>p + msg_id.data, msg_id.size, NULL)
                if seen & F_ID else None)
    if i != n:
        return None
    return out.columns()


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


# --- the due timeline: counts per second ---------------------------------------------------
def per_second(list deliver_ats, int64_t resolution):
    """== scheduler.timeline._per_second (as a dict): how many values fall in each
    ``resolution`` (floor division); OverflowError past int64 (that path then counts)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(deliver_ats), k
    cdef dict out = {}
    cdef int64_t v, second, run_second = 0
    cdef Py_ssize_t run = 0
    for k in range(count):
        v = <object>PyList_GET_ITEM(deliver_ats, k)
        second = v // resolution if v >= 0 else -((-v + resolution - 1) // resolution)
        if run and second == run_second:
            run += 1
            continue
        if run:
            out[run_second] = out.get(run_second, 0) + run
        run_second = second
        run = 1
    if run:
        out[run_second] = out.get(run_second, 0) + run
    return out


# --- a WriteBatch's entries in key order -----------------------------------------------------
from cpython.bytes cimport PyBytes_CheckExact
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdlib cimport qsort


cdef struct _KeyRef:
    const char* p
    Py_ssize_t n
    Py_ssize_t i


cdef int _key_order(const void* a, const void* b) noexcept nogil:
    """bytes order (a prefix first), then list order: what sorted() gives, stably."""
    cdef const _KeyRef* x = <const _KeyRef*>a
    cdef const _KeyRef* y = <const _KeyRef*>b
    cdef Py_ssize_t m = x.n if x.n < y.n else y.n
    cdef int c = memcmp(x.p, y.p, <size_t>m)
    if c != 0:
        return c
    if x.n != y.n:
        return -1 if x.n < y.n else 1
    return -1 if x.i < y.i else (1 if x.i > y.i else 0)


def put_sorted(put, list keys, list values, handle):
    """``put(key, value, handle)`` for each (keys[i], values[i]) in the keys' bytes order,
    equal keys in list order; returns the first key put (None: none). The sort compares the
    bytes in C, and no (key, value) tuple is built (storage/batch.py: put_sorted_py)."""
    cdef Py_ssize_t n = PyList_GET_SIZE(keys), i, j
    if PyList_GET_SIZE(values) != n:
        raise ValueError(f"{n} keys but {PyList_GET_SIZE(values)} values")
    if n == 0:
        return None
    cdef _KeyRef* refs = <_KeyRef*>PyMem_Malloc(n * sizeof(_KeyRef))
    if refs == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            key = <object>PyList_GET_ITEM(keys, i)
            if not PyBytes_CheckExact(key):
                raise TypeError(f"a key must be bytes, not {type(key).__name__}")
            refs[i].p = PyBytes_AS_STRING(key)
            refs[i].n = PyBytes_GET_SIZE(key)
            refs[i].i = i
        qsort(refs, <size_t>n, sizeof(_KeyRef), _key_order)  # (no Python runs meanwhile)
        for i in range(n):
            j = refs[i].i
            if PyList_GET_SIZE(keys) != n or PyList_GET_SIZE(values) != n:
                raise RuntimeError("the keys or values changed size while being put")
            put(<object>PyList_GET_ITEM(keys, j), <object>PyList_GET_ITEM(values, j), handle)
        return <object>PyList_GET_ITEM(keys, refs[0].i)
    finally:
        PyMem_Free(refs)
